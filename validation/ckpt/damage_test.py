#!/usr/bin/env python3
"""Damaged checkpoints: never a resume from wrong state, never a crash, never a hang.

A run of the tiny preset writes checkpoints at steps 5 and 10; an uninterrupted run
gives the reference losses. Each trial copies the checkpoint directory, damages the
newest file (step 10) at one byte offset with one bit pattern, and runs, each under a
deadline:
  amsp ckpt verify step-10.h5
  amsp train --resume auto (to step 12)
A trial is
  rejected  verify exits 1 or 2 with one error line, and the resume skips step 10
            ("resume: skipping ...") and continues from step 5, its losses equal to the
            uninterrupted run's bit for bit;
  harmless  verify passes, the resume continues from step 10, losses bit-identical;
  a crash   any process ended by a signal or an exit code other than 0, 1, 2;
  a hang    any process still running at its deadline;
  wrong     anything else (verify and resume disagree, losses differ, several lines).
Only rejected and harmless trials pass.

Five targeted changes run first and must each be rejected: the digit of "step":10 in
the manifest text flipped, and with h5py the step attribute rewritten (10 -> 11), a
dataset deleted, one renamed, one added.

Offsets: --sample N picks N offsets spread evenly over the first 16 KiB (HDF5's
superblock, object headers, the manifest) plus N // 4 random offsets in the rest of the
file; --full takes every byte of the first 16 KiB and --random R random offsets beyond.
The random offsets come from --seed (default 1), so every run checks the same trials and
a failure is rerun by running the same command; the seed is printed with the trial count.
Patterns: each offset is XORed with one of 0x01, 0x80, 0xff (cycled; --patterns to pick).

A sweep that takes hours can be stopped and continued: with --journal FILE each
finished trial is appended to FILE, and a later run with the same FILE and --work keeps
the work directory's checkpoints and reference losses, skips the trials already
recorded, and counts them in the summary. The work directory records the seed, and a
continuation with another seed (whose trial numbers would name other offsets) is refused.

usage: damage_test.py --amsp PATH --data CORPUS.h5 --work DIR [--sample N | --full]
                      [--random R] [--seed S] [--jobs J] [--journal FILE]
Prints a summary line "trials T: rejected R, harmless H, hangs 0, crashes 0, wrong 0"
and ends with "N passed, M failed"; exit 1 if any trial failed.
"""

import argparse
import concurrent.futures
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time

STEPS, RESUME_TO, SEQ = 10, 12, 32
DEFAULT_SEED = 1
VERIFY_DEADLINE, TRAIN_DEADLINE, CHECK_DEADLINE = 60, 120, 10


def train_cmd(args, ckdir, metrics, steps, resume):
    return [args.amsp, "train", "--model", "tiny", "--data", args.data, "--steps", str(steps),
            "--seq-len", str(SEQ), "--batch-size", "2", "--eval-every", "0", "--eval-windows", "1",
            "--threads", "1", "--peak-tflops", "1", "--shard", "ddp", "--checkpoint-dir", ckdir,
            "--checkpoint-every", "5", "--resume", resume, "--metrics", metrics,
            # The run writing the checkpoints is killed at the start of step 11, which must
            # find the step-10 file complete: a background write might still be under way.
            "--checkpoint-mode", "sync"]


def run(cmd, deadline, fault=None):
    """(returncode or None on a hang, stdout, stderr)."""
    # The checking process's deadline (ckpt::check_in_child), well inside this script's.
    env = dict(os.environ, OMP_NUM_THREADS="1", AMSP_CKPT_CHECK_TIMEOUT=str(CHECK_DEADLINE))
    if fault:
        env["AMSP_FAULT"] = fault
    # errors="replace": a message quoting a damaged name must not break the test itself.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True, env=env)
    try:
        out, err = p.communicate(timeout=deadline)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        return None, out, err


def losses(path):
    if not os.path.exists(path):
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}


def flip(path, offset, pattern):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ pattern]))


def change_with_h5py(path, how):
    """Edits a checkpoint the way a person or a tool could: still valid HDF5."""
    import h5py
    with h5py.File(path, "r+") as f:
        if how == "step attribute 10 -> 11":
            f.attrs.modify("step", 11)
        elif how == "a dataset deleted":
            del f["optimizer/exp_avg/lm_head.weight"]
        elif how == "a dataset renamed":
            f.move("model/norm.weight", "model/norm2.weight")
        elif how == "an extra dataset":
            f["model/extra.weight"] = [1.0, 2.0]
        else:
            raise ValueError(how)


# Damage aimed at what decides a resume, beyond random bytes.
TARGETED = ("manifest text: the digit of \"step\":10 flipped", "step attribute 10 -> 11",
            "a dataset deleted", "a dataset renamed", "an extra dataset")


def damage(victim, offset, pattern, targeted):
    if targeted is None:
        flip(victim, offset, pattern)
        return f"offset {offset} ^ 0x{pattern:02x}"
    if targeted.startswith("manifest"):
        data = open(victim, "rb").read()
        at = data.find(b'"step":10,')
        if at < 0:
            raise RuntimeError('no "step":10 in the file: has the manifest changed?')
        flip(victim, at + len('"step":1'), 0x01)  # '0' -> '1': step 11
    else:
        change_with_h5py(victim, targeted)
    return targeted


def trial(args, base, ref, offset, pattern, index, targeted=None):
    work = os.path.join(args.work, f"t{index}")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    victim = os.path.join(work, "step-00000010.h5")
    where = damage(victim, offset, pattern, targeted)
    vrc, vout, verr = run([args.amsp, "ckpt", "verify", victim], VERIFY_DEADLINE)
    metrics = os.path.join(work, "m.jsonl")
    trc, tout, terr = run(train_cmd(args, work, metrics, RESUME_TO, "auto"), TRAIN_DEADLINE)
    got = losses(metrics)
    shutil.rmtree(work, ignore_errors=True)
    for name, rc in (("verify", vrc), ("train", trc)):
        if rc is None:
            return "hang", f"{where}: {name} did not finish within its deadline"
        if rc < 0 or rc not in (0, 1, 2):
            return "crash", f"{where}: {name} ended with {rc}: {(verr if name == 'verify' else terr)[-300:]}"
    errors = [l for l in verr.splitlines() if l.strip()]
    if vrc != 0 and (len(errors) != 1 or not errors[0].startswith("amsp: error: checkpoint ")):
        return "wrong", f"{where}: verify exit {vrc} without one error line: {errors[:3]}"
    if vrc != 0 and any(ord(c) < 32 or c == "\ufffd" for c in errors[0]):
        return "wrong", f"{where}: verify's error line holds raw bytes of the damaged file: {errors[0]!r}"
    m = re.search(r"^resume: (\S+) \(step (\d+),", tout, re.M)
    resumed = int(m.group(2)) if m else None
    expect_from = 10 if vrc == 0 else 5
    if trc != 0 or resumed != expect_from:
        return "wrong", (f"{where}: verify exit {vrc}, the resume exited {trc} from step {resumed} "
                         f"(expected {expect_from}): {terr.strip()[-300:]}")
    want = {s: ref[s] for s in range(expect_from + 1, RESUME_TO + 1)}
    if got != want:
        return "wrong", f"{where}: losses {got} differ from the uninterrupted run's {want}"
    return ("harmless" if vrc == 0 else "rejected"), f"{where}: {errors[0][:300] if errors else 'ok'}"


def reference(args):
    """Writes the damaged run's checkpoints (work/base) and the uninterrupted run's losses."""
    # The run that writes the checkpoints is the uninterrupted run's schedule (RESUME_TO
    # steps), killed at the start of step 11, after its step-10 checkpoint.
    base = os.path.join(args.work, "base")
    rc, out, err = run(train_cmd(args, base, os.path.join(args.work, "base.jsonl"), RESUME_TO, "none"),
                       TRAIN_DEADLINE, fault=f"train.step@{STEPS + 1}")
    if rc != -9 or not os.path.exists(os.path.join(base, "step-00000010.h5")):
        print(f"FAIL: the run writing the checkpoints exited {rc}, not killed after step 10: {err[-1000:]}")
        return None
    refdir = os.path.join(args.work, "ref")
    rc, out, err = run(train_cmd(args, refdir, os.path.join(args.work, "ref.jsonl"), RESUME_TO, "none"),
                       TRAIN_DEADLINE)
    if rc != 0:
        print(f"FAIL: the uninterrupted run exited {rc}: {err[-1000:]}")
        return None
    shutil.rmtree(refdir)
    return losses(os.path.join(args.work, "ref.jsonl"))


def load_journal(path):
    """{trial index: (kind, text)} of a sweep stopped earlier; {} without one."""
    if not path or not os.path.exists(path):
        return {}
    return {r["index"]: (r["kind"], r["text"]) for r in map(json.loads, open(path))}


def journal_writer(path):
    """A function appending one finished trial to the journal (none without a path)."""
    lock = threading.Lock()

    def record(index, kind, text):
        if path:
            with lock, open(path, "a") as f:
                f.write(json.dumps({"index": index, "kind": kind, "text": text}) + "\n")
    return record


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--sample", type=int, default=48, help="offsets in the first 16 KiB (default 48)")
    ap.add_argument("--full", action="store_true", help="every byte of the first 16 KiB")
    ap.add_argument("--random", type=int, default=None, help="random offsets past 16 KiB (default sample/4)")
    ap.add_argument("--patterns", default="01,80,ff", help="XOR masks, cycled over the offsets")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED,
                    help=f"for the random offsets (default {DEFAULT_SEED}: every run checks the same trials)")
    ap.add_argument("--jobs", type=int, default=1, help="trials run at once")
    ap.add_argument("--progress", type=int, default=0, help="print the counts every N trials")
    ap.add_argument("--journal", default=None, help="append each trial here; continue a stopped sweep")
    args = ap.parse_args()
    args.amsp, args.data = os.path.abspath(args.amsp), os.path.abspath(args.data)
    journal = load_journal(args.journal)
    if not journal:
        shutil.rmtree(args.work, ignore_errors=True)
        os.makedirs(args.work)
    seed_file = os.path.join(args.work, "seed")
    if journal:
        recorded = open(seed_file).read().strip() if os.path.exists(seed_file) else None
        if recorded is not None and recorded != str(args.seed):
            print(f"FAIL: {args.journal} continues a sweep with --seed {recorded}, not {args.seed}: its trial "
                  f"numbers name other offsets (use --seed {recorded}, or another journal and --work)")
            return 1
    with open(seed_file, "w") as f:
        f.write(f"{args.seed}\n")
    t0 = time.time()
    ref = reference(args) if not journal else losses(os.path.join(args.work, "ref.jsonl"))
    if ref is None:
        return 1
    base = os.path.join(args.work, "base")
    size = os.path.getsize(os.path.join(base, "step-00000010.h5"))
    head = min(16384, size)
    rng = random.Random(args.seed)
    offsets = list(range(head)) if args.full else sorted({int(i * head / args.sample) for i in range(args.sample)})
    n_random = args.random if args.random is not None else len(offsets) // 4
    offsets += sorted(rng.randrange(head, size) for _ in range(n_random)) if size > head else []
    patterns = [int(p, 16) for p in args.patterns.split(",")]
    print(f"damaging step-00000010.h5 ({size} bytes): {len(offsets)} trials, random offsets from --seed "
          f"{args.seed}", flush=True)

    jobs = [(len(offsets) + k, 0, 0, t) for k, t in enumerate(TARGETED)]
    jobs += [(i, off, patterns[i % len(patterns)], None) for i, off in enumerate(offsets)]
    record = journal_writer(args.journal)

    def one(index, offset, pattern, targeted):
        if index in journal:
            return journal[index]
        result = trial(args, base, ref, offset, pattern, index, targeted)
        record(index, *result)
        return result

    counts = {k: 0 for k in ("rejected", "harmless", "hang", "crash", "wrong")}
    caught = {"did not finish": 0, "killed by": 0}  # HDF5 hangs and crashes the checking process took
    bad = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, *job) for job in jobs]
        for i, f in enumerate(futures):
            kind, text = f.result()
            for k in caught:
                caught[k] += kind == "rejected" and k in text
            if i < len(TARGETED) and kind != "rejected":
                kind, text = "wrong", f"{text}: expected a rejection ({kind})"
            if i < len(TARGETED):
                print(f"     {TARGETED[i]}: {kind}: {text[:200]}", flush=True)
            counts[kind] += 1
            if kind not in ("rejected", "harmless"):
                bad.append(text)
                print(f"FAIL {kind}: {text}", flush=True)
            if args.progress and (i + 1) % args.progress == 0:
                print(f"     after {i + 1} trials: rejected {counts['rejected']}, harmless {counts['harmless']}, "
                      f"hangs {counts['hang']}, crashes {counts['crash']}, wrong {counts['wrong']}; HDF5 hung "
                      f"{caught['did not finish']}, crashed {caught['killed by']} in the checker "
                      f"({time.time() - t0:.0f} s)", flush=True)
    earlier = f", {len(journal)} of them from the journal" if journal else ""
    print(f"trials {len(futures)}: rejected {counts['rejected']}, harmless {counts['harmless']}, "
          f"hangs {counts['hang']}, crashes {counts['crash']}, wrong {counts['wrong']} "
          f"({time.time() - t0:.0f} s{earlier}); among the rejected, HDF5 hung {caught['did not finish']} and crashed "
          f"{caught['killed by']} times in the checking process")
    if bad:
        print(f"the same trials again: --seed {args.seed} with the same --sample/--full, --random and --patterns")
    print(f"{len(futures) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
