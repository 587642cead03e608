// Token embedding: the gather, and its deterministic backward (kernels/cuda/ops.h).
//
// Backward groups the rows by token with a stable counting sort on the
// device, then one block per distinct token adds that token's rows in row
// order: the same additions in the same order as the CPU backend, so the
// result is bit-identical to it, and no two blocks write the same table row.
// The sort is one thread's work (O(rows + vocab)): simple and deterministic;
// a parallel scan would be the next step if it shows in a profile.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

AMSP_DEVICE_INLINE float widen(float x) { return x; }
AMSP_DEVICE_INLINE float widen(bf16 x) { return bf16_to_float(x); }

// One block per row (grid-stride over rows), threads across the row.
template <typename T>
__global__ void embedding_forward_kernel(const int32_t* tokens, const T* table, float* out,
                                         int64_t rows, int64_t dim) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* src = table + static_cast<int64_t>(tokens[r]) * dim;
    float* dst = out + r * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = widen(src[j]);
  }
}

// The workspace: begin[vocab + 1] (token t's rows are order[begin[t] ..
// begin[t + 1])), order[rows], used[rows] (the distinct tokens, increasing),
// and the number of distinct tokens.
struct Sorted {
  int32_t* begin;
  int32_t* order;
  int32_t* used;
  int32_t* distinct;
};

AMSP_DEVICE_INLINE Sorted split_workspace(int32_t* w, int64_t rows, int64_t vocab) {
  return Sorted{w, w + vocab + 1, w + vocab + 1 + rows, w + vocab + 1 + 2 * rows};
}

__global__ void sort_rows_kernel(const int32_t* tokens, int32_t* workspace, int64_t rows,
                                 int64_t vocab) {
  const Sorted s = split_workspace(workspace, rows, vocab);
  for (int64_t t = 0; t <= vocab; ++t) s.begin[t] = 0;
  for (int64_t r = 0; r < rows; ++r) ++s.begin[tokens[r] + 1];
  int32_t distinct = 0;
  for (int64_t t = 0; t < vocab; ++t) {
    if (s.begin[t + 1] > 0) s.used[distinct++] = static_cast<int32_t>(t);
    s.begin[t + 1] += s.begin[t];
  }
  *s.distinct = distinct;
  // Placing a row advances its token's begin to the next token's; shifting
  // begin up by one afterwards restores the starts.
  for (int64_t r = 0; r < rows; ++r) s.order[s.begin[tokens[r]]++] = static_cast<int32_t>(r);
  for (int64_t t = vocab; t > 0; --t) s.begin[t] = s.begin[t - 1];
  s.begin[0] = 0;
}

// fp32 table: added into the table row by row, as the CPU kernel does.
AMSP_DEVICE_INLINE void add_rows(float* dst, const float* dout, const Sorted& s, int32_t t,
                                 int64_t dim, int64_t j) {
  float acc = dst[j];
  for (int32_t p = s.begin[t]; p < s.begin[t + 1]; ++p)
    acc += dout[static_cast<int64_t>(s.order[p]) * dim + j];
  dst[j] = acc;
}

// bf16 table: the rows summed in fp32 from the first, then added and rounded once.
AMSP_DEVICE_INLINE void add_rows(bf16* dst, const float* dout, const Sorted& s, int32_t t,
                                 int64_t dim, int64_t j) {
  int32_t p = s.begin[t];
  float acc = dout[static_cast<int64_t>(s.order[p]) * dim + j];
  for (++p; p < s.begin[t + 1]; ++p) acc += dout[static_cast<int64_t>(s.order[p]) * dim + j];
  dst[j] = float_to_bf16(bf16_to_float(dst[j]) + acc);
}

// One block per distinct token (grid-stride), threads across the row.
template <typename T>
__global__ void embedding_accumulate_kernel(const float* dout, T* dtable, const int32_t* workspace,
                                            int64_t rows, int64_t dim, int64_t vocab) {
  const Sorted s = split_workspace(const_cast<int32_t*>(workspace), rows, vocab);
  const int32_t distinct = *s.distinct;
  for (int32_t i = static_cast<int32_t>(blockIdx.x); i < distinct;
       i += static_cast<int32_t>(gridDim.x)) {
    const int32_t t = s.used[i];
    T* dst = dtable + static_cast<int64_t>(t) * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) add_rows(dst, dout, s, t, dim, j);
  }
}

template <typename T>
void embedding_backward_impl(const int32_t* tokens, const float* dout, T* dtable, int64_t rows,
                             int64_t dim, int64_t vocab, int32_t* workspace, cudaStream_t s) {
  if (rows == 0 || dim == 0) return;
  AMSP_LAUNCH(sort_rows_kernel, 1, 1, 0, s)(tokens, workspace, rows, vocab);
  const int64_t blocks = rows < vocab ? rows : vocab;  // at most this many distinct tokens
  AMSP_LAUNCH(embedding_accumulate_kernel<T>, grid_for(blocks, 1), kBlockThreads, 0, s)(
      dout, dtable, workspace, rows, dim, vocab);
}

}  // namespace

void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t rows,
                       int64_t dim, cudaStream_t s) {
  if (rows > 0 && dim > 0)
    AMSP_LAUNCH(embedding_forward_kernel<float>, grid_for(rows, 1), kBlockThreads, 0, s)(
        tokens, table, out, rows, dim);
}

void embedding_forward(const int32_t* tokens, const bf16* table, float* out, int64_t rows,
                       int64_t dim, cudaStream_t s) {
  if (rows > 0 && dim > 0)
    AMSP_LAUNCH(embedding_forward_kernel<bf16>, grid_for(rows, 1), kBlockThreads, 0, s)(
        tokens, table, out, rows, dim);
}

int64_t embedding_backward_workspace(int64_t rows, int64_t vocab) { return vocab + 2 * rows + 2; }

void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, int64_t rows,
                        int64_t dim, int64_t vocab, int32_t* workspace, cudaStream_t s) {
  embedding_backward_impl(tokens, dout, dtable, rows, dim, vocab, workspace, s);
}

void embedding_backward(const int32_t* tokens, const float* dout, bf16* dtable, int64_t rows,
                        int64_t dim, int64_t vocab, int32_t* workspace, cudaStream_t s) {
  embedding_backward_impl(tokens, dout, dtable, rows, dim, vocab, workspace, s);
}

}  // namespace amsp::kernels::cuda
