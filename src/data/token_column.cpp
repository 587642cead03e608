#include "data/token_column.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/h5.h"

namespace amsp::data {
using h5::Handle;

namespace {

constexpr size_t kCachedChunks = 16;  // 4 MiB at prepare's 65536 tokens a chunk

// Whether the dcpl's filters are none, or deflate alone.
bool deflate_only(hid_t dcpl, bool* deflate) {
  const int n = H5Pget_nfilters(dcpl);
  *deflate = n == 1;
  if (n == 0) return true;
  if (n != 1) return false;
  unsigned flags = 0, config = 0;
  size_t nvalues = 0;
  return H5Pget_filter2(dcpl, 0, &flags, &nvalues, nullptr, 0, nullptr, &config) == H5Z_FILTER_DEFLATE;
}

}  // namespace

std::unique_ptr<TokenColumn> TokenColumn::open(hid_t file, const std::string& path, const std::string& name,
                                               int64_t vocab_size) {
  auto c = std::unique_ptr<TokenColumn>(new TokenColumn());
  c->path_ = path;
  c->name_ = name;
  c->vocab_ = vocab_size;
  Handle dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) fail_usage("--data ", path, ": ", name, " is not a dataset");
  Handle type(H5Dget_type(dset), H5Tclose);
  Handle space(H5Dget_space(dset), H5Sclose);
  Handle dcpl(H5Dget_create_plist(dset), H5Pclose);
  if (!type.valid() || !space.valid() || !dcpl.valid()) fail("--data ", path, ": HDF5 cannot inspect ", name);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (H5Tget_class(type) != H5T_INTEGER || rank != 1)
    fail_usage("--data ", path, ": ", name, " is ", H5Tget_class(type) == H5T_INTEGER ? "an integer" : "a non-integer",
               " array of rank ", rank, "; expected a 1-D uint32 array of token ids");
  hsize_t n = 0;
  if (H5Sget_simple_extent_dims(space, &n, nullptr) != 1) fail("--data ", path, ": HDF5 cannot size ", name);
  c->size_ = static_cast<int64_t>(n);
  if (n == 0) return c;
  c->is_signed_ = H5Tget_sign(type) == H5T_SGN_2;
  const bool raw_int32 = H5Tget_size(type) == 4 && H5Tget_order(type) == H5T_ORDER_LE;
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  bool deflate = false;
  if (raw_int32 && layout == H5D_CONTIGUOUS && H5Dget_offset(dset) != HADDR_UNDEF) {
    c->kind_ = Kind::kContiguous;
    c->address_ = H5Dget_offset(dset);
    c->layout_ = "contiguous";
  } else if (raw_int32 && layout == H5D_CHUNKED && deflate_only(dcpl, &deflate)) {
    c->deflate_ = deflate;
    c->locate_chunks(dset, dcpl);
  }
  if (c->kind_ != Kind::kMemory) {
    c->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (c->fd_ < 0) fail_usage("--data ", path, ": cannot open the file: ", std::strerror(errno));
    return c;
  }
  // Anything else: HDF5 converts the whole split now, and the ids are checked here.
  c->memory_.resize(n);
  if (H5Dread(dset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, c->memory_.data()) < 0)
    fail("--data ", path, ": HDF5 cannot read ", name, " (damaged file?)");
  c->layout_ = "in memory (not 4-byte integers, contiguous or chunked with deflate alone)";
  for (int64_t i = 0; i < c->size_; ++i) {
    const int32_t v = c->memory_[static_cast<size_t>(i)];
    if (v < 0 || v >= vocab_size)
      fail_usage("--data ", path, ": ", name, "[", i, "] = ", v, " is outside the vocabulary [0, ", vocab_size, ")");
  }
  return c;
}

// Every chunk's place in the file, found now, while HDF5 may be called. A
// chunk never written (HDF5 would read its fill value) leaves the split to be
// read into memory.
void TokenColumn::locate_chunks(hid_t dset, hid_t dcpl) {
  hsize_t dim = 0;
  if (H5Pget_chunk(dcpl, 1, &dim) != 1 || dim == 0) fail("--data ", path_, ": HDF5 cannot read ", name_, "'s chunk size");
  chunk_elems_ = static_cast<int64_t>(dim);
  const int64_t count = (size_ + chunk_elems_ - 1) / chunk_elems_;
  chunks_.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    hsize_t offset = static_cast<hsize_t>(i * chunk_elems_), bytes = 0;
    unsigned mask = 0;
    haddr_t address = HADDR_UNDEF;
    if (H5Dget_chunk_info_by_coord(dset, &offset, &mask, &address, &bytes) < 0 || address == HADDR_UNDEF) {
      chunks_.clear();
      return;
    }
    chunks_[static_cast<size_t>(i)] = {address, bytes, deflate_ && (mask & 1u) == 0};
  }
  kind_ = Kind::kChunked;
  layout_ = cat("chunked", deflate_ ? ", deflate" : "", ", ", chunk_elems_, " tokens a chunk");
}

TokenColumn::~TokenColumn() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenColumn::damaged(const std::string& what) const {
  fail("--data ", path_, ": cannot read ", name_, ": ", what, " (a damaged or truncated file?)");
}

void TokenColumn::read_raw(uint64_t address, uint64_t bytes, void* out) const {
  auto* p = static_cast<char*>(out);
  for (uint64_t done = 0; done < bytes;) {
    const ssize_t r = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(address + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) damaged(cat("bytes ", address, "..", address + bytes, ": ", std::strerror(errno)));
    if (r == 0) damaged(cat("the file ends before byte ", address + bytes));
    done += static_cast<uint64_t>(r);
  }
}

std::shared_ptr<const std::vector<uint32_t>> TokenColumn::chunk(int64_t index) const {
  std::lock_guard lock(mu_);
  for (auto it = cache_.begin(); it != cache_.end(); ++it)
    if (it->first == index) {
      cache_.splice(cache_.begin(), cache_, it);
      return it->second;
    }
  const Chunk& c = chunks_[static_cast<size_t>(index)];
  auto data = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(chunk_elems_));
  const uLongf want = static_cast<uLongf>(chunk_elems_) * 4;
  if (!c.filtered) {
    if (c.bytes != want) damaged(cat("chunk ", index, " holds ", c.bytes, " bytes, expected ", want));
    read_raw(c.address, c.bytes, data->data());
  } else {
    std::vector<unsigned char> stored(c.bytes);
    read_raw(c.address, c.bytes, stored.data());
    uLongf got = want;
    const int z = uncompress(reinterpret_cast<Bytef*>(data->data()), &got, stored.data(), c.bytes);
    if (z != Z_OK || got != want)
      damaged(cat("chunk ", index, " does not inflate to ", want, " bytes (zlib: ", zError(z), ")"));
  }
  cache_.emplace_front(index, data);
  if (cache_.size() > kCachedChunks) cache_.pop_back();
  return data;
}

void TokenColumn::convert(const uint32_t* raw, int64_t first_index, int64_t count, int32_t* out) const {
  for (int64_t i = 0; i < count; ++i) {
    // uint32 ids above 2^31 - 1 and negative int32 ids both fail the check.
    const bool ok = is_signed_ ? static_cast<int32_t>(raw[i]) >= 0 && static_cast<int64_t>(raw[i]) < vocab_
                               : static_cast<int64_t>(raw[i]) < vocab_;
    if (!ok)
      fail_usage("--data ", path_, ": ", name_, "[", first_index + i, "] = ",
                 is_signed_ ? static_cast<int64_t>(static_cast<int32_t>(raw[i])) : static_cast<int64_t>(raw[i]),
                 " is outside the vocabulary [0, ", vocab_, ")");
    out[i] = static_cast<int32_t>(raw[i]);
  }
}

void TokenColumn::read(int64_t start, int64_t count, int32_t* out) const {
  if (start < 0 || count < 0 || start + count > size_)
    fail("--data ", path_, ": ", name_, ": tokens [", start, ", ", start + count, ") are outside [0, ", size_, ")");
  if (count == 0) return;
  if (kind_ == Kind::kMemory) {
    std::memcpy(out, memory_.data() + start, sizeof(int32_t) * static_cast<size_t>(count));
  } else if (kind_ == Kind::kContiguous) {
    std::vector<uint32_t> raw(static_cast<size_t>(count));
    read_raw(address_ + 4 * static_cast<uint64_t>(start), 4 * static_cast<uint64_t>(count), raw.data());
    convert(raw.data(), start, count, out);
  } else {
    for (int64_t i = start; i < start + count;) {
      const int64_t index = i / chunk_elems_, within = i - index * chunk_elems_;
      const int64_t take = std::min(count - (i - start), chunk_elems_ - within);
      convert(chunk(index)->data() + within, i, take, out + (i - start));
      i += take;
    }
  }
}

}  // namespace amsp::data
