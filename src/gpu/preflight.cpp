#include "gpu/preflight.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "core/error.h"
#include "gpu/check.h"

namespace amsp::gpu {
namespace {

std::string version_text(int major, int minor, int patch) {
  return cat(major, ".", minor, ".", patch);
}

// Fills lib.path and lib.in_executable with where the code at `symbol` was
// loaded from: the shared object that holds it, or this program itself.
void locate(const void* symbol, Library& lib) {
  Dl_info there{}, here{};
  if (!dladdr(symbol, &there) || !there.dli_fname) return;
  dladdr(reinterpret_cast<const void*>(&locate), &here);
  lib.in_executable = there.dli_fbase == here.dli_fbase;
  const char* file = lib.in_executable ? "/proc/self/exe" : there.dli_fname;
  char resolved[PATH_MAX];
  lib.path = realpath(file, resolved) ? resolved : there.dli_fname;
}

// The NVIDIA kernel module's version: the first token of the form 550.54.15 in
// /proc/driver/nvidia/version's first line (whose wording differs between the
// proprietary and the open module); empty without that file.
std::string nvidia_driver() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line, token;
  if (!std::getline(f, line)) return "";
  std::istringstream words(line);
  while (words >> token)
    if (std::isdigit(static_cast<unsigned char>(token[0])) && token.find('.') != std::string::npos)
      return token;
  return line;
}

Library cuda_runtime(int* version) {
  Library lib;
  AMSP_CUDA_CHECK(cudaRuntimeGetVersion(version));
  lib.code = *version;
  lib.version = cuda_version_text(*version);
  locate(reinterpret_cast<const void*>(&cudaRuntimeGetVersion), lib);
  return lib;
}

Library cublas() {
  Library lib;
  int major = 0, minor = 0, patch = 0;
  AMSP_CUBLAS_CHECK(cublasGetProperty(MAJOR_VERSION, &major));
  AMSP_CUBLAS_CHECK(cublasGetProperty(MINOR_VERSION, &minor));
  AMSP_CUBLAS_CHECK(cublasGetProperty(PATCH_LEVEL, &patch));
  lib.code = major * 10000 + minor * 100 + patch;
  lib.version = version_text(major, minor, patch);
  locate(reinterpret_cast<const void*>(&cublasGetProperty), lib);
  return lib;
}

Library nccl() {
  Library lib;
  int v = 0;
  AMSP_NCCL_CHECK(ncclGetVersion(&v));
  lib.code = v;
  // NCCL_VERSION_CODE: 10000 major + 100 minor + patch since 2.9, 1000 major + 100 minor before.
  lib.version = v >= 10000 ? version_text(v / 10000, v % 10000 / 100, v % 100)
                           : version_text(v / 1000, v % 1000 / 100, v % 100);
  locate(reinterpret_cast<const void*>(&ncclGetVersion), lib);
  return lib;
}

// cuDNN 9, if the loader finds it: amsp does not link it, so this only records
// what a job on this node would get if it did.
Library cudnn() {
  Library lib;
  void* handle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!handle) return lib;
  using GetVersion = size_t (*)();
  if (auto get = reinterpret_cast<GetVersion>(dlsym(handle, "cudnnGetVersion"))) {
    const int v = static_cast<int>(get());  // 10000 major + 100 minor + patch
    lib.code = v;
    lib.version = version_text(v / 10000, v % 10000 / 100, v % 100);
    locate(reinterpret_cast<const void*>(get), lib);
  }
  dlclose(handle);
  return lib;
}

std::string where(const Library& lib, bool emulated) {
  if (emulated) return cat("emulated, in ", lib.path);
  return cat(lib.in_executable ? "linked statically into " : "shared library ", lib.path);
}

nlohmann::ordered_json library_json(const Library& lib) {
  if (lib.version.empty()) return {{"found", false}};
  return {{"found", true}, {"version", lib.version}, {"code", lib.code}, {"path", lib.path},
          {"static", lib.in_executable}};
}

}  // namespace

std::string cuda_version_text(int version) {
  return cat(version / 1000, ".", version % 1000 / 10);
}

Preflight inspect_libraries() {
  Preflight p;
  p.emulated = AMSP_CUDA_EMULATION;
  p.driver = nvidia_driver();
  AMSP_CUDA_CHECK(cudaDriverGetVersion(&p.driver_cuda));
  p.runtime = cuda_runtime(&p.runtime_cuda);
  p.cublas = cublas();
  p.cudnn = cudnn();
  p.nccl = nccl();
  return p;
}

std::string driver_refusal(const Preflight& p) {
  // CUDA's minor version compatibility: a driver runs every runtime of the
  // major version it supports, and all older ones.
  const int needed = p.runtime_cuda / 1000 * 1000;
  if (p.driver_cuda == 0)
    return cat("no NVIDIA driver is loaded (cudaDriverGetVersion reports none) but this build "
               "needs one supporting CUDA ", cuda_version_text(needed), ": install the NVIDIA driver");
  if (p.driver_cuda >= needed) return "";
  return cat("the driver supports CUDA ", cuda_version_text(p.driver_cuda), " but this build needs CUDA ",
             cuda_version_text(needed), ": update the NVIDIA driver");
}

void inspect_gpus(Preflight& p, int device) {
  int count = 0;
  if (const cudaError_t rc = cudaGetDeviceCount(&count); rc != cudaSuccess) {
    (void)cudaGetLastError();  // an answer, not a sticky error
    p.gpu_error = cat("cudaGetDeviceCount: ", cudaGetErrorString(rc));
    return;
  }
  if (device >= count) fail_usage("--cuda-device ", device, ": there are ", count, " visible GPUs");
  for (int i = device < 0 ? 0 : device; i < (device < 0 ? count : device + 1); ++i) {
    cudaDeviceProp prop;
    AMSP_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    p.gpus.push_back({i, prop.name, prop.major, prop.minor, static_cast<uint64_t>(prop.totalGlobalMem),
                      prop.multiProcessorCount});
  }
}

void print_preflight(const Preflight& p, std::ostream& out) {
  auto line = [&](const std::string& key, const std::string& value) {
    std::string k = key + ":";
    k.resize(std::max<size_t>(k.size() + 1, 10), ' ');
    out << k << value << "\n";
  };
  if (p.emulated)
    out << "gpu-info: the CPU emulation of CUDA (a build without -DAMSP_CUDA=ON): the driver, "
           "runtime, cuBLAS and NCCL versions below are the emulation's own\n";
  const std::string driver = p.emulated ? "emulated"
                             : p.driver.empty() ? "NVIDIA (no /proc/driver/nvidia/version)"
                                                : "NVIDIA " + p.driver;
  line("driver", cat(driver, ", supports CUDA ", cuda_version_text(p.driver_cuda)));
  line("runtime", cat("CUDA ", p.runtime.version, ", ", where(p.runtime, p.emulated)));
  line("cublas", cat(p.cublas.version, ", ", where(p.cublas, p.emulated)));
  line("cudnn", p.cudnn.version.empty()
                    ? std::string("not found (not used by this build)")
                    : cat(p.cudnn.version, ", ", p.cudnn.path, " (not used by this build)"));
  line("nccl", cat(p.nccl.version, ", ", where(p.nccl, p.emulated)));
  for (const Gpu& g : p.gpus) {
    char memory[32];
    std::snprintf(memory, sizeof memory, "%.1f GiB", static_cast<double>(g.memory) / (1ull << 30));
    line(cat("gpu ", g.index), cat(g.name, ", sm_", g.major, g.minor, ", ", memory, ", ", g.sms, " SMs"));
  }
  if (p.gpus.empty()) line("gpus", cat("none visible", p.gpu_error.empty() ? "" : " (" + p.gpu_error + ")"));
}

nlohmann::ordered_json preflight_json(const Preflight& p) {
  using json = nlohmann::ordered_json;
  json gpus = json::array();
  for (const Gpu& g : p.gpus)
    gpus.push_back({{"index", g.index}, {"name", g.name}, {"sm", cat("sm_", g.major, g.minor)},
                    {"memory_bytes", g.memory}, {"sms", g.sms}});
  json cudnn = library_json(p.cudnn);
  cudnn["used_by_this_build"] = false;
  const std::string refusal = driver_refusal(p);
  return {{"emulated", p.emulated},
          {"driver", {{"version", p.driver.empty() ? json() : json(p.driver)},
                      {"cuda", p.driver_cuda ? json(cuda_version_text(p.driver_cuda)) : json()},
                      {"cuda_code", p.driver_cuda}}},
          {"runtime", library_json(p.runtime)},
          {"cublas", library_json(p.cublas)},
          {"cudnn", cudnn},
          {"nccl", library_json(p.nccl)},
          {"gpus", gpus},
          {"gpu_error", p.gpu_error.empty() ? json() : json(p.gpu_error)},
          {"ok", refusal.empty() && !p.gpus.empty()},
          {"error", refusal.empty() ? json() : json(refusal)}};
}

}  // namespace amsp::gpu
