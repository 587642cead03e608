// Choosing and making the compute backend of a run: `--device cpu|cuda`.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"

namespace amsp::backend {

// "cpu" / "cuda"; nullopt otherwise.
std::optional<Device> parse_device(const std::string& text);

// cuda when this build has real CUDA and cudaGetDeviceCount finds a device,
// else cpu. (The emulation build defaults to cpu: its "device" is a test aid.)
Device default_device();

// Throws UsageError unless `device` can run in this build and process: in the
// emulation build, cuda needs AMSP_CUDA_EMULATION=1 in the environment.
void check_device_usable(Device device);

// The CUDA device of a rank: topology's GpuInfo::device when it knows one
// (>= 0), else local_rank modulo the devices this process sees.
int cuda_device_for(int gpu_info_device, int local_rank);

// The backend on `device`; for cuda, on CUDA device `cuda_device`, which
// becomes the current device before anything else CUDA is done.
std::unique_ptr<Backend> make_backend(Device device, DType compute, int cuda_device);

// True in a build whose CUDA is the CPU emulation (no -DAMSP_CUDA=ON).
bool cuda_emulated();

// Accesses the emulation's happens-before checker has checked in this process
// so far; -1 in a real CUDA build (there is no checker).
int64_t hb_checked();

}  // namespace amsp::backend
