// cuBLAS's products on OpenBLAS (cublas.h). bf16 operands are widened to fp32
// exactly, then one cblas_sgemm does the work; the product is the one
// CUBLAS_COMPUTE_32F defines, in OpenBLAS's order of summation.
#include "kernels/cuda/emu/cublas.h"

#include <cblas.h>

#include <cstdio>
#include <cstdlib>
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
};

cublasStatus_t validate(const Gemm& g) {
  auto op_ok = [](cublasOperation_t t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T; };
  if (!op_ok(g.ta) || !op_ok(g.tb) || g.m < 0 || g.n < 0 || g.k < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  for (const Matrix* x : {&g.a, &g.b, &g.c})
    if (x->ld < std::max(1, x->rows)) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// C = alpha op(A) op(B) + beta C; beta == 0 does not read C (NaNs there vanish).
void compute(const Gemm& g) {
  std::vector<float> a_store, b_store, c_store;
  const float* a = widened(g.a, a_store);
  const float* b = widened(g.b, b_store);
  float* c = g.c.type == CUDA_R_32F ? static_cast<float*>(const_cast<void*>(g.c.data))
                                    : const_cast<float*>(widened(g.c, c_store));
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

cublasStatus_t gemm(cublasHandle_t handle, Gemm g, const char* op, const char* file, int line) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (const cublasStatus_t rc = validate(g); rc != CUBLAS_STATUS_SUCCESS) return rc;
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  const cudaStream_t s = stream_of(handle);
  if (g.k > 0 && g.alpha != 0) {
    access(s, g.a, false, op, "A", file, line);
    access(s, g.b, false, op, "B", file, line);
  }
  if (g.beta != 0) access(s, g.c, false, op, "C", file, line);
  access(s, g.c, true, op, "C", file, line);
  amsp::emu::count_launch();
  amsp::emu::count_flops(2.0 * g.m * g.n * g.k, g.a.type == CUDA_R_16BF);
  if (amsp::emu::dry_run()) return CUBLAS_STATUS_SUCCESS;
  compute(g);
  return CUBLAS_STATUS_SUCCESS;
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
  const bool types_ok = computeType == CUBLAS_COMPUTE_32F && Atype == Btype &&
                        (Atype == CUDA_R_16BF || (Atype == CUDA_R_32F && Ctype == CUDA_R_32F)) &&
                        (Ctype == CUDA_R_32F || Ctype == CUDA_R_16BF);
  if (!types_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
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
