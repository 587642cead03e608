// amsp gpu-info: the preflight of a GPU node (gpu/preflight.h). One line each
// for the driver, the CUDA runtime, cuBLAS, cuDNN, NCCL and every visible GPU,
// each library with the file it was loaded from; a driver too old for the
// runtime is refused in one line with exit 1 before any GPU is touched.

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "gpu/preflight.h"

namespace amsp::cli {
namespace {

void write_json(const std::string& path, const gpu::Preflight& p) {
  std::ofstream f(path);
  f << gpu::preflight_json(p).dump(2) << "\n";
  if (!f) fail_usage("--json ", path, ": cannot write the file");
}

}  // namespace

int run_gpu_info(int argc, char** argv) {
  int cuda_device = -1;
  std::string json_path;
  po::options_description desc("Options");
  desc.add_options()
      ("cuda-device", po::value<int>(&cuda_device)->default_value(-1)->value_name("INT"),
           "report only this GPU (-1: every visible one)")
      ("json", po::value<std::string>(&json_path)->value_name("FILE"),
           "also write the same facts as one JSON object to FILE");
  po::variables_map vm;
  if (!parse_command("gpu-info",
                     "Reports the NVIDIA driver, the CUDA runtime, cuBLAS, cuDNN and NCCL this "
                     "build loads (version and file of each) and every visible GPU; exits 1 if "
                     "the driver is too old for the runtime or no GPU is visible (doc/cli.md).",
                     desc, argc, argv, vm))
    return 0;
  require(cuda_device >= -1, "cuda-device", cuda_device, "an integer >= -1");
  gpu::Preflight p = gpu::inspect_libraries();
  const std::string refusal = gpu::driver_refusal(p);
  if (refusal.empty()) gpu::inspect_gpus(p, cuda_device);
  if (!json_path.empty()) write_json(json_path, p);
  if (!refusal.empty()) fail(refusal);
  gpu::print_preflight(p, std::cout);
  return p.gpus.empty() ? kExitFailure : kExitOk;
}

}  // namespace amsp::cli
