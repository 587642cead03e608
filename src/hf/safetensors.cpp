#include "hf/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/common/math.h"

namespace amsp::hf {
namespace {

// Headers of real models are tens of kilobytes; the format's own reader
// refuses anything above 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: mant * 2^-24, exact in fp32.
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

StoredType parse_stored_type_at(const std::string& s, const std::string& where) {
  if (const auto d = parse_stored_type(s)) return *d;
  fail_usage(where, ": dtype ", s, " is not supported; expected F32, BF16 or F16");
}

void write_all(int fd, const void* buf, uint64_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) fail(path, ": write failed: ", put < 0 ? std::strerror(errno) : "no progress");
    p += put;
    n -= static_cast<uint64_t>(put);
  }
}

void read_exact(int fd, void* buf, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail(path, ": read failed at byte ", offset, got < 0 ? cat(": ", std::strerror(errno)) : ": end of file");
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

TensorInfo parse_tensor(const std::string& path, const std::string& name, const nlohmann::json& j,
                        uint64_t data_start, uint64_t data_bytes) {
  const std::string where = cat(path, ": tensor ", name);
  if (!j.is_object() || !j.contains("dtype") || !j["dtype"].is_string() || !j.contains("shape") ||
      !j["shape"].is_array() || !j.contains("data_offsets") || !j["data_offsets"].is_array() ||
      j["data_offsets"].size() != 2)
    fail_usage(where, ": expected {\"dtype\": ..., \"shape\": [...], \"data_offsets\": [begin, end]}");
  TensorInfo t;
  t.dtype = parse_stored_type_at(j["dtype"].get<std::string>(), where);
  for (const auto& d : j["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
      fail_usage(where, ": shape ", j["shape"].dump(), " is not a list of sizes");
    t.shape.push_back(d.get<int64_t>());
    t.numel *= t.shape.back();
    if (t.numel > (int64_t{1} << 40)) fail_usage(where, ": shape ", j["shape"].dump(), " is too large");
  }
  const auto& off = j["data_offsets"];
  if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    fail_usage(where, ": data_offsets ", off.dump(), " are not byte offsets");
  const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  if (b > e || e > data_bytes)
    fail_usage(where, ": data_offsets ", off.dump(), " outside the data section of ", data_bytes, " bytes");
  if (e - b != static_cast<uint64_t>(t.numel * stored_type_bytes(t.dtype)))
    fail_usage(where, ": data_offsets ", off.dump(), " hold ", e - b, " bytes, but shape ",
               j["shape"].dump(), " of ", stored_type_name(t.dtype), " needs ",
               t.numel * stored_type_bytes(t.dtype));
  t.begin = static_cast<int64_t>(data_start + b);
  return t;
}

}  // namespace

const char* stored_type_name(StoredType dtype) {
  switch (dtype) {
    case StoredType::kF32:
      return "F32";
    case StoredType::kBF16:
      return "BF16";
    case StoredType::kF16:
      return "F16";
  }
  return "?";
}

int64_t stored_type_bytes(StoredType dtype) { return dtype == StoredType::kF32 ? 4 : 2; }

std::optional<StoredType> parse_stored_type(const std::string& name) {
  for (StoredType d : {StoredType::kF32, StoredType::kBF16, StoredType::kF16})
    if (name == stored_type_name(d)) return d;
  return std::nullopt;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail_usage(path, ": cannot open: ", std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) fail_usage(path, ": not a regular file");
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < 8) fail_usage(path, ": ", size, " bytes; a safetensors file starts with an 8-byte header length");
    unsigned char len_bytes[8];
    read_exact(fd_, len_bytes, 8, 0, path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n == 0 || n > kMaxHeaderBytes || n > size - 8)
      fail_usage(path, ": header length ", n, " does not fit a file of ", size,
                 " bytes (is this a safetensors file?)");
    std::string header(n, '\0');
    read_exact(fd_, header.data(), n, 8, path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(header);
    } catch (const std::exception&) {
      fail_usage(path, ": the header is not JSON (is this a safetensors file?)");
    }
    if (!j.is_object()) fail_usage(path, ": the header is not a JSON object");
    const uint64_t data_start = 8 + n, data_bytes = size - data_start;
    std::vector<std::pair<uint64_t, std::string>> ranges;
    for (const auto& [name, value] : j.items()) {
      if (name == "__metadata__") {
        if (!value.is_object()) fail_usage(path, ": __metadata__ is not an object");
        for (const auto& [k, v] : value.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
        continue;
      }
      const TensorInfo t = parse_tensor(path, name, value, data_start, data_bytes);
      ranges.emplace_back(static_cast<uint64_t>(t.begin), name);
      tensors_[name] = t;
    }
    // Ranges must not overlap: a crafted header could alias one tensor's bytes into another.
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      const TensorInfo& prev = tensors_[ranges[i - 1].second];
      if (static_cast<uint64_t>(prev.begin + prev.numel * stored_type_bytes(prev.dtype)) >
          ranges[i].first)
        fail_usage(path, ": tensors ", ranges[i - 1].second, " and ", ranges[i].second, " overlap");
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::read(const std::string& name, int64_t first, int64_t count, float* out) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail_usage(path_, ": no tensor ", name);
  const TensorInfo& t = it->second;
  if (first < 0 || count < 0 || first + count > t.numel)
    fail(path_, ": elements [", first, ", ", first + count, ") of ", name, " outside its ", t.numel);
  if (count == 0) return;
  const int64_t eb = stored_type_bytes(t.dtype);
  const uint64_t offset = static_cast<uint64_t>(t.begin + first * eb);
  if (t.dtype == StoredType::kF32) {
    read_exact(fd_, out, static_cast<uint64_t>(count * 4), offset, path_);
    return;
  }
  std::vector<uint16_t> half(static_cast<size_t>(count));
  read_exact(fd_, half.data(), static_cast<uint64_t>(count * 2), offset, path_);
  for (int64_t i = 0; i < count; ++i)
    out[i] = t.dtype == StoredType::kBF16 ? kernels::bf16_to_float(half[static_cast<size_t>(i)])
                                          : f16_to_float(half[static_cast<size_t>(i)]);
}

// ------------------------------------------------------------------ writing

int64_t TensorDecl::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string safetensors_header(const std::vector<TensorDecl>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               std::vector<int64_t>* data_offsets) {
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata) meta[k] = v;
  nlohmann::ordered_json j;
  j["__metadata__"] = meta;
  int64_t offset = 0;
  if (data_offsets) data_offsets->clear();
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || j.contains(t.name))
      fail("safetensors: tensor name \"", t.name, "\" is empty, reserved or repeated");
    if (data_offsets) data_offsets->push_back(offset);
    j[t.name] = {{"dtype", stored_type_name(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string header = j.dump();
  // The data section starts 8-byte aligned: pad the JSON with spaces.
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  return header;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorDecl> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  for (const auto& t : tensors_)
    if (t.dtype != StoredType::kF32 && t.dtype != StoredType::kBF16)
      fail(path, ": tensor ", t.name, ": writing ", stored_type_name(t.dtype),
           " is not supported (F32 or BF16)");
  const std::string header = safetensors_header(tensors_, metadata);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot create: ", std::strerror(errno));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((header.size() >> (8 * i)) & 0xff);
  write_all(fd_, len, 8, path_);
  write_all(fd_, header.data(), header.size(), path_);
  while (current_ < tensors_.size() && tensors_[current_].numel() == 0) ++current_;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(const float* data, int64_t count) {
  while (count > 0) {
    if (current_ >= tensors_.size())
      fail(path_, ": ", count, " elements more than the ", tensors_.size(), " declared tensors hold");
    const TensorDecl& t = tensors_[current_];
    const int64_t n = std::min(count, t.numel() - written_);
    if (t.dtype == StoredType::kF32) {
      write_all(fd_, data, static_cast<uint64_t>(n) * 4, path_);
    } else {  // BF16: the constructor allows nothing else
      buffer_.resize(static_cast<size_t>(n) * 2);
      auto* out = reinterpret_cast<uint16_t*>(buffer_.data());
      for (int64_t i = 0; i < n; ++i) out[i] = kernels::float_to_bf16(data[i]);
      write_all(fd_, buffer_.data(), buffer_.size(), path_);
    }
    data += n;
    count -= n;
    written_ += n;
    if (written_ == t.numel()) {
      written_ = 0;
      ++current_;
      while (current_ < tensors_.size() && tensors_[current_].numel() == 0) ++current_;
    }
  }
}

void SafetensorsWriter::close() {
  if (fd_ < 0) return;
  if (current_ < tensors_.size())
    fail(path_, ": tensor ", tensors_[current_].name, " has ", written_, " of its ", tensors_[current_].numel(),
         " elements written");
  if (::fsync(fd_) != 0) fail(path_, ": fsync failed: ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(path_, ": close failed: ", std::strerror(errno));
}

}  // namespace amsp::hf
