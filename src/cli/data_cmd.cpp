// amsp data prepare: text and JSON Lines files -> HDF5 token dataset.

#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <thread>

#include "cli/commands.h"
#include "cli/options.h"
#include "comm/agree.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/documents.h"
#include "data/parallel_encode.h"
#include "data/prepare.h"

namespace amsp::cli {
namespace {

// Every core this rank may use; when the ranks on a node are not bound to
// cores of their own (mpiexec binds none by default), a share of the node's.
int threads_per_rank() {
  MPI_Comm node;
  int local = 1;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  const int cores = data::available_cores();
  const bool unbound = cores == static_cast<int>(std::thread::hardware_concurrency());
  return unbound ? std::max(1, cores / local) : cores;
}

// Under mpiexec or srun, each rank tokenizes a share of the files (consecutive
// files, about equal bytes) into a part file beside the output, and rank 0
// writes the dataset from the parts in rank order: the same file as one
// process writes. The output's directory must be visible to every rank.
data::PrepareReport prepare_on_ranks(const data::PrepareOptions& opt) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return data::prepare_dataset(opt);
  data::PrepareOptions mine_options = opt;  // the threads this rank tokenizes with
  if (mine_options.threads == 0) mine_options.threads = threads_per_rank();

  std::unique_ptr<data::Tokenizer> tokenizer;
  std::vector<std::string> files;
  comm::collectively(MPI_COMM_WORLD, [&] {
    data::check_prepare_options(opt);
    tokenizer = data::make_tokenizer(opt.tokenizer);
    files = data::expand_inputs(opt.inputs);
  });
  auto part_path = [&](int r) { return cat(opt.output, ".tmp.part", r); };
  struct RemoveParts {  // every rank removes its own part, whatever happens
    std::string path;
    ~RemoveParts() { std::remove(path.c_str()); }
  } remove_mine{part_path(rank)};

  data::TokenizeCounts mine;
  comm::collectively(MPI_COMM_WORLD, [&] {
    const auto [first, last] = data::file_share(files, rank, size);
    const std::vector<std::string> share(files.begin() + first, files.begin() + last);
    std::ofstream part(part_path(rank), std::ios::binary | std::ios::trunc);
    if (!part) fail_usage("--output ", opt.output, ": cannot create ", part_path(rank), " (not writable?)");
    if (!share.empty())
      mine = data::tokenize_files(share, mine_options, *tokenizer, [&](const int32_t* ids, size_t n) {
        part.write(reinterpret_cast<const char*>(ids), static_cast<std::streamsize>(n * sizeof(int32_t)));
      });
    part.close();
    if (!part) fail("--output ", opt.output, ": cannot write ", part_path(rank), " (disk full?)");
  });
  data::TokenizeCounts total;
  int64_t counts[3] = {mine.documents, mine.bytes_in, mine.skipped};
  MPI_Allreduce(MPI_IN_PLACE, counts, 3, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  total.documents = counts[0], total.bytes_in = counts[1], total.skipped = counts[2];

  data::PrepareReport report;
  comm::collectively(MPI_COMM_WORLD, [&] {
    if (rank != 0) return;
    data::DatasetWriter writer(opt, *tokenizer);
    std::vector<int32_t> buffer(1 <<20);
    for (int r = 0; r < size; ++r) {
      std::ifstream part(part_path(r), std::ios::binary);
      if (!part) fail("--output ", opt.output, ": cannot read ", part_path(r), " (is the directory shared by all ranks?)");
      while (part.read(reinterpret_cast<char*>(buffer.data()), static_cast<std::streamsize>(buffer.size() * 4)) ||
             part.gcount() > 0)
        writer.push(buffer.data(), static_cast<size_t>(part.gcount()) / sizeof(int32_t));
    }
    report = writer.finish(files, total);
  });
  return report;
}


void print_report(const data::PrepareOptions& opt, const data::PrepareReport& r) {
  std::cout << "wrote " << opt.output << ": " << r.documents << " documents, " << r.bytes_in
            << " bytes -> " << r.train_tokens << " train + " << r.valid_tokens
            << " validation tokens (tokenizer " << opt.tokenizer << ", vocabulary " << r.vocab_size
            << ")";
  if (r.skipped) std::cout << "; skipped " << r.skipped << " bad records";
  std::cout << "\n";
}

}  // namespace

int run_data_prepare(int argc, char** argv) {
  data::PrepareOptions opt;
  std::string format;
  po::options_description desc("Options");
  desc.add_options()
      ("input", po::value<std::vector<std::string>>(&opt.inputs)->multitoken()->composing()->required()
           ->value_name("PATH..."),
           "files, folders (every file under them) or quoted globs: plain text (each file one document) "
           "or JSON Lines (one document per line), either of them gzip- or zstd-compressed")
      ("input-format", po::value<std::string>(&format)->default_value("auto")->value_name("auto|text|jsonl"),
           "auto: JSON Lines for names ending in .jsonl, .ndjson or .json (before .gz/.zst), text otherwise")
      ("text-field", po::value<std::string>(&opt.input.text_field)->default_value("text")->value_name("NAME"),
           "JSON Lines: the field that holds a document's text")
      ("skip-bad-records", po::bool_switch(&opt.input.skip_bad_records),
           "JSON Lines: skip and count lines that are not an object with a string text field, "
           "instead of refusing the input")
      ("output", po::value<std::string>(&opt.output)->required()->value_name("FILE.h5"),
           "the dataset to write")
      ("tokenizer", po::value<std::string>(&opt.tokenizer)->default_value(opt.tokenizer)
           ->value_name("byte|FILE.model|FILE.json"),
           "built-in byte-level tokenizer, a SentencePiece model (e.g. LLaMA-2's tokenizer.model) or a "
           "Hugging Face tokenizer.json with a BPE model (e.g. LLaMA-3's, Mistral's, Qwen2's)")
      ("valid-fraction", number(&opt.valid_fraction, opt.valid_fraction)->value_name("NUM"),
           "share of tokens held out for validation, in [0, 0.5]")
      ("threads", po::value<int>(&opt.threads)->default_value(opt.threads)->value_name("N"),
           "tokenizer threads; 0: every core this process may run on (the dataset is the same for any N)");
  po::variables_map vm;
  if (!parse_command("data prepare", "Tokenizes text files into an HDF5 token dataset.", desc,
                     argc, argv, vm))
    return 0;
  require(opt.valid_fraction >= 0 && opt.valid_fraction <= 0.5, "valid-fraction",
          opt.valid_fraction, "a number in [0, 0.5]");
  const auto parsed = data::parse_input_format(format);
  if (!parsed) fail_usage("--input-format ", format, ": expected auto, text or jsonl");
  opt.input.format = *parsed;
  require(opt.threads >= 0, "threads", opt.threads, "a count >= 0 (0: every core)");
  if (opt.input.text_field.empty()) fail_usage("--text-field: expected the name of a JSON field");

  return run_under_mpi(&argc, &argv, [&] {
    const data::PrepareReport r = prepare_on_ranks(opt);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) print_report(opt, r);
    return 0;
  });
}

}  // namespace amsp::cli
