#include "backend/factory.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "gpu/check.h"

namespace amsp::backend {

void check_loss_acc(const double* acc, int64_t V) {
  if (acc[2] == 0.0) return;
  fail("cross_entropy_forward: target ", static_cast<int64_t>(acc[3]), " at row ",
       static_cast<int64_t>(acc[2]) - 1, " is outside the vocabulary of ", V);
}

std::optional<Device> parse_device(const std::string& text) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  return std::nullopt;
}

Device default_device() {
  if (AMSP_CUDA_EMULATION) return Device::kCpu;
  int count = 0;
  // No driver or no device is an answer here, not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return Device::kCpu;
  }
  return count > 0 ? Device::kCuda : Device::kCpu;
}

void check_device_usable(Device device) {
  if (device != Device::kCuda || !AMSP_CUDA_EMULATION) return;
  const char* flag = std::getenv("AMSP_CUDA_EMULATION");
  if (flag == nullptr || std::strcmp(flag, "1") != 0)
    fail_usage("--device cuda: this build has no CUDA; set AMSP_CUDA_EMULATION=1 to run the CUDA "
               "backend's code on the CPU emulation, for tests");
}

int cuda_device_for(int gpu_info_device, int local_rank) {
  if (gpu_info_device >= 0) return gpu_info_device;
  int count = 0;
  // No driver or no device is the user's to fix (another --device), not a crash.
  if (const cudaError_t rc = cudaGetDeviceCount(&count); rc != cudaSuccess)
    fail_usage("--device cuda: no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorString(rc), ")");
  if (count <= 0) fail_usage("--device cuda: no CUDA device is visible to this process");
  return local_rank % count;
}

std::unique_ptr<Backend> make_backend(Device device, DType compute, int cuda_device) {
  if (device == Device::kCpu) return make_cpu_backend(compute);
  check_device_usable(device);
  return make_cuda_backend(compute, cuda_device);
}

bool cuda_emulated() { return AMSP_CUDA_EMULATION; }

int64_t hb_checked() {
#if AMSP_CUDA_EMULATION
  return emu::hb_checked();
#else
  return -1;
#endif
}

}  // namespace amsp::backend
