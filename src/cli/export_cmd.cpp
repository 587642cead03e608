// amsp export --checkpoint FILE --format hf --output DIR: a checkpoint as a
// Hugging Face model directory that transformers' from_pretrained loads and
// `amsp train --init-from` reads back. No MPI: one process reads the sharded
// checkpoint whatever plan and rank count wrote it (engine/hf_export.h).

#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "engine/hf_export.h"
#include "plan/memory.h"

namespace amsp::cli {

int run_export(int argc, char** argv) {
  engine::ExportOptions o;
  std::string format, dtype, max_shard;
  po::options_description desc("Options");
  desc.add_options()
      ("checkpoint", po::value<std::string>(&o.checkpoint)->required()->value_name("FILE"),
           "a checkpoint written by amsp train --checkpoint-dir (any plan, any number of ranks)")
      ("format", po::value<std::string>(&format)->required()->value_name("hf"),
           "hf: a Hugging Face model directory (config.json, safetensors, tokenizer when known)")
      ("output", po::value<std::string>(&o.output)->required()->value_name("DIR"),
           "the directory to write; must not exist or be empty, unless --force")
      ("dtype", po::value<std::string>(&dtype)->default_value("fp32")->value_name("fp32|bf16"),
           "weights' dtype in the files; bf16 rounds to nearest even")
      ("max-shard-size", po::value<std::string>(&max_shard)->default_value("5GB")->value_name("SIZE"),
           "largest safetensors file (as transformers' save_pretrained: 5GB = 5*10^9 bytes); above it, "
           "shards model-0000K-of-0000N.safetensors and model.safetensors.index.json")
      ("force", po::bool_switch(&o.force), "replace an output directory that is not empty");
  po::variables_map vm;
  if (!parse_command("export", "Writes a checkpoint as a Hugging Face model directory.", desc, argc, argv, vm))
    return 0;
  require(format == "hf", "format", format, "hf (a Hugging Face model directory)");
  require(dtype == "fp32" || dtype == "bf16", "dtype", dtype, "fp32 or bf16");
  o.dtype = dtype == "bf16" ? hf::StoredType::kBF16 : hf::StoredType::kF32;
  o.max_shard_bytes = plan::parse_memory_size(max_shard, "max-shard-size");

  const engine::ExportReport r = engine::export_hf(o);
  if (!r.tokenizer_written) std::cerr << "amsp export: no tokenizer written: " << r.tokenizer << "\n";
  if (!r.tokenizer_warning.empty()) std::cerr << "amsp export: warning: " << r.tokenizer_warning << "\n";
  std::printf("exported %s (step %lld) to %s: %.2f MiB of %s weights in", o.checkpoint.c_str(),
              static_cast<long long>(r.step), o.output.c_str(), static_cast<double>(r.weight_bytes) / 1048576.0,
              dtype.c_str());
  for (const auto& f : r.files) std::printf(" %s", f.c_str());
  std::printf("\n");
  return kExitOk;
}

}  // namespace amsp::cli
