// Dense bf16 tensor-core peaks (no sparsity) of the GPUs amsp is likely to
// meet, from the vendors' data sheets, for MFU. V100 has no bf16: its fp16
// peak stands in. First match wins, so more specific names come first.
#include <string>
#include <utility>

#include "backend/cuda_backend.h"

namespace amsp::backend {

double gpu_peak_flops(const std::string& name) {
  static const std::pair<const char*, double> kPeaks[] = {
      {"GB200", 2500e12}, {"B200", 2250e12},    {"B100", 1750e12},  {"GH200", 989e12},
      {"H200", 989e12},   {"H100 PCIe", 756e12}, {"H100 NVL", 835e12}, {"H100", 989e12},
      {"H800", 989e12},   {"A100", 312e12},     {"A800", 312e12},   {"L40S", 362e12},
      {"L40", 181e12},    {"A40", 150e12},      {"A30", 165e12},    {"A10G", 70e12},
      {"A10", 125e12},    {"L4", 121e12},       {"V100", 125e12},   {"RTX 4090", 165e12},
      {"RTX 6000 Ada", 364e12}, {"RTX A6000", 155e12}, {"RTX 3090", 71e12},
  };
  for (const auto& [key, peak] : kPeaks)
    if (name.find(key) != std::string::npos) return peak;
  return 0;
}

}  // namespace amsp::backend
