// amsp data prepare: text and JSON Lines files -> HDF5 token dataset.

#include <iomanip>
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "data/dataset.h"

namespace amsp::cli {

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
      ("tokenizer", po::value<std::string>(&opt.tokenizer)->default_value("byte")
           ->value_name("byte|FILE.model|FILE.json"),
           "built-in byte-level tokenizer, a SentencePiece model (e.g. LLaMA-2's tokenizer.model) or a "
           "Hugging Face tokenizer.json with a BPE model (e.g. LLaMA-3's, Mistral's, Qwen2's)")
      ("valid-fraction", po::value<double>(&opt.valid_fraction)->default_value(0.05)->value_name("NUM"),
           "share of tokens held out for validation, in [0, 0.5]")
      ("threads", po::value<int>(&opt.threads)->default_value(0)->value_name("N"),
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

  const data::PrepareReport r = data::prepare_dataset(opt);
  std::cout << "wrote " << opt.output << ": " << r.documents << " documents, " << r.bytes_in
            << " bytes -> " << r.train_tokens << " train + " << r.valid_tokens
            << " validation tokens (tokenizer " << opt.tokenizer << ", vocabulary " << r.vocab_size
            << ")";
  if (r.skipped) std::cout << "; skipped " << r.skipped << " bad records";
  std::cout << "\n";
  return 0;
}

}  // namespace amsp::cli
