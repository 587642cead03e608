#!/usr/bin/env bash
# The collective benchmark from benchmarks/: `amsp comm-bench` under mpiexec (or
# srun inside a Slurm allocation), writing the results and the bandwidth table.
#
#   benchmarks/comm_bench.sh [-n RANKS] [-b BUILD_DIR] [-o OUT_DIR] [-- comm-bench options]
#
# e.g. benchmarks/comm_bench.sh -n 4 -- --max-bytes 64M --ops all_reduce
# Defaults: 4 ranks, build/, build/comm-bench/; the full 1K..256M sweep.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ranks=4 build="$here/../build" out=""
while getopts "n:b:o:" opt; do
  case $opt in
    n) ranks=$OPTARG ;;
    b) build=$OPTARG ;;
    o) out=$OPTARG ;;
    *) sed -n 2,9p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
out=${out:-$build/comm-bench}
mkdir -p "$out"
amsp="$build/amsp"
[ -x "$amsp" ] || { echo "comm_bench.sh: no $amsp; build first (cmake --build $build)" >&2; exit 2; }
if [ -n "${SLURM_JOB_ID:-}" ]; then
  launch=(srun)  # the allocation's tasks
else
  launch=(mpiexec -n "$ranks")
fi
name="$(hostname)-${SLURM_NTASKS:-$ranks}"
exec "${launch[@]}" "$amsp" comm-bench --json "$out/$name-results.json" \
  --output-table "$out/$name-table.json" "$@"
