// Linear layers through OpenBLAS sgemm (row-major, weights [out, in]).
//
// OpenBLAS core selection: A DYNAMIC_ARCH OpenBLAS picks its kernels from the
// CPU model number at load time, and releases that predate a CPU (0.3.21 and
// Emerald/Sapphire Rapids, for one) fall back to the generic SSE3 "Prescott"
// kernels: 2.5-3x slower sgemm on an AVX-512 machine. When that happened and
// the user did not choose a core (OPENBLAS_CORETYPE), we pick one from the
// instruction sets the CPU reports and re-run OpenBLAS's own selection, before
// main() and before any BLAS call.
#include <cblas.h>
#include <strings.h>

#include <cstdlib>

#include "kernels/cpu/ops.h"

extern "C" {
// Exported by DYNAMIC_ARCH builds only; weak so other builds still link.
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace amsp::kernels {
namespace {

const char* core_for_this_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  if (__builtin_cpu_supports("avx")) return "SandyBridge";
#endif
  return nullptr;
}

bool retune_openblas() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return false;  // the user's choice
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return false;
  const char* current = openblas_get_corename();
  if (current == nullptr || strcasecmp(current, "prescott") != 0) return false;
  const char* core = core_for_this_cpu();
  if (core == nullptr) return false;
  setenv("OPENBLAS_CORETYPE", core, 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  return true;
}

[[maybe_unused]] const bool retuned = retune_openblas();

}  // namespace

const char* blas_core_name() { return openblas_get_corename(); }

namespace {

// An empty sum (k = 0): y = beta * y, 0 where beta is 0 (whatever y held), as
// BLAS defines it; sgemm itself refuses the leading dimension 0 it would get.
void empty_product(float* y, int64_t n, float beta) {
  for (int64_t i = 0; i < n; ++i) y[i] = beta == 0.0f ? 0.0f : beta * y[i];
}

}  // namespace

void linear_forward(const float* x, const float* w, float* y, int64_t M, int64_t in, int64_t out,
                    float beta) {
  if (M == 0 || out == 0) return;
  if (in == 0) return empty_product(y, M * out, beta);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, out, in, 1.0f, x, in, w, in, beta, y,
              out);
}

void linear_backward_input(const float* dy, const float* w, float* dx, int64_t M, int64_t in,
                           int64_t out, float beta) {
  if (M == 0 || in == 0) return;
  if (out == 0) return empty_product(dx, M * in, beta);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, in, out, 1.0f, dy, out, w, in, beta,
              dx, in);
}

void linear_backward_weight(const float* dy, const float* x, float* dw, int64_t M, int64_t in,
                            int64_t out) {
  if (M == 0 || in == 0 || out == 0) return;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, M, 1.0f, dy, out, x, in, 1.0f, dw,
              in);
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace amsp::kernels
