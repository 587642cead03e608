// cuBLASLt products with a plan per shape (cuda_gemm.h).
#include "backend/cuda_gemm.h"

#include <cstdint>

#include "core/error.h"
#include "gpu/check.h"

namespace amsp::backend {

LtGemm::LtGemm(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  AMSP_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c}) AMSP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(l));
    AMSP_CUBLAS_CHECK(cublasLtMatmulDescDestroy(p.desc));
  }
  AMSP_CUBLAS_CHECK(cublasLtDestroy(handle_));
}

// The descriptors of the shape and the heuristic's first algorithm for them,
// made the first time the shape is seen.
const LtGemm::Plan& LtGemm::plan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan p;
  const cudaDataType ab = key.a_bf16 ? CUDA_R_16BF : CUDA_R_32F, ct = key.c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  AMSP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t ta = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  AMSP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  AMSP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  // Stored operands: op(A) is m x k, op(B) is k x n.
  AMSP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, key.ta ? key.k : key.m, key.ta ? key.m : key.k, key.lda));
  AMSP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, key.tb ? key.n : key.k, key.tb ? key.k : key.n, key.ldb));
  AMSP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, ct, key.m, key.n, key.ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  AMSP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_ws = workspace_bytes_;
  AMSP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                         sizeof max_ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  AMSP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
  AMSP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt has no algorithm for the product m=", key.m, " n=", key.n, " k=", key.k,
         key.a_bf16 ? " bf16" : " fp32", " operands into ", key.c_bf16 ? "bf16" : "fp32", " within ",
         workspace_bytes_, " bytes of workspace");
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void LtGemm::run(cudaStream_t stream, bool trans_a, bool trans_b, int m, int n, int k, Operand a,
                 Operand b, float beta, const void* c, void* d, bool c_bf16, int ldc) {
  if (m == 0 || n == 0) return;
  const Key key{trans_a, trans_b, m, n, k, static_cast<int>(a.ld), static_cast<int>(b.ld), ldc, a.bf16, c_bf16};
  const Plan& p = plan(key);
  const float alpha = 1.0f;
  AMSP_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, a.data, p.a, b.data, p.b, &beta, c, p.c,
                                   d, p.c, &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace amsp::backend
