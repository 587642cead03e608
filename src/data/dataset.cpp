#include "data/dataset.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <system_error>

#include "core/error.h"
#include "core/h5.h"
#include "data/documents.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"

namespace amsp::data {
namespace fs = std::filesystem;
using h5::Handle;
using h5::link_exists;
using h5::read_int_attr;
using h5::read_string_attr;

namespace {

// ---------------------------------------------------------------- reading

// An open, checked dataset file: exists, is HDF5, has our format and version.
struct OpenDataset {
  std::string path;
  Handle file;
  std::string tokenizer;
  int64_t vocab_size = 0;
};

[[noreturn]] void not_ours(const std::string& path, const std::string& found) {
  fail_usage("--data ", path, ": wrong format attribute (", found, ", expected \"", kDatasetFormat,
             "\"): is this a tokenized dataset from `amsp data prepare`?");
}

OpenDataset open_dataset(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail_usage("--data ", path, ": no such file");
  if (fs::is_directory(path, ec))
    fail_usage("--data ", path, ": is a directory; expected a dataset written by `amsp data prepare`");
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 < 0) fail_usage("--data ", path, ": cannot read the file");
  if (is_hdf5 == 0)
    fail_usage("--data ", path, ": not an HDF5 file; expected a dataset written by `amsp data prepare`");
  OpenDataset d;
  d.path = path;
  Handle fapl = h5::file_access();
  d.file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.valid() ? fapl.get() : H5P_DEFAULT),
                  H5Fclose);
  if (!d.file.valid()) fail_usage("--data ", path, ": HDF5 cannot open the file (damaged or truncated?)");

  std::string format;
  if (H5Aexists(d.file, "format") <= 0) not_ours(path, "none found");
  if (!read_string_attr(d.file, "format", &format)) not_ours(path, "not a string");
  if (format != kDatasetFormat) not_ours(path, cat("found \"", format, "\""));

  int64_t version = 0;
  if (!read_int_attr(d.file, "version", &version))
    fail_usage("--data ", path, ": missing or non-integer version attribute; expected version ", kDatasetVersion);
  if (version != kDatasetVersion)
    fail_usage("--data ", path, ": unsupported dataset version ", version, " (this amsp reads version ",
               kDatasetVersion, "); re-run `amsp data prepare`");
  if (!read_string_attr(d.file, "tokenizer", &d.tokenizer))
    fail_usage("--data ", path, ": missing tokenizer attribute; expected \"byte\", \"sentencepiece\" or \"huggingface\"");
  if (!read_int_attr(d.file, "vocab_size", &d.vocab_size) || d.vocab_size <= 0 ||
      d.vocab_size > std::numeric_limits<int32_t>::max())
    fail_usage("--data ", path, ": missing or invalid vocab_size attribute; expected a positive integer");
  return d;
}

// A split's tokens, left in the file. A missing dataset is an error if
// required, else an empty split.
std::unique_ptr<TokenColumn> open_tokens(const OpenDataset& d, const char* name, bool required) {
  if (!link_exists(d.file, name)) {
    if (!required) return std::make_unique<TokenColumn>();
    fail_usage("--data ", d.path, ": missing dataset ", name,
               "; expected a dataset written by `amsp data prepare`");
  }
  return TokenColumn::open(d.file, d.path, name, d.vocab_size);
}

}  // namespace

// ------------------------------------------------------------------ reading

TokenDataset::TokenDataset(const std::string& path) : path_(path) {
  h5::QuietErrors quiet;
  OpenDataset d = open_dataset(path);
  tokenizer_ = d.tokenizer;
  vocab_size_ = d.vocab_size;
  train_ = open_tokens(d, "/train/tokens", true);
  valid_ = open_tokens(d, "/valid/tokens", false);
}

TokenDataset::~TokenDataset() = default;

int64_t TokenDataset::size(Split split) const { return column(split).size(); }

void TokenDataset::read(Split split, int64_t start, int64_t count, int32_t* out) const {
  column(split).read(start, count, out);
}

std::vector<int32_t> TokenDataset::tokens(Split split) const {
  std::vector<int32_t> t(static_cast<size_t>(size(split)));
  read(split, 0, size(split), t.data());
  return t;
}

std::string TokenDataset::layout(Split split) const { return column(split).layout(); }

std::unique_ptr<Tokenizer> dataset_tokenizer(const std::string& path) {
  h5::QuietErrors quiet;
  OpenDataset d = open_dataset(path);
  if (d.tokenizer == "byte") return make_tokenizer("byte");
  if (d.tokenizer != "sentencepiece" && d.tokenizer != "huggingface")
    fail_usage("--data ", path, ": unknown tokenizer \"", d.tokenizer,
               "\"; expected \"byte\", \"sentencepiece\" or \"huggingface\"");
  const char* name = "/tokenizer/model";
  if (!link_exists(d.file, name)) fail_usage("--data ", path, ": missing dataset ", name, " (the tokenizer)");
  Handle dset(H5Dopen2(d.file, name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) fail_usage("--data ", path, ": ", name, " is not a dataset");
  Handle space(H5Dget_space(dset), H5Sclose);
  hsize_t n = 0;
  if (!space.valid() || H5Sget_simple_extent_ndims(space) != 1 ||
      H5Sget_simple_extent_dims(space, &n, nullptr) != 1)
    fail_usage("--data ", path, ": ", name, ": expected a 1-D uint8 array");
  std::string model(n, '\0');
  if (n > 0 && H5Dread(dset, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, model.data()) < 0)
    fail_usage("--data ", path, ": cannot read ", name, "; expected a 1-D uint8 array");
  auto tok = d.tokenizer == "huggingface" ? make_hf_tokenizer(model, "--data " + path)
                                          : make_sentencepiece_tokenizer(model, "--data " + path);
  if (tok->vocab_size() != d.vocab_size)
    fail_usage("--data ", path, ": the stored ", d.tokenizer, " tokenizer has ", tok->vocab_size(),
               " ids but vocab_size says ", d.vocab_size);
  return tok;
}

}  // namespace amsp::data
