#!/usr/bin/env python3
"""Tests of slurm/scaling_report.py on synthetic scaling studies (no Slurm, no amsp).

usage: scaling_report_test.py

Builds study directories (jobs.tsv, run directories with metrics.jsonl, attempt-*.json,
exit-code, logs/<job>.out) in a temporary directory, runs the report on them as a
subprocess and checks its outputs against values worked out from the synthetic numbers.
Prints PASS/FAIL per check and "N passed, M failed"; exits 1 if any check failed.
"""

import csv
import json
import os
import struct
import subprocess
import sys
import tempfile

SCRIPT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "..", "..", "slurm", "scaling_report.py"))
TASKS_PER_NODE = 2
# Parallel efficiency per node count, so the expected figures differ between runs.
EFFICIENCY = {1: 1.0, 2: 0.9, 4: 0.8}
PLANS = {"zero3": "zero3", "auto": "mics:2"}  # requested -> what the attempt record says


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def job_id(plan, nodes):
    return str((100 if plan == "zero3" else 200) + nodes)


def step_record(step, tokens_per_s, mfu, step_ms, exposed_ms, state_bytes, val_loss=None):
    r = {"step": step, "loss": 3.0 - 0.01 * step, "lr": 1e-3, "grad_norm": 1.0,
         "step_ms": step_ms, "tokens_per_s": tokens_per_s, "mfu": mfu, "tokens": 256 * step,
         "model_state_bytes": state_bytes, "comm": {"dp": {"all_gather": {"calls": 3}}},
         "comm_bytes_sent": 1000, "comm_in_flight_ms": exposed_ms * 2, "comm_exposed_ms": exposed_ms}
    if val_loss is not None:
        r["val_loss"] = val_loss
    return json.dumps(r)


def make_ok_run(run_dir, plan, nodes):
    """A completed run whose medians over steps 3..6 are known (see expected_row)."""
    world = nodes * TASKS_PER_NODE
    eff = EFFICIENCY[nodes]
    base = 1000.0 * world * eff
    state = 48e6 / world if plan == "zero3" else 48e6 / 2
    lines = [json.dumps({"step": 0, "val_loss": 3.5})]  # no "loss": not a step record
    # Steps 1 and 2 are warm-up: far off, so the medians change if they are not skipped.
    lines += [step_record(s, 10.0, 0.01, 5000.0, 4000.0, state) for s in (1, 2)]
    measured = {3: 1.0, 4: 1.2, 5: 0.8, 6: 1.1}
    mfus = {3: 0.30, 4: 0.32, 5: 0.28, 6: 0.31}
    step_ms = {3: 100.0, 4: 110.0, 5: 90.0, 6: 105.0}
    exposed = {3: 10.0, 4: 20.0, 5: 5.0, 6: 15.0}

    def real(s, val=None):
        return step_record(s, base * measured[s], mfus[s] * eff, step_ms[s] / eff,
                           exposed[s] * nodes, state, val)

    lines.append(real(3))
    # Step 4 twice (a resumed attempt redoes it): the first record must lose.
    lines.append(step_record(4, 1e9, 0.99, 1.0, 0.0, state))
    lines.append(real(5))  # out of order on purpose
    lines.append(real(4))
    lines.append(real(6, val=2.9))
    write(os.path.join(run_dir, "metrics.jsonl"), "\n".join(lines) + "\n")

    job = job_id(plan, nodes)
    common = {"amsp_version": "0.1.0", "started_at": "2024-01-01T00:00:00Z",
              "world_size": world, "num_nodes": nodes, "ranks_per_node": TASKS_PER_NODE,
              "topology": {}, "plan_reason": "test", "model": {"name": "tiny"},
              "parameters": 1000000, "tokens_per_step": 256 * world,
              "model_state_bytes": 1}  # metrics.jsonl's value wins
    # Older attempts: by string order attempt-9.0 would sort last, by number 12.10 does.
    stale = dict(common, slurm=None, plan="stale", result=None)
    write(os.path.join(run_dir, "attempt-9.0.json"), json.dumps(stale))
    write(os.path.join(run_dir, f"attempt-{job}.2.json"), json.dumps(stale))
    last = dict(common, slurm={"job_id": job, "restart_count": 10}, plan=PLANS[plan],
                result={"status": "completed", "last_step": 6, "seconds": 1.0, "val_loss": 2.9,
                        "peak_rss_bytes": int((200 + nodes) * 1e6), "exit_code": 0})
    write(os.path.join(run_dir, f"attempt-{job}.10.json"), json.dumps(last))
    write(os.path.join(run_dir, "exit-code"), "0\n")


def expected_row(plan, nodes):
    world = nodes * TASKS_PER_NODE
    eff = EFFICIENCY[nodes]
    return {"nodes": nodes, "gpus": world, "plan": plan, "resolved_plan": PLANS[plan],
            "tokens_per_s_per_gpu": 1.05 * 1000.0 * eff,       # median of 1.0,1.2,0.8,1.1
            "mfu": 0.305 * eff,
            "exposed_comm_share": 50.0 * nodes / (405.0 / eff),  # sums over steps 3..6
            "model_state_mb": (48.0 / world if plan == "zero3" else 24.0),
            "peak_rss_mb": 200.0 + nodes, "step_ms": 102.5 / eff, "status": "ok"}


def make_study(root, runs, failed=()):
    """runs: (plan, nodes) in jobs.tsv order; failed: those to set up as failed runs."""
    study = tempfile.mkdtemp(dir=root)
    rows = ["job_id\tnodes\ttasks_per_node\tplan\trun_dir"]
    for i, (plan, nodes) in enumerate(runs):
        name = f"runs/{plan}-{nodes}"
        run_dir = os.path.join(study, name)
        # Relative and absolute run directories both occur.
        rows.append(f"{job_id(plan, nodes)}\t{nodes}\t{TASKS_PER_NODE}\t{plan}\t{name if i % 2 else run_dir}")
        os.makedirs(run_dir)
        if (plan, nodes) not in failed:
            make_ok_run(run_dir, plan, nodes)
    write(os.path.join(study, "jobs.tsv"), "\n".join(rows) + "\n")
    return study


def run_report(study, *args):
    return subprocess.run([sys.executable, SCRIPT, study, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)


def read_csv(study):
    with open(os.path.join(study, "scaling.csv"), newline="") as f:
        return list(csv.DictReader(f))


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n", "scaling.png does not start with the PNG signature")
    check(head[12:16] == b"IHDR", "scaling.png: no IHDR chunk first")
    return struct.unpack(">II", head[16:24])


# A mixed order in jobs.tsv: the report sorts by first appearance of the plan, then nodes.
ALL_RUNS = [("zero3", 4), ("auto", 1), ("zero3", 1), ("auto", 4), ("zero3", 2), ("auto", 2)]
EXPECTED_ORDER = [("zero3", 1), ("zero3", 2), ("zero3", 4), ("auto", 1), ("auto", 2), ("auto", 4)]
TOLERANCE = {"tokens_per_s_per_gpu": 0.051, "mfu": 0.00006, "exposed_comm_share": 0.00006,
             "model_state_mb": 0.051, "peak_rss_mb": 0.051, "step_ms": 0.051}


def test_two_plans(root):
    study = make_study(root, ALL_RUNS)
    p = run_report(study)
    check(p.returncode == 0, f"exit {p.returncode}, expected 0; stderr: {p.stderr}")
    rows = read_csv(study)
    with open(os.path.join(study, "scaling.csv")) as f:
        header = f.readline().strip()
    check(header == "nodes,gpus,plan,resolved_plan,tokens_per_s_per_gpu,mfu,exposed_comm_share,"
          "model_state_mb,peak_rss_mb,step_ms,status,run_dir", f"csv header {header!r}")
    check([(r["plan"], int(r["nodes"])) for r in rows] == EXPECTED_ORDER,
          f"row order {[(r['plan'], r['nodes']) for r in rows]}, expected {EXPECTED_ORDER}")
    for row, (plan, nodes) in zip(rows, EXPECTED_ORDER):
        for key, want in expected_row(plan, nodes).items():
            got = row[key]
            if key in TOLERANCE:
                check(got != "" and abs(float(got) - want) <= TOLERANCE[key],
                      f"{plan} x {nodes} nodes: {key} = {got!r}, expected {want:.6g}")
            else:
                check(got == str(want), f"{plan} x {nodes} nodes: {key} = {got!r}, expected {want!r}")
    with open(os.path.join(study, "scaling.md")) as f:
        md = f.read()
    check("auto → mics:2" in md, "scaling.md does not show 'auto → mics:2'")
    check("zero3 → " not in md, "scaling.md shows an arrow for zero3, which resolved to itself")
    check("Scaling study: tiny, 256 tokens per step per rank" in md.splitlines()[0],
          f"scaling.md heading {md.splitlines()[0]!r}")
    check(md.count("\n| ") == 1 + len(ALL_RUNS), "scaling.md: not one table line per run plus the header")
    check("| GPUs (ranks) |" in md and "30.5%" in md, "scaling.md: headers or MFU percent missing")
    png = os.path.join(study, "scaling.png")
    check(os.path.isfile(png), "no scaling.png")
    width, height = png_size(png)
    check(abs(width - 1320) <= 20 and abs(height - 540) <= 20, f"scaling.png is {width}x{height}, expected about 1320x540")
    check("scaling.csv" in p.stdout and "scaling.md" in p.stdout and "scaling.png" in p.stdout,
          "stdout does not name the three outputs")
    # --skip 0 takes the warm-up steps in: medians change.
    p = run_report(study, "--skip", "0", "--title", "Custom title")
    check(p.returncode == 0, f"--skip 0: exit {p.returncode}")
    first = read_csv(study)[0]
    check(abs(float(first["tokens_per_s_per_gpu"]) - 0.9 * 1000.0) <= 0.051,
          f"--skip 0: tokens/s per GPU {first['tokens_per_s_per_gpu']}, expected 900.0")
    with open(os.path.join(study, "scaling.md")) as f:
        check("Custom title" in f.readline(), "--title is not the heading of scaling.md")
    return "two plans x 1,2,4 nodes: csv values, md, png"


def test_one_failed(root):
    study = make_study(root, ALL_RUNS, failed={("zero3", 2)})
    run_dir = os.path.join(study, "runs", "zero3-2")
    write(os.path.join(run_dir, "exit-code"), "2\n")
    job = job_id("zero3", 2)
    write(os.path.join(study, "logs", f"{job}.out"),
          "train.sbatch: job 102 attempt 0: 2 node(s) x 2 rank(s), plan zero3, run directory x\n"
          "amsp: error: --shard zero3: needs 4 ranks, got 3\n"
          "train.sbatch: amsp failed with exit code 2 (see the lines above)\n")
    p = run_report(study)
    check(p.returncode == 0, f"exit {p.returncode}, expected 0; stderr: {p.stderr}")
    rows = {(r["plan"], int(r["nodes"])): r for r in read_csv(study)}
    bad = rows[("zero3", 2)]
    check(bad["status"].startswith("failed"), f"status {bad['status']!r}")
    check("amsp: error: --shard zero3: needs 4 ranks, got 3" in bad["status"], f"status {bad['status']!r} lacks the error")
    check("exit 2" in bad["status"], f"status {bad['status']!r} lacks the exit code")
    check(all(bad[k] == "" for k in TOLERANCE), f"failed run has numbers: {bad}")
    check(all(r["status"] == "ok" for k, r in rows.items() if k != ("zero3", 2)), "other runs are not ok")
    check(os.path.isfile(os.path.join(study, "scaling.png")), "no scaling.png")
    return "one failed run: its reason in the table, the others ok"


def test_all_failed(root):
    study = make_study(root, [("zero3", 1), ("zero3", 2), ("auto", 1)],
                       failed={("zero3", 1), ("zero3", 2), ("auto", 1)})
    # zero3 x 1: never submitted; zero3 x 2: amsp started but never wrote a result;
    # auto x 1: the job script failed before amsp ran.
    with open(os.path.join(study, "jobs.tsv")) as f:
        text = f.read().replace(job_id("zero3", 1) + "\t", "-\t")
    write(os.path.join(study, "jobs.tsv"), text)
    write(os.path.join(study, "runs", "zero3-2", "attempt-102.0.json"),
          json.dumps({"world_size": 4, "plan": "zero3", "result": None}))
    write(os.path.join(study, "runs", "auto-1", "exit-code"), "2\n")
    p = run_report(study)
    check(p.returncode == 1, f"exit {p.returncode}, expected 1; stderr: {p.stderr}")
    check(os.path.isfile(os.path.join(study, "scaling.csv")), "no scaling.csv")
    check(os.path.isfile(os.path.join(study, "scaling.md")), "no scaling.md")
    check(not os.path.exists(os.path.join(study, "scaling.png")), "scaling.png written")
    check(p.stderr.strip() != "", "no warning on stderr")
    status = {(r["plan"], int(r["nodes"])): r["status"] for r in read_csv(study)}
    check(status[("zero3", 1)].startswith("failed") and "not submitted" in status[("zero3", 1)], f"{status}")
    check(status[("zero3", 2)] == "failed: still running", f"{status}")
    check(status[("auto", 1)] == "failed: exit 2", f"{status}")
    return "all runs failed: exit 1, csv and md, no png"


def test_bad_input(root):
    study = tempfile.mkdtemp(dir=root)
    p = run_report(study)
    check(p.returncode == 2, f"missing jobs.tsv: exit {p.returncode}, expected 2")
    lines = p.stderr.splitlines()
    check(len(lines) == 1 and lines[0].startswith("scaling_report.py:"), f"missing jobs.tsv: stderr {p.stderr!r}")
    write(os.path.join(study, "jobs.tsv"), "job nodes plan\n")
    p = run_report(study)
    check(p.returncode == 2 and len(p.stderr.splitlines()) == 1 and p.stderr.startswith("scaling_report.py:"),
          f"bad header: exit {p.returncode}, stderr {p.stderr!r}")
    write(os.path.join(study, "jobs.tsv"), "job_id\tnodes\ttasks_per_node\tplan\trun_dir\n1\t2\tzero3\n")
    p = run_report(study)
    check(p.returncode == 2 and "line 2" in p.stderr, f"short line: exit {p.returncode}, stderr {p.stderr!r}")
    return "missing or malformed jobs.tsv: exit 2, one line on stderr"


def main():
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="scaling-report-test-") as root:
        for test in (test_two_plans, test_one_failed, test_all_failed, test_bad_input):
            try:
                print(f"PASS: {test(root)}", flush=True)
                passed += 1
            except Failure as e:
                print(f"FAIL: {test.__name__}: {e}", flush=True)
                failed += 1
            except Exception as e:  # a crash in one check should not hide the others
                print(f"FAIL: {test.__name__}: {type(e).__name__}: {e}", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
