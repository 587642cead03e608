#!/usr/bin/env python3
"""Activation recomputation in `amsp train`, on 2 MPI ranks:

- --recompute full trains to the same losses and gradient norms, bit for bit, as none
  (zero3: the backward gathers feed the recomputed forward too);
- the activation memory each rank's model allocates is what `amsp plan` predicts for both
  settings, and smaller with recomputation;
- --shard auto --recompute auto says which it chose: none when a plan fits without it,
  full when only recomputation makes a plan fit (--memory-per-rank between the two);
- --shard auto warns, in one line, when its bandwidth table was measured on another
  shape of job (the default 2x4 table on these 2x1 ranks), and not with a 2x1 table;
- on GPUs (emulated, of two sizes) --shard auto plans with the smaller one's free memory,
  and by default with the h100 preset's modelled NCCL table, saying that it is a model.

usage: recompute_test.py AMSP MPIEXEC CORPUS WORK
"""
import json
import os
import re
import shutil
import subprocess
import sys

AMSP, MPIEXEC, DATA, WORK = sys.argv[1:5]
MODEL = ["--model", "tiny", "--seq-len", "64", "--batch-size", "2"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def train(tag, extra, steps=6):
    metrics = os.path.join(WORK, tag + ".jsonl")
    cmd = [MPIEXEC, "-n", "2", AMSP, "train", "--data", DATA, "--steps", str(steps),
           "--threads", "1", "--peak-tflops", "1", "--eval-every", "0", "--metrics", metrics,
           "--run-info", os.path.join(WORK, tag + ".json")] + MODEL + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
    rows = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    return p, [r for r in rows if "loss" in r]


def planned_activations(recompute):
    p = subprocess.run([AMSP, "plan", "--precision", "fp32", "--nodes", "1", "--gpus-per-node", "2",
                        "--micro-batch", "2", "--shard", "zero3", "--recompute", recompute, "--json"]
                       + MODEL[:2] + MODEL[2:4], capture_output=True, text=True, timeout=60)
    return json.loads(p.stdout)["plan"]["memory"]["activations"]


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
runs = {}
for r in ("none", "full"):
    p, rows = train(r, ["--shard", "zero3", "--recompute", r])
    check(p.returncode == 0 and len(rows) == 6, f"--recompute {r} trains 6 steps")
    runs[r] = rows
if len(runs["none"]) == len(runs["full"]) == 6:
    same = all(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
               for a, b in zip(runs["none"], runs["full"]))
    check(same, "losses and gradient norms are the same bits with and without recomputation")
    kept, rebuilt = runs["none"][0]["activation_bytes"], runs["full"][0]["activation_bytes"]
    check(rebuilt < kept, f"recomputation keeps less: {rebuilt} < {kept} bytes")
    for r, measured in (("none", kept), ("full", rebuilt)):
        planned = planned_activations(r)
        check(planned == measured, f"--recompute {r}: the planner's activations {planned} = allocated {measured}")
    record = json.load(open(os.path.join(WORK, "full.json")))
    check(record.get("recompute") == "full", "the run record says recompute full")

# --shard auto weighs recomputation: roomy memory, none; memory only recomputation fits, full.
p, _ = train("auto-roomy", ["--shard", "auto"], steps=1)
first = p.stdout.splitlines()[0] if p.stdout else ""
check(p.returncode == 0 and "recompute none" in first, f"roomy: recompute none, said: {first}")

# The default table was measured on 2x4 ranks, this job is 2x1: one warning line, from
# rank 0, naming the table and how to measure one. None with a table of this job's shape.
warnings = [l for l in p.stderr.splitlines() if "warning: bandwidth table" in l]
check(len(warnings) == 1 and "localcluster-2x4.json was measured on 2x4 ranks" in warnings[0]
      and "this job has 2x1" in warnings[0] and "mpiexec -n 2 amsp comm-bench --output-table" in warnings[0]
      and "--bandwidth" in warnings[0], f"one warning of the table's other shape, said: {warnings}")
local = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "inputs",
                                    "bandwidth", "localcluster-2x4.json")))
local["entries"] = [e for e in local["entries"] if e["nodes"] == 1]  # the 2x1 groups only
own = os.path.join(WORK, "bandwidth-2x1.json")
with open(own, "w") as f:
    json.dump(local, f)
p, _ = train("auto-own-table", ["--shard", "auto", "--bandwidth", own], steps=1)
first = p.stdout.splitlines()[0] if p.stdout else ""
check(p.returncode == 0 and own in first and "warning" not in p.stderr,
      f"a 2x1 table: no warning, said: {first} {p.stderr.strip()[:300]}")
states = runs["none"][0]["model_state_bytes"] if runs.get("none") else 0
# Enough for zero3's states, temporaries and the recomputed activations, not the full ones.
if runs.get("none") and runs.get("full"):
    tight = int((runs["none"][0]["model_state_bytes"] + runs["none"][0]["temporary_bytes"]
                 + (runs["none"][0]["activation_bytes"] + runs["full"][0]["activation_bytes"]) / 2)
                / 0.92)
    p, rows = train("auto-tight", ["--shard", "auto", "--memory-per-rank", str(tight)], steps=1)
    first = p.stdout.splitlines()[0] if p.stdout else ""
    check(p.returncode == 0 and "recompute full" in first, f"tight: recompute full, said: {first}")

# On GPUs, --shard auto plans with the devices' free memory, the least of any rank's (every
# rank must choose the same plan), not the host's: emulated GPUs of 400 MiB (rank 0, which
# prints the plan) and 300 MiB (rank 1) leave under 300 MiB less the margin to plan with.
gpu = [AMSP, "train", "--data", DATA, "--steps", "1", "--threads", "1", "--peak-tflops", "1",
       "--eval-every", "0", "--shard", "auto", "--device", "cuda", "--precision", "bf16"] + MODEL
p = subprocess.run([MPIEXEC, "-n", "1", "-env", "AMSP_EMU_DEVICE_MEMORY", "400M"] + gpu
                   + [":", "-n", "1", "-env", "AMSP_EMU_DEVICE_MEMORY", "300M"] + gpu,
                   capture_output=True, text=True, timeout=600, env=dict(os.environ, AMSP_CUDA_EMULATION="1"))
first = p.stdout.splitlines()[0] if p.stdout else ""
fit = re.search(r"plans that fit ([0-9.]+) MiB per rank", first)
check(p.returncode == 0 and fit is not None and 150 < float(fit[1]) <= 0.92 * 300,
      f"--device cuda: planned with the smaller GPU's free memory less the margin, said: {first} "
      f"{p.stderr.strip()[-300:]}")
# ... and with the h100 preset's modelled NCCL bandwidths, not the CPU cluster's MPI table,
# saying in one line that they are a model and how to measure this job's.
warnings = [l for l in p.stderr.splitlines() if "warning: bandwidth table" in l]
check(re.search(r"bandwidth from \S*/clusters/h100\.json", first) is not None and len(warnings) == 1 and "h100.json is modelled from data sheets, not measured" in warnings[0]
      and "amsp comm-bench --output-table" in warnings[0],
      f"--device cuda: the modelled GPU table by default, one warning, said: {first} {warnings}")

p = subprocess.run([AMSP, "train", "--data", DATA, "--recompute", "some"], capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "--recompute" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
      f"a bad --recompute is one line, exit 2: {p.stderr.strip()}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
