// Tokenizes a stream of documents on several threads and hands the ids back
// in the documents' order, so that the output does not depend on the thread
// count. Memory stays bounded: the reader waits while a few batches per thread
// are in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace amsp::data {

// Reads documents with next(&text) until it returns false, encodes each with
// tokenizer.encode_document on `threads` threads (>= 1) and passes the ids of
// consecutive documents to sink, in order, on the calling thread. An exception
// from next, the tokenizer or sink ends the run and is rethrown here.
void encode_in_order(const std::function<bool(std::string*)>& next, const Tokenizer& tokenizer, int threads,
                     const std::function<void(const std::vector<int32_t>&)>& sink);

// The processors this process may run on (its CPU affinity, as Slurm sets it).
int available_cores();

}  // namespace amsp::data
