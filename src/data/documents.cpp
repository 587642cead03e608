#include "data/documents.h"

#include <glob.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace amsp::data {
namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = 1 << 20;  // bytes read from a file at a time

// The byte offset of the first byte that is not UTF-8 text (a NUL is never
// text), or -1. Overlong forms, surrogates and code points past U+10FFFF are
// invalid, as in RFC 3629.
int64_t first_non_text_byte(const std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const int64_t n = static_cast<int64_t>(text.size());
  for (int64_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c == 0) return i;
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else return i;
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return -1;
}

// Why text is not a document ("" if it is one); `what` says what holds it.
std::string not_text(const std::string& text, const char* what) {
  const int64_t bad = first_non_text_byte(text);
  if (bad < 0) return "";
  const auto byte = static_cast<unsigned char>(text[static_cast<size_t>(bad)]);
  if (byte == 0) return cat("a NUL byte at offset ", bad, ": ", what, ", expected UTF-8 text");
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", byte);
  return cat("byte ", hex, " at offset ", bad,
             " is not UTF-8; expected UTF-8 text (convert it first, e.g. iconv -f latin1 -t utf-8)");
}

struct File {
  explicit File(const std::string& path) : f(std::fopen(path.c_str(), "rb")) {
    if (!f) fail_usage("--input ", path, ": cannot open the file: ", std::strerror(errno));
  }
  ~File() { std::fclose(f); }
  size_t read(void* buf, size_t n, const std::string& path) {
    const size_t got = std::fread(buf, 1, n, f);
    if (got < n && std::ferror(f)) fail_usage("--input ", path, ": read error: ", std::strerror(errno));
    return got;
  }
  std::FILE* f;
};

class PlainSource final : public ByteSource {
 public:
  PlainSource(std::string path, std::string head) : path_(std::move(path)), file_(path_), head_(std::move(head)) {
    std::fseek(file_.f, static_cast<long>(head_.size()), SEEK_SET);
  }
  size_t read(char* buf, size_t n) override {
    if (!head_.empty()) {  // the bytes looked at for the magic number
      const size_t k = std::min(n, head_.size());
      std::memcpy(buf, head_.data(), k);
      head_.erase(0, k);
      return k;
    }
    return file_.read(buf, n, path_);
  }
  const char* compression() const override { return "plain"; }

 private:
  std::string path_;
  File file_;
  std::string head_;
};

// gzip, as many members as the file holds (gzip -c a b > ab, pigz, bgzip).
class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(std::string path) : path_(std::move(path)), file_(path_), in_(kChunk) {
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) fail("zlib: inflateInit2 failed");
  }
  ~GzipSource() override { inflateEnd(&z_); }
  size_t read(char* buf, size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(buf);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out == n) {
      if (z_.avail_in == 0) {
        z_.next_in = in_.data();
        z_.avail_in = static_cast<uInt>(file_.read(in_.data(), in_.size(), path_));
        if (z_.avail_in == 0) {
          if (mid_member_) fail_usage("--input ", path_, ": the gzip stream is truncated");
          return 0;
        }
      }
      const int rc = inflate(&z_, Z_NO_FLUSH);
      mid_member_ = true;
      if (rc == Z_STREAM_END) {
        mid_member_ = false;
        inflateReset(&z_);  // another member may follow
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail_usage("--input ", path_, ": corrupt gzip data (", z_.msg ? z_.msg : "zlib error", ")");
      }
    }
    return n - z_.avail_out;
  }
  const char* compression() const override { return "gzip"; }

 private:
  std::string path_;
  File file_;
  std::vector<Bytef> in_;
  z_stream z_{};
  bool mid_member_ = false;
};

class ZstdSource final : public ByteSource {
 public:
  explicit ZstdSource(std::string path) : path_(std::move(path)), file_(path_), in_(ZSTD_DStreamInSize()) {
    if (!ctx_) fail("zstd: cannot create a decompression context");
  }
  ~ZstdSource() override { ZSTD_freeDCtx(ctx_); }
  size_t read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    for (;;) {
      if (src_.pos < src_.size || pending_) {  // input to use, or output held back
        const size_t rc = ZSTD_decompressStream(ctx_, &out, &src_);
        if (ZSTD_isError(rc)) fail_usage("--input ", path_, ": corrupt zstd data (", ZSTD_getErrorName(rc), ")");
        pending_ = rc != 0;  // 0: a frame ended here and all of it was handed out
        if (out.pos > 0) return out.pos;
        if (src_.pos < src_.size) continue;
      }
      src_ = {in_.data(), file_.read(in_.data(), in_.size(), path_), 0};
      if (src_.size == 0) {
        if (pending_) fail_usage("--input ", path_, ": the zstd stream is truncated");
        return 0;
      }
    }
  }
  const char* compression() const override { return "zstd"; }

 private:
  std::string path_;
  File file_;
  std::vector<char> in_;
  ZSTD_inBuffer src_{nullptr, 0, 0};
  ZSTD_DCtx* ctx_ = ZSTD_createDCtx();
  bool pending_ = false;
};

// "a.jsonl.gz" -> "a.jsonl"
std::string without_compression_suffix(const std::string& name) {
  for (const char* ext : {".gz", ".zst", ".zstd"}) {
    const size_t n = std::strlen(ext);
    if (name.size() > n && name.compare(name.size() - n, n, ext) == 0) return name.substr(0, name.size() - n);
  }
  return name;
}

bool ends_with(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

bool is_jsonl(const std::string& path, InputFormat format) {
  if (format != InputFormat::kAuto) return format == InputFormat::kJsonl;
  const std::string name = without_compression_suffix(path);
  return ends_with(name, ".jsonl") || ends_with(name, ".ndjson") || ends_with(name, ".json");
}

}  // namespace

std::optional<InputFormat> parse_input_format(const std::string& text) {
  if (text == "auto") return InputFormat::kAuto;
  if (text == "text") return InputFormat::kText;
  if (text == "jsonl") return InputFormat::kJsonl;
  return std::nullopt;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& args) {
  std::vector<std::string> files;
  for (const std::string& arg : args) {
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(arg, fs::directory_options::follow_directory_symlink, ec))
        if (e.is_regular_file()) found.push_back(e.path().string());
      if (ec) fail_usage("--input ", arg, ": cannot list the folder: ", ec.message());
      if (found.empty()) fail_usage("--input ", arg, ": the folder holds no files");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(arg, ec)) {
      files.push_back(arg);
    } else {
      glob_t g{};
      const int rc = ::glob(arg.c_str(), 0, nullptr, &g);  // glob sorts its matches
      std::vector<std::string> found;
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i)
        if (fs::is_regular_file(g.gl_pathv[i], ec)) found.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      if (found.empty())
        fail_usage("--input ", arg, ": no such file, folder, or files matching it; expected text or JSON Lines files");
      files.insert(files.end(), found.begin(), found.end());
    }
  }
  return files;
}

std::unique_ptr<ByteSource> open_bytes(const std::string& path) {
  std::string head(4, '\0');
  {
    File f(path);
    head.resize(f.read(head.data(), head.size(), path));
  }
  const auto* m = reinterpret_cast<const unsigned char*>(head.data());
  if (head.size() >= 2 && m[0] == 0x1f && m[1] == 0x8b) return std::make_unique<GzipSource>(path);
  if (head.size() >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd)
    return std::make_unique<ZstdSource>(path);
  return std::make_unique<PlainSource>(path, head);
}

DocumentReader::DocumentReader(std::vector<std::string> files, InputOptions options)
    : files_(std::move(files)), options_(std::move(options)) {}

DocumentReader::~DocumentReader() = default;

bool DocumentReader::open_next_file() {
  if (next_file_ >= files_.size()) return false;
  path_ = files_[next_file_++];
  jsonl_ = is_jsonl(path_, options_.format);
  source_ = open_bytes(path_);
  buffer_.clear();
  pos_ = 0;
  eof_ = false;
  line_ = 0;
  return true;
}

bool DocumentReader::read_line(std::string* line) {
  for (;;) {
    const size_t nl = buffer_.find('\n', pos_);
    if (nl != std::string::npos || (eof_ && pos_ < buffer_.size())) {
      const size_t end = nl == std::string::npos ? buffer_.size() : nl;
      line->assign(buffer_, pos_, end - pos_);
      pos_ = end + (nl != std::string::npos);
      ++line_;
      return true;
    }
    if (eof_) return false;
    buffer_.erase(0, pos_);
    pos_ = 0;
    const size_t have = buffer_.size();
    buffer_.resize(have + kChunk);
    const size_t got = source_->read(buffer_.data() + have, kChunk);
    buffer_.resize(have + got);
    bytes_in_ += static_cast<int64_t>(got);
    eof_ = got == 0;
  }
}

void DocumentReader::bad(const std::string& what) {
  if (!options_.skip_bad_records)
    fail_usage("--input ", path_, ":", line_, ": ", what, " (--skip-bad-records skips such lines)");
  ++skipped_;
}

bool DocumentReader::next_jsonl(std::string* text) {
  std::string line;
  while (read_line(&line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      const std::string why = e.what();
      bad(cat("not a JSON value (", why.substr(why.find(' ') + 1), ")"));
      continue;
    }
    const auto field = j.is_object() ? j.find(options_.text_field) : j.end();
    if (!j.is_object()) {
      bad(cat("expected a JSON object, got ", j.type_name()));
    } else if (field == j.end()) {
      bad(cat("no \"", options_.text_field, "\" field (--text-field names the field that holds the text)"));
    } else if (!field->is_string()) {
      bad(cat("\"", options_.text_field, "\" is ", field->type_name(), ", expected a string"));
    } else if (const std::string why = not_text(field->get_ref<const std::string&>(), "binary data"); !why.empty()) {
      bad(cat("\"", options_.text_field, "\": ", why));
    } else if (!field->get_ref<const std::string&>().empty()) {
      *text = field->get<std::string>();
      return true;
    }
  }
  return false;
}

bool DocumentReader::next(std::string* text) {
  for (;;) {
    if (!source_ && !open_next_file()) return false;
    if (jsonl_) {
      if (next_jsonl(text)) return true;
      source_.reset();
      continue;
    }
    // Plain text: the whole file is one document.
    text->clear();
    std::vector<char> chunk(kChunk);
    for (size_t got; (got = source_->read(chunk.data(), chunk.size())) > 0;) text->append(chunk.data(), got);
    bytes_in_ += static_cast<int64_t>(text->size());
    source_.reset();
    if (text->empty()) fail_usage("--input ", path_, ": the file is empty; expected UTF-8 text");
    if (const std::string why = not_text(*text, "a binary file"); !why.empty()) fail_usage("--input ", path_, ": ", why);
    return true;
  }
}

}  // namespace amsp::data
