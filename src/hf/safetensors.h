// Reading safetensors files: Hugging Face's format for model weights.
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
#include <string>
#include <vector>

namespace amsp::hf {

enum class DType { kF32, kBF16, kF16 };

const char* dtype_name(DType dtype);  // "F32", "BF16", "F16"
int64_t dtype_bytes(DType dtype);

struct TensorInfo {
  DType dtype = DType::kF32;
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

}  // namespace amsp::hf
