#include "hf/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/test_temp_dir.h"
#include "kernels/common/math.h"

namespace amsp::hf {
namespace {

// A file of this header text and data bytes, in the safetensors layout.
std::string write_file(const std::string& name, const std::string& header, const std::string& data,
                       uint64_t claimed_len = 0) {
  const auto dir = test::process_temp_dir().path() / "safetensors";
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

// ------------------------------------------------------------------ writing

std::string temp_path(const std::string& name) {
  const auto dir = test::process_temp_dir().path() / "safetensors";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

using kernels::bf16_to_float;
using kernels::float_to_bf16;
const auto bits_of = kernels::float_to_bits;
const auto float_of = kernels::bits_to_float;

TEST(SafetensorsWriterTest, HeaderOffsetsAlignmentAndDtypesReadBack) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};  // [2, 3] F32
  const std::vector<float> b = {1.0f, -2.5f, 3.0f};                          // [3] BF16, exact
  const std::vector<float> c = {0.25f};                                       // [1] F32 after a 6-byte tensor
  const std::string path = temp_path("written.safetensors");
  {
    SafetensorsWriter w(path,
                        {{"a", StoredType::kF32, {2, 3}},
                         {"b", StoredType::kBF16, {3}},
                         {"c", StoredType::kF32, {1}}},
                        {{"source", "test"}});
    w.write(a.data(), 2);  // a tensor may come in pieces
    w.write(a.data() + 2, 4);
    w.write(b.data(), 3);
    w.write(c.data(), 1);
    w.close();
  }
  const std::string bytes = file_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section not 8-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + n + 24 + 6 + 4);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["__metadata__"]["source"], "test");
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(header["b"]["dtype"], "BF16");
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({24, 30}));
  EXPECT_EQ(header["c"]["data_offsets"], nlohmann::json::array({30, 34}));
  // Declaration order is file order.
  EXPECT_LT(bytes.find("\"a\""), bytes.find("\"b\""));
  EXPECT_LT(bytes.find("\"b\""), bytes.find("\"c\""));

  SafetensorsFile f(path);  // the reader's own checks pass
  EXPECT_EQ(f.tensors().at("b").dtype, StoredType::kBF16);
  EXPECT_EQ(f.tensors().at("a").begin, static_cast<int64_t>(8 + n));
  std::vector<float> ra(6), rb(3), rc(1);
  f.read("a", 0, 6, ra.data());
  f.read("b", 0, 3, rb.data());
  f.read("c", 0, 1, rc.data());
  EXPECT_EQ(std::memcmp(ra.data(), a.data(), 24), 0);
  EXPECT_EQ(rb, b);
  EXPECT_EQ(rc, c);
  // safetensors_header says the same offsets.
  std::vector<int64_t> offsets;
  EXPECT_EQ(safetensors_header({{"a", StoredType::kF32, {2, 3}},
                                {"b", StoredType::kBF16, {3}},
                                {"c", StoredType::kF32, {1}}},
                               {{"source", "test"}}, &offsets),
            bytes.substr(8, n));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 24, 30}));
}

TEST(SafetensorsWriterTest, Bf16RoundsToNearestEvenAndRoundTrips) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(float_of(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(float_of(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(float_of(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(float_to_bf16(float_of(0x3f807fffu)), 0x3f80);  // below the tie
  EXPECT_EQ(float_to_bf16(float_of(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  const uint16_t nan = float_to_bf16(float_of(0x7f800001u));  // a signalling NaN whose payload is low
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  // Every bf16 value but NaN survives widening and narrowing bit for bit.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), h) << std::hex << h;
  }
  EXPECT_EQ(bits_of(bf16_to_float(0xc020)), bits_of(-2.5f));
}

TEST(SafetensorsWriterTest, WrongElementCountsAreErrors) {
  const float x[4] = {1, 2, 3, 4};
  {
    SafetensorsWriter w(temp_path("short.safetensors"), {{"a", StoredType::kF32, {4}}});
    w.write(x, 3);
    EXPECT_THROW(w.close(), Error);
  }
  {
    SafetensorsWriter w(temp_path("long.safetensors"), {{"a", StoredType::kF32, {2}}});
    EXPECT_THROW(w.write(x, 3), Error);
  }
  EXPECT_THROW(SafetensorsWriter(temp_path("dup.safetensors"),
                                 {{"a", StoredType::kF32, {1}}, {"a", StoredType::kF32, {1}}}),
               Error);
  EXPECT_THROW(SafetensorsWriter(temp_path("f16.safetensors"), {{"a", StoredType::kF16, {1}}}),
               Error);
}

}  // namespace
}  // namespace amsp::hf
