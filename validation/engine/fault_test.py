#!/usr/bin/env python3
"""The rank that hangs a job, or issues the wrong collective, is named: faults injected.

Each run trains the tiny preset on 8 ranks (plan zero3, whose groups are all 8 ranks, and
mics:4, whose groups of 4 and 2 chain the gradient reductions across groups, in turns of
four runs) and injects one fault through AMSP_FAULT
(src/core/fault.h) on a random rank at a random step, cycling through the kinds:

  stop    the rank stops (SIGSTOP) at the start of the step
  spin    its main thread loops forever there, its other threads alive
  skip    it drops one collective of the step (a random one of its first 12)
  short   it issues one collective with one element fewer

A run passes when the job ends, non-zero, within --comm-timeout + 10 s of the fault
(measured from the moment the step before it was reported, so the figure errs long),
with at least one 'amsp: error:' line, and every error line that names culprits
naming exactly the rank the fault was injected on, with its node and local rank: a
'hang:' line for stop and spin (comm/watchdog.h), a 'mismatch' line for skip and short
(comm/mismatch.h). A verdict that names any other rank fails the run.

  fault_test.py AMSP MPIEXEC DATA WORK [--runs 20] [--seed S]      mpiexec -n 8
  fault_test.py AMSP MPIEXEC DATA WORK --slurm SCRIPTS [--runs 8]  srun -N 4 on a local
                                                                   Slurm cluster
  fault_test.py AMSP MPIEXEC DATA WORK --device cuda [--runs 4]     the CUDA backend on its
        emulation (NCCL), whose mismatch check runs beside the op (the emulated NCCL
        hangs in a mismatched op, as NCCL would)

Prints one line per run and a table: kind, rank, step, seconds from the fault to the
end, verdict.
"""
import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

RANKS = 8
TIMEOUT_S = 3          # --comm-timeout
GRACE_S = 10           # the job must end within TIMEOUT_S + GRACE_S of the fault
START_S = 120          # for the job to reach the step before the fault (a precondition)
KINDS = ["stop", "spin", "skip", "short"]
EXPECT = {"stop": "hang", "spin": "hang", "skip": "mismatch", "short": "mismatch"}


def fault_spec(kind, rank, step, index):
    if kind == "stop":
        return f"train.step@{step}:{rank},STOP"
    if kind == "spin":
        return f"train.step@{step}:{rank},SPIN"
    return f"collective@{step}:{rank},{kind.upper()}={index}"


def named_ranks(line):
    """The ranks an error line blames, with the node and local rank it gives for each."""
    if ": hang: " in line:
        return {int(m[1]): (m[2], int(m[3])) for m in
                re.finditer(r"rank (\d+) \(([^,]+), local (\d+)\) (?:did not answer|never reached|is in no collective)",
                            line)}
    if ": mismatch in " in line:
        head = line.split(" where ")[0]
        return {int(m[1]): (m[2], int(m[3])) for m in re.finditer(r"rank (\d+) \(([^,]+), local (\d+)\) issued", head)}
    return None


def verdict(kind, victim, where, err_lines):
    """Why the run's error lines do not name the victim as they should ("" if they do)."""
    errors = [l for l in err_lines if l.startswith("amsp: error:")]
    if not errors:
        return "no 'amsp: error:' line"
    blamed = [(l, named_ranks(l)) for l in errors]
    blamed = [(l, n) for l, n in blamed if n is not None]
    if not blamed:
        return f"no error line names a rank: {errors[0]!r}"
    for line, names in blamed:
        expect = EXPECT[kind]
        if f": {expect}" not in line:
            return f"expected a '{expect}' line for {kind}: {line!r}"
        if set(names) != {victim}:
            return f"named ranks {sorted(names)}, the fault was on rank {victim}: {line!r}"
        if names[victim] != where:
            return f"named rank {victim} on {names[victim]}, it runs on {where}: {line!r}"
    return ""


def lines_in(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def one_run(args, launch, where_of, i, kind, victim, step, index, plan):
    metrics = os.path.join(args.work, f"run{i}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = launch + [args.amsp, "train", "--model", "tiny", "--data", args.data, "--steps", "40",
                    "--seq-len", "32", "--batch-size", "1", "--shard", plan, "--eval-every", "0",
                    "--peak-tflops", "1", "--threads", "1", "--comm-timeout", str(TIMEOUT_S),
                    "--metrics", metrics]
    env = dict(args.env, AMSP_FAULT=fault_spec(kind, victim, step, index))
    if args.device == "cuda":
        cmd += ["--device", "cuda", "--precision", "bf16"]
        env["AMSP_CUDA_EMULATION"] = "1"
    t_start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    # The fault comes right after the report of the step before it.
    t_fault = None
    while proc.poll() is None and time.time() < t_start + START_S:
        if t_fault is None and lines_in(metrics) >= step - 1:
            t_fault = time.time()
        if t_fault is not None and time.time() > t_fault + TIMEOUT_S + GRACE_S + 20:
            break
        time.sleep(0.02)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    t_end = time.time()
    lines = [l for l in err.splitlines() if l.strip()]
    took = None if t_fault is None else t_end - t_fault
    why = ""
    if t_fault is None:
        why = f"the job never reported step {step - 1}"
    elif proc.returncode == 0:
        why = "the job ended with exit code 0"
    elif took > TIMEOUT_S + GRACE_S:
        why = f"the job ended {took:.1f} s after the fault, bound {TIMEOUT_S + GRACE_S} s"
    if not why:
        why = verdict(kind, victim, where_of(victim), lines)
    return took, why, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("amsp")
    ap.add_argument("mpiexec")
    ap.add_argument("data")
    ap.add_argument("work")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--shard", help="the plan of every run (default: zero3 and mics:4 in turns of 4 runs)")
    ap.add_argument("--slurm", help="slurm/local-cluster: run under srun on a local Slurm cluster")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()
    args.amsp, args.data, args.work = map(os.path.abspath, (args.amsp, args.data, args.work))
    os.makedirs(args.work, exist_ok=True)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed} (--seed {seed} repeats these runs)")
    args.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "PMI_", "HYDRA_"))}
    if args.slurm:
        return under_slurm(args, rng)
    host = socket.gethostname()
    return run_all(args, rng, [args.mpiexec, "-n", str(RANKS)], lambda r: (host, r))


def run_all(args, rng, launch, where_of):
    results = []
    for i in range(args.runs):
        kind = KINDS[i % len(KINDS)]
        victim, step, index = rng.randrange(RANKS), rng.randrange(3, 9), rng.randrange(12)
        plan = args.shard or ["zero3", "mics:4"][(i // len(KINDS)) % 2]
        took, why, lines = one_run(args, launch, where_of, i, kind, victim, step, index, plan)
        results.append((kind, plan, victim, step, took, why))
        print(f"{'ok  ' if not why else 'FAIL'} run {i}: {plan}, {fault_spec(kind, victim, step, index)}: "
              f"{'no end' if took is None else f'ended {took:.1f} s after the fault'}{': ' + why if why else ''}",
              flush=True)
        for l in [l for l in lines if l.startswith("amsp: error:")][:2]:
            print(f"     {l}")
    print("\n| kind | plan | rank | step | seconds from fault to end | verdict |\n|---|---|---|---|---|---|")
    for kind, plan, victim, step, took, why in results:
        print(f"| {kind} | {plan} | {victim} | {step} | {'-' if took is None else f'{took:.1f}'} | {why or 'named'} |")
    failed = sum(1 for r in results if r[-1])
    print(f"\n{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def under_slurm(args, rng):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "slurm"))
    import local_cluster as lc
    if lc.missing():
        print(f"SKIP: needs root and Slurm + munge (missing: {lc.missing()})")
        return 77
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    with lc.local_cluster(os.path.abspath(args.slurm), os.path.join(args.work, "cluster")) as conf:
        args.env = lc.clean_env({"SLURM_CONF": conf})
        launch = ["srun", "--mpi=pmi2", "--time=3", "-N", "4", "--ntasks-per-node=2", "--kill-on-bad-exit=1"]
        # Block distribution: ranks 0-1 on n1, 2-3 on n2, ...
        return run_all(args, rng, launch, lambda r: (f"n{r // 2 + 1}", r % 2))


if __name__ == "__main__":
    sys.exit(main())
