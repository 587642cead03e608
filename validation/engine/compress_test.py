#!/usr/bin/env python3
"""Compressed collectives train what the uncompressed run trains, to the quantization's
error, and move the bytes the records hold.

On 4 ranks (zero3: every unit gathered over P before its forward and its backward, its
gradient reduce-scattered over P after), `amsp train` runs 20 steps of the tiny preset
with --compress off, p=int8 (the parameters' all-gathers, block 256), g=int8 (the
gradients' reduce-scatters, as an all-to-all of records summed in fp32) and
p=int4,block=chunk (one scale per rank's chunk, deliberately coarse), in fp32 and in
bf16. Required:

  - p=int8 and g=int8: every step's loss within 5e-3 (relative) of the uncompressed
    run's, the final validation loss within 1% (doc/compression.md: int8 blocks of 256
    keep each value within half a step of 1/254 of its block's largest value, 0.4% of
    it; the worst step measured 2.04e-3 for bf16 p=int8 on an AMD EPYC with AVX-512,
    within 2e-3 on the suite's other machines, while a gather or a sum that drops ranks'
    records is off by 2.6e-2 and more);
  - p=int4,block=chunk: its final validation loss further from the uncompressed one
    than int8's (the compression acts where the schedule says);
  - the P group's all-gather bytes per step: int8 at most 0.27 of fp32's (0.54 of
    bf16's), int4 at most 0.14 (0.28): one byte (half a byte) per value plus an fp32
    scale per block, against four (two); with g=int8 the reduce-scatter's bytes become
    an all-to-all's, at most 0.27 (0.54) of them, and the all-gathers' do not change;
  - the convergence guard (every 10 steps, so at steps 1 and 11): int8's readings of
    each compressed kind below the 5% threshold and no warning; p=int4,block=chunk's
    reading above it and its warning line at both steps;
  - the guard's fallback (fp32, p=int4,g=int8,block=chunk, --compress-guard fallback,
    a checkpoint every 2 steps): at step 1 it stops compressing the all-gathers and
    says so, every later step moves the bytes of an uncompressed all-gather; resumed
    from step 4, the run says it keeps the switch and moves the same bytes, while
    g=int8 stays on (its reading at step 4 and 7 is still taken);
  - evaluation gathers exactly: the fp32 p=int8 run's final validation loss is that of
    its final checkpoint under `amsp eval` (to 1e-6), not of its quantized copies.

usage: compress_test.py --amsp PATH --data CORPUS.h5 --work DIR --mpiexec PATH
Prints one line per check and ends with "N passed, M failed"; exit 1 on any failure.
"""

import json
import os
import subprocess
import sys

from checks import Checks, job_args

STEPS, SEQ, RANKS = 20, 32, 4


GUARD_EVERY, THRESHOLD = 10, 0.05


def train(args, precision, compress, steps=STEPS, extra=(), tag=None):
    tag = tag or f"{precision}-{compress.replace(',', '_').replace('=', '')}"
    metrics = os.path.join(args.work, tag + ".jsonl")
    cmd = [args.mpiexec, "-n", str(RANKS), args.amsp, "train", "--model", "tiny", "--data", args.data,
           "--precision", precision, "--steps", str(steps), "--seq-len", str(SEQ), "--batch-size", "1",
           "--shard", "zero3", "--compress", compress, "--eval-every", "0", "--eval-windows", "8",
           "--peak-tflops", "1", "--threads", "1", "--metrics", metrics,
           "--compress-guard-every", str(GUARD_EVERY), *extra]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-600:]}")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in rows if "loss" in r]
    return {"loss": [r["loss"] for r in steps], "val": [r["val_loss"] for r in rows if "val_loss" in r][-1],
            "comm": steps[-1]["comm"], "steps": steps, "out": p.stdout,
            "guard_lines": [l for l in p.stdout.splitlines() if l.startswith("compress guard:")]}


def readings(run, key):
    """{step: the guard's reading} of one kind."""
    return {r["step"]: r[key] for r in run["steps"] if key in r}


def check_guard(check, precision, q8, g8, q4):
    due = {1, 1 + GUARD_EVERY}
    for name, run, key in (("p=int8", q8, "compress_err_p"), ("g=int8", g8, "compress_err_g")):
        got = readings(run, key)
        check(set(got) == due and all(0 < e < THRESHOLD for e in got.values()) and not run["guard_lines"],
              f"{precision} {name}: the guard read {', '.join(f'{e:.2%} at step {s}' for s, e in got.items())} "
              f"(due at {sorted(due)}, below {THRESHOLD:.0%}), {len(run['guard_lines'])} warnings")
    got = readings(q4, "compress_err_p")
    warned = [l for l in q4["guard_lines"] if "parameters' all-gathers as int4" in l and "fallback would" in l]
    check(set(got) == due and all(e > THRESHOLD for e in got.values()) and len(warned) == 2,
          f"{precision} p=int4,block=chunk: the guard read {', '.join(f'{e:.0%}' for e in got.values())} "
          f"and warned {len(warned)} times")


def check_fallback(check, args, uncompressed_gather):
    ckpt = os.path.join(args.work, "guard-ckpt")
    flags = ["--compress-guard", "fallback", "--compress-guard-every", "3", "--checkpoint-dir", ckpt,
             "--checkpoint-every", "2", "--checkpoint-mode", "sync"]
    c = "p=int4,g=int8,block=chunk"
    first = train(args, "fp32", c, steps=4, extra=flags, tag="fallback-1")
    again = train(args, "fp32", c, steps=8, extra=flags + ["--resume", "auto"], tag="fallback-2")
    said = [l for l in first["guard_lines"] if "parameters' all-gathers as int4" in l and "uncompressed from step 1 on" in l]
    gathers = [op_bytes({"comm": r["comm"]}, "P", "all_gather") for r in first["steps"] + again["steps"]]
    kept = any(l.startswith("resume: --compress p=off,g=int8,block=chunk as the compression guard left it")
               for l in again["out"].splitlines())
    g_read = sorted(readings(first, "compress_err_g")) + sorted(readings(again, "compress_err_g"))
    check(len(said) == 1 and kept and gathers and all(b == uncompressed_gather for b in gathers)
          and g_read == [1, 4, 7] and not readings(again, "compress_err_p"),
          f"fallback: switched at step 1 ({len(said)} line), kept on resume ({kept}), every step's P all-gather "
          f"{sorted(set(gathers))} bytes (uncompressed: {uncompressed_gather}), g=int8 read at steps {g_read}")


def check_eval_exact(check, args, q8, saved):
    """The run's validation loss is its weights', gathered exactly: amsp eval of its last
    checkpoint (fp32, the same plan, ranks and windows) says the same."""
    last = os.path.join(saved, f"step-{STEPS:08d}.h5")
    cmd = [args.mpiexec, "-n", str(RANKS), args.amsp, "eval", "--checkpoint", last, "--data", args.data,
           "--seq-len", str(SEQ), "--batch-size", "1", "--windows", "8", "--shard", "zero3", "--threads", "1"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-600:]}")
    exact = float(p.stdout.split(" loss ")[1].split()[0])
    rel = abs(q8["val"] - exact) / exact
    check(rel <= 1e-6, f"fp32 p=int8: the run's final val loss {q8['val']:.6f} is its checkpoint's, "
                       f"evaluated uncompressed: {exact:.6f} (relative {rel:.1e}, at most 1e-6)")


def op_bytes(run, group, op):
    return run["comm"].get(group, {}).get(op, {}).get("bytes_sent", 0)


def main():
    args = job_args()
    check = Checks()

    for precision, value_bytes in (("fp32", 4), ("bf16", 2)):
        try:
            saved = os.path.join(args.work, f"{precision}-p8-ckpt")
            off, q8, g8, q4 = (train(args, precision, c, extra=["--checkpoint-dir", saved] if c == "p=int8" else ())
                               for c in ("off", "p=int8", "g=int8", "p=int4,block=chunk"))
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            check(False, f"{precision}: {e}")
            continue
        for name, run in (("p=int8", q8), ("g=int8", g8)):
            worst = max(abs(a - b) / abs(b) for a, b in zip(run["loss"], off["loss"]))
            val = abs(run["val"] - off["val"]) / off["val"]
            check(len(run["loss"]) == STEPS and worst <= 5e-3 and val <= 0.01,
                  f"{precision} {name}: losses within {worst:.1e} of uncompressed, final val loss "
                  f"{run['val']:.4f} against {off['val']:.4f} ({val:.2%})")
        val8, val4 = abs(q8["val"] - off["val"]) / off["val"], abs(q4["val"] - off["val"]) / off["val"]
        check(val4 > val8, f"{precision} p=int4,block=chunk: final val loss {q4['val']:.4f}, {val4:.2%} "
                           f"from uncompressed (int8: {val8:.2%})")
        a_off, a8, a4 = (op_bytes(r, "P", "all_gather") for r in (off, q8, q4))
        r8, r4 = a8 / a_off, a4 / a_off
        lim8, lim4 = 1.08 / value_bytes, 0.56 / value_bytes
        check(0 < r8 <= lim8 and 0 < r4 <= lim4,
              f"{precision} P all-gather bytes per step: int8 {r8:.3f} (at most {lim8:.2f}), int4 {r4:.3f} "
              f"(at most {lim4:.2f}) of uncompressed")
        rs_off = op_bytes(off, "P", "reduce_scatter")
        same = all(op_bytes(r, "P", "reduce_scatter") == rs_off for r in (q8, q4))
        check(same, f"{precision} p= leaves the gradients' reduce-scatter bytes as they were: {rs_off}")
        rg = op_bytes(g8, "P", "all_to_all") / rs_off
        check(0 < rg <= lim8 and op_bytes(g8, "P", "reduce_scatter") == 0
              and op_bytes(g8, "P", "all_gather") == a_off,
              f"{precision} g=int8: the reduce-scatter's bytes move as an all-to-all of records, {rg:.3f} "
              f"of them (at most {lim8:.2f}); the all-gathers' unchanged")
        check_guard(check, precision, q8, g8, q4)
        if precision == "fp32":
            try:
                check_eval_exact(check, args, q8, saved)
                check_fallback(check, args, a_off)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                check(False, f"fallback: {e}")
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
