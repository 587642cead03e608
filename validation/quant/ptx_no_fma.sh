#!/usr/bin/env bash
# Compiles kernels/cuda/quant.cu with nvcc, as the CUDA build does (-O3, nvcc's
# default --fmad=true), to PTX for sm_80 and sm_90, and fails on any fused
# multiply-add in it: dequantize_sum must round every product and every addition
# on its own (doc/compression.md), which __fmul_rn and __fadd_rn promise and
# plain * and + would not (nvcc fuses them). The GPU-free half of the check
# that a GPU run of `amsp backend-check` completes. Exit 77 without nvcc.
#
#   usage: ptx_no_fma.sh SOURCE_DIR WORK_DIR
set -uo pipefail
src=$1
work=$2
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [[ ! -x $nvcc ]]; then
  echo "SKIP: no CUDA toolkit (nvcc)"
  exit 77
fi
mkdir -p "$work"
status=0
for arch in 80 90; do
  ptx=$work/quant_sm$arch.ptx
  if ! "$nvcc" -std=c++17 -O3 --expt-relaxed-constexpr -DAMSP_CUDA_REAL -I"$src" -arch=sm_$arch \
      -ptx "$src/kernels/cuda/quant.cu" -o "$ptx"; then
    echo "FAIL sm_$arch: nvcc could not compile kernels/cuda/quant.cu"
    exit 1
  fi
  fused=$(grep -Ec '\bfma\.[a-z.]*f32' "$ptx")
  mul=$(grep -Ec '\bmul\.rn\.f32' "$ptx")
  add=$(grep -Ec '\badd\.rn\.f32' "$ptx")
  # The sum's kernels must be there, or finding no fma proves nothing.
  if ! grep -Eq '\.entry .*dequantize_sum_kernel' "$ptx"; then
    echo "FAIL sm_$arch: no dequantize_sum kernel in the PTX of kernels/cuda/quant.cu"
    status=1
  elif ((fused > 0)); then
    echo "FAIL sm_$arch: $fused fused multiply-adds in the PTX of kernels/cuda/quant.cu"
    grep -E '\bfma\.[a-z.]*f32' "$ptx" | head -3
    status=1
  else
    echo "ok sm_$arch: no fused multiply-add; $mul mul.rn.f32, $add add.rn.f32"
  fi
done
exit $status
