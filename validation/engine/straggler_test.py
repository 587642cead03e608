#!/usr/bin/env python3
"""A persistently slow rank is named while the job runs, and an undisturbed job names none.

- slowed: on 4 and on 8 ranks, a random rank is made 50% busier from a random step S on
  (AMSP_FAULT=train.step@S:RANK,SLOW=0.5: it spins for half its busy time each step),
  with the threshold at 25%. The job must print 'straggler: rank RANK (...)' naming that
  rank, by step S + 28, and name no other rank.
- quiet: as many ranks as there are cores (at most 4), 1000 steps, nothing injected, the
  default threshold of 10%: at most one straggler report. More ranks than cores is no
  undisturbed job: the kernel's scheduler then makes a rank 13 to 17% busier for three
  windows now and then (seen twice in 1000 steps with 4 ranks on 2 cores).

Windows of 4 steps, 3 in a row (--straggler-every 4 --straggler-windows 3). Why 50% against
25% in the slowed cases, where the default is 10%: they run 4 and 8 ranks on however few
cores there are, and on this repository's 2-core machine beside a CPU hog (stress-ng
--cpu 1) an undisturbed rank's busy time in a window of 4 steps is up to 12% above the
median (p99 over 280 windows; once 27%), while a rank made 20% busier showed anywhere
from 0 to 30% (its own busy time varies as much): a 20% slowdown against 10% was named
late or beside another rank in 2 of 3 suite runs under that load. 50% against 25% keeps
every window of the slowed rank above the threshold and every undisturbed one below it.
Three windows in a row leave room for one low window within the 28 steps; two were not
enough on this oversubscribed machine. Prints a table: case, ranks, slowed rank, from
step, named at, delay, reports.

usage: straggler_test.py AMSP MPIEXEC DATA WORK [--seed S] [--quiet-steps 1000]
"""
import argparse
import os
import random
import re
import subprocess
import sys

EVERY = 4
LIMIT = 28  # steps from the slowdown to the report
SLOW, THRESHOLD = 0.5, 0.25  # the slowed cases' injected slowdown and threshold
REPORT = re.compile(r"^straggler: rank (\d+) \(([^)]*)\) is (\d+)% busier .* up to step (\d+)$")


def train(args, ranks, steps, fault=None, threshold=None):
    cmd = [args.mpiexec, "-n", str(ranks), args.amsp, "train", "--model", "tiny", "--data", args.data,
           "--steps", str(steps), "--seq-len", "32", "--batch-size", "1", "--shard", "zero3",
           "--eval-every", "0", "--peak-tflops", "1", "--threads", "1", "--straggler-every", str(EVERY),
           "--straggler-windows", "3"]
    if threshold is not None:
        cmd += ["--straggler-threshold", str(threshold)]
    env = dict(os.environ)
    env.pop("AMSP_FAULT", None)
    if fault:
        env["AMSP_FAULT"] = fault
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stderr[-2000:]}")
    return [(int(m[1]), int(m[4]), int(m[3])) for l in p.stdout.splitlines() if (m := REPORT.match(l))]


def slowed(args, rng, ranks):
    victim, start = rng.randrange(ranks), rng.randrange(10, 21)
    reports = train(args, ranks, start + LIMIT + 10, f"train.step@{start}:{victim},SLOW={SLOW}", THRESHOLD)
    named = [step for r, step, _ in reports if r == victim]
    others = [r for r, _, _ in reports if r != victim]
    why = ""
    if others:
        why = f"named rank(s) {others}, the slowed rank is {victim}"
    elif not named:
        why = f"rank {victim}, slowed from step {start}, was never named"
    elif named[0] - start > LIMIT:
        why = f"rank {victim} named at step {named[0]}, {named[0] - start} steps after the slowdown (limit {LIMIT})"
    return (f"slowed", ranks, victim, start, named[0] if named else None, len(reports), why)


def quiet(args, ranks, steps):
    reports = train(args, ranks, steps)
    why = f"{len(reports)} straggler reports in an undisturbed run: {reports}" if len(reports) > 1 else ""
    return ("quiet", ranks, None, None, None, len(reports), why)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("amsp")
    ap.add_argument("mpiexec")
    ap.add_argument("data")
    ap.add_argument("work")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--quiet-steps", type=int, default=1000)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed} (--seed {seed} repeats these runs)", flush=True)
    quiet_ranks = max(2, min(4, os.cpu_count() or 2))
    results = [slowed(args, rng, 4), slowed(args, rng, 8), quiet(args, quiet_ranks, args.quiet_steps)]
    print("| case | ranks | slowed rank | from step | named at step | delay (steps) | reports | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for case, ranks, victim, start, named, n, why in results:
        delay = named - start if named is not None and start is not None else None
        cells = [case, ranks, victim, start, named, delay, n, why or "ok"]
        print("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    failed = [r for r in results if r[-1]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
