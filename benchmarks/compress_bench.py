#!/usr/bin/env python3
"""Compressed collectives against uncompressed ones, side by side, over many steps and seeds.

    python3 benchmarks/compress_bench.py --amsp build/amsp --data corpus.h5 [--model tiny]
        [--steps 1000] [--seeds 1,2,3,4,5] [--coarse-steps N] [--launcher slurm|mpiexec] [--work DIR]

For each seed, the same `amsp train` twice on 4 ranks, 2 nodes of 2 when launched by srun
on the local Slurm cluster (slurm/local-cluster, started here and stopped again) or 4
processes of mpiexec: zero3 in bf16, once with --compress off and once with p=int8,g=int8
(blocks of 256), the convergence guard every 100 steps. Then once with the compression made
deliberately too coarse (p=int4,g=int4, one scale per rank's chunk), which the guard must
name (over --coarse-steps steps, all of them by default; 0 leaves it out, for more seeds
of a preset whose coarse run is already measured). Printed per seed: the compressed groups' bytes per step against the uncompressed
run's (bf16), the median step time of each, the final validation loss of each, and the
guard's largest reading; then the goals of doc/compression.md:

  - bytes per step of the compressed collectives at most 0.55 of bf16's;
  - the final validation loss within 1% of the uncompressed run's, every seed;
  - no divergence (every run finishes, every loss finite);
  - the coarse run's guard above its threshold.

Exit 0 when every goal is met, 1 when one is not, 2 on a run that could not be made.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RANKS = 4
COMPRESSED = "p=int8,g=int8"
COARSE = "p=int4,g=int4,block=chunk"
BYTES_GOAL, LOSS_GOAL = 0.55, 0.01


def launcher(args, env):
    if args.launcher == "mpiexec":
        return [args.mpiexec, "-n", str(RANKS)]
    return ["srun", "--mpi=pmi2", "-N", "2", "--ntasks-per-node", "2", f"--time={args.minutes}"]


def train(args, env, compress, seed, tag, steps=None):
    metrics = os.path.join(args.work, f"{tag}.jsonl")
    cmd = launcher(args, env) + [
        args.amsp, "train", "--model", args.model, "--data", args.data, "--precision", "bf16",
        "--steps", str(steps or args.steps), "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
        "--shard", "zero3", "--compress", compress, "--seed", str(seed), "--eval-every", "0",
        "--eval-windows", str(args.eval_windows), "--threads", "1", "--peak-tflops", "1",
        "--compress-guard-every", str(args.guard_every), "--metrics", metrics]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with open(metrics) if os.path.exists(metrics) else open(os.devnull) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in rows if "loss" in r]
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    return {"ok": p.returncode == 0, "rc": p.returncode, "err": p.stderr.strip()[-400:],
            "steps": steps, "val": vals[-1] if vals else float("nan"),
            "guard_lines": [l for l in p.stdout.splitlines() if l.startswith("compress guard:")]}


def bytes_per_step(run, ops):
    """Mean bytes per step this rank sent in the given (group, op) pairs."""
    total = 0
    for r in run["steps"]:
        for group, op in ops:
            total += r["comm"].get(group, {}).get(op, {}).get("bytes_sent", 0)
    return total / max(1, len(run["steps"]))


def guard_max(run):
    errs = [r[k] for r in run["steps"] for k in ("compress_err_p", "compress_err_g") if k in r and r[k] is not None]
    return max(errs) if errs else float("nan")


def finite(run):
    return run["ok"] and len(run["steps"]) > 0 and all(r["loss"] == r["loss"] and abs(r["loss"]) < 1e30
                                                        for r in run["steps"])


def run_all(args, env):
    rows, fails = [], []
    for seed in args.seeds:
        off = train(args, env, "off", seed, f"off-{seed}")
        on = train(args, env, COMPRESSED, seed, f"int8-{seed}")
        for name, r in (("off", off), ("int8", on)):
            if not r["ok"]:
                sys.exit(f"compress_bench: seed {seed} {name} exited {r['rc']}: {r['err']}")
        plain = bytes_per_step(off, [("P", "all_gather"), ("P", "reduce_scatter")])
        packed = bytes_per_step(on, [("P", "all_gather"), ("P", "all_to_all")])
        ms = lambda r: statistics.median(s["step_ms"] for s in r["steps"][1:] or r["steps"])
        rows.append({"seed": seed, "ratio": packed / plain if plain else float("nan"),
                     "off_ms": ms(off), "on_ms": ms(on), "off_val": off["val"], "on_val": on["val"],
                     "loss_diff": abs(on["val"] - off["val"]) / off["val"], "guard": guard_max(on),
                     "warned": len(on["guard_lines"]), "finite": finite(off) and finite(on)})
    coarse = train(args, env, COARSE, args.seeds[0], "coarse", args.coarse_steps) if args.coarse_steps else None
    return rows, coarse


def report(args, rows, coarse):
    print(f"{args.model}, {args.steps} steps, {RANKS} ranks ({args.launcher}), zero3, bf16, "
          f"seq {args.seq_len} x batch {args.batch_size}; compressed: {COMPRESSED} against off")
    print("| seed | bytes/step of P's collectives, int8 / bf16 | step ms off / int8 | final val loss off / int8 "
          "(difference) | guard's largest reading | guard warnings |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['ratio']:.3f} | {r['off_ms']:.1f} / {r['on_ms']:.1f} | {r['off_val']:.4f} / "
              f"{r['on_val']:.4f} ({r['loss_diff']:.2%}) | {r['guard']:.2%} | {r['warned']} |")
    if coarse:
        print(f"coarse {COARSE}, seed {args.seeds[0]}, {args.coarse_steps} steps: guard's largest reading "
              f"{guard_max(coarse):.0%}, {len(coarse['guard_lines'])} warnings, final val loss {coarse['val']:.4f}"
              + ("" if coarse["ok"] else f" (exited {coarse['rc']})"))
    else:
        print("coarse run: not run (--coarse-steps 0)")
    goals = [
        (all(r["ratio"] <= BYTES_GOAL for r in rows), f"bytes per step at most {BYTES_GOAL} of bf16's"),
        (all(r["loss_diff"] <= LOSS_GOAL for r in rows), f"final validation loss within {LOSS_GOAL:.0%}, every seed"),
        (all(r["finite"] for r in rows), "no divergence"),
    ] + ([(len(coarse["guard_lines"]) > 0, "the coarse run trips the guard")] if coarse else [])
    for ok, text in goals:
        print(f"goal {'met' if ok else 'NOT MET'}: {text}")
    return 0 if all(ok for ok, _ in goals) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--guard-every", type=int, default=100)
    ap.add_argument("--coarse-steps", type=int, default=None, help="steps of the coarse run (default --steps; 0: none)")
    ap.add_argument("--launcher", choices=("slurm", "mpiexec"), default="slurm")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--minutes", type=int, default=60, help="srun --time per run")
    ap.add_argument("--work", default="/tmp/amsp-compress-bench")
    args = ap.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.coarse_steps is None:
        args.coarse_steps = args.steps
    args.amsp, args.data = os.path.abspath(args.amsp), os.path.abspath(args.data)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    if args.launcher == "mpiexec":
        return report(args, *run_all(args, dict(os.environ)))
    sys.path.insert(0, os.path.join(REPO, "validation", "slurm"))
    import local_cluster as lc  # noqa: E402
    why = lc.missing()
    if why:
        sys.exit(f"compress_bench: no local Slurm cluster here (missing: {why}); use --launcher mpiexec")
    with lc.deadline(args.minutes * 60 * (2 * len(args.seeds) + (1 if args.coarse_steps else 0))), \
            lc.local_cluster(os.path.join(REPO, "slurm", "local-cluster"), os.path.join(args.work, "cluster")) as conf:
        return report(args, *run_all(args, lc.clean_env({"SLURM_CONF": conf})))


if __name__ == "__main__":
    sys.exit(main())
