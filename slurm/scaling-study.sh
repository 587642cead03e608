#!/bin/bash
# A scaling study: the same amsp training, for each shard plan, over a sweep of node
# counts; waits for every job, then collects one table (CSV and markdown) and one plot
# (PNG) of throughput per GPU and MFU against the GPU count, one line per plan.
# doc/cluster.md ("Scaling studies") explains how to read them.
#
#   slurm/scaling-study.sh [options] [-- amsp train options]
#
#   --nodes "LIST"       node counts (default "1 2 4 8 16 32 64 128": 8 to 1024 GPUs at
#                        8 per node)
#   --tasks-per-node N   ranks per node, one per GPU (default 8)
#   --cpus-per-task N    cores per rank (default 1)
#   --plans "LIST"       shard plans, each as amsp train --shard takes it (default "auto zero3")
#   --model NAME|FILE    model preset or config.json (default tiny)
#   --data FILE          token dataset (default build/corpus.h5)
#   --steps N            optimizer steps per run (default 20; the report leaves out the first 2)
#   --batch-size B       sequences per micro-batch per rank (default 8)
#   --seq-len T          tokens per sequence (default 128)
#   --global-batch-tokens N
#                        keep the global batch fixed at N tokens (the paper's setting) by
#                        choosing --grad-accum = N / (B x T x ranks) per run; default: a fixed
#                        batch per rank (weak scaling)
#   --sbatch "ARGS"      more sbatch options for every job: partition, account, time,
#                        --gpus-per-node, --exclusive (default "--exclusive")
#   --serial             run one job at a time (each waits for the one before), so no two
#                        runs of the study share nodes or switches
#   --out DIR            the study directory (default scaling-<date>-<time>)
#   --dry-run            print the sbatch commands and submit nothing
#   --report-only        collect the table and plot of an existing study directory again
#
# The report (slurm/scaling_report.py) needs Python 3 with matplotlib (Debian:
# python3-matplotlib); AMSP_PYTHON names the interpreter if the one on PATH lacks it.
# The jobs run slurm/train.sbatch with AMSP_BIN (default: amsp on PATH, else the build/amsp
# beside this script), without checkpoints.
#
# The study directory holds jobs.tsv (one line per job), runs/<plan>-n<nodes>/ (each run's
# metrics and records, from slurm/train.sbatch), logs/<job id>.out, and the results:
# scaling.csv, scaling.md and scaling.png.
set -uo pipefail
PATH=$PATH:/usr/sbin:/sbin
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
  printf 'scaling-study.sh: error: %s\n' "$*" >&2
  exit 2
}

nodes_list="1 2 4 8 16 32 64 128"
per_node=8
cpus=1
plans="auto zero3"
model=tiny
data=build/corpus.h5
steps=20
batch=8
seq=128
global_tokens=""
sbatch_args="--exclusive"
serial=0
out=""
dry=0
report_only=0
train_args=()

need() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) need "$@"; nodes_list=$2; shift 2 ;;
    --tasks-per-node) need "$@"; per_node=$2; shift 2 ;;
    --cpus-per-task) need "$@"; cpus=$2; shift 2 ;;
    --plans) need "$@"; plans=$2; shift 2 ;;
    --model) need "$@"; model=$2; shift 2 ;;
    --data) need "$@"; data=$2; shift 2 ;;
    --steps) need "$@"; steps=$2; shift 2 ;;
    --batch-size) need "$@"; batch=$2; shift 2 ;;
    --seq-len) need "$@"; seq=$2; shift 2 ;;
    --global-batch-tokens) need "$@"; global_tokens=$2; shift 2 ;;
    --sbatch) need "$@"; sbatch_args=$2; shift 2 ;;
    --serial) serial=1; shift ;;
    --out) need "$@"; out=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --report-only) report_only=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    --) shift; train_args=("$@"); break ;;
    *) die "unknown option $1; expected the options in --help, then -- and amsp train options" ;;
  esac
done

whole() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 $2: expected a whole number >= 1"; }
whole --tasks-per-node "$per_node"
whole --cpus-per-task "$cpus"
whole --steps "$steps"
whole --batch-size "$batch"
whole --seq-len "$seq"
[[ -z $global_tokens ]] || whole --global-batch-tokens "$global_tokens"
read -r -a nodes_arr <<<"$nodes_list"
read -r -a plans_arr <<<"$plans"
((${#nodes_arr[@]} > 0)) || die "--nodes is empty; expected node counts such as \"1 2 4\""
((${#plans_arr[@]} > 0)) || die "--plans is empty; expected plans such as \"zero3 mics:8\""
for n in "${nodes_arr[@]}"; do whole "--nodes entry" "$n"; done
[[ -n $out ]] || out=scaling-$(date +%Y%m%d-%H%M%S)

# The report needs matplotlib: AMSP_PYTHON, else the first python3 that has it (a
# pyenv or conda python3 on PATH may not see Debian's python3-matplotlib).
report() {
  local py
  for py in ${AMSP_PYTHON:-} python3 /usr/bin/python3; do
    if "$py" -c 'import matplotlib' 2>/dev/null; then
      "$py" "$here/scaling_report.py" "$@"
      return
    fi
  done
  python3 "$here/scaling_report.py" "$@"  # writes the tables and says what is missing
}

if ((report_only)); then
  [[ -f $out/jobs.tsv ]] || die "--report-only: $out/jobs.tsv not found; expected a study directory"
  report "$out"
  exit
fi

command -v sbatch >/dev/null 2>&1 || ((dry)) || die "sbatch not found: run this on a Slurm login node"
[[ -f $data ]] || die "--data $data: no such file; make one with amsp data prepare"
amsp_bin=${AMSP_BIN:-$(command -v amsp 2>/dev/null || echo "$here/../build/amsp")}
[[ -x $amsp_bin ]] || die "no amsp executable at $amsp_bin; build it (cmake --build build) or set AMSP_BIN"
amsp_bin=$(realpath "$amsp_bin")
data=$(realpath "$data")
out=$(realpath -m "$out")
[[ -e $out/jobs.tsv ]] && die "--out $out already holds a study (jobs.tsv); choose another directory or use --report-only"

# Plan text to a directory name: "p=1,g=2x1,os=8x1" -> "p1-g2x1-os8x1", "mics:8" -> "mics8".
slug() { echo "$1" | sed 's/[=:]//g; s/,/-/g; s/[^A-Za-z0-9x._-]/_/g'; }

if ((!dry)); then
  mkdir -p "$out/runs" "$out/logs" || die "--out $out: cannot create the directory"
  printf 'job_id\tnodes\ttasks_per_node\tplan\trun_dir\n' >"$out/jobs.tsv"
fi
ids=()
prev=""
for plan in "${plans_arr[@]}"; do
  for n in "${nodes_arr[@]}"; do
    ranks=$((n * per_node))
    accum=1
    if [[ -n $global_tokens ]]; then
      per_step=$((batch * seq * ranks))
      if ((global_tokens % per_step != 0)); then
        echo "scaling-study.sh: skipping $plan on $n node(s): --global-batch-tokens $global_tokens is not a multiple of $batch x $seq x $ranks ranks" >&2
        continue
      fi
      accum=$((global_tokens / per_step))
    fi
    run_dir=$out/runs/$(slug "$plan")-n$n
    cmd=(sbatch --parsable -N "$n" --ntasks-per-node="$per_node" --cpus-per-task="$cpus"
         --job-name="amsp-scale-$(slug "$plan")-n$n" --output="$out/logs/%j.out")
    # shellcheck disable=SC2206
    [[ -n $sbatch_args ]] && cmd+=($sbatch_args)
    ((serial)) && [[ -n $prev ]] && cmd+=(--dependency="afterany:$prev")
    # Checkpoints are not part of what is measured; a stop signal then just ends the run.
    cmd+=("$here/train.sbatch" --steps "$steps" --batch-size "$batch" --seq-len "$seq"
          --grad-accum "$accum" --eval-every 0 "${train_args[@]}")
    envs=(AMSP_BIN="$amsp_bin" AMSP_MODEL="$model" AMSP_SHARD="$plan" AMSP_DATA="$data" AMSP_RUN_DIR="$run_dir" AMSP_CKPT_DIR=none)
    if ((dry)); then
      echo "${envs[*]} ${cmd[*]}"
      continue
    fi
    id=$(env "${envs[@]}" "${cmd[@]}") || die "sbatch failed for plan $plan on $n node(s): ${cmd[*]}"
    id=${id%%;*}
    ids+=("$id")
    prev=$id
    printf '%s\t%s\t%s\t%s\t%s\n' "$id" "$n" "$per_node" "$plan" "$run_dir" >>"$out/jobs.tsv"
    echo "submitted job $id: plan $plan on $n node(s) x $per_node ranks (grad-accum $accum)"
  done
done
((dry)) && exit 0
((${#ids[@]} > 0)) || die "no job submitted"

# Wait until none of the study's jobs is pending or running (a requeued job counts).
echo "waiting for ${#ids[@]} job(s); results in $out"
last=""
while :; do
  queued=$(squeue -h -o %i 2>/dev/null) || { sleep 5; continue; }
  left=0
  for id in "${ids[@]}"; do grep -qx "$id" <<<"$queued" && left=$((left + 1)); done
  ((left == 0)) && break
  msg="$left of ${#ids[@]} job(s) pending or running"
  [[ $msg != "$last" ]] && echo "$msg"
  last=$msg
  sleep 2
done
report "$out"
