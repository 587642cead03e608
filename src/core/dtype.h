// Element types and devices: what a buffer holds and where. The lowest layer,
// so that comm, the backends, the model, the engine and checkpoints all speak of
// the same types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace amsp {

// fp32, bfloat16 (the top half of an fp32: 8-bit exponent, 7+1-bit mantissa)
// and int32 (token ids).
enum class DType : uint8_t { kF32, kBF16, kI32 };
inline constexpr int kNumDTypes = 3;

inline int64_t dtype_bytes(DType t) { return t == DType::kBF16 ? 2 : 4; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "int32";
  }
  return "?";
}
// "fp32" / "bf16" / "int32"; nullopt otherwise.
inline std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "int32") return DType::kI32;
  return std::nullopt;
}

enum class Device : uint8_t { kCpu, kCuda };
inline const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

}  // namespace amsp
