#!/usr/bin/env python3
"""The GPU checks of validation/gpu/check.sh: kernels, equivalence, throughput.

Run by check.sh after it has built amsp; prints each part as it goes and ends with
one Markdown table. Exit 1 if any check failed. doc/gpu.md explains the tolerances.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

# Losses of runs that differ only in how bf16 sums are ordered (1 GPU against n,
# the GPU against the CPU): one bf16 rounding flip in a gradient moves the next
# loss by about 2^-8 of the update; over a few steps 2^-7 relative holds.
LOSS_TOLERANCE = 2.0 ** -7
EQ_STEPS = 8


def run(cmd, env=None, timeout=3600):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=timeout)
    return p.returncode, p.stdout, time.time() - t0


def metrics(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l]


def mpiexec(n):
    return ["mpiexec", "-n", str(n)] if n > 1 else []


def train(a, ranks, plan, model, steps, batch, seq, work, precision="bf16", device="cuda", extra=()):
    os.makedirs(work, exist_ok=True)
    m = os.path.join(work, f"{device}-{ranks}-{plan.replace(',', '_').replace('=', '')}.jsonl")
    if os.path.exists(m):
        os.remove(m)
    cmd = mpiexec(ranks) + [a.amsp, "train", "--device", device, "--precision", precision,
                            "--model", model, "--data", a.data, "--steps", str(steps),
                            "--batch-size", str(batch), "--seq-len", str(seq), "--shard", plan,
                            "--eval-every", "0", "--eval-windows", "1", "--threads", "1",
                            "--metrics", m, *extra]
    rc, out, secs = run(cmd)
    if rc != 0:
        return None, f"exit {rc}: {out.strip().splitlines()[-1] if out.strip() else ''}"
    return metrics(m), f"{secs:.0f} s"


def kernel_checks(a, results):
    print("== 1. kernels: the CUDA backend against the CPU backend", flush=True)
    for precision in ("fp32", "bf16"):
        rc, out, _ = run([a.amsp, "backend-check", "--device", "cuda", "--precision", precision])
        print(out, flush=True)
        last = out.strip().splitlines()[-1] if out.strip() else "no output"
        results.append(("kernels", precision, "ok" if rc == 0 else "FAIL", last))


def mixed_plan(n):
    return {2: "p=1,g=2x1,os=2x1", 4: "p=2x1,g=2x1,os=4x1", 8: "p=2x1,g=4x1,os=8x1"}[n]


def compare_losses(ref, got):
    if ref is None or got is None or len(ref) != len(got):
        return float("inf")
    return max(abs(r["loss"] - g["loss"]) / max(1.0, abs(r["loss"])) for r, g in zip(ref, got))


def equivalence(a, results):
    print("== 2. training equivalence: 1 GPU against n GPUs, and the GPU against the CPU", flush=True)
    model, seq, batch = ("tiny", 32, 4) if a.emulated else ("small", 256, 8)
    work = os.path.join(a.work, "equivalence")
    sizes = [n for n in (2, 4 if a.emulated else 8) if n <= a.gpus]
    plans = (lambda n: ["zero3"]) if a.emulated else (lambda n: ["ddp", "zero3", mixed_plan(n)])
    ref, note = train(a, 1, "ddp", model, EQ_STEPS, batch * 2, seq, work)
    cpu, _ = train(a, 1, "ddp", model, EQ_STEPS, batch * 2, seq, work, device="cpu")
    err = compare_losses(cpu, ref)
    results.append(("equivalence", f"1 GPU vs CPU, {model}", "ok" if err <= LOSS_TOLERANCE else "FAIL",
                    f"worst relative loss difference {err:.2e} (tolerance {LOSS_TOLERANCE:.1e}); {note}"))
    for n in sizes:
        for plan in plans(n):
            got, note = train(a, n, plan, model, EQ_STEPS, batch * 2 // n or 1, seq, work)
            err = compare_losses(ref, got)
            verdict = "ok" if err <= LOSS_TOLERANCE else "FAIL"
            results.append(("equivalence", f"1 vs {n} GPUs, {plan}", verdict,
                            f"worst relative loss difference {err:.2e}; {note}"))
            print(f"   {n} GPUs {plan}: {verdict} ({err:.2e})", flush=True)


def few_layer_7b(work):
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = json.load(open(os.path.join(here, "..", "..", "inputs", "models", "llama-7b.json")))
    cfg["num_hidden_layers"] = 4
    path = os.path.join(work, "llama-7b-4layers.json")
    os.makedirs(work, exist_ok=True)
    json.dump(cfg, open(path, "w"), indent=2)
    return path


def fsdp(a, model_cfg, seq, batch, steps):
    """PyTorch FSDP's tokens/s per GPU on the same GPUs, or a reason it did not run."""
    probe = "import torch, transformers; assert torch.cuda.is_available()"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode != 0:
        return None, "torch with CUDA or transformers not importable"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_reference.py")
    rc, out, _ = run(["torchrun", f"--nproc_per_node={a.gpus}", script, "--config", model_cfg,
                      "--seq-len", str(seq), "--batch-size", str(batch), "--steps", str(steps)])
    for line in out.splitlines():
        if line.startswith("tokens_per_s_per_gpu "):
            return float(line.split()[1]), "ok"
    return None, f"exit {rc}"


def throughput(a, results, table):
    print("== 3. throughput", flush=True)
    work = os.path.join(a.work, "throughput")
    if a.emulated:
        cases = [("tiny", "tiny", 32, 2, 3)]
    else:
        presets = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "inputs", "models")
        cases = [("small", os.path.join(presets, "small.json"), 1024, 8, 30),
                 ("base", os.path.join(presets, "base.json"), 1024, 8, 30),
                 ("llama-7b, 4 layers", few_layer_7b(work), 2048, 2, 20)]
        if a.quick:
            cases = cases[:1]
    for name, model, seq, batch, steps in cases:
        got, note = train(a, a.gpus, "auto", model, steps, batch, seq, work)
        if got is None:
            results.append(("throughput", name, "FAIL", note))
            continue
        tail = got[2:] or got
        tps = statistics.median(r["tokens_per_s"] for r in tail) / a.gpus
        mfu = statistics.median(r["mfu"] for r in tail)
        exposed = statistics.median(r["comm_exposed_ms"] / r["step_ms"] for r in tail)
        ref, why = (None, "not run under emulation") if a.emulated else fsdp(a, model, seq, batch, steps)
        table.append((name, a.gpus, seq, batch, tps, mfu, exposed, ref, why))
        print(f"   {name}: {tps:.0f} tokens/s per GPU, MFU {mfu:.1%}, exposed comm {exposed:.1%}", flush=True)


def print_table(results, table, a):
    where = "CPU emulation of CUDA (no GPU; proves only that this script works)" if a.emulated else \
        subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().splitlines()[0]
    print(f"\n### amsp GPU check: {a.gpus} x {where}\n")
    print("| part | case | result | detail |\n|---|---|---|---|")
    for part, case, verdict, detail in results:
        print(f"| {part} | {case} | {verdict} | {detail} |")
    if table:
        print("\n| model | GPUs | seq | batch/GPU | amsp tokens/s/GPU | MFU | exposed comm | FSDP tokens/s/GPU |")
        print("|---|---|---|---|---|---|---|---|")
        for name, g, seq, batch, tps, mfu, exposed, ref, why in table:
            fs = f"{ref:.0f}" if ref else f"- ({why})"
            print(f"| {name} | {g} | {seq} | {batch} | {tps:.0f} | {mfu:.1%} | {exposed:.1%} | {fs} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--emulated", action="store_true")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    results, table = [], []
    kernel_checks(a, results)
    equivalence(a, results)
    throughput(a, results, table)
    print_table(results, table, a)
    failed = [r for r in results if r[2] != "ok"]
    print(f"\n{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
