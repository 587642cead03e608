// The CUDA backend's matrix products through cuBLASLt (internal to
// cuda_backend*.cpp). Why cuBLASLt and not cublasGemmEx: the algorithm is
// chosen once per shape by cuBLASLt's heuristic and reused (a GEMM call then
// costs no search), and the workspace is one buffer of the backend's, made at
// start-up, where cuBLAS's own handle allocates its workspace on first use
// (cudaMalloc, which synchronises the whole device; doc/gpu.md). llm.c and
// PyTorch do the same (PyTorch's cublasLt path for bf16 GEMMs, with a cached
// workspace per handle and stream).
//
// Column-major, as cuBLAS sees the row-major matrices (CudaBackend::gemm):
// C[m, n] = op(A) op(B) + beta C, fp32 accumulation and scalars, A and B both
// fp32 or both bf16, C fp32 or (bf16 operands only) bf16, stored once in its
// dtype by the epilogue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/cuda/api.h"

namespace amsp::backend {

class LtGemm {
 public:
  // The workspace every product may use: device memory the caller owns and
  // keeps for the life of this object, used only on the stream given to run.
  LtGemm(void* workspace, size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  struct Operand {
    const void* data;
    bool bf16;
    int64_t ld;
  };
  // Enqueues D = op(A) op(B) + beta C on `stream`, C and D of one layout (the
  // same matrix, or disjoint ones). Shapes, leading dimensions and dtypes must
  // fit cuBLAS's int dimensions (the caller checks them).
  void run(cudaStream_t stream, bool trans_a, bool trans_b, int m, int n, int k, Operand a,
           Operand b, float beta, const void* c, void* d, bool c_bf16, int ldc);
  // How many shapes have a plan (one heuristic query each).
  size_t plans() const { return plans_.size(); }

 private:
  // A product's shape as cuBLASLt's descriptors see it.
  struct Key {
    bool ta, tb;
    int m, n, k, lda, ldb, ldc;
    bool a_bf16, c_bf16;
    auto tie() const { return std::tie(ta, tb, m, n, k, lda, ldb, ldc, a_bf16, c_bf16); }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<Key, Plan> plans_;
};

}  // namespace amsp::backend
