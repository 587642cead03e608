#include "data/dataset.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "core/error.h"
#include "data/test_support.h"
#include "data/tokenizer.h"

namespace amsp::data {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_text;

// ---------------------------------------------------------------- helpers

// Expects fn to throw UsageError whose one-line message contains every needle.
template <typename Fn>
void expect_usage_error(Fn&& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    for (const auto& needle : needles) EXPECT_NE(msg.find(needle), std::string::npos) << "[" << needle << "] not in: " << msg;
  }
}

std::string read_string_attribute(hid_t file, const char* name) {
  hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
  EXPECT_GE(attr, 0) << name;
  hid_t type = H5Aget_type(attr);
  EXPECT_EQ(H5Tget_class(type), H5T_STRING) << name;
  EXPECT_GT(H5Tis_variable_str(type), 0) << name;
  EXPECT_EQ(H5Tget_cset(type), H5T_CSET_UTF8) << name;
  char* p = nullptr;
  EXPECT_GE(H5Aread(attr, type, &p), 0);
  std::string s = p ? p : "";
  H5free_memory(p);
  H5Tclose(type);
  H5Aclose(attr);
  return s;
}

int64_t read_int_attribute(hid_t file, const char* name) {
  hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
  EXPECT_GE(attr, 0) << name;
  int64_t v = std::numeric_limits<int64_t>::min();
  EXPECT_GE(H5Aread(attr, H5T_NATIVE_INT64, &v), 0);
  H5Aclose(attr);
  return v;
}

// Hand-made dataset files for the reader's checks and the sampler tests.
struct FakeDataset {
  const char* format = "amsp-token-dataset";  // nullptr: no attribute
  int64_t version = 1;
  int64_t vocab_size = 1 << 30;
  bool with_train = true;
  bool with_valid = true;
  bool float_train = false;  // wrong dtype
  bool rank2_train = false;  // wrong rank
  std::vector<uint32_t> train, valid;
  // How /train/tokens is stored: the layouts data/token_column.h reads from
  // the file, and two it reads into memory.
  enum Layout { kContiguous, kChunked, kDeflate, kShuffleDeflate, kInt64 } layout = kContiguous;
};

void write_vector(hid_t group, const char* name, const std::vector<uint32_t>& v,
                  FakeDataset::Layout layout = FakeDataset::kContiguous) {
  const hsize_t dims[1] = {v.size()}, chunk[1] = {7};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (layout != FakeDataset::kContiguous) H5Pset_chunk(dcpl, 1, chunk);
  if (layout == FakeDataset::kShuffleDeflate) H5Pset_shuffle(dcpl);
  if (layout == FakeDataset::kDeflate || layout == FakeDataset::kShuffleDeflate) H5Pset_deflate(dcpl, 1);
  const hid_t type = layout == FakeDataset::kInt64 ? H5T_STD_I64LE : H5T_STD_U32LE;
  hid_t dset = H5Dcreate2(group, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(dset, 0);
  if (!v.empty()) ASSERT_GE(H5Dwrite(dset, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  H5Dclose(dset);
  H5Pclose(dcpl);
  H5Sclose(space);
}

void write_fake(const std::string& path, const FakeDataset& f) {
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  hid_t scalar = H5Screate(H5S_SCALAR);
  if (f.format) {
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, H5T_VARIABLE);
    hid_t a = H5Acreate2(file, "format", str, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, str, &f.format);
    H5Aclose(a);
    // Fixed-length string, as some writers make them.
    hid_t fixed = H5Tcopy(H5T_C_S1);
    H5Tset_size(fixed, 4);
    a = H5Acreate2(file, "tokenizer", fixed, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, fixed, "byte");
    H5Aclose(a);
    H5Tclose(fixed);
    H5Tclose(str);
  }
  auto put_int = [&](const char* name, int64_t v) {
    hid_t a = H5Acreate2(file, name, H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
  };
  put_int("version", f.version);
  put_int("vocab_size", f.vocab_size);
  if (f.with_train) {
    hid_t g = H5Gcreate2(file, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (f.float_train) {
      const hsize_t dims[1] = {4};
      const float x[4] = {1, 2, 3, 4};
      hid_t space = H5Screate_simple(1, dims, nullptr);
      hid_t d = H5Dcreate2(g, "tokens", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
      H5Dclose(d);
      H5Sclose(space);
    } else if (f.rank2_train) {
      const hsize_t dims[2] = {2, 2};
      const uint32_t x[4] = {1, 2, 3, 4};
      hid_t space = H5Screate_simple(2, dims, nullptr);
      hid_t d = H5Dcreate2(g, "tokens", H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
      H5Dclose(d);
      H5Sclose(space);
    } else {
      write_vector(g, "tokens", f.train, f.layout);
    }
    H5Gclose(g);
  }
  if (f.with_valid) {
    hid_t g = H5Gcreate2(file, "valid", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    write_vector(g, "tokens", f.valid);
    H5Gclose(g);
  }
  H5Sclose(scalar);
  ASSERT_GE(H5Fclose(file), 0);
}

std::vector<uint32_t> iota_tokens(size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i);
  return v;
}

// ---------------------------------------------------------------- prepare

TEST(DatasetTest, PrepareAndOpenRoundTripBytes) {
  TempDir dir;
  const std::string a = dir.file("a.txt"), b = dir.file("b.txt"), c = dir.file("c.txt");
  const std::string ta = testing::sample_text(1500, 1);
  const std::string tb = testing::sample_text(1200, 2) + "no newline at the end";
  const std::string tc = "short document\n";
  write_text(a, ta);
  write_text(b, tb);
  write_text(c, tc);
  std::string expected = ta + (ta.back() == '\n' ? "" : "\n") + tb + "\n" + tc;

  PrepareOptions opt;
  opt.inputs = {a, b, c};
  opt.output = dir.file("out.h5");
  opt.valid_fraction = 0.1;
  const PrepareReport r = prepare_dataset(opt);
  EXPECT_EQ(r.documents, 3);
  EXPECT_EQ(r.bytes_in, static_cast<int64_t>(ta.size() + tb.size() + tc.size()));
  EXPECT_EQ(r.vocab_size, 256);
  EXPECT_EQ(r.train_tokens + r.valid_tokens, static_cast<int64_t>(expected.size()));
  const double share = static_cast<double>(r.valid_tokens) / static_cast<double>(expected.size());
  EXPECT_GT(share, 0.05);
  EXPECT_LT(share, 0.15);
  EXPECT_GE(r.valid_tokens, 2048);  // whole blocks (and maybe the partial last one)

  TokenDataset ds(opt.output);
  EXPECT_EQ(ds.path(), opt.output);
  EXPECT_EQ(ds.tokenizer(), "byte");
  EXPECT_EQ(ds.vocab_size(), 256);
  const auto& train = ds.tokens(Split::kTrain);
  const auto& valid = ds.tokens(Split::kValid);
  ASSERT_EQ(static_cast<int64_t>(train.size()), r.train_tokens);
  ASSERT_EQ(static_cast<int64_t>(valid.size()), r.valid_tokens);
  EXPECT_LE(*std::max_element(train.begin(), train.end()), 255);

  // Put the blocks back together: each block of the stream is either the next
  // block of train or the next block of valid.
  std::string rebuilt;
  size_t ti = 0, vi = 0;
  int valid_blocks = 0;
  for (size_t start = 0; start < expected.size(); start += 2048) {
    const size_t len = std::min<size_t>(2048, expected.size() - start);
    auto matches = [&](const std::vector<int32_t>& v, size_t at) {
      if (at + len > v.size()) return false;
      for (size_t i = 0; i < len; ++i)
        if (v[at + i] != static_cast<unsigned char>(expected[start + i])) return false;
      return true;
    };
    if (matches(train, ti)) {
      ti += len;
    } else {
      ASSERT_TRUE(matches(valid, vi)) << "block at " << start;
      vi += len;
      ++valid_blocks;
    }
  }
  EXPECT_EQ(ti, train.size());
  EXPECT_EQ(vi, valid.size());
  EXPECT_GE(valid_blocks, 1);
  // The first block is always train; valid blocks are spread over the corpus.
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(train[i], static_cast<unsigned char>(expected[i]));

  // Attributes, read with the plain HDF5 API as h5py would.
  hid_t file = H5Fopen(opt.output.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_EQ(read_string_attribute(file, "format"), "amsp-token-dataset");
  EXPECT_EQ(read_int_attribute(file, "version"), 1);
  EXPECT_EQ(read_string_attribute(file, "tokenizer"), "byte");
  EXPECT_EQ(read_int_attribute(file, "vocab_size"), 256);
  EXPECT_EQ(read_int_attribute(file, "bos_id"), -1);
  EXPECT_EQ(read_int_attribute(file, "eos_id"), -1);
  EXPECT_EQ(read_int_attribute(file, "documents"), 3);
  EXPECT_EQ(read_string_attribute(file, "sources"), a + "\n" + b + "\n" + c);
  // Tokens are uint32, chunked and deflated.
  hid_t dset = H5Dopen2(file, "/train/tokens", H5P_DEFAULT);
  ASSERT_GE(dset, 0);
  hid_t type = H5Dget_type(dset);
  EXPECT_GT(H5Tequal(type, H5T_STD_U32LE), 0);
  hid_t dcpl = H5Dget_create_plist(dset);
  EXPECT_EQ(H5Pget_layout(dcpl), H5D_CHUNKED);
  EXPECT_GE(H5Pget_nfilters(dcpl), 1);
  H5Pclose(dcpl);
  H5Tclose(type);
  H5Dclose(dset);
  EXPECT_EQ(H5Lexists(file, "tokenizer", H5P_DEFAULT), 0);
  H5Fclose(file);

  // The dataset's own tokenizer.
  auto tok = dataset_tokenizer(opt.output);
  EXPECT_EQ(tok->kind(), "byte");
}

// Documents are tokenized in batches on several threads; the file must be the
// one a single thread writes, documents in input order.
TEST(DatasetTest, ThreadCountDoesNotChangeTheDataset) {
  TempDir dir;
  const std::string in = dir.file("docs.jsonl");
  std::string jsonl, expected;
  for (int i = 0; i < 30000; ++i) {  // several batches of 4096 documents
    const std::string text = "document " + std::to_string(i) + (i % 7 ? " short" : testing::sample_text(3, i));
    jsonl += "{\"text\": \"" + text + "\"}\n";
    expected += text + "\n";
  }
  write_text(in, jsonl);
  std::vector<std::vector<int32_t>> train, valid;
  for (int threads : {1, 3}) {
    PrepareOptions opt;
    opt.inputs = {in};
    opt.output = dir.file("t" + std::to_string(threads) + ".h5");
    opt.threads = threads;
    EXPECT_EQ(prepare_dataset(opt).documents, 30000);
    const TokenDataset ds(opt.output);
    train.push_back(ds.tokens(Split::kTrain));
    valid.push_back(ds.tokens(Split::kValid));
  }
  EXPECT_EQ(train[0], train[1]);
  EXPECT_EQ(valid[0], valid[1]);
  ASSERT_EQ(train[0].size() + valid[0].size(), expected.size());
  EXPECT_EQ(std::string(train[0].begin(), train[0].begin() + 40), expected.substr(0, 40));
}

TEST(DatasetTest, ValidFractionZeroKeepsEverythingInTrainAndEmptyValidWorks) {
  TempDir dir;
  const std::string text = testing::sample_text(800, 3);
  write_text(dir.file("t.txt"), text);
  PrepareOptions opt;
  opt.inputs = {dir.file("t.txt")};
  opt.output = dir.file("out.h5");
  opt.valid_fraction = 0.0;
  const auto r = prepare_dataset(opt);
  EXPECT_EQ(r.valid_tokens, 0);
  TokenDataset ds(opt.output);
  EXPECT_TRUE(ds.tokens(Split::kValid).empty());
  EXPECT_EQ(num_eval_windows(ds, 16), 0);
  const auto& train = ds.tokens(Split::kTrain);
  std::string back(train.begin(), train.end());
  EXPECT_EQ(back, text.back() == '\n' ? text : text + "\n");
}

TEST(DatasetTest, SmallCorpusHoldsOutOneBlock) {
  TempDir dir;
  // Three blocks (2 full + a partial one) and a share that would round to none.
  write_text(dir.file("t.txt"), std::string(2 * 2048 + 100, 'x'));
  PrepareOptions opt;
  opt.inputs = {dir.file("t.txt")};
  opt.output = dir.file("out.h5");
  opt.valid_fraction = 0.01;
  const auto r = prepare_dataset(opt);
  EXPECT_EQ(r.valid_tokens, 2048);
  EXPECT_EQ(r.train_tokens, 2048 + 101);

  // A single block holds out nothing.
  write_text(dir.file("small.txt"), "tiny\n");
  opt.inputs = {dir.file("small.txt")};
  const auto r2 = prepare_dataset(opt);
  EXPECT_EQ(r2.valid_tokens, 0);
  EXPECT_EQ(r2.train_tokens, 5);
}

TEST(DatasetTest, ValidFractionHalf) {
  TempDir dir;
  write_text(dir.file("t.txt"), std::string(20 * 2048, 'y'));
  PrepareOptions opt;
  opt.inputs = {dir.file("t.txt")};
  opt.output = dir.file("out.h5");
  opt.valid_fraction = 0.5;
  const auto r = prepare_dataset(opt);
  EXPECT_EQ(r.valid_tokens, 10 * 2048);
  EXPECT_EQ(r.train_tokens, 10 * 2048 + 1);  // + the newline
}

TEST(DatasetTest, WritesToTemporaryThenRenames) {
  TempDir dir;
  write_text(dir.file("t.txt"), "hello world\n");
  PrepareOptions opt;
  opt.inputs = {dir.file("t.txt")};
  opt.output = dir.file("out.h5");
  // A stale temporary and an old output are both replaced.
  write_text(opt.output + ".tmp", "stale");
  write_text(opt.output, "old");
  prepare_dataset(opt);
  EXPECT_TRUE(fs::exists(opt.output));
  EXPECT_FALSE(fs::exists(opt.output + ".tmp"));
  TokenDataset ds(opt.output);
  EXPECT_EQ(ds.tokens(Split::kTrain).size(), 12u);

  // A failed prepare leaves neither the output nor a temporary behind.
  PrepareOptions bad = opt;
  bad.output = dir.file("bad.h5");
  bad.inputs = {dir.file("t.txt"), dir.file("missing.txt")};
  EXPECT_THROW(prepare_dataset(bad), UsageError);
  EXPECT_FALSE(fs::exists(bad.output));
  EXPECT_FALSE(fs::exists(bad.output + ".tmp"));
}

TEST(DatasetTest, PrepareErrors) {
  TempDir dir;
  write_text(dir.file("t.txt"), "hello\n");
  PrepareOptions opt;
  opt.inputs = {dir.file("t.txt")};
  opt.output = dir.file("out.h5");

  PrepareOptions o = opt;
  o.inputs = {dir.file("missing.txt")};
  expect_usage_error([&] { prepare_dataset(o); }, {"--input " + dir.file("missing.txt"), "no such file, folder"});
  fs::create_directories(dir.path() / "empty");
  o.inputs = {(dir.path() / "empty").string()};  // a folder is read file by file: this one has none
  expect_usage_error([&] { prepare_dataset(o); }, {"--input", "the folder holds no files"});

  for (double f : {-0.1, 0.51, 1.0, std::nan("")}) {
    o = opt;
    o.valid_fraction = f;
    expect_usage_error([&] { prepare_dataset(o); }, {"--valid-fraction", "[0, 0.5]"});
  }

  o = opt;
  o.output = dir.file("no/such/dir/out.h5");
  expect_usage_error([&] { prepare_dataset(o); }, {"--output " + o.output, "does not exist"});
  o.output = dir.path().string();
  expect_usage_error([&] { prepare_dataset(o); }, {"--output", "directory"});
  o = opt;
  o.inputs.clear();
  expect_usage_error([&] { prepare_dataset(o); }, {"--input"});
  o = opt;
  o.tokenizer = dir.file("missing.model");
  expect_usage_error([&] { prepare_dataset(o); }, {"--tokenizer", "no such file"});
  EXPECT_FALSE(fs::exists(opt.output));
}

// ---------------------------------------------------------------- opening

TEST(DatasetTest, OpenErrors) {
  TempDir dir;
  const std::string missing = dir.file("missing.h5");
  expect_usage_error([&] { TokenDataset d(missing); }, {"--data " + missing, "no such file"});

  const std::string text = dir.file("text.h5");
  write_text(text, "just some text, not HDF5\n");
  expect_usage_error([&] { TokenDataset d(text); },
                     {"--data " + text, "not an HDF5 file", "expected a dataset written by `amsp data prepare`"});

  const std::string path = dir.file("fake.h5");
  FakeDataset f;
  f.train = iota_tokens(100);
  f.format = nullptr;
  write_fake(path, f);
  expect_usage_error([&] { TokenDataset d(path); },
                     {"--data " + path, "wrong format attribute", "is this a tokenized dataset"});

  f.format = "something-else";
  write_fake(path, f);
  expect_usage_error([&] { TokenDataset d(path); }, {"wrong format attribute", "something-else"});

  f = FakeDataset{};
  f.train = iota_tokens(100);
  f.version = 2;
  write_fake(path, f);
  expect_usage_error([&] { TokenDataset d(path); }, {"--data " + path, "unsupported", "version 2"});

  f = FakeDataset{};
  f.with_train = false;
  write_fake(path, f);
  expect_usage_error([&] { TokenDataset d(path); }, {"--data " + path, "missing", "/train/tokens"});

  f = FakeDataset{};
  f.float_train = true;
  write_fake(path, f);
  expect_usage_error([&] { TokenDataset d(path); }, {"/train/tokens", "non-integer", "1-D uint32"});

  f = FakeDataset{};
  f.rank2_train = true;
  write_fake(path, f);
  expect_usage_error([&] { TokenDataset d(path); }, {"/train/tokens", "rank 2", "1-D uint32"});

  f = FakeDataset{};
  f.vocab_size = 50;
  f.train = iota_tokens(100);
  write_fake(path, f);
  expect_usage_error([&] { TokenDataset(path).tokens(Split::kTrain); },
                     {"/train/tokens[50] = 50", "outside the vocabulary [0, 50)"});

  // Missing valid split: read as empty; fixed-length string attributes read.
  f = FakeDataset{};
  f.train = iota_tokens(100);
  f.with_valid = false;
  write_fake(path, f);
  TokenDataset ok(path);
  EXPECT_EQ(ok.tokenizer(), "byte");
  EXPECT_EQ(ok.tokens(Split::kTrain).size(), 100u);
  EXPECT_TRUE(ok.tokens(Split::kValid).empty());
}

// ---------------------------------------------------------- reading by range

// Every layout reads the same tokens, whole and by any range (across chunk
// boundaries: the fakes' chunks hold 7 tokens), and says how it reads them.
TEST(TokenColumnTest, EveryLayoutReadsTheSameTokens) {
  TempDir dir;
  const std::vector<std::pair<FakeDataset::Layout, std::string>> layouts = {
      {FakeDataset::kContiguous, "contiguous"},
      {FakeDataset::kChunked, "chunked, 7 tokens a chunk"},
      {FakeDataset::kDeflate, "chunked, deflate, 7 tokens a chunk"},
      {FakeDataset::kShuffleDeflate, "in memory"},
      {FakeDataset::kInt64, "in memory"}};
  for (const auto& [layout, name] : layouts) {
    SCOPED_TRACE(name);
    const std::string path = dir.file("layout.h5");
    FakeDataset f;
    f.train = iota_tokens(100);
    f.layout = layout;
    write_fake(path, f);
    const TokenDataset ds(path);
    EXPECT_EQ(ds.layout(Split::kTrain).rfind(name, 0), 0u) << ds.layout(Split::kTrain);
    const std::vector<int32_t> all = ds.tokens(Split::kTrain);
    ASSERT_EQ(all.size(), 100u);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(all[i], i);
    for (const auto& [start, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {6, 2}, {5, 20}, {93, 7}, {99, 1}}) {
      std::vector<int32_t> part(count, -1);
      ds.read(Split::kTrain, start, count, part.data());
      EXPECT_EQ(part, std::vector<int32_t>(all.begin() + start, all.begin() + start + count)) << start << "+" << count;
    }
    int32_t t[2];
    EXPECT_THROW(ds.read(Split::kTrain, 99, 2, t), Error);
  }
}

// An id outside the vocabulary is named when a read meets it, in every layout.
TEST(TokenColumnTest, IdsOutsideTheVocabularyAreNamedWhereTheyAre) {
  TempDir dir;
  for (auto layout : {FakeDataset::kContiguous, FakeDataset::kChunked, FakeDataset::kDeflate, FakeDataset::kInt64}) {
    const std::string path = dir.file("bad.h5");
    FakeDataset f;
    f.vocab_size = 1000;
    f.train = iota_tokens(100);
    f.train[60] = 1000;
    f.train[61] = 0x80000001u;  // negative as int32
    f.layout = layout;
    write_fake(path, f);
    if (layout == FakeDataset::kInt64) {  // read into memory: checked at the open
      expect_usage_error([&] { TokenDataset d(path); }, {"/train/tokens[60] = 1000", "outside the vocabulary [0, 1000)"});
      continue;
    }
    const TokenDataset ds(path);
    std::vector<int32_t> part(10);
    ds.read(Split::kTrain, 50, 10, part.data());  // up to the bad id: fine
    expect_usage_error([&] { ds.read(Split::kTrain, 55, 10, part.data()); },
                       {"/train/tokens[60] = 1000", "outside the vocabulary [0, 1000)"});
    expect_usage_error([&] { ds.read(Split::kTrain, 61, 1, part.data()); }, {"/train/tokens[61] = ", "outside the vocabulary"});
  }
}

// A file cut short after it was opened: the read that needs the lost bytes
// fails in one line naming the dataset, not with garbage tokens.
TEST(TokenColumnTest, ATruncatedFileFailsTheReadThatNeedsIt) {
  TempDir dir;
  for (auto layout : {FakeDataset::kContiguous, FakeDataset::kDeflate}) {
    const std::string path = dir.file("cut.h5");
    FakeDataset f;
    f.train = iota_tokens(5000);
    f.with_valid = false;
    f.layout = layout;
    write_fake(path, f);
    const TokenDataset ds(path);
    std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
    std::vector<int32_t> part(10);
    try {
      ds.read(Split::kTrain, 4990, 10, part.data());
      ADD_FAILURE() << "a read past the end of a truncated file succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot read /train/tokens"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("damaged or truncated"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------- sampling

class DatasetSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("iota.h5");
    FakeDataset f;
    f.train = iota_tokens(5000);
    f.valid = iota_tokens(10 * 16 + 5);
    write_fake(path_, f);
  }
  TempDir dir_;
  std::string path_;
};

TEST_F(DatasetSamplerTest, WindowsAreShiftedInBoundsAndDeterministic) {
  TokenDataset ds(path_);
  const int64_t B = 8, T = 64, n = 5000;
  std::vector<int32_t> x(B * T), y(B * T), x2(B * T), y2(B * T);
  sample_train_batch(ds, 42, 7, 0, B, T, x.data(), y.data());
  sample_train_batch(ds, 42, 7, 0, B, T, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  std::set<int32_t> starts;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t start = x[b * T];
    EXPECT_GE(start, 0);
    EXPECT_LE(start, n - (T + 1));
    starts.insert(start);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(x[b * T + t], start + t);
      EXPECT_EQ(y[b * T + t], start + t + 1);
    }
  }
  EXPECT_GT(starts.size(), 4u);  // rows differ

  // Another step or seed draws other windows.
  sample_train_batch(ds, 42, 8, 0, B, T, x2.data(), y2.data());
  EXPECT_NE(x, x2);
  sample_train_batch(ds, 43, 7, 0, B, T, x2.data(), y2.data());
  EXPECT_NE(x, x2);
}

TEST_F(DatasetSamplerTest, RowWindowsDoNotDependOnPartitioning) {
  TokenDataset ds(path_);
  const int64_t T = 32;
  std::vector<int32_t> x(8 * T), y(8 * T), xs(8 * T), ys(8 * T);
  sample_train_batch(ds, 5, 123, 0, 8, T, x.data(), y.data());
  sample_train_batch(ds, 5, 123, 0, 4, T, xs.data(), ys.data());
  sample_train_batch(ds, 5, 123, 4, 4, T, xs.data() + 4 * T, ys.data() + 4 * T);
  EXPECT_EQ(x, xs);
  EXPECT_EQ(y, ys);
  // One row at a time, too.
  for (int64_t r = 0; r < 8; ++r) {
    std::vector<int32_t> x1(T), y1(T);
    sample_train_batch(ds, 5, 123, r, 1, T, x1.data(), y1.data());
    EXPECT_TRUE(std::equal(x1.begin(), x1.end(), x.begin() + r * T)) << "row " << r;
  }
}

TEST_F(DatasetSamplerTest, StartsCoverTheWholeRange) {
  // n - T = 3 possible starts: all of them appear, nothing beyond.
  FakeDataset f;
  f.train = iota_tokens(20);
  const std::string path = dir_.file("short.h5");
  write_fake(path, f);
  TokenDataset ds(path);
  const int64_t T = 17;
  std::set<int32_t> starts;
  std::vector<int32_t> x(T), y(T);
  for (int64_t step = 0; step < 200; ++step) {
    sample_train_batch(ds, 1, step, 0, 1, T, x.data(), y.data());
    starts.insert(x[0]);
    EXPECT_EQ(y[T - 1], x[0] + T);
  }
  EXPECT_EQ(starts, (std::set<int32_t>{0, 1, 2}));
}

TEST_F(DatasetSamplerTest, TrainSplitShorterThanOneSequence) {
  TokenDataset ds(path_);
  std::vector<int32_t> x(5000), y(5000);
  expect_usage_error([&] { sample_train_batch(ds, 1, 0, 0, 1, 5000, x.data(), y.data()); },
                     {"--data " + path_, "train split has 5000 tokens", "--seq-len 5000 + 1"});
  EXPECT_NO_THROW(sample_train_batch(ds, 1, 0, 0, 1, 4999, x.data(), y.data()));
  EXPECT_EQ(x[0], 0);
}

TEST_F(DatasetSamplerTest, EvalWindows) {
  TokenDataset ds(path_);
  const int64_t T = 16;  // valid has 10 T + 5 tokens
  ASSERT_EQ(num_eval_windows(ds, T), 10);
  EXPECT_EQ(num_eval_windows(ds, 10 * T + 4), 1);  // exactly T + 1 tokens
  EXPECT_EQ(num_eval_windows(ds, 10 * T + 5), 0);  // shorter than T + 1
  const int64_t B = 4;
  std::vector<int32_t> x(B * T), y(B * T);
  eval_batch(ds, 8, B, T, x.data(), y.data());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(x[b * T + t], (8 + b) * T + t);
      EXPECT_EQ(y[b * T + t], (8 + b) * T + t + 1);
    }
  for (int64_t b = 2; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(x[b * T + t], 0);
      EXPECT_EQ(y[b * T + t], -1);
    }
  // Deterministic.
  std::vector<int32_t> x2(B * T), y2(B * T);
  eval_batch(ds, 8, B, T, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  // Nothing to evaluate: everything is padding.
  const int64_t T2 = 10 * T + 5;
  std::vector<int32_t> x3(2 * T2, 7), y3(2 * T2, 7);
  eval_batch(ds, 0, 2, T2, x3.data(), y3.data());
  EXPECT_TRUE(std::all_of(x3.begin(), x3.end(), [](int32_t v) { return v == 0; }));
  EXPECT_TRUE(std::all_of(y3.begin(), y3.end(), [](int32_t v) { return v == -1; }));
}

// ---------------------------------------------------------------- SentencePiece

TEST(DatasetTest, SentencePieceDataset) {
  TempDir dir;
  const std::string corpus = dir.file("sp_corpus.txt");
  write_text(corpus, testing::sample_text(3000, 11));
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --model_prefix=" + dir.file("sp") +
      " --vocab_size=300 --model_type=bpe --character_coverage=1.0"
      " --normalization_rule_name=identity --add_dummy_prefix=false --remove_extra_whitespaces=false"
      " --num_threads=1 --minloglevel=2");
  ASSERT_TRUE(status.ok()) << status.ToString();
  const std::string model = dir.file("sp.model");

  const std::string d1 = "The cat reads the letter and kaloter today. ";
  const std::string d2 = "A quiet river explains seven apples!";
  write_text(dir.file("d1.txt"), d1);
  write_text(dir.file("d2.txt"), d2);
  PrepareOptions opt;
  opt.inputs = {dir.file("d1.txt"), dir.file("d2.txt")};
  opt.output = dir.file("sp.h5");
  opt.tokenizer = model;
  opt.valid_fraction = 0.05;
  const auto r = prepare_dataset(opt);
  EXPECT_EQ(r.vocab_size, 300);
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.valid_tokens, 0);  // one block

  auto tok = make_tokenizer(model);
  const int32_t bos = tok->bos_id(), eos = tok->eos_id();
  EXPECT_GE(bos, 0);
  EXPECT_GE(eos, 0);
  std::vector<int32_t> expected = {bos};
  for (int32_t id : tok->encode(d1)) expected.push_back(id);
  expected.push_back(eos);
  expected.push_back(bos);
  for (int32_t id : tok->encode(d2)) expected.push_back(id);
  expected.push_back(eos);

  TokenDataset ds(opt.output);
  EXPECT_EQ(ds.tokenizer(), "sentencepiece");
  EXPECT_EQ(ds.vocab_size(), 300);
  EXPECT_EQ(ds.tokens(Split::kTrain), expected);

  hid_t file = H5Fopen(opt.output.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_EQ(read_string_attribute(file, "tokenizer"), "sentencepiece");
  EXPECT_EQ(read_int_attribute(file, "bos_id"), bos);
  EXPECT_EQ(read_int_attribute(file, "eos_id"), eos);
  EXPECT_EQ(read_int_attribute(file, "vocab_size"), 300);
  EXPECT_GT(H5Lexists(file, "tokenizer", H5P_DEFAULT), 0);
  H5Fclose(file);

  // The stored model decodes the dataset without the .model file.
  fs::remove(model);
  auto stored = dataset_tokenizer(opt.output);
  EXPECT_EQ(stored->kind(), "sentencepiece");
  EXPECT_EQ(stored->vocab_size(), 300);
  const auto& train = ds.tokens(Split::kTrain);
  const std::vector<int32_t> doc1(train.begin() + 1, train.begin() + 1 + tok->encode(d1).size());
  EXPECT_EQ(stored->decode(doc1), d1);
  EXPECT_EQ(stored->decode(tok->encode(d2)), d2);
}

}  // namespace
}  // namespace amsp::data

namespace amsp::data {
namespace {

// The one-line UsageError prepare_dataset gives for this input, "" if it accepts it.
std::string prepare_error(const testing::TempDir& dir, const std::string& content, bool* wrote) {
  const std::string in = dir.file("in.txt"), out = dir.file("out.h5");
  testing::write_text(in, content);
  std::filesystem::remove(out);
  std::string error;
  try {
    PrepareOptions o;
    o.inputs = {in};
    o.output = out;
    prepare_dataset(o);
  } catch (const UsageError& e) {
    error = e.what();
  }
  *wrote = std::filesystem::exists(out);
  return error;
}

TEST(PrepareInputTest, EmptyBinaryAndNonUtf8InputsAreRefusedWritingNothing) {
  testing::TempDir dir;
  bool wrote = true;
  EXPECT_NE(prepare_error(dir, "", &wrote).find("the file is empty"), std::string::npos);
  EXPECT_FALSE(wrote);
  EXPECT_NE(prepare_error(dir, std::string("abc\0def", 7), &wrote).find("a NUL byte at offset 3"), std::string::npos);
  EXPECT_FALSE(wrote);
  EXPECT_NE(prepare_error(dir, "caf\xe9 au lait", &wrote).find("byte 0xE9 at offset 3 is not UTF-8"),
            std::string::npos);
  EXPECT_FALSE(wrote);
  // Overlong '/', a UTF-16 surrogate, a code point past U+10FFFF, a truncated sequence.
  EXPECT_NE(prepare_error(dir, "ok \xc0\xaf", &wrote).find("offset 3"), std::string::npos);
  EXPECT_NE(prepare_error(dir, "ok \xed\xa0\x80", &wrote).find("offset 3"), std::string::npos);
  EXPECT_NE(prepare_error(dir, "ok \xf4\x90\x80\x80", &wrote).find("offset 3"), std::string::npos);
  EXPECT_NE(prepare_error(dir, "ok \xe2\x82", &wrote).find("offset 3"), std::string::npos);
  EXPECT_FALSE(wrote);
}

TEST(PrepareInputTest, Utf8TextWithBomAndCrlfIsAccepted) {
  testing::TempDir dir;
  bool wrote = false;
  EXPECT_EQ(prepare_error(dir, "\xef\xbb\xbf" "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\r\nline\r\n", &wrote), "");
  EXPECT_TRUE(wrote);
}

TEST(PrepareInputTest, AFailureLeavesAnExistingOutputUntouched) {
  testing::TempDir dir;
  const std::string out = dir.file("out.h5");
  testing::write_text(out, "keep me");
  testing::write_text(dir.file("bad.txt"), std::string("\0\1\2", 3));
  PrepareOptions o;
  o.inputs = {dir.file("bad.txt")};
  o.output = out;
  EXPECT_THROW(prepare_dataset(o), UsageError);
  std::ifstream in(out);
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "keep me");
}

}  // namespace
}  // namespace amsp::data
