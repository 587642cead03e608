// gpu-info's decisions, apart from the libraries it asks (validation/gpu_info_test.sh
// runs the command itself on the emulation).
#include "gpu/preflight.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace amsp::gpu {
namespace {

Preflight versions(int driver, int runtime) {
  Preflight p;
  p.driver_cuda = driver;
  p.runtime_cuda = runtime;
  return p;
}

TEST(GpuPreflight, CudaVersionText) {
  EXPECT_EQ(cuda_version_text(12040), "12.4");
  EXPECT_EQ(cuda_version_text(13000), "13.0");
  EXPECT_EQ(cuda_version_text(11080), "11.8");
}

// Minor version compatibility: any driver of the runtime's major version will do.
TEST(GpuPreflight, TheDriverMustSupportTheRuntimesMajorVersion) {
  EXPECT_EQ(driver_refusal(versions(13000, 13000)), "");
  EXPECT_EQ(driver_refusal(versions(13000, 13010)), "");
  EXPECT_EQ(driver_refusal(versions(13020, 12080)), "");
  EXPECT_EQ(driver_refusal(versions(12040, 13000)),
            "the driver supports CUDA 12.4 but this build needs CUDA 13.0: update the NVIDIA driver");
  EXPECT_EQ(driver_refusal(versions(12090, 13010)),
            "the driver supports CUDA 12.9 but this build needs CUDA 13.0: update the NVIDIA driver");
  EXPECT_NE(driver_refusal(versions(0, 13000)).find("no NVIDIA driver is loaded"), std::string::npos);
}

TEST(GpuPreflight, ReportsEveryLibraryAndGpu) {
  Preflight p = versions(13000, 13000);
  p.driver = "580.65.06";
  p.runtime = {"13.0", 13000, "/opt/cuda/lib64/libcudart.so.13.0.48", false};
  p.cublas = {"13.1.0", 130100, "/opt/cuda/lib64/libcublas.so.13.1.0.3", false};
  p.nccl = {"2.28.9", 22809, "/opt/nccl/lib/libnccl.so.2.28.9", false};
  p.gpus = {{0, "NVIDIA H100 80GB HBM3", 9, 0, 85520809984ull, 132}};
  std::ostringstream out;
  print_preflight(p, out);
  EXPECT_EQ(out.str(),
            "driver:   NVIDIA 580.65.06, supports CUDA 13.0\n"
            "runtime:  CUDA 13.0, shared library /opt/cuda/lib64/libcudart.so.13.0.48\n"
            "cublas:   13.1.0, shared library /opt/cuda/lib64/libcublas.so.13.1.0.3\n"
            "cudnn:    not found (not used by this build)\n"
            "nccl:     2.28.9, shared library /opt/nccl/lib/libnccl.so.2.28.9\n"
            "gpu 0:    NVIDIA H100 80GB HBM3, sm_90, 79.6 GiB, 132 SMs\n");
  const nlohmann::ordered_json j = preflight_json(p);
  EXPECT_EQ(j["driver"]["version"], "580.65.06");
  EXPECT_EQ(j["cudnn"]["found"], false);
  EXPECT_EQ(j["gpus"][0]["sm"], "sm_90");
  EXPECT_EQ(j["ok"], true);
}

TEST(GpuPreflight, NoGpuIsNotOk) {
  Preflight p = versions(13000, 13000);
  p.gpu_error = "cudaGetDeviceCount: no CUDA-capable device is detected";
  std::ostringstream out;
  print_preflight(p, out);
  EXPECT_NE(out.str().find("gpus:     none visible (cudaGetDeviceCount: no CUDA-capable"),
            std::string::npos) << out.str();
  EXPECT_EQ(preflight_json(p)["ok"], false);
}

}  // namespace
}  // namespace amsp::gpu
