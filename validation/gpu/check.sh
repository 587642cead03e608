#!/usr/bin/env bash
# Everything about amsp's CUDA path that needs a GPU, in one command for a GPU
# machine that has a driver, CUDA's libraries and Python (with PyTorch for the
# side-by-side), and nothing of ours: no build, no install, no network. It runs
# amsp from the bundle that validation/gpu/bundle.sh makes (doc/gpu.md):
#   0. preflight: the driver, CUDA runtime, cuBLAS, cuDNN and NCCL it will use;
#   1. every kernel of the CUDA backend against the CPU backend at the sizes of a
#      1B-7B layer, fp32 and bf16;
#   2. the GPU against the CPU: the losses of a few steps of the small preset;
#   3. one-GPU training of the ~1B preset (seq 2048, bf16): tokens/s, MFU, peak
#      memory (against the plan's prediction, within 5%), time per kernel; and the same model, weights and batches in
#      PyTorch (eager with SDPA, and torch.compile) in the same run; attention at
#      D = 128 (two decoder layers of llama-7b), amsp's kernels and PyTorch's, each
#      timed by its own profile, and at D = 64 with one and two tiles a warp; and one step under Nsight Compute (counters);
#   4. compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over a
#      small backend-check, where the tool is present;
#   5. with two GPUs or more: ddp, zero3 and a mixed plan against one GPU;
#   6. with 8 cores or more (not with --quick): CPU ranks, a core each, for the
#      figures a 2-core development machine cannot give: communication hidden per
#      plan, and the checkpoint stall (benchmarks/hidden_bench.py, ckpt_stall.py).
# It writes gpu-check.md (one Markdown table) and gpu-check.json into DIR and
# exits non-zero on any wrong result, naming the failing check on one line.
#
#   check.sh --bundle ARCHIVE --out DIR [--quick] [--parts LIST]
#   check.sh --bundle-dir DIR --out DIR [--quick] [--parts LIST]   (an unpacked bundle; its
#       bin/check.sh runs this)
#   --parts LIST: some of kernels,losses,side-by-side,attention,counters,sanitizers,gpus,cores (all by
#       default; the preflight always runs), e.g. a second call for what the first
#       had no time for
#   check.sh --emulated [--build DIR] --out DIR     (no GPU: the CPU emulation of
#       CUDA in an ordinary build, tiny sizes; the test suite runs this to keep the
#       script working, it proves nothing about a GPU)
#
# Launching: ranks are started by the bundle's own MPICH launcher on this node
# (mpiexec -launcher fork), never by srun: inside a Slurm allocation, run this
# script in a step of its own (srun --overlap -N1 ... check.sh), not on the
# submit host. Python: python3 on PATH, or AMSP_PYTHON.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
archive="" bundle="" build="" out="" emulated=0 quick=0 parts=""
value() {  # the value of option $1, or a one-line error
  [[ $# -ge 2 && -n $2 ]] || { echo "check.sh: $1 needs a value" >&2; exit 2; }
  echo "$2"
}
while (($#)); do
  case $1 in
    --bundle) archive=$(value "$@"); shift 2 ;;
    --bundle-dir) bundle=$(value "$@"); shift 2 ;;
    --build) build=$(value "$@"); shift 2 ;;
    --out) out=$(value "$@"); shift 2 ;;
    --emulated) emulated=1; shift ;;
    --quick) quick=1; shift ;;
    --parts) parts=$(value "$@"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "check.sh: unknown option $1 (expected --bundle ARCHIVE, --bundle-dir DIR, --emulated, --build DIR, --out DIR, --quick or --parts LIST)" >&2; exit 2 ;;
  esac
done
[[ -n $out ]] || { echo "check.sh: --out DIR is required (where gpu-check.md and gpu-check.json go)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${AMSP_PYTHON:-python3}
command -v "$python" >/dev/null || { echo "check.sh: no $python: set AMSP_PYTHON to a Python 3" >&2; exit 2; }
start=$(date +%s)

if ((emulated)); then
  build=${build:-$here/../../build}
  [[ -x $build/amsp ]] || { echo "check.sh: no $build/amsp; build amsp first" >&2; exit 2; }
  export AMSP_CUDA_EMULATION=1
  args=(--amsp "$build/amsp" --mpiexec "${MPIEXEC:-mpiexec}" --inputs "$here/../../inputs" --scripts "$here/../.."
        --data "$build/test-work/corpus.h5" --gpus 2 --emulated
        --commit "$(git -C "$here" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)")
  if [[ ! -f $build/test-work/corpus.h5 ]]; then
    mkdir -p "$build/test-work"
    "$build/amsp" data prepare --input $("$here/../../inputs/corpus/files.sh") --output "$build/test-work/corpus.h5" >/dev/null
  fi
else
  if [[ -n $archive ]]; then
    [[ -f $archive ]] || { echo "check.sh: no bundle $archive (validation/gpu/bundle.sh makes it)" >&2; exit 2; }
    unpacked=$(mktemp -d "${TMPDIR:-/tmp}/amsp-gpu-check.XXXXXX")
    trap 'rm -rf "$unpacked"' EXIT
    tar -C "$unpacked" -xJf "$archive"
    bundle=$unpacked/amsp-gpu
  fi
  [[ -n $bundle && -f $bundle/MANIFEST ]] || { echo "check.sh: give --bundle ARCHIVE or --bundle-dir DIR (an unpacked bundle with a MANIFEST)" >&2; exit 2; }
  bundle=$(cd "$bundle" && pwd)
  command -v nvidia-smi >/dev/null || { echo "check.sh: no nvidia-smi: is this a GPU machine?" >&2; exit 2; }
  gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
  ((gpus > 0)) || { echo "check.sh: nvidia-smi lists no GPU" >&2; exit 2; }
  # Find CUDA's libraries once, here: the wrappers in bin/ then only run the
  # programs (through the bundle's own glibc where this machine's is older).
  found=$(here=$bundle; . "$bundle/libexec/cuda-libs.sh" && env) || exit 2
  while IFS= read -r line; do export "${line?}"; done \
    < <(grep -E '^(LD_LIBRARY_PATH|AMSP_INPUTS|AMSP_BUNDLE_READY|AMSP_BUNDLE_OWN_GLIBC)=' <<<"$found")
  echo "== bundle $(sed -n 's/^commit //p' "$bundle/MANIFEST"), unpacked in $(($(date +%s) - start)) s; $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"
  args=(--amsp "$bundle/bin/amsp" --mpiexec "$bundle/bin/mpiexec" --inputs "$bundle/share/amsp/inputs"
        --data "$bundle/share/amsp/corpus.h5" --gpus "$gpus" --manifest "$bundle/MANIFEST"
        --scripts "$bundle/share/amsp/tree")
fi
((quick)) && args+=(--quick)
[[ -n $parts ]] && args+=(--parts "$parts")
"$python" "$here/check.py" "${args[@]}" --out "$out" --started "$start"
