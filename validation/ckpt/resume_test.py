#!/usr/bin/env python3
"""Checkpoint and resume through the real `amsp train`.

Every run is the tiny preset, --seq-len 32, --eval-every 0 (validation at the start and
the end only), --threads 1, --peak-tflops 1. A run is "interrupted" by SIGKILL (a crash)
or SIGUSR1 (preemption, exit 75) and continued by a new `amsp train`. Every interruption
happens at a named point of a step or a save: the test sets AMSP_FAULT and the ranks
raise the signal on themselves there (src/core/fault.h), so no check races the run and
the outcome is the same on a fast machine and a loaded one.

mpi mode (mpiexec on this machine):
  1  same plan and world size: a run killed after its step-10 checkpoint and resumed
     with --resume auto gives bit-identical losses, gradient norms, learning rates and
     validation loss (JSON floats compared exactly) and identical --final-params bytes
     to 20 steps straight; on 4 ranks (zero3, M=2, every rank killed inside the step-20
     write: save.data@20) and on 1 rank (batch 4, M=2, SIGUSR1 during step 9: exit 75,
     checkpoint, resume). The metrics file is
     appended to: one file holds both runs.
  2  another world size and plan, same global batch in micro-batches of the same shape
     (so that only the order of the gradient sums differs, as in the equivalence test):
     8 ranks zero3 (batch 1) -> 4 ranks p=1,g=2x1,os=4x1 (batch 1, M=2), and 4 ranks
     zero3 M=2 (batch 1) -> 1 rank given only --global-batch (it splits it as batch 1,
     M=8, says so, and prints no "resume: changed" line):
     losses and validation loss of the resumed part within 1e-5 relative of the
     uninterrupted run; final parameters per tensor relative L2 <= 1e-5 and max <= 1e-3
     of the tensor's scale (the tolerances of validation/engine/equivalence_test.py).
  4  kill -9 at every point of a save: 2 ranks zero3, --checkpoint-every 1, seven runs,
     each killed at another point (save.begin, save.data, save.closed, save.renamed,
     save.latest_tmp, save.latest, train.step); after each kill `latest` names a
     complete step file that `amsp ckpt verify` passes (the one that point implies),
     the newest step file is complete too, and the next --resume auto resumes from
     exactly the newest, whatever `latest` says, ignoring any .tmp left by the killed
     write. Every step record of all six runs (one appended
     metrics file) equals the uninterrupted run's bit for bit, and so do the final
     parameters. Plus the 4-rank kill of check 1 checked the same way.
  5  a flipped byte in the newest checkpoint's data: --resume auto says "skipping" naming
     the dataset and resumes from the previous checkpoint (reproducing the original run's
     losses bit for bit); --resume FILE on the damaged file fails naming the dataset.
  6  a checkpoint of another model (--model.num_hidden_layers 3, run has 5): refused on 2
     ranks with exit code 2 and one error line naming num_hidden_layers (--resume FILE
     and --resume auto).
  7  --keep-last 2 leaves exactly the two newest checkpoints (and again after a resume).
  8  resume with changed options: --steps and --lr are listed with what they do; another
     dataset or rope_theta refused (exit 2, one line naming --force-resume); with
     --force-resume the other dataset is taken, saying so. A run from scratch or from an
     older file into a directory holding newer checkpoints is refused (exit 2).
  9  a second job on a --checkpoint-dir in use is refused naming the holder's pid; after
     kill -9 of the holder the next job takes the lock over, says so, and releases it.
  10 background saves (the default; the killed runs of checks 2, 3 and 4 pass
     --checkpoint-mode sync: their kill points imply which files exist only if a save
     ends before the next step starts): the
     same 2-rank run saving sync and background writes files identical by h5diff -r that
     verify, and bit-identical step records, though the writer of step 4's snapshot
     sleeps 1 s before copying (save.snapshot@4,SLEEP=1), so that step 5's optimizer
     updates must copy the units themselves before changing them; each saving step
     reports ckpt_stall_ms, the step after it ckpt_update_wait_ms (above 0 after step 4),
     and the writes' ckpt_write_ms come in later records; SIGUSR1 raised inside the background
     write of step 4 (save.data@4,USR1) stops the run (exit 75) after the write in flight
     and the stop step's save are complete, and --resume auto continues bit for bit.
     A background write that fails (save.data@8,FAIL: every rank's write throws an I/O
     error, as on a full disk; and save.data@8:1,FAIL, rank 1's alone) ends the job
     within a deadline, non-zero, with an error line naming step-00000008.h5; step-00000004.h5 still verifies and `latest` names it;
     no step-00000008.h5 exists (at most its .tmp); --resume auto continues from step 4
     to 12 bit for bit.

slurm mode (srun on a local Slurm cluster of 4 virtual nodes x 2 CPUs that the script
starts on ports found free, validation/slurm/local_cluster.py, and always stops):
  3  8 ranks (4 nodes x 2) p=1,g=2x1,os=2x2 killed after the step-10 checkpoint, resumed
     with --resume auto on 2 nodes x 2 under mics:2 with batch 1, M=2: losses and parameters
     within the tolerances of 2 against the uninterrupted 8-rank run. Exit code 77
     (CTest SKIP_RETURN_CODE) without root, Slurm or munge.

usage: resume_test.py MODE --amsp PATH --data CORPUS.h5 --work DIR [--mpiexec PATH]
                      [--cluster-scripts DIR] [--only TEXT]
Prints one line per check and ends with "N passed, M failed"; exit 1 on any failure.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
import equivalence_test as eq  # noqa: E402  (clean_env, parameter layout and comparison)

SKIP = 77
LOSS_TOL = eq.LOSS_TOL            # 1e-5 relative, losses and validation losses
PARAM_MAX_TOL = eq.PARAM_MAX_TOL  # 1e-3 of the tensor's scale
PARAM_L2_TOL = eq.PARAM_L2_TOL    # 1e-5 relative L2 per tensor
STEPS, SEQ = 20, 32
DEADLINE = 840        # seconds for the whole script, below the CTest TIMEOUT of 900
RUN_TIMEOUT = 240     # seconds for one amsp run
COMPARED = ("loss", "grad_norm", "lr", "tokens", "val_loss")
SYNC = ("--checkpoint-mode", "sync")


class Failure(Exception):
    pass


# --- processes -----------------------------------------------------------------
def rank_pids(tag):
    """PIDs of the amsp processes whose command line holds tag (a path unique to a run).
    mpiexec (hydra) starts every rank in its own session, so killing mpiexec's process
    group does not reach them; slurmstepd starts them under srun. They are found here."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().strip() != "amsp":
                    continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(tag in a for a in args):
            pids.append(int(d))
    return sorted(pids)


def descendants(pid):
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


LIVE_JOBS = []


class Job:
    """A launched `amsp train` whose stdout is read line by line as it comes."""

    def __init__(self, cmd, env, tag):
        self.cmd, self.tag, self.t0 = cmd, tag, time.time()
        self.out, self.err = [], []
        self.cond = threading.Condition()
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
        LIVE_JOBS.append(self)
        self.readers = [threading.Thread(target=self._read, args=(s, l), daemon=True)
                        for s, l in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for r in self.readers:
            r.start()

    def _read(self, stream, lines):
        for line in stream:
            with self.cond:
                lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def kill9(self):
        """SIGKILL every rank at once, then the launcher and its helpers."""
        for pid in rank_pids(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in [self.p.pid] + descendants(self.p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def finish(self, timeout=RUN_TIMEOUT):
        try:
            self.p.wait(timeout=max(1, timeout - (time.time() - self.t0)))
        except subprocess.TimeoutExpired:
            self.kill9()
            self.p.wait()
        for r in self.readers:
            r.join(10)
        for pid in rank_pids(self.tag):  # leave nothing behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self in LIVE_JOBS:
            LIVE_JOBS.remove(self)
        return self.p.returncode

    def seconds(self):
        return time.time() - self.t0

    def stdout(self):
        return "\n".join(self.out)

    def stderr(self):
        return "\n".join(self.err)


def kill_all_jobs():
    for j in list(LIVE_JOBS):
        j.kill9()
        try:
            j.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


# --- metrics and parameters ------------------------------------------------------
def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def split_resumed(records, resume_step):
    """An appended metrics file as (the records before the resumed run, the resumed run's):
    the resumed run wrote the last STEPS - resume_step records. The interrupted run may
    have written steps past its last checkpoint, or none."""
    n = STEPS - resume_step
    return records[:len(records) - n], records[len(records) - n:]


def by_step(records):
    return {r["step"]: r for r in records if "loss" in r}


def exact_mismatches(records, ref):
    """Step records whose compared fields differ in any bit from the reference's."""
    bad = []
    for r in records:
        if "loss" not in r:
            continue
        s = ref.get(r["step"])
        if s is None:
            bad.append(f"step {r['step']} not in the reference")
            continue
        for k in COMPARED:
            if r.get(k) != s.get(k):
                bad.append(f"step {r['step']} {k} {r.get(k)!r} vs {s.get(k)!r}")
    return bad


def loss_error(records, ref):
    """Worst relative difference of loss / val_loss over the step records, and where."""
    worst, where = 0.0, ""
    for r in records:
        if "loss" not in r:
            continue
        s = ref.get(r["step"], {})
        for k in ("loss", "val_loss"):
            if k in r or k in s:
                e = eq.rel(r.get(k), s.get(k))
                if e != e:
                    e = float("inf")
                if e > worst:
                    worst, where = e, f"{k} step {r['step']}"
    return worst, where


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# --- checkpoint directory helpers -----------------------------------------------
def latest_name(ckdir):
    try:
        with open(os.path.join(ckdir, "latest")) as f:
            return f.read()
    except OSError:
        return None


def step_files(ckdir):
    return sorted(f for f in os.listdir(ckdir) if re.fullmatch(r"step-\d{8}\.h5", f))


def tmp_files(ckdir):
    return sorted(f for f in os.listdir(ckdir) if f.endswith(".tmp"))


# --- the test ----------------------------------------------------------------------
class Tests:
    def __init__(self, args, slurm_env=None):
        self.args = args
        self.slurm_env = slurm_env
        self.layout = eq.tensor_layout(os.path.join(REPO, "inputs", "models", "tiny.json"))
        self.passed = self.failed = 0

    # reporting
    def report(self, ok, text, details=()):
        print(f"{'ok  ' if ok else 'FAIL'} {text}", flush=True)
        if not ok:
            for d in details:
                for line in str(d).strip().splitlines()[-10:]:
                    print(f"     | {line}")
        self.passed += bool(ok)
        self.failed += not ok
        return ok

    def path(self, *p):
        return os.path.join(self.args.work, *p)

    # launching
    def launcher(self, ranks, nodes=1):
        if self.slurm_env is None:
            assert nodes == 1
            return [self.args.mpiexec, "-n", str(ranks)], eq.clean_env()
        return (["srun", "--mpi=pmi2", "--time=5", "-N", str(nodes), f"--ntasks-per-node={ranks // nodes}"],
                self.slurm_env)

    def start(self, tag, ranks, plan, batch, accum, steps=STEPS, nodes=1, ckdir=None, every=0,
              resume=None, keep=0, params=True, extra=(), fresh=True, fault=None):
        """Starts a run; its metrics go to WORK/tag.jsonl (appended to on resume unless
        fresh), its final parameters to WORK/tag.bin. fault: AMSP_FAULT for the ranks (a
        crash or a signal at a named point of a step or a save, src/core/fault.h)."""
        metrics, final = self.path(f"{tag}.jsonl"), self.path(f"{tag}.bin")
        if fresh:
            for p in (metrics, final):
                if os.path.exists(p):
                    os.remove(p)
        pre, env = self.launcher(ranks, nodes)
        env = dict(env, AMSP_FAULT=fault) if fault else env
        cmd = pre + [self.args.amsp, "train", "--model", "tiny", "--data", self.args.data,
                     "--steps", str(steps), "--seq-len", str(SEQ), "--batch-size", str(batch),
                     *(["--grad-accum", str(accum)] if accum else []), "--shard", plan, "--eval-every", "0",
                     "--eval-windows", "8", "--peak-tflops", "1", "--threads", "1",
                     "--comm-timeout", "120", "--metrics", metrics]
        if params:
            cmd += ["--final-params", final]
        if ckdir:
            cmd += ["--checkpoint-dir", ckdir, "--checkpoint-every", str(every)]
        if resume:
            cmd += ["--resume", resume]
        if keep:
            cmd += ["--keep-last", str(keep)]
        cmd += list(extra)
        return Job(cmd, env, metrics)

    def run(self, *a, **kw):
        job = self.start(*a, **kw)
        rc = job.finish()
        return job, rc

    def straight(self, tag, ranks, plan, batch, accum, nodes=1):
        """An uninterrupted reference run: its step records by step and its parameters."""
        job, rc = self.run(tag, ranks, plan, batch, accum, nodes=nodes)
        if rc != 0:
            raise Failure(f"uninterrupted run {tag} exited {rc}: {' '.join(job.cmd)}\n{job.stderr()[-1500:]}")
        print(f"     uninterrupted {tag}: {ranks} ranks {plan} B={batch} M={accum}, "
              f"{job.seconds():.1f} s", flush=True)
        return by_step(read_metrics(self.path(f"{tag}.jsonl"))), self.path(f"{tag}.bin")

    def verify(self, path):
        p = subprocess.run([self.args.amsp, "ckpt", "verify", path], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        return p.returncode == 0 and ": ok," in p.stdout, p.stdout.strip()

    def after_kill(self, ckdir):
        """After a SIGKILL: `latest` names one complete step file that verifies.
        Returns (ok, step, description)."""
        name = latest_name(ckdir)
        if name is None:
            return False, None, "no latest file"
        fname = name.strip()
        if not name.endswith("\n") or "\n" in fname or not re.fullmatch(r"step-(\d{8})\.h5", fname):
            return False, None, f"latest holds {name!r}, not one step-NNNNNNNN.h5 line"
        if not os.path.isfile(os.path.join(ckdir, fname)):
            return False, None, f"latest names {fname}, which does not exist"
        ok, text = self.verify(os.path.join(ckdir, fname))
        step = int(fname[5:13])
        return ok, step, f"latest {fname} {'verifies' if ok else 'FAILS verify: ' + text}"

    # ---------------------------------------------------------------- check 1 and 4a
    def same_plan_4(self):
        """4 ranks zero3 M=2: every rank killed inside the step-20 write, resume auto."""
        ref, ref_params = self.straight("s4", 4, "zero3", 1, 2)
        self.s4 = (ref, ref_params)
        ckdir = self.path("ck-s4")
        shutil.rmtree(ckdir, ignore_errors=True)
        # Each rank kills itself once its part of step-20.h5 is written, before the
        # file is closed: a crash inside the write, on every machine alike.
        job, rc = self.run("i4", 4, "zero3", 1, 2, ckdir=ckdir, every=10, fault="save.data@20")
        if rc == 0 or os.path.exists(os.path.join(ckdir, "step-00000020.h5")):
            self.report(False, f"1  4 ranks zero3 M=2: AMSP_FAULT=save.data@20 did not kill the run "
                               f"inside the step-20 write (exit {rc})", [job.stderr()])
            return
        tmps = tmp_files(ckdir)
        ok, step, what = self.after_kill(ckdir)
        self.report(ok and step == 10 and tmps == [".step-00000020.h5.tmp"],
                    f"4  kill -9 of 4 ranks inside the step-20 write (left {' '.join(tmps) or 'no .tmp'}): "
                    f"{what}", [what])
        self.s4_ckpt = os.path.join(ckdir, "step-00000010.h5")
        # Resume with auto: the .tmp of the killed write must be ignored.
        job2, rc2 = self.run("i4", 4, "zero3", 1, 2, ckdir=ckdir, every=10, resume="auto", fresh=False)
        self.same_plan_result("1  4 ranks zero3 M=2 B=1: 20 steps, kill -9 in the step-20 write, "
                              "--resume auto, 10 steps", job2, rc2, "i4", ref, ref_params, 10, ckdir)

    def same_plan_result(self, label, job, rc, tag, ref, ref_params, resume_step, ckdir):
        out = job.stdout()
        resumed = re.search(r"^resume: (\S+) \(step (\d+),", out, re.M)
        problems = []
        if rc != 0:
            problems.append(f"resumed run exited {rc}")
        if not resumed or os.path.basename(resumed.group(1)) != f"step-{resume_step:08d}.h5":
            problems.append(f"did not resume from step-{resume_step:08d}.h5: "
                            f"{resumed.group(0) if resumed else 'no resume line'}")
        recs = read_metrics(self.path(f"{tag}.jsonl")) if os.path.exists(self.path(f"{tag}.jsonl")) else []
        head, tail = split_resumed(recs, resume_step)
        hs, ts = [r["step"] for r in head], [r["step"] for r in tail]
        if hs != list(range(len(hs))) or len(hs) <= resume_step or "val_loss" not in head[0] \
                or ts != list(range(resume_step + 1, STEPS + 1)):
            problems.append(f"metrics file steps {hs} then {ts}; expected 0..j (j >= {resume_step}) "
                            f"then {resume_step + 1}..{STEPS}")
        bad = exact_mismatches(recs, ref)
        if bad:
            problems.append(f"{len(bad)} differences, first: {bad[0]}")
        got = self.path(f"{tag}.bin")
        same = os.path.exists(got) and file_bytes(got) == file_bytes(ref_params)
        if not same:
            problems.append("final parameters differ from the uninterrupted run's")
        tmps = tmp_files(ckdir)
        if tmps:
            problems.append(f"temporaries left after the resumed run: {tmps}")
        n = sum(1 for r in recs if "loss" in r)
        self.report(not problems,
                    f"{label}: {n} step records bit-identical{'' if not bad else ' (NOT)'}, final params "
                    f"{'identical' if same else 'DIFFER'}, {job.seconds():.1f} s"
                    + (f"; {'; '.join(problems)}" if problems else ""),
                    [' '.join(job.cmd), job.stderr()])

    def same_plan_1(self):
        """1 rank, batch 4, M=2: SIGUSR1 (preemption) near step 10, exit 75, resume auto."""
        ref, ref_params = self.straight("s1", 1, "zero3", 4, 2)
        ckdir = self.path("ck-s1")
        shutil.rmtree(ckdir, ignore_errors=True)
        # SIGUSR1 raised by the rank itself at the start of step 9: the stop request
        # arrives mid-run whatever the machine's speed.
        job, rc = self.run("i1", 1, "zero3", 4, 2, ckdir=ckdir, every=10, fault="train.step@9,USR1")
        stop = re.search(r"^stopping after step (\d+) \(stop requested by", job.stdout(), re.M)
        k = int(stop.group(1)) if stop else None
        if rc != 75 or k is None or not os.path.exists(os.path.join(ckdir, f"step-{k:08d}.h5")) \
                or (latest_name(ckdir) or "").strip() != f"step-{k:08d}.h5":
            self.report(False, f"1  1 rank: SIGUSR1 at step 9: exit {rc} (expected 75), "
                               f"stopped after step {k}, latest {latest_name(ckdir)!r}",
                        [' '.join(job.cmd), job.stderr()])
            return
        job2, rc2 = self.run("i1", 1, "zero3", 4, 2, ckdir=ckdir, every=10, resume="auto", fresh=False)
        if k != 9:
            self.report(False, f"1  1 rank: SIGUSR1 during step 9 stopped after step {k}, not 9")
        self.same_plan_result(f"1  1 rank B=4 M=2: SIGUSR1 at step 9, stopped after step {k} (exit 75), "
                              f"--resume auto, {STEPS - k} steps", job2, rc2, "i1", ref, ref_params, k, ckdir)

    # ---------------------------------------------------------------- check 2 and 3
    def resharded(self, label, job, rc, tag, ref, ref_params, resume_step, problems=()):
        problems = list(problems)
        out = job.stdout()
        resumed = re.search(r"^resume: (\S+) \(step (\d+), written by (\S+) on (\d+) ranks", out, re.M)
        if rc != 0:
            problems.append(f"exited {rc}")
        if not resumed or int(resumed.group(2)) != resume_step:
            problems.append(f"no 'resume: ... (step {resume_step}' line")
        recs = read_metrics(self.path(f"{tag}.jsonl")) if os.path.exists(self.path(f"{tag}.jsonl")) else []
        last = split_resumed(recs, resume_step)[1]
        steps = [r["step"] for r in last]
        if steps != list(range(resume_step + 1, STEPS + 1)):
            problems.append(f"resumed steps {steps[:2]}..{steps[-1:]}, expected {resume_step + 1}..{STEPS}")
        lerr, lwhere = loss_error(last, ref)
        if lerr > LOSS_TOL:
            problems.append(f"loss {lerr:.1e} > {LOSS_TOL}")
        got = self.path(f"{tag}.bin")
        if os.path.exists(got):
            perr, pwhere, pl2 = eq.compare_params(eq.read_params(got), eq.read_params(ref_params), self.layout)
        else:
            perr, pwhere, pl2 = float("inf"), "no --final-params file", float("inf")
        if perr > PARAM_MAX_TOL or pl2 > PARAM_L2_TOL:
            problems.append(f"params max {perr:.1e} ({pwhere}) L2 {pl2:.1e}")
        src = f"{resumed.group(3)} on {resumed.group(4)}" if resumed else "?"
        self.report(not problems,
                    f"{label}: from {src} at step {resume_step}, loss {lerr:.1e} ({lwhere}), params max "
                    f"{perr:.1e} ({pwhere}) L2 {pl2:.1e}, {job.seconds():.1f} s"
                    + (f"; {'; '.join(problems)}" if problems else ""),
                    [' '.join(job.cmd), job.stderr()])

    def interrupted_at_10(self, tag, ranks, plan, batch, accum, ckdir, nodes=1):
        """Runs until its step-10 checkpoint is written; every rank dies at the start of step 11."""
        shutil.rmtree(ckdir, ignore_errors=True)
        # Sync: a kill at the start of step 11 must find the step-10 file complete (a
        # background write may still be under way then).
        job, rc = self.run(tag, ranks, plan, batch, accum, nodes=nodes, ckdir=ckdir, every=10,
                           fault="train.step@11", extra=SYNC)
        # Every rank passed the step-10 save (it ends collectively) before any died; rank 0's
        # "checkpoint:" line may still be lost with it, so the file is what is checked.
        if not os.path.exists(os.path.join(ckdir, "step-00000010.h5")) or rc == 0:
            raise Failure(f"{tag}: the run did not write its step-10 checkpoint or was not killed "
                          f"(exit {rc}): {' '.join(job.cmd)}\n{job.stderr()[-1500:]}")
        print(f"     interrupted {tag}: {ranks} ranks {plan}, killed after the step-10 checkpoint, "
              f"{job.seconds():.1f} s", flush=True)
        ok, step, what = self.after_kill(ckdir)
        if not ok or step != 10:
            raise Failure(f"{tag}: after the kill: {what}")
        return os.path.join(ckdir, "step-00000010.h5")

    def reshard_8_to_4(self):
        ref, ref_params = self.straight("s8", 8, "zero3", 1, 1)
        ck = self.interrupted_at_10("i8", 8, "zero3", 1, 1, self.path("ck-s8"))
        job, rc = self.run("r8to4", 4, "p=1,g=2x1,os=4x1", 1, 2, resume=ck)
        self.resharded("2  8 ranks zero3 B=1 -> 4 ranks p=1,g=2x1,os=4x1 B=1 M=2 (--resume FILE)",
                       job, rc, "r8to4", ref, ref_params, 10)

    def reshard_4_to_1(self):
        if not getattr(self, "s4_ckpt", None) or not os.path.exists(self.s4_ckpt):
            self.report(False, "2  4 ranks -> 1 rank: no step-10 checkpoint from check 1")
            return
        ref, ref_params = self.s4
        # The same global batch by --global-batch, as a requeued job on another allocation
        # gives it: 4 ranks x 2 x 1 sequences of SEQ are 8 x SEQ tokens, here 1 rank x 8 x 1.
        job, rc = self.run("r4to1", 1, "ddp", 1, None, resume=self.s4_ckpt,
                           extra=["--global-batch", str(8 * SEQ)])
        out = job.stdout()
        problems = [f"printed {line!r}" for line in out.splitlines() if line.startswith("resume: changed")]
        split = f"batch: --global-batch {8 * SEQ} tokens = 1 ranks x 8 micro-batches x 1 sequences x {SEQ} tokens"
        if split not in out.splitlines():
            problems.append(f"no line {split!r}")
        self.resharded("2  4 ranks zero3 B=1 M=2 -> 1 rank --global-batch (B=1 M=8), no 'changed' line "
                       "(--resume FILE)", job, rc, "r4to1", ref, ref_params, 10, problems)

    def slurm_resume(self):
        ref, ref_params = self.straight("u8", 8, "p=1,g=2x1,os=2x2", 1, 1, nodes=4)
        ckdir = self.path("ck-slurm")
        self.interrupted_at_10("sl8", 8, "p=1,g=2x1,os=2x2", 1, 1, ckdir, nodes=4)
        self.report(True, "3  8 ranks on 4 nodes killed after the step-10 checkpoint: latest names "
                          "step-00000010.h5, which verifies")
        job, rc = self.run("sl8", 4, "mics:2", 1, 2, nodes=2, ckdir=ckdir, every=0, resume="auto", fresh=False)
        self.resharded("3  srun 4 nodes x 2 p=1,g=2x1,os=2x2 B=1 -> 2 nodes x 2 mics:2 B=1 M=2 (--resume auto)",
                       job, rc, "sl8", ref, ref_params, 10)

    # ---------------------------------------------------------------- check 4
    # Each run of check 4 dies at one of these points (src/core/fault.h), past the
    # checkpoint the previous run resumed from. With --checkpoint-every 1 the newest
    # complete file is then step N's once it was renamed into place (save.renamed and
    # later), else step N-1's; `latest` names step N's only after save.latest. The
    # next --resume auto must take the newest complete file, whatever `latest` says.
    KILLS = (("save.begin", 3), ("save.data", 7), ("save.closed", 11), ("save.renamed", 15),
             ("save.latest_tmp", 19), ("save.latest", 23), ("train.step", 28))

    def kills(self):
        steps = 40
        tag = "k2"
        ref_job, rc = self.run("k2ref", 2, "zero3", 1, 1, steps=steps)
        if rc != 0:
            raise Failure(f"kill test reference exited {rc}: {ref_job.stderr()[-1500:]}")
        ref = by_step(read_metrics(self.path("k2ref.jsonl")))
        ckdir = self.path("ck-kill")
        shutil.rmtree(ckdir, ignore_errors=True)
        expect = None   # the file the next run must resume from
        left = []       # temporaries the previous kill left, which the next run must remove and name
        spans = []      # (first, last) step of each run, from its records
        def count():
            p = self.path(f"{tag}.jsonl")
            return read_metrics(p) if os.path.exists(p) else []
        for i in range(len(self.KILLS) + 1):
            before = len(count()) if i else 0
            fault = "%s@%d" % self.KILLS[i] if i < len(self.KILLS) else None
            # Sync: each point implies which files exist only if a save ends before the next step.
            job, rc = self.run(tag, 2, "zero3", 1, 1, steps=steps, ckdir=ckdir, every=1, resume="auto",
                               fresh=(i == 0), fault=fault, extra=SYNC)
            mine = [r["step"] for r in count()[before:]]
            spans.append(f"{mine[0]}-{mine[-1]}" if mine else "none")
            if fault is None:
                break
            point, at = self.KILLS[i]
            problems = []
            out = job.stdout()
            if expect:
                m = re.search(r"^resume: (\S+) \(step (\d+),", out, re.M)
                if not m or os.path.basename(m.group(1)) != expect:
                    problems.append(f"resumed from {m.group(1) if m else 'nothing'}, not {expect}")
            if expect and mine and mine[0] != int(expect[5:13]) + 1:
                problems.append(f"its first step record is {mine[0]}, not {int(expect[5:13]) + 1}")
            removed = re.search(r"^resume: removed what an interrupted save left in \S+:(.*)$", out, re.M)
            if sorted((removed.group(1) if removed else "").split()) != sorted(left):
                problems.append(f"the resume said it removed {removed.group(1).split() if removed else 'nothing'}, "
                                f"not {left}")
            if rc == 0:
                problems.append(f"run ended by itself (exit {rc}): AMSP_FAULT={fault} never fired")
            tmps = tmp_files(ckdir)
            ok, step, what = self.after_kill(ckdir)
            want_latest = at if point == "save.latest" else at - 1
            if not ok or step != want_latest:
                problems.append(f"{what}; expected latest step-{want_latest:08d}.h5")
            newest = at if point in ("save.renamed", "save.latest_tmp", "save.latest") else at - 1
            files = step_files(ckdir)
            if not files or files[-1] != f"step-{newest:08d}.h5":
                problems.append(f"newest step file {files[-1] if files else None}, expected step-{newest:08d}.h5")
            elif not self.verify(os.path.join(ckdir, files[-1]))[0]:
                problems.append(f"{files[-1]} does not verify")
            expect = f"step-{newest:08d}.h5"
            left = tmps
            self.report(not problems,
                        f"4  kill -9 #{i + 1} of 2 ranks at {fault} "
                        f"({'a write was under way: ' + ' '.join(tmps) if tmps else 'no .tmp left'}): {what}"
                        + (f"; {'; '.join(problems)}" if problems else ""),
                        [' '.join(job.cmd), job.stderr()])
        # The last run finishes: every record of all the runs equals the reference.
        problems = []
        m = re.search(r"^resume: (\S+) \(step (\d+),", job.stdout(), re.M)
        if rc != 0:
            problems.append(f"the final run exited {rc}")
        if not m or os.path.basename(m.group(1)) != expect:
            problems.append(f"resumed from {m.group(1) if m else 'nothing'}, not {expect}")
        recs = read_metrics(self.path(f"{tag}.jsonl"))
        bad = exact_mismatches(recs, ref)
        if bad:
            problems.append(f"{len(bad)} differences, first: {bad[0]}")
        if not recs or recs[0] != {"step": 0, "val_loss": recs[0].get("val_loss")} or recs[-1]["step"] != steps:
            problems.append(f"metrics file from step {recs[0]['step'] if recs else None} to "
                            f"{recs[-1]['step'] if recs else None}")
        same = file_bytes(self.path(f"{tag}.bin")) == file_bytes(self.path("k2ref.bin"))
        if not same:
            problems.append("final parameters differ")
        if tmp_files(ckdir):
            problems.append(f"temporaries left: {tmp_files(ckdir)}")
        spans = " ".join(spans)
        self.report(not problems,
                    f"4  after {len(self.KILLS)} kills the run finishes: steps per run {spans}, "
                    f"{sum(1 for r in recs if 'loss' in r)} step records bit-identical to the uninterrupted "
                    f"run, final params {'identical' if same else 'DIFFER'}"
                    + (f"; {'; '.join(problems)}" if problems else ""),
                    [' '.join(job.cmd), job.stderr()])

    # ---------------------------------------------------------------- check 5
    def flipped_byte(self):
        ckdir = self.path("ck-flip")
        shutil.rmtree(ckdir, ignore_errors=True)
        job, rc = self.run("f1", 1, "ddp", 1, 1, steps=10, ckdir=ckdir, every=5)
        if rc != 0 or step_files(ckdir) != ["step-00000005.h5", "step-00000010.h5"]:
            raise Failure(f"flip test: the run exited {rc}, files {step_files(ckdir)}: {job.stderr()[-1000:]}")
        ref = by_step(read_metrics(self.path("f1.jsonl")))
        victim = os.path.join(ckdir, "step-00000010.h5")
        dataset = "model/layers.1.mlp.down_proj.weight"
        h5 = subprocess.run(["h5dump", "-p", "-H", "-d", "/" + dataset, victim], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=60)
        m = re.search(r"OFFSET\s+(\d+)", h5.stdout)
        if not m:
            raise Failure(f"h5dump gives no offset for {dataset}: {h5.stdout[-500:]}")
        offset = int(m.group(1)) + 4 * 1001 + 2   # a byte inside element 1001
        with open(victim, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x10]))
        # --resume FILE on the damaged file: refused, the dataset named.
        job, rc = self.run("f1-file", 1, "ddp", 1, 1, steps=20, resume=victim, params=False)
        errors = [l for l in job.err if l.strip()]
        ok = rc != 0 and any(dataset in l for l in errors) and not os.path.exists(self.path("f1-file.jsonl"))
        self.report(ok, f"5  --resume FILE on a checkpoint with a flipped byte refused: exit {rc}, "
                        f"{len(errors)} stderr line(s): {errors[0][:200] if errors else '(none)'}",
                    [' '.join(job.cmd), job.stdout()[-800:], job.stderr()])
        # --resume auto: skips it naming the dataset, resumes from step 5.
        job, rc = self.run("f1-auto", 1, "ddp", 1, 1, steps=10, ckdir=ckdir, every=5, resume="auto")
        out = job.stdout()
        skip = re.search(r"^resume: skipping (\S+): (.*)$", out, re.M)
        res = re.search(r"^resume: (\S+) \(step (\d+),", out, re.M)
        recs = read_metrics(self.path("f1-auto.jsonl")) if os.path.exists(self.path("f1-auto.jsonl")) else []
        bad = exact_mismatches(recs, ref)
        steps = [r["step"] for r in recs]
        problems = []
        if rc != 0:
            problems.append(f"exited {rc}")
        if not skip or os.path.basename(skip.group(1)) != "step-00000010.h5" or dataset not in skip.group(2):
            problems.append("no 'resume: skipping .../step-00000010.h5: ... " + dataset + "' line")
        if not res or os.path.basename(res.group(1)) != "step-00000005.h5":
            problems.append(f"resumed from {res.group(1) if res else 'nothing'}, not step-00000005.h5")
        if steps != list(range(6, 11)) or bad:
            problems.append(f"steps {steps}, {len(bad)} differences from the original run" +
                            (f", first {bad[0]}" if bad else ""))
        self.report(not problems,
                    f"5  --resume auto with the newest checkpoint damaged: "
                    f"{skip.group(0)[:160] if skip else 'no skip line'}; resumed from step "
                    f"{res.group(2) if res else '?'}, steps 6-10 bit-identical to the original run"
                    + (f"; {'; '.join(problems)}" if problems else ""),
                    [' '.join(job.cmd), out[-800:], job.stderr()])

    # ---------------------------------------------------------------- check 6
    def other_model(self):
        ckdir = self.path("ck-model")
        shutil.rmtree(ckdir, ignore_errors=True)
        job, rc = self.run("m3", 1, "ddp", 1, 1, steps=2, ckdir=ckdir, params=False,
                           extra=["--model.num_hidden_layers", "3"])
        ck = os.path.join(ckdir, "step-00000002.h5")
        if rc != 0 or not os.path.exists(ck):
            raise Failure(f"model test: the 3-layer run exited {rc}: {job.stderr()[-1000:]}")
        for how, kw in (("--resume FILE", dict(resume=ck)),
                        ("--resume auto", dict(resume="auto", ckdir=ckdir))):
            job, rc = self.run("m5", 2, "zero3", 1, 1, steps=4, params=False, **kw)
            lines = [l for l in job.err if l.strip()]
            ok = (rc == 2 and len(lines) == 1 and lines[0].startswith("amsp: error:")
                  and "num_hidden_layers" in lines[0] and " 3 " in lines[0] and " 5 " in lines[0]
                  and not any(l.startswith("step ") for l in job.out))
            self.report(ok, f"6  5-layer run on 2 ranks, {how} of a 3-layer checkpoint: exit {rc}, "
                            f"{len(lines)} stderr line(s): {lines[0][:200] if lines else '(none)'}",
                        [' '.join(job.cmd), job.stderr()])

    # ---------------------------------------------------------------- check 8
    def changed_options(self):
        ckdir = self.path("ck-changed")
        shutil.rmtree(ckdir, ignore_errors=True)
        job, rc = self.run("c1", 1, "ddp", 1, 1, steps=4, ckdir=ckdir, params=False)
        if rc != 0:
            raise Failure(f"changed-options test: the first run exited {rc}: {job.stderr()[-1000:]}")
        other = self.path("other.h5")
        subprocess.run([self.args.amsp, "data", "prepare", "--input", os.path.join(REPO, "COPYING"),
                        os.path.join(REPO, "README.md"), "--output", other], check=True,
                       stdout=subprocess.DEVNULL, timeout=60)
        cases = [  # (what, extra options, data, expected exit, text every expected line holds)
            ("--steps 8 --lr 0.002", ["--lr", "0.002"], None, 0,
             ["resume: changed: --steps 8 (was 4): the cosine schedule now ends at step 8 instead of 4",
              "resume: changed: --lr 0.002 (was 0.001)"]),
            ("--model.rope_theta 500000", ["--model.rope_theta", "500000"], None, 2,
             ["model field rope_theta", "--force-resume"]),
            ("another dataset", [], other, 2, ["holds other tokens than the checkpoint's run trained on",
                                               "--force-resume"]),
            ("another dataset, --force-resume", ["--force-resume"], other, 0,
             ["resume: forced (--force-resume): --data"]),
        ]
        for what, extra, data, want_rc, texts in cases:
            args = list(extra) + (["--data", data] if data else [])
            job, rc = self.run("c2", 1, "ddp", 1, 1, steps=8, ckdir=ckdir, resume="auto", params=False,
                               extra=args)
            out = job.stdout() + "\n" + job.stderr()
            errors = [l for l in job.err if l.startswith("amsp: error:")]
            missing = [t for t in texts if t not in out]
            ok = rc == want_rc and not missing and (want_rc == 0 or len(errors) == 1)
            self.report(ok, f"8  resume with {what}: exit {rc} (expected {want_rc})"
                            + (f"; missing {missing}" if missing else "")
                            + (f": {errors[0][:160]}" if errors else ""), [' '.join(job.cmd), out[-1500:]])
            if rc == 0:  # the run went on: write the step-4 checkpoint again for the next case
                shutil.rmtree(ckdir, ignore_errors=True)
                self.run("c1", 1, "ddp", 1, 1, steps=4, ckdir=ckdir, params=False)
        # A fresh run, or one resumed from an older file, into a directory holding newer
        # checkpoints of another trajectory: refused, nothing written.
        for what, resume in (("from scratch", None), ("from an older file", "OLDER")):
            if resume:
                shutil.rmtree(ckdir, ignore_errors=True)
                self.run("c1", 1, "ddp", 1, 1, steps=4, ckdir=ckdir, every=2, params=False)
                resume = os.path.join(ckdir, "step-00000002.h5")
            before = sorted(os.listdir(ckdir))
            job, rc = self.run("c3", 1, "ddp", 1, 1, steps=8, ckdir=ckdir, resume=resume, params=False)
            errors = [l for l in job.err if l.startswith("amsp: error:")]
            ok = (rc == 2 and len(errors) == 1 and "holds checkpoints up to step 4" in errors[0]
                  and sorted(os.listdir(ckdir)) == before)
            self.report(ok, f"8  a run {what} into a directory with newer checkpoints: exit {rc}: "
                            f"{errors[0][:200] if errors else '(no error line)'}", [job.stderr()])

    # ---------------------------------------------------------------- check 9
    def directory_lock(self):
        ckdir = self.path("ck-lock")
        shutil.rmtree(ckdir, ignore_errors=True)
        holder = self.start("l1", 1, "ddp", 1, 1, steps=1000000, ckdir=ckdir, params=False)
        deadline = time.time() + RUN_TIMEOUT
        while not os.path.exists(os.path.join(ckdir, "lock")) and holder.p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        pids = rank_pids(holder.tag)
        job, rc = self.run("l2", 2, "zero3", 1, 1, steps=4, ckdir=ckdir, resume="auto", params=False)
        errors = [l for l in job.err if l.startswith("amsp: error:")]
        ok = (rc == 2 and len(errors) == 1 and "is in use by pid" in errors[0]
              and any(f"pid {p} " in errors[0] for p in pids) and not os.path.exists(self.path("l2.jsonl")))
        self.report(ok, f"9  a second job on a locked --checkpoint-dir: exit {rc}: "
                        f"{errors[0][:200] if errors else '(no error line)'}", [job.stderr()])
        holder.kill9()
        holder.finish()
        job, rc = self.run("l3", 2, "zero3", 1, 1, steps=4, ckdir=ckdir, resume="auto", params=False)
        took = [l for l in job.out if "took over the lock of pid" in l and "which is gone" in l]
        ok = rc == 0 and len(took) == 1 and not os.path.exists(os.path.join(ckdir, "lock"))
        self.report(ok, f"9  after kill -9 of the holder the next job takes the lock over and releases it: "
                        f"exit {rc}: {took[0] if took else '(no takeover line)'}", [job.stdout()[-800:], job.stderr()])

    # ---------------------------------------------------------------- check 10
    def background(self):
        """The same 2-rank run saving sync and background: the same files (h5diff), the stall
        reported; a stop request during a background write waits for it; resume bit for bit.
        In fp32 the next step's updates copy the snapshot's units; in bf16 they write their
        results into the snapshot's buffers and hand theirs over, no copy: both checked."""
        steps, every = 12, 4
        ref = self.background_pair("fp32", "save.snapshot", steps, every)
        self.background_pair("bf16", "save.writer", steps, every)
        self.background_pair("fp32", "save.writer", steps, every)
        self.background_stop(ref, steps, every)
        for rank in ("", ":1"):
            self.background_failure(ref, steps, every, rank)

    def background_pair(self, precision, point, steps, every):
        """The writer of step 4's snapshot sleeps 1 s at `point`: save.snapshot holding its
        first unit, so that step 5's update of it waits (the writer then copies the rest);
        save.writer before it claims any, so that step 5's updates take every unit by
        exchanging buffers and wait for nothing. Either way, or step 4's file holds step
        5's states."""
        files = [f"step-{s:08d}.h5" for s in range(every, steps + 1, every)]
        holds = point == "save.snapshot"
        tag = "" if (precision, holds) == ("fp32", True) else f"-{precision}-{point.split('.')[1]}"
        label = f"{precision}, {'the writer holding a unit' if holds else 'every unit exchanged'}"
        dirs = {}
        for mode in ("sync", "background"):
            dirs[mode] = self.path(f"ck-{mode}{tag}")
            shutil.rmtree(dirs[mode], ignore_errors=True)
            job, rc = self.run(f"bg-{mode}{tag}", 2, "zero3", 1, 1, steps=steps, ckdir=dirs[mode], every=every,
                               extra=["--checkpoint-mode", mode, "--precision", precision],
                               fault=f"{point}@{every},SLEEP=1" if mode == "background" else None)
            if rc != 0:
                raise Failure(f"background test: the {mode} run ({precision}) exited {rc}: {job.stderr()[-1500:]}")
        ref = by_step(read_metrics(self.path(f"bg-sync{tag}.jsonl")))
        recs = read_metrics(self.path(f"bg-background{tag}.jsonl"))
        self.background_files(dirs, files, recs, ref, label)
        self.background_stall(recs, ref, every, label, holds)
        return ref

    def background_files(self, dirs, files, recs, ref, label):
        problems = [f"{f}: {t}" for f in files for ok, t in [self.verify(os.path.join(dirs["background"], f))]
                    if not ok]
        for f in files:
            p = subprocess.run(["h5diff", "-r", os.path.join(dirs["sync"], f), os.path.join(dirs["background"], f)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
            if p.returncode != 0:
                problems.append(f"h5diff {f}: exit {p.returncode}: {p.stdout.strip()[-300:]}")
        if sorted(os.listdir(dirs["background"])) != sorted(files + ["latest"]):
            problems.append(f"left {sorted(os.listdir(dirs['background']))}")
        bad = exact_mismatches(recs, ref)
        if bad:
            problems.append(f"{len(bad)} step records differ, first {bad[0]}")
        self.report(not problems, f"10 background vs sync saves of the same 2-rank run ({label}): {len(files)} files "
                                  f"verify and are identical by h5diff -r, step records bit-identical"
                                  + (f"; {'; '.join(problems)}" if problems else ""))

    def background_stall(self, recs, ref, every, label, holds):
        saving = [r for r in recs if "loss" in r and r["step"] % every == 0]
        stalls = [r.get("ckpt_stall_ms") for r in saving]
        writes = [r["ckpt_write_ms"] for r in recs if "ckpt_write_ms" in r]
        sync_stalls = [ref[r["step"]].get("ckpt_stall_ms") for r in saving]
        after = [r.get("ckpt_update_wait_ms") for r in recs if "loss" in r and r["step"] % every == 1
                 and r["step"] > 1]
        # The first save's next step waited for the unit its writer held while it slept
        # (1 s), or for nothing, taking every unit by exchange.
        first_ok = bool(after) and after[0] is not None and (after[0] > 0 if holds else after[0] < 500)
        ok = (None not in stalls and None not in sync_stalls and len(writes) >= len(saving) - 1
              and not any("ckpt_stall_ms" in r for r in recs if "loss" in r and r["step"] % every)
              and None not in after and first_ok)
        fmt = lambda xs: " ".join(f"{x:.1f}" if x is not None else "-" for x in xs)
        how = "the first while its writer slept holding a unit" if holds else \
              "the first while its writer slept, every unit exchanged"
        self.report(ok, f"10 stall reported on each saving step ({label}): background {fmt(stalls)} ms, sync "
                        f"{fmt(sync_stalls)} ms; the next steps' updates waited {fmt(after)} ms for the "
                        f"snapshot ({how}); background writes {fmt(writes)} ms in later steps")

    def background_stop(self, ref, steps, every):
        ckdir = self.path("ck-bg-stop")
        shutil.rmtree(ckdir, ignore_errors=True)
        # SIGUSR1 raised by the writer thread itself once the step-4 data is written:
        # the stop request arrives while a background write is under way, always.
        job, rc = self.run("bg-stop", 2, "zero3", 1, 1, steps=steps, ckdir=ckdir, every=every,
                           fault=f"save.data@{every},USR1", params=False)
        stop = re.search(r"^stopping after step (\d+) \(stop requested by", job.stdout(), re.M)
        k = int(stop.group(1)) if stop else None
        problems = [] if rc == 75 and k else [f"exit {rc} (expected 75), stopped after step {k}"]
        # A slow writer may see the request only after later periodic saves.
        want = sorted(set(range(every, (k or every) + 1, every)) | {k or every})
        have = [int(f[5:13]) for f in step_files(ckdir)]
        if have != want or tmp_files(ckdir) or (latest_name(ckdir) or "").strip() != f"step-{k or 0:08d}.h5":
            problems.append(f"files {have} (expected {want}), .tmp {tmp_files(ckdir)}, latest {latest_name(ckdir)!r}")
        problems += [f"{f}: {t}" for f in step_files(ckdir) for ok, t in [self.verify(os.path.join(ckdir, f))]
                     if not ok]
        job2, rc2 = self.run("bg-stop", 2, "zero3", 1, 1, steps=steps, ckdir=ckdir, every=every, resume="auto",
                             fresh=False, params=False)
        recs = read_metrics(self.path("bg-stop.jsonl")) if os.path.exists(self.path("bg-stop.jsonl")) else []
        bad = exact_mismatches(recs, ref)
        if rc2 != 0 or bad or not k or [r["step"] for r in recs if "loss" in r][-(steps - k):] != \
                list(range(k + 1, steps + 1)):
            problems.append(f"resume exit {rc2}, {len(bad)} records differ" + (f", first {bad[0]}" if bad else ""))
        self.report(not problems, f"10 SIGUSR1 during the background write of step {every}: stopped after step {k} "
                                  f"(exit {rc}) with step {every} and {k} complete, resumed to {steps} bit for bit"
                                  + (f"; {'; '.join(problems)}" if problems else ""),
                    [' '.join(job.cmd), job.stdout()[-800:], job.stderr(), job2.stderr()])

    def background_failure(self, ref, steps, every, rank):
        ckdir = self.path(f"ck-bg-fail{rank.replace(':', '-')}")
        shutil.rmtree(ckdir, ignore_errors=True)
        failing = 2 * every
        name = f"step-{failing:08d}.h5"
        fault = f"save.data@{failing}{rank},FAIL"
        # The writer thread of every rank (rank "": a full shared disk) or of rank 1 alone
        # (the other one goes on into the collective close) gets an I/O error once the
        # step-8 data is written, the .tmp file still open, at the same point on every machine.
        job = self.start("bg-fail", 2, "zero3", 1, 1, steps=steps, ckdir=ckdir, every=every,
                         fault=fault, params=False)
        rc = job.finish(timeout=90)
        secs = job.seconds()
        errors = [l for l in job.stderr().splitlines() if l.startswith("amsp: error:")]
        problems = []
        if rc in (0, None) or rc < 0:
            problems.append(f"exit {rc} after {secs:.0f} s (expected a non-zero exit, not a hang or a kill)")
        if not errors or not all(f"{ckdir}/{name}: the background write failed" in l and "injected I/O error" in l
                                 for l in errors):
            problems.append(f"error lines {errors}")
        if step_files(ckdir) != [f"step-{every:08d}.h5"] or (latest_name(ckdir) or "").strip() != \
                f"step-{every:08d}.h5" or any(t != f".{name}.tmp" for t in tmp_files(ckdir)):
            problems.append(f"left {sorted(os.listdir(ckdir))}, latest {latest_name(ckdir)!r}")
        problems += [f"{f}: {t}" for f in step_files(ckdir) for ok, t in [self.verify(os.path.join(ckdir, f))]
                     if not ok]
        job2, rc2 = self.run("bg-fail-resume", 2, "zero3", 1, 1, steps=steps, ckdir=ckdir, every=every,
                             resume="auto", params=False)
        resumed = re.search(r"^resume: (\S+) \(step (\d+),", job2.stdout(), re.M)
        recs = read_metrics(self.path("bg-fail-resume.jsonl")) if os.path.exists(self.path("bg-fail-resume.jsonl")) \
            else []
        bad = exact_mismatches(recs, ref)
        if rc2 != 0 or not resumed or int(resumed.group(2)) != every or bad or \
                [r["step"] for r in recs if "loss" in r] != list(range(every + 1, steps + 1)):
            problems.append(f"resume exit {rc2}, {resumed.group(0) if resumed else 'no resume line'}, "
                            f"{len(bad)} records differ" + (f", first {bad[0]}" if bad else ""))
        self.report(not problems, f"10 a failing background write of step {failing} ({fault}): "
                                  f"exit {rc} in {secs:.0f} s, {errors[0] if errors else 'no error line'}; "
                                  f"step {every} intact and latest; --resume auto from step {every} to {steps} "
                                  f"bit for bit" + (f"; {'; '.join(problems)}" if problems else ""),
                    [' '.join(job.cmd), job.stdout()[-800:], job.stderr(), job2.stderr()])

    # ---------------------------------------------------------------- check 7
    def keep_last(self):
        ckdir = self.path("ck-keep")
        shutil.rmtree(ckdir, ignore_errors=True)
        job, rc = self.run("kl", 1, "ddp", 1, 1, steps=5, ckdir=ckdir, every=1, keep=2, params=False)
        left = sorted(os.listdir(ckdir)) if os.path.isdir(ckdir) else []
        want = ["latest", "step-00000004.h5", "step-00000005.h5"]
        ok = rc == 0 and left == want and (latest_name(ckdir) or "").strip() == "step-00000005.h5"
        job2, rc2 = self.run("kl", 1, "ddp", 1, 1, steps=7, ckdir=ckdir, every=1, keep=2, params=False,
                             resume="auto", fresh=False)
        left2 = sorted(os.listdir(ckdir))
        want2 = ["latest", "step-00000006.h5", "step-00000007.h5"]
        ok2 = rc2 == 0 and left2 == want2 and (latest_name(ckdir) or "").strip() == "step-00000007.h5"
        self.report(ok and ok2, f"7  --keep-last 2 with 5 checkpoints leaves {' '.join(left)}; "
                                f"resumed to step 7: {' '.join(left2)}",
                    [job.stderr(), job2.stderr()])


def run_checks(tests, checks, only):
    for name, fn in checks:
        if only and not any(o in name for o in only):
            continue
        try:
            fn()
        except (Failure, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
            kill_all_jobs()
            tests.report(False, f"{name}: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["mpi", "slurm"])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True, help="a corpus written by amsp data prepare")
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--cluster-scripts", default=os.path.join(REPO, "slurm", "local-cluster"))
    ap.add_argument("--only", action="append", default=[],
                    help="run only the checks whose name contains TEXT: same_plan_4, same_plan_1, "
                         "reshard_8_to_4, reshard_4_to_1, kills, flipped_byte, other_model, keep_last, "
                         "background")
    args = ap.parse_args()
    args.amsp = os.path.abspath(args.amsp)
    args.data = os.path.abspath(args.data)
    args.cluster_scripts = os.path.abspath(args.cluster_scripts)
    args.work = os.path.abspath(os.path.join(args.work, args.mode))

    if args.mode == "slurm":
        lacking = eq.lc.missing(("srun", "sinfo", "scontrol", "slurmctld", "slurmd", "munged"))
        if lacking:
            print(f"SKIP: needs root and Slurm + munge (missing: {lacking})")
            return SKIP
        os.environ["PATH"] = os.environ.get("PATH", "") + eq.lc.SBIN
    cluster_dir = os.path.join(args.work, "cluster")
    if args.mode == "slurm" and os.path.isdir(cluster_dir):
        # A run killed before its cleanup may have left daemons in this directory.
        subprocess.run([os.path.join(args.cluster_scripts, "stop.sh"), cluster_dir], env=eq.clean_env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=90)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work, exist_ok=True)

    t0 = time.time()
    tests = None
    try:
        with eq.lc.deadline(DEADLINE):  # the signals are ignored once it ends: the cleanup finishes
            if args.mode == "mpi":
                tests = Tests(args)
                run_checks(tests, [("same_plan_4", tests.same_plan_4), ("same_plan_1", tests.same_plan_1),
                                   ("reshard_4_to_1", tests.reshard_4_to_1),
                                   ("reshard_8_to_4", tests.reshard_8_to_4), ("kills", tests.kills),
                                   ("flipped_byte", tests.flipped_byte), ("other_model", tests.other_model),
                                   ("keep_last", tests.keep_last), ("changed_options", tests.changed_options),
                                   ("directory_lock", tests.directory_lock), ("background", tests.background)],
                           args.only)
            else:
                with eq.lc.local_cluster(args.cluster_scripts, cluster_dir) as conf:
                    try:
                        tests = Tests(args, eq.clean_env({"SLURM_CONF": conf}))
                        run_checks(tests, [("slurm_resume", tests.slurm_resume)], args.only)
                    finally:
                        kill_all_jobs()  # before the cluster stops
        print(f"{tests.passed} passed, {tests.failed} failed ({time.time() - t0:.0f} s)")
        return 1 if tests.failed else 0
    except (Failure, eq.lc.Interrupted, eq.lc.ClusterError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", flush=True)
        if tests:
            print(f"{tests.passed} passed, {tests.failed + 1} failed ({time.time() - t0:.0f} s)")
        return 1
    finally:
        kill_all_jobs()


if __name__ == "__main__":
    sys.exit(main())
