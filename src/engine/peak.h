// The peak that MFU is measured against.
#pragma once

namespace amsp::engine {

// Best FLOP/s of a large fp32 GEMM (OpenBLAS sgemm, n = 1536) on this process's
// threads, over a few repetitions. Takes about a quarter of a second.
double measure_sgemm_peak_flops(int n = 1536, int repeats = 4);

}  // namespace amsp::engine
