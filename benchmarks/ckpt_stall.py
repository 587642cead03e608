#!/usr/bin/env python3
"""Training stall per checkpoint, --checkpoint-mode sync against background, side by side.

    python3 benchmarks/ckpt_stall.py --amsp build/amsp --data corpus.h5 [--model base]
        [--ranks 2] [--steps 24] [--every 8] [--keep-last 2] [--seq-len 64] [--precision fp32|bf16]
        [--device cpu|cuda] [--work DIR] [--json FILE]

Runs the same `amsp train` twice, once per mode (same model, plan, data, seed; a
checkpoint every --every steps and at the end), and prints for each checkpoint the time
training was blocked by it: sync, the whole save (ckpt_stall_ms); background, the wait
at the step boundary (ckpt_stall_ms: the previous write still in flight) plus the time
the next step's optimizer updates waited for the snapshot (ckpt_update_wait_ms), since
the snapshot overlaps that step. Beside them: the background write's own time
(ckpt_write_ms, on the writer thread) and the step after the save, against an ordinary
step (the median of the sync run's steps that neither follow a save nor are the first
two). The goals (doc/checkpoints.md): a background stall under 5% of an ordinary step,
and the step after a save within 10% of one. The last checkpoint is waited for at the
end of training in both modes, so its row has no step after it.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys


def run(args, mode):
    ckdir = os.path.join(args.work, f"ck-{mode}")
    metrics = os.path.join(args.work, f"{mode}.jsonl")
    shutil.rmtree(ckdir, ignore_errors=True)
    cmd = ([args.mpiexec, "-n", str(args.ranks)] if args.ranks > 1 else []) + [
        args.amsp, "train", "--model", args.model, "--data", args.data, "--steps", str(args.steps),
        "--seq-len", str(args.seq_len), "--batch-size", "1", "--shard", args.shard,
        "--eval-every", "0", "--eval-windows", "1", "--peak-tflops", "1", "--threads", "1",
        "--checkpoint-dir", ckdir, "--checkpoint-every", str(args.every), "--checkpoint-mode", mode,
        "--keep-last", str(args.keep_last), "--precision", args.precision,
        "--metrics", metrics] + (["--device", args.device] if args.device else [])
    print(f"{mode}: {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"{mode} run exited {p.returncode}: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    with open(metrics) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    shutil.rmtree(ckdir, ignore_errors=True)
    return {r["step"]: r for r in recs if "loss" in r}


def writes_in_order(recs):
    return [recs[s]["ckpt_write_ms"] for s in sorted(recs) if "ckpt_write_ms" in recs[s]]


def bg_stall(bg, s):
    """Background: blocked at the boundary after step s, plus step s+1's updates' wait."""
    nxt = bg.get(s + 1, {})
    return bg[s].get("ckpt_stall_ms", float("nan")) + nxt.get("ckpt_update_wait_ms", 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--model", default="base")
    ap.add_argument("--shard", default="zero3")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--every", type=int, default=8,
                    help="steps between saves: a background write should fit in them (a save that "
                         "comes sooner waits for the previous write, and that wait is stall)")
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--work", default="/tmp/amsp-ckpt-stall")
    ap.add_argument("--device", help="amsp's --device (default: amsp's own, cuda where it has a GPU)")
    ap.add_argument("--json", help="also write the figures here (the ordinary step, each save, the worst)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    sync, bg = run(args, "sync"), run(args, "background")
    saves = [s for s in sorted(sync) if "ckpt_stall_ms" in sync[s]]
    writes = writes_in_order(bg)
    plain = [sync[s]["step_ms"] for s in sync if s - 1 not in saves and s > 2]
    if not plain:
        sys.exit("no ordinary step to compare with: give more --steps or a larger --every")
    step = statistics.median(plain)
    print(f"{args.model}, {args.ranks} ranks {args.shard}, {args.precision}, seq {args.seq_len}, batch 1, "
          f"{os.cpu_count()} cores; ordinary step (sync run, median of {len(plain)}): {step:.0f} ms")
    print(f"{'step':>5} | {'sync stall ms':>13} | {'bg stall ms':>11} | {'bg stall %':>10} | {'bg write ms':>11} | "
          f"{'next step ms sync':>17} | {'next step ms bg':>15} | {'bg next / ordinary':>18}")
    worst_stall, worst_next, rows = 0.0, 0.0, []
    for i, s in enumerate(saves):
        stall = bg_stall(bg, s)
        w = f"{writes[i]:.0f}" if i < len(writes) else "(end)"
        nxt = lambda r: f"{r[s + 1]['step_ms']:.0f}" if s + 1 in r else "-"
        ratio = bg[s + 1]["step_ms"] / step if s + 1 in bg else None
        worst_stall = max(worst_stall, stall / step)
        if ratio is not None:
            worst_next = max(worst_next, ratio - 1)
        rows.append({"step": s, "sync_stall_ms": sync[s]["ckpt_stall_ms"], "bg_stall_ms": stall,
                     "bg_write_ms": writes[i] if i < len(writes) else None, "bg_next_over_ordinary": ratio})
        print(f"{s:>5} | {sync[s]['ckpt_stall_ms']:>13.1f} | {stall:>11.1f} | {100 * stall / step:>9.1f}% | "
              f"{w:>11} | {nxt(sync):>17} | {nxt(bg):>15} | "
              f"{(f'{ratio:.2f}' if ratio is not None else '-'):>18}")
    print(f"goal: background stall under 5% of a step: worst {100 * worst_stall:.1f}% "
          f"{'met' if worst_stall < 0.05 else 'NOT met'}; step after a save within 10%: worst "
          f"{100 * worst_next:+.1f}% {'met' if worst_next <= 0.10 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "ranks": args.ranks, "precision": args.precision, "cores": os.cpu_count(),
                       "ordinary_step_ms": step, "saves": rows, "worst_stall": worst_stall,
                       "worst_next": worst_next}, f, indent=1)


if __name__ == "__main__":
    main()
