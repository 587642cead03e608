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

constexpr const char* kFormat = "amsp-token-dataset";
constexpr int64_t kVersion = 1;
// The held-out split is made of whole blocks of this many tokens.
constexpr int64_t kSplitBlock = 2048;
constexpr hsize_t kChunk = 64 * 1024;

// ---------------------------------------------------------------- writing

// Throws a runtime failure (exit 1) naming the output and the step that failed.
struct Writer {
  std::string output;
  [[noreturn]] void failed(const std::string& what) const {
    fail("--output ", output, ": HDF5 could not ", what, " (disk full or not writable?)");
  }
};

void write_string_attr(const Writer& w, hid_t obj, const char* name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.valid() || H5Tset_size(type, H5T_VARIABLE) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0)
    w.failed("make a string type");
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (!space.valid()) w.failed("make a scalar dataspace");
  Handle attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) w.failed(cat("create attribute ", name));
  const char* p = value.c_str();
  if (H5Awrite(attr, type, &p) < 0) w.failed(cat("write attribute ", name));
  if (!attr.close()) w.failed(cat("close attribute ", name));
}

template <typename T>
void write_scalar_attr(const Writer& w, hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                       T value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (!space.valid()) w.failed("make a scalar dataspace");
  Handle attr(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) w.failed(cat("create attribute ", name));
  if (H5Awrite(attr, mem_type, &value) < 0) w.failed(cat("write attribute ", name));
  if (!attr.close()) w.failed(cat("close attribute ", name));
}

void write_int_attr(const Writer& w, hid_t obj, const char* name, int64_t value) {
  write_scalar_attr(w, obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, value);
}

// A 1-D dataset, chunked and deflated; an empty one is contiguous (a chunk
// cannot have size 0).
void write_array(const Writer& w, hid_t parent, const char* name, hid_t file_type, hid_t mem_type,
                 const void* data, hsize_t n) {
  const hsize_t dims[1] = {n};
  Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  if (!space.valid()) w.failed(cat("make the dataspace of ", name));
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!dcpl.valid()) w.failed("make a dataset property list");
  if (n > 0) {
    const hsize_t chunk[1] = {std::min(n, kChunk)};
    if (H5Pset_chunk(dcpl, 1, chunk) < 0) w.failed(cat("set the chunking of ", name));
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0 && H5Pset_deflate(dcpl, 1) < 0)
      w.failed(cat("set the compression of ", name));
  }
  Handle dset(H5Dcreate2(parent, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) w.failed(cat("create dataset ", name));
  if (n > 0 && H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    w.failed(cat("write dataset ", name));
  if (!dset.close()) w.failed(cat("close dataset ", name));
}

Handle make_group(const Writer& w, hid_t parent, const char* name) {
  Handle g(H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.valid()) w.failed(cat("create group ", name));
  return g;
}

std::string join_lines(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += '\n';
    s += v[i];
  }
  return s;
}

// Removes the temporary file unless the prepare completed.
struct TempFile {
  std::string path;
  bool keep = false;
  ~TempFile() {
    if (!keep) {
      std::error_code ec;
      fs::remove(path, ec);
    }
  }
};

// ---------------------------------------------------------------- reading

// An open, checked dataset file: exists, is HDF5, has our format and version.
struct OpenDataset {
  std::string path;
  Handle file;
  std::string tokenizer;
  int64_t vocab_size = 0;
};

[[noreturn]] void not_ours(const std::string& path, const std::string& found) {
  fail_usage("--data ", path, ": wrong format attribute (", found, ", expected \"", kFormat,
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
  if (format != kFormat) not_ours(path, cat("found \"", format, "\""));

  int64_t version = 0;
  if (!read_int_attr(d.file, "version", &version))
    fail_usage("--data ", path, ": missing or non-integer version attribute; expected version ", kVersion);
  if (version != kVersion)
    fail_usage("--data ", path, ": unsupported dataset version ", version, " (this amsp reads version ",
               kVersion, "); re-run `amsp data prepare`");
  if (!read_string_attr(d.file, "tokenizer", &d.tokenizer))
    fail_usage("--data ", path, ": missing tokenizer attribute; expected \"byte\", \"sentencepiece\" or \"huggingface\"");
  if (!read_int_attr(d.file, "vocab_size", &d.vocab_size) || d.vocab_size <= 0 ||
      d.vocab_size > std::numeric_limits<int32_t>::max())
    fail_usage("--data ", path, ": missing or invalid vocab_size attribute; expected a positive integer");
  return d;
}

// Reads a 1-D integer dataset into int32 and checks ids are in [0, vocab).
// A missing dataset is an error if required, else an empty split.
std::vector<int32_t> read_tokens(const OpenDataset& d, const char* name, bool required) {
  if (!link_exists(d.file, name)) {
    if (!required) return {};
    fail_usage("--data ", d.path, ": missing dataset ", name,
               "; expected a dataset written by `amsp data prepare`");
  }
  Handle dset(H5Dopen2(d.file, name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) fail_usage("--data ", d.path, ": ", name, " is not a dataset");
  Handle type(H5Dget_type(dset), H5Tclose);
  Handle space(H5Dget_space(dset), H5Sclose);
  if (!type.valid() || !space.valid()) fail("--data ", d.path, ": HDF5 cannot inspect ", name);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (H5Tget_class(type) != H5T_INTEGER || rank != 1)
    fail_usage("--data ", d.path, ": ", name, " is ",
               H5Tget_class(type) == H5T_INTEGER ? "an integer" : "a non-integer", " array of rank ", rank,
               "; expected a 1-D uint32 array of token ids");
  hsize_t n = 0;
  if (H5Sget_simple_extent_dims(space, &n, nullptr) != 1) fail("--data ", d.path, ": HDF5 cannot size ", name);
  std::vector<int32_t> tokens(n);
  // Out-of-range values (uint32 above 2^31, 64-bit ids) clip during the
  // conversion and are caught by the range check below.
  if (n > 0 && H5Dread(dset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()) < 0)
    fail("--data ", d.path, ": HDF5 cannot read ", name, " (damaged file?)");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= d.vocab_size)
      fail_usage("--data ", d.path, ": ", name, "[", i, "] = ", tokens[i], " is outside the vocabulary [0, ",
                 d.vocab_size, ")");
  }
  return tokens;
}

}  // namespace

// ------------------------------------------------------------------ prepare

namespace {

// Checked before any input is read: a bad option should not cost a long tokenization.
void check_prepare_options(const PrepareOptions& options) {
  const double f = options.valid_fraction;
  if (!(f >= 0.0 && f <= 0.5))
    fail_usage("--valid-fraction ", f, ": expected a number in [0, 0.5]");
  const std::string& output = options.output;
  if (output.empty()) fail_usage("--output: expected the path of the .h5 file to write");
  std::error_code ec;
  if (fs::is_directory(output, ec)) fail_usage("--output ", output, ": is a directory; expected a file path");
  const fs::path parent = fs::path(output).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    fail_usage("--output ", output, ": directory ", parent.string(), " does not exist");
  if (options.inputs.empty()) fail_usage("--input: expected at least one text or JSON Lines file");
}

// The token stream of all documents in order (data/documents.h); counts
// documents, bytes and skipped records in `report`. Each document is as
// Tokenizer::encode_document makes it.
std::vector<int32_t> tokenize_inputs(const std::vector<std::string>& files, const PrepareOptions& options,
                                     const Tokenizer& tokenizer, PrepareReport& report) {
  std::vector<int32_t> all;
  DocumentReader reader(files, options.input);
  std::string text;
  while (reader.next(&text)) {
    report.documents += 1;
    tokenizer.encode_document(text, &all);
  }
  report.bytes_in = reader.bytes_in();
  report.skipped = reader.skipped();
  if (report.documents == 0)
    fail_usage("--input: no documents in ", files.size(), " file(s)",
               report.skipped ? cat(" (", report.skipped, " bad records skipped)") : "",
               "; expected text files or JSON Lines with a \"", options.input.text_field, "\" field");
  // A user-supplied model could hand out ids past its own vocabulary; such a
  // dataset would fail only later, in training.
  for (int32_t id : all)
    if (id < 0 || id >= report.vocab_size)
      fail_usage("--tokenizer ", options.tokenizer, ": produced id ", id, " outside its vocabulary of ",
                 report.vocab_size, "; expected a tokenizer whose ids fit its own vocabulary");
  return all;
}

struct Splits {
  std::vector<uint32_t> train, valid;
};

// Held-out split: block b goes to valid when floor((b+1) f) > floor(b f), so
// valid blocks are spread evenly (every 1/f-th block) and make up a share f.
// A corpus of two blocks or more always holds out at least one.
Splits split_blocks(const std::vector<int32_t>& all, double f) {
  const int64_t n = static_cast<int64_t>(all.size());
  const int64_t num_blocks = (n + kSplitBlock - 1) / kSplitBlock;
  std::vector<char> is_valid(num_blocks, 0);
  int64_t held_out = 0;
  if (f > 0) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const double lo = std::floor(static_cast<double>(b) * f + 1e-9);
      const double hi = std::floor(static_cast<double>(b + 1) * f + 1e-9);
      if (hi > lo) is_valid[b] = 1, ++held_out;
    }
    if (held_out == 0 && num_blocks >= 2) {
      // Fewer than 1/f blocks: hold out the last full block.
      is_valid[n / kSplitBlock - 1] = 1;
    }
  }
  Splits s;
  s.train.reserve(n);
  for (int64_t b = 0; b < num_blocks; ++b) {
    auto& dst = is_valid[b] ? s.valid : s.train;
    const int64_t end = std::min(n, (b + 1) * kSplitBlock);
    for (int64_t i = b * kSplitBlock; i < end; ++i) dst.push_back(static_cast<uint32_t>(all[i]));
  }
  return s;
}

// Writes the whole dataset to `path` and closes it; any HDF5 failure names the
// output and the step.
void write_dataset_file(const Writer& w, const std::string& path, const PrepareOptions& options,
                        const std::vector<std::string>& files, const Tokenizer& tokenizer,
                        const PrepareReport& report, const Splits& splits) {
  const bool bytes = tokenizer.kind() == "byte";
  h5::QuietErrors quiet;
  Handle fapl = h5::file_access();
  Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.valid() ? fapl.get() : H5P_DEFAULT),
              H5Fclose);
  if (!file.valid()) fail_usage("--output ", w.output, ": cannot create ", path, " (not writable?)");
  write_string_attr(w, file, "format", kFormat);
  write_int_attr(w, file, "version", kVersion);
  write_string_attr(w, file, "tokenizer", tokenizer.kind());
  write_int_attr(w, file, "vocab_size", report.vocab_size);
  write_int_attr(w, file, "bos_id", tokenizer.bos_id());
  write_int_attr(w, file, "eos_id", tokenizer.eos_id());
  write_int_attr(w, file, "documents", report.documents);
  write_string_attr(w, file, "sources", join_lines(files));
  write_int_attr(w, file, "bytes_in", report.bytes_in);
  write_scalar_attr(w, file, "valid_fraction", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, options.valid_fraction);
  write_int_attr(w, file, "split_block", kSplitBlock);
  {
    Handle g = make_group(w, file, "train");
    write_array(w, g, "tokens", H5T_STD_U32LE, H5T_NATIVE_UINT32, splits.train.data(), splits.train.size());
  }
  {
    Handle g = make_group(w, file, "valid");
    write_array(w, g, "tokens", H5T_STD_U32LE, H5T_NATIVE_UINT32, splits.valid.data(), splits.valid.size());
  }
  if (!bytes) {
    const std::string model = tokenizer.serialized_model();
    Handle g = make_group(w, file, "tokenizer");
    write_array(w, g, "model", H5T_STD_U8LE, H5T_NATIVE_UINT8, model.data(), model.size());
  }
  if (!file.close()) w.failed("close (flush) the file");
}

}  // namespace

PrepareReport prepare_dataset(const PrepareOptions& options) {
  check_prepare_options(options);
  const auto tokenizer = make_tokenizer(options.tokenizer);
  PrepareReport report;
  report.vocab_size = tokenizer->vocab_size();
  // The unsplit stream is a temporary: freed before the file is written.
  const std::vector<std::string> files = expand_inputs(options.inputs);
  const Splits splits = split_blocks(tokenize_inputs(files, options, *tokenizer, report), options.valid_fraction);
  report.train_tokens = static_cast<int64_t>(splits.train.size());
  report.valid_tokens = static_cast<int64_t>(splits.valid.size());

  // Write under a temporary name; rename into place once closed, so that a failed
  // prepare never leaves a half-written file at the output path.
  const Writer w{options.output};
  TempFile tmp{options.output + ".tmp"};
  write_dataset_file(w, tmp.path, options, files, *tokenizer, report, splits);
  std::error_code ec;
  fs::rename(tmp.path, options.output, ec);
  if (ec) fail("--output ", options.output, ": cannot rename ", tmp.path, " into place: ", ec.message());
  tmp.keep = true;
  return report;
}

// ------------------------------------------------------------------ reading

TokenDataset::TokenDataset(const std::string& path) : path_(path) {
  h5::QuietErrors quiet;
  OpenDataset d = open_dataset(path);
  tokenizer_ = d.tokenizer;
  vocab_size_ = d.vocab_size;
  train_ = read_tokens(d, "/train/tokens", true);
  valid_ = read_tokens(d, "/valid/tokens", false);
}

int32_t TokenDataset::max_token(Split split) const {
  const auto& t = tokens(split);
  return t.empty() ? -1 : *std::max_element(t.begin(), t.end());
}

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
