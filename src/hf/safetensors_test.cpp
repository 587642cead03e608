#include "hf/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace amsp::hf {
namespace {

// A file of this header text and data bytes, in the safetensors layout.
std::string write_file(const std::string& name, const std::string& header, const std::string& data,
                       uint64_t claimed_len = 0) {
  const auto dir = std::filesystem::temp_directory_path() / ("amsp-st-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = claimed_len ? claimed_len : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
  return path;
}

std::string bytes_of(const std::vector<uint16_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2);
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsTest, ReadsF32SlicesAndMetadata) {
  const float v[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const std::string path = write_file(
      "f32.safetensors",
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
      std::string(reinterpret_cast<const char*>(v), sizeof v));
  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors().at("w").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  float out[4] = {};
  f.read("w", 2, 4, out);
  EXPECT_EQ(std::memcmp(out, v + 2, sizeof out), 0);
}

TEST(SafetensorsTest, ConvertsBf16AndF16Exactly) {
  // bf16: 1.0 = 0x3f80, -2.5 = 0xc020; f16: 1.0 = 0x3c00, -2.5 = 0xc100, the
  // smallest subnormal 2^-24 = 0x0001, 65504 = 0x7bff, -0 = 0x8000.
  const std::string path = write_file(
      "half.safetensors",
      R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"h":{"dtype":"F16","shape":[5],"data_offsets":[4,14]}})",
      bytes_of({0x3f80, 0xc020, 0x3c00, 0xc100, 0x0001, 0x7bff, 0x8000}));
  SafetensorsFile f(path);
  float b[2], h[5];
  f.read("b", 0, 2, b);
  f.read("h", 0, 5, h);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.5f);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.5f);
  EXPECT_EQ(h[2], 5.9604644775390625e-8f);
  EXPECT_EQ(h[3], 65504.0f);
  EXPECT_EQ(h[4], 0.0f);
  EXPECT_TRUE(std::signbit(h[4]));
}

TEST(SafetensorsTest, DamagedHeadersAreOneLineErrors) {
  const std::string data(16, '\0');
  struct Case {
    std::string header;
    uint64_t claimed;
    std::string expect;
  } cases[] = {
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 1u << 20, "does not fit a file"},
      {"not json at all", 0, "not JSON"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,32]}})", 0, "outside the data section"},
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 0, "needs 12"},
      {R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 0, "dtype I64 is not supported"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       0, "overlap"},
      {R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 0, "not a list of sizes"},
      {R"({"w":{"dtype":"F32","shape":[4]}})", 0, "expected {"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string msg = error_of(write_file("bad" + std::to_string(i++) + ".safetensors", c.header, data, c.claimed));
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_NE(error_of(write_file("short.safetensors", "", "")).find("does not fit"), std::string::npos);
}

TEST(SafetensorsTest, ReadOutsideTheTensorFails) {
  const std::string path = write_file(
      "range.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  SafetensorsFile f(path);
  float out[3];
  EXPECT_THROW(f.read("w", 1, 2, out), Error);
  EXPECT_THROW(f.read("missing", 0, 1, out), UsageError);
}

}  // namespace
}  // namespace amsp::hf
