#!/usr/bin/env python3
"""benchmarks/plan_validation.py's schedule_bound on `amsp plan --schedule`, worked by hand.

The small preset on 4 ranks, 2 micro-batches, fp32 (counts from the schedule: the head
98688 elements, each of the 8 decoder layers 1770240, the embedding 98304):
  - ddp: every unit all-reduced on the last micro-batch, 2 (n - 1) / n = 1.5 elements
    moved an element, a decoder layer in two buckets (its MLP block's 1180032 elements
    after that block's backward, then its attention block's 590208); the tail is layer
    0's attention block's and the embedding's:
    1 - (590208 + 98304) / (8 * 1770240 + 98688 + 98304);
  - zero3: P all-gathers of a quarter each, twice a micro-batch but the head's once, and a
    reduce-scatter a micro-batch, (n - 1) = 3 elements moved an element; the tail is
    layer 0's and the embedding's last reduce-scatter:
    1 - (442560 + 24576) / (2 (24672 + 16 * 442560 + 2 * 24576) + 2 (24672 + 8 * 442560 + 24576)).
usage: schedule_bound_test.py AMSP
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
import plan_validation as pv  # noqa: E402

failures = []


def expect(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def schedule(amsp, plan):
    return subprocess.run([amsp, "plan", "--model", "small", "--gpus-per-node", "4", "--seq-len", "128",
                           "--micro-batch", "1", "--global-batch", str(128 * 2 * 4), "--precision", "fp32",
                           "--shard", plan, "--schedule"], check=True, capture_output=True, text=True).stdout


amsp = sys.argv[1]
want = {"ddp": 1 - (590208 + 98304) / (8 * 1770240 + 98688 + 98304),
        "zero3": 1 - (442560 + 24576) / (2 * (24672 + 16 * 442560 + 2 * 24576) + 2 * (24672 + 8 * 442560 + 24576))}
for plan, w in want.items():
    got = pv.schedule_bound(schedule(amsp, plan), 2)
    expect(abs(got - w) <= 1e-12, f"{plan}: at most {100 * got:.3f}% hidden (by hand {100 * w:.3f}%)")
try:
    pv.schedule_bound("unit 1:\n", 2)
    expect(False, "a schedule without its plan line refused")
except ValueError as e:
    expect("plan" in str(e), f"a schedule without its plan line refused: {e}")
print("schedule_bound: " + ("FAILED" if failures else "ok"))
sys.exit(1 if failures else 0)
