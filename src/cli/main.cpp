// amsp: a LLaMA trainer with AMSP-style sharding for Slurm clusters.
// This file only dispatches git-style subcommands; each lives in its own file.

#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"

namespace {

struct Command {
  const char* words;  // e.g. "data prepare"
  const char* summary;
  int (*run)(int, char**);
};

const Command kCommands[] = {
    {"train", "train a LLaMA model", amsp::cli::run_train},
    {"eval", "loss of a checkpoint on a token dataset", amsp::cli::run_eval},
    {"data prepare", "tokenize text files into an HDF5 token dataset", amsp::cli::run_data_prepare},
    {"plan", "choose how to shard model states for a model, cluster and batch", amsp::cli::run_plan},
    {"comm-bench", "measure the collectives (nccl-tests style) and write a bandwidth table", amsp::cli::run_comm_bench},
    {"backend-check", "check a device backend's kernels against the CPU backend", amsp::cli::run_backend_check},
    {"gpu-info", "the driver, CUDA, cuBLAS, cuDNN and NCCL this build loads, and the GPUs", amsp::cli::run_gpu_info},
    {"ckpt inspect", "show a checkpoint's metadata and datasets", amsp::cli::run_ckpt_inspect},
    {"ckpt verify", "recompute a checkpoint's checksums (exit 1 naming a damaged dataset)", amsp::cli::run_ckpt_verify},
    {"export", "write a checkpoint as a Hugging Face model directory (safetensors)", amsp::cli::run_export},
};

void print_usage(std::ostream& os) {
  os << "usage: amsp <command> [options]\n\ncommands:\n";
  for (const auto& c : kCommands) {
    std::string w = c.words;
    w.resize(16, ' ');
    os << "  " << w << c.summary << "\n";
  }
  os << "\n'amsp <command> --help' lists a command's options. Docs: doc/ in the source tree.\n";
}

// Whether the leading words of argv (after argv[0]) match the command's words.
bool matches(const Command& c, int argc, char** argv, int* consumed) {
  int i = 1;
  const char* p = c.words;
  while (*p) {
    const char* space = std::strchr(p, ' ');
    const size_t n = space ? static_cast<size_t>(space - p) : std::strlen(p);
    if (i >= argc || std::strlen(argv[i]) != n || std::strncmp(argv[i], p, n) != 0) return false;
    ++i;
    p += n;
    if (*p == ' ') ++p;
  }
  *consumed = i;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_usage(std::cout);
    return argc < 2 ? amsp::kExitUsage : amsp::kExitOk;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::cout << "amsp " << AMSP_VERSION << "\n";
    return 0;
  }
  try {
    for (const auto& c : kCommands) {
      int consumed = 0;
      if (!matches(c, argc, argv, &consumed)) continue;
      // Hand the subcommand an argv whose [0] is its name, as parsers expect.
      return c.run(argc - consumed + 1, argv + consumed - 1);
    }
    std::string words = argv[1];
    if (argc > 2 && argv[2][0] != '-') words += std::string(" ") + argv[2];
    std::string known;
    for (const auto& c : kCommands) known += std::string(known.empty() ? "" : ", ") + c.words;
    amsp::fail_usage("unknown command '", words, "'; expected one of: ", known, " (see amsp --help)");
  } catch (const amsp::Error& e) {
    // An empty message: another rank reports this error.
    if (*e.what()) std::cerr << "amsp: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "amsp: error: " << e.what() << "\n";
    return amsp::kExitFailure;
  }
}
