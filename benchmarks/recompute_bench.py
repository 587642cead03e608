#!/usr/bin/env python3
"""Activation recomputation beside none, in the same run: the activation memory the model
allocates (and the planner's prediction of it), step time and tokens/s, per preset.

For each preset, `amsp train` runs alternately with --recompute none and full (REPEATS
times each, one rank, the median step time of steps 3..). On a CPU the recomputed
forward costs about a third more compute, as on a GPU; what it buys is the activation
memory of all but one layer.

usage: recompute_bench.py AMSP DATA [--presets small,base] [--seq 512] [--batch 4]
                          [--steps 8] [--repeats 2] [--work DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def train(args, preset, recompute, tag):
    metrics = os.path.join(args.work, f"{tag}.jsonl")
    cmd = [args.amsp, "train", "--model", preset, "--data", args.data, "--steps", str(args.steps),
           "--seq-len", str(args.seq), "--batch-size", str(args.batch), "--shard", "ddp",
           "--recompute", recompute, "--threads", "2", "--eval-every", "0", "--eval-windows", "8",
           "--peak-tflops", "1", "--metrics", metrics]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    rows = [json.loads(line) for line in open(metrics) if '"loss"' in line]
    return rows


def planned(args, preset, recompute):
    out = subprocess.run([args.amsp, "plan", "--model", preset, "--precision", "fp32", "--seq-len",
                          str(args.seq), "--micro-batch", str(args.batch), "--gpus-per-node", "1",
                          "--shard", "ddp", "--recompute", recompute, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["plan"]["memory"]["activations"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("amsp")
    p.add_argument("data")
    p.add_argument("--presets", default="small,base")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", default=None)
    args = p.parse_args()
    args.work = args.work or tempfile.mkdtemp(prefix="amsp-recompute-")
    os.makedirs(args.work, exist_ok=True)
    print(f"one rank, 2 threads, seq {args.seq} x batch {args.batch}, {args.steps} steps, "
          f"{args.repeats} runs each (median of steps 3..)")
    print(f"{'preset':8} {'recompute':9} {'activations MB':>14} {'planned MB':>10} {'step ms':>8} "
          f"{'tokens/s':>9} {'loss (last)':>12}")
    for preset in args.presets.split(","):
        result = {}
        for rep in range(args.repeats):
            for r in ("none", "full"):  # alternate, so drifting load hits both alike
                rows = train(args, preset, r, f"{preset}-{r}-{rep}")
                result.setdefault(r, []).append(rows)
        for r in ("none", "full"):
            runs = result[r]
            step = statistics.median(x["step_ms"] for rows in runs for x in rows[2:])
            tok = statistics.median(x["tokens_per_s"] for rows in runs for x in rows[2:])
            act = runs[0][0]["activation_bytes"]
            print(f"{preset:8} {r:9} {act / 1e6:14.1f} {planned(args, preset, r) / 1e6:10.1f} "
                  f"{step:8.1f} {tok:9.0f} {runs[0][-1]['loss']:12.6f}")
        same = all(a["loss"] == b["loss"] for a, b in zip(result["none"][0], result["full"][0]))
        print(f"{preset:8} losses with and without recomputation {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
