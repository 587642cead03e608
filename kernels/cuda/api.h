// The CUDA, cuBLAS (and cuBLASLt) and NCCL APIs as amsp's CUDA code sees them: the real
// headers in a CUDA build (-DAMSP_CUDA=ON), or the emulation's (kernels/cuda/emu)
// in every other build, where the same CUDA backend code runs on the CPU for the
// tests (doc/gpu.md, "Emulation"). Code above this header cannot tell which.
//
// AMSP_CUDA_EMULATION is 1 in the emulation build, 0 in a real one.
//
// AMSP_HB_ACCESS(stream, ptr, bytes, write) tells the emulation's happens-before
// checker that work about to be issued on `stream` reads (write = false) or
// writes (write = true) bytes [ptr, ptr + bytes); in a real build it is nothing.
//
// AMSP_DEVICE_FLOPS(flops, tensor) tells the emulation's counters
// (emu::device_counts) the floating-point operations a kernel about to be
// launched performs, on tensor cores or not; in a real build it is nothing.
#pragma once

#if defined(AMSP_CUDA_REAL)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <nccl.h>
#define AMSP_CUDA_EMULATION 0
#define AMSP_HB_ACCESS(stream, ptr, bytes, write) ((void)0)
#define AMSP_DEVICE_FLOPS(flops, tensor) ((void)0)
#else
#include "kernels/cuda/emu/cublas.h"
#include "kernels/cuda/emu/nccl.h"
#include "kernels/cuda/emu/runtime.h"
#define AMSP_CUDA_EMULATION 1
#define AMSP_DEVICE_FLOPS(flops, tensor) ::amsp::emu::count_flops((flops), (tensor))
#define AMSP_HB_ACCESS(stream, ptr, bytes, write) \
  ::amsp::emu::hb_access((stream), (ptr), (bytes), (write), __FILE__, __LINE__)
#endif
