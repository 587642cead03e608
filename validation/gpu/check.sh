#!/usr/bin/env bash
# Everything about amsp's CUDA path that needs a GPU, in one command for a GPU node
# (doc/gpu.md). It builds amsp with CUDA, then:
#   1. checks every kernel of the CUDA backend against the CPU backend (fp32 and
#      bf16; tolerances in doc/gpu.md, "Kernel checks");
#   2. trains on 1 GPU and on 2 (and 8, when there are 8) with several shard plans
#      and checks that the losses agree within bf16's resolution;
#   3. measures throughput (tokens/s per GPU, MFU, exposed communication) for the
#      small and base presets and a llama-7b-shaped model of a few layers, beside
#      PyTorch FSDP on the same GPUs when torch (with CUDA) and transformers import.
# It ends with a table to paste into an issue.
#
#   validation/gpu/check.sh [--build DIR] [--quick]
#   validation/gpu/check.sh --emulated [--build DIR]   (no GPU: the CPU emulation of
#       CUDA in an ordinary build, tiny sizes; the test suite runs this to keep the
#       script working, it proves nothing about a GPU)
#
# Needs what the README's first command installs, the CUDA toolkit with NCCL (nvcc on
# PATH or CUDACXX), and MPI ranks on one node (mpiexec; under Slurm, run it inside
# an allocation: salloc -N1 --gpus-per-node=8 validation/gpu/check.sh).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build="" emulated=0 quick=0
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --emulated) emulated=1; shift ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "check.sh: unknown option $1 (expected --build DIR, --quick or --emulated)" >&2; exit 2 ;;
  esac
done

if ((emulated)); then
  build=${build:-$repo/build}
  [[ -x $build/amsp ]] || { echo "check.sh: no $build/amsp; build amsp first" >&2; exit 2; }
  export AMSP_CUDA_EMULATION=1
  gpus=4
else
  build=${build:-$repo/build-cuda}
  command -v nvidia-smi >/dev/null || { echo "check.sh: no nvidia-smi: is this a GPU node?" >&2; exit 2; }
  gpus=$(nvidia-smi -L | grep -c '^GPU ')
  ((gpus > 0)) || { echo "check.sh: nvidia-smi lists no GPU" >&2; exit 2; }
  echo "== building with CUDA in $build ($gpus GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs))"
  start=$(date +%s)
  cmake -S "$repo" -B "$build" -DAMSP_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DAMSP_TESTS=OFF \
        -DAMSP_BENCHMARKS=OFF >/dev/null
  cmake --build "$build" -j"$(nproc)" --target amsp
  echo "   built in $(($(date +%s) - start)) s"
fi

data=$build/corpus.h5
[[ -f $data ]] || "$build/amsp" data prepare --input $("$repo/inputs/corpus/files.sh") --output "$data"
args=(--amsp "$build/amsp" --data "$data" --gpus "$gpus" --work "$build/gpu-check")
((emulated)) && args+=(--emulated)
((quick)) && args+=(--quick)
exec python3 "$repo/validation/gpu/check.py" "${args[@]}"
