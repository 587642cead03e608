// Token datasets in HDF5: what `amsp data prepare` writes and `amsp train` reads.
//
// File layout (format version 1), readable with h5py/h5dump:
//   /                 attributes: format = "amsp-token-dataset", version = 1,
//                     tokenizer = "byte" | "sentencepiece" | "huggingface", vocab_size, bos_id,
//                     eos_id, documents, sources (newline-joined input files);
//                     informative only: bytes_in, valid_fraction, split_block
//   /train/tokens     1-D uint32 (chunked, deflate)
//   /valid/tokens     1-D uint32, the held-out split (may be empty; a file
//                     without it reads as an empty held-out split)
//   /tokenizer/model  1-D uint8, the SentencePiece model proto or the tokenizer.json
//                     text (all but byte)
// Strings are variable-length UTF-8 (h5py reads them as str); integers int64.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/documents.h"
#include "data/token_column.h"
#include "data/tokenizer.h"

namespace amsp::data {

enum class Split { kTrain, kValid };

// The root's format and version attributes.
inline constexpr const char* kDatasetFormat = "amsp-token-dataset";
inline constexpr int64_t kDatasetVersion = 1;

struct PrepareOptions {
  std::vector<std::string> inputs;    // files, folders or globs (data/documents.h)
  InputOptions input;                 // their format, the JSON field, bad records
  std::string output;                 // .h5 path
  std::string tokenizer = "byte";     // see make_tokenizer
  double valid_fraction = 0.05;       // share of tokens held out
  int threads = 0;                    // tokenizer threads; 0: every core this process may use
};

struct PrepareReport {
  int64_t documents = 0;
  int64_t bytes_in = 0;
  int64_t train_tokens = 0;
  int64_t valid_tokens = 0;
  int64_t vocab_size = 0;
  int64_t skipped = 0;  // bad JSON Lines records skipped (--skip-bad-records)
};

// Tokenizes the inputs and writes the dataset (to a temporary name, renamed into
// place when complete, so a failed prepare never leaves a half-written file at
// output), streaming: memory does not grow with the corpus. The held-out split
// takes every k-th block of the token stream (data/block_split.h) so that it
// samples the whole corpus rather than its last document.
PrepareReport prepare_dataset(const PrepareOptions& options);

// The tokenizer a dataset was prepared with (byte, or the stored SentencePiece
// model or tokenizer.json), e.g. to decode samples. Throws UsageError like TokenDataset.
std::unique_ptr<Tokenizer> dataset_tokenizer(const std::string& path);

// A dataset opened for training. The splits stay in the file: windows are
// read as they are needed (data/token_column.h), from any thread.
class TokenDataset {
 public:
  // Throws UsageError with a one-line reason: missing file, not HDF5, wrong
  // format attribute ("is this a tokenized dataset?"), unsupported version,
  // missing /train/tokens, wrong dtype or rank. An id outside [0, vocab_size)
  // is a UsageError when a read meets it.
  explicit TokenDataset(const std::string& path);
  ~TokenDataset();

  const std::string& path() const { return path_; }
  const std::string& tokenizer() const { return tokenizer_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t size(Split split) const;
  // Tokens [start, start + count) of a split.
  void read(Split split, int64_t start, int64_t count, int32_t* out) const;
  // A whole split (tests and small tools).
  std::vector<int32_t> tokens(Split split) const;
  // How a split is read ("chunked, deflate, 65536 tokens a chunk", ...).
  std::string layout(Split split) const;

 private:
  std::string path_;
  std::string tokenizer_;
  int64_t vocab_size_ = 0;
  std::unique_ptr<TokenColumn> train_, valid_;
  const TokenColumn& column(Split split) const { return split == Split::kTrain ? *train_ : *valid_; }
};

// The counter that the random draws of row `row` of step `step` use: distinct
// for every pair with 0 <= step, row < 2^32 (a runtime failure outside).
uint64_t step_row_index(int64_t step, int64_t row);

// Fills B windows of T+1 consecutive tokens: tokens[b*T + t] = w[t], targets =
// w[t+1]. Training windows start at positions drawn from (seed, step, row) with
// the counter-based RNG, row = first_row + b: a row's window depends only on
// (seed, step, row), never on how rows are divided among ranks or micro-batches.
// Throws UsageError if the split is shorter than T+1 tokens.
void sample_train_batch(const TokenDataset& data, uint64_t seed, int64_t step, int64_t first_row,
                        int64_t B, int64_t T, int32_t* tokens, int32_t* targets);
// Where row `row` of step `step` starts in the train split: its window is
// tokens [start, start + T]. What sample_train_batch copies, for recording the
// data order.
int64_t train_window_start(const TokenDataset& data, uint64_t seed, int64_t step, int64_t row, int64_t T);

// Evaluation windows: a split (the held-out one unless asked) cut into
// consecutive windows of T+1 tokens (stride T); window i for i in
// [0, num_eval_windows). Deterministic.
int64_t num_eval_windows(const TokenDataset& data, int64_t T, Split split = Split::kValid);
void eval_batch(const TokenDataset& data, int64_t first_window, int64_t B, int64_t T,
                int32_t* tokens, int32_t* targets, Split split = Split::kValid);

}  // namespace amsp::data
