// The emulation's cuBLAS products against a naive triple loop, and their
// accesses seen by the happens-before checker.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cuda/api.h"

namespace {

using amsp::kernels::bf16_to_float;
using amsp::kernels::float_to_bf16;

struct Case {
  cublasOperation_t ta, tb;
  int m, n, k;
  float beta;
};

// Column-major op(X)[r, c] of a matrix stored with leading dimension ld.
float at(const std::vector<float>& x, int ld, bool t, int r, int c) {
  return t ? x[static_cast<size_t>(r) * ld + c] : x[static_cast<size_t>(c) * ld + r];
}

std::vector<float> random_values(size_t n, uint32_t seed, bool bf16_exact) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_exact ? amsp::kernels::round_bf16(u(rng)) : u(rng);
  return v;
}

template <class T>
T* to_device(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return d;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
  return h;
}

// kLt*Apart: cuBLASLt with C and D apart (D = alpha op(A) op(B) + beta C).
enum class Kind {
  kSgemm,
  kGemmExF32,
  kGemmExBf16,
  kGemmExBf16Out,
  kLtF32,
  kLtBf16,
  kLtBf16Out,
  kLtF32Apart,
  kLtBf16OutApart
};

// One product through cuBLASLt, as the CUDA backend calls it (backend/cuda_gemm.cpp):
// descriptors, the heuristic's algorithm, its workspace, D = C or D apart.
cublasStatus_t lt_matmul(const Case& c, float alpha, const void* a, int lda, const void* b, int ldb,
                         const void* dc, void* dd, int ldc, cudaDataType in, cudaDataType out) {
  const bool ta = c.ta == CUBLAS_OP_T, tb = c.tb == CUBLAS_OP_T;
  cublasLtHandle_t h = nullptr;
  EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const int32_t opa = c.ta, opb = c.tb;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&la, in, ta ? c.k : c.m, ta ? c.m : c.k, lda), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&lb, in, tb ? c.n : c.k, tb ? c.k : c.n, ldb), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&lc, out, c.m, c.n, ldc), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t max_ws = 1 << 20;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &r, &found);
  void* ws = nullptr;
  EXPECT_EQ(cudaMalloc(&ws, max_ws), cudaSuccess);
  if (rc == CUBLAS_STATUS_SUCCESS) {
    EXPECT_EQ(found, 1);
    EXPECT_LE(r.workspaceSize, max_ws);
    rc = cublasLtMatmul(h, desc, &alpha, a, la, b, lb, &c.beta, dc, lc, dd, lc, &r.algo, ws, max_ws,
                        nullptr);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaFree(ws), cudaSuccess);
  for (cublasLtMatrixLayout_t l : {la, lb, lc}) EXPECT_EQ(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtDestroy(h), CUBLAS_STATUS_SUCCESS);
  return rc;
}

// Runs one product on the emulation and checks every element of C (D where it
// is apart, C then unchanged), and that the padding rows are left alone.
void check(const Case& c, Kind kind) {
  SCOPED_TRACE(::testing::Message()
               << "ta=" << c.ta << " tb=" << c.tb << " m=" << c.m << " n=" << c.n << " k=" << c.k
               << " beta=" << c.beta << " kind=" << static_cast<int>(kind));
  const bool ta = c.ta == CUBLAS_OP_T, tb = c.tb == CUBLAS_OP_T;
  const int lda = (ta ? c.k : c.m) + 2, ldb = (tb ? c.n : c.k) + 1, ldc = c.m + 3;
  const bool apart = kind == Kind::kLtF32Apart || kind == Kind::kLtBf16OutApart;
  const bool bf16_in = kind == Kind::kGemmExBf16 || kind == Kind::kGemmExBf16Out ||
                       kind == Kind::kLtBf16 || kind == Kind::kLtBf16Out ||
                       kind == Kind::kLtBf16OutApart;
  const bool bf16_out =
      kind == Kind::kGemmExBf16Out || kind == Kind::kLtBf16Out || kind == Kind::kLtBf16OutApart;
  const bool lt =
      kind == Kind::kLtF32 || kind == Kind::kLtBf16 || kind == Kind::kLtBf16Out || apart;
  auto a = random_values(static_cast<size_t>(lda) * (ta ? c.m : c.k), 1, bf16_in);
  auto b = random_values(static_cast<size_t>(ldb) * (tb ? c.k : c.n), 2, bf16_in);
  auto c0 = random_values(static_cast<size_t>(ldc) * c.n, 3, bf16_out);
  if (c.beta == 0)
    for (float& x : c0) x = NAN;  // beta 0 must not read C
  const float alpha = 0.75f;

  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  void* da = bf16_in ? static_cast<void*>(to_device(to_bf16(a))) : to_device(a);
  void* db = bf16_in ? static_cast<void*>(to_device(to_bf16(b))) : to_device(b);
  void* dc = bf16_out ? static_cast<void*>(to_device(to_bf16(c0))) : to_device(c0);
  // D apart starts with other values, which its padding must keep.
  const auto d0 = apart ? random_values(c0.size(), 4, bf16_out) : c0;
  void* dd = !apart ? dc : bf16_out ? static_cast<void*>(to_device(to_bf16(d0))) : to_device(d0);
  const cudaDataType in = bf16_in ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType out = bf16_out ? CUDA_R_16BF : CUDA_R_32F;
  const cublasStatus_t rc =
      lt ? lt_matmul(c, alpha, da, lda, db, ldb, dc, dd, ldc, in, out)
      : kind == Kind::kSgemm
          ? cublasSgemm(h, c.ta, c.tb, c.m, c.n, c.k, &alpha, static_cast<float*>(da), lda,
                        static_cast<float*>(db), ldb, &c.beta, static_cast<float*>(dc), ldc)
          : cublasGemmEx(h, c.ta, c.tb, c.m, c.n, c.k, &alpha, da, in, lda, db, in, ldb, &c.beta,
                         dc, out, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  ASSERT_EQ(rc, CUBLAS_STATUS_SUCCESS);

  auto read = [&](const void* p) {
    std::vector<float> v(c0.size());
    if (bf16_out) {
      std::vector<uint16_t> bits(c0.size());
      EXPECT_EQ(cudaMemcpy(bits.data(), p, bits.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16_to_float(bits[i]);
    } else {
      EXPECT_EQ(cudaMemcpy(v.data(), p, v.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return v;
  };
  const std::vector<float> got = read(dd);
  if (apart) {  // C only read
    const std::vector<float> c_after = read(dc);
    for (size_t i = 0; i < c0.size(); ++i)
      if (!std::isnan(c0[i]) || !std::isnan(c_after[i])) {
        ASSERT_EQ(c_after[i], c0[i]) << "C at " << i;
      }
  }
  for (int j = 0; j < c.n; ++j) {
    for (int i = 0; i < ldc; ++i) {
      const size_t idx = static_cast<size_t>(j) * ldc + i;
      if (i >= c.m) {  // padding: untouched
        if (!std::isnan(d0[idx]) || !std::isnan(got[idx])) {
          ASSERT_EQ(got[idx], d0[idx]);
        }
        continue;
      }
      double want = 0;
      for (int p = 0; p < c.k; ++p) want += double(at(a, lda, ta, i, p)) * at(b, ldb, tb, p, j);
      want = alpha * want + (c.beta == 0 ? 0.0 : double(c.beta) * c0[idx]);
      const double tol = bf16_out ? std::abs(want) * 0x1p-8 + 1e-6 : 1e-6 * (c.k + 1);
      ASSERT_NEAR(got[idx], want, tol) << "C[" << i << ", " << j << "]";
    }
  }
  ASSERT_EQ(cudaFree(da), cudaSuccess);
  ASSERT_EQ(cudaFree(db), cudaSuccess);
  ASSERT_EQ(cudaFree(dc), cudaSuccess);
  if (apart) {
    ASSERT_EQ(cudaFree(dd), cudaSuccess);
  }
  ASSERT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

TEST(CudaEmuCublas, ProductsMatchTheTripleLoop) {
  const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {17, 9, 13}, {4, 3, 0}, {33, 1, 65}};
  for (auto kind :
       {Kind::kSgemm, Kind::kGemmExF32, Kind::kGemmExBf16, Kind::kGemmExBf16Out, Kind::kLtF32,
        Kind::kLtBf16, Kind::kLtBf16Out, Kind::kLtF32Apart, Kind::kLtBf16OutApart})
    for (auto ta : {CUBLAS_OP_N, CUBLAS_OP_T})
      for (auto tb : {CUBLAS_OP_N, CUBLAS_OP_T})
        for (const auto& s : shapes)
          for (float beta : {0.0f, 1.0f}) check({ta, tb, s[0], s[1], s[2], beta}, kind);
}

TEST(CudaEmuCublas, RejectsBadArguments) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float)), cudaSuccess);
  const float one = 1, zero = 0;
  EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, 3, d, 4, &zero, d, 4),
            CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 4, 4, &one, d, 4, d, 4, &zero, d, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d, CUDA_R_32F, 2, d, CUDA_R_16BF, 2,
                   &zero, d, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_NOT_SUPPORTED);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cublasSetStream(h, s), CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_STREQ(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  ASSERT_EQ(cudaFree(d), cudaSuccess);
}

// cuBLASLt's descriptors are checked against each other, as the library does:
// a layout that does not fit the operation, D unlike C, D overlapping C
// without being C, a workspace smaller than the algorithm asked for, an
// unknown attribute.
TEST(CudaEmuCublasLt, RejectsBadArguments) {
  cublasLtHandle_t h = nullptr;
  ASSERT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const int32_t bad_op = 7;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &bad_op, sizeof bad_op),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, c2 = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);   // m 4, k 3
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 3, 4, 3), CUBLAS_STATUS_SUCCESS);   // n 4: C has 5
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 4, 5, 4), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&c2, CUDA_R_16BF, 4, 5, 4), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t ws_bytes = 4096;
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                 sizeof ws_bytes), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, c, pref, 1, &r, &found), CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayout_t b_ok = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&b_ok, CUDA_R_32F, 3, 5, 3), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b_ok, c, c2, pref, 1, &r, &found),
            CUBLAS_STATUS_NOT_SUPPORTED);  // D unlike C
  const int64_t queries = amsp::emu::lt_heuristic_queries();
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b_ok, c, c, pref, 1, &r, &found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(amsp::emu::lt_heuristic_queries(), queries + 1);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(r.workspaceSize, ws_bytes);
  float *da = nullptr, *db = nullptr, *dc = nullptr, *dd = nullptr;
  void* ws = nullptr;
  for (float** p : {&da, &db, &dc, &dd}) ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(p), 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  const float one = 1, zero = 0;
  EXPECT_EQ(cublasLtMatmul(h, desc, &one, da, a, db, b_ok, &zero, dc, c, dc + 1, c, &r.algo, ws,
                           ws_bytes, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);  // D overlaps C
  EXPECT_EQ(cublasLtMatmul(h, desc, &one, da, a, db, b_ok, &zero, dc, c, dd, c, &r.algo, ws,
                           ws_bytes, nullptr),
            CUBLAS_STATUS_SUCCESS);  // D apart from C
  EXPECT_EQ(cublasLtMatmul(h, desc, &one, da, a, db, b_ok, &zero, dc, c, dc, c, &r.algo, ws, ws_bytes - 1, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);  // less workspace than the algorithm asked for
  EXPECT_EQ(cublasLtMatmul(h, desc, &one, da, a, db, b_ok, &zero, dc, c, dc, c, &r.algo, ws, ws_bytes, nullptr),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc), static_cast<void*>(dd), ws})
    ASSERT_EQ(cudaFree(p), cudaSuccess);
  for (cublasLtMatrixLayout_t l : {a, b, c, c2, b_ok}) ASSERT_EQ(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtDestroy(h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtDestroy(h), CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST(CudaEmuCublasDeath, ProductReadingUnorderedInputDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float *a = nullptr, *c = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&a), 16 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&c), 16 * sizeof(float)), cudaSuccess);
  cudaStream_t producer = nullptr, consumer = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(h, consumer), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaMemsetAsync(a, 0, 16 * sizeof(float), producer), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(c, 0, 16 * sizeof(float), consumer), cudaSuccess);
  const float one = 1;
  EXPECT_DEATH(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, 4, 4, 4, &one, a, 4, a, 4, &one, c, 4),
               "read by stream [0-9]+ at .*cublas_test.cpp:[0-9]+ \\(cublasSgemm\\) is not "
               "ordered after the write by stream [0-9]+ at .*\\(cudaMemsetAsync\\)");
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, producer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer, e, 0), cudaSuccess);
  EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, 4, 4, 4, &one, a, 4, a, 4, &one, c, 4),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> host(16, 1.0f);
  EXPECT_DEATH(
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, 4, 4, 4, &one, host.data(), 4, a, 4, &one, c, 4),
      "A .* is not device memory");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaFree(c), cudaSuccess);
}

}  // namespace
