// What `amsp gpu-info` reports before a job trusts a GPU node: the NVIDIA
// driver and the CUDA version it supports, the CUDA runtime, cuBLAS, cuDNN
// and NCCL with the version and the file of each that this process actually
// loaded, and every visible GPU; and the one check that stops a job before it
// starts, a driver older than the runtime needs.
//
// Works against kernels/cuda/api.h: the real libraries in a CUDA build, the CPU
// emulation otherwise, where every version is the emulation's own (Preflight::
// emulated says so, and so does every report). cuDNN is not linked by amsp:
// it is looked for with dlopen("libcudnn.so.9"), for the record.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace amsp::gpu {

// A CUDA version as cudaDriverGetVersion and cudaRuntimeGetVersion write it,
// 1000 * major + 10 * minor: 12040 -> "12.4".
std::string cuda_version_text(int version);

// One library as loaded: empty version when it was not found.
struct Library {
  std::string version;  // "13.1.0"
  int code = 0;         // the library's own version number (cuBLAS: 10000 major + 100 minor + patch)
  std::string path;     // the file the code was loaded from (symlinks resolved)
  bool in_executable = false;  // linked statically into this program
};

struct Gpu {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability: sm_<major><minor>
  uint64_t memory = 0;       // bytes
  int sms = 0;
};

struct Preflight {
  bool emulated = false;
  std::string driver;    // the NVIDIA kernel module's version, from /proc/driver/nvidia/version
  int driver_cuda = 0;   // the newest CUDA the driver supports (cudaDriverGetVersion); 0: none
  int runtime_cuda = 0;  // cudaRuntimeGetVersion
  Library runtime, cublas, cudnn, nccl;
  std::vector<Gpu> gpus;
  std::string gpu_error;  // why there are none, when cudaGetDeviceCount failed
};

// The driver, runtime and libraries; no GPU is touched.
Preflight inspect_libraries();

// Empty when the driver can run this build's CUDA runtime (a driver supports
// every runtime of its major version and older), else the one line that says
// what to do: "the driver supports CUDA 12.4 but this build needs CUDA 13.0:
// update the NVIDIA driver".
std::string driver_refusal(const Preflight& p);

// Fills p.gpus: every visible GPU, or only `device` when it is >= 0 (an Error
// naming the count if there is no such GPU).
void inspect_gpus(Preflight& p, int device);

// One line per fact, "key:     value", as gpu-info prints them.
void print_preflight(const Preflight& p, std::ostream& out);
// The same facts as one JSON object.
nlohmann::ordered_json preflight_json(const Preflight& p);

}  // namespace amsp::gpu
