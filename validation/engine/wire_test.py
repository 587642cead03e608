#!/usr/bin/env python3
"""Bytes the engine hands to MPI, counted by MPI's profiling interface, against the
planner's prediction and against hand-written formulas.

The engine's own byte counters and the planner both come from comm::traffic_bytes, so
comparing them cannot catch a wrong formula. Here a preloaded library
(validation/engine/mpi_count.c) counts every collective call amsp makes, per
communicator (amsp names its groups P, G, OS, replica, gather, world) and operation:
calls, elements and bytes as given to MPI. One optimizer step is isolated in one run of
3 steps: the library also snapshots its counts at every collective on the group "world",
which the engine uses only for the gradient norm, once per step. There must be exactly 3
such marks; the counts between the second and the third are one whole step (the update's
gathers of step 2, then step 3 up to its norm), with start-up, evaluation and the final
gathers outside. Steps 2 and 3 must also hand MPI the same (the first and the second
interval are equal). Rank 0's counts are turned into
per-rank bytes by the bandwidth-optimal model written out below, and compared for
every plan of the engine's equivalence tests on 4 and 8 ranks with `amsp plan --json`:
calls, elements and bytes per (group, operation) must be equal. For ddp, zero3 and
p=2x1,g=2x1,os=4x1 on 4 ranks the counts must also equal closed-form formulas written
from the plan's definition and the tiny preset's unit sizes.

usage: wire_test.py --amsp PATH --preload libamsp_mpi_count.so --mpiexec PATH
                    --data CORPUS.h5 --work DIR [--only TEXT]
Prints one line per case and ends with "N passed, M failed"; exit 1 on any failure.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import equivalence_test as eq  # noqa: E402  (the cases and clean_env)

SEQ = 32
OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all")


def ring_bytes(op, n, elements, blocks, elem_bytes):
    """Per-rank bytes sent by a bandwidth-optimal ring or pipelined chain (the model
    nccl-tests' bus bandwidth uses): all-gather and reduce-scatter move (n-1) blocks of
    the per-rank count; all-reduce is a reduce-scatter then an all-gather of padded
    blocks, 2(n-1) ceil(count/n). An all-to-all (amsp's bf16 sums exchange their blocks
    with one) sends the block for each of the n-1 other ranks."""
    if n <= 1:
        return 0
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) * elements * elem_bytes
    if op == "all_reduce":
        return 2 * (n - 1) * blocks * elem_bytes
    raise ValueError(op)


STEPS = 3
# Compressed all-gathers and reduce-scatters (doc/compression.md): the records' int32
# words on the wire must be the planner's, in both code widths and with one scale per
# chunk, over the P, G and OS groups.
COMPRESSED_CASES = [(4, 1, "zero3", 1, 1, "p=int8"), (4, 1, "p=2x1,g=2x1,os=4x1", 2, 1, "p=int4,g=int8,block=64"),
                    (8, 1, "mics:4", 1, 1, "p=int8,g=int4,block=chunk"), (4, 1, "p=1,g=2x1,os=4x1", 1, 1, "g=int8")]


def counted(args, ranks, plan, batch, accum, tag, compress="off"):
    """Rank 0's snapshots at the gradient norm's all-reduce on "world", one per step."""
    out = os.path.join(args.work, tag)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    # AMSP_COMM_CHECK=0: the mismatch check's 16-byte all-reduce per op is not data
    # movement, and the planner's bytes are the data's (doc/communication.md).
    env = eq.clean_env({"LD_PRELOAD": args.preload, "AMSP_MPI_COUNT_DIR": out, "AMSP_MPI_COUNT_MARK": "world",
                        "AMSP_COMM_CHECK": "0"})
    cmd = [args.mpiexec, "-n", str(ranks), args.amsp, "train", "--model", "tiny", "--data", args.data,
           "--steps", str(STEPS), "--seq-len", str(SEQ), "--batch-size", str(batch), "--grad-accum", str(accum),
           "--shard", plan, "--eval-every", "0", "--eval-windows", "4", "--peak-tflops", "1", "--threads", "1",
           "--compress", compress]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-800:]}")
    path = os.path.join(out, "rank-0-marks.json")
    if not os.path.exists(path):
        raise RuntimeError(f"no {path}: no collective on \"world\" (the gradient norm), or too many")
    with open(path) as f:
        return json.load(f)


def between(a, b):
    """{(comm, op): (size, calls, elements, bytes, blocks)} counted from snapshot a to b."""
    out = {}
    for comm in set(a) | set(b):
        for op in OPS:
            x, y = a.get(comm, {}).get(op), b.get(comm, {}).get(op)
            if not y:
                continue
            x = x or {"calls": 0, "elements": 0, "bytes": 0, "blocks": 0}
            d = tuple(y[k] - x[k] for k in ("calls", "elements", "bytes", "blocks"))
            if any(d):
                out[(comm, op)] = (b[comm]["size"],) + d
    return out


def one_step(args, ranks, plan, batch, accum, tag, compress="off"):
    """{(comm, op): (size, calls, elements, bytes, blocks)} of one step on rank 0."""
    marks = counted(args, ranks, plan, batch, accum, tag, compress)
    if len(marks) != STEPS:
        raise RuntimeError(f"{len(marks)} collectives on \"world\" in {STEPS} steps: expected one per step "
                           "(the gradient norm)")
    step2, step3 = between(marks[0], marks[1]), between(marks[1], marks[2])
    if step2 != step3:
        raise RuntimeError(f"steps 2 and 3 hand MPI different counts: {step2} != {step3}")
    return step3


def planned(args, ranks, plan, batch, accum, compress="off"):
    cmd = [args.amsp, "plan", "--model", "tiny", "--nodes", "1", "--gpus-per-node", str(ranks),
           "--precision", "fp32", "--seq-len", str(SEQ), "--micro-batch", str(batch),
           "--global-batch", str(SEQ * batch * accum * ranks), "--gpu-memory", "16GiB",
           "--bandwidth", os.path.join(REPO, "inputs", "bandwidth", "localcluster-2x4.json"),
           "--shard", plan, "--compress", compress, "--json"]
    p = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)["plan"]
    out = {}
    for c in p["collectives"]:
        if c["bytes_sent"] or c["calls_per_step"]:
            k = (c["group"], c["op"])
            calls, elements, sent, eb = out.get(k, (0, 0, 0, c["elem_bytes"]))
            out[k] = (calls + c["calls_per_step"], elements + c["elements_per_step"], sent + c["bytes_sent"], eb)
    return out


# --- closed forms: the tiny preset on 4 ranks, one micro-batch of one sequence --------
def tiny_units():
    """numel of embed, the 5 decoder layers and the head (inputs/models/tiny.json)."""
    c = json.load(open(os.path.join(REPO, "inputs", "models", "tiny.json")))
    h, i, v, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    layer = 2 * h + 2 * h * h + 2 * kv * h + 3 * h * i
    return [v * h] + [layer] * L + [h + v * h]


def closed_form(plan):
    """Per step on 4 ranks with M = 1: {(group, op): (calls, elements)} from the plan's
    definition: every unit is padded to a multiple of s_os, gathered over P before each use
    (forward, then backward except the head, which keeps its copy), its gradient
    reduce-scattered over P (then G), over OS, all-reduced over the replicas (ddp: a decoder
    layer in two buckets, its MLP block's and its attention block's gradients), the
    updated OS-shards all-gathered over the gather group; the gradient norm is one double
    all-reduced over the world."""
    units = tiny_units()
    U, L, n = len(units), len(units) - 2, 4
    norm = {("world", "all_reduce"): (1, 1)}
    if plan == "ddp":   # p = g = os = 1: each unit all-reduced over the 4 replicas, a decoder
        return {("replica", "all_reduce"): (U + L, sum(units)), **norm}  # layer in 2 buckets
    if plan == "zero3":  # p = g = os = 4: gathers and reduce-scatters of quarter units over P
        pad = [math.ceil(u / n) * n for u in units]
        return {("P", "all_gather"): (2 * U - 1, sum(pad) // n + sum(pad[:-1]) // n),
                ("P", "reduce_scatter"): (U, sum(pad) // n), **norm}
    if plan == "p=2x1,g=2x1,os=4x1":  # halves over P; quarters over OS and gather (2 ranks each)
        pad = [math.ceil(u / n) * n for u in units]
        return {("P", "all_gather"): (2 * U - 1, sum(pad) // 2 + sum(pad[:-1]) // 2),
                ("P", "reduce_scatter"): (U, sum(pad) // 2),
                ("OS", "reduce_scatter"): (U, sum(pad) // 4),
                ("gather", "all_gather"): (U, sum(pad) // 4), **norm}
    return None


def check_case(args, per_node, plan, accum, batch, compress="off"):
    ranks = per_node
    tag = (f"w{ranks}-{plan.replace(':', '').replace(',', '_').replace('=', '')}-m{accum}-b{batch}"
           + ("" if compress == "off" else "-" + compress.replace(",", "_").replace("=", "")))
    got = one_step(args, ranks, plan, batch, accum, tag, compress)
    want = planned(args, ranks, plan, batch, accum, compress)
    problems = []
    total_got = total_want = 0
    groups = {k: v for k, v in got.items() if k[0] != "MPI_COMM_WORLD"}
    # A bf16 reduce-scatter is an all-to-all on the wire, a bf16 all-reduce an all-to-all
    # and an all-gather: MPI's calls no longer map one to one onto amsp's ops, so such a
    # group is compared by its bytes per rank, summed over its MPI calls.
    by_group = {g for g, op in groups if op == "all_to_all"}
    for grp in sorted(by_group):
        ring = 0
        for (g, op), (size, calls, elements, sent, blocks) in groups.items():
            if g == grp:
                ring += ring_bytes(op, size, elements, blocks, sent // elements if elements else 0)
        planned_bytes = sum(w[2] for (g, op), w in want.items() if g == grp)
        total_got += ring
        total_want += planned_bytes
        if ring != planned_bytes:
            problems.append(f"{grp}: counted {ring} bytes over its MPI calls, planned {planned_bytes}")
    for key in sorted(set(groups) | set(want)):
        if key[0] in by_group:
            continue
        g, w = groups.get(key), want.get(key)
        if g is None or w is None:
            problems.append(f"{key[0]} {key[1]}: counted {g}, planned {w}")
            continue
        size, calls, elements, sent, blocks = g
        eb = sent // elements if elements else w[3]
        ring = ring_bytes(key[1], size, elements, blocks, eb)
        total_got += ring
        total_want += w[2]
        if (calls, elements, ring) != w[:3]:
            problems.append(f"{key[0]} {key[1]}: counted {calls} calls, {elements} elements, {ring} bytes; "
                            f"planned {w[0]}, {w[1]}, {w[2]}")
    if ranks == 4 and accum == 1 and batch == 1 and compress == "off":
        cf = closed_form(plan)
        if cf is not None:
            mine = {k: v[1:3] for k, v in groups.items()}
            if mine != cf:
                problems.append(f"closed form {cf} != counted {mine}")
    book = got.get(("MPI_COMM_WORLD", "all_reduce"))
    text = (f"{ranks} ranks {plan:20s} M={accum} B={batch}"
            + ("" if compress == "off" else f" --compress {compress}")
            + f": {total_got:>10} bytes per rank per step counted on "
            f"the wire, {total_want:>10} planned" + (" (closed form too)" if ranks == 4 and accum == 1 and batch == 1
                                                      and compress == "off" and closed_form(plan) else "")
            + (f"; bookkeeping on MPI_COMM_WORLD: {book[1]} all-reduces of {book[3]} bytes" if book else ""))
    return not problems, text, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--preload", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", action="append", default=[])
    args = ap.parse_args()
    args.amsp, args.preload = os.path.abspath(args.amsp), os.path.abspath(args.preload)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    passed = failed = 0
    cases = [c + ("off",) for c in eq.MPI_CASES] + COMPRESSED_CASES
    for per_node, nodes, plan, accum, batch, compress in cases:
        label = f"{per_node} {plan} M={accum} B={batch}" + ("" if compress == "off" else f" {compress}")
        if args.only and not any(o in label for o in args.only):
            continue
        try:
            ok, text, problems = check_case(args, per_node, plan, accum, batch, compress)
        except (RuntimeError, OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            ok, text, problems = False, label, [str(e)]
        print(f"{'ok  ' if ok else 'FAIL'} {text}", flush=True)
        for p in problems:
            print(f"     | {p}")
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
