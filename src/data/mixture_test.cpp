#include "data/mixture.h"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/test_support.h"

namespace amsp::data {
namespace {

using testing::TempDir;

// A dataset file whose source shows in every token: source k holds
// k * 1000 + (i mod 1000), so a window's first token / 1000 names its source.
void write_source(const std::string& path, int k, int64_t train = 5000, const char* tokenizer = "byte",
                  int64_t vocab = 4096) {
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  hid_t scalar = H5Screate(H5S_SCALAR), str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, H5T_VARIABLE);
  for (const auto& [name, value] : {std::pair{"format", "amsp-token-dataset"}, {"tokenizer", tokenizer}}) {
    hid_t a = H5Acreate2(file, name, str, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, str, &value);
    H5Aclose(a);
  }
  for (const auto& [name, value] : {std::pair{"version", int64_t{1}}, {"vocab_size", vocab}}) {
    hid_t a = H5Acreate2(file, name, H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &value);
    H5Aclose(a);
  }
  for (const auto& [group, n] : {std::pair{"train", train}, {"valid", int64_t{300}}}) {
    std::vector<uint32_t> tokens(n);
    for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(k * 1000 + i % 1000);
    const hsize_t dims[1] = {static_cast<hsize_t>(n)};
    hid_t g = H5Gcreate2(file, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t d = H5Dcreate2(g, "tokens", H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data());
    H5Dclose(d);
    H5Sclose(space);
    H5Gclose(g);
  }
  H5Tclose(str);
  H5Sclose(scalar);
  ASSERT_GE(H5Fclose(file), 0);
}

// The one-line UsageError message of fn, exit code 2; "" if it throws none.
template <typename Fn>
std::string usage_error(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    return e.what();
  }
  return "";
}

class MixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int k = 0; k < 3; ++k) write_source(path(k), k);
  }
  std::string path(int k) const { return dir_.file(std::string(1, static_cast<char>('a' + k)) + ".h5"); }
  TempDir dir_;
};

// Each source's share of 102,400 rows is within 4.5 standard deviations of the
// binomial count its weight implies (the weights given as 7:2:1 are normalised
// to 0.7, 0.2, 0.1), and every row's window comes from the source source_of names.
TEST_F(MixtureTest, SourcesAreDrawnInProportionToTheirWeights) {
  const Mixture mix(path(0) + ":7," + path(1) + ":2," + path(2) + ":1");
  ASSERT_EQ(mix.size(), 3u);
  const double expected[3] = {0.7, 0.2, 0.1};
  const int64_t steps = 200, rows = 512, n = steps * rows;
  std::vector<int64_t> counts(3, 0);
  for (int64_t step = 1; step <= steps; ++step) {
    const std::vector<int64_t> c = mix.rows_per_source(1337, step, rows);
    for (int k = 0; k < 3; ++k) counts[k] += c[k];
  }
  for (int k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(mix.weight(k), expected[k]);
    const double mean = n * expected[k], sd = std::sqrt(n * expected[k] * (1 - expected[k]));
    EXPECT_LE(std::abs(counts[k] - mean), 4.5 * sd) << "source " << k << ": " << counts[k] << " rows of " << n;
  }
  const int64_t T = 16;
  std::vector<int32_t> x(64 * T), y(64 * T);
  mix.sample_train_batch(1337, 9, 0, 64, T, x.data(), y.data());
  for (int64_t r = 0; r < 64; ++r) {
    const size_t k = mix.source_of(1337, 9, r);
    EXPECT_EQ(x[r * T] / 1000, static_cast<int32_t>(k)) << "row " << r;
    EXPECT_EQ(x[r * T] % 1000, mix.window_start(1337, 9, r, T) % 1000) << "row " << r;
    EXPECT_EQ(y[r * T], x[r * T + 1]);
  }
}

// What the trainer does on 1, 2 and 8 ranks with 1, 2 or 4 micro-batches: row
// (micro * ranks + rank) * batch + b of the step. The rows are the same bits.
TEST_F(MixtureTest, RowsDoNotDependOnHowRanksDivideThem) {
  const Mixture mix(path(0) + ":0.5," + path(1) + ":0.3," + path(2) + ":0.2");
  const int64_t T = 8, rows = 16;
  std::vector<int32_t> whole(rows * T), targets(rows * T);
  mix.sample_train_batch(7, 42, 0, rows, T, whole.data(), targets.data());
  for (const auto& [ranks, micro] : {std::pair{1, 4}, {2, 2}, {8, 1}, {4, 4}}) {
    const int64_t batch = rows / (ranks * micro);
    std::vector<int32_t> split(rows * T), t(rows * T);
    for (int rank = ranks - 1; rank >= 0; --rank)
      for (int m = 0; m < micro; ++m) {
        const int64_t first = (int64_t{m} * ranks + rank) * batch;
        mix.sample_train_batch(7, 42, first, batch, T, split.data() + first * T, t.data() + first * T);
      }
    EXPECT_EQ(split, whole) << ranks << " ranks, " << micro << " micro-batches";
    EXPECT_EQ(t, targets) << ranks << " ranks, " << micro << " micro-batches";
  }
  // Another step or seed draws other sources.
  std::vector<size_t> a, b, c;
  for (int64_t r = 0; r < 64; ++r) {
    a.push_back(mix.source_of(7, 42, r));
    b.push_back(mix.source_of(7, 43, r));
    c.push_back(mix.source_of(8, 42, r));
  }
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
}

// One dataset, with or without a weight, draws no source: its windows are the
// dataset sampler's, and those are what (seed, step, row) gave before mixtures
// (the starts below computed from doc/data.md's formula, independently of amsp).
TEST_F(MixtureTest, OneDatasetIsTheSamplerItWasBefore) {
  const TokenDataset ds(path(0));
  for (const std::string& text : {path(0), path(0) + ":3"}) {
    const Mixture mix(text);
    ASSERT_TRUE(mix.single()) << text;
    EXPECT_EQ(mix.path(0), path(0));
    EXPECT_EQ(mix.weight(0), 1.0);
    const int64_t T = 64;
    const std::pair<int64_t, int64_t> rows[] = {{1, 0}, {1, 1}, {2, 0}, {7, 5}, {123, 4095}};
    const int64_t golden[] = {1992, 4448, 3663, 3304, 2905};
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(mix.source_of(1337, rows[i].first, rows[i].second), 0u);
      EXPECT_EQ(mix.window_start(1337, rows[i].first, rows[i].second, T), golden[i]);
      EXPECT_EQ(train_window_start(ds, 1337, rows[i].first, rows[i].second, T), golden[i]);
    }
    std::vector<int32_t> x(8 * T), y(8 * T), x2(8 * T), y2(8 * T);
    mix.sample_train_batch(1337, 3, 8, 8, T, x.data(), y.data());
    sample_train_batch(ds, 1337, 3, 8, 8, T, x2.data(), y2.data());
    EXPECT_EQ(x, x2);
    EXPECT_EQ(y, y2);
    EXPECT_EQ(mix.rows_per_source(1337, 3, 10), std::vector<int64_t>{10});
  }
}

// Paths with ':' or ',': text naming an existing file is that file; in a
// mixture the weight is what follows an entry's last ':' when it is a number.
TEST_F(MixtureTest, PathsWithColonsAndCommas) {
  const std::string odd = dir_.file("web:2024,v1.h5"), colon = dir_.file("part:1.h5");
  write_source(odd, 1);
  write_source(colon, 2);
  const Mixture whole(odd);
  ASSERT_TRUE(whole.single());
  EXPECT_EQ(whole.path(0), odd);
  const Mixture mix(colon + ":3," + path(0));
  ASSERT_EQ(mix.size(), 2u);
  EXPECT_EQ(mix.path(0), colon);
  EXPECT_DOUBLE_EQ(mix.weight(0), 0.75);
  const auto entries = parse_mixture(colon + "," + path(0) + ":1e-1");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].path, colon);
  EXPECT_EQ(entries[0].weight, 1.0);
  EXPECT_EQ(entries[1].path, path(0));
  EXPECT_EQ(entries[1].weight, 0.1);
}

TEST_F(MixtureTest, BadSpecsAreRefusedInOneLine) {
  const std::string a = path(0), b = path(1), missing = dir_.file("nosuch.h5");
  const auto refusal = [](const std::string& text) { return usage_error([&] { Mixture m(text); }); };
  EXPECT_EQ(refusal(a + ":0.5," + missing + ":0.5"), "--data " + missing + ": no such file");
  EXPECT_EQ(refusal(a + ":0.7," + b + ":0"), "--data " + b + ":0: weight 0 of " + b + "; expected a positive finite number");
  EXPECT_EQ(refusal(a + ":-1," + b), "--data " + a + ":-1: weight -1 of " + a + "; expected a positive finite number");
  EXPECT_EQ(refusal(a + ":inf," + b), "--data " + a + ":inf: weight inf of " + a + "; expected a positive finite number");
  EXPECT_EQ(refusal(a + ":0.5," + b + ":lots"),
            "--data " + b + ":lots: weight \"lots\" is not a number; expected PATH or PATH:WEIGHT entries separated "
            "by commas, WEIGHT a positive number");
  EXPECT_EQ(refusal(a + ":0.5," + a + ":0.5"), "--data " + a + ":0.5," + a + ":0.5: " + a +
                                                   " is named twice (entries 1 and 2); expected each dataset once "
                                                   "(give it the sum of the weights)");
  EXPECT_EQ(refusal(a + "," + dir_.path().string() + "/./a.h5"),
            "--data " + a + "," + dir_.path().string() + "/./a.h5: " + dir_.path().string() +
                "/./a.h5 is named twice (entries 1 and 2); expected each dataset once (give it the sum of the "
                "weights)");
  EXPECT_EQ(refusal(a + ",," + b), "--data " + a + ",," + b +
                                       ": entry 2 is empty; expected PATH or PATH:WEIGHT entries separated by commas");
  EXPECT_EQ(refusal(a + "," + b + ","), "--data " + a + "," + b +
                                            ",: entry 3 is empty; expected PATH or PATH:WEIGHT entries separated by "
                                            "commas");
  EXPECT_EQ(refusal(":0.5," + a), "--data :0.5: no path before the weight; expected PATH or PATH:WEIGHT entries "
                                  "separated by commas");

  const std::string wide = dir_.file("wide.h5"), sp = dir_.file("sp.h5");
  write_source(wide, 1, 5000, "byte", 8192);
  write_source(sp, 1, 5000, "sentencepiece", 4096);
  EXPECT_EQ(refusal(a + "," + wide), "--data " + wide + ": tokenizer byte with 8192 ids, but " + a +
                                         " has byte with 4096 ids; expected every dataset of a mixture prepared "
                                         "with the same tokenizer");
  EXPECT_EQ(refusal(a + "," + sp), "--data " + sp + ": tokenizer sentencepiece with 4096 ids, but " + a +
                                       " has byte with 4096 ids; expected every dataset of a mixture prepared with "
                                       "the same tokenizer");
  // Nothing of this is refused for one dataset: its own checks apply.
  EXPECT_EQ(refusal(wide), "");
}

}  // namespace
}  // namespace amsp::data
