#!/usr/bin/env python3
"""Turns the runs of a scaling study into one table (CSV and markdown) and one plot.

usage: scaling_report.py STUDY_DIR [--skip N] [--title TEXT]

slurm/scaling-study.sh calls this after every Slurm job of the study has ended. It reads
STUDY_DIR/jobs.tsv (a header line, then per submitted run the tab-separated columns
job_id, nodes, tasks_per_node, plan, run_dir; run_dir absolute or relative to STUDY_DIR,
job_id "-" if the submission failed) and, in each run directory, what
slurm/train.sbatch and `amsp train` left there: metrics.jsonl, attempt-<job>.<restart>.json
and exit-code. The error text of a failed run comes from STUDY_DIR/logs/<job_id>.out.

It writes, into STUDY_DIR:
  scaling.csv   one row per run: nodes, gpus (ranks), plan, resolved_plan,
                tokens_per_s_per_gpu, mfu (fraction), exposed_comm_share (fraction),
                model_state_mb (per rank), peak_rss_mb (max over ranks), step_ms, status,
                run_dir; failed runs have empty numbers and status "failed: <reason>"
  scaling.md    the same rows as a markdown table, for a report or a pull request
  scaling.png   tokens/s per GPU and MFU against the number of GPUs, one line per plan

Every figure is a median over the steps after the first N (--skip, default 2), which
are warm-up (first-touch allocation, communicator setup, cold caches).

Exit codes: 0 at least one run is ok; 1 no run is ok (csv and md are still written,
the png is not); 2 bad input (missing STUDY_DIR or jobs.tsv, malformed jobs.tsv) or
matplotlib missing (csv and md are written first).
"""

import argparse
import csv
import json
import os
import re
import statistics
import sys

PROG = "scaling_report.py"
JOBS_COLUMNS = ["job_id", "nodes", "tasks_per_node", "plan", "run_dir"]
CSV_COLUMNS = ["nodes", "gpus", "plan", "resolved_plan", "tokens_per_s_per_gpu", "mfu",
               "exposed_comm_share", "model_state_mb", "peak_rss_mb", "step_ms", "status",
               "run_dir"]


class InputError(Exception):
    """Bad input that ends the report with exit code 2."""


# --- reading ---------------------------------------------------------------------------

def read_jobs(study_dir):
    """The runs listed in STUDY_DIR/jobs.tsv, as dicts with the jobs.tsv columns."""
    path = os.path.join(study_dir, "jobs.tsv")
    if not os.path.isdir(study_dir):
        raise InputError(f"{study_dir}: no such directory; expected the directory of a scaling study")
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file; expected the list of submitted runs "
                         f"(written by slurm/scaling-study.sh)")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    expected = "\t".join(JOBS_COLUMNS)
    if not lines or lines[0].rstrip("\r").split("\t") != JOBS_COLUMNS:
        got = lines[0] if lines else "an empty file"
        raise InputError(f"{path}: header is {got!r}; expected the tab-separated columns {expected!r}")
    jobs = []
    for number, line in enumerate(lines[1:], start=2):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(JOBS_COLUMNS):
            raise InputError(f"{path} line {number}: {len(fields)} tab-separated fields; "
                             f"expected {len(JOBS_COLUMNS)} ({expected!r})")
        job = dict(zip(JOBS_COLUMNS, (x.strip() for x in fields)))
        for key in ("nodes", "tasks_per_node"):
            if not job[key].isdigit() or int(job[key]) < 1:
                raise InputError(f"{path} line {number}: {key} is {job[key]!r}; expected a whole number >= 1")
            job[key] = int(job[key])
        if not job["plan"] or not job["run_dir"]:
            raise InputError(f"{path} line {number}: empty plan or run_dir; expected both")
        jobs.append(job)
    return jobs


def read_steps(run_dir):
    """Step records of metrics.jsonl by step number; a repeated step keeps its last record
    (a resumed attempt redoes the steps after its checkpoint)."""
    steps = {}
    try:
        f = open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8", errors="replace")
    except OSError:
        return steps
    with f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short when the job was killed
            # The step-0 record holds only the initial val_loss.
            if isinstance(record, dict) and "loss" in record and isinstance(record.get("step"), int):
                steps[record["step"]] = record
    return steps


def natural_key(name):
    """attempt-9.0 < attempt-12.1 < attempt-12.10: the numbers compared as integers."""
    return [int(n) for n in re.findall(r"\d+", name)], name


def read_last_attempt(run_dir):
    """The record of the job's last attempt (attempt-<job>.<restart>.json), or None."""
    try:
        names = [n for n in os.listdir(run_dir) if n.startswith("attempt-") and n.endswith(".json")]
    except OSError:
        return None
    if not names:
        return None
    try:
        with open(os.path.join(run_dir, max(names, key=natural_key)), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None  # written only partly: treat like a run without a record
    return record if isinstance(record, dict) else None


def read_exit_code(run_dir):
    """The job script's exit code as text, or None if it never got that far."""
    try:
        with open(os.path.join(run_dir, "exit-code"), encoding="utf-8", errors="replace") as f:
            text = f.read().strip()
    except OSError:
        return None
    return text or None


def error_line(study_dir, job_id):
    """The last error line in the job's Slurm log, or None.

    Error lines (amsp: error: ..., train.sbatch: error: ...) win over the other
    train.sbatch: lines, since the last of those is usually just "amsp failed with exit
    code N (see the lines above)".
    """
    if job_id in ("", "-"):
        return None
    try:
        with open(os.path.join(study_dir, "logs", f"{job_id}.out"), encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f]
    except OSError:
        return None
    errors = [l for l in lines if l.startswith(("amsp: error:", "train.sbatch: error:"))]
    others = [l for l in lines if l.startswith("train.sbatch:")]
    found = (errors or others or [None])[-1]
    if found and len(found) > 200:
        found = found[:197] + "..."
    return found


# --- computing -------------------------------------------------------------------------

def median_of(records, key):
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def failure_reason(job, run_dir, attempt, steps, study_dir):
    """A short reason why a run is not ok."""
    result = attempt.get("result") if attempt else None
    code = read_exit_code(run_dir)
    parts = []
    if job["job_id"] == "-":
        parts.append("not submitted")
    if code is not None:
        parts.append(f"exit {code}")
    if isinstance(result, dict):
        if result.get("status") == "stopped":
            parts.append(f"stopped after step {result.get('last_step', '?')} (not resumed)")
        elif result.get("status") == "completed" and not steps:
            parts.append("no step records in metrics.jsonl")
        elif result.get("status") != "completed":
            parts.append(f"result {result.get('status')!r}")
    elif attempt is not None and code is not None:
        parts.append("no result recorded")
    err = error_line(study_dir, job["job_id"])
    if err:
        parts.append(err)
    if not parts:
        # An attempt record without a result and no exit code: amsp was still running
        # (or was killed without the job script getting to write its exit code).
        parts.append("still running" if attempt is not None else "no output")
    return "; ".join(parts)


def summarize(job, study_dir, skip):
    """One row of the report (numbers unrounded, None where unknown)."""
    run_dir = job["run_dir"] if os.path.isabs(job["run_dir"]) else os.path.join(study_dir, job["run_dir"])
    found = read_last_attempt(run_dir)
    attempt = found or {}
    steps = read_steps(run_dir)
    result = attempt.get("result") if isinstance(attempt.get("result"), dict) else {}
    model = attempt.get("model") if isinstance(attempt.get("model"), dict) else {}
    world = attempt.get("world_size")
    if not isinstance(world, int) or world < 1:
        world = job["nodes"] * job["tasks_per_node"]
    row = {"nodes": job["nodes"], "gpus": world, "plan": job["plan"],
           "resolved_plan": str(attempt.get("plan") or ""), "run_dir": job["run_dir"],
           "tokens_per_s_per_gpu": None, "mfu": None, "exposed_comm_share": None,
           "model_state_mb": None, "peak_rss_mb": None, "step_ms": None,
           "model": attempt.get("model_name") or model.get("name"),
           "tokens_per_step": attempt.get("tokens_per_step")}
    if result.get("status") != "completed" or not steps:
        row["status"] = "failed: " + failure_reason(job, run_dir, found, steps, study_dir)
        return row
    row["status"] = "ok"
    ordered = [steps[s] for s in sorted(steps)]
    measured = ordered[skip:] or ordered[-1:]
    tokens_per_s = median_of(measured, "tokens_per_s")
    if tokens_per_s is not None:
        row["tokens_per_s_per_gpu"] = tokens_per_s / world
    row["mfu"] = median_of(measured, "mfu")
    row["step_ms"] = median_of(measured, "step_ms")
    # A share of the summed times, not a median of per-step shares: long steps weigh more,
    # as they do in the wall-clock time of the run.
    timed = [r for r in measured
             if isinstance(r.get("comm_exposed_ms"), (int, float)) and isinstance(r.get("step_ms"), (int, float))]
    total_ms = sum(r["step_ms"] for r in timed)
    if total_ms > 0:
        row["exposed_comm_share"] = sum(r["comm_exposed_ms"] for r in timed) / total_ms
    state = measured[-1].get("model_state_bytes")
    if not isinstance(state, (int, float)):
        state = attempt.get("model_state_bytes")
    if isinstance(state, (int, float)):
        row["model_state_mb"] = state / 1e6
    if isinstance(result.get("peak_rss_bytes"), (int, float)):
        row["peak_rss_mb"] = result["peak_rss_bytes"] / 1e6
    return row


def sort_rows(rows, jobs):
    """By plan, in the order the plans first appear in jobs.tsv, then by nodes."""
    plan_order = {}
    for job in jobs:
        plan_order.setdefault(job["plan"], len(plan_order))
    return sorted(rows, key=lambda r: (plan_order[r["plan"]], r["nodes"], r["gpus"]))


def default_title(rows, study_dir):
    for row in rows:
        if row["status"] == "ok" and row["model"] and isinstance(row["tokens_per_step"], (int, float)):
            per_rank = row["tokens_per_step"] / row["gpus"]
            return f"Scaling study: {row['model']}, {per_rank:g} tokens per step per rank"
    return f"Scaling study: {os.path.basename(os.path.abspath(study_dir))}"


# --- writing ---------------------------------------------------------------------------

def fmt(value, digits, scale=1.0, suffix=""):
    return "" if value is None else f"{value * scale:.{digits}f}{suffix}"


def write_csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(CSV_COLUMNS)
        for r in rows:
            out.writerow([r["nodes"], r["gpus"], r["plan"], r["resolved_plan"],
                          fmt(r["tokens_per_s_per_gpu"], 1), fmt(r["mfu"], 4),
                          fmt(r["exposed_comm_share"], 4), fmt(r["model_state_mb"], 1),
                          fmt(r["peak_rss_mb"], 1), fmt(r["step_ms"], 1), r["status"], r["run_dir"]])


def plan_text(row):
    """The plan as asked for, and what `auto` (or another spelling) became."""
    if row["resolved_plan"] and row["resolved_plan"] != row["plan"]:
        return f"{row['plan']} → {row['resolved_plan']}"
    return row["plan"]


def markdown(rows, title, skip):
    def cell(text):
        return str(text).replace("|", "\\|") or "–"

    lines = [f"## {title}", "",
             "| nodes | GPUs (ranks) | plan | tokens/s per GPU | MFU | exposed comm "
             "| model states (MB/rank) | peak RSS (MB, max rank) | step (ms) | status |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cells = [r["nodes"], r["gpus"], plan_text(r), fmt(r["tokens_per_s_per_gpu"], 1),
                 fmt(r["mfu"], 1, 100, "%"), fmt(r["exposed_comm_share"], 1, 100, "%"),
                 fmt(r["model_state_mb"], 1), fmt(r["peak_rss_mb"], 1), fmt(r["step_ms"], 1),
                 r["status"]]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    lines += ["", f"Medians over the steps after the first {skip} (warm-up); tokens/s per GPU = "
              f"tokens/s of the job / ranks; exposed comm = time ranks waited for communication "
              f"/ step time."]
    return "\n".join(lines) + "\n"


def plot(path, rows, title):
    """Writes the two-panel figure; raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")  # no display on a login or batch node
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    ok = [r for r in rows if r["status"] == "ok"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120)
    gpu_counts = sorted({r["gpus"] for r in ok})
    plans = list(dict.fromkeys(r["plan"] for r in ok))  # first-seen order, as in the table
    for plan in plans:
        runs = sorted((r for r in ok if r["plan"] == plan), key=lambda r: r["gpus"])
        resolved = {r["resolved_plan"] for r in runs}
        label = plan
        if len(resolved) == 1 and "" not in resolved and plan not in resolved:
            label = f"{plan} ({resolved.pop()})"
        for ax, key, scale in ((left, "tokens_per_s_per_gpu", 1.0), (right, "mfu", 100.0)):
            points = [(r["gpus"], r[key] * scale) for r in runs if r[key] is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    for ax, name in ((left, "tokens/s per GPU"), (right, "MFU (%)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(gpu_counts))
        ax.xaxis.set_minor_locator(NullLocator())  # only the counts that were run
        ax.set_xticklabels([str(n) for n in gpu_counts])
        if len(gpu_counts) > 1:
            ax.set_xlim(gpu_counts[0] / 1.25, gpu_counts[-1] * 1.25)
        ax.set_xlabel("GPUs (ranks)")
        ax.set_title(name)
        # From zero, so flat and falling curves look like what they are; room above the top.
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.grid(True, alpha=0.4)
        ax.legend(title="plan", fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)  # not bbox_inches="tight": keep the size at 11x4.5 in, 120 dpi
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(prog=PROG, description="Table and plot of a scaling study.")
    parser.add_argument("study_dir", metavar="STUDY_DIR")
    parser.add_argument("--skip", type=int, default=2, metavar="N",
                        help="steps to leave out at the start (warm-up; default 2)")
    parser.add_argument("--title", help="heading of the table and plot "
                        "(default: model and tokens per step per rank of the first ok run)")
    args = parser.parse_args()
    if args.skip < 0:
        parser.error("--skip must be >= 0")

    study_dir = args.study_dir
    try:
        jobs = read_jobs(study_dir)
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    rows = sort_rows([summarize(job, study_dir, args.skip) for job in jobs], jobs)
    title = args.title or default_title(rows, study_dir)

    csv_path = os.path.join(study_dir, "scaling.csv")
    md_path = os.path.join(study_dir, "scaling.md")
    png_path = os.path.join(study_dir, "scaling.png")
    write_csv(csv_path, rows)
    table = markdown(rows, title, args.skip)
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(table)
    print(table)
    print(f"csv:      {csv_path}")
    print(f"markdown: {md_path}")

    if not any(r["status"] == "ok" for r in rows):
        # A plot from an earlier report would show runs that this one calls failed.
        if os.path.exists(png_path):
            os.remove(png_path)
        print(f"{PROG}: warning: no run of {study_dir} is ok; wrote no plot", file=sys.stderr)
        return 1
    try:
        plot(png_path, rows, title)
    except ImportError:
        if os.path.exists(png_path):
            os.remove(png_path)
        # Name the interpreter: with pyenv or a venv, "python3" may not be the system one.
        print(f"{PROG}: matplotlib is missing for {sys.executable}, wrote no plot: install "
              f"python3-matplotlib (apt-get install python3-matplotlib) or run the system "
              f"python3", file=sys.stderr)
        return 2
    print(f"plot:     {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
