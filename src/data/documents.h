// The documents `amsp data prepare` reads, one at a time, as the field ships
// them: plain text files (each one document) or JSON Lines (one document per
// line, the string under a field such as "text"), either of them compressed
// with gzip or zstd, recognised by their magic bytes rather than their names;
// given as files, globs or folders.
//
// One document and one decompression buffer are held at a time, whatever the
// size of the corpus. Bad input is refused in one line naming the file, the
// line and what is wrong (UsageError), unless skip_bad_records counts and
// skips it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace amsp::data {

// auto: JSON Lines when the file name, less a .gz, .zst or .zstd suffix, ends in
// .jsonl, .ndjson or .json; plain text otherwise.
enum class InputFormat { kAuto, kText, kJsonl };
std::optional<InputFormat> parse_input_format(const std::string& text);  // "auto", "text", "jsonl"

struct InputOptions {
  InputFormat format = InputFormat::kAuto;
  std::string text_field = "text";  // JSON Lines: the field that holds the document
  bool skip_bad_records = false;    // count and skip bad JSON lines instead of refusing them
};

// The files the --input arguments name, in order: a file itself, a folder's
// regular files (recursively, sorted by path), a glob's matches (sorted).
// UsageError for an argument that names nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& args);

// A file's bytes, decompressed if it is gzip (1f 8b) or zstd (28 b5 2f fd).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to n bytes into buf; 0 at the end. UsageError on a corrupt or truncated stream.
  virtual size_t read(char* buf, size_t n) = 0;
  // "gzip", "zstd" or "plain".
  virtual const char* compression() const = 0;
};
std::unique_ptr<ByteSource> open_bytes(const std::string& path);

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, InputOptions options);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document into *text (UTF-8, not empty); false after the last.
  bool next(std::string* text);

  int64_t skipped() const { return skipped_; }    // bad records skipped
  int64_t bytes_in() const { return bytes_in_; }  // decompressed bytes read

 private:
  bool open_next_file();
  bool read_line(std::string* line);  // false at the file's end
  bool next_jsonl(std::string* text);
  void bad(const std::string& what);  // refuses, or counts with skip_bad_records

  std::vector<std::string> files_;
  InputOptions options_;
  size_t next_file_ = 0;
  std::string path_;  // the file being read
  bool jsonl_ = false;
  std::unique_ptr<ByteSource> source_;
  std::string buffer_;  // read, not yet consumed
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t line_ = 0;
  int64_t skipped_ = 0;
  int64_t bytes_in_ = 0;
};

}  // namespace amsp::data
