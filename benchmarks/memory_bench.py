#!/usr/bin/env python3
"""Each rank's memory, predicted beside measured: the plan's prediction of the rank's peak
(what the engine reserves on the backend before anything else allocates: the planner's
model states and temporaries for the plan, plus the model's own activation buffers) and
the backend allocator's high-water mark after two steps, per rank, for the equivalence
plans on 4 ranks, per preset, with and without recomputation.

The figures come from the run record (`--run-info`, `result.memory_per_rank`), so both
numbers are the same run's. On the CPU backend the allocator is the host's (doc/metrics.md,
`mem_peak_bytes`); the process's peak resident set is printed beside it, for what the
backend does not allocate (MPI, OpenBLAS, the conversion workspace, the binary).

usage: memory_bench.py AMSP DATA [--presets small,base] [--plans "ddp;zero1;..."]
                       [--seq 128] [--batch 2] [--device cpu|cuda] [--mpiexec mpiexec]
                       [--work DIR] [--quick]

--device cuda trains in bf16 on the CUDA backend (set AMSP_CUDA_EMULATION=1 where no GPU
is: the emulated device's allocator is the real caching allocator). --quick: the tiny
preset, three plans, without recomputation (what the suite samples). The goal, every
rank within 5% of its prediction, is printed, not enforced: a figure, not a test.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

PLANS = ("ddp", "zero1", "zero2", "zero3", "fsdp", "mics:2", "mics:4", "p=2x1,g=2x1,os=4x1",
         "p=1,g=2x1,os=4x1")
GOAL = 0.05


def run(args, preset, plan, recompute):
    tag = f"{preset}-{plan}-{recompute}".replace(":", "").replace(",", "_").replace("=", "")
    info = os.path.join(args.work, f"{tag}.json")
    cmd = [args.mpiexec, "-n", "4", args.amsp, "train", "--model", preset, "--data", args.data,
           "--steps", "2", "--seq-len", str(args.seq), "--batch-size", str(args.batch),
           "--shard", plan, "--recompute", recompute, "--threads", "1", "--eval-every", "0",
           "--eval-windows", "4", "--run-info", info]
    if args.device == "cuda":
        cmd += ["--device", "cuda", "--precision", "bf16"]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=1800)
    if done.returncode != 0:
        sys.exit(f"memory_bench: {' '.join(cmd)} failed ({done.returncode}): "
                 f"{done.stderr.strip().splitlines()[-1:]}")
    return json.load(open(info))["result"]["memory_per_rank"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("amsp")
    p.add_argument("data")
    p.add_argument("--presets", default="small,base")
    p.add_argument("--plans", default=";".join(PLANS), help="plans separated by ';'")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--mpiexec", default=os.environ.get("MPIEXEC", "mpiexec"))
    p.add_argument("--work", default=None)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.presets, args.plans = "tiny", "ddp;zero3;p=2x1,g=2x1,os=4x1"
    args.work = args.work or tempfile.mkdtemp(prefix="amsp-memory-")
    os.makedirs(args.work, exist_ok=True)
    recomputes = ("none",) if args.quick else ("none", "full")
    backend = "bf16 on the CUDA backend" if args.device == "cuda" else "fp32 on the CPU backend"
    print(f"4 ranks, seq {args.seq} x batch {args.batch}, {backend}; MB = 2^20 bytes")
    print(f"{'preset':7} {'plan':20} {'recompute':9} {'rank':>4} {'predicted MB':>12} "
          f"{'measured MB':>11} {'error':>7} {'rss MB':>8}")
    worst, misses = 0.0, 0
    for preset in args.presets.split(","):
        for recompute in recomputes:
            for plan in args.plans.split(";"):
                for r in run(args, preset, plan, recompute):
                    pred, got = r["predicted_bytes"], r["peak_backend_bytes"]
                    err = (got - pred) / pred
                    worst = max(worst, abs(err))
                    misses += abs(err) > GOAL
                    print(f"{preset:7} {plan:20} {recompute:9} {r['rank']:>4} {pred / 2**20:12.2f} "
                          f"{got / 2**20:11.2f} {100 * err:+6.2f}% {r['peak_rss_bytes'] / 2**20:8.1f}")
    print(f"worst error {100 * worst:.2f}% (goal {100 * GOAL:.0f}%); ranks past the goal: {misses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
