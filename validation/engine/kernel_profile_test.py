#!/usr/bin/env python3
"""amsp train --kernel-profile: every backend call timed by name, and nothing else changed.

For --device cpu and --device cuda (the CUDA backend on the CPU emulation of CUDA), one
rank trains the tiny preset a few steps with two micro-batches per step, once with
--kernel-profile and once without, and checks:

  - the profile: the first step is left out as warm-up; every op the model and the
    optimizer run is there, each with exactly the calls per step the model implies
    (e.g. attention_forward: layers x micro-batches; adamw: one per unit), the linear
    kernels split by shape as the model's projections are, every op's time positive,
    the kernels sorted by time, shares summing to 1, and the kernels' time within the
    step's;
  - the table printed at the end names the steps and the top kernel;
  - every kernel's least bytes a call (swiglu_forward's by hand), its GB/s (those bytes
    over its time) and that against the device's copy bandwidth, measured after the
    last step and printed;
  - every metrics line carries mem_peak_bytes > 0 and rss_peak_bytes > 0, and on cuda
    mem_reserved_bytes >= mem_peak_bytes (the caching allocator); the run record has
    the same maxima;
  - the idle time between calls, by the pair of names around each gap: one gap before
    every call of a step but its first, the pairs summing to the totals, within the
    step's unaccounted time, and the line and the longest pair printed;
  - the losses, gradient norms and validation loss of the two runs are bit-identical:
    profiling times the calls but changes none of their results.

usage: kernel_profile_test.py AMSP DATA WORKDIR
Prints one line per check and ends with "N passed, M failed"; exit status 1 on a failure.
"""
import collections
import json
import os
import subprocess
import sys

STEPS, ACCUM, BATCH, SEQ = 3, 2, 2, 32
TINY = json.load(open(os.path.join(os.path.dirname(__file__), "..", "..", "inputs", "models", "tiny.json")))
L = TINY["num_hidden_layers"]
H = TINY["hidden_size"]
KV = H // TINY["num_attention_heads"] * TINY["num_key_value_heads"]
I = TINY["intermediate_size"]
V = TINY["vocab_size"]
N = BATCH * SEQ  # rows of a micro-batch

# Calls per micro-batch of each op the model runs (src/model/llama.cpp; no
# recomputation): per layer two RMSNorms, four projections (q, k and v as one over
# their adjacent weights, gate and up as another), one attention (which rotates q
# and k by RoPE as it reads them: no RoPE call of its own), SwiGLU (its forward
# again in backward); the head's norm and projection.
PER_MICRO = {
    "embedding_forward": 1, "embedding_backward": 1,
    "rmsnorm_forward": 2 * L + 1, "rmsnorm_apply": 2 * L + 1, "rmsnorm_backward": 2 * L + 1,
    "attention_forward": L, "attention_backward": L,
    "swiglu_forward": 2 * L, "swiglu_backward": L,
    "cross_entropy_forward": 1, "cross_entropy_backward": 1,
    "from_host": 2,  # tokens and targets
}
# The linear kernels by shape (M, in, out): q, k and v; o; gate and up; down; the head.
# Summed, not a dict literal: two of them may have one shape (the tiny preset's
# vocabulary is hidden + 2 kv_dim).
LINEAR_SHAPES = collections.Counter()
for shape, count in [((N, H, H + 2 * KV), L), ((N, H, H), L), ((N, H, 2 * I), L), ((N, I, H), L),
                     ((N, H, V), 1)]:
    LINEAR_SHAPES[shape] += count
# Per step: AdamW once per unit, over every tensor of its OS-shard (Backend::adamw_parts);
# one sum of squares per unit; the clipping factor; the one read of the step's loss and norm;
# zeroed: the head's residual gradient per micro-batch, the embedding's table gradient in
# the first (which writes every other gradient: no pass zeroes the gradients) and the
# step's loss and norm sums.
PER_STEP = {"adamw": L + 2, "sum_squares": L + 2, "clip_scale": 1, "to_host": 1, "fill_zero": ACCUM + 2}
# Ops a one-rank step never calls: the residual products read the residual in place
# (linear_forward_residual) and RMSNorm's backward rounds the gradient the products
# read, so no layer copies its residual stream.
NEVER = ("copy",)

passed, failed = 0, 0


def check(ok, what):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if ok:
        passed += 1
    else:
        failed += 1
    return ok


def train(amsp, data, out, device, profile):
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", AMSP_CUDA_EMULATION="1")
    cmd = [amsp, "train", "--model", "tiny", "--data", data, "--device", device, "--shard", "ddp",
           "--steps", str(STEPS), "--grad-accum", str(ACCUM), "--batch-size", str(BATCH),
           "--seq-len", str(SEQ), "--threads", "1", "--eval-every", "0", "--eval-windows", "2",
           "--peak-tflops", "1", "--metrics", os.path.join(out, "metrics.jsonl"),
           "--run-info", os.path.join(out, "run.json")]
    if device == "cuda":
        cmd += ["--precision", "bf16"]
    if profile:
        cmd += ["--kernel-profile", os.path.join(out, "profile.json")]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240, env=env)
    if not check(p.returncode == 0, f"{device}: amsp train{' --kernel-profile' if profile else ''} exits 0"):
        print(p.stdout[-3000:])
        return None
    return p.stdout


def by_op(kernels):
    ops = {}
    for k in kernels:
        o = ops.setdefault(k["op"], {"calls": 0, "total_ms": 0.0})
        o["calls"] += k["calls"]
        o["total_ms"] += k["total_ms"]
    return ops


def check_profile(device, prof, stdout):
    steps = STEPS - 1
    check(prof["steps"] == steps and prof["first_step"] == 2 and prof["last_step"] == STEPS,
          f"{device}: steps 2-{STEPS} timed, the first left out (got {prof['steps']}, "
          f"{prof['first_step']}-{prof['last_step']})")
    check(prof["device"].startswith(device), f"{device}: device {prof['device']!r}")
    ops = by_op(prof["kernels"])
    want = {op: n * ACCUM * steps for op, n in PER_MICRO.items()}
    want.update({op: n * steps for op, n in PER_STEP.items()})
    want["linear_forward"] = want["linear_backward_input"] = want["linear_backward_weight"] = \
        sum(LINEAR_SHAPES.values()) * ACCUM * steps
    for op, n in sorted(want.items()):
        got = ops.get(op, {"calls": 0, "total_ms": 0})
        check(got["calls"] == n and got["total_ms"] > 0,
              f"{device}: {op}: {got['calls']} calls (want {n}), {got['total_ms']:.4f} ms")
    for op in NEVER:
        check(op not in ops, f"{device}: no {op} call (got {ops.get(op, {}).get('calls', 0)})")
    for kind in ("linear_forward", "linear_backward_input", "linear_backward_weight"):
        shapes = {k["name"]: k["calls"] for k in prof["kernels"] if k["op"] == kind}
        expect = {f"{kind}[M={m},in={i},out={o}]": c * ACCUM * steps for (m, i, o), c in LINEAR_SHAPES.items()}
        # Shapes that coincide (k/v and q/o when kv heads = heads) add up under one name.
        merged = {}
        for name, c in expect.items():
            merged[name] = merged.get(name, 0) + c
        check(shapes == merged, f"{device}: {kind} by shape {shapes}")
    times = [k["total_ms"] for k in prof["kernels"]]
    check(times == sorted(times, reverse=True), f"{device}: kernels sorted by total time")
    check(abs(sum(k["share"] for k in prof["kernels"]) - 1) < 1e-9, f"{device}: shares sum to 1")
    per_step = [k["ms_per_step"] for k in prof["kernels"]]
    check(all(abs(k["ms_per_step"] * steps - k["total_ms"]) < 1e-9 * max(1, k["total_ms"]) for k in prof["kernels"]),
          f"{device}: ms_per_step = total_ms / steps")
    kernel_ms = sum(per_step)
    check(0 < kernel_ms <= prof["step_ms_mean"] * (1 + 1e-9) and prof["step_ms_median"] > 0 and
          abs(prof["unaccounted_ms_per_step"] - (prof["step_ms_mean"] - kernel_ms)) < 1e-6,
          f"{device}: kernels {kernel_ms:.2f} ms within the step's {prof['step_ms_mean']:.2f} ms, "
          f"unaccounted {prof['unaccounted_ms_per_step']:.2f} ms")
    top = prof["kernels"][0]["name"]
    check(f"kernel profile: steps 2-{STEPS} ({steps})" in stdout and top in stdout,
          f"{device}: the table is printed, naming the steps and the top kernel {top}")
    check_bandwidth(device, prof, stdout)
    check_idle(device, prof, stdout)


def check_idle(device, prof, stdout):
    """The time between calls, by the pair of names around each gap: a gap before every
    call of a step but its first, the pairs adding up to the totals, and each name as
    often `before` (`after`) a gap as it is called, but for the step's first (last) call."""
    steps = prof["steps"]
    calls = {k["name"]: k["calls"] for k in prof["kernels"]}
    idle = prof["idle"]
    gaps = sum(i["gaps"] for i in idle)
    check(prof["idle_gaps_per_step"] * steps == gaps == sum(calls.values()) - steps,
          f"{device}: a gap before every call but each step's first ({gaps} gaps, "
          f"{sum(calls.values())} calls, {steps} steps)")
    idle_ms = sum(i["total_ms"] for i in idle)
    check(abs(prof["idle_ms_per_step"] * steps - idle_ms) <= 1e-9 * max(1, idle_ms) and
          0 <= prof["idle_ms_per_step"] <= prof["unaccounted_ms_per_step"] + 1e-6,
          f"{device}: idle {prof['idle_ms_per_step']:.3f} ms per step, the pairs' sum, within the unaccounted "
          f"{prof['unaccounted_ms_per_step']:.3f} ms")
    times = [i["total_ms"] for i in idle]
    check(times == sorted(times, reverse=True) and
          all(0 <= i["max_ms"] <= i["total_ms"] and abs(i["ms_per_step"] * steps - i["total_ms"]) <= 1e-9 * max(1, i["total_ms"])
              for i in idle) and all(i["after"] in calls and i["before"] in calls for i in idle),
          f"{device}: idle pairs sorted by time, each naming two profiled calls, max within total")
    # The step ends with its one read of the loss and the norm (to_host), and starts with
    # something else.
    for side, edge in (("before", "first"), ("after", "last")):
        seen = collections.Counter()
        for i in idle:
            seen[i[side]] += i["gaps"]
        short = {name: n - seen[name] for name, n in calls.items() if n != seen[name]}
        ends = list(short) == ["to_host"]
        check(list(short.values()) == [steps] and ends == (edge == "last"),
              f"{device}: every call is {side} a gap but the step's {edge} ({short})")
    top = idle[0]
    check(f"idle between calls: {prof['idle_ms_per_step']:.2f} ms per step" in stdout and
          f"{top['after']} -> {top['before']}" in stdout,
          f"{device}: the idle line and the longest pair are printed ({top['after']} -> {top['before']})")


def check_bandwidth(device, prof, stdout):
    """Each kernel's least bytes over its time, against the device's copy bandwidth."""
    act = 2 if device == "cuda" else 4  # bf16 activations under --precision bf16, else fp32
    sw = next((k for k in prof["kernels"] if k["name"] == "swiglu_forward"), {})
    want = N * 3 * I * act  # gate and up read, the product written
    copy = prof.get("copy_gb_per_s") or 0
    consistent = all(abs(k["gb_per_s"] - k["min_bytes"] / (k["total_ms"] * 1e6))
                     <= 1e-9 * k["gb_per_s"] and abs(k["of_copy"] - k["gb_per_s"] / copy) <= 1e-12
                     for k in prof["kernels"]) if copy > 0 else False
    got = sw.get("min_bytes", 0) / max(1, sw.get("calls", 1))
    check(got == want and copy > 0 and consistent
          and f"device copy {copy:.1f} GB/s" in stdout,
          f"{device}: swiglu_forward's least bytes {got:.0f} a call (want {want}), "
          f"every kernel's GB/s its least bytes over its time and of_copy that over the device's copy "
          f"bandwidth ({copy:.1f} GB/s, printed)")


def metrics(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if line.strip()]


def check_memory(device, out):
    rows = [r for r in metrics(out) if r.get("step", 0) >= 1]
    check(len(rows) == STEPS and all(r.get("mem_peak_bytes", 0) > 0 and r.get("rss_peak_bytes", 0) > 0 for r in rows),
          f"{device}: every metrics line has mem_peak_bytes > 0 and rss_peak_bytes > 0 "
          f"({rows[-1].get('mem_peak_bytes') if rows else None}, {rows[-1].get('rss_peak_bytes') if rows else None})")
    if device == "cuda":
        ok = all(r.get("mem_reserved_bytes", 0) >= r["mem_peak_bytes"] for r in rows)
    else:
        ok = all("mem_reserved_bytes" not in r for r in rows)
    check(ok, f"{device}: mem_reserved_bytes {'>= mem_peak_bytes' if device == 'cuda' else 'absent (no caching allocator)'}")
    result = json.load(open(os.path.join(out, "run.json")))["result"]
    reserved = result.get("peak_backend_reserved_bytes")
    check(result["peak_backend_bytes"] == rows[-1]["mem_peak_bytes"] and result["peak_rss_bytes"] >= rows[-1]["rss_peak_bytes"]
          and (reserved >= rows[-1]["mem_reserved_bytes"] if device == "cuda" else reserved is None),
          f"{device}: the run record's maxima: backend {result['peak_backend_bytes']}, reserved {reserved}, "
          f"rss {result['peak_rss_bytes']}")


def same_results(device, with_profile, without):
    fields = ("loss", "grad_norm", "val_loss")
    a = [{f: r.get(f) for f in fields} for r in metrics(with_profile)]
    b = [{f: r.get(f) for f in fields} for r in metrics(without)]
    check(a == b and len(a) == STEPS + 1, f"{device}: losses, gradient norms and validation loss bit-identical "
          f"with and without --kernel-profile ({[r['loss'] for r in a[1:]]})")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    amsp, data, work = sys.argv[1:]
    for device in ("cpu", "cuda"):
        profiled = os.path.join(work, device, "profiled")
        plain = os.path.join(work, device, "plain")
        stdout = train(amsp, data, profiled, device, True)
        if stdout is None or train(amsp, data, plain, device, False) is None:
            continue
        check_profile(device, json.load(open(os.path.join(profiled, "profile.json"))), stdout)
        check_memory(device, profiled)
        same_results(device, profiled, plain)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or not passed else 0)


if __name__ == "__main__":
    main()
