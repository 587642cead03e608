// One split's tokens (a 1-D integer dataset of a token dataset file), read by
// range straight from the file: a rank holds the windows it trains on, never
// the corpus (doc/data.md, "Reading while training").
//
// HDF5 runs only in open(): it checks the dataset and notes where its data
// lie in the file. A dataset of 4-byte little-endian integers, contiguous or
// chunked without a filter or with deflate alone (what `amsp data prepare`
// writes), is then read with pread and, for deflate, zlib, with a small cache
// of inflated chunks; reads are thread-safe and never call HDF5, which the
// checkpoint writer may be using (the HDF5 build is not thread-safe). Any
// other layout (another filter, another integer size) is read into memory
// whole in open(), as h5py would.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace amsp::data {

class TokenColumn {
 public:
  TokenColumn() = default;  // an empty split
  // Opens dataset `name` of the open file `file` (path names it in errors).
  // UsageError in one line if it is not a 1-D integer dataset; chunks it
  // cannot locate leave the split to be read into memory. Token ids are
  // checked as they are read.
  static std::unique_ptr<TokenColumn> open(hid_t file, const std::string& path, const std::string& name,
                                           int64_t vocab_size);
  ~TokenColumn();
  TokenColumn(const TokenColumn&) = delete;
  TokenColumn& operator=(const TokenColumn&) = delete;

  int64_t size() const { return size_; }
  // Tokens [start, start + count) into out. UsageError naming the dataset and
  // the index of an id outside [0, vocab_size); Error for a read that fails (a
  // truncated or damaged file).
  void read(int64_t start, int64_t count, int32_t* out) const;
  // "chunked, deflate, 65536 tokens a chunk", "contiguous", "in memory (...)".
  const std::string& layout() const { return layout_; }

 private:
  struct Chunk {
    uint64_t address = 0;  // byte offset in the file
    uint64_t bytes = 0;    // stored (compressed) size
    bool filtered = true;  // false: this chunk's deflate was skipped (filter mask)
  };
  enum class Kind { kMemory, kContiguous, kChunked };

  std::string path_, name_;
  int64_t vocab_ = 0, size_ = 0;
  Kind kind_ = Kind::kMemory;
  std::string layout_ = "empty";
  bool is_signed_ = false, deflate_ = false;
  int fd_ = -1;
  uint64_t address_ = 0;       // kContiguous
  int64_t chunk_elems_ = 0;    // kChunked
  std::vector<Chunk> chunks_;  // kChunked, in order
  std::vector<int32_t> memory_;

  // Inflated chunks, most recently used first (kChunked).
  mutable std::mutex mu_;
  mutable std::list<std::pair<int64_t, std::shared_ptr<const std::vector<uint32_t>>>> cache_;

  void locate_chunks(hid_t dset, hid_t dcpl);
  std::shared_ptr<const std::vector<uint32_t>> chunk(int64_t index) const;
  void read_raw(uint64_t address, uint64_t bytes, void* out) const;
  void convert(const uint32_t* raw, int64_t first_index, int64_t count, int32_t* out) const;
  [[noreturn]] void damaged(const std::string& what) const;
};

}  // namespace amsp::data
