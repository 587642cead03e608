#!/usr/bin/env python3
"""validation/gpu/check.sh --emulated, end to end, judged by what it writes.

  check_emulated_test.py BUILD_DIR WORKDIR     (python: one with torch and transformers)

1. The whole check on the CPU emulation of CUDA must exit 0 and write gpu-check.md and
   gpu-check.json in which every part that can run without a GPU is "ok" (preflight,
   both kernel checks, the losses against the CPU, amsp beside PyTorch with the first
   losses compared, attention at D = 128 timed, zero3 on two emulated GPUs), the sanitizers and the counters
   (ncu) are "not run" with their reason, and the figures hold a per-kernel table whose call counts follow the
   model and the device's idle time between calls by pair; the CPU ranks' benchmarks (hidden communication, checkpoint stall) ran at
   tiny sizes and their tables are in the report.
2. A wrong result must fail the check: with an amsp whose gpu-info exits 1, check.sh
   must exit non-zero and name the failing check on its last line.
3. --parts runs only the parts it names, and refuses one that does not exist.
Prints "N passed, M failed"; exit 1 on any failure.
"""

import json
import os
import stat
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
build, work = sys.argv[1], sys.argv[2]
failures, passes = [], []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    (passes if cond else failures).append(what)


def check(out, amsp_build, *more):
    p = subprocess.run(["bash", os.path.join(HERE, "check.sh"), "--emulated", "--build", amsp_build, "--out", out,
                        *more], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=540)
    return p.returncode, p.stdout


out = os.path.join(work, "whole")
rc, text = check(out, build)
print(text[-6000:])
expect(rc == 0, f"check.sh --emulated exits 0 (got {rc})")
doc = json.load(open(os.path.join(out, "gpu-check.json"))) if os.path.exists(os.path.join(out, "gpu-check.json")) else {}
results = {(r["part"], r["case"]): r["result"] for r in doc.get("results", [])}
by_part = {}
for (part, case), verdict in results.items():
    by_part.setdefault(part, []).append(verdict)
for part, n in (("preflight", 1), ("kernels", 2), ("losses", 1), ("several GPUs", 1)):
    expect(by_part.get(part, []) == ["ok"] * n, f"{part}: {n} ok (got {by_part.get(part)})")
expect(by_part.get("side-by-side", [])[:3] == ["ok", "ok", "ok"],
       f"side-by-side: amsp, its predicted peak memory and the first loss against PyTorch eager ok "
       f"(got {by_part.get('side-by-side')})")
expect(by_part.get("sanitizer") == ["not run"] * 4, "sanitizers: not run under the emulation, with a reason")
expect(by_part.get("counters") == ["not run"], "counters (ncu): not run under the emulation")
figures = doc.get("figures", {})
kernels = {k["name"]: k for k in figures.get("kernels", {}).get("kernels", [])}
steps = figures.get("kernels", {}).get("steps", 0)
layers = json.load(open(os.path.join(HERE, "..", "..", "inputs", "models", "tiny.json")))["num_hidden_layers"]
expect(steps > 0 and kernels.get("attention_forward", {}).get("calls") == layers * steps,
       f"kernel table: attention_forward called layers x steps = {layers} x {steps} times "
       f"(got {kernels.get('attention_forward', {}).get('calls')})")
expect(figures.get("amsp", {}).get("peak_bytes", 0) > 0, "amsp's peak memory reported")
expect(by_part.get("CPU ranks") == ["ok"] * 4, f"CPU ranks: hidden unbound and bound, two checkpoint stalls ok "
       f"(got {by_part.get('CPU ranks')})")
cores = figures.get("cores", {})
# The bound run's ranks were started with hydra's binding, 2 cores each.
launcher = os.path.join(out, "cores", "mpiexec-bound-2")
expect(os.path.exists(launcher) and "-bind-to core:2" in open(launcher).read()
       and "zero3" in cores.get("hidden-bound-2", {}).get("table", ""),
       "the hidden bench ran again with each rank bound to 2 cores (mpiexec -bind-to core:2)")
hidden_details = [r["detail"] for r in doc.get("results", [])
                  if r["part"] == "CPU ranks" and r["case"].startswith("hidden")]
expect(len(hidden_details) == 2 and all("on the rank that computed longest" in d and "net of waits for late ranks" in d
                                       and "where its schedule lets at most" in d for d in hidden_details)
       and "the slowest, rank" in cores.get("hidden", {}).get("table", ""),
       "the hidden bench traced its last run: every rank's share, the share on the rank the others waited for, "
       "and every rank's share net of waits for late ranks, beside what the plan's schedule lets hide")
expect("zero3" in cores.get("hidden", {}).get("table", "") and
       all("goal: background stall" in cores.get(k, {}).get("table", "") for k in ("ckpt-base", "ckpt-small")),
       "the CPU ranks' benchmarks' tables are in the figures")
# On a GPU machine amsp's default device is cuda: the CPU ranks must ask for the CPU.
hidden_log = os.path.join(out, "cores", "hidden", "mpi4", "0-after-0.log")
first = open(hidden_log).readline() if os.path.exists(hidden_log) else ""
expect("--device cpu" in first and all(
    table.count(" --device cpu") == 2 for table in (cores.get(k, {}).get("table", "") for k in ("ckpt-base", "ckpt-small"))),
    "the CPU ranks' runs ask for --device cpu (the hidden bench's and both checkpoint benchmarks' commands)")
md = open(os.path.join(out, "gpu-check.md")).read() if os.path.exists(os.path.join(out, "gpu-check.md")) else ""
expect("| amsp |" in md and "| PyTorch eager" in md and "| kernel | calls/step" in md and "CPU ranks, hidden" in md,
       "gpu-check.md has the results, the side-by-side, the kernel table and the CPU ranks' tables")
kprof = figures.get("kernels") or {}
idle = kprof.get("idle") or [{}]
expect(kprof.get("idle_gaps_per_step", 0) > 0 and "| after | before | gaps/step |" in md and
       f"| {idle[0].get('after')} | {idle[0].get('before')} |" in md,
       f"gpu-check.md has the device's idle time between calls by pair, the largest first "
       f"({idle[0].get('after')} -> {idle[0].get('before')})")
expect((kprof.get("copy_gb_per_s") or 0) > 0 and "| GB/s | of copy |" in md
       and all(r.get("gb_per_s", 0) > 0 for r in kprof.get("kernels", [])[:15]),
       "the kernel table gives each kernel's GB/s beside the device's copy bandwidth, measured in the same run")
torch_profile = (figures.get("torch_eager") or {}).get("profile") or {}
expect(torch_profile.get("steps") == 2 and torch_profile.get("kernels") and "| operator (CPU) | calls/step" in md
       and "Attention, both sides: amsp" in md,
       "PyTorch eager's own table (torch.profiler over 2 steps) and attention on both sides are in gpu-check.md")
# amsp timed as users run it, and again with the profile's events; the host's share of each step.
plain, profiled = figures.get("amsp", {}), figures.get("amsp_profiled", {})
expect("| amsp with --kernel-profile |" in md and 0 < plain.get("host_issue_ms_median", 0) <= plain.get("step_ms_median", 0)
       and profiled.get("step_ms_median", 0) > 0,
       f"amsp's step timed without and with the kernel profile, and its host time within the step "
       f"(got {plain.get('host_issue_ms_median')} of {plain.get('step_ms_median')} ms, profiled {profiled.get('step_ms_median')})")
# Where the host's time goes, from the plain run's trace: every unit's forward and backward
# enqueued within the step, in the report.
h = figures.get("host_phases") or {}
expect("| enqueueing forwards |" in md and h.get("steps", 0) >= 1 and 0 < h.get("forward", 0)
       and 0 < h.get("backward", 0) and h.get("forward", 0) + h.get("backward", 0) <= h.get("whole", 0),
       f"the host's time per step by phase, from the side-by-side run's trace (got {h})")

# Attention at D = 128 (llama-7b's head dim; tiny's width as one head here): amsp's two
# kernels timed from its own profile, in the report beside PyTorch's.
att = figures.get("attention_128") or {}
expect((by_part.get("attention") or ["?"])[0] == "ok" and att.get("head_dim") == 128
       and att.get("amsp", {}).get("forward_ms", 0) > 0 and att.get("amsp", {}).get("backward_ms", 0) > 0
       and "| system | forward ms | backward ms | forward TFLOP/s |" in md,
       f"attention at D = 128: amsp's forward and backward timed, in the report (got {by_part.get('attention')}, {att})")

# Attention with one tile of 16 rows a warp beside two (AMSP_ATTENTION_WARP_TILES), timed in
# the same run: both layouts ran, and the table is in the report.
wt = figures.get("attention_warp_tiles") or {}
ran = {}
for t in (1, 2):
    info = os.path.join(out, "runs", f"attention-warp-tiles-{t}", "run.json")
    ran[t] = " ".join(json.load(open(info)).get("devices", [])) if os.path.exists(info) else ""
expect("two tiles of 16 rows a warp" in ran[2] and "two tiles" not in ran[1],
       f"the runs of one tile a warp and of two each ran the layout named (devices: {ran})")
expect(results.get(("attention", f"D = {wt.get('head_dim')}, tiny's layers, one tile a warp against two")) == "ok"
       and all(wt.get(f"tiles_{t}", {}).get("forward_ms", 0) > 0 for t in (1, 2))
       and "| tiles a warp | forward ms | backward ms |" in md,
       f"attention with one tile a warp against two: both timed, in the report (got {wt})")

# A wrong result: gpu-info fails, so the check must fail and say which check.
fake = os.path.join(work, "fake-build")
os.makedirs(os.path.join(fake, "test-work"), exist_ok=True)
wrapper = os.path.join(fake, "amsp")
with open(wrapper, "w") as f:
    f.write(f'#!/bin/sh\n[ "$1" = gpu-info ] && {{ echo "gpu-info: planted failure"; exit 1; }}\n'
            f'exec "{os.path.abspath(build)}/amsp" "$@"\n')
os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IEXEC)
corpus = os.path.join(build, "test-work", "corpus.h5")
link = os.path.join(fake, "test-work", "corpus.h5")
if not os.path.exists(link):
    os.symlink(os.path.abspath(corpus), link)
rc, text = check(os.path.join(work, "failing"), fake)
last = text.strip().splitlines()[-1] if text.strip() else ""
expect(rc != 0 and last == "gpu check FAILED: preflight / gpu-info",
       f"a failing gpu-info fails the check and is named on the last line (exit {rc}, last line {last!r})")

# --parts: only the parts named run (after the preflight); a part that does not exist is refused.
rc, text = check(os.path.join(work, "parts"), build, "--parts", "gpus")
parts_doc = os.path.join(work, "parts", "gpu-check.json")
ran = [r["part"] for r in json.load(open(parts_doc))["results"]] if os.path.exists(parts_doc) else []
expect(rc == 0 and ran == ["preflight", "several GPUs"], f"--parts gpus runs the preflight and that part (got {ran})")
rc, text = check(os.path.join(work, "parts"), build, "--parts", "kernels,cpu")
last = text.strip().splitlines()[-1] if text.strip() else ""
expect(rc == 2 and last.endswith("--parts: no part cpu (expected some of kernels,losses,side-by-side,attention,"
                                  "counters,sanitizers,gpus,cores)"), f"--parts with an unknown part refused (exit {rc}, {last!r})")

print(f"{len(passes)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
