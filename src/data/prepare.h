// The pieces of `amsp data prepare`, for running it on several ranks: each
// rank tokenizes a share of the files (tokenize_files) into a part, and one
// writes the dataset from the parts in order (DatasetWriter). One process
// does both in prepare_dataset (data/dataset.h). The file is the same either
// way, whatever the rank and thread counts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace amsp::data {

// What reading the documents counted.
struct TokenizeCounts {
  int64_t documents = 0;
  int64_t bytes_in = 0;
  int64_t skipped = 0;  // bad JSON Lines records skipped
};

// Checked before any input is read: a bad option should not cost a long tokenization.
void check_prepare_options(const PrepareOptions& options);

// Reads the documents of `files` in order and tokenizes them on options.threads
// threads (0: every core), passing the ids to sink in document order.
TokenizeCounts tokenize_files(const std::vector<std::string>& files, const PrepareOptions& options,
                              const Tokenizer& tokenizer, const std::function<void(const int32_t*, size_t)>& sink);

// The files [first, last) that part `part` of `parts` tokenizes: consecutive
// files of about equal size, so that the parts in order are the corpus in order.
std::pair<size_t, size_t> file_share(const std::vector<std::string>& files, int part, int parts);

// The dataset being written to options.output + ".tmp": tokens in, split into
// train and held-out as they come, renamed into place by finish(). Destroyed
// unfinished, it removes the temporary file: a failed prepare leaves nothing
// under the output name and an existing file there as it was.
class DatasetWriter {
 public:
  DatasetWriter(const PrepareOptions& options, const Tokenizer& tokenizer);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Throws UsageError for an id outside the tokenizer's vocabulary.
  void push(const int32_t* ids, size_t n);
  // Throws UsageError for a corpus without documents.
  PrepareReport finish(const std::vector<std::string>& files, const TokenizeCounts& counts);

 private:
  struct File;
  std::unique_ptr<File> file_;
};

}  // namespace amsp::data
