#!/usr/bin/env python3
"""The planner's predicted step time against measured runs on this machine.

For each layout (mpi4: `mpiexec -n 4`, one node; slurm2x2: `srun -N 2
--ntasks-per-node=2` on the local Slurm cluster, which this script starts and always
stops) and each shard plan of the engine's equivalence tests for that layout
(validation/engine/equivalence_test.py), on the tests' workload (tiny model, seq 32,
one sequence per rank, one micro-batch; all adjustable):

  1. measures a bandwidth table for the layout on the spot (`amsp comm-bench
     --output-table`, launched exactly like the training runs; the median per entry of
     --bench-runs runs), and a second one while busy one-rank processes load the cores
     as the ranks' compute does ("loaded"; --no-loaded-table skips it);
  2. measures the compute throughput under the same conditions: as many concurrent
     one-rank `amsp train --shard ddp` processes as the layout has ranks (they share
     the cores as the ranks do, and have no communication), traced; per-rank FLOP/s =
     the planner's FLOPs of one rank's step / the traced forward + backward time. Done
     before and after the layout's plans; the mean is fed to the planner, both are shown;
  3. predicts each plan with `amsp plan --shard PLAN --json --precision fp32
     --bandwidth TABLE --peak-tflops X --achievable 1 ...` on the same model and batch,
     with each table;
  4. runs `amsp train` with that plan (--metrics and --trace), --repeats times in rounds
     over the plans, drops the first --warmup steps, and takes the median of the rest:
     step time, comm in flight and exposed (metrics, rank 0), and from every rank's
     trace the forward + backward time, the time blocked, the optimizer, and the time
     at least one collective was in flight (busy);
  5. prints the table, and a second one that splits measured - predicted into compute,
     exposed communication, optimizer and the rest (--markdown FILE writes both, all
     figures go to WORK/results.json).

A benchmark, not a test: it never fails on a timing. Exit code 1 only if something
could not run at all (a failed comm-bench or calibration, or every plan of a layout).
doc/planner-validation.md has the measured tables and the analysis.

usage: benchmarks/plan_validation.py [--amsp build/amsp] [--data CORPUS.h5] [--work DIR]
           [--layouts mpi4,slurm2x2] [--plans all|"P1 P2"] [--steps 40] [--warmup 5]
           [--repeats 2] [--model tiny] [--seq-len 32] [--batch-size 1] [--grad-accum 1]
           [--bench-runs 3] [--no-loaded-table] [--plan-arg=--OPTION=VALUE ...]
           [--markdown FILE]
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "validation", "engine"))
sys.path.insert(0, os.path.join(REPO, "validation", "slurm"))
import equivalence_test as eq  # noqa: E402  (the plans, run(), clean_env())
import issue_order             # noqa: E402  (amsp plan --schedule's command)
import local_cluster as lc     # noqa: E402  (the local Slurm cluster, deadline())

RUN_TIMEOUT = 300


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


# --- layouts and plans -------------------------------------------------------------
class Layout:
    """mpiR: mpiexec -n R on this machine (one node); slurmNxR: N nodes x R tasks."""

    def __init__(self, name):
        self.name = name
        if name.startswith("mpi") and name[3:].isdigit():
            self.kind, self.nodes, self.per_node = "mpi", 1, int(name[3:])
        elif name.startswith("slurm") and "x" in name:
            n, r = name[5:].split("x", 1)
            self.kind, self.nodes, self.per_node = "slurm", int(n), int(r)
        else:
            raise SystemExit(f"plan_validation.py: error: --layouts: {name!r} is not mpiR or slurmNxR")
        self.world = self.nodes * self.per_node
        self.env = None  # set when the layout's launcher is ready

    def plans(self):
        """The equivalence tests' plans on this layout (fp32 cases), in their order. Under
        Slurm the test leaves out the plans whose groups the nodes do not cut (they only
        repeat its mpiexec cases); their step times still differ across nodes, so they
        come first here."""
        cases = eq.MPI_CASES if self.kind == "mpi" else eq.SLURM_CASES
        seen = [] if self.kind == "mpi" else ["ddp", "zero1", "zero2", "zero3", "mics:2", "mics:4"]
        for per_node, nodes, plan, _, _ in cases:
            if (per_node, nodes) == (self.per_node, self.nodes) and plan not in seen:
                seen.append(plan)
        return seen or ["ddp", "zero1", "zero2", "zero3"]

    def launcher(self, args):
        if self.kind == "mpi":
            return [args.mpiexec, "-n", str(self.world)]
        return ["srun", "--mpi=pmi2", "--time=10", "-N", str(self.nodes),
                f"--ntasks-per-node={self.per_node}"]


# --- running amsp -------------------------------------------------------------------
def run(cmd, env, what, log):
    rc, out, err, secs = eq.run(cmd, env, timeout=RUN_TIMEOUT)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + f"\n# exit {rc}, {secs:.1f} s\n--- stdout\n{out}--- stderr\n{err}")
    if rc != 0:
        tail = " | ".join(err.strip().splitlines()[-3:])
        raise RuntimeError(f"{what} failed (exit {rc}, log {log}): {tail[:400]}")
    return out, secs


def train_args(args, shard, metrics=None, trace=None, steps=None):
    """The tests' kind of run: no evaluation but the start's and the end's, one thread
    per rank, the MFU against a nominal peak (no sgemm measurement at start-up)."""
    cmd = [args.amsp, "train", "--model", args.model, "--data", args.data,
           "--steps", str(steps or args.steps), "--seq-len", str(args.seq_len),
           "--batch-size", str(args.batch_size), "--grad-accum", str(args.grad_accum),
           "--shard", shard, "--eval-every", "0", "--eval-windows", "8",
           "--peak-tflops", "1", "--threads", "1", "--comm-timeout", "120"]
    if getattr(args, "device", None):
        cmd += ["--device", args.device]
    if metrics:
        cmd += ["--metrics", metrics]
    if trace:  # every step after the first
        cmd += ["--trace", trace, "--trace-steps", str(args.steps - 1)]
    return cmd


# --- the share a schedule can hide at most ---------------------------------------
STAGE = re.compile(r"^\s+(P|G|OS|replica|gather|world) (all_gather|reduce_scatter|all_reduce) (\d+) (\w+), "
                   r".*?(every micro-batch|last micro-batch|once)")
PART = re.compile(r"after backward part (\d+)")
GROUP = re.compile(r"^plan p=(\d+)x(\d+),g=(\d+)x(\d+),os=(\d+)x(\d+) on (\d+) nodes x (\d+) ranks")


def schedule_bound(text, micro_batches):
    """The largest share of a step's communication that `amsp plan --schedule`'s `text`
    lets compute hide: 1 - tail / all, in elements each rank moves (a reduce-scatter or
    all-gather of a count c per rank over n ranks moves (n - 1) c, an all-reduce of c
    2 (n - 1) / n c). The tail is what nothing computes beside: the reductions of the last
    micro-batch that the first decoder layer (unit 1) issues after its backward's last part
    (only the embedding's backward follows), the embedding's (unit 0) and the norm. A unit
    that reduces in buckets issues each after one part of its backward ("after backward
    part k"); the others issue all after the whole. A P all-gather runs twice a micro-batch
    (forward, backward) but for the head's. A model with all collectives at one bandwidth:
    on the 8-layer small preset, ddp's all-reduce of the first layer's attention block, a
    third of a layer, and the embedding's stay exposed whatever the engine does."""
    lines = text.splitlines()
    m = next(filter(None, map(GROUP.match, lines)), None)
    if m is None:
        raise ValueError("no 'plan p=...' line in the schedule")
    f = [int(x) for x in m.groups()]
    p, g, os_, world = f[0] * f[1], f[2] * f[3], f[4] * f[5], f[6] * f[7]
    size = {"P": p, "G": g // p, "OS": os_ // g, "replica": world // os_, "gather": os_ // p, "world": world}
    total = 0.0
    reductions = []  # (unit, part, elements moved) of the last micro-batch
    unit = head = None  # the schedule lists the units in backward order: the head first
    for x in lines:
        if x.startswith("unit "):
            unit = int(x.split()[1].rstrip(":"))
            head = unit if head is None else head
            continue
        st = STAGE.match(x)
        if not st or unit is None:
            continue
        group, op, count, runs = st.group(1), st.group(2), int(st.group(3)), st.group(5)
        n = size[group]
        moved = 2 * (n - 1) / n * count if op == "all_reduce" else (n - 1) * count
        times = micro_batches if runs == "every micro-batch" else 1
        if op == "all_gather" and group == "P":
            times *= 1 if unit == head else 2
        total += moved * times
        if op != "all_gather":
            part = PART.search(x)
            reductions.append((unit, int(part.group(1)) if part else 1, moved))
    last_part = max((k for u, k, _ in reductions if u == 1), default=1)
    tail = sum(moved for u, k, moved in reductions if u == 0 or (u == 1 and k == last_part))
    return 1 - tail / total if total > 0 else float("nan")


def plan_schedule(amsp, args, layout, shard):
    """`amsp plan --schedule` (amsp: the binary) for the run train_args describes, on this layout."""
    cmd = issue_order.schedule_command(amsp, args.model, layout.per_node, layout.nodes, shard, args.grad_accum,
                                       args.batch_size, args.seq_len, getattr(args, "precision", None) or "fp32")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"amsp plan --schedule failed: {p.stderr.strip()[:400]}")
    return p.stdout


def read_metrics(path, warmup):
    rows = [json.loads(line) for line in open(path) if '"step_ms"' in line]
    return [r for r in rows if r["step"] > warmup]


def union_ms(spans, lo, hi):
    """Length of the union of [start, end) spans clipped to [lo, hi), in ms (us in)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total / 1e3


def collective_key(e):
    """(communicator, group, sequence) of a span about a collective, the same on every
    member of its group (src/engine/trace.h); None for other spans and older traces."""
    a = e.get("args") or {}
    if "seq" not in a:
        return None
    track = e["cat"] if e["cat"].startswith("comm") else "comm " + e["name"].split()[-1]
    return track, a["group"], a["seq"]


def joined(events):
    """{collective: (when its last member issued it, that rank)}, in us: it cannot
    complete sooner. (Every rank issues a communicator's collectives in one order, so
    this time only grows along a communicator: a collective queued behind a late one is
    late too.) The ranks' clocks are the trace's, agreed at a barrier: meaningful on one
    host's MPI ranks (on CUDA a span's start is its device start, not its issue)."""
    last = {}
    for e in events:
        k = collective_key(e)
        if k and e["cat"].startswith("comm") and (k not in last or e["ts"] > last[k][0]):
            last[k] = (e["ts"], e["pid"])
    return last


def late_ms(e, by, who=None):
    """How much of span e (ms) fell before its collective could complete (`joined`),
    spent waiting for a rank that had not issued it yet; adds it to who[that rank]. (The
    last rank to issue it never waits for itself: its spans start at its issue.)"""
    k = collective_key(e)
    if k not in by:
        return 0.0
    ms = max(0.0, min(e["ts"] + e["dur"], by[k][0]) - e["ts"]) / 1e3
    if who is not None and ms > 0:
        who[by[k][1]] = who.get(by[k][1], 0.0) + ms
    return ms


def trace_steps(path, first_step, warmup):
    """Per rank, per measured step (> warmup): forward + backward, optimizer, waits,
    comm busy (union of collectives in flight) and in flight (their sum), in ms; and of
    the waits and the time in flight, how much was before the last member of the
    collective issued it (late_wait, late_in_flight: `joined`), with whom that waited
    for (late_for: {rank: ms}). A step's window runs from the end
    of the previous step's optimizer to the end of its own; the trace starts at
    `first_step`, so the first traced step has no window and is never measured
    (warmup >= first_step)."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    by = joined(events)
    per_rank = {}
    for rank in sorted({e["pid"] for e in events}):
        ev = [e for e in events if e["pid"] == rank]
        ends = sorted(e["ts"] + e["dur"] for e in ev if e["name"] == "optimizer")
        steps = []
        for k in range(1, len(ends)):
            if first_step + k <= warmup:
                continue
            lo, hi = ends[k - 1], ends[k]
            inside = [e for e in ev if lo <= e["ts"] < hi]
            # Blocked: waits, and the gradient norm's blocking all-reduce (its own span).
            waits = [e for e in inside if e["cat"] == "wait" or e["name"].startswith("all_reduce (norm)")]
            late_for = {}
            steps.append({
                "compute": sum(e["dur"] for e in inside if e["name"].startswith(("fwd ", "bwd "))) / 1e3,
                "optimizer": sum(e["dur"] for e in inside if e["name"] == "optimizer") / 1e3,
                "wait": sum(e["dur"] for e in waits) / 1e3,
                "busy": union_ms([(e["ts"], e["ts"] + e["dur"]) for e in ev if e["cat"].startswith("comm")],
                                 lo, hi),
                # Summed over collectives, as the metrics' comm_in_flight_ms.
                "in_flight": sum(e["dur"] for e in inside if e["cat"].startswith("comm")) / 1e3,
                "late_wait": sum(late_ms(e, by, late_for) for e in waits),
                "late_in_flight": sum(late_ms(e, by) for e in inside if e["cat"].startswith("comm")),
                "late_for": late_for,
            })
        per_rank[rank] = steps
    return per_rank


def trace_summary(per_rank):
    """Median over the steps of each rank, then the mean over ranks."""
    keys = ("compute", "optimizer", "wait", "busy")
    return {k: mean([median([s[k] for s in steps]) for steps in per_rank.values() if steps]) for k in keys}


def plan_json(args, layout, shard, table, peak_tflops, cluster=None):
    tokens = args.seq_len * args.batch_size * args.grad_accum * layout.world
    cmd = [args.amsp, "plan", "--shard", shard, "--json", "--precision", "fp32",
           "--peak-tflops", repr(peak_tflops), "--achievable", "1", "--model", args.model,
           "--nodes", str(layout.nodes), "--gpus-per-node", str(layout.per_node),
           "--seq-len", str(args.seq_len), "--micro-batch", str(args.batch_size),
           "--global-batch", str(tokens), "--gpu-memory", "64GiB"]
    if cluster:
        cmd += ["--cluster", cluster]
    if table:
        cmd += ["--bandwidth", table]
    cmd += args.plan_arg
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"amsp plan failed (exit {p.returncode}): {p.stderr.strip()[:400]}  [{' '.join(cmd)}]")
    j = json.loads(p.stdout)
    return j["plan"], cmd, j["input"]


# Bytes AdamW and the norm stream per fp32 OS-shard element, as the planner counts them
# (plan::optimizer_seconds): read gradient, master, m, v; write the last three; the
# norm reads the gradient again.
OPTIMIZER_BYTES_FP32 = 32


def write_cluster(args, layout, info, work):
    """This machine as a cluster description for amsp plan: the measured table, the
    measured compute rate, and as effects only what was measured (the memory bandwidth
    the optimizer gets with every rank running it), every other effect 0 (not
    modelled) unless --effects sets it. Without a cluster file amsp plan would take the
    default preset's effects (a800: GPU contention, stragglers, HBM bandwidth)."""
    c = info["calibration"]
    effects = {}
    if c.get("parameters") and c["optimizer_ms_1rank"] > 0:
        effects["memory_bandwidth_GBps"] = (c["parameters"] * OPTIMIZER_BYTES_FP32
                                            / (c["optimizer_ms_1rank"] / 1e3) / 1e9)
        effects["memory_efficiency"] = 1.0
    effects.update(json.loads(args.effects) if args.effects else {})
    table = json.load(open(info["comm_bench"]["table"]))
    cluster = dict(table, cluster=f"{platform.node()}-{layout.name}", gpus_per_node=layout.per_node,
                   gpu_memory="64GiB", peak_tflops_bf16=c["peak_tflops"], peak_tflops_fp32=c["peak_tflops"],
                   achievable_fraction=1.0, effects=effects,
                   description=f"{platform.node()}, {layout.name}, as measured by benchmarks/plan_validation.py")
    path = os.path.join(work, "cluster.json")
    with open(path, "w") as f:
        json.dump(cluster, f, indent=1)
    info["cluster_file"] = path
    info["effects"] = effects
    return path


def predict(args, layout, info, plans, measured, work):
    """Every plan's prediction with the idle table and, if measured, the loaded one."""
    c = info["calibration"]
    table = info["comm_bench"]["table"]
    cluster = write_cluster(args, layout, info, work)
    try:
        plan_json(args, layout, "ddp", table, c["peak_tflops"], cluster)
    except RuntimeError as e:  # a binary that does not read cluster files with effects
        note = f"{layout.name}: amsp plan refused the machine's cluster file, predicting without it: {str(e)[:200]}"
        print("   " + note, flush=True)
        info.setdefault("notes", []).append(note)
        cluster = None
    loaded = info.get("comm_bench_loaded", {}).get("table")
    info["rows"] = []
    for plan in plans:
        row = {"layout": layout.name, "plan": plan, "measured": measured[plan]}
        try:
            pred, cmd, _ = plan_json(args, layout, plan, table, c["peak_tflops"], cluster)
            row["predicted"] = pred
            row["plan_cmd"] = " ".join(cmd)
            if loaded:
                row["predicted_loaded"] = plan_json(args, layout, plan, loaded, c["peak_tflops"], cluster)[0]
        except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            row["predicted"] = {"error": str(e)}
        info["rows"].append(row)


# --- the three measurements -------------------------------------------------------------
def merge_tables(paths, out):
    """One table from several comm-bench runs: per entry (op, shape, size) the median
    time. On a shared machine a single run's entries jump by 2-10x from one size to the
    next; the median of three is what the planner is given."""
    tables = [json.load(open(p)) for p in paths]
    times = {}
    for t in tables:
        for e in t["entries"]:
            times.setdefault((e["op"], e["ranks_per_node"], e["nodes"], e["bytes"]), []).append(e["time_us"])
    merged = {k: v for k, v in tables[0].items() if k != "entries"}
    # The bandwidths are derived from the times when absent (inputs/bandwidth/README.md).
    merged["entries"] = [{"op": op, "ranks_per_node": p0, "nodes": p1, "bytes": size, "time_us": median(ts)}
                         for (op, p0, p1, size), ts in sorted(times.items())]
    with open(out, "w") as f:
        json.dump(merged, f, indent=1)
    return merged


def comm_bench(args, layout, work, loaded=False):
    """The layout's bandwidth table: --bench-runs comm-bench runs, merged entry by entry
    (median). loaded: measured while as many one-rank training processes as the layout
    has ranks keep the cores busy, as the ranks' own compute does in a training run (the
    collectives then get the CPU time compute leaves)."""
    name = "bandwidth-loaded" if loaded else "bandwidth"
    table = os.path.join(work, name + ".json")
    load = []
    secs = 0.0
    try:
        if loaded:
            for i in range(layout.world):
                load.append(subprocess.Popen(
                    train_args(args, "ddp", steps=1000000),
                    env=eq.clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True))
            time.sleep(2)  # past their start-up, into the steps
            if any(p.poll() is not None for p in load):
                raise RuntimeError("the load for the loaded comm-bench did not start")
        parts = []
        for k in range(args.bench_runs):
            part = os.path.join(work, f"{name}-{k}.json")
            cmd = layout.launcher(args) + [args.amsp, "comm-bench", "--output-table", part,
                                           "--max-bytes", args.max_bytes, "--max-seconds", "0.3",
                                           "--cluster", f"{platform.node()}-{layout.name}"]
            _, t = run(cmd, layout.env, "comm-bench", os.path.join(work, f"{name}-{k}.log"))
            secs += t
            parts.append(part)
    finally:
        for p in load:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait()
    merge_tables(parts, table)
    return table, secs, cmd


def calibrate(args, layout, work, tag):
    """`world` concurrent one-rank ddp runs: forward + backward ms, optimizer ms and
    step ms of one rank's step (median over steps, mean over processes)."""
    env = eq.clean_env()
    procs = []
    for i in range(layout.world):
        m, t = (os.path.join(work, f"{tag}-{i}.{x}") for x in ("jsonl", "trace.json"))
        cmd = train_args(args, "ddp", m, t)
        log = open(os.path.join(work, f"{tag}-{i}.log"), "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), m, t, log, cmd))
    t0 = time.time()
    results = []
    try:
        for p, m, t, log, cmd in procs:
            rc = p.wait(timeout=max(1, RUN_TIMEOUT - (time.time() - t0)))
            log.close()
            if rc != 0:
                raise RuntimeError(f"calibration run failed (exit {rc}): {' '.join(cmd)} (log {log.name})")
            # The last 2 steps are left out too: the processes do not end at the same moment.
            tail = args.steps - 2
            steps = [s for s in trace_steps(t, 2, args.warmup)[0]][:max(1, tail - args.warmup)]
            rows = [r for r in read_metrics(m, args.warmup) if r["step"] <= tail] or read_metrics(m, args.warmup)
            results.append({"compute": median([s["compute"] for s in steps]),
                            "optimizer": median([s["optimizer"] for s in steps]),
                            "step": median([r["step_ms"] for r in rows])})
    finally:
        for p, *_ in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return {k: mean([r[k] for r in results]) for k in ("compute", "optimizer", "step")} | {
        "per_process_compute": [round(r["compute"], 2) for r in results], "seconds": time.time() - t0}


def combine(runs):
    """The runs of one plan: the median of each figure over the runs (their mean for
    two), each run's median step time kept to show the spread."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)):
            out[k] = median([r[k] for r in runs])
    out["by_op"] = {op: {x: median([r["by_op"].get(op, {}).get(x, 0.0) for r in runs]) for x in ("exposed", "in_flight")}
                    for op in runs[0]["by_op"]}
    out["step_runs"] = [r["step"] for r in runs]
    out["cmd"] = [r["cmd"] for r in runs]
    return out


def measure(args, layout, plan, work, rnd=0):
    tag = plan.replace(":", "").replace(",", "_").replace("=", "") + f"-{rnd}"
    m, t = (os.path.join(work, f"train-{tag}.{x}") for x in ("jsonl", "trace.json"))
    for path in (m, t):
        if os.path.exists(path):
            os.remove(path)
    cmd = layout.launcher(args) + train_args(args, plan, m, t)
    out, secs = run(cmd, layout.env, f"amsp train --shard {plan}", os.path.join(work, f"train-{tag}.log"))
    rows = read_metrics(m, args.warmup)
    first = out.splitlines()[0] if out else ""
    tr = trace_summary(trace_steps(t, 2, args.warmup))
    by_op = {f"{g} {op}": {"exposed": median([r["comm"].get(g, {}).get(op, {}).get("exposed_ms", 0.0) for r in rows]),
                           "in_flight": median([r["comm"].get(g, {}).get(op, {}).get("in_flight_ms", 0.0) for r in rows])}
             for g in rows[0]["comm"] for op in rows[0]["comm"][g]}
    return {"step": median([r["step_ms"] for r in rows]), "by_op": by_op,
            "step_min": min(r["step_ms"] for r in rows), "step_max": max(r["step_ms"] for r in rows),
            "in_flight": median([r["comm_in_flight_ms"] for r in rows]),
            "exposed": median([r["comm_exposed_ms"] for r in rows]),
            "bytes_sent": rows[-1]["comm_bytes_sent"], "steps": len(rows),
            "factors": first.split()[1] if first.startswith("plan: ") else "",
            "seconds": secs, "cmd": " ".join(cmd), **{"trace_" + k: v for k, v in tr.items()}}


# --- one layout -----------------------------------------------------------------------
def run_layout(args, layout, plans, results):
    work = os.path.join(args.work, layout.name)
    os.makedirs(work, exist_ok=True)
    info = {"layout": layout.name, "load_start": os.getloadavg()[0], "rows": []}
    results["layouts"].append(info)
    print(f"\n== {layout.name}: {layout.world} ranks ({layout.per_node} per node x {layout.nodes} node(s)), "
          f"load average {info['load_start']:.1f}", flush=True)

    table, secs, cmd = comm_bench(args, layout, work)
    info["comm_bench"] = {"table": table, "seconds": secs, "cmd": " ".join(cmd)}
    print(f"   comm-bench: {table} ({secs:.0f} s)", flush=True)
    loaded = None
    if args.loaded_table:
        loaded, secs, _ = comm_bench(args, layout, work, loaded=True)
        info["comm_bench_loaded"] = {"table": loaded, "seconds": secs}
        print(f"   comm-bench beside {layout.world} busy processes: {loaded} ({secs:.0f} s)", flush=True)

    # The planner's FLOPs of one rank's step: its compute time at 1 TFLOP/s.
    one, _, one_input = plan_json(args, Layout("mpi1"), "ddp", None, 1.0)
    flops = one["compute_s"] * 1e12
    before = calibrate(args, layout, work, "calib-before")
    print(f"   compute, {layout.world} concurrent 1-rank runs: fwd+bwd {before['compute']:.1f} ms, "
          f"optimizer {before['optimizer']:.1f} ms, step {before['step']:.1f} ms "
          f"({before['seconds']:.0f} s)", flush=True)

    # Rounds over all plans rather than repeats back to back, so that a burst of
    # load from other work on the machine hits several plans once, not one plan twice.
    runs = {plan: [] for plan in plans}
    errors = {}
    for rnd in range(args.repeats):
        for plan in plans:
            if plan in errors:
                continue
            try:
                r = measure(args, layout, plan, work, rnd)
                runs[plan].append(r)
                print(f"   {plan:22s} {r['factors']:20s} step {r['step']:7.1f} ms (min {r['step_min']:.1f}), "
                      f"exposed {r['exposed']:6.1f} ms, fwd+bwd {r['trace_compute']:6.1f} ms, "
                      f"optimizer {r['trace_optimizer']:6.1f} ms  ({r['seconds']:.0f} s)", flush=True)
            except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                errors[plan] = str(e)
                print(f"   {plan:22s} FAILED: {e}", flush=True)
    # A plan that failed in a later round keeps the runs it completed.
    measured = {plan: combine(runs[plan]) if runs[plan] else {"error": errors[plan]} for plan in plans}

    after = calibrate(args, layout, work, "calib-after")
    compute_ms = (before["compute"] + after["compute"]) / 2
    peak = flops / (compute_ms / 1e3) / 1e12
    info["calibration"] = {"flops_per_rank_step": flops, "before": before, "after": after,
                           "compute_ms": compute_ms, "peak_tflops": peak,
                           "optimizer_ms_1rank": (before["optimizer"] + after["optimizer"]) / 2,
                           "step_ms_1rank": (before["step"] + after["step"]) / 2}
    print(f"   compute, after the plans: fwd+bwd {after['compute']:.1f} ms, optimizer {after['optimizer']:.1f} ms; "
          f"mean {compute_ms:.1f} ms for {flops / 1e6:.1f} MFLOP: {peak * 1e3:.3f} GFLOP/s per rank", flush=True)

    info["calibration"]["parameters"] = one_input["parameters"]
    info["load_end"] = os.getloadavg()[0]
    predict(args, layout, info, plans, measured, work)
    return any("error" not in measured[p] for p in plans)


# --- the table --------------------------------------------------------------------------
KNOWN = {"compute_s", "comm_s", "exposed_comm_s", "step_time_s"}
HEAD = ["layout", "plan", "factors", "pred step", "meas step", "runs", "meas/pred", "pred step (loaded)", "meas/pred",
        "pred comm", "pred comm (loaded)", "in flight", "busy", "pred exp", "pred exp (loaded)", "meas exp"]


def fmt(x, digits=1):
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def ms(pred, key):
    return pred[key] * 1e3 if pred and key in pred else None


def ok_rows(results):
    for info in results["layouts"]:
        for row in info["rows"]:
            yield row, "error" not in row["measured"] and "error" not in row["predicted"]


def table_rows(results):
    rows = []
    for row, ok in ok_rows(results):
        p, m, pl = row["predicted"], row["measured"], row.get("predicted_loaded")
        if not ok:
            rows.append([row["layout"], row["plan"], "failed: " + (m.get("error") or p.get("error"))[:200]]
                        + [""] * (len(HEAD) - 3))
            continue
        extra = {k: v * 1e3 for k, v in p.items() if k.endswith("_s") and k not in KNOWN | {"optimizer_s"}}
        rows.append([row["layout"], row["plan"], p.get("plan", ""), fmt(ms(p, "step_time_s")), fmt(m["step"]),
                     "/".join(f"{x:.0f}" for x in m["step_runs"]), fmt(m["step"] / ms(p, "step_time_s"), 2), fmt(ms(pl, "step_time_s")),
                     fmt(m["step"] / ms(pl, "step_time_s"), 2) if pl else "-",
                     fmt(ms(p, "comm_s")), fmt(ms(pl, "comm_s")), fmt(m["in_flight"]), fmt(m["trace_busy"]),
                     fmt(ms(p, "exposed_comm_s")), fmt(ms(pl, "exposed_comm_s")), fmt(m["exposed"])]
                    + ([", ".join(f"{k} {v:.1f}" for k, v in extra.items())] if extra else []))
    return rows


BUDGET_HEAD = ["layout", "plan", "meas - pred", "pred compute", "fwd+bwd", "d compute", "pred exp", "blocked",
               "d exposed", "pred opt", "optimizer", "d optimizer", "rest", "most exposed op (rank 0)"]


def budget_rows(results):
    """Where the difference between measured and predicted step time goes. The model's
    step is compute + exposed (+ optimizer); the measured one, from the trace of every
    rank, fwd+bwd + blocked + optimizer + rest. The four differences add up to the total."""
    rows = []
    for row, ok in ok_rows(results):
        if not ok:
            continue
        p, m = row["predicted"], row["measured"]
        opt = ms(p, "optimizer_s") or 0.0
        rest = m["step"] - m["trace_compute"] - m["trace_optimizer"] - m["trace_wait"]
        # Whatever else the planner adds to step_time_s (a future term) is taken off the rest.
        other = ms(p, "step_time_s") - ms(p, "compute_s") - ms(p, "exposed_comm_s") - opt
        top = max(m["by_op"].items(), key=lambda kv: kv[1]["exposed"], default=None)
        rows.append([row["layout"], row["plan"], fmt(m["step"] - ms(p, "step_time_s")), fmt(ms(p, "compute_s")),
                     fmt(m["trace_compute"]), fmt(m["trace_compute"] - ms(p, "compute_s")),
                     fmt(ms(p, "exposed_comm_s")), fmt(m["trace_wait"]),
                     fmt(m["trace_wait"] - ms(p, "exposed_comm_s")), fmt(ms(p, "optimizer_s")),
                     fmt(m["trace_optimizer"]), fmt(m["trace_optimizer"] - opt), fmt(rest - other),
                     f"{top[0]} {top[1]['exposed']:.1f}" if top else "-"])
    return rows


def print_table(head, rows, left=3):
    full = [r for r in rows if len(r) > left and r[left]]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *[r + [""] * (len(head) - len(r)) for r in full])]
    print("\n" + "  ".join(h.rjust(w) if i >= left else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths))))
    for r in rows:
        if r not in full:
            print("  ".join(r[:left]))
            continue
        print("  ".join(str(x).rjust(w) if i >= left else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths))))


def md_table(head, rows, left):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * left + "---:|" * (len(head) - left)]
    out += ["| " + " | ".join(str(x) for x in r + [""] * (len(head) - len(r))) + " |" for r in rows]
    return out


def binary_info(path):
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()[:12]
    mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    version = subprocess.run([path, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
    tree = os.path.dirname(os.path.dirname(path))
    git = subprocess.run(["git", "-C", tree, "log", "-1", "--format=%h %s"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--", "src"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True).stdout
    return {"path": path, "sha256": h, "built": mtime.strftime("%Y-%m-%d %H:%M UTC"), "version": version,
            "tree_head": git, "tree_src_modified": ", ".join(l[3:] for l in dirty.splitlines() if l.strip())}


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def markdown(results, rows):
    b, w = results["binary"], results["workload"]
    out = [f"Measured {results['date']} on {results['host']} ({results['cpu']}, {results['cores']} cores), "
           f"`{b['path']}` ({b['version']}, sha256 {b['sha256']}, built {b['built']}; its tree: "
           f"{b['tree_head'] or '?'}{', src modified since: ' + b['tree_src_modified'] if b['tree_src_modified'] else ''}).",
           "",
           f"Workload: `--model {w['model']}`, seq {w['seq_len']}, batch {w['batch_size']}, "
           f"{w['grad_accum']} micro-batch(es), fp32, 1 thread per rank, {w['repeats']} run(s) of "
           f"{w['steps']} steps per plan, the first {w['warmup']} steps left out; medians over the rest. Command: `{results['command']}`", ""]
    if "predicted_by" in results:
        pb = results["predicted_by"]
        out += [f"Predictions made again afterwards (`{results['command_predict']}`) with `{pb['path']}` (sha256 "
                f"{pb['sha256']}, built {pb['built']}), from the same measurements.", ""]
    for info in results["layouts"]:
        c = info.get("calibration")
        if not c:
            continue
        out.append(f"- {info['layout']}: load average {info['load_start']:.1f} at start, {info['load_end']:.1f} at end; "
                   f"compute ({len(c['before']['per_process_compute'])} concurrent 1-rank runs) fwd+bwd "
                   f"{c['before']['compute']:.1f} ms before the plans, {c['after']['compute']:.1f} ms after, "
                   f"for {c['flops_per_rank_step'] / 1e6:.1f} MFLOP: `--peak-tflops {c['peak_tflops']:.6f}` "
                   f"({c['peak_tflops'] * 1e3:.2f} GFLOP/s per rank); optimizer of the whole model on one rank "
                   f"{c['optimizer_ms_1rank']:.1f} ms, whole step {c['step_ms_1rank']:.1f} ms. "
                   f"Effects in the machine's cluster file: "
                   f"{', '.join(f'{k} {v:.3g}' for k, v in info.get('effects', {}).items()) or 'none (no cluster file)'}.")
    head = HEAD + (["other predicted terms"] if any(len(r) > len(HEAD) for r in rows) else [])
    out += [""] + md_table(head, rows, 3)
    out += ["", "Times in ms per step. meas step: the median over the runs of each run's median step (runs: each run's). pred: `amsp plan` with the table measured on idle ranks (step_time_s, "
            "comm_s, exposed_comm_s); (loaded): the same with the table measured beside busy processes. meas step, "
            "in flight, meas exp: the metrics' step_ms, comm_in_flight_ms, comm_exposed_ms (rank 0's collectives, "
            "each from its issue to its completion, so queued collectives overlap). busy: from the trace, the time "
            "at least one collective was in flight (per rank, then the mean over ranks).", "",
            "Where the difference goes (ms per step; d = measured - predicted, with the idle-rank table; the "
            "d terms and rest add up to meas - pred):", ""]
    out += md_table(BUDGET_HEAD, budget_rows(results), 2)
    out += ["", "From the trace, per rank (median over the steps), then the mean over the ranks: fwd+bwd, the "
            "forward and backward spans; blocked, the waits for collectives and the gradient norm's blocking "
            "all-reduce (rank 0's share is meas exp above; ranks block by different amounts); optimizer, the "
            "AdamW span. pred compute, pred exp, pred opt: compute_s, exposed_comm_s, optimizer_s (when amsp plan "
            "reports one). rest: meas step - fwd+bwd - blocked - optimizer (data, the norm's local sum, the loss "
            "all-reduce, issuing collectives, scheduling), less any other term step_time_s holds. most exposed "
            "op: rank 0's group and collective with the largest median exposed time.", ""]
    return "\n".join(out)


def write_outputs(args, results, rows):
    print_table(HEAD + (["other predicted terms"] if any(len(r) > len(HEAD) for r in rows) else []), rows)
    print("\nwhere the difference goes (ms per step, measured - predicted):")
    print_table(BUDGET_HEAD, budget_rows(results), left=2)
    for note in results["notes"]:
        print("note: " + note)
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results, rows) + "\n" + "".join(f"\nNote: {n}\n" for n in results["notes"]))
        print(f"wrote {args.markdown}")


def predict_only(args):
    """Predictions again for runs already measured: a new binary, or other effects."""
    results = json.load(open(os.path.join(args.work, "results.json")))
    results["predicted_by"] = binary_info(args.amsp)
    results["command_predict"] = shlex.join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])
    w = results["workload"]
    args.model, args.seq_len, args.batch_size, args.grad_accum = (w["model"], w["seq_len"], w["batch_size"],
                                                                  w["grad_accum"])
    for info in results["layouts"]:
        if "calibration" not in info:
            continue
        layout = Layout(info["layout"])
        c = info["calibration"]
        if not c.get("parameters"):
            c["parameters"] = plan_json(args, Layout("mpi1"), "ddp", None, 1.0)[2]["parameters"]
        predict(args, layout, info, [r["plan"] for r in info["rows"]], {r["plan"]: r["measured"] for r in info["rows"]},
                os.path.join(args.work, layout.name))
    write_outputs(args, results, table_rows(results))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--amsp", default=os.path.join(REPO, "build", "amsp"))
    ap.add_argument("--data", default="/tmp/corpus.h5", help="a corpus written by amsp data prepare")
    ap.add_argument("--work", default="/tmp/plan-validation")
    ap.add_argument("--layouts", default="mpi4,slurm2x2", help="comma list of mpiR, slurmNxR")
    ap.add_argument("--plans", default="all", help="plans separated by ';' or spaces (plans contain commas), or all: "
                    "the equivalence tests' plans for each layout")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out (>= 2)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each plan, in rounds over the plans")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seq-len", type=int, default=eq.SEQ)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--max-bytes", default="4M", help="comm-bench's largest message")
    ap.add_argument("--bench-runs", type=int, default=3, help="comm-bench runs per table (median per entry)")
    ap.add_argument("--no-loaded-table", dest="loaded_table", action="store_false",
                    help="skip the second comm-bench table, measured beside busy processes")
    ap.add_argument("--effects", help="JSON object merged into the machine's cluster effects, e.g. "
                    "'{\"contention\": 0.5}' (default: only the measured memory bandwidth)")
    ap.add_argument("--predict-only", action="store_true",
                    help="measure nothing: predict again from WORK/results.json (its tables, calibration and "
                    "runs) with --amsp and --effects, and write the tables")
    ap.add_argument("--plan-arg", action="append", default=[],
                    help="extra option for amsp plan, e.g. --plan-arg=--contention=0.3 (repeatable)")
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--cluster-scripts", default=os.path.join(REPO, "slurm", "local-cluster"))
    ap.add_argument("--markdown", help="write the table as Markdown here")
    ap.add_argument("--deadline", type=int, default=1800, help="seconds for the whole run")
    args = ap.parse_args()
    if args.warmup < 2 or args.steps < args.warmup + 3:
        ap.error("--warmup must be >= 2 and --steps >= warmup + 3")
    args.amsp, args.data, args.work = (os.path.abspath(p) for p in (args.amsp, args.data, args.work))
    layouts = [Layout(x) for x in args.layouts.split(",") if x]
    if args.predict_only:
        return predict_only(args)
    os.makedirs(args.work, exist_ok=True)
    # One binary for the whole run, even if the build directory is rebuilt meanwhile.
    binary = binary_info(args.amsp)
    args.amsp = os.path.join(args.work, "amsp")
    shutil.copy2(binary["path"], args.amsp)

    results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "host": platform.node(), "cpu": cpu_name(), "cores": os.cpu_count(),
               "binary": binary, "command": shlex.join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
               "workload": {k: getattr(args, k) for k in ("model", "seq_len", "batch_size", "grad_accum", "steps",
                                                          "warmup", "repeats", "plan_arg")},
               "layouts": [], "notes": []}
    print(f"plan validation: {binary['path']} ({binary['version']}, sha256 {binary['sha256']}, copied to "
          f"{args.amsp}), {results['cpu']}, "
          f"{results['cores']} cores; {args.model}, seq {args.seq_len} x batch {args.batch_size} x "
          f"{args.grad_accum} micro-batch(es) per rank, {args.steps} steps (first {args.warmup} left out)")
    code = 0
    t0 = time.time()
    try:
        with lc.deadline(args.deadline):
            for layout in layouts:
                plans = layout.plans() if args.plans == "all" else [p for p in args.plans.replace(";", " ").split() if p]
                if layout.kind == "mpi":
                    layout.env = eq.clean_env()
                    try:
                        code |= not run_layout(args, layout, plans, results)
                    except RuntimeError as e:
                        note = f"{layout.name}: {e}"
                        print("   " + note, flush=True)
                        results["notes"].append(note)
                        code = 1
                    continue
                why = lc.missing(("srun", "scontrol", "slurmctld", "slurmd", "munged"))
                if why:
                    note = f"{layout.name}: the local Slurm cluster cannot be started here (missing: {why}); skipped"
                    print("   " + note, flush=True)
                    results["notes"].append(note)
                    continue
                try:
                    with lc.local_cluster(args.cluster_scripts,
                                          os.path.join(args.work, layout.name + "-cluster")) as conf:
                        layout.env = lc.clean_env({"SLURM_CONF": conf})
                        code |= not run_layout(args, layout, plans, results)
                except lc.ClusterError as e:
                    note = f"{layout.name}: the local Slurm cluster failed: {str(e)[:300]}; skipped"
                    print("   " + note, flush=True)
                    results["notes"].append(note)
                except RuntimeError as e:
                    note = f"{layout.name}: {e}"
                    print("   " + note, flush=True)
                    results["notes"].append(note)
                    code = 1
    except lc.Interrupted as e:
        print(f"stopped: {e}", flush=True)
        results["notes"].append(f"stopped: {e}")
        code = 1
    results["seconds"] = time.time() - t0
    write_outputs(args, results, table_rows(results))
    print(f"({results['seconds']:.0f} s; figures in {os.path.join(args.work, 'results.json')})")
    return code


if __name__ == "__main__":
    sys.exit(main())
