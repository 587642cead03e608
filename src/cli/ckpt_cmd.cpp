// amsp ckpt inspect FILE / amsp ckpt verify FILE: no MPI. The file is first
// read by a child process with a deadline (ckpt::check_in_child), so that a
// damaged file makes these commands fail with one line, never crash or hang;
// `verify --in-process` is that child.

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"

namespace amsp::cli {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string pad(std::string s, size_t width, bool right = false) {
  if (s.size() >= width) return s + " ";
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

// JSON on one line (as stored it is pretty-printed); the text itself if not JSON.
std::string compact(const std::string& text) {
  if (text.empty()) return "(none)";
  try {
    return nlohmann::json::parse(text).dump();
  } catch (const std::exception&) {
    return text;
  }
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct FileArgs {
  std::string file;
  bool in_process = false;      // verify: this is the checking child
  bool structure_only = false;  // verify --in-process: no data checksums
};

// Parses `amsp ckpt <verb> FILE`; false if --help was printed.
bool parse_file(const char* verb, const char* summary, int argc, char** argv, FileArgs* args) {
  std::string* file = &args->file;
  po::options_description desc("Options");
  desc.add_options()("file", po::value<std::string>(file)->value_name("FILE"), "checkpoint file (.h5)");
  if (std::string(verb) == "verify")
    desc.add_options()("in-process", po::bool_switch(&args->in_process),
                       "check in this process, not in a child (what the child runs)")(
        "structure-only", po::bool_switch(&args->structure_only),
        "with --in-process: the manifest and structure, no data checksums");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_command(std::string("ckpt ") + verb, summary, desc, argc, argv, vm, &pos)) return false;
  if (file->empty()) fail_usage("ckpt ", verb, ": expected the path of a checkpoint file");
  if (!std::filesystem::exists(*file)) fail_usage("checkpoint ", *file, ": no such file");
  return true;
}

}  // namespace

int run_ckpt_inspect(int argc, char** argv) {
  FileArgs args;
  if (!parse_file("inspect", "Shows a checkpoint's metadata and datasets (shapes, dtypes, sizes).", argc,
                  argv, &args))
    return 0;
  const std::string& file = args.file;
  if (const std::string problem = ckpt::check_in_child(file, /*data=*/false); !problem.empty())
    fail("checkpoint ", file, ": ", problem);
  const ckpt::Metadata m = ckpt::read_metadata(file);
  const auto datasets = ckpt::inspect(file, false);
  int64_t total = 0;
  for (const auto& d : datasets) total += d.bytes;
  std::cout << "checkpoint      " << file << "\n"
            << "format version  " << m.format_version << "\n"
            << "step            " << m.step << "\n"
            << "tokens          " << m.tokens << "\n"
            << "seed            " << m.seed << "\n"
            << "plan            " << m.plan << "\n"
            << "world size      " << m.world_size << "\n"
            << "topology        " << m.topology << "\n"
            << "model           " << compact(m.model_json) << "\n"
            << "options         " << compact(m.options_json) << "\n"
            << "datasets        " << datasets.size() << ", " << mib(total) << " MiB\n\n";
  std::cout << pad("dataset", 52) << pad("shape", 16) << pad("dtype", 9) << pad("MiB", 10, true)
            << "  checksum\n";
  for (const auto& d : datasets)
    std::cout << pad(d.name, 52) << pad(shape_text(d.shape), 16) << pad(d.dtype, 9)
              << pad(mib(d.bytes), 10, true) << "  " << hex(d.stored_checksum) << "\n";
  return kExitOk;
}

int run_ckpt_verify(int argc, char** argv) {
  FileArgs args;
  if (!parse_file("verify",
                  "Checks a checkpoint: its manifest, its completeness against its own model config, "
                  "and every dataset's checksum; exit 1 naming the first problem.",
                  argc, argv, &args))
    return 0;
  const std::string& file = args.file;
  if (!args.in_process) {
    if (const std::string problem = ckpt::check_in_child(file, /*data=*/true); !problem.empty())
      fail("checkpoint ", file, ": ", problem);
    // Passed in the child: safe to read here.
    const ckpt::Metadata m = ckpt::read_metadata(file);
    std::cout << file << ": ok, " << ckpt::inspect(file, false).size() << " datasets verified (step " << m.step
              << "; manifest, completeness against its model, checksums)\n";
    return kExitOk;
  }
  if (args.structure_only) {
    (void)ckpt::check_structure(file);
    return kExitOk;
  }
  for (const auto& d : ckpt::inspect(file, true))
    if (d.stored_checksum != d.computed_checksum)
      fail("checkpoint ", file, ": dataset ", d.name, " fails its checksum (stored ", hex(d.stored_checksum),
           ", computed ", hex(d.computed_checksum), ")");
  return kExitOk;
}

}  // namespace amsp::cli
