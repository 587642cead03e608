#!/usr/bin/env python3
"""The same seed gives bit-identical training: two short runs of the tiny preset (two
micro-batches per step, evaluations on the way) agree on every loss, gradient norm and
validation loss, and another seed gives other losses. (That the tiny preset learns is
engine_precision's first check: validation/engine/precision_test.py.)

usage: determinism_test.py AMSP DATA WORKDIR
"""
import json
import os
import subprocess
import sys


def run(amsp, data, metrics, steps, extra=()):
    cmd = [amsp, "train", "--model", "tiny", "--data", data, "--steps", str(steps),
           "--metrics", metrics, "--peak-tflops", "1", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(metrics) as f:
        return [json.loads(line) for line in f]


def main():
    amsp, data, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    a = run(amsp, data, f"{work}/det_a.jsonl", 6, ["--grad-accum", "2", "--eval-every", "3"])
    b = run(amsp, data, f"{work}/det_b.jsonl", 6, ["--grad-accum", "2", "--eval-every", "3"])
    keys = ("loss", "grad_norm", "val_loss")
    ok = len(a) == len(b) == 7 and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in keys)
    print("losses bit-identical across runs:", ok)
    c = run(amsp, data, f"{work}/det_c.jsonl", 6, ["--grad-accum", "2", "--eval-every", "3", "--seed", "7"])
    differs = [x["loss"] for x in a[1:]] != [x["loss"] for x in c[1:]]
    print("another seed gives other losses:", differs)
    ok = ok and differs
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
