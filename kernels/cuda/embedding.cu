// Token embedding: the gather, and its deterministic backward (kernels/cuda/ops.h).
//
// Backward groups the rows by token with a stable counting sort on the
// device, then one block per distinct token adds that token's rows in row
// order: the same additions in the same order as the CPU backend, so the
// result is bit-identical to it, and no two blocks write the same table row.
// The sort is spread over the device: the counts over every row, the scan of
// the vocabulary by a block of 1024 threads (each a run of vocab / 1024
// entries), the placement of the rows by that block a tile at a time.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// One block per row (grid-stride over rows), threads across the row.
template <typename T>
__global__ void embedding_forward_kernel(const int32_t* tokens, const T* table, float* out,
                                         int64_t rows, int64_t dim) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* src = table + static_cast<int64_t>(tokens[r]) * dim;
    float* dst = out + r * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = load(src[j]);
  }
}

// The workspace: begin[vocab + 1] (token t's rows are order[begin[t] ..
// begin[t + 1])), cursor[vocab + 1] (where the next row of token t goes while
// they are placed), order[rows], used[rows] (the distinct tokens, increasing),
// and the number of distinct tokens.
struct Sorted {
  int32_t* begin;
  int32_t* cursor;
  int32_t* order;
  int32_t* used;
  int32_t* distinct;
};

AMSP_DEVICE_INLINE Sorted split_workspace(int32_t* w, int64_t rows, int64_t vocab) {
  return Sorted{w, w + vocab + 1, w + 2 * (vocab + 1), w + 2 * (vocab + 1) + rows,
                w + 2 * (vocab + 1) + 2 * rows};
}

// The sort, in three launches after begin is zeroed: count each token's rows
// (integer atomics: the counts do not depend on their order), scan the counts
// into starts, place the rows. Each step's result depends only on the tokens.
constexpr int kSortThreads = 1024;

// begin[t + 1] = rows of token t.
__global__ void count_tokens_kernel(const int32_t* tokens, int32_t* workspace, int64_t rows, int64_t vocab) {
  const Sorted s = split_workspace(workspace, rows, vocab);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x)
    atomicAdd(&s.begin[tokens[r] + 1], 1);
}

// One block: begin becomes its inclusive prefix sum (token t's first place),
// cursor a copy, used the tokens with rows in increasing order. Each thread
// owns a contiguous run of entries; thread 0 scans the runs' totals.
__global__ void scan_tokens_kernel(int32_t* workspace, int64_t rows, int64_t vocab) {
  __shared__ int32_t run_sum[kSortThreads], run_used[kSortThreads];
  const Sorted s = split_workspace(workspace, rows, vocab);
  const int64_t n = vocab + 1, per = (n + kSortThreads - 1) / kSortThreads;
  const int64_t lo = threadIdx.x * per, hi = lo + per < n ? lo + per : n;
  int32_t sum = 0, used = 0;
  for (int64_t j = lo; j < hi; ++j) {
    sum += s.begin[j];
    used += j > 0 && s.begin[j] > 0;
  }
  run_sum[threadIdx.x] = sum;
  run_used[threadIdx.x] = used;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t total = 0, distinct = 0;
    for (int i = 0; i < kSortThreads; ++i) {
      const int32_t a = run_sum[i], b = run_used[i];
      run_sum[i] = total;
      run_used[i] = distinct;
      total += a;
      distinct += b;
    }
    *s.distinct = distinct;
  }
  __syncthreads();
  sum = run_sum[threadIdx.x];
  used = run_used[threadIdx.x];
  for (int64_t j = lo; j < hi; ++j) {
    if (j > 0 && s.begin[j] > 0) s.used[used++] = static_cast<int32_t>(j - 1);
    sum += s.begin[j];
    s.begin[j] = sum;
    s.cursor[j] = sum;
  }
}

// One block, rows in tiles of its threads, in order: a row goes to its
// token's cursor plus the rows of its token earlier in the tile (a stable
// placement); then the last row of each token in the tile moves the cursor.
__global__ void place_rows_kernel(const int32_t* tokens, int32_t* workspace, int64_t rows, int64_t vocab) {
  __shared__ int32_t tile[kSortThreads];
  const Sorted s = split_workspace(workspace, rows, vocab);
  const int i = static_cast<int>(threadIdx.x);
  for (int64_t base = 0; base < rows; base += kSortThreads) {
    const int64_t r = base + i;
    const int in_tile = static_cast<int>(rows - base < kSortThreads ? rows - base : kSortThreads);
    const int32_t t = r < rows ? tokens[r] : -1;
    tile[i] = t;
    __syncthreads();
    int32_t before = 0;
    bool last = true;
    if (i < in_tile) {
      for (int j = 0; j < i; ++j) before += tile[j] == t;
      for (int j = i + 1; j < in_tile && last; ++j) last = tile[j] != t;
      s.order[s.cursor[t] + before] = static_cast<int32_t>(r);
    }
    __syncthreads();  // every row of the tile placed from the old cursors
    if (i < in_tile && last) s.cursor[t] += before + 1;
    __syncthreads();  // the cursors moved before the next tile reads them, and the tile is free
  }
}

// acc + column j of token t's rows from its p-th on, in row order. A frequent
// token has hundreds of rows: each row's index and value are loaded eight rows
// at a time before they are added (pack.cuh, batched), not one row a latency.
AMSP_DEVICE_INLINE float sum_rows(float acc, const float* dout, const Sorted& s, int32_t p,
                                  int32_t t, int64_t dim, int64_t j) {
  batched<8>(
      p, s.begin[t + 1], 1,
      [&](int64_t q) { return dout[static_cast<int64_t>(s.order[q]) * dim + j]; },
      [&](int64_t, float v) { acc += v; });
  return acc;
}

// fp32 table: added into the table row by row, as the CPU kernel does.
AMSP_DEVICE_INLINE void add_rows(float* dst, const float* dout, const Sorted& s, int32_t t,
                                 int64_t dim, int64_t j) {
  dst[j] = sum_rows(dst[j], dout, s, s.begin[t], t, dim, j);
}

// bf16 table: the rows summed in fp32 from the first, then added and rounded once.
AMSP_DEVICE_INLINE void add_rows(bf16* dst, const float* dout, const Sorted& s, int32_t t,
                                 int64_t dim, int64_t j) {
  const int32_t p = s.begin[t];
  const float acc =
      sum_rows(dout[static_cast<int64_t>(s.order[p]) * dim + j], dout, s, p + 1, t, dim, j);
  dst[j] = float_to_bf16(bf16_to_float(dst[j]) + acc);
}

// A block per distinct token (blockIdx.x, grid-stride) and slice of a row's
// columns (blockIdx.y), a thread a column: a batch of few distinct tokens, each
// with many rows, still spreads over the device.
template <typename T>
__global__ void embedding_accumulate_kernel(const float* dout, T* dtable, const int32_t* workspace,
                                            int64_t rows, int64_t dim, int64_t vocab) {
  const Sorted s = split_workspace(const_cast<int32_t*>(workspace), rows, vocab);
  const int32_t distinct = *s.distinct;
  for (int32_t i = static_cast<int32_t>(blockIdx.x); i < distinct;
       i += static_cast<int32_t>(gridDim.x)) {
    const int32_t t = s.used[i];
    T* dst = dtable + static_cast<int64_t>(t) * dim;
    for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < dim;
         j += static_cast<int64_t>(gridDim.y) * blockDim.x)
      add_rows(dst, dout, s, t, dim, j);
  }
}

template <typename T>
void embedding_backward_impl(const int32_t* tokens, const float* dout, T* dtable, int64_t rows,
                             int64_t dim, int64_t vocab, int32_t* workspace, cudaStream_t s) {
  if (rows == 0 || dim == 0) return;
  fill_i32(workspace, 0, vocab + 1, s);
  AMSP_LAUNCH(count_tokens_kernel, grid_for(rows), kBlockThreads, 0, s)(tokens, workspace, rows, vocab);
  AMSP_LAUNCH(scan_tokens_kernel, 1, kSortThreads, 0, s)(workspace, rows, vocab);
  AMSP_LAUNCH(place_rows_kernel, 1, kSortThreads, 0, s)(tokens, workspace, rows, vocab);
  const int64_t blocks = rows < vocab ? rows : vocab;  // at most this many distinct tokens
  const dim3 grid(grid_for(blocks, 1), grid_for(dim, kBlockThreads, 65535));
  AMSP_LAUNCH(embedding_accumulate_kernel<T>, grid, kBlockThreads, 0, s)
  (dout, dtable, workspace, rows, dim, vocab);
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

int64_t embedding_backward_workspace(int64_t rows, int64_t vocab) { return 2 * (vocab + 1) + 2 * rows + 1; }

void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, int64_t rows,
                        int64_t dim, int64_t vocab, int32_t* workspace, cudaStream_t s) {
  embedding_backward_impl(tokens, dout, dtable, rows, dim, vocab, workspace, s);
}

void embedding_backward(const int32_t* tokens, const float* dout, bf16* dtable, int64_t rows,
                        int64_t dim, int64_t vocab, int32_t* workspace, cudaStream_t s) {
  embedding_backward_impl(tokens, dout, dtable, rows, dim, vocab, workspace, s);
}

}  // namespace amsp::kernels::cuda
