// Element types and devices: what a buffer holds and where. The lowest layer,
// so that comm, the backends, the model, the engine and checkpoints all speak of
// the same types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace amsp {

// fp32, bfloat16 (the top half of an fp32: 8-bit exponent, 7+1-bit mantissa),
// int32 (token ids) and fp64 (reductions of a few statistics, such as the
// gradient norm's partial sums).
enum class DType : uint8_t { kF32, kBF16, kI32, kF64 };
inline constexpr int kNumDTypes = 4;

inline int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    default: return 4;
  }
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "int32";
    case DType::kF64: return "fp64";
  }
  return "?";
}
// The inverse of dtype_name ("fp32", "bf16", "int32", "fp64"); nullopt otherwise.
inline std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "int32") return DType::kI32;
  if (s == "fp64") return DType::kF64;
  return std::nullopt;
}

enum class Device : uint8_t { kCpu, kCuda };
inline const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

}  // namespace amsp
