// cuBLAS's products on OpenBLAS (cublas.h). bf16 operands are widened to fp32
// exactly, then one cblas_sgemm does the work; the product is the one
// CUBLAS_COMPUTE_32F defines, in OpenBLAS's order of summation.
#include "kernels/cuda/emu/cublas.h"

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cuda/emu/hb.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

using amsp::emu::Memory;

std::mutex g_mu;
std::set<cublasHandle_t> g_handles;

bool valid(cublasHandle_t h) {
  std::lock_guard lock(g_mu);
  return g_handles.count(h) != 0;
}

cudaStream_t stream_of(cublasHandle_t h) {
  std::lock_guard lock(g_mu);
  return h->stream;
}

size_t type_bytes(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

// A column-major rows x cols matrix with leading dimension ld.
struct Matrix {
  const void* data = nullptr;
  cudaDataType type = CUDA_R_32F;
  int rows = 0, cols = 0, ld = 0;
  // The bytes it spans, from the first element to the last.
  size_t span() const {
    if (rows == 0 || cols == 0) return 0;
    return (static_cast<size_t>(cols - 1) * ld + rows) * type_bytes(type);
  }
  size_t elements() const { return span() / type_bytes(type); }
};

// Records one operand access on the handle's stream; a pointer that is not
// device memory is a bug a GPU would report as an illegal address.
void access(cudaStream_t s, const Matrix& m, bool write, const char* op, const char* name,
            const char* file, int line) {
  const size_t bytes = m.span();
  if (bytes == 0) return;
  const Memory kind = amsp::emu::memory_of(m.data, bytes);
  if (kind == Memory::kHost || kind == Memory::kOutside ||
      !amsp::emu::op_access(s, m.data, bytes, write, op, file, line)) {
    std::fprintf(stderr, "amsp emu: %s at %s:%d: %s [%p, +%zu bytes) is %s\n", op, file, line, name,
                 m.data, bytes,
                 kind == Memory::kHost ? "not device memory" : "past the end of its allocation");
    std::fflush(stderr);
    std::abort();
  }
}

// The matrix as fp32: itself, or a widened copy held in `store`.
const float* widened(const Matrix& m, std::vector<float>& store) {
  if (m.type == CUDA_R_32F) return static_cast<const float*>(m.data);
  const uint16_t* h = static_cast<const uint16_t*>(m.data);
  store.resize(m.elements());
  for (size_t i = 0; i < store.size(); ++i) store[i] = amsp::kernels::bf16_to_float(h[i]);
  return store.data();
}

struct Gemm {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  Matrix a, b, c;
  // Where beta's C is read: c.data, or (cublasLtMatmul's C apart from its D)
  // another matrix of c's layout.
  const void* c_in = nullptr;
  Matrix source() const {
    Matrix s = c;
    if (c_in) s.data = c_in;
    return s;
  }
};

cublasStatus_t validate(const Gemm& g) {
  auto op_ok = [](cublasOperation_t t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T; };
  if (!op_ok(g.ta) || !op_ok(g.tb) || g.m < 0 || g.n < 0 || g.k < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  for (const Matrix* x : {&g.a, &g.b, &g.c})
    if (x->ld < std::max(1, x->rows)) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// C = alpha op(A) op(B) + beta C_in (C_in: g.source()); beta == 0 does not
// read it (NaNs there vanish).
void compute(const Gemm& g) {
  std::vector<float> a_store, b_store, c_store;
  const float* a = widened(g.a, a_store);
  const float* b = widened(g.b, b_store);
  const Matrix in = g.source();
  float* c = g.c.type == CUDA_R_32F ? static_cast<float*>(const_cast<void*>(g.c.data))
                                    : const_cast<float*>(widened(in, c_store));
  if (g.c.type == CUDA_R_32F && in.data != g.c.data && g.beta != 0)
    for (int j = 0; j < g.n; ++j)
      std::memcpy(c + static_cast<size_t>(j) * g.c.ld,
                  static_cast<const float*>(in.data) + static_cast<size_t>(j) * g.c.ld,
                  static_cast<size_t>(g.m) * sizeof(float));
  if (g.k == 0 || g.alpha == 0) {
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i) {
        float& x = c[static_cast<size_t>(j) * g.c.ld + i];
        x = g.beta == 0 ? 0.0f : g.beta * x;
      }
  } else {
    cblas_sgemm(CblasColMajor, g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g.m, g.n, g.k, g.alpha, a, g.a.ld,
                b, g.b.ld, g.beta, c, g.c.ld);
  }
  if (g.c.type == CUDA_R_16BF) {  // rounded once, padding rows left alone
    uint16_t* out = static_cast<uint16_t*>(const_cast<void*>(g.c.data));
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i) {
        const size_t at = static_cast<size_t>(j) * g.c.ld + i;
        out[at] = amsp::kernels::float_to_bf16(c[at]);
      }
  }
}

// A valid product, on stream s: its accesses, its counts and (unless a dry
// run) its values.
cublasStatus_t run(cudaStream_t s, const Gemm& g, const char* op, const char* file, int line) {
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  if (g.k > 0 && g.alpha != 0) {
    access(s, g.a, false, op, "A", file, line);
    access(s, g.b, false, op, "B", file, line);
  }
  if (g.beta != 0) access(s, g.source(), false, op, "C", file, line);
  access(s, g.c, true, op, g.c_in ? "D" : "C", file, line);
  amsp::emu::count_launch();
  amsp::emu::count_flops(2.0 * g.m * g.n * g.k, g.a.type == CUDA_R_16BF);
  if (amsp::emu::dry_run()) return CUBLAS_STATUS_SUCCESS;
  compute(g);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm(cublasHandle_t handle, const Gemm& g, const char* op, const char* file, int line) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (const cublasStatus_t rc = validate(g); rc != CUBLAS_STATUS_SUCCESS) return rc;
  return run(stream_of(handle), g, op, file, line);
}

// The types GemmEx and cublasLtMatmul take: A and B both fp32 (C fp32) or both
// bf16 (C fp32 or bf16), fp32 compute.
bool types_ok(cudaDataType a, cudaDataType b, cudaDataType c, cublasComputeType_t compute) {
  return compute == CUBLAS_COMPUTE_32F && a == b &&
         (a == CUDA_R_16BF || (a == CUDA_R_32F && c == CUDA_R_32F)) &&
         (c == CUDA_R_32F || c == CUDA_R_16BF);
}

// Operand shapes as stored: op(A) is m x k, op(B) is k x n, C is m x n.
Gemm shape(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
           float beta) {
  Gemm g;
  g.ta = ta;
  g.tb = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = alpha;
  g.beta = beta;
  g.a.rows = ta == CUBLAS_OP_N ? m : k;
  g.a.cols = ta == CUBLAS_OP_N ? k : m;
  g.b.rows = tb == CUBLAS_OP_N ? k : n;
  g.b.cols = tb == CUBLAS_OP_N ? n : k;
  g.c.rows = m;
  g.c.cols = n;
  return g;
}

}  // namespace

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (!value) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = 13; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = 0; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = 0; return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  std::lock_guard lock(g_mu);
  g_handles.insert(*handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  {
    std::lock_guard lock(g_mu);
    if (!g_handles.erase(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!amsp::emu::stream_valid(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  std::lock_guard lock(g_mu);
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc, const char* file, int line) {
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  Gemm g = shape(transa, transb, m, n, k, *alpha, *beta);
  g.a.data = A;
  g.a.ld = lda;
  g.b.data = B;
  g.b.ld = ldb;
  g.c.data = C;
  g.c.ld = ldc;
  return gemm(handle, g, "cublasSgemm", file, line);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo, const char* file, int line) {
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (!types_ok(Atype, Btype, Ctype, computeType)) return CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm g = shape(transa, transb, m, n, k, *static_cast<const float*>(alpha),
                 *static_cast<const float*>(beta));
  g.a = {A, Atype, g.a.rows, g.a.cols, lda};
  g.b = {B, Btype, g.b.rows, g.b.cols, ldb};
  g.c = {C, Ctype, g.c.rows, g.c.cols, ldc};
  return gemm(handle, g, "cublasGemmEx", file, line);
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

// ---- cuBLASLt ----------------------------------------------------------------------------

struct cublasLtContext {};

namespace {

// What the opaque descriptors hold here (each fits its opaque struct).
struct Desc {
  cublasComputeType_t compute;
  cudaDataType scale;
  cublasOperation_t ta, tb;
};
struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Preference {
  uint64_t max_workspace;
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

std::set<cublasLtHandle_t> g_lt_handles;
int64_t g_heuristic_queries = 0;
constexpr uint64_t kAlgoTag = 0x616d7370;  // the one algorithm: its data[0]
constexpr size_t kAlgoWorkspace = size_t{4} << 20;

bool lt_valid(cublasLtHandle_t h) {
  std::lock_guard lock(g_mu);
  return g_lt_handles.count(h) != 0;
}

Desc& desc_of(cublasLtMatmulDesc_t d) { return *reinterpret_cast<Desc*>(d); }
const Layout& layout_of(cublasLtMatrixLayout_t l) { return *reinterpret_cast<const Layout*>(l); }

// The product the descriptors describe, or why not: shapes that agree with the
// operations, D's layout C's, every dimension within int.
cublasStatus_t lt_gemm(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, Gemm& g) {
  if (!desc || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
  const Desc& op = desc_of(desc);
  const Layout &la = layout_of(a), &lb = layout_of(b), &lc = layout_of(c), &ld = layout_of(d);
  if (op.scale != CUDA_R_32F || !types_ok(la.type, lb.type, lc.type, op.compute))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld.type != lc.type || ld.rows != lc.rows || ld.cols != lc.cols || ld.ld != lc.ld)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t limit = 0x7fffffff;
  for (const Layout* l : {&la, &lb, &lc})
    if (l->rows > limit || l->cols > limit || l->ld < 0 || l->ld > static_cast<int64_t>(limit))
      return CUBLAS_STATUS_INVALID_VALUE;
  const uint64_t m = lc.rows, n = lc.cols, k = op.ta == CUBLAS_OP_N ? la.cols : la.rows;
  const uint64_t am = op.ta == CUBLAS_OP_N ? la.rows : la.cols;
  const uint64_t bk = op.tb == CUBLAS_OP_N ? lb.rows : lb.cols, bn = op.tb == CUBLAS_OP_N ? lb.cols : lb.rows;
  if (am != m || bk != k || bn != n) return CUBLAS_STATUS_INVALID_VALUE;
  g = shape(op.ta, op.tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, 0.0f);
  g.a.type = la.type;
  g.a.ld = static_cast<int>(la.ld);
  g.b.type = lb.type;
  g.b.ld = static_cast<int>(lb.ld);
  g.c.type = lc.type;
  g.c.ld = static_cast<int>(lc.ld);
  return validate(g);
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  std::lock_guard lock(g_mu);
  g_lt_handles.insert(*handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  {
    std::lock_guard lock(g_mu);
    if (!g_lt_handles.erase(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtMatmulDescOpaque_t{};
  desc_of(*desc) = Desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (!desc || !buf || size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  int32_t value;
  std::memcpy(&value, buf, sizeof value);
  if (value != CUBLAS_OP_N && value != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
  const auto op = static_cast<cublasOperation_t>(value);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: desc_of(desc).ta = op; return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB: desc_of(desc).tb = op; return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  if (type != CUDA_R_32F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  *layout = new cublasLtMatrixLayoutOpaque_t{};
  *reinterpret_cast<Layout*>(*layout) = Layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (!pref || !buf || size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::memcpy(&reinterpret_cast<Preference*>(pref)->max_workspace, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  if (!lt_valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!pref || requested < 1 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
  {
    std::lock_guard lock(g_mu);
    ++g_heuristic_queries;
  }
  Gemm g;
  if (const cublasStatus_t rc = lt_gemm(desc, a, b, c, d, g); rc != CUBLAS_STATUS_SUCCESS) return rc;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = kAlgoTag;
  results[0].workspaceSize =
      std::min<size_t>(reinterpret_cast<const Preference*>(pref)->max_workspace, kAlgoWorkspace);
  results[0].algo.data[1] = results[0].workspaceSize;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream, const char* file, int line) {
  if (!lt_valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!alpha || !beta || !algo || algo->data[0] != kAlgoTag) return CUBLAS_STATUS_INVALID_VALUE;
  if (!amsp::emu::stream_valid(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  Gemm g;
  if (const cublasStatus_t rc = lt_gemm(desc, a, b, c, d, g); rc != CUBLAS_STATUS_SUCCESS) return rc;
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  g.a.data = A;
  g.b.data = B;
  g.c.data = D;
  if (C != D) {
    // Disjoint, as cuBLASLt requires of an out-of-place product.
    const auto *c0 = static_cast<const char*>(C), *d0 = static_cast<const char*>(D);
    const size_t span = g.c.span();
    if (c0 < d0 + span && d0 < c0 + span) return CUBLAS_STATUS_INVALID_VALUE;
    g.c_in = C;
  }
  const size_t needed = algo->data[1];
  if (workspace_bytes < needed) return CUBLAS_STATUS_INVALID_VALUE;
  // The workspace: ordered and checked like an operand, its bytes not counted
  // (scratch the library may use, not traffic the product needs).
  if (needed > 0 && g.m > 0 && g.n > 0) amsp::emu::hb_access_sparse(stream, workspace, needed, 0, true, file, line);
  return run(stream, g, "cublasLtMatmul", file, line);
}

int64_t amsp::emu::lt_heuristic_queries() {
  std::lock_guard lock(g_mu);
  return g_heuristic_queries;
}
