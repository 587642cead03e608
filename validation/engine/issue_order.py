"""Every rank issues every collective of a step in the schedule's one order.

Used by validation/engine/equivalence_test.py (mpi mode): each case's run also sets
AMSP_COMM_ISSUE_LOG, so each rank writes the (group, op, count) of every op it issues, in
issue order, and each rank's communication thread sleeps a different random 0-POLL_MAX_US
between polls (AMSP_COMM_POLL), so collectives complete in a different order on every rank
and every run. Required of the logs:

  - every rank's log is the same, line for line: per communicator the same sequence on
    every member, and the same order across communicators;
  - outside the evaluations (forward-only parameter all-gathers), the log is the step's
    issue order as `amsp plan --schedule` prints it for that plan and batch, once per step.

See doc/engine-tests.md ("One issue order").
"""

import os
import random
import re

POLL_MAX_US = 300


def env_and_wrapper(logdir, ranks, seed):
    """Environment additions and a command prefix (to go after `mpiexec -n N`) that log
    every issued op into logdir and slow each rank's poller by its own random time."""
    rng = random.Random(seed)
    env = {"AMSP_COMM_ISSUE_LOG": logdir}
    for r in range(ranks):
        env[f"AMSP_TEST_POLL_{r}"] = str(rng.randrange(0, POLL_MAX_US + 1))
    # PMI_RANK is set by mpiexec (hydra) for each rank.
    wrapper = ["sh", "-c", 'eval "export AMSP_COMM_POLL=\\$AMSP_TEST_POLL_$PMI_RANK"; exec "$@"', "sh"]
    return env, wrapper


def schedule_command(amsp, model, per_node, nodes, plan, accum, batch, seq, precision, extra=()):
    """`amsp plan --schedule` for a training run of `nodes` x `per_node` ranks, each with
    `accum` micro-batches of `batch` sequences of `seq` tokens a step; `extra`: options both
    commands take (--prefetch-units, --reduction-slots)."""
    return [amsp, "plan", "--model", model, "--gpus-per-node", str(per_node), "--nodes", str(nodes),
            "--seq-len", str(seq), "--micro-batch", str(batch), "--precision", precision,
            "--global-batch", str(seq * batch * accum * per_node * nodes), "--shard", plan, "--schedule", *extra]


def schedule_issues(run, amsp, per_node, plan, accum, batch, seq, precision, model="tiny", extra=()):
    """The step's issue order from `amsp plan --schedule`, as log lines without dtype.
    run(cmd) -> (rc, out, err, seconds). Raises ValueError naming a failure."""
    cmd = schedule_command(amsp, model, per_node, 1, plan, accum, batch, seq, precision, extra)
    rc, out, err, _ = run(cmd)
    if rc != 0:
        raise ValueError(f"amsp plan --schedule failed: {err.strip()}")
    lines = out.split("Issue order, the same on every rank:\n", 1)[1].splitlines()
    return [re.sub(r"^\s*\d+\. ", "", x) for x in lines if x.strip()]


def read_logs(logdir, ranks):
    logs = []
    for r in range(ranks):
        with open(os.path.join(logdir, f"issues.{r}")) as f:
            # "P all_gather 16384 fp32" -> "P all_gather 16384" (the schedule's form)
            logs.append([" ".join(line.split()[:3]) for line in f if line.strip()])
    return logs


def is_eval_op(line):
    return line.startswith("P all_gather")


def check_logs(logdir, ranks, expected, steps):
    """Returns the number of issues per rank; raises ValueError naming the first
    difference between ranks or against the schedule."""
    logs = read_logs(logdir, ranks)
    for r in range(1, ranks):
        if logs[r] != logs[0]:
            i = next((k for k, (a, b) in enumerate(zip(logs[0], logs[r])) if a != b),
                     min(len(logs[0]), len(logs[r])))
            got = logs[r][i] if i < len(logs[r]) else "end of log"
            want = logs[0][i] if i < len(logs[0]) else "end of log"
            raise ValueError(f"rank {r} issue #{i + 1} is '{got}', rank 0's '{want}'")
    log, n, i, found = logs[0], len(expected), 0, 0
    while i < len(log):
        if log[i:i + n] == expected:
            i, found = i + n, found + 1
        elif is_eval_op(log[i]):
            i += 1
        else:
            # Not an evaluation and no step starts here: name the first difference from
            # the schedule's step.
            k = next((k for k in range(n) if i + k >= len(log) or log[i + k] != expected[k]), 0)
            got = log[i + k] if i + k < len(log) else "end of log"
            raise ValueError(f"issue #{i + k + 1} is '{got}', the schedule's #{k + 1} of step "
                             f"{found + 1} is '{expected[k]}'")
    if found != steps:
        raise ValueError(f"the schedule's step was found {found} times in the log, expected {steps}")
    return len(log)
