// amsp data prepare: documents in, tokens out, streamed. The reader, the
// tokenizer threads and the writer pass batches along; the whole corpus is
// never in memory, and the file is the same whatever the thread count.
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/h5.h"
#include "data/block_split.h"
#include "data/dataset.h"
#include "data/documents.h"
#include "data/parallel_encode.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

namespace amsp::data {
namespace fs = std::filesystem;
using h5::Handle;

namespace {

constexpr hsize_t kChunk = 64 * 1024;
// Tokens gathered before each append to the file.
constexpr size_t kWriteBatch = 1 << 20;

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

Handle make_group(const Writer& w, hid_t parent, const char* name) {
  Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  if (!gcpl.valid() || H5Pset_obj_track_times(gcpl, false) < 0) w.failed("make a group property list");
  Handle g(H5Gcreate2(parent, name, H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose);
  if (!g.valid()) w.failed(cat("create group ", name));
  return g;
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

// A 1-D uint32 dataset that grows as tokens are appended (chunked, deflated).
class TokenSink {
 public:
  TokenSink(const Writer& w, hid_t file, const char* group, int64_t vocab_size, const std::string& tokenizer)
      : w_(w), name_(cat("/", group, "/tokens")), vocab_size_(vocab_size), tokenizer_(tokenizer) {
    group_ = make_group(w, file, group);
    const hsize_t dims[1] = {0}, max[1] = {H5S_UNLIMITED}, chunk[1] = {kChunk};
    Handle space(H5Screate_simple(1, dims, max), H5Sclose);
    Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (!space.valid() || !dcpl.valid() || H5Pset_chunk(dcpl, 1, chunk) < 0 ||
        H5Pset_obj_track_times(dcpl, false) < 0)
      w.failed(cat("set up ", name_));
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0 && H5Pset_deflate(dcpl, 1) < 0)
      w.failed(cat("set the compression of ", name_));
    dset_ = Handle(H5Dcreate2(group_, "tokens", H5T_STD_U32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    if (!dset_.valid()) w.failed(cat("create dataset ", name_));
    buffer_.reserve(kWriteBatch);
  }

  // A tokenizer that hands out ids past its own vocabulary would make a
  // dataset that fails only later, in training: refused here.
  void append(const int32_t* ids, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size_)
        fail_usage("--tokenizer ", tokenizer_, ": produced id ", ids[i], " outside its vocabulary of ", vocab_size_,
                   "; expected a tokenizer whose ids fit its own vocabulary");
      buffer_.push_back(static_cast<uint32_t>(ids[i]));
      if (buffer_.size() == kWriteBatch) flush();
    }
  }

  void close() {
    flush();
    if (!dset_.close() || !group_.close()) w_.failed(cat("close ", name_));
  }
  int64_t size() const { return static_cast<int64_t>(written_ + buffer_.size()); }

 private:
  void flush() {
    if (buffer_.empty()) return;
    const hsize_t start[1] = {written_}, count[1] = {buffer_.size()}, total[1] = {written_ + buffer_.size()};
    if (H5Dset_extent(dset_, total) < 0) w_.failed(cat("extend ", name_));
    Handle file_space(H5Dget_space(dset_), H5Sclose);
    Handle mem_space(H5Screate_simple(1, count, nullptr), H5Sclose);
    if (!file_space.valid() || !mem_space.valid() ||
        H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, nullptr, count, nullptr) < 0 ||
        H5Dwrite(dset_, H5T_NATIVE_UINT32, mem_space, file_space, H5P_DEFAULT, buffer_.data()) < 0)
      w_.failed(cat("write ", name_));
    written_ += buffer_.size();
    buffer_.clear();
  }

  const Writer& w_;
  std::string name_;
  int64_t vocab_size_;
  std::string tokenizer_;
  Handle group_, dset_;
  std::vector<uint32_t> buffer_;
  hsize_t written_ = 0;
};

// The root's attributes, written last: the counts are known only then.
void write_attributes(const Writer& w, hid_t file, const PrepareOptions& options, const std::vector<std::string>& files,
                      const Tokenizer& tokenizer, const PrepareReport& report) {
  write_string_attr(w, file, "format", kDatasetFormat);
  write_int_attr(w, file, "version", kDatasetVersion);
  write_string_attr(w, file, "tokenizer", tokenizer.kind());
  write_int_attr(w, file, "vocab_size", report.vocab_size);
  write_int_attr(w, file, "bos_id", tokenizer.bos_id());
  write_int_attr(w, file, "eos_id", tokenizer.eos_id());
  write_int_attr(w, file, "documents", report.documents);
  write_string_attr(w, file, "sources", join(files, "\n"));
  write_int_attr(w, file, "bytes_in", report.bytes_in);
  write_scalar_attr(w, file, "valid_fraction", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, options.valid_fraction);
  write_int_attr(w, file, "split_block", kSplitBlock);
}

void write_tokenizer_model(const Writer& w, hid_t file, const Tokenizer& tokenizer) {
  if (tokenizer.kind() == "byte") return;
  const std::string model = tokenizer.serialized_model();
  Handle g = make_group(w, file, "tokenizer");
  const hsize_t dims[1] = {model.size()};
  Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!dcpl.valid() || H5Pset_obj_track_times(dcpl, false) < 0) w.failed("make a dataset property list");
  Handle dset(H5Dcreate2(g, "model", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (!space.valid() || !dset.valid()) w.failed("create dataset /tokenizer/model");
  if (!model.empty() && H5Dwrite(dset, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, model.data()) < 0)
    w.failed("write dataset /tokenizer/model");
  if (!dset.close()) w.failed("close dataset /tokenizer/model");
}

}  // namespace

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


TokenizeCounts tokenize_files(const std::vector<std::string>& files, const PrepareOptions& options,
                              const Tokenizer& tokenizer, const std::function<void(const int32_t*, size_t)>& sink) {
  TokenizeCounts counts;
  DocumentReader reader(files, options.input);
  const int threads = options.threads > 0 ? options.threads : available_cores();
  encode_in_order(
      [&](std::string* text) { return reader.next(text) && (++counts.documents, true); }, tokenizer, threads,
      [&](const std::vector<int32_t>& ids) { sink(ids.data(), ids.size()); });
  counts.bytes_in = reader.bytes_in();
  counts.skipped = reader.skipped();
  return counts;
}

std::pair<size_t, size_t> file_share(const std::vector<std::string>& files, int part, int parts) {
  // File f goes to the part its first byte falls in, of `parts` equal spans.
  std::vector<uintmax_t> start(files.size() + 1, 0);
  for (size_t f = 0; f < files.size(); ++f) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(files[f], ec);
    start[f + 1] = start[f] + (ec ? 0 : size) + 1;  // + 1: empty files count too
  }
  const long double total = static_cast<long double>(start.back());
  auto owner = [&](size_t f) { return static_cast<int>(start[f] * static_cast<long double>(parts) / total); };
  size_t first = 0;
  while (first < files.size() && owner(first) < part) ++first;
  size_t last = first;
  while (last < files.size() && owner(last) == part) ++last;
  return {first, last};
}

struct DatasetWriter::File {
  File(const PrepareOptions& o, const Tokenizer& t)
      : options(o),
        tokenizer(t),
        w{o.output},
        tmp{o.output + ".tmp"},
        handle(create(w, tmp.path)),
        train(w, handle, "train", t.vocab_size(), o.tokenizer),
        valid(w, handle, "valid", t.vocab_size(), o.tokenizer),
        split(
            o.valid_fraction, [this](const int32_t* ids, size_t n) { train.append(ids, n); },
            [this](const int32_t* ids, size_t n) { valid.append(ids, n); }) {}

  static Handle create(const Writer& w, const std::string& path) {
    Handle fapl = h5::file_access();
    Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.valid() ? fapl.get() : H5P_DEFAULT),
                H5Fclose);
    if (!file.valid()) fail_usage("--output ", w.output, ": cannot create ", path, " (not writable?)");
    return file;
  }

  const PrepareOptions& options;
  const Tokenizer& tokenizer;
  h5::QuietErrors quiet;
  Writer w;
  TempFile tmp;
  Handle handle;
  TokenSink train, valid;
  BlockSplitter split;
};

DatasetWriter::DatasetWriter(const PrepareOptions& options, const Tokenizer& tokenizer)
    : file_(std::make_unique<File>(options, tokenizer)) {}

DatasetWriter::~DatasetWriter() = default;

void DatasetWriter::push(const int32_t* ids, size_t n) { file_->split.push(ids, n); }

PrepareReport DatasetWriter::finish(const std::vector<std::string>& files, const TokenizeCounts& counts) {
  File& f = *file_;
  if (counts.documents == 0)
    fail_usage("--input: no documents in ", files.size(), " file(s)",
               counts.skipped ? cat(" (", counts.skipped, " bad records skipped)") : "",
               "; expected text files or JSON Lines with a \"", f.options.input.text_field, "\" field");
  f.split.finish();
  PrepareReport report;
  report.documents = counts.documents;
  report.bytes_in = counts.bytes_in;
  report.skipped = counts.skipped;
  report.vocab_size = f.tokenizer.vocab_size();
  report.train_tokens = f.train.size();
  report.valid_tokens = f.valid.size();
  f.train.close();
  f.valid.close();
  write_tokenizer_model(f.w, f.handle, f.tokenizer);
  write_attributes(f.w, f.handle, f.options, files, f.tokenizer, report);
  if (!f.handle.close()) f.w.failed("close (flush) the file");
  std::error_code ec;
  fs::rename(f.tmp.path, f.options.output, ec);
  if (ec) fail("--output ", f.options.output, ": cannot rename ", f.tmp.path, " into place: ", ec.message());
  f.tmp.keep = true;
  return report;
}

PrepareReport prepare_dataset(const PrepareOptions& options) {
  check_prepare_options(options);
  const auto tokenizer = make_tokenizer(options.tokenizer);
  const std::vector<std::string> files = expand_inputs(options.inputs);
  DatasetWriter writer(options, *tokenizer);
  const TokenizeCounts counts =
      tokenize_files(files, options, *tokenizer, [&](const int32_t* ids, size_t n) { writer.push(ids, n); });
  return writer.finish(files, counts);
}

}  // namespace amsp::data
