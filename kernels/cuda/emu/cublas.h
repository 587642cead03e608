// The subset of cuBLAS amsp uses, for the emulation build: <cublas_v2.h>'s
// names and signatures, implemented on the CPU with OpenBLAS (cublas.cpp).
// GemmEx with bf16 inputs widens them exactly and multiplies in fp32, as
// cuBLAS's CUBLAS_COMPUTE_32F does (in another order of summation).
// Column-major, as cuBLAS is. GemmEx takes A and B both fp32 (C fp32) or both
// bf16 (C fp32 or bf16, rounded once), scalars as host floats. A product reads
// A and B and, unless beta is 0, C, then writes C, on the handle's stream, for
// the happens-before checker; like the copies of runtime.h, the two products
// take the caller's file and line as defaulted trailing arguments. Pointers
// that are not device memory end the process with a message (on a GPU they
// are an illegal address).
#pragma once

#include "kernels/cuda/emu/runtime.h"

struct cublasContext;
typedef cublasContext* cublasHandle_t;

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
enum libraryPropertyType_t { MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2 };
typedef libraryPropertyType_t libraryPropertyType;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc, const char* file = __builtin_FILE(),
                           int line = __builtin_LINE());
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE());
const char* cublasGetStatusString(cublasStatus_t status);
// The emulation's own version, 13.0.0 (the cuBLAS of CUDA 13.0, whose API it
// follows); it names no installed library.
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value);
