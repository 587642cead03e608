#!/usr/bin/env python3
"""A stuck or dead rank ends the whole job with a message, never a silent hang.

- stuck: one rank of a 4-rank zero3 job is stopped (SIGSTOP) after step 2; with
  --comm-timeout 5 the others must abort within a bound, naming a rank and the
  operation that timed out.
- dead: one rank is killed (SIGKILL); the job must end, non-zero, within a bound (the
  process manager, mpiexec or srun, ends the others).

usage: failure_test.py AMSP MPIEXEC DATA WORKDIR
"""
import json
import os
import signal
import subprocess
import sys
import time

BOUND_S = 60


def rank_pids(tag):
    """PIDs of the amsp ranks of this job (their command line holds the unique tag)."""
    out = subprocess.run(["pgrep", "-f", f"amsp train .*{tag}"], stdout=subprocess.PIPE, text=True).stdout
    pids = []
    for p in out.split():
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "amsp":  # not mpiexec, whose command line holds the tag too
                    pids.append(int(p))
        except OSError:
            pass
    return sorted(pids)


def start(amsp, mpiexec, data, work, tag):
    metrics = os.path.join(work, f"{tag}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [mpiexec, "-n", "4", amsp, "train", "--model", "tiny", "--data", data, "--steps", "100000",
           "--seq-len", "32", "--batch-size", "1", "--shard", "zero3", "--eval-every", "0",
           "--peak-tflops", "1", "--threads", "1", "--comm-timeout", "5", "--metrics", metrics]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3:
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"job ended early: {proc.stderr.read()}")
        time.sleep(0.2)
    raise RuntimeError("job did not reach step 2")


def finish(proc):
    try:
        _, err = proc.communicate(timeout=BOUND_S)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, ""


def case(name, sig, expect, amsp, mpiexec, data, work):
    tag = f"{work}/{name}"
    proc = start(amsp, mpiexec, data, work, name)
    pids = rank_pids(tag)
    t0 = time.time()
    victim = pids[-1]
    os.kill(victim, sig)
    rc, err = finish(proc)
    took = time.time() - t0
    for p in rank_pids(tag):  # leave nothing behind
        os.kill(p, signal.SIGKILL)
    lines = [l for l in err.splitlines() if l.strip()]
    ok = rc not in (None, 0) and (not expect or any(expect in l for l in lines))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: signal {sig} to one of {len(pids)} ranks; job ended "
          f"{'(never: hang)' if rc is None else f'with {rc} after {took:.1f} s'}")
    for l in lines[:3]:
        print(f"     {l}")
    return ok


def main():
    amsp, mpiexec, data, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    results = [case("stuck", signal.SIGSTOP, "timeout", amsp, mpiexec, data, work),
               case("dead", signal.SIGKILL, "", amsp, mpiexec, data, work)]
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
