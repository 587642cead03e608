// Causal grouped-query attention. Per (sequence, head) the score and value
// products are sgemm calls reading the projections in place through
// leading-dimension strides. Queries are processed in blocks of kBlock
// rows so that only the keys a block can see (the causal lower triangle, up to
// the block's last row) are multiplied.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {
namespace {

constexpr int64_t kBlock = 64;

// Per-thread scratch that survives across calls (OpenMP keeps its threads).
float* scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// Rows [0, T) of one head's gradient (row stride ld) rotated back in place:
// the gradient with respect to the unrotated q or k.
void rotate_back(float* x, int64_t ld, int64_t T, int64_t D, Rotary rope) {
  if (!rope.cos) return;
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t) {
    float* a = x + t * ld;
    const float* c = rope.cos + t * half;
    const float* s = rope.sin + t * half;
    for (int64_t i = 0; i < half; ++i) rope_rotate(a[i], a[i + half], c[i], -s[i]);
  }
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, int64_t ldq, int64_t ldk,
                       float* probs, float* out, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t D) {
  const int64_t group = H / KV, ldo = H * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H, kvh = h / group;
    const float* Q = q + b * T * ldq + h * D;
    const float* K = k + b * T * ldk + kvh * D;
    const float* Vm = v + b * T * ldk + kvh * D;
    float* O = out + b * T * ldo + h * D;
    float* P = probs + bh * T * T;
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), m = r1 - r0;
      // S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, D, scale, Q + r0 * ldq, ldq, K,
                  ldk, 0.0f, P + r0 * T, T);
      for (int64_t i = r0; i < r1; ++i) {
        float* row = P + i * T;
        const int64_t n = i + 1;  // keys 0..i are visible
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; ++j) {
          const float e = fast_exp(row[j] - mx);
          row[j] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) row[j] *= inv;
        for (int64_t j = n; j < r1; ++j) row[j] = 0.0f;
      }
      // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, r1, 1.0f, P + r0 * T, T, Vm,
                  ldk, 0.0f, O + r0 * ldo, ldo);
    }
  }
}

void attention_backward(const float* q, const float* k, const float* v, int64_t ldq, int64_t ldk,
                        Rotary rope, const float* probs, const float* dout, float* dq, float* dk,
                        float* dv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t group = H / KV, ldo = H * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // One task per (sequence, kv head): the query heads sharing a kv head add
  // into the same dK/dV, in head order, inside one thread.
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < B * KV; ++bk) {
    const int64_t b = bk / KV, kvh = bk % KV;
    const float* K = k + b * T * ldk + kvh * D;
    const float* Vm = v + b * T * ldk + kvh * D;
    float* dK = dk + b * T * ldk + kvh * D;
    float* dV = dv + b * T * ldk + kvh * D;
    for (int64_t t = 0; t < T; ++t) {
      std::fill(dK + t * ldk, dK + t * ldk + D, 0.0f);
      std::fill(dV + t * ldk, dV + t * ldk + D, 0.0f);
    }
    float* dS = scratch(kBlock * T);
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      const float* Q = q + b * T * ldq + h * D;
      const float* dO = dout + b * T * ldo + h * D;
      float* dQ = dq + b * T * ldq + h * D;
      const float* P = probs + (b * H + h) * T * T;
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(T, r0 + kBlock), m = r1 - r0;
        // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T   (into dS, row stride r1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, D, 1.0f, dO + r0 * ldo, ldo,
                    Vm, ldk, 0.0f, dS, r1);
        // dS = scale * P * (dP - sum_j P dP)
        for (int64_t i = r0; i < r1; ++i) {
          const float* p = P + i * T;
          float* d = dS + (i - r0) * r1;
          const int64_t n = i + 1;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t j = 0; j < n; ++j) dot += p[j] * d[j];
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) d[j] = scale * p[j] * (d[j] - dot);
          for (int64_t j = n; j < r1; ++j) d[j] = 0.0f;
        }
        // dQ[r0:r1] = dS K[0:r1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, r1, 1.0f, dS, r1, K, ldk, 0.0f,
                    dQ + r0 * ldq, ldq);
        // dK[0:r1] += dS^T Q[r0:r1]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, D, m, 1.0f, dS, r1, Q + r0 * ldq,
                    ldq, 1.0f, dK, ldk);
        // dV[0:r1] += P[r0:r1, 0:r1]^T dO[r0:r1]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, D, m, 1.0f, P + r0 * T, T,
                    dO + r0 * ldo, ldo, 1.0f, dV, ldk);
      }
      rotate_back(dQ, ldq, T, D, rope);
    }
    rotate_back(dK, ldk, T, D, rope);
  }
}

}  // namespace amsp::kernels
