#include "data/documents.h"

#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <fstream>

#include "core/error.h"
#include "data/dataset.h"
#include "data/test_support.h"

namespace amsp::data {
namespace {

using testing::TempDir;

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// gzip as the gzip tool writes it; `members` > 1 concatenates that many members
// (as `cat a.gz b.gz` or pigz do), splitting the text between them.
void write_gzip(const std::string& path, const std::string& text, int members = 1) {
  std::string out;
  const size_t per = (text.size() + members - 1) / members;
  for (int m = 0; m < members; ++m) {
    const std::string part = text.substr(std::min(text.size(), m * per), per);
    z_stream z{};
    ASSERT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string buf(deflateBound(&z, part.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(part.data()));
    z.avail_in = static_cast<uInt>(part.size());
    z.next_out = reinterpret_cast<Bytef*>(buf.data());
    z.avail_out = static_cast<uInt>(buf.size());
    ASSERT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    buf.resize(z.total_out);
    deflateEnd(&z);
    out += buf;
  }
  write(path, out);
}

std::string zstd_bytes(const std::string& text) {
  std::string buf(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(buf.data(), buf.size(), text.data(), text.size(), 3);
  buf.resize(n);
  return buf;
}

std::vector<std::string> read_all(const std::vector<std::string>& files, InputOptions o = {}) {
  DocumentReader r(files, o);
  std::vector<std::string> docs;
  std::string d;
  while (r.next(&d)) docs.push_back(d);
  return docs;
}

// The one-line UsageError that reading the files raises ("" if none).
std::string refusal(const std::vector<std::string>& files, InputOptions o = {}) {
  try {
    read_all(files, o);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

const std::string kJsonl =
    "{\"text\": \"first document\", \"id\": 1}\n"
    "\n"
    "{\"id\": 2, \"text\": \"zweites Dokument: \\u00e4\\u00f6\\u00fc, \\u65e5\\u672c\\u8a9e\"}\r\n"
    "{\"text\": \"\"}\n"
    "{\"text\": \"last, without a newline\", \"body\": \"another field\"}";
const std::vector<std::string> kDocs = {"first document",
                                        "zweites Dokument: \xc3\xa4\xc3\xb6\xc3\xbc, \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
                                        "last, without a newline"};

TEST(Documents, JsonLinesGiveOneDocumentPerRecord) {
  TempDir dir;
  write(dir.file("a.jsonl"), kJsonl);
  EXPECT_EQ(read_all({dir.file("a.jsonl")}), kDocs);  // blank lines and empty texts are not documents
  InputOptions body;
  body.text_field = "body";
  EXPECT_NE(refusal({dir.file("a.jsonl")}, body).find(":1: no \"body\" field"), std::string::npos);
}

TEST(Documents, GzipAndZstdAreRecognisedByTheirBytes) {
  TempDir dir;
  write_gzip(dir.file("a.jsonl.gz"), kJsonl);
  write_gzip(dir.file("two-members.jsonl"), kJsonl, 2);  // no .gz in the name
  write(dir.file("a.jsonl.zst"), zstd_bytes(kJsonl));
  write(dir.file("two-frames.jsonl"), zstd_bytes(kJsonl.substr(0, 40)) + zstd_bytes(kJsonl.substr(40)));
  for (const char* name : {"a.jsonl.gz", "two-members.jsonl", "a.jsonl.zst", "two-frames.jsonl"})
    EXPECT_EQ(read_all({dir.file(name)}), kDocs) << name;
  EXPECT_STREQ(open_bytes(dir.file("two-members.jsonl"))->compression(), "gzip");
  EXPECT_STREQ(open_bytes(dir.file("a.jsonl.zst"))->compression(), "zstd");
}

TEST(Documents, LargeCompressedInputsStreamThroughWholeLines) {
  TempDir dir;
  std::string text;
  std::vector<std::string> docs;
  for (int i = 0; i < 30000; ++i) {  // several MB: many reads, lines across chunk ends
    docs.push_back("document " + std::to_string(i) + std::string(static_cast<size_t>(i % 300), 'x'));
    text += "{\"text\": \"" + docs.back() + "\"}\n";
  }
  write_gzip(dir.file("big.jsonl.gz"), text);
  write(dir.file("big.jsonl.zst"), zstd_bytes(text));
  EXPECT_EQ(read_all({dir.file("big.jsonl.gz")}), docs);
  EXPECT_EQ(read_all({dir.file("big.jsonl.zst")}), docs);
}

TEST(Documents, TruncatedOrCorruptStreamsAreRefused) {
  TempDir dir;
  std::string gz;
  write_gzip(dir.file("a.gz"), kJsonl);
  {
    std::ifstream f(dir.file("a.gz"), std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(f), {});
  }
  write(dir.file("cut.jsonl.gz"), gz.substr(0, gz.size() / 2));
  EXPECT_NE(refusal({dir.file("cut.jsonl.gz")}).find("the gzip stream is truncated"), std::string::npos);
  const std::string zs = zstd_bytes(kJsonl);
  write(dir.file("cut.jsonl.zst"), zs.substr(0, zs.size() - 5));
  EXPECT_NE(refusal({dir.file("cut.jsonl.zst")}).find("the zstd stream is truncated"), std::string::npos);
  std::string bad = gz;
  bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x5a);
  write(dir.file("bad.jsonl.gz"), bad);
  EXPECT_NE(refusal({dir.file("bad.jsonl.gz")}).find("bad.jsonl.gz"), std::string::npos);
}

TEST(Documents, BadRecordsAreNamedByFileAndLineOrSkipped) {
  TempDir dir;
  const std::string path = dir.file("dirty.jsonl");
  write(path,
        "{\"text\": \"good one\"}\n"
        "{\"text\": \"cut short\n"
        "[\"an\", \"array\"]\n"
        "{\"title\": \"no text\"}\n"
        "{\"text\": 42}\n"
        "{\"text\": \"NUL \\u0000 inside\"}\n"
        "{\"text\": \"good two\"}\n");
  EXPECT_NE(refusal({path}).find("dirty.jsonl:2: not a JSON value"), std::string::npos) << refusal({path});
  InputOptions skip;
  skip.skip_bad_records = true;
  DocumentReader r({path}, skip);
  std::vector<std::string> docs;
  std::string d;
  while (r.next(&d)) docs.push_back(d);
  EXPECT_EQ(docs, (std::vector<std::string>{"good one", "good two"}));
  EXPECT_EQ(r.skipped(), 5);
  const std::vector<std::pair<std::string, std::string>> each = {
      {"[1]\n", ":1: expected a JSON object, got array"},
      {"{\"title\": \"x\"}\n", ":1: no \"text\" field"},
      {"{\"text\": 42}\n", ":1: \"text\" is number, expected a string"},
      {"{\"text\": \"a\\u0000b\"}\n", ":1: \"text\": a NUL byte at offset 1"},
      {"{\"text\": \"ok\"}\n{\"text\": \"\\xff\"}\n", ":2: not a JSON value"},
  };
  for (const auto& [content, expected] : each) {
    write(path, content);
    EXPECT_NE(refusal({path}).find(expected), std::string::npos) << refusal({path});
  }
}

TEST(Documents, TextFilesAreOneDocumentEach) {
  TempDir dir;
  write(dir.file("a.txt"), "plain text\nover two lines\n");
  write(dir.file("b.txt.gz"), "");
  write_gzip(dir.file("b.txt.gz"), "compressed text");
  EXPECT_EQ(read_all({dir.file("a.txt"), dir.file("b.txt.gz")}),
            (std::vector<std::string>{"plain text\nover two lines\n", "compressed text"}));
  write(dir.file("latin1.txt"), "caf\xe9");
  EXPECT_NE(refusal({dir.file("latin1.txt")}).find("byte 0xE9 at offset 3 is not UTF-8"), std::string::npos);
  // --input-format overrides the name.
  write(dir.file("records.txt"), "{\"text\": \"as JSON\"}\n");
  InputOptions jsonl;
  jsonl.format = InputFormat::kJsonl;
  EXPECT_EQ(read_all({dir.file("records.txt")}, jsonl), (std::vector<std::string>{"as JSON"}));
}

TEST(Documents, InputsExpandFoldersAndGlobsInOrder) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "corpus" / "sub");
  write(dir.file("corpus/b.jsonl"), "");
  write(dir.file("corpus/a.jsonl"), "");
  write(dir.file("corpus/sub/c.jsonl"), "");
  write(dir.file("x.txt"), "x");
  EXPECT_EQ(expand_inputs({dir.file("corpus")}),
            (std::vector<std::string>{dir.file("corpus/a.jsonl"), dir.file("corpus/b.jsonl"),
                                      dir.file("corpus/sub/c.jsonl")}));
  EXPECT_EQ(expand_inputs({dir.file("x.txt"), dir.file("corpus/*.jsonl")}),
            (std::vector<std::string>{dir.file("x.txt"), dir.file("corpus/a.jsonl"), dir.file("corpus/b.jsonl")}));
  EXPECT_THROW(expand_inputs({dir.file("corpus/*.zst")}), UsageError);
  EXPECT_THROW(expand_inputs({dir.file("missing.txt")}), UsageError);
}

TEST(Documents, PrepareReadsJsonLinesAsItReadsTheSameTextFiles) {
  TempDir dir;
  write_gzip(dir.file("docs.jsonl.gz"), kJsonl);
  for (size_t i = 0; i < kDocs.size(); ++i) write(dir.file("doc" + std::to_string(i) + ".txt"), kDocs[i]);
  PrepareOptions from_jsonl, from_text;
  from_jsonl.inputs = {dir.file("docs.jsonl.gz")};
  from_jsonl.output = dir.file("jsonl.h5");
  from_text.inputs = {dir.file("doc*.txt")};
  from_text.output = dir.file("text.h5");
  from_jsonl.valid_fraction = from_text.valid_fraction = 0;
  const PrepareReport a = prepare_dataset(from_jsonl), b = prepare_dataset(from_text);
  EXPECT_EQ(a.documents, 3);
  EXPECT_EQ(b.documents, 3);
  EXPECT_EQ(TokenDataset(from_jsonl.output).tokens(Split::kTrain), TokenDataset(from_text.output).tokens(Split::kTrain));
  // Nothing but bad records: refused, and nothing written under the output name.
  write(dir.file("bad.jsonl"), "{\"title\": \"x\"}\n");
  PrepareOptions bad = from_jsonl;
  bad.inputs = {dir.file("bad.jsonl")};
  bad.output = dir.file("bad.h5");
  bad.input.skip_bad_records = true;
  EXPECT_THROW(prepare_dataset(bad), UsageError);
  EXPECT_FALSE(std::filesystem::exists(bad.output));
}

}  // namespace
}  // namespace amsp::data
