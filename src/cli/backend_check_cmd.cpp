// amsp backend-check: every kernel of a device backend against the CPU backend
// (backend/compare.h). On a GPU node it checks the CUDA kernels on the device
// (validation/gpu/check.sh runs it); in the test suite, on the CPU emulation.

#include <iostream>

#include "backend/compare.h"
#include "backend/factory.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"

namespace amsp::cli {

int run_backend_check(int argc, char** argv) {
  std::string device_text = "cuda", precision = "fp32", shapes_text = "small";
  int cuda_device = 0;
  po::options_description desc("Options");
  desc.add_options()
      ("device", po::value<std::string>(&device_text)->default_value(device_text)->value_name("cuda|cpu"),
           "the backend to check against the CPU backend")
      ("precision", po::value<std::string>(&precision)->default_value(precision)->value_name("fp32|bf16"),
           "the compute dtype of both backends (bf16: bf16 matrix products)")
      ("shapes", po::value<std::string>(&shapes_text)->default_value(shapes_text)->value_name("small|layer|layer-mini"),
           "small: awkward small shapes; layer: those, then every kernel at the sizes of a 1B and a "
           "7B LLaMA layer (tens of seconds of CPU on a 16-core node); layer-mini: the layer cases "
           "with every size divided by 16")
      ("cuda-device", po::value<int>(&cuda_device)->default_value(0)->value_name("INT"),
           "which GPU");
  po::variables_map vm;
  if (!parse_command("backend-check",
                     "Runs every kernel of a training step on a backend and on the CPU backend, "
                     "from the same inputs, and compares each output within a tolerance derived "
                     "for it (doc/gpu.md, \"Kernel checks\").",
                     desc, argc, argv, vm))
    return 0;
  const auto device = backend::parse_device(device_text);
  require(device.has_value(), "device", device_text, "cuda or cpu");
  const auto compute = parse_dtype(precision);
  require(compute == DType::kF32 || compute == DType::kBF16, "precision", precision, "fp32 or bf16");
  const auto shapes = backend::parse_shapes(shapes_text);
  require(shapes.has_value(), "shapes", shapes_text, "small, layer or layer-mini");
  require(cuda_device >= 0, "cuda-device", cuda_device, "an integer >= 0");
  backend::check_device_usable(*device);
  const auto reference = backend::make_cpu_backend(*compute);
  const auto other = backend::make_backend(*device, *compute, cuda_device);
  std::cout << "backend-check: " << other->describe() << " against " << reference->describe()
            << ", " << precision << " compute, " << shapes_text << " shapes\n";
  const backend::CompareReport report = backend::compare_backends(*reference, *other, *shapes);
  backend::print_report(report, std::cout);
  return report.ok() ? 0 : 1;
}

}  // namespace amsp::cli
