#!/usr/bin/env python3
"""The CUDA backend trains what the CPU backend trains, run on the CPU emulation of CUDA.

`amsp train --device cuda` in a build without CUDA runs the CUDA backend's own code
(cuBLAS calls, kernels/cuda, NCCL communicators, streams and events) on the emulation
(kernels/cuda/api.h) when AMSP_CUDA_EMULATION=1. For each case (ranks, plan) the tiny
preset trains a few bf16 steps on --device cuda and on --device cpu from the same seed
and data, and:

  - both runs complete; the cuda run's record names backend "cuda", a cuda device on
    every rank, and a happens-before checker that checked accesses (hb_checked > 0):
    every kernel, copy and collective declared what it reads and writes, and none was
    unordered against a conflicting one (the checker ends the job if one is);
  - every step's loss and the final validation loss agree within 2^-8 relative;
  - the host waits for the device once per step (host_syncs): the read of the loss
    and the norm at its end;
  - the device memory reserved (mem_reserved_bytes) is the same at every step: no
    step after the first asks the device for memory; its peak is within 5% of the
    engine's prediction;
  - the parameters of the final checkpoint (read with h5py) agree per tensor within
    1e-2 relative L2 and 0.25 of the tensor's largest element.

Tolerances, as in equivalence_test.py's bf16 cases (doc/engine-tests.md): u = 2^-8 is
bf16's unit roundoff. The two backends compute the same bf16-rounded products, but
their fp32 accumulations run in different orders (cuBLAS vs OpenBLAS, the fused
attention's online softmax vs the CPU's full softmax), so a product lands on the other
side of a bf16 rounding boundary now and then: a loss moves, to first order, by at most
what a relative change u of every parameter would do, 2^-8. AdamW turns gradient
differences of ~2u into update differences of ~2u lr; a few steps stay far inside 1e-2
of a tensor in L2; single elements have no derivable bound, 0.25 only catches garbage.
A wrong kernel (a dropped beta, a missing reduction, a race) moves a loss by far more.

Also: --device cuda without AMSP_CUDA_EMULATION=1 is refused with exit code 2 and a
one-line reason, and so is an AMSP_ATTENTION_WARP_TILES other than 1 or 2; and an NCCL failure (the emulation's AMSP_EMU_NCCL_FAIL, at issue or
reported asynchronously) ends the job with a line naming the group and the op; and a
run resumed on cuda from a checkpoint it wrote continues bit for bit.

usage: cuda_emulation_test.py AMSP MPIEXEC DATA WORKDIR [--only=TEXT]

--only=TEXT runs only the cases whose plan contains TEXT, or with "faults" the refusal
and the NCCL failures, with "resume" the resume.
Prints one line per check and ends with "N passed, M failed".
"""
import json
import math
import os
import shutil
import subprocess
import sys
import time

STEPS, SEQ, BATCH = 3, 32, 2
LOSS_TOL = 2.0 ** -8
PARAM_L2_TOL, PARAM_MAX_TOL = 1e-2, 0.25
# (ranks, plan): data parallel, fully sharded, and a mixed plan whose P, G and OS
# groups all differ.
# (ranks, plan, compression): the last runs its parameter all-gathers and gradient
# reduce-scatters compressed (doc/compression.md), so the NCCL communicator's quantizing
# steps and its all-to-all run on its stream.
CASES = [(2, "ddp", "off"), (2, "zero3", "off"), (4, "p=2x1,g=2x1,os=4x1", "off"), (2, "zero3", "on")]


def train(amsp, mpiexec, data, work, tag, ranks, plan, device, compress="off"):
    out = os.path.join(work, tag)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if device == "cuda":
        env["AMSP_CUDA_EMULATION"] = "1"
    cmd = [mpiexec, "-n", str(ranks), amsp, "train", "--model", "tiny", "--data", data,
           "--device", device, "--precision", "bf16", "--shard", plan, "--compress", compress,
           "--steps", str(STEPS), "--seq-len", str(SEQ), "--batch-size", str(BATCH),
           "--threads", "1", "--eval-every", "0", "--eval-windows", "4", "--peak-tflops", "1",
           "--metrics", os.path.join(out, "metrics.jsonl"), "--run-info", os.path.join(out, "run.json"),
           "--checkpoint-dir", os.path.join(out, "ckpt")]
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300, env=env)
    return p, out, time.time() - t0


def rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def losses(out):
    r = rows(os.path.join(out, "metrics.jsonl"))
    steps = {x["step"]: x["loss"] for x in r if "loss" in x and "step" in x}
    vals = [x["val_loss"] for x in r if x.get("val_loss") is not None]
    return steps, (vals[-1] if vals else float("nan"))


def checkpoint_params(out):
    import h5py
    import numpy as np
    ckpt = os.path.join(out, "ckpt")
    last = sorted(f for f in os.listdir(ckpt) if f.endswith(".h5"))[-1]
    params = {}
    with h5py.File(os.path.join(ckpt, last), "r") as f:
        def take(name, obj):
            if isinstance(obj, h5py.Dataset) and not name.startswith("optimizer/"):
                params[name] = np.asarray(obj, dtype=np.float64)
        f.visititems(take)
    return params


def compare_params(got, ref):
    """(worst relative L2, its tensor, worst max |diff| / max |ref|, its tensor)."""
    import numpy as np
    worst_l2, at_l2, worst_max, at_max = 0.0, "", 0.0, ""
    for name, b in ref.items():
        a = got.get(name)
        if a is None or a.shape != b.shape:
            return math.inf, f"{name} missing or of another shape", math.inf, name
        d = a - b
        l2 = float(np.sqrt((d * d).sum() / max((b * b).sum(), 1e-60)))
        mx = float(np.abs(d).max() / max(np.abs(b).max(), 1e-30))
        if not (l2 == l2 and mx == mx):
            l2 = mx = math.inf
        if l2 > worst_l2:
            worst_l2, at_l2 = l2, name
        if mx > worst_max:
            worst_max, at_max = mx, name
    return worst_l2, at_l2, worst_max, at_max


def check_resume(amsp, mpiexec, data, work, check):
    """Checkpoint state crosses the device boundary both ways (state_views stages it
    through host copies): 4 steps saving at step 2, and a run resumed from that file,
    give steps 3 and 4 bit for bit. The first run saves in the background, from a
    snapshot in the backend's page-locked host memory (cudaHostAlloc): its run record
    says so (ckpt_snapshot_pinned, ckpt_snapshot_bytes = 3 fp32 states of this rank's
    OS-shard), and the resume checks what that snapshot held. Its writer waits 1 s
    before it waits for the snapshot's copies (save.snapshot@2,SLEEP=1), so that step 3's
    optimizer updates are issued first: the happens-before checker then requires them to
    be ordered after the copies on the device (Backend::fence_snapshot)."""
    base = os.path.join(work, "resume")
    env = dict(os.environ, AMSP_CUDA_EMULATION="1", OMP_NUM_THREADS="1")
    cmd = [mpiexec, "-n", "2", amsp, "train", "--model", "tiny", "--data", data, "--device", "cuda",
           "--precision", "bf16", "--shard", "zero3", "--steps", "4", "--seq-len", str(SEQ),
           "--batch-size", str(BATCH), "--threads", "1", "--eval-every", "0", "--eval-windows", "2",
           "--peak-tflops", "1"]
    os.makedirs(base, exist_ok=True)
    straight = subprocess.run(cmd + ["--checkpoint-dir", os.path.join(base, "a"), "--checkpoint-every", "2",
                                     "--checkpoint-mode", "background", "--run-info", os.path.join(base, "a.json"),
                                     "--metrics", os.path.join(base, "a.jsonl")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300,
                              env=dict(env, AMSP_FAULT="save.snapshot@2,SLEEP=1"))
    if straight.returncode != 0:
        check(False, f"resume on cuda: the straight run failed: {straight.stderr.strip()[-300:]}")
        return
    info = json.load(open(os.path.join(base, "a.json")))
    snap = info.get("ckpt_snapshot_bytes")
    check(info.get("checkpoint_mode") == "background" and info.get("ckpt_snapshot_pinned") is True
          and isinstance(snap, int) and snap > 0 and snap % 12 == 0,
          f"background save on cuda: snapshot in pinned host memory "
          f"(ckpt_snapshot_pinned {info.get('ckpt_snapshot_pinned')}, ckpt_snapshot_bytes {snap})")
    os.makedirs(os.path.join(base, "b"))
    shutil.copy(os.path.join(base, "a", "step-00000002.h5"), os.path.join(base, "b"))
    resumed = subprocess.run(cmd + ["--checkpoint-dir", os.path.join(base, "b"), "--resume", "auto",
                                    "--metrics", os.path.join(base, "b.jsonl")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300, env=env)
    if resumed.returncode != 0:
        check(False, f"resume on cuda: the resumed run failed: {resumed.stderr.strip()[-300:]}")
        return
    steps = lambda f: {r["step"]: (r["loss"], r["grad_norm"]) for r in rows(os.path.join(base, f))
                       if "loss" in r and "step" in r}
    a, b = steps("a.jsonl"), steps("b.jsonl")
    check(sorted(b) == [3, 4] and all(a[k] == b[k] for k in b),
          f"resume on cuda from step 2: steps 3-4 (loss, grad norm) {[b.get(k) for k in (3, 4)]} vs "
          f"{[a.get(k) for k in (3, 4)]}, bit for bit")


def check_refusal_and_faults(amsp, mpiexec, data, check):
    """--device cuda without the emulation is refused; an NCCL failure ends every rank."""
    # Refused without the environment variable.
    env = {k: v for k, v in os.environ.items() if k != "AMSP_CUDA_EMULATION"}
    p = subprocess.run([amsp, "train", "--data", data, "--device", "cuda", "--steps", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60, env=env)
    check(p.returncode == 2 and "AMSP_CUDA_EMULATION=1" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          f"--device cuda without AMSP_CUDA_EMULATION: exit {p.returncode}, {p.stderr.strip()[:160]}")
    # The attention's warp layout, a knob for timing, takes 1 or 2 and nothing else.
    env = dict(os.environ, AMSP_CUDA_EMULATION="1", AMSP_ATTENTION_WARP_TILES="3")
    p = subprocess.run([amsp, "train", "--data", data, "--device", "cuda", "--model", "tiny", "--seq-len", "16",
                        "--batch-size", "1", "--steps", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60, env=env)
    check(p.returncode == 2 and "AMSP_ATTENTION_WARP_TILES=3: expected 1 or 2" in p.stderr
          and len(p.stderr.strip().splitlines()) == 1,
          f"AMSP_ATTENTION_WARP_TILES=3: exit {p.returncode}, {p.stderr.strip()[:160]}")

    # An NCCL failure, returned at issue or reported asynchronously after the op
    # completed (the emulation's AMSP_EMU_NCCL_FAIL), ends every rank with one line
    # naming the group and the op, instead of hanging or training on.
    for fault, expect in (("reducescatter:3", "issuing reduce_scatter"), ("allgather:2:async", "ops issued up to")):
        env = dict(os.environ, AMSP_CUDA_EMULATION="1", AMSP_EMU_NCCL_FAIL=fault, OMP_NUM_THREADS="1")
        p = subprocess.run([mpiexec, "-n", "2", amsp, "train", "--model", "tiny", "--data", data, "--device", "cuda",
                            "--precision", "bf16", "--shard", "zero3", "--steps", "2", "--seq-len", str(SEQ),
                            "--batch-size", str(BATCH), "--threads", "1", "--eval-every", "0", "--eval-windows", "2",
                            "--peak-tflops", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
        lines = [l for l in p.stderr.splitlines() if l.startswith("amsp: error:")]
        check(p.returncode != 0 and lines and "NCCL error on group P" in lines[0] and expect in lines[0],
              f"NCCL fault {fault}: exit {p.returncode}, {lines[0] if lines else p.stderr.strip()[-200:]}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--only")]
    only = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")), "")
    amsp, mpiexec, data, work = args[:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    results = []

    def check(ok, text):
        results.append(bool(ok))
        print(f"{'ok  ' if ok else 'FAIL'} {text}", flush=True)

    if not only or only in "faults":
        check_refusal_and_faults(amsp, mpiexec, data, check)

    for ranks, plan, compress in CASES:
        if only and only not in plan:
            continue
        name = f"{ranks} ranks, {plan}" + ("" if compress == "off" else f", --compress {compress}")
        tag = plan.replace(",", "_").replace("=", "").replace(":", "") + ("" if compress == "off" else "-q")
        runs = {}
        for device in ("cpu", "cuda"):
            p, out, secs = train(amsp, mpiexec, data, work, f"{tag}-{ranks}-{device}", ranks, plan, device,
                                 compress)
            if p.returncode != 0:
                check(False, f"{name}: --device {device} exit {p.returncode}: {p.stderr.strip()[-400:]}")
                break
            runs[device] = (out, secs)
        if len(runs) < 2:
            continue
        cpu, cuda = runs["cpu"][0], runs["cuda"][0]
        info = json.load(open(os.path.join(cuda, "run.json")))
        hb = (info.get("result") or {}).get("hb_checked")
        devices = info.get("devices", [])
        check(info.get("backend") == "cuda" and len(devices) == ranks and all(d.startswith("cuda:") for d in devices)
              and isinstance(hb, int) and hb > 0,
              f"{name}: cuda run completed in {runs['cuda'][1]:.0f} s (cpu {runs['cpu'][1]:.0f} s), "
              f"devices {sorted(set(devices))}, happens-before checks {hb}")
        # Host synchronisations per step (the metrics' host_syncs): one, the read of the
        # loss and the squared norm at the step's end. Gathers and reduction slots are
        # waited for by the compute stream, the batch is copied from page-locked memory
        # without waiting, the loss, the norm and the clipping factor stay on the device.
        syncs = [r.get("host_syncs") for r in rows(os.path.join(cuda, "metrics.jsonl")) if "loss" in r and "step" in r]
        check(len(syncs) == STEPS and all(x == 1 for x in syncs),
              f"{name}: host synchronisations per step {syncs}, expected 1 each")
        # The host's time to enqueue each step, up to that synchronisation: within the step.
        issue = [(r.get("host_issue_ms"), r["step_ms"]) for r in rows(os.path.join(cuda, "metrics.jsonl"))
                 if "loss" in r and "step" in r]
        check(len(issue) == STEPS and all(i is not None and 0 < i <= s for i, s in issue),
              f"{name}: host issue against step ms {issue}, expected each within its step")
        # Device memory is taken once: the plan's predicted peak at start-up, whatever it
        # missed in the first step, nothing after (no cudaMalloc, which synchronises, in
        # a later step): the caching allocator's reserve is the same at every step.
        reserved = [r.get("mem_reserved_bytes") for r in rows(os.path.join(cuda, "metrics.jsonl"))
                    if "loss" in r and "step" in r]
        check(len(reserved) == STEPS and len(set(reserved)) == 1 and reserved[0] > 0,
              f"{name}: device memory reserved per step {reserved}, expected the same at every step")
        # The allocator's peak is the engine's prediction within 5% (doc/engine.md,
        # "Memory, predicted and measured"): the backend's own workspace, the plan's
        # states and temporaries, the model's activations on this backend.
        last = [r for r in rows(os.path.join(cuda, "metrics.jsonl")) if "mem_peak_bytes" in r][-1:]
        err = [(r["mem_peak_bytes"] - r["mem_predicted_bytes"]) / r["mem_predicted_bytes"] for r in last]
        check(len(err) == 1 and abs(err[0]) <= 0.05,
              f"{name}: device memory peak against the prediction {err}, expected within 5%")
        (lc, vc), (lg, vg) = losses(cpu), losses(cuda)
        worst, at = 0.0, None
        for step in sorted(lc):
            if step not in lg:
                worst, at = math.inf, step
                break
            d = abs(lg[step] - lc[step]) / abs(lc[step])
            if d > worst:
                worst, at = d, step
        dv = abs(vg - vc) / abs(vc)
        check(len(lc) == STEPS and worst <= LOSS_TOL and dv <= LOSS_TOL,
              f"{name}: losses cuda vs cpu: worst {worst:.2e} at step {at} "
              f"(step 1 {lg.get(1, math.nan):.6f} vs {lc.get(1, math.nan):.6f}, "
              f"step {STEPS} {lg.get(STEPS, math.nan):.6f} vs {lc.get(STEPS, math.nan):.6f}), "
              f"validation {vg:.6f} vs {vc:.6f} ({dv:.2e}); at most {LOSS_TOL:.2e}")
        l2, at_l2, mx, at_mx = compare_params(checkpoint_params(cuda), checkpoint_params(cpu))
        check(l2 <= PARAM_L2_TOL and mx <= PARAM_MAX_TOL,
              f"{name}: checkpoint parameters: worst L2 {l2:.2e} ({at_l2}), worst max {mx:.2e} ({at_mx}); "
              f"at most {PARAM_L2_TOL:g} and {PARAM_MAX_TOL:g}")

    if not only or only in "resume":
        check_resume(amsp, mpiexec, data, work, check)

    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
