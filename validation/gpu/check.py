#!/usr/bin/env python3
"""The parts of the GPU check (validation/gpu/check.sh), run in order within a time
budget; each is recorded as ok, FAIL or not run (with the reason). Writes
gpu-check.md and gpu-check.json into --out; exit 1 if any check failed, naming the
failing checks on the last line. doc/gpu.md explains the tolerances and the figures.
"""

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ncu_table  # noqa: E402
# Losses of runs that differ only in how bf16 sums are ordered (1 GPU against n, the
# GPU against the CPU): one bf16 rounding flip in a gradient moves the next loss by
# about 2^-8 of the update; over a few steps 2^-7 relative holds.
LOSS_TOLERANCE = 2.0 ** -7
# The first loss of amsp against PyTorch, from the same weights on the same tokens:
# both compute the products from bf16 operands with fp32 sums, but PyTorch's autocast
# also rounds activations (attention, the residual's inputs to each product) to bf16
# where amsp keeps fp32, so each layer's output differs by about one bf16 rounding
# (2^-9 relative, rms); at initialisation the loss is ln(vocab) plus a small term, and
# those differences move it far less than 2^-7 relative.
FIRST_LOSS_TOLERANCE = 2.0 ** -7
# The optimizer of the side-by-side, as torch_reference.py runs it.
OPT_FLAGS = ["--lr", "3e-4", "--min-lr", "3e-4", "--warmup-steps", "0", "--beta1", "0.9", "--beta2", "0.95",
             "--adam-eps", "1e-8", "--weight-decay", "0.1", "--grad-clip", "1.0"]


class Check:
    def __init__(self, a):
        self.a = a
        self.results = []  # (part, case, verdict, detail): verdict ok | FAIL | not run
        self.figures = {}
        self.logs = os.path.join(a.out, "logs")
        os.makedirs(self.logs, exist_ok=True)

    def left(self):
        return self.a.budget - (time.time() - self.a.started)

    def record(self, part, case, verdict, detail):
        self.results.append((part, case, verdict, detail))
        print(f"   {part} / {case}: {verdict}: {detail}", flush=True)

    def run(self, name, cmd, timeout, env=None):
        """Runs cmd with its output in logs/NAME.log; returns (rc, output, seconds).
        rc is None when it ran past the timeout."""
        t0 = time.time()
        log = os.path.join(self.logs, name + ".log")
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=timeout, env=env)
            rc, out = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            rc, out = None, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n\n" + out)
        return rc, out, time.time() - t0

    def launch(self, ranks):
        return [self.a.mpiexec, "-launcher", "fork", "-n", str(ranks)] if ranks > 1 else []


def last_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else "no output"


def metrics(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l] if os.path.exists(path) else []


def preset(a, name):
    return os.path.join(a.inputs, "models", name + ".json")


# ---- 0. preflight ---------------------------------------------------------------------

def preflight(c):
    print("== 0. preflight", flush=True)
    path = os.path.join(c.a.out, "gpu-info.json")
    rc, out, _ = c.run("gpu-info", [c.a.amsp, "gpu-info", "--json", path], 120)
    print(out, end="", flush=True)
    if os.path.exists(path):
        c.figures["gpu_info"] = json.load(open(path))
    if rc != 0:
        c.record("preflight", "gpu-info", "FAIL", last_line(out))
        return False
    c.record("preflight", "gpu-info", "ok", " ".join(out.strip().splitlines()[:1]))
    return True


# ---- 1. kernels -----------------------------------------------------------------------

def kernels(c):
    print("== 1. kernels: the CUDA backend against the CPU backend", flush=True)
    shapes = "small" if c.a.emulated else "layer"
    for precision in ("fp32", "bf16"):
        rc, out, secs = c.run(f"backend-check-{precision}", [c.a.amsp, "backend-check", "--device", "cuda",
                              "--precision", precision, "--shapes", shapes], 600)
        print(out, end="", flush=True)
        verdict = "ok" if rc == 0 else "FAIL"
        c.record("kernels", f"{precision}, {shapes} shapes", verdict, f"{last_line(out)} ({secs:.0f} s)")


# ---- 2. sanitizers --------------------------------------------------------------------

def find_cuda_tool(name, *patterns):
    """A CUDA tool: in $CUDA_HOME/bin, /usr/local/cuda/bin, on PATH, or the newest
    match of `patterns` (where a tool installs apart from the toolkit)."""
    for d in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        p = os.path.join(d, "bin", name) if d else ""
        if p and os.access(p, os.X_OK):
            return p
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(p for pattern in patterns for p in glob.glob(pattern))
    return versions[-1] if versions else None


def sanitizers(c):
    print("== 2. compute-sanitizer over a small backend-check", flush=True)
    tools = ("memcheck", "racecheck", "synccheck", "initcheck")
    tool_path = None if c.a.emulated else find_cuda_tool("compute-sanitizer")
    if tool_path is None:
        why = "no GPU (emulation)" if c.a.emulated else "compute-sanitizer not found"
        for t in tools:
            c.record("sanitizer", t, "not run", why)
        return
    for t in tools[:1] if c.a.quick else tools:
        if c.left() < 60:
            c.record("sanitizer", t, "not run", "time budget spent")
            continue
        # amsp is the bundle's sh wrapper: the tool must follow it into the program.
        cmd = [tool_path, "--tool", t, "--target-processes", "all", "--error-exitcode", "3", "--print-limit", "10",
               c.a.amsp, "backend-check",
               "--device", "cuda", "--precision", "bf16", "--shapes", "small"]
        rc, out, secs = c.run(f"sanitizer-{t}", cmd, min(150, c.left() - 30))
        if rc is None:
            c.record("sanitizer", t, "not run", f"still running after {secs:.0f} s (logs/sanitizer-{t}.log)")
        else:
            summary = [l for l in out.splitlines() if "ERROR SUMMARY" in l or "RACECHECK SUMMARY" in l]
            c.record("sanitizer", t, "ok" if rc == 0 else "FAIL",
                     (summary[-1].strip() if summary else last_line(out)) + f" ({secs:.0f} s)")


# ---- training runs ----------------------------------------------------------------------

def train(c, name, ranks, plan, model_args, steps, batch, seq, device="cuda", extra=(), timeout=600, tool=(),
          env=None):
    """`tool`: a command that runs amsp (a profiler), between the launcher and amsp; `env`:
    variables set for it."""
    work = os.path.join(c.a.out, "runs", name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    m = os.path.join(work, "metrics.jsonl")
    cmd = c.launch(ranks) + list(tool) + [c.a.amsp, "train", "--device", device, "--precision", "bf16", *model_args,
                             "--data", c.a.data, "--steps", str(steps), "--batch-size", str(batch),
                             "--seq-len", str(seq), "--shard", plan, "--eval-every", "0", "--eval-windows", "1",
                             "--metrics", m, "--run-info", os.path.join(work, "run.json"), *extra]
    rc, out, secs = c.run("train-" + name, cmd, timeout, env=dict(os.environ, **env) if env else None)
    if rc != 0:
        return None, f"exit {rc}: {last_line(out)}", work
    return metrics(m), f"{secs:.0f} s", work


def worst_loss_difference(ref, got):
    if not ref or not got or len(ref) != len(got):
        return float("inf")
    return max(abs(r["loss"] - g["loss"]) / max(1.0, abs(r["loss"])) for r, g in zip(ref, got))


def gpu_against_cpu(c):
    print("== 3. the GPU against the CPU: the losses of a few steps", flush=True)
    model, seq, batch, steps = ("tiny", 32, 4, 3) if c.a.emulated else ("small", 256, 8, 6)
    args = ["--model", preset(c.a, model)]
    gpu, note, _ = train(c, "gpu-vs-cpu-cuda", 1, "ddp", args, steps, batch, seq)
    cpu, _, _ = train(c, "gpu-vs-cpu-cpu", 1, "ddp", args, steps, batch, seq, device="cpu",
                      extra=["--threads", str(os.cpu_count() or 1)])
    err = worst_loss_difference(cpu, gpu)
    c.record("losses", f"1 GPU vs CPU, {model}, {steps} steps", "ok" if err <= LOSS_TOLERANCE else "FAIL",
             f"worst relative loss difference {err:.2e} (tolerance {LOSS_TOLERANCE:.1e}); {note}")
    c.figures["gpu_vs_cpu"] = {"model": model, "gpu": [r["loss"] for r in gpu or []],
                               "cpu": [r["loss"] for r in cpu or []]}


# ---- 4. one-GPU training beside PyTorch ---------------------------------------------------

def torch_run(c, args, name, timeout):
    py = os.environ.get("AMSP_PYTHON", sys.executable)
    rc, out, secs = c.run(name, [py, os.path.join(HERE, "torch_reference.py"), *args], timeout)
    res = [json.loads(l[len("result "):]) for l in out.splitlines() if l.startswith("result ")]
    if rc != 0 or not res or "error" in res[-1]:
        return None, (res[-1]["error"] if res and "error" in res[-1] else f"exit {rc}: {last_line(out)}")
    return res[-1], f"{secs:.0f} s"


def initial_weights(c, config, work, name):
    """A Hugging Face directory of random weights for `config` (torch_reference.py init) in
    work/init, both sides' starting point: (its path, how long) or (None, why not)."""
    hf = os.path.join(work, "init")
    _, note = torch_run(c, ["init", "--config", config, "--out", hf], name, 300)
    return (hf if os.path.exists(os.path.join(hf, "config.json")) else None), note


def summary(runs):
    """A training run's figures: medians over the steps after the first two."""
    tail = runs[2:] or runs
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in tail),
            "mfu": statistics.median(r["mfu"] for r in tail),
            "step_ms_median": statistics.median(r["step_ms"] for r in tail),
            "host_issue_ms_median": statistics.median(r.get("host_issue_ms", 0) for r in tail),
            "peak_bytes": max(r.get("mem_peak_bytes", 0) for r in runs),
            "predicted_bytes": max(r.get("mem_predicted_bytes", 0) for r in runs),
            "losses": [r["loss"] for r in runs]}


# A rank's peak memory as the plan predicts it (what the engine reserves at start-up),
# against its allocator's high-water mark: the planner promises 5%.
MEMORY_TOLERANCE = 0.05


def memory_row(s):
    """The side-by-side's (verdict, detail) for amsp's predicted peak memory."""
    peak, predicted = s.get("peak_bytes", 0), s.get("predicted_bytes", 0)
    if not peak or not predicted:
        return "FAIL", "the metrics have no peak or no prediction"
    err = (predicted - peak) / peak
    return ("ok" if abs(err) <= MEMORY_TOLERANCE else "FAIL",
            f"predicted {size(predicted)}, allocator's peak {size(peak)}: {err:+.1%} "
            f"(tolerance {MEMORY_TOLERANCE:.0%})")


def host_phases(trace_path):
    """Where the host's time goes in a step, from `amsp train --trace` (compute track, host
    clock): per recorded step (each ends with its "optimizer" span, which runs from the
    update's enqueue through the step's one synchronisation), the time spent enqueueing
    the units' forwards and backwards, the optimizer span, and the rest of the step's host
    time (gathers and reductions issued, the batch copied, the loss). Medians over the
    steps after the first recorded one; None without a trace."""
    try:
        events = json.load(open(trace_path))["traceEvents"]
    except (OSError, ValueError, KeyError):
        return None
    spans = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "compute"), key=lambda e: e["ts"])
    steps, cur = [], []
    for e in spans:
        cur.append(e)
        if e["name"] == "optimizer":
            steps.append(cur)
            cur = []
    rows = []
    for st in steps[1:] or steps:
        ms = lambda prefix: sum(e["dur"] for e in st if e["name"].startswith(prefix)) / 1e3
        whole = (st[-1]["ts"] + st[-1]["dur"] - st[0]["ts"]) / 1e3
        rows.append({"forward": ms("fwd "), "backward": ms("bwd "), "optimizer": ms("optimizer"), "whole": whole})
    if not rows:
        return None
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["other"] = max(0.0, med["whole"] - med["forward"] - med["backward"] - med["optimizer"])
    med["steps"] = len(rows)
    return med


def side_by_side(c):
    print("== 4. one-GPU training, amsp beside PyTorch", flush=True)
    if c.a.emulated:
        model, seq, batch, steps, torch_device = "tiny", 32, 2, 3, "cpu"
    else:
        model, seq, batch, steps, torch_device = "llama-1b", 2048, 2, 8 if c.a.quick else 12, "cuda"
    work = os.path.join(c.a.out, "side-by-side")
    os.makedirs(work, exist_ok=True)
    hf, note = initial_weights(c, preset(c.a, model), work, "torch-init")
    if hf is None:
        c.record("side-by-side", f"{model} initial weights", "FAIL", note)
        return
    order = os.path.join(work, "order.jsonl")
    profile = os.path.join(work, "kernel-profile.json")
    # The figures from a run as users run it; the kernel table from a second run with
    # its timing events, whose own step time says what the events cost.
    # Its trace (steps 2 on, a few spans a unit) says where the host's time goes.
    trace = os.path.join(work, "trace.json")
    runs, note, run_dir = train(c, "side-by-side", 1, "ddp", ["--init-from", hf], steps, batch, seq,
                                extra=OPT_FLAGS + ["--data-order", order, "--trace", trace,
                                                   "--trace-steps", str(steps - 1)])
    if runs is None:
        c.record("side-by-side", f"amsp {model}", "FAIL", note)
        return
    c.figures["model"] = {"preset": model, "seq": seq, "batch": batch, "steps": steps}
    c.figures["amsp"] = amsp = summary(runs)
    phases = host_phases(trace)
    if phases:
        c.figures["host_phases"] = phases
    c.record("side-by-side", f"amsp {model}", "ok", f"{amsp['tokens_per_s']:.0f} tokens/s, MFU {amsp['mfu']:.1%}, "
             f"host {amsp['host_issue_ms_median']:.0f} of {amsp['step_ms_median']:.0f} ms a step; {note}")
    c.record("side-by-side", f"amsp {model}, peak memory predicted", *memory_row(amsp))
    profiled, note, _ = train(c, "side-by-side-profiled", 1, "ddp", ["--init-from", hf], steps, batch, seq,
                              extra=OPT_FLAGS + ["--kernel-profile", profile])
    if profiled is None or not os.path.exists(profile):
        c.record("side-by-side", f"amsp {model}, kernel profile", "FAIL", note)
    else:
        c.figures["amsp_profiled"] = summary(profiled)
        c.figures["kernels"] = json.load(open(profile))
    for mode in ("eager", "compile"):
        if mode == "compile" and (c.a.quick or c.left() < 150):
            c.record("side-by-side", "PyTorch compile", "not run", "time budget" if not c.a.quick else "--quick")
            continue
        # Eager's own kernel table, from two more steps under torch.profiler (after the timed ones).
        profiling = ["--profile-steps", "2"] if mode == "eager" else []
        res, why = torch_run(c, ["train", "--model", hf, "--data", c.a.data, "--order", order, "--steps",
                                 str(steps), "--mode", mode, "--device", torch_device, *profiling], f"torch-{mode}",
                             max(60, min(600, c.left() - 20)))
        if res is None:
            verdict = "not run" if mode == "compile" and "no torch.compile" in why else "FAIL"
            c.record("side-by-side", f"PyTorch {mode}", verdict, why)
            continue
        # The same model and tokens: MFU scales with throughput.
        res["mfu"] = amsp["mfu"] * res["tokens_per_s"] / amsp["tokens_per_s"] if amsp["tokens_per_s"] else 0
        c.figures["torch_" + mode] = res
        diff = abs(res["losses"][0] - amsp["losses"][0]) / abs(res["losses"][0])
        ok = diff <= FIRST_LOSS_TOLERANCE
        c.record("side-by-side", f"first loss, amsp vs PyTorch {mode}", "ok" if ok else "FAIL",
                 f"{amsp['losses'][0]:.5f} vs {res['losses'][0]:.5f}, relative {diff:.1e} "
                 f"(tolerance {FIRST_LOSS_TOLERANCE:.1e}; attention: {res['attention']}); {why}")


# ---- 5. attention at D = 128, amsp beside PyTorch -----------------------------------------------
# The side-by-side's llama-1b has heads of 64; every LLaMA preset from 7B up has 128, where
# amsp's attention takes other tile variants (doc/gpu.md, "The kernels"). Two decoder layers
# of llama-7b, each side's attention kernels timed by its own profile.

BACKWARD_KERNEL = re.compile(r"bwd|backward|bprop|dgrad", re.IGNORECASE)


def attention_tflops(ms, products, m):
    """TFLOP/s of `products` causal products (2 D each per (query, key) pair) in ms a step."""
    pairs = m["seq"] * (m["seq"] + 1) / 2
    flops = products * 2.0 * m["head_dim"] * pairs * m["batch"] * m["heads"] * m["layers"]
    return flops / (ms / 1e3) / 1e12 if ms else 0.0


def amsp_attention(c, name, model_args, m, extra=(), env=None):
    """amsp's attention forward and backward, ms a step, from its kernel profile of m's run:
    ({forward_ms, backward_ms}, note) or (None, why not)."""
    profile = os.path.join(c.a.out, "attention", name + "-profile.json")
    runs, note, _ = train(c, name, 1, "ddp", model_args, m["steps"], m["batch"], m["seq"],
                          extra=OPT_FLAGS + ["--kernel-profile", profile, *extra], env=env)
    if runs is None or not os.path.exists(profile):
        return None, note
    rows = {r["name"]: r["ms_per_step"] for r in json.load(open(profile)).get("kernels", [])}
    return {"forward_ms": rows.get("attention_forward", 0.0), "backward_ms": rows.get("attention_backward", 0.0)}, note


def attention_warp_tiles(c):
    """Up to D = 64 the tensor-core kernels may take two tiles of 16 rows a warp
    (AMSP_ATTENTION_WARP_TILES=2) or one (the default, the faster on an H200): two decoder
    layers of llama-1b (D = 64), each layout's attention ms a step in the same run."""
    print("== 5b. attention at llama-1b's D = 64: one tile a warp against two", flush=True)
    base, seq, batch, steps = ("tiny", 32, 2, 3) if c.a.emulated else ("llama-1b", 2048, 2, 4)
    if c.left() < 90:
        c.record("attention", "one tile a warp against two", "not run", "time budget")
        return
    work = os.path.join(c.a.out, "attention")
    os.makedirs(work, exist_ok=True)
    cfg = json.load(open(preset(c.a, base)))
    cfg["num_hidden_layers"] = 2
    config = os.path.join(work, "config-warp-tiles.json")
    json.dump(cfg, open(config, "w"), indent=2)
    m = {"preset": base, "layers": 2, "seq": seq, "batch": batch, "steps": steps,
         "heads": cfg["num_attention_heads"], "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"]}
    case = f"D = {m['head_dim']}, {base}'s layers, one tile a warp against two"
    notes = []
    for tiles in (2, 1):
        r, note = amsp_attention(c, f"attention-warp-tiles-{tiles}", ["--model", config], m,
                                 env={"AMSP_ATTENTION_WARP_TILES": str(tiles)})
        if r is None:
            c.record("attention", case, "FAIL", f"{tiles} a warp: {note}")
            return
        m[f"tiles_{tiles}"] = r
        notes.append(f"{tiles}: forward {r['forward_ms']:.2f} ms, backward {r['backward_ms']:.2f} ms")
    c.record("attention", case, "ok", "; ".join(notes) + " a step")
    c.figures["attention_warp_tiles"] = m


def attention(c):
    attention_128(c)
    attention_warp_tiles(c)


def attention_128(c):
    print("== 5. attention at D = 128: two layers of llama-7b, amsp beside PyTorch", flush=True)
    if c.left() < 150:
        c.record("attention", "D = 128", "not run", "time budget")
        return
    base, seq, batch, steps, torch_device = (("tiny", 32, 2, 3, "cpu") if c.a.emulated else
                                             ("llama-7b", 2048, 2, 4, "cuda"))
    work = os.path.join(c.a.out, "attention")
    os.makedirs(work, exist_ok=True)
    cfg = json.load(open(preset(c.a, base)))
    cfg["num_hidden_layers"] = 2
    if c.a.emulated:  # one head of 128 over tiny's width
        cfg["num_attention_heads"] = cfg["num_key_value_heads"] = 1
    config = os.path.join(work, "config.json")
    json.dump(cfg, open(config, "w"), indent=2)
    m = {"preset": base, "layers": 2, "seq": seq, "batch": batch, "steps": steps,
         "heads": cfg["num_attention_heads"], "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"]}
    case = f"D = {m['head_dim']}, {base}'s layers"
    hf, note = initial_weights(c, config, work, "attention-torch-init")
    if hf is None:
        c.record("attention", f"{case}, initial weights", "FAIL", note)
        return
    order = os.path.join(work, "order.jsonl")
    m["amsp"], note = amsp_attention(c, "attention", ["--init-from", hf], m, ["--data-order", order])
    if m["amsp"] is None:
        c.record("attention", f"{case}, amsp", "FAIL", note)
        return
    c.record("attention", f"{case}, amsp", "ok", f"forward {m['amsp']['forward_ms']:.2f} ms, backward "
             f"{m['amsp']['backward_ms']:.2f} ms a step; {note}")
    res, why = torch_run(c, ["train", "--model", hf, "--data", c.a.data, "--order", order, "--steps", str(steps),
                             "--mode", "eager", "--device", torch_device, "--profile-steps", "2"],
                         "attention-torch", max(60, min(600, c.left() - 20)))
    p = (res or {}).get("profile")
    att = [r for r in (p or {}).get("kernels", []) if ATTENTION.search(r["name"])]
    if not p:
        c.record("attention", f"{case}, PyTorch eager", "FAIL", why if res is None else "no profile")
    elif not att:
        c.record("attention", f"{case}, PyTorch eager", "not run",
                 f"none of its 25 largest {'kernels' if p['activity'] == 'cuda' else 'operators'} is named like "
                 f"attention; {why}")
    else:
        m["torch"] = {"attention": res.get("attention"),
                      "forward_ms": sum(r["ms_per_step"] for r in att if not BACKWARD_KERNEL.search(r["name"])),
                      "backward_ms": sum(r["ms_per_step"] for r in att if BACKWARD_KERNEL.search(r["name"])),
                      "kernels": [r["name"] for r in att]}
        c.record("attention", f"{case}, PyTorch eager", "ok", f"forward {m['torch']['forward_ms']:.2f} ms, backward "
                 f"{m['torch']['backward_ms']:.2f} ms a step ({len(att)} of its 25 largest kernels named like "
                 f"attention); {why}")
    c.figures["attention_128"] = m


def attention_table(f):
    return attention_128_table(f) + warp_tiles_table(f)


def timing_rows(caption, column, rows, m):
    """A table of attention's ms a step, forward and backward, and the TFLOP/s of the causal
    products as models count them (2 forward, 5 backward), a line per (label, times)."""
    lines = ["", caption, "", f"| {column} | forward ms | backward ms | forward TFLOP/s | backward TFLOP/s |",
             "|---|---|---|---|---|"]
    for label, r in rows:
        lines.append(f"| {label} | {r['forward_ms']:.2f} | {r['backward_ms']:.2f} | "
                     f"{attention_tflops(r['forward_ms'], 2, m):.0f} | {attention_tflops(r['backward_ms'], 5, m):.0f} |")
    return lines


def warp_tiles_table(f):
    m = f.get("attention_warp_tiles")
    if not m or "tiles_1" not in m:
        return []
    return timing_rows(f"amsp's attention at D = {m['head_dim']} with two tiles of 16 rows a warp "
                       f"(AMSP_ATTENTION_WARP_TILES=2) and one (the default), {m['layers']} decoder layers "
                       f"of {m['preset']}, seq {m['seq']}, batch {m['batch']}, ms a step from the kernel profile:",
                       "tiles a warp", [(t, m[f"tiles_{t}"]) for t in (2, 1)], m)


def attention_128_table(f):
    m = f.get("attention_128")
    if not m or "amsp" not in m:
        return []
    return timing_rows(f"Attention at D = {m['head_dim']} ({m['layers']} decoder layers of {m['preset']}, seq "
                       f"{m['seq']}, batch {m['batch']}; each side's own profile, ms a step; TFLOP/s of the causal "
                       "products as models count them, 2 forward and 5 backward, whatever each side computes):",
                       "system", [(label, m[key]) for key, label in
                                  (("amsp", "amsp"), ("torch", "PyTorch eager, its kernels named like attention"))
                                  if m.get(key)], m)


# ---- counters: one step under Nsight Compute --------------------------------------------------
# The kernel profile's events time each backend call, several kernels and any wait for the
# host together; ncu times a kernel alone and reads its counters: DRAM traffic and
# throughput against the device's peak, SM throughput, occupancy, registers. That says
# which memory-bound kernels are far from the memory and whether they are short of warps
# or of bandwidth. ncu replays each kernel (9 passes of these counters on an H200, about
# half a second a launch), so it takes one launch of each launch configuration (function,
# grid, block, shared memory) of the step: llama-1b's 22 layers launch the same few dozen
# configurations over and over, and every launch of the step (some 800) did not finish in
# 5 minutes. The kernel profile has each kernel's time a step; the step's own time under
# ncu means nothing.

COUNTERS_FILTER = ("--filter-mode", "per-launch-config", "--launch-count", "1")

def profiled_step(c, name, tool, ncu_args, limit):
    """llama-1b's third step under ncu with ncu_args; the report's path, or None and why not."""
    report = os.path.join(c.a.out, "counters", name)
    os.makedirs(os.path.dirname(report), exist_ok=True)
    ncu = [tool, "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off",
           *ncu_args, "--export", report, "--force-overwrite"]
    runs, note, _ = train(c, name, 1, "ddp", ["--model", preset(c.a, "llama-1b")], 3, 2, 2048,
                          extra=["--cuda-profiler-step", "3"], timeout=max(60, min(limit, c.left() - 30)), tool=ncu)
    if runs is None or not os.path.exists(report + ".ncu-rep"):
        return None, f"{note} (logs/train-{name}.log)"
    return report + ".ncu-rep", note


def export_page(c, tool, report, page, name):
    """ncu's `page` of the report as CSV, kept beside it; the text, or None."""
    rc, out, _ = c.run(name, [tool, "--import", report, "--csv", "--page", page, "--print-units", "base"], 120)
    if rc != 0:
        return None
    open(os.path.join(os.path.dirname(report), name + ".csv"), "w").write(out)
    return out


def counters(c):
    print("== 4b. one training step under Nsight Compute: each kernel's time and counters", flush=True)
    case = "llama-1b, step 3, one launch of each configuration"
    tool = None if c.a.emulated else find_cuda_tool("ncu", "/opt/nvidia/nsight-compute/*/ncu")
    if tool is None or c.left() < 150:
        c.record("counters", case, "not run", "no GPU (emulation)" if c.a.emulated else
                 "ncu not found" if tool is None else "time budget spent")
        return
    report, note = profiled_step(c, "counters", tool,
                                 ["--metrics", ",".join(ncu_table.METRICS), *COUNTERS_FILTER], 240)
    if report is None:
        c.record("counters", case, "FAIL", note)
        return
    out = export_page(c, tool, report, "raw", "counters-csv") or ""
    try:
        rows = ncu_table.kernel_rows(out)
    except ValueError as e:
        rows, out = [], str(e)
    if not rows:
        c.record("counters", case, "FAIL", f"no kernel read from the report: {last_line(out)} (logs/counters-csv.log)")
        return
    c.figures["counters"] = {"kernels": rows, "launches": sum(r["calls"] for r in rows),
                             "ms": sum(r["ms"] for r in rows)}
    top = rows[0]
    c.record("counters", case, "ok", f"{c.figures['counters']['launches']} launches, "
             f"{c.figures['counters']['ms']:.1f} ms of kernel time; the longest {top['name']} "
             f"{top['ms']:.2f} ms ({top['dram_pct']:.0f}% of DRAM peak, {top['sm_pct']:.0f}% of SM peak); {note}")
    attention_counters(c, tool)


def attention_counters(c, tool):
    """One launch of each attention kernel with ncu's full set: why the tensor-core
    kernels run where they do (ncu_table.deep_rows). The CSVs stay in counters/."""
    case = "llama-1b, step 3, attention kernels, full set"
    if c.left() < 120:
        c.record("counters", case, "not run", "time budget spent")
        return
    report, note = profiled_step(c, "counters-attention", tool, list(ncu_table.ATTENTION_FILTER), 240)
    if report is None:
        c.record("counters", case, "FAIL", note)
        return
    rows = ncu_table.deep_rows(export_page(c, tool, report, "raw", "attention-raw") or "")
    export_page(c, tool, report, "details", "attention-details")
    if not rows:
        c.record("counters", case, "FAIL", "no kernel read from the report (logs/attention-raw.log)")
        return
    c.figures["counters_attention"] = rows
    c.record("counters", case, "ok", "; ".join(
        f"{r['name']} {r['us']:.0f} us, issue {r['issue_pct'] or 0:.0f}%, tensor {r['tensor_pct'] or 0:.0f}%"
        for r in rows) + f"; {note}")


# ---- 5. several GPUs ------------------------------------------------------------------------

def mixed_plan(n):
    return {2: "p=1,g=2x1,os=2x1", 4: "p=2x1,g=2x1,os=4x1", 8: "p=2x1,g=4x1,os=8x1"}.get(n, "zero3")


def several_gpus(c):
    print("== 5. several GPUs against one", flush=True)
    if c.a.gpus < 2:
        c.record("several GPUs", "ddp, zero3, mixed", "not run", f"{c.a.gpus} GPU on this machine")
        return
    model, seq, batch = ("tiny", 32, 4) if c.a.emulated else ("small", 256, 8)
    args = ["--model", preset(c.a, model)]
    n = c.a.gpus
    steps = 3 if c.a.emulated else 6
    ref, _, _ = train(c, "gpus-1", 1, "ddp", args, steps, batch, seq)
    plans = ["zero3"] if c.a.emulated else ["ddp", "zero3", mixed_plan(n)]
    for plan in plans:
        if c.left() < 40:
            c.record("several GPUs", f"{n} GPUs, {plan}", "not run", "time budget spent")
            continue
        got, note, _ = train(c, f"gpus-{n}-{plan}", n, plan, args, steps, max(batch // n, 1), seq)
        err = worst_loss_difference(ref, got)
        c.record("several GPUs", f"1 vs {n} GPUs, {plan}", "ok" if err <= LOSS_TOLERANCE else "FAIL",
                 f"worst relative loss difference {err:.2e}; {note}")


# ---- 6. CPU ranks on this machine's cores ------------------------------------------------------
# Two goals of the CPU engine are about cores the development machines (2 cores for 4
# ranks) do not have: communication hidden behind compute for every plan
# (doc/engine.md), and a background checkpoint that neither stalls training nor slows the
# next step (doc/checkpoints.md). A GPU machine has cores to spare, so the check measures
# both there, with the same benchmarks, a core per rank and its communication thread.
# Benchmarks, not tests: a goal not met is a figure, not a failure; a run that fails is.

CORE_NEED = 8  # 4 ranks, each with its compute thread and its communication thread


def fork_launcher(c, bind=0):
    """mpiexec that starts ranks on this machine, never through a resource manager (the
    benchmarks add only -n); with `bind`, each rank bound to that many cores of its own
    (hydra's -bind-to core:N, as srun --cpu-bind=cores would place them)."""
    path = os.path.join(c.a.out, "cores", f"mpiexec-bound-{bind}" if bind else "mpiexec")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    flags = f" -bind-to core:{bind}" if bind else ""
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec "{os.path.abspath(shutil.which(c.a.mpiexec) or c.a.mpiexec)}" -launcher fork{flags} "$@"\n')
    os.chmod(path, 0o755)
    return path


def benchmark(c, name, script, flags, timeout, bind=0):
    """Runs benchmarks/SCRIPT with its figures in a JSON; returns them, or None (recorded)."""
    path = os.path.join(c.a.out, "cores", name + ".json")
    cmd = [sys.executable, os.path.join(c.a.scripts, "benchmarks", script), "--data", c.a.data,
           "--mpiexec", fork_launcher(c, bind), "--device", "cpu", "--work", os.path.join(c.a.out, "cores", name),
           "--json", path] + flags
    rc, out, secs = c.run("cores-" + name, cmd, timeout)
    print(out, end="", flush=True)
    if rc != 0 or not os.path.exists(path):
        why = f"still running after {secs:.0f} s" if rc is None else f"exit {rc}: {last_line(out)}"
        c.record("CPU ranks", name, "FAIL", f"{why} (logs/cores-{name}.log)")
        return None
    c.figures.setdefault("cores", {})[name] = {"table": out, "seconds": secs}
    return json.load(open(path))


def hidden(c, case, tiny, bind=0):
    flags = ["--after", os.path.abspath(c.a.amsp), "--layouts", "mpi4", "--repeats", "1"] + (
        ["--model", preset(c.a, "tiny"), "--plans", "zero3", "--seq-len", "32", "--steps", "3", "--warmup", "1"]
        if tiny else [])
    got = benchmark(c, f"hidden-bound-{bind}" if bind else "hidden", "hidden_bench.py", flags, c.left() - 20, bind)
    if got:
        worst = min(got, key=lambda r: r["hidden"])
        slow = [r["slowest_rank_hidden"] for r in got if r.get("slowest_rank_hidden") is not None]
        on_slowest = f"; on the rank that computed longest {min(slow):.1%} to {max(slow):.1%}" if slow else ""
        net = [r["hidden_net_of_late_ranks"] for r in got if r.get("hidden_net_of_late_ranks") is not None]
        on_time = f"; net of waits for late ranks, every rank {min(net):.1%} to {max(net):.1%}" if net else ""
        bound = worst.get("schedule_bound")
        allowed = f", where its schedule lets at most {bound:.1%} hide" if bound is not None else ""
        c.record("CPU ranks", case, "ok", f"{len(got)} plans: hidden {worst['hidden']:.1%} "
                 f"({worst['plan']}{allowed}) to {max(r['hidden'] for r in got):.1%}{on_slowest}{on_time}; "
                 "goal 93%")


def ckpt_stall(c, case, tiny, model, ranks):
    flags = ["--amsp", os.path.abspath(c.a.amsp), "--model", preset(c.a, "tiny" if tiny else model),
             "--ranks", str(ranks)] + (["--steps", "6", "--every", "2", "--seq-len", "32"] if tiny else [])
    got = benchmark(c, f"ckpt-{model}", "ckpt_stall.py", flags, c.left() - 10)
    if got:
        c.record("CPU ranks", case, "ok", f"ordinary step {got['ordinary_step_ms']:.0f} ms; background stall "
                 f"at most {got['worst_stall']:.1%} (goal 5%), step after a save {got['worst_next']:+.1%} "
                 f"(goal 10%)")


def cores(c):
    print("== 6. CPU ranks on this machine's cores: hidden communication, checkpoint stall", flush=True)
    n = os.cpu_count() or 1
    why = ("--quick" if c.a.quick else "no benchmark scripts (--scripts)" if not c.a.scripts
           else f"{n} cores, {CORE_NEED} needed" if n < CORE_NEED and not c.a.emulated else None)
    tiny = c.a.emulated  # the suite keeps the part working at tiny sizes; its figures mean nothing
    # (case, seconds it needs left, what runs it)
    # Unbound, the ranks' threads move between cores at the scheduler's will (on a GPU
    # machine's 16 cores one rank arriving late at the all-reduces showed as exposed time
    # on the others); bound, each rank has 2 cores of its own.
    runs = [("hidden, 4 ranks", 150, lambda case: hidden(c, case, tiny)),
            ("hidden, 4 ranks, each bound to 2 cores", 150, lambda case: hidden(c, case, tiny, bind=2))] + [
        (f"checkpoint stall, {'tiny' if tiny else m} on {r} ranks", need,
         lambda case, m=m, r=r: ckpt_stall(c, case, tiny, m, r)) for m, r, need in (("base", 2, 120), ("small", 4, 60))]
    for case, need, run in runs:
        if why or c.left() < need:
            c.record("CPU ranks", case, "not run", why or "time budget spent")
        else:
            run(case)


# ---- the report -------------------------------------------------------------------------------

def size(b):
    if not b:
        return "-"
    return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


ATTENTION = re.compile(r"flash|fmha|sdpa|attention|attn", re.IGNORECASE)


def torch_kernel_table(f):
    """PyTorch eager's time per kernel beside amsp's table, and attention on both sides."""
    p = (f.get("torch_eager") or {}).get("profile")
    if not p:
        return []
    unit = "kernel" if p["activity"] == "cuda" else "operator (CPU)"
    lines = ["", f"PyTorch eager's time per {unit} (torch.profiler, {p['steps']} steps after the timed ones; "
                 f"all of them together: {p['total_ms_per_step']:.1f} ms/step):", "",
             f"| {unit} | calls/step | ms/step |", "|---|---|---|"]
    for row in p["kernels"][:15]:
        name = row["name"].replace("|", "/")
        lines.append(f"| {name[:100] + ('...' if len(name) > 100 else '')} | {row['calls_per_step']:.0f} | "
                     f"{row['ms_per_step']:.2f} |")
    ours = {r["name"]: r["ms_per_step"] for r in (f.get("kernels") or {}).get("kernels", [])}
    theirs = sum(r["ms_per_step"] for r in p["kernels"] if ATTENTION.search(r["name"]))
    if "attention_forward" in ours:
        lines += ["", f"Attention, both sides: amsp {ours['attention_forward']:.2f} ms/step forward and "
                      f"{ours.get('attention_backward', 0):.2f} backward; PyTorch's kernels named like attention "
                      f"(flash, fmha, sdpa, attention), among its 25 largest: {theirs:.2f} ms/step together."]
    return lines


def idle_table(k, rows=12):
    """Where the compute stream sat empty between two calls (the kernel profile's `idle`):
    the pairs of calls around the most idle time. Many short gaps everywhere say the host
    enqueues slower than the device runs; a few long ones name what the device waited for."""
    idle = k.get("idle") or []
    if not idle:
        return []
    steps = max(1, k.get("steps", 1))
    out = ["", f"Where the device sat idle between calls (the kernel profile's events: from one call's "
               f"end to the next one's start; {k.get('idle_ms_per_step', 0):.1f} ms a step over "
               f"{k.get('idle_gaps_per_step', 0):.0f} gaps, the pairs with the most):", "",
           "| after | before | gaps/step | ms/step | mean gap us | longest us |", "|---|---|---|---|---|---|"]
    for row in idle[:rows]:
        mean_us = 1e3 * row["total_ms"] / max(1, row["gaps"])
        out.append(f"| {row['after']} | {row['before']} | {row['gaps'] / steps:.0f} | {row['ms_per_step']:.2f} | "
                   f"{mean_us:.1f} | {1e3 * row['max_ms']:.1f} |")
    return out


def write_report(c):
    """gpu-check.md and gpu-check.json as the results stand; the markdown's text."""
    a, f = c.a, c.figures
    info = f.get("gpu_info", {})
    gpus = info.get("gpus") or [{}]
    where = "CPU emulation of CUDA (no GPU: proves only that this script works)" if a.emulated else \
        f"{a.gpus} x {gpus[0].get('name', '?')}, driver {info.get('driver', {}).get('version', '?')}"
    commit = a.commit or "?"
    if a.manifest and os.path.exists(a.manifest):
        commit = next((l.split()[1] for l in open(a.manifest) if l.startswith("commit ")), "?")
    wall = time.time() - a.started
    libs = "; ".join(f"{k} {info[k].get('version') or '?'}" + (f" ({info[k]['path']})" if info[k].get("path") else "")
                     for k in ("runtime", "cublas", "cudnn", "nccl") if isinstance(info.get(k), dict))
    lines = [f"### amsp GPU check: {where}", "",
             f"{datetime.date.today().isoformat()}, {'build' if a.emulated else 'bundle'} {commit}, wall time {wall:.0f} s",
             "", f"Libraries: {libs or 'unknown (no preflight)'}", "",
             "| part | case | result | detail |", "|---|---|---|---|"]
    lines += [f"| {p} | {cs} | {v} | {d} |" for p, cs, v, d in c.results]
    if "amsp" in f:
        m = f["model"]
        lines += ["", f"{m['preset']}, seq {m['seq']}, batch {m['batch']}, {m['steps']} steps, bf16, 1 GPU "
                      "(medians over the steps after the first two; host ms: the host's time to enqueue a "
                      "step, up to its one synchronisation, `host_issue_ms`):", "",
                  "| system | tokens/s | MFU | step ms | host ms | peak memory | first loss |",
                  "|---|---|---|---|---|---|---|"]
        for key, label in (("amsp", "amsp"), ("amsp_profiled", "amsp with --kernel-profile"),
                           ("torch_eager", "PyTorch eager"), ("torch_compile", "PyTorch compile")):
            r = f.get(key)
            if r:
                att = f", {'SDPA' if r['attention'] == 'sdpa' else 'eager'} attention" if "attention" in r else ""
                host = f"{r['host_issue_ms_median']:.0f}" if "host_issue_ms_median" in r else "-"
                lines.append(f"| {label}{att} | {r['tokens_per_s']:.0f} | {r['mfu']:.1%} | {r['step_ms_median']:.0f} | "
                             f"{host} | {size(r.get('peak_bytes'))} | {r['losses'][0]:.5f} |")
    h = f.get("host_phases")
    if h:
        lines += ["", f"amsp's host time per step, from its trace (host clock, median of {h['steps']} steps; "
                      "optimizer: from the update's enqueue through the step's one synchronisation):", "",
                  "| enqueueing forwards | backwards | optimizer, then the wait | the rest | the step |",
                  "|---|---|---|---|---|",
                  f"| {h['forward']:.1f} ms | {h['backward']:.1f} ms | {h['optimizer']:.1f} ms | {h['other']:.1f} ms | "
                  f"{h['whole']:.1f} ms |"]
    k = f.get("kernels")
    if k:
        copy = k.get("copy_gb_per_s")
        lines += ["", f"amsp's time per kernel (CUDA events around each launch, {k.get('steps')} steps; "
                      f"not attributed to a kernel: {k.get('unaccounted_ms_per_step', 0):.1f} ms/step). GB/s: the "
                      "call's least bytes (operands read once, results written once) over its time, beside the "
                      "device's copy bandwidth measured in the same run "
                      f"({copy or 0:.0f} GB/s, cudaMemcpyAsync device to device); a measure for the memory-bound "
                      "kernels, not for the products and attention:", "",
                  "| kernel | calls/step | ms/step | share | GB/s | of copy |", "|---|---|---|---|---|---|"]
        steps = max(1, k.get("steps", 1))
        for row in k.get("kernels", [])[:15]:
            of = f"{row['of_copy']:.0%}" if row.get("of_copy") is not None else ""
            lines.append(f"| {row['name']} | {row['calls'] / steps:.0f} | {row['ms_per_step']:.2f} | {row['share']:.1%} "
                         f"| {row.get('gb_per_s', 0):.0f} | {of} |")
        lines += idle_table(k)
    lines += torch_kernel_table(f)
    lines += attention_table(f)
    n = f.get("counters")
    if n:
        lines += ["", f"amsp's kernels under Nsight Compute, one launch of each launch configuration of a step "
                      f"(llama-1b, seq 2048, batch 2, step 3; {n['launches']} launches, {n['ms']:.1f} ms, each "
                      "timed alone; percentages of the device's peak, weighted by time; the time a step is the "
                      "kernel profile's):", ""] + ncu_table.table(n["kernels"])
    deep = f.get("counters_attention")
    if deep:
        lines += ["", "One launch of each attention kernel with ncu's full set (the same step; the whole CSV in "
                      "counters/attention-raw.csv):", ""] + ncu_table.deep_table(deep)
    for name, run in f.get("cores", {}).items():
        lines += ["", f"CPU ranks, {name} ({os.cpu_count()} cores, {run['seconds']:.0f} s):", "", "```",
                  run["table"].strip(), "```"]
    text = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "gpu-check.md"), "w").write(text)
    doc = {"where": where, "date": datetime.date.today().isoformat(), "bundle": commit, "wall_s": wall,
           "results": [dict(zip(("part", "case", "result", "detail"), r)) for r in c.results],
           "figures": f, "failed": sum(1 for r in c.results if r[2] == "FAIL")}
    json.dump(doc, open(os.path.join(a.out, "gpu-check.json"), "w"), indent=2)
    return text


def report(c):
    """The report written and printed, and the exit status: 1 if any check failed."""
    print("\n" + write_report(c))
    failed = [r for r in c.results if r[2] == "FAIL"]
    passed = sum(1 for r in c.results if r[2] == "ok")
    skipped = len(c.results) - passed - len(failed)
    print(f"{passed} passed, {len(failed)} failed, {skipped} skipped")
    if failed:
        print("gpu check FAILED: " + "; ".join(f"{p} / {cs}" for p, cs, _, _ in failed))
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--amsp", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--manifest")
    ap.add_argument("--commit", help="the commit of the build checked (a bundle's MANIFEST says its own)")
    ap.add_argument("--emulated", action="store_true")
    ap.add_argument("--scripts", help="a tree with benchmarks/ and validation/ (the repository, or the bundle's copy)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--started", type=float, default=time.time())
    ap.add_argument("--budget", type=float, default=float(os.environ.get("AMSP_CHECK_BUDGET_S", 450)),
                    help="seconds from the start after which optional parts are skipped")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="the parts to run after the preflight, in their order whatever the list's "
                         "(a second call can run what the first had no time for)")
    a = ap.parse_args()
    unknown = set(a.parts.split(",")) - set(PARTS)
    if unknown:
        ap.error(f"--parts: no part {', '.join(sorted(unknown))} (expected some of {','.join(PARTS)})")
    c = Check(a)
    if preflight(c):
        for name, part in PARTS.items():
            if name in a.parts.split(","):
                part(c)
                # After each part: a run cut short (a device lease running out) still leaves
                # the parts it finished in --out.
                write_report(c)
    return report(c)


# The parts after the preflight, in the order they run (the GPU's first).
PARTS = {"kernels": kernels, "losses": gpu_against_cpu, "side-by-side": side_by_side, "attention": attention,
         "counters": counters,
         "sanitizers": sanitizers, "gpus": several_gpus, "cores": cores}


if __name__ == "__main__":
    sys.exit(main())
