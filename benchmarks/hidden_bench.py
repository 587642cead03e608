#!/usr/bin/env python3
"""How much communication the engine hides, before and after, side by side.

For each layout (mpi4: `mpiexec -n 4`; slurm2x2: 2 nodes x 2 ranks on the local Slurm
cluster, which the script starts and always stops) and each plan of the engine's
equivalence set for that layout, runs the same training job with two binaries in
alternation, --repeats times each: --before (e.g. the previous engine, built from an
older commit) and --after (today's); without --before, --after alone. From rank 0's metrics, steps after --warmup: step
time, communication in flight per step, exposed communication (time compute waited), and
the share hidden, 1 - exposed / in flight; the medians are printed per plan and binary.
The last run of the last binary per plan is also traced, and a second line gives every
rank's compute, blocked time, time in flight and share hidden, and the share on the rank
that computed longest: the one the others wait for at the reductions. Each rank's share
is also given net of the time it waited for a collective that another member had not
yet issued (a late rank, not the schedule), with whom the ranks waited for. Beside them,
"at most": the share the plan's schedule lets compute hide at all (plan_validation's
schedule_bound, a model): what the first decoder layer issues after its backward's last
part and the embedding's reductions, on the last micro-batch, have only the embedding's
backward beside them.

The default workload is one where backward compute exceeds communication (the small
preset, seq 128, two micro-batches per rank): everything could hide, so what does not is
the engine's schedule. A benchmark, not a test: it never fails on a timing.

Building the previous engine, for example:
  git worktree add /tmp/amsp-before <commit> && cmake -S /tmp/amsp-before -B /tmp/amsp-before/build \\
      -DCMAKE_BUILD_TYPE=Release -DAMSP_TESTS=OFF -DAMSP_BENCHMARKS=OFF && make -C /tmp/amsp-before/build amsp

usage: benchmarks/hidden_bench.py [--before PATH] [--after build/amsp] [--data CORPUS.h5]
           [--layouts mpi4,slurm2x2] [--plans all|"P1;P2"] [--model small] [--seq-len 128]
           [--grad-accum 2] [--steps 8] [--warmup 2] [--repeats 2] [--device cpu|cuda] [--work DIR]
           [--json FILE]
"""

import argparse
import json
import os
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import plan_validation as pv  # noqa: E402  (layouts, launching, metrics, the local cluster)


FIELDS = ("step_ms", "comm_in_flight_ms", "comm_exposed_ms")


def measure(args, layout, binary, plan, work, tag, trace=None):
    """Step time, comm in flight and exposed per step (ms), rank 0, steps after the warm-up;
    with `trace`, the run also writes its --trace there."""
    metrics = os.path.join(work, f"{tag}.jsonl")
    run_args = argparse.Namespace(**{**vars(args), "amsp": binary})
    cmd = layout.launcher(args) + pv.train_args(run_args, plan, metrics=metrics, trace=trace)
    pv.run(cmd, layout.env, f"{tag} ({plan})", os.path.join(work, f"{tag}.log"))
    rows = pv.read_metrics(metrics, args.warmup)
    return [[r[f] for r in rows] for f in FIELDS]


def hidden(wait, in_flight):
    return 1 - wait / in_flight if in_flight > 0 else float("nan")


def ranks_line(trace, warmup):
    """Every rank's view of one run, from its trace (medians over the measured steps, ms):
    forward + backward compute, time blocked, collectives in flight (summed, as the
    metrics' comm_in_flight_ms), and the share hidden on each rank. A collective
    completes when its last rank joins, so a rank whose compute runs late shows on the
    others as waiting. So each rank's share is also given net of that (the trace's
    `late_wait` and `late_in_flight`, plan_validation.joined): hidden once every member
    had issued the collective, what the engine's schedule left exposed when nobody was
    late; and whom the ranks waited for, in ms per step. Returns the lines, the share on
    the rank that computed longest and the least net share over the ranks (None, None
    without traced steps)."""
    if not trace or not os.path.exists(trace):
        return "no trace", None, None
    per_rank = pv.trace_steps(trace, 2, warmup)
    keys = ("compute", "wait", "in_flight", "late_wait", "late_in_flight")
    med = {r: {k: pv.median([s[k] for s in steps]) for k in keys} for r, steps in per_rank.items() if steps}
    if not med:
        return "no traced steps", None, None
    share = {r: hidden(m["wait"], m["in_flight"]) for r, m in med.items()}
    # Each step's own net share, then their median: a step waits on time no longer than
    # its collectives are in flight on time, but the medians of the four parts taken
    # apart need not keep that (a rank mostly waiting for late ones read -3%).
    on_time = {r: pv.median([hidden(s["wait"] - s["late_wait"], s["in_flight"] - s["late_in_flight"])
                             for s in per_rank[r] if s["in_flight"] > s["late_in_flight"]]) for r in med}
    late_for = {}
    for steps in per_rank.values():
        for s in steps:
            for who, ms in s["late_for"].items():
                late_for[who] = late_for.get(who, 0.0) + ms / len(steps)
    slow = max(med, key=lambda r: med[r]["compute"])
    cells = ", ".join(f"{r}: {m['compute']:.0f}/{m['wait']:.0f}/{m['in_flight']:.0f} ({100 * share[r]:.0f}%; "
                      f"{100 * on_time[r]:.0f}% net of {m['late_wait']:.0f} ms waiting for late ranks)"
                      for r, m in sorted(med.items()))
    waited = ", ".join(f"rank {r} {ms:.1f}" for r, ms in sorted(late_for.items(), key=lambda x: -x[1])) or "nobody"
    least = min(on_time.values())
    return (f"ranks' compute/blocked/in flight ms (hidden): {cells}; the slowest, rank {slow}, "
            f"computes {med[slow]['compute'] - min(m['compute'] for m in med.values()):.0f} ms more "
            f"than the fastest and hides {100 * share[slow]:.1f}%; net of late ranks, at least {100 * least:.1f}% "
            f"hidden on every rank; the ranks waited for (ms per step, summed over waiters): {waited}"), \
        share[slow], least


def run_layout(args, layout, plans):
    work = os.path.join(args.work, layout.name)
    os.makedirs(work, exist_ok=True)
    sides = [s for s in ("before", "after") if getattr(args, s)]
    print(f"\n{layout.name}: {layout.world} ranks; per step, ms (medians); hidden = 1 - exposed / comm; "
          "at most: the share the schedule lets compute hide (plan_validation.schedule_bound, a model)")
    head = f"{'step':>6s} {'comm':>7s} {'exposed':>8s} {'hidden':>7s}"
    print(f"{'plan':22s} | " + " | ".join(head for _ in sides) + " | at most")
    print(f"{'':22s} | " + " | ".join(f"{'--- ' + side + ' ---':>31s}" for side in sides))
    rows = []
    for i, plan in enumerate(plans):
        got = {side: ([], [], []) for side in sides}
        # The last run of this engine is also traced, for every rank's share.
        traced = (sides[-1], args.repeats - 1)
        trace = os.path.join(work, f"{i}-{traced[0]}-{traced[1]}.trace.json")
        for r in range(args.repeats):
            for side in sides:
                run_trace = trace if (side, r) == traced else None
                for acc, values in zip(got[side], measure(args, layout, getattr(args, side), plan, work,
                                                          f"{i}-{side}-{r}", run_trace)):
                    acc.extend(values)
        line, slowest, on_time = ranks_line(trace, args.warmup)
        bound = pv.schedule_bound(pv.plan_schedule(args.after, args, layout, plan), args.grad_accum)
        cells = []
        for side in sides:
            step, comm, exposed = (statistics.median(x) for x in got[side])
            share = hidden(exposed, comm)
            cells.append(f"{step:6.0f} {comm:7.1f} {exposed:8.1f} {100 * share:6.1f}%")
            rows.append((layout.name, plan, side, step, comm, exposed, share,
                         *((slowest, on_time) if side == sides[-1] else (None, None)), bound))
        print(f"{plan:22s} | " + " | ".join(cells) + f" | {100 * bound:6.1f}%", flush=True)
        print(f"{'':22s}   {sides[-1]}, last run: {line}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="the amsp binary to compare against (none: --after alone)")
    ap.add_argument("--after", default=os.path.join(REPO, "build", "amsp"))
    ap.add_argument("--data", default=os.path.join(REPO, "build", "test-work", "corpus.h5"))
    ap.add_argument("--work", default="/tmp/hidden-bench")
    ap.add_argument("--layouts", default="mpi4,slurm2x2")
    ap.add_argument("--plans", default="all", help="plans separated by ';', or all: the equivalence set's")
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--cluster-scripts", default=os.path.join(REPO, "slurm", "local-cluster"))
    ap.add_argument("--deadline", type=int, default=3600, help="seconds for the whole run")
    ap.add_argument("--device", help="amsp's --device (default: amsp's own, cuda where it has a GPU)")
    ap.add_argument("--json", help="also write the rows here: layout, plan, side, step, comm, exposed, hidden, "
                    "the share hidden on the rank that computed longest and the least share over the ranks "
                    "net of waiting for late ranks (its last run, traced), and the schedule's bound")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    # Copies, so that a rebuild meanwhile changes nothing; a script (the GPU bundle's
    # bin/amsp, which finds its libraries from where it lies) runs where it is.
    for side in [s for s in ("before", "after") if getattr(args, s)]:
        info = pv.binary_info(os.path.abspath(getattr(args, side)))
        with open(info["path"], "rb") as f:
            script = f.read(2) == b"#!"
        if not script:
            copy = os.path.join(args.work, f"amsp-{side}")
            shutil.copy2(info["path"], copy)
            setattr(args, side, copy)
        print(f"{side}: {info['path']} ({info['tree_head'] or info['version']}, sha256 {info['sha256']})")
    print(f"{args.model}, seq {args.seq_len} x batch {args.batch_size} x {args.grad_accum} micro-batches per "
          f"rank, {args.steps} steps (first {args.warmup} left out), {args.repeats} runs per binary and plan, "
          f"{pv.cpu_name()}, load {os.getloadavg()[0]:.1f} at start")
    code, rows = 0, []
    with pv.lc.deadline(args.deadline):
        for name in args.layouts.split(","):
            layout = pv.Layout(name)
            plans = layout.plans() if args.plans == "all" else [p for p in args.plans.split(";") if p]
            if layout.kind == "mpi":
                layout.env = pv.eq.clean_env()
                rows += run_layout(args, layout, plans)
                continue
            why = pv.lc.missing(("srun", "scontrol", "slurmctld", "slurmd", "munged"))
            if why:
                print(f"\n{name}: the local Slurm cluster cannot be started here (missing: {why}); skipped")
                code = 1
                continue
            with pv.lc.local_cluster(args.cluster_scripts, os.path.join(args.work, name + "-cluster")) as conf:
                layout.env = pv.lc.clean_env({"SLURM_CONF": conf})
                rows += run_layout(args, layout, plans)
    if args.json:
        keys = ("layout", "plan", "side", "step_ms", "comm_ms", "exposed_ms", "hidden", "slowest_rank_hidden",
                "hidden_net_of_late_ranks", "schedule_bound")
        with open(args.json, "w") as f:
            json.dump([dict(zip(keys, r)) for r in rows], f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
