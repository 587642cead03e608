#!/usr/bin/env python3
"""Every rank issues every collective of a step in the schedule's one order.

For every case of the engine equivalence set on 4 and 8 ranks (validation/engine/
equivalence_test.py: MPI_CASES, and the bf16 cases), `amsp train` runs 2 steps with
AMSP_COMM_ISSUE_LOG set, so each rank writes the (group, op, count) of every op it issues,
in issue order. Each rank is slowed at random, differently: its communication thread
sleeps a random 0-2000 us between polls (AMSP_COMM_POLL), so collectives complete in a
different order on every rank and every run. Required:

  - every rank's log is the same, line for line: per communicator the same sequence on
    every member, and the same order across communicators;
  - between the evaluations at the start and the end (forward-only parameter
    all-gathers), the log is the step's issue order as `amsp plan --schedule` prints it
    for that plan and batch, once per step.

usage: issue_order_test.py --amsp PATH --data CORPUS.h5 --work DIR --mpiexec PATH [--only TEXT]
                          [--plan-amsp PATH]
Prints one line per case and ends with "N passed, M failed"; exit 1 on any failure.
See doc/engine-tests.md.
"""

import argparse
import os
import random
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence_test as eq  # noqa: E402

STEPS, SEQ = 2, 32
DEADLINE_CASE = 120


def schedule_issues(args, per_node, plan, accum, batch, precision):
    """The step's issue order from `amsp plan --schedule`, as log lines without dtype."""
    cmd = [args.plan_amsp or args.amsp, "plan", "--model", "tiny", "--gpus-per-node", str(per_node),
           "--seq-len", str(SEQ), "--micro-batch", str(batch), "--precision", precision,
           "--global-batch", str(SEQ * batch * accum * per_node), "--shard", plan, "--schedule"]
    rc, out, err, _ = eq.run(cmd, eq.clean_env())
    if rc != 0:
        raise eq.Failure(f"amsp plan --schedule failed: {err.strip()}")
    lines = out.split("Issue order, the same on every rank:\n", 1)[1].splitlines()
    return [re.sub(r"^\s*\d+\. ", "", x) for x in lines if x.strip()]


def launch(args, per_node, plan, accum, batch, precision, logdir, seed):
    """2 steps on per_node ranks, each rank's poller sleeping a random time."""
    rng = random.Random(seed)
    env = eq.clean_env({"AMSP_COMM_ISSUE_LOG": logdir})
    for r in range(per_node):
        env[f"AMSP_TEST_POLL_{r}"] = str(rng.randrange(0, 2001))
    train = [args.amsp, "train", "--model", "tiny", "--data", args.data, "--precision", precision,
             "--steps", str(STEPS), "--seq-len", str(SEQ), "--batch-size", str(batch),
             "--grad-accum", str(accum), "--shard", plan, "--eval-every", "0",
             "--eval-windows", "8", "--peak-tflops", "1", "--threads", "1", "--comm-timeout", "60"]
    # PMI_RANK is set by mpiexec (hydra) for each rank.
    wrapper = ['sh', '-c', 'eval "export AMSP_COMM_POLL=\\$AMSP_TEST_POLL_$PMI_RANK"; exec "$@"', "sh"]
    rc, out, err, secs = eq.run([args.mpiexec, "-n", str(per_node)] + wrapper + train, env,
                                timeout=DEADLINE_CASE)
    if rc != 0:
        raise eq.Failure(f"amsp train exit {rc}: {err.strip()[-400:]}")
    return secs


def check_logs(logdir, ranks, expected):
    logs = []
    for r in range(ranks):
        with open(os.path.join(logdir, f"issues.{r}")) as f:
            # "P all_gather 16384 fp32" -> "P all_gather 16384" (the schedule's form)
            logs.append([" ".join(line.split()[:3]) for line in f if line.strip()])
    for r in range(1, ranks):
        if logs[r] != logs[0]:
            i = next((k for k, (a, b) in enumerate(zip(logs[0], logs[r])) if a != b),
                     min(len(logs[0]), len(logs[r])))
            got = logs[r][i] if i < len(logs[r]) else "end of log"
            want = logs[0][i] if i < len(logs[0]) else "end of log"
            raise eq.Failure(f"rank {r} issue #{i + 1} is '{got}', rank 0's '{want}'")
    steps = expected * STEPS
    log = logs[0]
    start = next((i for i in range(len(log) - len(steps) + 1) if log[i:i + len(steps)] == steps), None)
    if start is None:
        # Name the first difference against the schedule, after the leading evaluation.
        lead = 0
        while lead < len(log) and log[lead].startswith("P all_gather") and log[lead:lead + 1] != steps[:1]:
            lead += 1
        for k, want in enumerate(steps):
            got = log[lead + k] if lead + k < len(log) else "end of log"
            if got != want:
                raise eq.Failure(f"issue #{lead + k + 1} is '{got}', the schedule's #{k % len(expected) + 1} "
                                 f"of step {k // len(expected) + 1} is '{want}'")
        raise eq.Failure("the schedule's steps were not found in the log")
    rest = log[:start] + log[start + len(steps):]
    stray = [x for x in rest if not x.startswith("P all_gather")]
    if stray:
        raise eq.Failure(f"issued outside the steps and evaluations: '{stray[0]}'")
    return len(log)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--only", default="")
    # The binary whose `plan --schedule` is the reference (default --amsp): lets an older
    # engine be run against today's schedule.
    ap.add_argument("--plan-amsp", default="")
    args = ap.parse_args()
    cases = [(c, "fp32") for c in eq.MPI_CASES] + [(c, "bf16") for c in eq.BF16_CASES]
    passed = failed = 0
    for n, ((per_node, nodes, plan, accum, batch), precision) in enumerate(cases):
        name = f"{per_node} ranks {plan} M={accum} B={batch} {precision}"
        if args.only and args.only not in name:
            continue
        logdir = os.path.join(args.work, f"case{n}")
        shutil.rmtree(logdir, ignore_errors=True)
        os.makedirs(logdir)
        try:
            expected = schedule_issues(args, per_node, plan, accum, batch, precision)
            secs = launch(args, per_node, plan, accum, batch, precision, logdir, seed=n)
            lines = check_logs(logdir, per_node, expected)
            print(f"ok    {name}: {lines} issues per rank, {len(expected)} per step, {secs:.1f} s",
                  flush=True)
            passed += 1
        except eq.Failure as e:
            print(f"FAIL  {name}: {e}", flush=True)
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
