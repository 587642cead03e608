// Reading and writing safetensors files: Hugging Face's format for model weights.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON naming each
// tensor's dtype, shape and [begin, end) byte range in the data that follows, then
// the raw little-endian data. Nothing in it is executed, and nothing is read but
// the ranges asked for, so a rank of a sharded job reads only the slices it holds.
//
// The header is checked as untrusted input before anything uses it: its length
// against the file size, every tensor's range inside the data section, ranges
// matching shape x element size, ranges not overlapping, dtypes known. Any
// violation is a UsageError naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace amsp::hf {

// The element types a safetensors file stores, by the format's own names (amsp's
// DType has no fp16, which Hugging Face checkpoints may hold).
enum class StoredType { kF32, kBF16, kF16 };

const char* stored_type_name(StoredType dtype);  // "F32", "BF16", "F16"
int64_t stored_type_bytes(StoredType dtype);
// "F32" -> kF32 ...; nullopt for a dtype this module does not handle.
std::optional<StoredType> parse_stored_type(const std::string& name);

struct TensorInfo {
  StoredType dtype = StoredType::kF32;
  std::vector<int64_t> shape;
  int64_t numel = 1;
  int64_t begin = 0;  // byte offset of the first element, from the start of the file
};

class SafetensorsFile {
 public:
  // Opens and validates the header; the data stays on disk.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Elements [first, first + count) of tensor `name` in row-major order,
  // converted to fp32 (exactly: bf16 and fp16 values are representable).
  void read(const std::string& name, int64_t first, int64_t count, float* out) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writing: the tensors and their order are declared up front, so the header
// (and every offset) is written first and the data streams after it, one
// tensor at a time, converted from fp32 to the tensor's dtype. The layout is
// the one SafetensorsFile reads: tensors back to back in the order given, the
// header padded with spaces so that the data starts at a multiple of 8 bytes
// (as the reference implementation does), metadata {"format": "pt"} plus any
// given (transformers refuses a file without it).
struct TensorDecl {
  std::string name;
  StoredType dtype = StoredType::kF32;
  std::vector<int64_t> shape;
  int64_t numel() const;
  int64_t bytes() const { return numel() * stored_type_bytes(dtype); }
};

// The header text for these tensors (padded; without the 8-byte length) and
// each tensor's byte offset in the data section. Pure: what the writer writes.
std::string safetensors_header(const std::vector<TensorDecl>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               std::vector<int64_t>* data_offsets = nullptr);

class SafetensorsWriter {
 public:
  // Creates (truncates) path and writes the header. Names must be unique.
  SafetensorsWriter(const std::string& path, std::vector<TensorDecl> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next count elements of the current tensor, row-major, in declaration
  // order; a tensor may come in several pieces. Error if more elements come
  // than declared or the disk refuses them.
  void write(const float* data, int64_t count);
  // Checks that every declared element was written, fsyncs and closes. Error
  // naming the first tensor short of its elements.
  void close();

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<TensorDecl> tensors_;
  size_t current_ = 0;       // tensor being written
  int64_t written_ = 0;      // elements of it written so far
  std::vector<char> buffer_;
};

}  // namespace amsp::hf
