#!/usr/bin/env python3
"""The tiny preset learns; bf16 mixed precision trains like fp32, resumes bit for bit,
and crosses precisions.

1. The tiny preset, 300 steps on one rank, in fp32 and in bf16 from the same seed: in
   fp32 the validation loss ends below 75% of the initial one (the model learns the
   built-in corpus), and the final validation losses of the two agree within 2% (bf16
   rounds parameters, matmul results and gradients to 8 significant bits; the
   optimizer's fp32 master copy keeps the small updates, so the trajectories stay
   close).
2. bf16 on 2 ranks (zero3): a run stopped after step 11 (a USR1 raised at a named point,
   AMSP_FAULT) and resumed with --resume auto gives every step's loss and gradient norm
   and the final parameters bit for bit as the run that was never stopped: checkpoints
   hold the fp32 master weights and moments, and the bf16 parameters are rounded from them.
3. The bf16 checkpoint of step 11 resumes in fp32, and an fp32 one in bf16: both finish,
   the resume says what changed, and their final losses stay within 2% of the straight run.

usage: precision_test.py AMSP MPIEXEC DATA WORKDIR
Prints one line per check and ends with "N passed, M failed".
"""
import json
import os
import shutil
import subprocess
import sys

STEPS = 20
SEQ = 32


def train(amsp, data, work, tag, extra, ranks=1, mpiexec=None, env=None, steps=STEPS):
    metrics = os.path.join(work, tag + ".jsonl")
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [
        amsp, "train", "--model", "tiny", "--data", data, "--steps", str(steps),
        "--peak-tflops", "1", "--metrics", metrics,
        "--final-params", os.path.join(work, tag + ".bin")] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600,
                       env=dict(os.environ, **(env or {})))
    return p, metrics


def rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def vals(path):
    """The validation losses in order: step 0 (before training), then every --eval-every."""
    return [r["val_loss"] for r in rows(path) if r.get("val_loss") is not None]


def steps_of(path):
    """{step: (loss, grad_norm)} of the training steps; a resumed file appends."""
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in rows(path) if "loss" in r and "step" in r}


def main():
    amsp, mpiexec, data, work = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    results = []

    def check(ok, text):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {text}", flush=True)

    # 1. 300 steps of tiny: it learns in fp32, and bf16 ends where fp32 does.
    common = ["--steps", "300", "--seq-len", "64", "--batch-size", "8", "--threads", "2", "--eval-every", "100",
              "--eval-windows", "64"]
    final = {}
    for precision in ("fp32", "bf16"):
        p, m = train(amsp, data, work, f"long-{precision}", common[2:] + ["--precision", precision],
                     steps=300)
        if p.returncode != 0:
            check(False, f"300 steps in {precision}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
            return 1
        v = vals(m)
        final[precision] = v[-1] if len(v) >= 2 else float("nan")
        if precision == "fp32":
            first = v[0] if len(v) >= 2 else float("nan")
            check(final["fp32"] < 0.75 * first,
                  f"tiny, 300 steps in fp32 learns: validation loss {first:.4f} at step 0, {final['fp32']:.4f} "
                  f"after ({100 * final['fp32'] / first:.1f}% of it; need < 75%)")
    diff = abs(final["bf16"] - final["fp32"]) / final["fp32"]
    check(diff <= 0.02, f"tiny, 300 steps: final validation loss bf16 {final['bf16']:.4f} vs fp32 "
                        f"{final['fp32']:.4f}: {100 * diff:.2f}% apart (at most 2%)")

    # 2. bf16 resume, bit for bit, on 2 ranks with zero3.
    base = ["--seq-len", str(SEQ), "--batch-size", "2", "--threads", "1", "--shard", "zero3",
            "--eval-every", "0", "--eval-windows", "8"]
    p, straight = train(amsp, data, work, "straight", base + ["--precision", "bf16"], 2, mpiexec)
    ckdir = os.path.join(work, "ckpt-bf16")
    q, resumed = train(amsp, data, work, "resumed",
                       base + ["--precision", "bf16", "--checkpoint-dir", ckdir, "--resume", "auto"],
                       2, mpiexec, env={"AMSP_FAULT": "train.step@11,USR1"})
    stopped_ok = q.returncode == 75
    r, resumed = train(amsp, data, work, "resumed",
                       base + ["--precision", "bf16", "--checkpoint-dir", ckdir, "--resume", "auto"],
                       2, mpiexec)
    same_steps = p.returncode == 0 and r.returncode == 0 and steps_of(straight) == steps_of(resumed)
    same_params = (p.returncode == 0 and r.returncode == 0 and
                   open(os.path.join(work, "straight.bin"), "rb").read() ==
                   open(os.path.join(work, "resumed.bin"), "rb").read())
    check(stopped_ok and same_steps and same_params,
          f"bf16 zero3 on 2 ranks stopped after step 11 (exit {q.returncode}) and resumed (exit "
          f"{r.returncode}): losses and norms {'identical' if same_steps else 'DIFFER'}, final "
          f"parameters {'identical' if same_params else 'DIFFER'}")

    # 3. Across precisions: the step-11 checkpoint of each precision resumes in the other.
    straight_final = rows(straight)[-1]["loss"] if p.returncode == 0 else float("nan")
    for was, now in (("bf16", "fp32"), ("fp32", "bf16")):
        d = os.path.join(work, f"cross-{was}")
        a, _ = train(amsp, data, work, f"cross-{was}-first", base + ["--precision", was,
                     "--checkpoint-dir", d, "--resume", "auto"], 2, mpiexec,
                     env={"AMSP_FAULT": "train.step@11,USR1"})
        b, m = train(amsp, data, work, f"cross-{was}-then-{now}", base + ["--precision", now,
                     "--checkpoint-dir", d, "--resume", "auto"], 2, mpiexec)
        said = f"--precision {now} (was {was})" in b.stdout
        last = rows(m)[-1]["loss"] if b.returncode == 0 and rows(m) else float("nan")
        close = abs(last - straight_final) / straight_final <= 0.02
        check(a.returncode == 75 and b.returncode == 0 and said and close,
              f"{was} checkpoint of step 11 resumed in {now}: exit {a.returncode} then {b.returncode}, "
              f"change {'named' if said else 'NOT named'}, last loss {last:.4f} vs {straight_final:.4f} "
              f"straight bf16")

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
