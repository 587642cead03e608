#!/usr/bin/env python3
"""fp32 beside bf16 in the same run: throughput, model-state and temporary bytes per
rank (with the planner's prediction), bytes sent per step, and the loss reached.

For each preset, `amsp train` runs alternately in fp32 and bf16 (REPEATS times each,
the median step time of steps 3.. taken), on one rank for throughput, and on RANKS
ranks with one plan for memory and bytes. CPU figures: on a CPU, bf16 costs extra
rounding passes and saves nothing in the matmuls, so it is expected to be slower here;
what bf16 buys (half the parameter and gradient bytes, on the wire and in memory) shows
in the byte columns.

usage: precision_bench.py AMSP DATA [--presets tiny,small] [--ranks 4] [--plan zero3]
                          [--steps 12] [--repeats 2] [--mpiexec mpiexec] [--work DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def train(args, preset, precision, ranks, tag, seq):
    metrics = os.path.join(args.work, f"{tag}.jsonl")
    cmd = ([args.mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [
        args.amsp, "train", "--model", preset, "--data", args.data, "--steps", str(args.steps),
        "--seq-len", str(seq), "--batch-size", "4", "--precision", precision,
        "--shard", args.plan if ranks > 1 else "ddp", "--threads", str(2 // ranks or 1),
        "--eval-every", "0", "--eval-windows", "8", "--peak-tflops", "1", "--metrics", metrics]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return [json.loads(line) for line in open(metrics) if '"loss"' in line]


def planned(args, preset, precision, seq):
    out = subprocess.run(
        [args.amsp, "plan", "--model", preset, "--nodes", "1", "--gpus-per-node", str(args.ranks),
         "--precision", precision, "--seq-len", str(seq), "--micro-batch", "4",
         "--global-batch", str(seq * 4 * args.ranks), "--gpu-memory", "16GiB", "--shard", args.plan,
         "--json"], check=True, stdout=subprocess.PIPE, text=True).stdout
    m = json.loads(out)["plan"]["memory"]
    return m["params"] + m["grads"] + m["optimizer"], m["gathered"] + m["buckets"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("amsp")
    ap.add_argument("data")
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--plan", default="zero3")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--work", default=tempfile.mkdtemp(prefix="amsp-precision-"))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    print(f"{'preset':6s} {'precision':9s} {'tokens/s (1 rank)':>17s} {'final loss':>10s} "
          f"{'states/rank':>12s} {'planned':>12s} {'temps/rank':>11s} {'planned':>11s} "
          f"{'sent/step':>11s}   ({args.ranks} ranks, {args.plan})")
    for preset in args.presets.split(","):
        seq = 128 if preset == "tiny" else 256
        speed = {"fp32": [], "bf16": []}
        loss = {}
        for r in range(args.repeats):
            for precision in ("fp32", "bf16"):
                rows = train(args, preset, precision, 1, f"{preset}-{precision}-{r}", seq)
                speed[precision].append(statistics.median(x["tokens_per_s"] for x in rows[2:]))
                loss[precision] = rows[-1]["loss"]
        for precision in ("fp32", "bf16"):
            rows = train(args, preset, precision, args.ranks, f"{preset}-{precision}-ranks", seq)
            last = rows[-1]
            want_states, want_temps = planned(args, preset, precision, seq)
            print(f"{preset:6s} {precision:9s} {statistics.median(speed[precision]):17.0f} "
                  f"{loss[precision]:10.4f} {last['model_state_bytes']:12d} {want_states:12d} "
                  f"{last['temporary_bytes']:11d} {want_temps:11d} {last['comm_bytes_sent']:11d}",
                  flush=True)


if __name__ == "__main__":
    main()
