#include "gpu/check.h"

#include "core/error.h"
#include "core/mpi_check.h"

namespace amsp::gpu {

void cuda_check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc != cudaSuccess) comm::call_failed(call, file, line, cudaGetErrorString(rc));
}

void cublas_check(cublasStatus_t rc, const char* call, const char* file, int line) {
  if (rc != CUBLAS_STATUS_SUCCESS) comm::call_failed(call, file, line, cublasGetStatusString(rc));
}

void nccl_check(ncclResult_t rc, const char* call, const char* file, int line) {
  if (rc != ncclSuccess && rc != ncclInProgress)
    comm::call_failed(call, file, line, ncclGetErrorString(rc));
}

void check_launch(const char* what, const char* file, int line) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    comm::call_failed(cat("the ", what, " kernels").c_str(), file, line, cudaGetErrorString(rc));
}

}  // namespace amsp::gpu
