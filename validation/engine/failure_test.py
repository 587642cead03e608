#!/usr/bin/env python3
"""A stuck or dead rank ends the whole job with a message, never a silent hang.

- stuck: rank 3 of a 4-rank zero3 job is stopped (SIGSTOP, from outside, at whatever
  moment) after step 2; with --comm-timeout 5 the job must end, non-zero, within BOUND_S
  seconds of the stop, and its first error line must be exactly the hang line a waiting
  rank prints (comm/watchdog.h): one of the other ranks, this host, naming rank 3 (local
  3) as not answering, the op, a group of the 4 ranks, 5 s (a communicator's op, or one
  of the engine's blocking all-reduces on the world). Any other first error fails.
- dead: one rank is killed (SIGKILL); the job must end, non-zero, within BOUND_S (the
  process manager, mpiexec or srun, ends the others).

usage: failure_test.py AMSP MPIEXEC DATA WORKDIR
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

BOUND_S = 60        # from the signal to the end of the job: the 5 s timeout and the teardown
START_S = 120       # for the job to reach step 2 (a precondition, not a verdict)
RANKS, TIMEOUT_S, VICTIM = 4, 5, 3
OPS = "all_gather|reduce_scatter|all_reduce|broadcast"
GROUPS = "P|G|OS|replica|gather|world"


def hang_line():
    """The line the waiting rank that reports prints when a collective it waits for does
    not complete because the stopped rank cannot answer (comm/watchdog.cpp), as a regular
    expression with the ranks, the host and the limit of this test."""
    host = re.escape(socket.gethostname())
    return re.compile(rf"amsp: error: rank (?P<rank>\d+) of {RANKS} on host {host}: hang: "
                      rf"rank (?P<culprit>\d+) \({host}, local (?P<local>\d+)\) did not answer within 3.0 s "
                      rf"\(stopped, dead or wedged\) and holds up (?P<op>{OPS}) #\d+ on the (?P<group>{GROUPS}) "
                      rf"group of ranks 0-{RANKS - 1}; ranks? [0-9, -]+ waited {TIMEOUT_S}.0 s$")


def stuck_verdict(lines, victim_rank):
    """Why the error lines of the stuck case are not the hang line naming the stopped rank
    ("" if they are)."""
    errors = [l for l in lines if l.startswith("amsp: error:")]
    if not errors:
        return "no 'amsp: error:' line"
    m = hang_line().match(errors[0])
    if not m:
        return f"the first error is not a hang line of the expected form: {errors[0]!r}"
    if int(m["rank"]) == victim_rank:
        return f"the stopped rank {victim_rank} reported the hang"
    if int(m["culprit"]) != victim_rank or int(m["local"]) != victim_rank:
        return f"the line names rank {m['culprit']}, the stopped one is {victim_rank}"
    return ""


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
    cmd = [mpiexec, "-n", str(RANKS), amsp, "train", "--model", "tiny", "--data", data, "--steps", "100000",
           "--seq-len", "32", "--batch-size", "1", "--shard", "zero3", "--eval-every", "0",
           "--peak-tflops", "1", "--threads", "1", "--comm-timeout", str(TIMEOUT_S), "--metrics", metrics]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + START_S
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


def mpi_rank(pid):
    """The MPI rank of a process mpiexec (Hydra) started: PMI_RANK in its environment."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        for var in f.read().split(b"\0"):
            if var.startswith(b"PMI_RANK="):
                return int(var[9:])
    return None


def case(name, sig, amsp, mpiexec, data, work):
    tag = f"{work}/{name}"
    proc = start(amsp, mpiexec, data, work, name)
    pids = rank_pids(tag)
    ranks = {mpi_rank(p): p for p in pids}
    if sorted(ranks, key=str) != list(range(RANKS)) or len(pids) != RANKS:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        print(f"FAIL {name}: expected {RANKS} amsp ranks with PMI_RANK 0..{RANKS - 1}, found {ranks}")
        return False
    t0 = time.time()
    os.kill(ranks[VICTIM], sig)
    rc, err = finish(proc)
    took = time.time() - t0
    for p in rank_pids(tag):  # leave nothing behind
        os.kill(p, signal.SIGKILL)
    lines = [l for l in err.splitlines() if l.strip()]
    why = ""
    if rc is None:
        why = f"the job did not end within {BOUND_S} s (a hang)"
    elif rc == 0:
        why = "the job ended with exit code 0"
    elif sig == signal.SIGSTOP:
        why = stuck_verdict(lines, VICTIM)
    print(f"{'ok  ' if not why else 'FAIL'} {name}: signal {sig} to rank {VICTIM} of {len(pids)}; job ended "
          f"{'(never: hang)' if rc is None else f'with {rc} after {took:.1f} s (bound {BOUND_S} s)'}"
          f"{': ' + why if why else ''}")
    for l in lines[:3]:
        print(f"     {l}")
    return not why


def main():
    amsp, mpiexec, data, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    results = [case("stuck", signal.SIGSTOP, amsp, mpiexec, data, work),
               case("dead", signal.SIGKILL, amsp, mpiexec, data, work)]
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
