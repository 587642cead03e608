#!/usr/bin/env python3
"""The engine sends exactly what the planner predicts, and allocates exactly the
model-state and temporary bytes of its memory model, in fp32 and in bf16.

For each plan and precision, `amsp train` runs on N ranks under mpiexec with
--metrics; the bytes each group and op sent in a step (rank 0's count) must equal, to
the byte, the sum of the collectives `amsp plan --shard PLAN --json` lists for the same
model, mesh, batch and precision; model_state_bytes (counted from the buffers the
engine allocated) must equal the planner's params + grads + optimizer, and
temporary_bytes its gathered + buckets, also with the work in flight set by
--prefetch-units and --reduction-slots (given to both commands).

usage: bytes_test.py AMSP MPIEXEC DATA WORKDIR
"""
import json
import os
import subprocess
import sys
from collections import defaultdict

RANKS = 4
SEQ, BATCH, ACCUM = 32, 1, 2
PLANS = ["ddp", "zero1", "zero2", "zero3", "mics:2", "p=1,g=2x1,os=4x1", "p=2x1,g=2x1,os=4x1",
         "p=1,g=1,os=2x1"]
# (precision, plan, --compress): compressed all-gathers' records, their bytes and their
# buffers (doc/compression.md).
COMPRESSED = [("fp32", "zero3", "p=int8"), ("bf16", "mics:2", "p=int4,block=64"),
              ("bf16", "p=2x1,g=2x1,os=4x1", "on")]
# (precision, plan, options of both commands): the engine's work in flight, away from its
# defaults (the temporaries are sized by them).
IN_FLIGHT = [("fp32", "zero3", ["--prefetch-units", "1", "--reduction-slots", "1"]),
             ("bf16", "mics:2", ["--prefetch-units", "3", "--reduction-slots", "3"])]


def predicted(amsp, plan, precision, compress="off", extra=()):
    out = subprocess.run(
        [amsp, "plan", "--model", "tiny", "--nodes", "1", "--gpus-per-node", str(RANKS),
         "--precision", precision, "--seq-len", str(SEQ), "--micro-batch", str(BATCH),
         "--global-batch", str(SEQ * BATCH * ACCUM * RANKS), "--gpu-memory", "16GiB",
         "--bandwidth", os.path.join(os.path.dirname(__file__), "..", "..", "inputs", "bandwidth",
                                     "localcluster-2x4.json"),
         "--shard", plan, "--compress", compress, "--json", *extra], check=True, stdout=subprocess.PIPE, text=True).stdout
    p = json.loads(out)["plan"]
    sent = defaultdict(int)
    for c in p["collectives"]:
        if c["bytes_sent"] or c["bytes_received"]:
            sent[(c["group"], c["op"])] += c["bytes_sent"]
    m = p["memory"]
    return dict(sent), (m["params"] + m["grads"] + m["optimizer"], m["gathered"] + m["buckets"])


def measured(amsp, mpiexec, data, work, plan, precision, compress="off", extra=()):
    metrics = os.path.join(work, "bytes.jsonl")
    subprocess.run([mpiexec, "-n", str(RANKS), amsp, "train", "--model", "tiny", "--data", data,
                    "--steps", "2", "--seq-len", str(SEQ), "--batch-size", str(BATCH),
                    "--grad-accum", str(ACCUM), "--shard", plan, "--precision", precision, "--eval-every", "0",
                    "--eval-windows", "4", "--peak-tflops", "1", "--threads", "1", "--compress", compress,
                    "--metrics", metrics, *extra], check=True, stdout=subprocess.DEVNULL, timeout=120)
    rows = [json.loads(line) for line in open(metrics)]
    last = rows[-1]  # a whole step: every collective it issued, nothing else
    sent = {(g, op): s["bytes_sent"] for g, ops in last["comm"].items() for op, s in ops.items()
            if s["bytes_sent"]}
    return sent, (last["model_state_bytes"], last["temporary_bytes"])


def main():
    amsp, mpiexec, data, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    passed = failed = 0
    cases = ([(p, plan, "off", []) for p in ("fp32", "bf16") for plan in PLANS] +
             [(p, plan, c, []) for p, plan, c in COMPRESSED] + [(p, plan, "off", x) for p, plan, x in IN_FLIGHT])
    for precision, plan, compress, extra in cases:
        want, want_mem = predicted(amsp, plan, precision, compress, extra)
        got, got_mem = measured(amsp, mpiexec, data, work, plan, precision, compress, extra)
        ok = want == got and want_mem == got_mem
        label = " ".join([plan] + ([f"--compress {compress}"] if compress != "off" else []) + extra)
        print(f"{'ok  ' if ok else 'FAIL'} {precision} {label:28s} bytes {sum(got.values()):>10} "
              f"(predicted {sum(want.values()):>10}), model states {got_mem[0]} (predicted {want_mem[0]}), "
              f"temporaries {got_mem[1]} (predicted {want_mem[1]})")
        if not ok:
            for key in sorted(set(want) | set(got)):
                if want.get(key) != got.get(key):
                    print(f"     {key[0]:8s} {key[1]:15s} measured {got.get(key)} predicted {want.get(key)}")
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
