#!/usr/bin/env python3
"""`amsp train --trace` names each collective the same on every member of its group, and
benchmarks/plan_validation.py's reading of it tells waiting for a late rank from
waiting for communication.

  1. by hand: a trace of two ranks and three collectives whose answers are worked out
     below (a late issue, a rank that waits for its own late issue, a collective nobody
     was late for);
  2. on 4 ranks, p=1,g=2x1,os=4x1 (two G groups of 2, two OS groups of 2, the gather and
     world groups of 4), tiny preset, 6 steps traced: every collective's spans carry
     (group, seq), each group's members apart from the other group of its kind, and every
     collective of the measured steps is recorded by as many ranks as its group has;
  3. zero3 (every collective over all 4 ranks) with rank 2 asleep for 0.5 s as step 4
     starts (AMSP_FAULT=train.step@4:2,SLEEP=0.5): the ranks waited for rank 2 at least
     0.5 s (it held up the others' first gathers of the step) and longer than for all the
     other ranks together.

usage: trace_test.py --amsp PATH --data CORPUS.h5 --work DIR --mpiexec PATH
Prints one line per check and ends with "N passed, M failed"; exit 1 on any failure.
"""

import json
import os
import subprocess
import sys

from checks import Checks, job_args

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks"))
import plan_validation as pv  # noqa: E402

PLAN, RANKS, STEPS, WARMUP = "p=1,g=2x1,os=4x1", 4, 6, 2
GROUP_SIZE = {"comm G": 2, "comm OS": 2, "comm gather": 4, "comm world": 4}


def span(pid, cat, name, ts_ms, dur_ms, seq=None, group=0):
    e = {"pid": pid, "cat": cat, "name": name, "ph": "X", "ts": ts_ms * 1e3, "dur": dur_ms * 1e3}
    if seq is not None:
        e["args"] = {"group": group, "seq": seq}
    return e


def by_hand():
    """Steps end at 0 (not measured), 100 and 200 ms on both ranks. Step 2, communicator
    G: rank 0 issues #1 at 10 and #2 at 12, rank 1 issues #1 at 40 (late) and #2 at 41.
    Rank 0 waits for #2 from 20 to 45: 21 ms of it before #2's last issue (41), waiting
    for rank 1, 4 ms for the communication. Rank 1 waits for #1 from 41 to 44: it issued
    last itself, nothing late. Step 3: both issue #3 at 110; rank 0 waits 120-125:
    nothing late. In flight, rank 0: #1 10-44 (30 ms before 40), #2 12-45 (29 ms before
    41), #3 110-124 (0)."""
    ev = [span(r, "compute", "optimizer", t - 1, 1) for r in (0, 1) for t in (0, 100, 200)]
    ev += [span(0, "comm G", "reduce_scatter", 10, 34, 1), span(0, "comm G", "reduce_scatter", 12, 33, 2),
           span(1, "comm G", "reduce_scatter", 40, 4, 1), span(1, "comm G", "reduce_scatter", 41, 4, 2),
           span(0, "wait", "wait reduce_scatter G", 20, 25, 2), span(1, "wait", "wait reduce_scatter G", 41, 3, 1),
           span(0, "comm G", "reduce_scatter", 110, 14, 3), span(1, "comm G", "reduce_scatter", 110, 14, 3),
           span(0, "wait", "wait reduce_scatter G", 120, 5, 3)]
    return {"traceEvents": ev}


def check_by_hand(check, work):
    path = os.path.join(work, "by-hand.json")
    with open(path, "w") as f:
        json.dump(by_hand(), f)
    got = pv.trace_steps(path, 1, 1)
    want = {0: [(25, 21, 59, {1: 21}), (5, 0, 0, {})], 1: [(3, 0, 0, {}), (0, 0, 0, {})]}
    seen = {r: [(round(s["wait"], 6), round(s["late_wait"], 6), round(s["late_in_flight"], 6),
                 {k: round(v, 6) for k, v in s["late_for"].items()}) for s in steps] for r, steps in got.items()}
    check(seen == want, f"by hand: per rank and step (wait, late wait, late in flight, whom): {seen}, want {want}")


def train(args, tag, plan, env=None):
    trace = os.path.join(args.work, tag + ".json")
    cmd = [args.mpiexec, "-n", str(RANKS), args.amsp, "train", "--model", "tiny", "--data", args.data,
           "--steps", str(STEPS), "--seq-len", "32", "--batch-size", "1", "--grad-accum", "2", "--shard", plan,
           "--eval-every", "0", "--eval-windows", "8", "--peak-tflops", "1", "--threads", "1",
           "--trace", trace, "--trace-steps", str(STEPS - 1)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=240,
                       env={**os.environ, **(env or {})})
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-600:]}")
    return trace


def check_identities(check, trace):
    events = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    comm = [e for e in events if e["cat"].startswith("comm") or e["cat"] == "wait"]
    bare = [e["name"] for e in comm if pv.collective_key(e) is None]
    ranks = {}
    for e in comm:
        if e["cat"].startswith("comm") and pv.collective_key(e):
            ranks.setdefault(pv.collective_key(e), set()).add(e["pid"])
    groups = {track: {frozenset(r) for k, r in ranks.items() if k[0] == track} for track in ("comm G", "comm OS")}
    # The measured steps: issued after the end of step WARMUP's optimizer on every rank,
    # before the last step's optimizer (which issues the next step's first gathers, whose
    # completion after the last traced step is not recorded) on any.
    opt = {r: sorted(e["ts"] for e in events if e["pid"] == r and e["name"] == "optimizer") for r in range(RANKS)}
    start = max(opt[r][WARMUP - 2] for r in range(RANKS))
    stop = min(opt[r][-1] for r in range(RANKS))
    first = {}
    for e in comm:
        k = pv.collective_key(e)
        if k and e["cat"].startswith("comm"):
            first[k] = min(first.get(k, e["ts"]), e["ts"])
    measured = [k for k in ranks if start < first[k] < stop]
    short = [k for k in measured if len(ranks[k]) != GROUP_SIZE[k[0]]]
    check(not bare and groups == {"comm G": {frozenset({0, 1}), frozenset({2, 3})},
                                  "comm OS": {frozenset({0, 2}), frozenset({1, 3})}} and measured and not short,
          f"4 ranks, {PLAN}: {len(comm) - len(bare)} collective spans carry their identity ({len(bare)} do not); "
          f"the G and OS groups' members {[sorted(sorted(g) for g in v) for v in groups.values()]}; "
          f"{len(measured)} collectives of the "
          f"measured steps, {len(short)} recorded by fewer ranks than their group has {short[:3]}")


def check_late_rank(check, trace):
    late = {}
    for steps in pv.trace_steps(trace, 2, WARMUP).values():
        for s in steps:
            for who, ms in s["late_for"].items():
                late[who] = late.get(who, 0.0) + ms
    others = sum(ms for who, ms in late.items() if who != 2)
    check(late.get(2, 0) >= 500 and late.get(2, 0) > others,
          f"rank 2 asleep 500 ms: the ranks waited {late.get(2, 0):.1f} ms for it, "
          f"{others:.1f} ms for the others ({', '.join(f'{w}: {ms:.1f}' for w, ms in sorted(late.items()))})")


def main():
    args = job_args()
    check = Checks()
    check_by_hand(check, args.work)
    try:
        check_identities(check, train(args, "plain", PLAN))
        check_late_rank(check, train(args, "slowed", "zero3", {"AMSP_FAULT": "train.step@4:2,SLEEP=0.5"}))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        check(False, str(e))
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
