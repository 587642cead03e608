// The CUDA, cuBLAS and NCCL members of the one check family (core/mpi_check.h
// has the MPI one): a failed call prints one line naming the function,
// file:line, rank, host and the library's own error string, and ends the whole
// job (call_failed -> abort_job -> MPI_Abort), so that one rank's device
// failure never leaves the others waiting in a collective.
//
// Works against kernels/cuda/api.h: the real libraries in a CUDA build, the
// emulation otherwise.
#pragma once

#include "kernels/cuda/api.h"

namespace amsp::gpu {

void cuda_check(cudaError_t rc, const char* call, const char* file, int line);
void cublas_check(cublasStatus_t rc, const char* call, const char* file, int line);
// ncclInProgress is how a non-blocking communicator says "issued": not an error.
void nccl_check(ncclResult_t rc, const char* call, const char* file, int line);

// After a batch of kernel launches: the launch error, if any (cudaGetLastError),
// named with the kernel family `what`.
void check_launch(const char* what, const char* file, int line);

}  // namespace amsp::gpu

#define AMSP_CUDA_CHECK(call) ::amsp::gpu::cuda_check((call), #call, __FILE__, __LINE__)
#define AMSP_CUBLAS_CHECK(call) ::amsp::gpu::cublas_check((call), #call, __FILE__, __LINE__)
#define AMSP_NCCL_CHECK(call) ::amsp::gpu::nccl_check((call), #call, __FILE__, __LINE__)
#define AMSP_CUDA_CHECK_LAUNCH(what) ::amsp::gpu::check_launch((what), __FILE__, __LINE__)
