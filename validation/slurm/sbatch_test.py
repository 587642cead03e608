#!/usr/bin/env python3
"""slurm/train.sbatch and slurm/scaling-study.sh on a real local Slurm cluster.

Each mode starts its own cluster of 4 virtual nodes x 2 CPUs (slurm/local-cluster/start.sh,
on ports found free by local_cluster.py) and always stops it. Jobs are submitted with
sbatch exactly as a user would, from a submit directory under --work, with AMSP_BIN and
AMSP_DATA in the environment. Every run is the tiny preset, --batch-size 2 --seq-len 32 --peak-tflops 1.

job       the script's refusals and one 2-node training job:
            - outside an allocation it exits 2 with one line naming SLURM_JOB_ID;
            - a job with a missing dataset ends with exit code 2 and one error line;
            - sbatch train.sbatch with the script's own #SBATCH defaults (2 nodes x 2 ranks,
              log amsp-<id>.out in the submit directory, run directory runs/amsp-<id>):
              exit code 0; job.log names the job, its nodes and switches; the amsp record
              (attempt-<id>.0.json) holds the Slurm job id, the node list, the topology the
              ranks saw (4 ranks, 2 per node, switch paths from topology.conf) and the plan;
              every step once in metrics.jsonl; the final checkpoint passes amsp ckpt verify;
            - one rank of a running job killed with SIGKILL: the whole job ends within
              KillWait (srun --kill-on-bad-exit, then SIGKILL) with a failure exit code, and no
              rank is left;
            - then, on a second cluster whose job ids start again at 1: a new job with the
              earlier job's id finds its default run directory owned by that run (run.json)
              and is refused (exit 2, one line naming both, nothing there touched); the
              directory given on purpose (AMSP_RUN_DIR) continues the run, same run id.
preempt   a stop request at every moment of a job's life: one uninterrupted run and eight
          interrupted ones, 2 nodes x 1 rank, zero3, 100 steps, all submitted at once:
            A  scancel --batch --signal=USR1 (what Slurm's --signal=B:USR1 sends) after 12
               steps: the script forwards it, amsp checkpoints and exits 75, the script
               requeues the job;
            B  scontrol requeue: Slurm sends SIGTERM, amsp checkpoints and exits 75, Slurm
               requeues the job;
            C  the time limit: submitted with --time=1 --signal=B:USR1@60, so Slurm's own
               warning signal arrives during the run, within 30 s of its start (Slurm's
               timer period; AMSP_FAULT=train.step@2,SLEEP=40 holds the run there until
               the signal, at most 40 s, so that it is still running then on any
               machine); the test lifts the limit of the requeued attempt so that it
               can finish;
            D  USR1 as soon as the batch script runs, before srun starts: the script holds it
               until every rank has its handlers (AMSP_READY_FILE), amsp stops before its
               first step with nothing to save;
            E  USR1 as the script launches srun (MPI_Init, communicator set-up);
            F  USR1 once every rank is up (data loading, first evaluation, first step);
            G  USR1 raised during the checkpoint of step 20 (AMSP_FAULT=save.data@20,USR1);
            H  USR1 raised after the last step (AMSP_FAULT=save.begin@100,USR1): the run
               completes in one attempt.
          Each of A-G must run exactly two attempts of one run id, the second resuming from
          the checkpoint the first wrote when it stopped (or from scratch when it stopped
          before its first step), no rank may die of the signal, and the metrics must hold
          every step exactly once, with the losses, gradient norms, learning rates, token
          counts and validation losses of the uninterrupted run bit for bit.
elastic   a node range (sbatch -N 2-4 --ntasks-per-node=1, AMSP_SHARD=auto, AMSP_GLOBAL_BATCH=256
          tokens, 30 steps): an uninterrupted run on 4 nodes; then "shrink", whose first
          attempt has 4 nodes and is stopped by `scontrol requeuehold` after 10 steps, and
          whose requeued attempt has 2; then "grow", 2 and then 4. Slurm gives such a job its
          minimum whenever that many nodes are free, so the test sets each attempt's count
          on the held job (scontrol update NumNodes, NumTasks) before releasing it. Each run
          must end completed in two attempts with job.log naming both allocations, every
          step once in metrics.jsonl with the uninterrupted run's token counts, no "changed"
          line, and losses within 1e-5 (relative) of it.
scaling   scaling-study.sh over 1, 2 and 4 nodes x 2 ranks for zero3 and auto, one job at a
          time: scaling.csv and scaling.md with six ok rows (2, 4 and 8 GPUs, positive
          throughput and MFU, exposed share in [0, 1], the resolved plans), a PNG plot of the
          expected size, and no two runs overlapping in time. Also --dry-run of the 8..1024
          GPU sweep: ten sbatch commands and nothing submitted.

usage: sbatch_test.py MODE --amsp PATH --data CORPUS.h5 --work DIR [--cluster-scripts DIR]
Prints one line per check and ends with "N passed, M failed"; exit 1 on any failure, 77
(CTest SKIP_RETURN_CODE) without root, Slurm or munge.
"""

import argparse
import csv
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
import equivalence_test as eq  # noqa: E402  (run: a command in its own process group)
import local_cluster as lc  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "ckpt"))
import resume_test as rt  # noqa: E402  (rank_pids: the amsp processes of a run)

SKIP = 77
DEADLINE = 560          # seconds for the whole script, below the CTest TIMEOUT of 600
SMALL = ["--batch-size", "2", "--seq-len", "32", "--peak-tflops", "1"]
KILL_WAIT = 10         # KillWait of the local cluster (slurm/local-cluster/start.sh)
COMPARED = ("loss", "grad_norm", "lr", "tokens", "val_loss")


class Failure(Exception):
    pass


class Cluster:
    """Submits and watches jobs on the local cluster from a submit directory."""

    def __init__(self, args, work, conf):
        self.args, self.work = args, work
        self.submit_dir = os.path.join(work, "submit")
        os.makedirs(self.submit_dir, exist_ok=True)
        self.env = lc.clean_env({"SLURM_CONF": conf, "AMSP_BIN": args.amsp, "AMSP_DATA": args.data})
        self.passed = self.failed = 0
        self.state = {}
        self.seen = {}

    def use(self, conf):
        """Submits to another cluster from now on (the next phase of a mode)."""
        self.env["SLURM_CONF"] = conf
        return self

    def report(self, ok, text, details=()):
        print(f"{'PASS' if ok else 'FAIL'}: {text}", flush=True)
        if not ok:
            for d in details:
                if d:
                    print("      " + str(d)[-3000:].replace("\n", "\n      "))
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def cmd(self, args, env=None, timeout=60):
        rc, out, err, _ = eq.run(args, {**self.env, **(env or {})}, timeout=timeout)
        return rc, out, err

    def sbatch(self, opts, env=None, train_args=()):
        """Submits slurm/train.sbatch from the submit directory; returns the job id."""
        p = subprocess.run(["sbatch", "--parsable", *opts, os.path.join(REPO, "slurm", "train.sbatch"),
                            *train_args], env={**self.env, **(env or {})}, cwd=self.submit_dir,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        if p.returncode != 0:
            raise Failure(f"sbatch {' '.join(opts)} failed: {p.stderr.strip()}")
        return p.stdout.strip().split(";")[0]

    def job(self, jid):
        """scontrol's view of a job as a dict: the last one seen once Slurm has forgotten
        the job (MinJobAge), empty if it never knew it."""
        rc, out, _ = self.cmd(["scontrol", "-o", "show", "job", jid], timeout=20)
        if rc == 0:
            self.seen[jid] = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
        return self.seen.get(jid, {})

    def wait_done(self, jids, timeout):
        """Waits until no job in jids is pending, running or completing."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            states = {j: self.job(j).get("JobState", "GONE") for j in jids}
            if all(s not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "SUSPENDED")
                   for s in states.values()):
                return states
            time.sleep(1)
        raise Failure(f"jobs {' '.join(jids)} still not done after {timeout} s: {states}")

    def log(self, jid, name="amsp"):
        path = os.path.join(self.submit_dir, f"{name}-{jid}.out")
        return open(path, errors="replace").read() if os.path.exists(path) else ""


def read_jsonl(path):
    """The complete records of a JSON Lines file that a running job may be appending to:
    a last line without its newline is a record still being written, left for later."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip() and l.endswith("\n")]


def step_records(path):
    return [r for r in read_jsonl(path) if "loss" in r]


def read_json(path):
    with open(path) as f:
        return json.load(f)


def attempts(run_dir):
    """The amsp records of a run directory, in attempt order."""
    def key(p):
        return [int(x) for x in re.findall(r"\d+", os.path.basename(p))]
    return [read_json(p) for p in sorted(glob.glob(os.path.join(run_dir, "attempt-*.json")), key=key)]


def hostnames(cluster, expr):
    rc, out, _ = cluster.cmd(["scontrol", "show", "hostnames", expr], timeout=20)
    return out.split() if rc == 0 else []


# --------------------------------------------------------------------------- job
def mode_job(c):
    # Outside an allocation: refused in one line.
    rc, out, err = c.cmd(["bash", os.path.join(REPO, "slurm", "train.sbatch")])
    lines = [l for l in err.splitlines() if l.strip()]
    c.report(rc == 2 and len(lines) == 1 and "SLURM_JOB_ID" in lines[0] and "sbatch" in lines[0],
             f"outside an allocation: exit {rc}, {lines[0] if lines else '(no message)'}", [out, err])

    bad = c.sbatch(["-N", "1", "--ntasks-per-node=1", "--job-name=bad"],
                   env={"AMSP_DATA": os.path.join(c.work, "nosuch.h5")})
    steps = 12
    jid = c.sbatch([], env={"AMSP_SHARD": "p=1,g=2x1,os=2x2"},
                   train_args=["--steps", str(steps), "--eval-every", "6", "--eval-windows", "8", *SMALL])
    c.wait_done([bad, jid], 180)

    info = c.job(bad)
    log = c.log(bad, "bad")
    errors = [l for l in log.splitlines() if "error" in l]
    c.report(info.get("ExitCode") == "2:0" and len(errors) == 1 and "nosuch.h5: no such file" in errors[0],
             f"a job with a missing dataset: ExitCode {info.get('ExitCode')}, "
             f"{errors[0] if errors else '(no error line)'}", [log])

    info = c.job(jid)
    log = c.log(jid)
    run_dir = os.path.join(c.submit_dir, "runs", f"amsp-{jid}")
    problems = []
    if info.get("ExitCode") != "0:0":
        problems.append(f"ExitCode {info.get('ExitCode')}")
    if info.get("NumNodes") != "2" or info.get("NumTasks") != "4":
        problems.append(f"{info.get('NumNodes')} nodes, {info.get('NumTasks')} tasks (expected the "
                        "script's #SBATCH defaults: 2 nodes x 2)")
    if "train.sbatch: training completed" not in log:
        problems.append("no 'training completed' in the log")
    nodelist = info.get("NodeList", "")
    names = hostnames(c, nodelist)
    joblog = open(os.path.join(run_dir, "job.log")).read() if os.path.exists(os.path.join(run_dir, "job.log")) else ""
    leaves = {}
    for n in names:
        leaves.setdefault("s1" if n in ("n1", "n2") else "s2", []).append(n)
    switches = "; ".join(f"{s}: {' '.join(ns)}" for s, ns in sorted(leaves.items()))
    if f"== attempt 0 of job {jid}" not in joblog or nodelist not in joblog or \
            f"switches:       {switches}\n" not in joblog:
        problems.append(f"job.log does not name the job, its node list and its switches ({switches})")
    recs = attempts(run_dir)
    rec = recs[-1] if recs else {}
    slurm = rec.get("slurm") or {}
    topo = rec.get("topology") or {}
    seen = [n.get("name") for n in topo.get("nodes", [])]
    paths = [n.get("switch_path") for n in topo.get("nodes", [])]
    expect_paths = ["top.s1" if n in ("n1", "n2") else "top.s2" for n in seen]
    if slurm.get("job_id") != jid or slurm.get("nodelist") != nodelist:
        problems.append(f"record's slurm {slurm}")
    if (rec.get("world_size"), rec.get("num_nodes"), rec.get("ranks_per_node")) != (4, 2, 2) or \
            topo.get("source") != "slurm" or sorted(seen) != sorted(names) or paths != expect_paths:
        problems.append(f"record's topology {topo}")
    if rec.get("plan") != "p=1x1,g=2x1,os=2x2":
        problems.append(f"record's plan {rec.get('plan')}")
    result = rec.get("result") or {}
    if result.get("status") != "completed" or result.get("last_step") != steps or not result.get("peak_rss_bytes"):
        problems.append(f"record's result {result}")
    got = [r["step"] for r in step_records(os.path.join(run_dir, "metrics.jsonl"))]
    if got != list(range(1, steps + 1)):
        problems.append(f"metrics steps {got}")
    ck = os.path.join(run_dir, "checkpoints", f"step-{steps:08d}.h5")
    rc, out, err = c.cmd([c.args.amsp, "ckpt", "verify", ck])
    if rc != 0:
        problems.append(f"amsp ckpt verify {ck}: exit {rc} {err.strip()}")
    c.state["run"] = (jid, run_dir, steps)
    c.report(not problems,
             f"2-node job {jid} through train.sbatch's defaults on {nodelist} ({' '.join(f'{n}[{p}]' for n, p in zip(seen, paths))}): "
             f"plan {rec.get('plan')}, {len(got)} steps, checkpoint verified"
             + (f"; {'; '.join(problems)}" if problems else ""), [log[-3000:], joblog])


    # One rank killed: srun (--kill-on-bad-exit) ends the step. The other ranks take its
    # SIGTERM as a stop request but cannot finish a step without the dead rank, so they
    # end at KillWait (10 s on the local cluster) with SIGKILL: bounded, instead of waiting for the collective
    # timeout (600 s).
    jid = c.sbatch(["--job-name=crash"], env={"AMSP_SHARD": "zero3"},
                   train_args=["--steps", "3000", "--eval-every", "0", *SMALL])
    run_dir = os.path.join(c.submit_dir, "runs", f"crash-{jid}")
    t_end = time.time() + 120
    while len(step_records(os.path.join(run_dir, "metrics.jsonl"))) < 5 and time.time() < t_end:
        time.sleep(0.2)
    pids = rt.rank_pids(run_dir)
    if len(pids) != 4:
        raise Failure(f"crash test: found {len(pids)} amsp ranks of job {jid}, not 4")
    os.kill(pids[-1], signal.SIGKILL)
    t0 = time.time()
    c.wait_done([jid], 120)
    secs = time.time() - t0
    info = c.job(jid)
    left = rt.rank_pids(run_dir)
    code = open(os.path.join(run_dir, "exit-code")).read().strip() if os.path.exists(
        os.path.join(run_dir, "exit-code")) else "?"
    c.report(secs < KILL_WAIT + 20 and info.get("ExitCode") not in (None, "0:0") and code not in ("0", "75") and not left,
             f"one rank of job {jid} killed (SIGKILL): the job ended {secs:.1f} s later (KillWait is {KILL_WAIT} s) with ExitCode "
             f"{info.get('ExitCode')} (script exit {code}), no rank left", [c.log(jid, "crash")[-2000:]])


def tree_digest(path):
    """Every file under path with its size and modification time."""
    return {os.path.relpath(os.path.join(d, f), path): (os.stat(os.path.join(d, f)).st_size,
                                                       os.stat(os.path.join(d, f)).st_mtime_ns)
            for d, _, files in os.walk(path) for f in files}


def mode_job_ids_repeat(c):
    """On a new cluster whose job ids start again at 1: a new job whose default run
    directory holds the earlier run is refused and touches nothing there; the same
    directory given on purpose (AMSP_RUN_DIR) continues that run."""
    old_jid, run_dir, steps = c.state["run"]
    before = tree_digest(run_dir)
    identity = read_json(os.path.join(run_dir, "run.json"))
    filler = "0"
    while int(filler) < int(old_jid) - 1:  # quick failing jobs until the next id is the old one
        filler = c.sbatch(["-N", "1", "--ntasks-per-node=1", "--job-name=filler"],
                          env={"AMSP_DATA": os.path.join(c.work, "nosuch.h5")})
    new = c.sbatch([], env={"AMSP_SHARD": "p=1,g=2x1,os=2x2"},
                   train_args=["--steps", str(steps), "--eval-every", "6", "--eval-windows", "8", *SMALL])
    c.wait_done([new], 120)
    info = c.job(new)
    errors = [l for l in c.log(new).splitlines() if "train.sbatch: error:" in l]
    ok = new == old_jid and info.get("ExitCode") == "2:0" and len(errors) == 1 and \
        f"belongs to run {identity.get('run_id')}" in errors[0] and "AMSP_RUN_DIR" in errors[0] and \
        tree_digest(run_dir) == before
    c.report(ok, f"job ids repeat: new job {new} (earlier job {old_jid}) finds runs/amsp-{old_jid}: ExitCode "
             f"{info.get('ExitCode')}, {errors[-1] if errors else '(no error line)'}; the earlier run's files "
             f"{'untouched' if tree_digest(run_dir) == before else 'CHANGED'}", [c.log(new)[-2000:]])

    # Given on purpose: the run continues, two steps further.
    again = c.sbatch(["--job-name=again"], env={"AMSP_SHARD": "p=1,g=2x1,os=2x2", "AMSP_RUN_DIR": run_dir},
                     train_args=["--steps", str(steps + 2), "--eval-every", "6", "--eval-windows", "8", *SMALL])
    c.wait_done([again], 120)
    log = c.log(again, "again")
    rec = read_json(os.path.join(run_dir, f"attempt-{again}.0.json")) if os.path.exists(
        os.path.join(run_dir, f"attempt-{again}.0.json")) else {}
    ok = c.job(again).get("ExitCode") == "0:0" and "continuing it as asked" in log and \
        rec.get("run_id") == identity.get("run_id") and str(rec.get("resumed_from") or "").endswith(f"step-{steps:08d}.h5") \
        and (rec.get("result") or {}).get("last_step") == steps + 2
    c.report(ok, f"AMSP_RUN_DIR={os.path.relpath(run_dir, c.submit_dir)} given on purpose (job {again}): "
             f"ExitCode {c.job(again).get('ExitCode')}, run id {rec.get('run_id')}, resumed from "
             f"{os.path.basename(str(rec.get('resumed_from')))}, trained to step {(rec.get('result') or {}).get('last_step')}",
             [log[-2000:]])


# ----------------------------------------------------------------------- preempt
# The interrupted runs: how each is stopped, and when the test acts (None: it stops itself,
# through AMSP_FAULT, or Slurm does).
PREEMPT_STEPS, PREEMPT_AT, PREEMPT_SAVE = 100, 12, 20
PREEMPT_CASES = {
    "A": (f"scancel --batch --signal=USR1 after {PREEMPT_AT} steps", "usr1"),
    "B": (f"scontrol requeue after {PREEMPT_AT} steps", "requeue"),
    "C": ("the time limit's warning (--signal=B:USR1@60)", "timelimit"),
    "D": ("USR1 as soon as the batch script runs (before srun starts)", "atonce"),
    "E": ("USR1 as srun starts (MPI_Init, communicator set-up)", "atlaunch"),
    "F": ("USR1 once every rank is up (data loading, first evaluation, first step)", "atready"),
    "G": (f"USR1 during the checkpoint of step {PREEMPT_SAVE} (AMSP_FAULT=save.data@{PREEMPT_SAVE},USR1)", "atsave"),
    "H": (f"USR1 after the last step (AMSP_FAULT=save.begin@{PREEMPT_STEPS},USR1)", "atend"),
}


def submit_preempt_jobs(c):
    train = ["--steps", str(PREEMPT_STEPS), "--eval-every", "50", "--eval-windows", "8",
             "--checkpoint-every", "10", *SMALL]
    env = {"AMSP_SHARD": "zero3"}
    # C: Slurm checks time limits every 30 s, so its warning may come up to 30 s after
    # the start; a wait at step 2 of up to 40 s, which the signal ends, keeps the job
    # running until then on any machine.
    extra_env = {"C": {"AMSP_FAULT": "train.step@2,SLEEP=40"},
                 "G": {"AMSP_FAULT": f"save.data@{PREEMPT_SAVE},USR1"},
                 "H": {"AMSP_FAULT": f"save.begin@{PREEMPT_STEPS},USR1"}}
    # 2 nodes x 1 rank: nine jobs at once on 2 cores.
    layout = ["-N", "2", "--ntasks-per-node=1"]
    ids = {"ref": c.sbatch(["--job-name=ref", *layout], env=env, train_args=train)}
    for k, (_, name) in PREEMPT_CASES.items():
        opts = [f"--job-name={name}", *layout] + (["--time=1", "--signal=B:USR1@60"] if k == "C" else [])
        ids[k] = c.sbatch(opts, env={**env, **extra_env.get(k, {})}, train_args=train)
    return ids


def preempt_trigger(c, k, jid, run_dir, name):
    """The test's action for case k once its moment has come; None while it has not."""
    info = c.job(jid)
    if info.get("Restarts", "0") != "0":
        return None  # only the first attempt is interrupted
    steps_done = len(step_records(os.path.join(run_dir, "metrics.jsonl")))
    due = {"A": steps_done >= PREEMPT_AT, "B": steps_done >= PREEMPT_AT,
           # D: as soon as the batch script runs (its first line), before srun. Not
           # before bash has started: no script can catch a signal that comes first.
           "D": info.get("JobState") == "RUNNING" and "the batch script started" in c.log(jid, name),
           "E": "attempt 0: " in c.log(jid, name),
           "F": os.path.exists(os.path.join(run_dir, f".ready-{jid}.0"))}.get(k, False)
    if not due:
        return None
    return ["scontrol", "requeue", jid] if k == "B" else ["scancel", "--batch", "--signal=USR1", jid]


def run_preempt_jobs(c, ids, run_dir):
    acted = {k: k not in "ABDEF" for k in PREEMPT_CASES}
    lifted = False
    deadline = time.time() + 420
    while time.time() < deadline:
        for k in PREEMPT_CASES:
            cmd = None if acted[k] else preempt_trigger(c, k, ids[k], run_dir[k], PREEMPT_CASES[k][1])
            if cmd:
                rc, out, err = c.cmd(cmd)
                if rc != 0 and k != "D":  # D: the batch step may not be up yet; try again
                    raise Failure(f"{' '.join(cmd)}: exit {rc} {err.strip()}")
                acted[k] = rc == 0
        # C: once Slurm has requeued it, give the next attempt room to finish.
        if not lifted and c.job(ids["C"]).get("Restarts", "0") != "0":
            rc, out, err = c.cmd(["scontrol", "update", f"JobId={ids['C']}", "TimeLimit=10"])
            if rc != 0:
                raise Failure(f"scontrol update TimeLimit of job {ids['C']}: {err.strip()}")
            lifted = True
        states = [c.job(j).get("JobState", "GONE") for j in ids.values()]
        if all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE") for s in states) and all(acted.values()):
            return
        time.sleep(0.3)
    raise Failure(f"preemption jobs not done after 420 s: {({k: c.job(j).get('JobState') for k, j in ids.items()})}")


def attempt_problems(recs, steps):
    """What is wrong with a stopped-then-resumed run's attempt records."""
    if len(recs) != 2:
        return [f"{len(recs)} attempts, expected 2"], None
    problems = []
    first, second = recs[0].get("result") or {}, recs[1].get("result") or {}
    stop_step = first.get("last_step")
    if first.get("status") != "stopped" or first.get("exit_code") != 75 or not (0 <= (stop_step or 0) < steps):
        problems.append(f"first attempt's result {first}")
    expect_from = f"step-{stop_step:08d}.h5" if stop_step else None
    got_from = recs[1].get("resumed_from")
    if (str(got_from or "").endswith(expect_from) if expect_from else got_from is None) is False or \
            recs[1].get("first_step") != (stop_step or 0) + 1:
        problems.append(f"second attempt resumed from {got_from} at step {recs[1].get('first_step')}, "
                        f"not {expect_from or 'scratch'}")
    if second.get("status") != "completed" or second.get("last_step") != steps:
        problems.append(f"second attempt's result {second}")
    if recs[0].get("run_id") is None or recs[0].get("run_id") != recs[1].get("run_id"):
        problems.append(f"run ids {recs[0].get('run_id')} and {recs[1].get('run_id')}")
    return problems, stop_step


def mode_preempt(c):
    steps = PREEMPT_STEPS
    ids = submit_preempt_jobs(c)
    names = {"ref": "ref", **{k: name for k, (_, name) in PREEMPT_CASES.items()}}
    run_dir = {k: os.path.join(c.submit_dir, "runs", f"{names[k]}-{j}") for k, j in ids.items()}
    run_preempt_jobs(c, ids, run_dir)

    ref = {r["step"]: r for r in step_records(os.path.join(run_dir["ref"], "metrics.jsonl"))}
    ref_ok = sorted(ref) == list(range(1, steps + 1)) and c.job(ids["ref"]).get("ExitCode") == "0:0"
    c.report(ref_ok, f"uninterrupted run {ids['ref']}: {len(ref)} steps, ExitCode {c.job(ids['ref']).get('ExitCode')}",
             [c.log(ids["ref"], "ref")[-2000:]])
    if not ref_ok:
        return
    for k, (how, name) in PREEMPT_CASES.items():
        jid, d = ids[k], run_dir[k]
        log = c.log(jid, name)
        joblog = open(os.path.join(d, "job.log")).read() if os.path.exists(os.path.join(d, "job.log")) else ""
        problems = []
        if c.job(jid).get("ExitCode") != "0:0" or open(os.path.join(d, "exit-code")).read().strip() != "0":
            problems.append(f"ExitCode {c.job(jid).get('ExitCode')}")
        recs = attempts(d)
        if k == "H":  # after the last step there is nothing left to stop: the run completes
            stop_step = None
            result = (recs[0].get("result") or {}) if len(recs) == 1 else {}
            if result.get("status") != "completed" or result.get("last_step") != steps:
                problems.append(f"{len(recs)} attempts, the first's result {result}; expected one, completed")
        else:
            more, stop_step = attempt_problems(recs, steps)
            problems += more
        expect_log = {"B": ["received SIGTERM", "clean stop on SIGTERM"], "G": ["clean stop:", "requeueing job"],
                      "H": ["training completed"]}.get(k, ["received SIGUSR1", "clean stop:", "requeueing job"])
        problems += [f"no '{text}' in the log" for text in expect_log if text not in log]
        # The closing lines count each attempt's own steps beside the run's.
        first = (stop_step or 0) + 1
        closing = ([f"stopped: this attempt trained {f'steps 1-{stop_step} ({stop_step})' if stop_step else 'no steps'} in "]
                   if k != "H" else []) + \
            [f"done: this attempt trained steps {first}-{steps} ({steps - first + 1}) in ",
             f"; the run: {steps} of {steps} steps"]
        problems += [f"no closing line '{text}...'" for text in closing if text not in log]
        if "User defined signal" in log:
            problems.append("a rank was killed by SIGUSR1")
        recs_m = step_records(os.path.join(d, "metrics.jsonl"))
        got = [r["step"] for r in recs_m]
        if got != list(range(1, steps + 1)):
            dup = sorted({s for s in got if got.count(s) > 1})
            problems.append(f"metrics hold {len(got)} step records (repeated: {dup[:5]}, missing: "
                            f"{sorted(set(range(1, steps + 1)) - set(got))[:5]})")
        diffs = [f"step {r['step']} {f}: {r.get(f)} vs {ref[r['step']].get(f)}"
                 for r in recs_m if r["step"] in ref for f in COMPARED if r.get(f) != ref[r["step"]].get(f)]
        if diffs:
            problems.append(f"{len(diffs)} differences from the uninterrupted run, first: {diffs[0]}")
        # C, stopped in step 2's wait of up to 40 s (the warning may also come sooner, before
        # step 2, whose wait then runs whole in the next attempt): the signal ended the wait,
        # so the attempt lasted less than the wait alone would have.
        secs = (recs[0].get("result") or {}).get("seconds", 0) if recs else 0
        if k == "C" and stop_step == 2 and secs >= 40:
            problems.append(f"its first attempt took {secs:.1f} s: the signal did not end its AMSP_FAULT wait of 40 s")
        c.report(not problems,
                 f"{k}  {how} (job {jid}): "
                 + ("completed" if k == "H" else f"stopped after step {stop_step}, requeued, resumed") + "; "
                 f"{len(got)} step records, each once, bit-identical to the uninterrupted run"
                 + (f"; {'; '.join(problems)}" if problems else ""), [log[-3000:], joblog])


# ----------------------------------------------------------------------- elastic
# A node range: sbatch -N 2-4 --ntasks-per-node=1. Slurm derives the task count of such a
# job from its minimum, so it starts it on 2 nodes whenever 2 are free; which count an
# attempt gets is the scheduler's, so the test sets it: each attempt is released from a
# hold with the job's NumNodes updated to the count wanted (as a site's scheduler or an
# administrator would change it), the first attempt is stopped after ELASTIC_AT steps by
# `scontrol requeuehold` (SIGTERM: amsp checkpoints and exits 75, Slurm requeues and holds).
ELASTIC_STEPS, ELASTIC_AT, ELASTIC_SEQ = 30, 10, 32
ELASTIC_TOKENS = 4 * 2 * ELASTIC_SEQ      # 4 ranks x batch 2 on the widest allocation
ELASTIC_LOSS_RTOL = 1e-5                  # fp32, reductions over 4 ranks against 2


def scontrol(c, *args):
    rc, out, err = c.cmd(["scontrol", *args])
    if rc != 0:
        raise Failure(f"scontrol {' '.join(args)}: exit {rc} {err.strip()}")


def elastic_submit(c, name, nodes, hold=False):
    env = {"AMSP_SHARD": "auto", "AMSP_GLOBAL_BATCH": str(ELASTIC_TOKENS)}
    train = ["--steps", str(ELASTIC_STEPS), "--eval-every", "0", "--checkpoint-every", "5",
             "--seq-len", str(ELASTIC_SEQ), "--batch-size", "2", "--peak-tflops", "1"]
    return c.sbatch([f"--job-name={name}", "-N", nodes, "--ntasks-per-node=1"] + (["--hold"] if hold else []),
                    env=env, train_args=train)


def release_on(c, jid, nodes):
    """A held job, given `nodes` nodes for its next attempt and released."""
    # One rank per node: the task count goes with the node count (Slurm keeps the last
    # attempt's otherwise, and a job of 4 tasks on 2 nodes is refused: BadConstraints).
    scontrol(c, "update", f"JobId={jid}", f"NumNodes={nodes}-{nodes}", f"NumTasks={nodes}")
    scontrol(c, "release", jid)


def wait_job(c, jid, what, ok, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = c.job(jid)
        if ok(info):
            return info
        time.sleep(0.3)
    raise Failure(f"job {jid} not {what} after {timeout} s: {c.job(jid).get('JobState')} "
                  f"{c.job(jid).get('Reason')}")


def elastic_run(c, name, first_nodes, second_nodes):
    """One interrupted run: the first attempt on first_nodes nodes, the second on second_nodes."""
    jid = elastic_submit(c, name, "2-4", hold=True)
    run_dir = os.path.join(c.submit_dir, "runs", f"{name}-{jid}")
    release_on(c, jid, first_nodes)
    wait_job(c, jid, "running", lambda j: j.get("JobState") == "RUNNING")
    deadline = time.time() + 240
    while len(step_records(os.path.join(run_dir, "metrics.jsonl"))) < ELASTIC_AT:
        if time.time() > deadline or c.job(jid).get("JobState") != "RUNNING":
            raise Failure(f"job {jid} did not reach step {ELASTIC_AT}: {c.job(jid).get('JobState')}")
        time.sleep(0.3)
    scontrol(c, "requeuehold", jid)
    wait_job(c, jid, "requeued and held", lambda j: j.get("JobState") == "PENDING" and
             j.get("Restarts", "0") != "0" and "held" in j.get("Reason", "").lower())
    release_on(c, jid, second_nodes)
    c.wait_done([jid], timeout=300)
    return jid, run_dir


def elastic_check(c, name, jid, run_dir, nodes, ref):
    recs = attempts(run_dir)
    problems, stop_step = attempt_problems(recs, ELASTIC_STEPS)
    joblog = open(os.path.join(run_dir, "job.log")).read() if os.path.exists(os.path.join(run_dir, "job.log")) else ""
    got_nodes = [int(n) for n in re.findall(r"^nodes: +(\d+):", joblog, re.M)]
    if got_nodes != list(nodes):
        problems.append(f"job.log names allocations of {got_nodes} nodes, expected {list(nodes)}")
    plans = [r.get("plan") for r in recs]
    metrics = step_records(os.path.join(run_dir, "metrics.jsonl"))
    steps = [r["step"] for r in metrics]
    if steps != list(range(1, ELASTIC_STEPS + 1)):
        problems.append(f"metrics hold steps {steps[:3]}...{steps[-3:]} ({len(steps)})")
    tokens = [r["tokens"] - ref[r["step"]]["tokens"] for r in metrics if r["step"] in ref]
    if any(tokens):
        problems.append(f"tokens differ from the uninterrupted run's (first difference {next(t for t in tokens if t)})")
    rel = [abs(r["loss"] - ref[r["step"]]["loss"]) / abs(ref[r["step"]]["loss"]) for r in metrics if r["step"] in ref]
    worst = max(rel) if rel else float("inf")
    if worst > ELASTIC_LOSS_RTOL:
        problems.append(f"losses differ from the uninterrupted run's by up to {worst:.2e} (tolerance "
                        f"{ELASTIC_LOSS_RTOL:.0e})")
    log = c.log(jid, name)
    if "changed" in log and "--global-batch" not in log:
        problems.append("the resume warned that the batch changed")
    cumulative = [r["tokens"] for r in metrics]
    per_step = sorted({b - a for a, b in zip([0] + cumulative, cumulative)})
    c.report(not problems, f"{name}: sbatch -N 2-4, attempts on {got_nodes} nodes (plans {plans}), stopped after "
                           f"step {stop_step}, resumed; tokens per step {per_step} (the uninterrupted run: "
                           f"{ELASTIC_TOKENS}), losses within {worst:.1e} of the uninterrupted 4-node run"
                           + (f"; {'; '.join(problems)}" if problems else ""), [log[-3000:], joblog[-2000:]])


def mode_elastic(c):
    ref_id = elastic_submit(c, "eref", "4")
    c.wait_done([ref_id], timeout=300)
    ref_dir = os.path.join(c.submit_dir, "runs", f"eref-{ref_id}")
    ref = {r["step"]: r for r in step_records(os.path.join(ref_dir, "metrics.jsonl"))}
    ok = sorted(ref) == list(range(1, ELASTIC_STEPS + 1)) and c.job(ref_id).get("ExitCode") == "0:0"
    c.report(ok, f"uninterrupted run {ref_id} on 4 nodes: {len(ref)} steps, ExitCode {c.job(ref_id).get('ExitCode')}",
             [c.log(ref_id, "eref")[-2000:]])
    if not ok:
        return
    for name, nodes in (("shrink", (4, 2)), ("grow", (2, 4))):
        jid, run_dir = elastic_run(c, name, *nodes)
        elastic_check(c, name, jid, run_dir, nodes, ref)


# ----------------------------------------------------------------------- scaling
def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])


def mode_scaling(c):
    study = os.path.join(c.work, "study")
    shutil.rmtree(study, ignore_errors=True)
    script = os.path.join(REPO, "slurm", "scaling-study.sh")
    rc, out, err = c.cmd([script, "--nodes", "1 2 4", "--tasks-per-node", "2", "--plans", "zero3 auto",
                          "--data", c.args.data, "--steps", "8", "--batch-size", "2", "--seq-len", "64",
                          "--serial", "--out", study, "--", "--peak-tflops", "1"], timeout=300)
    problems = []
    if rc != 0:
        problems.append(f"exit {rc}")
    rows = list(csv.DictReader(open(os.path.join(study, "scaling.csv")))) if os.path.exists(
        os.path.join(study, "scaling.csv")) else []
    got = [(r["plan"], int(r["nodes"]), int(r["gpus"])) for r in rows]
    want = [(p, n, 2 * n) for p in ("zero3", "auto") for n in (1, 2, 4)]
    if got != want:
        problems.append(f"rows {got}, expected {want}")
    for r in rows:
        try:
            ok = (r["status"] == "ok" and float(r["tokens_per_s_per_gpu"]) > 0 and 0 < float(r["mfu"]) < 1
                  and 0 <= float(r["exposed_comm_share"]) <= 1 and float(r["model_state_mb"]) > 0
                  and float(r["peak_rss_mb"]) > 0 and r["resolved_plan"].startswith("p="))
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"row {r}")
    md = open(os.path.join(study, "scaling.md")).read() if os.path.exists(os.path.join(study, "scaling.md")) else ""
    if md.count("| ok |") != 6:
        problems.append(f"scaling.md has {md.count('| ok |')} ok rows")
    size = png_size(os.path.join(study, "scaling.png")) if os.path.exists(os.path.join(study, "scaling.png")) else None
    if not size or not (1000 <= size[0] <= 2000 and 400 <= size[1] <= 1000):
        problems.append(f"scaling.png size {size}")
    # --serial: each run starts after the previous one finished.
    spans = []
    for r in rows:
        recs = attempts(r["run_dir"] if os.path.isabs(r["run_dir"]) else os.path.join(study, r["run_dir"]))
        if recs and recs[-1].get("result"):
            spans.append((recs[-1]["started_at"], recs[-1]["result"]["finished_at"]))
    if len(spans) == 6 and any(spans[i + 1][0] < spans[i][1] for i in range(5)):
        problems.append(f"runs overlap in time: {spans}")
    c.report(not problems,
             f"scaling study over 1, 2, 4 nodes x 2 ranks, zero3 and auto, one job at a time: "
             f"{len(rows)} rows, plot {size}" + (f"; {'; '.join(problems)}" if problems else ""),
             [out[-3000:], err[-2000:], md])
    if rows:
        print(md)

    # The 8..1024 GPU sweep of a real cluster, as sbatch commands only.
    before = c.cmd(["squeue", "-h", "-o", "%i"])[1].split()
    rc, out, err = c.cmd([script, "--nodes", "1 2 4 8 16 32 64 128", "--tasks-per-node", "8", "--plans",
                          "zero3 mics:8", "--data", c.args.data, "--out", os.path.join(c.work, "dry"),
                          "--sbatch", "--exclusive --gpus-per-node=8 -p gpu", "--dry-run"])
    lines = [l for l in out.splitlines() if " sbatch " in l]
    after = c.cmd(["squeue", "-h", "-o", "%i"])[1].split()
    ok = (rc == 0 and len(lines) == 16 and "-N 128 --ntasks-per-node=8" in out and "--gpus-per-node=8" in out
          and before == after and not os.path.exists(os.path.join(c.work, "dry")))
    c.report(ok, f"--dry-run of 8 to 1024 GPUs for 2 plans: {len(lines)} sbatch commands, nothing submitted",
             [out[-2000:], err])


# A mode is one or more phases, each on a cluster of its own started anew (so job ids
# start again at 1); phases share the Cluster object and its state.
MODES = {"job": (mode_job, mode_job_ids_repeat), "preempt": (mode_preempt,), "elastic": (mode_elastic,),
         "scaling": (mode_scaling,)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=sorted(MODES))
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cluster-scripts", default=os.path.join(REPO, "slurm", "local-cluster"))
    args = ap.parse_args()
    args.amsp = os.path.abspath(args.amsp)
    args.data = os.path.abspath(args.data)
    args.cluster_scripts = os.path.abspath(args.cluster_scripts)
    work = os.path.abspath(os.path.join(args.work, args.mode))

    lacking = lc.missing()
    if lacking:
        print(f"SKIP: needs root and Slurm + munge (missing: {lacking})")
        return SKIP
    os.environ["PATH"] = os.environ.get("PATH", "") + lc.SBIN

    t0 = time.time()
    try:
        with lc.deadline(DEADLINE):
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            c = None
            for i, phase in enumerate(MODES[args.mode]):
                cluster_dir = os.path.join(work, f"cluster{i}" if i else "cluster")
                with lc.local_cluster(args.cluster_scripts, cluster_dir) as conf:
                    c = c.use(conf) if c else Cluster(args, work, conf)
                    phase(c)
    except (Failure, lc.Interrupted, lc.ClusterError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", flush=True)
        return 1
    print(f"{c.passed} passed, {c.failed} failed ({time.time() - t0:.0f} s)")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
