#!/usr/bin/env python3
"""Overlap on and off, side by side: the same training job on N ranks for several
shard plans, once with communication overlapping compute (the engine's default) and
once with every collective waited for as soon as it is issued (--no-overlap). Prints
step time, communication time in flight and exposed communication time (time compute
spent blocked in waits), averaged over the steps after the first.

usage: benchmarks/overlap_bench.py [--amsp build/amsp] [--data build/corpus.h5]
           [--ranks 4] [--model small] [--plans zero3 zero2 mics:2 ddp] [--steps 6]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, plan, overlap, work):
    metrics = os.path.join(work, "m.jsonl")
    cmd = [args.mpiexec, "-n", str(args.ranks), args.amsp, "train", "--model", args.model,
           "--data", args.data, "--steps", str(args.steps), "--seq-len", str(args.seq),
           "--batch-size", str(args.batch), "--grad-accum", str(args.accum), "--shard", plan,
           "--eval-every", "0", "--eval-windows", "4", "--peak-tflops", "1",
           "--threads", str(args.threads), "--metrics", metrics]
    if not overlap:
        cmd.append("--no-overlap")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(metrics) if '"step_ms"' in line][1:]
    n = len(rows)
    return (sum(r["step_ms"] for r in rows) / n, sum(r["comm_in_flight_ms"] for r in rows) / n,
            sum(r["comm_exposed_ms"] for r in rows) / n, rows[-1]["comm_bytes_sent"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--amsp", default=os.path.join(REPO, "build", "amsp"))
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--data", default=os.path.join(REPO, "build", "corpus.h5"))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--model", default="small")
    ap.add_argument("--plans", nargs="+", default=["ddp", "zero2", "zero3", "mics:2"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"overlap on vs off: {args.model}, {args.ranks} ranks x {args.threads} thread(s), batch "
          f"{args.batch} x seq {args.seq} x accum {args.accum} per rank, {args.steps} steps "
          f"(first left out), load average {load:.1f} at start")
    print(f"{'plan':20s} {'MB/step':>8s} | {'step ms':>8s} {'comm ms':>8s} {'exposed':>8s} | "
          f"{'step ms':>8s} {'comm ms':>8s} {'exposed':>8s} | {'speed-up':>8s}")
    print(f"{'':20s} {'':>8s} | {'--- overlap on ---':>26s} | {'--- overlap off ---':>26s} |")
    with tempfile.TemporaryDirectory() as work:
        for plan in args.plans:
            on = run(args, plan, True, work)
            off = run(args, plan, False, work)
            print(f"{plan:20s} {on[3] / 1e6:8.2f} | {on[0]:8.1f} {on[1]:8.1f} {on[2]:8.1f} | "
                  f"{off[0]:8.1f} {off[1]:8.1f} {off[2]:8.1f} | {off[0] / on[0]:7.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
