"""Nsight Compute's raw CSV of one training step, as a table per kernel.

`ncu --import REPORT --csv --page raw --print-units base` writes a header row of
column names (the launch's fields, then one column per metric), a row of units, and a
row per kernel launch. kernel_rows() reads it into one row per kernel (launches of the
same function summed, whatever their template arguments and grid), with the time,
the DRAM traffic and the throughputs that say how far each is from the machine's
ceilings: the check's part "counters" (validation/gpu/check.py) prints them.
"""

import csv
import re

# What the check asks ncu for (9 passes of each launch on an H200).
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread")


def short_name(name):
    """A kernel's function name without its return type, namespaces, template
    arguments and parameters: 'void a::(anonymous namespace)::k<S<8, bf16>>(const
    float *, int)' -> 'k'. Library kernels named by their template (CUTLASS's
    'Kernel2<cutlass_80_...>') keep its first argument; names without any (cuBLASLt's
    'nvjet_...') stay whole."""
    plain = name.replace("(anonymous namespace)", "anonymous")
    depth, out, first_arg = 0, [], []
    for ch in plain:
        if ch == "(" and depth == 0:
            break
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
        elif depth == 1 and not (first_arg and first_arg[-1] is None):
            first_arg.append(None if ch == "," else ch)
    base = "".join(out).strip().split(" ")[-1].split("::")[-1]
    arg = "".join(c for c in first_arg if c).strip()
    if base in ("Kernel", "Kernel2", "device_kernel") and arg:
        return arg.split("::")[-1]
    return base or name


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def kernel_rows(csv_text):
    """Rows per kernel function, the longest first: name, calls, ms (summed), mean_us,
    gb_per_s (DRAM bytes read and written over the time), dram_pct, sm_pct and
    warps_pct (each launch's percentage weighted by its time), registers (the most)."""
    rows = list(csv.reader(line for line in csv_text.splitlines() if line.strip()))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        return []
    col = {name: i for i, name in enumerate(rows[head])}
    missing = [m for m in ("Kernel Name",) + METRICS if m not in col]
    if missing:
        raise ValueError("ncu's CSV has no column " + ", ".join(missing))
    by_name = {}
    for r in rows[head + 1:]:
        t = number(r[col["gpu__time_duration.sum"]]) if len(r) == len(rows[head]) else None
        if t is None:  # the units row, or a launch without figures
            continue
        k = by_name.setdefault(short_name(r[col["Kernel Name"]]),
                               {"calls": 0, "ns": 0.0, "bytes": 0.0, "dram": 0.0, "sm": 0.0, "warps": 0.0,
                                "registers": 0})
        k["calls"] += 1
        k["ns"] += t
        k["bytes"] += sum(number(r[col[m]]) or 0.0 for m in ("dram__bytes_read.sum", "dram__bytes_write.sum"))
        for key, metric in (("dram", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                            ("sm", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                            ("warps", "sm__warps_active.avg.pct_of_peak_sustained_active")):
            k[key] += t * (number(r[col[metric]]) or 0.0)
        k["registers"] = max(k["registers"], int(number(r[col["launch__registers_per_thread"]]) or 0))
    out = []
    for name, k in by_name.items():
        ns = k["ns"] or 1.0
        out.append({"name": name, "calls": k["calls"], "ms": k["ns"] / 1e6, "mean_us": k["ns"] / k["calls"] / 1e3,
                    "gb_per_s": k["bytes"] / ns, "dram_pct": k["dram"] / ns, "sm_pct": k["sm"] / ns,
                    "warps_pct": k["warps"] / ns, "registers": k["registers"]})
    return sorted(out, key=lambda r: -r["ms"])


def table(rows, limit=25):
    """Markdown lines for the largest `limit` kernels."""
    lines = ["| kernel | launches | ms | mean us | DRAM GB/s | DRAM % of peak | SM % of peak | warps active % | "
             "registers |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows[:limit]:
        name = r["name"] if len(r["name"]) <= 60 else r["name"][:57] + "..."
        lines.append(f"| {name} | {r['calls']} | {r['ms']:.2f} | {r['mean_us']:.1f} | {r['gb_per_s']:.0f} | "
                     f"{r['dram_pct']:.0f} | {r['sm_pct']:.0f} | {r['warps_pct']:.0f} | {r['registers']} |")
    return lines



# ---- one launch of each attention kernel with ncu's full set ----------------------------------
# The step's table says how long attention takes and how far it is from DRAM's and the
# SMs' peaks; it cannot say why a tensor-core kernel runs at a tenth of its pipe. The full
# set (every section, the warp states and the per-instruction samples included) says that:
# whether the warps issue every cycle, how busy the tensor pipe is, how many warps are
# resident, and what the warps wait for when they do not issue. The check keeps the whole
# CSV for reading later; deep_rows picks these.

ATTENTION_FILTER = ("--kernel-name", "regex:attention_(forward|dq|dkv)", "--filter-mode", "per-launch-config",
                    "--launch-count", "1", "--set", "full")

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def first_column(col, *patterns):
    """The first column whose name matches one of the regular expressions, in order."""
    for p in patterns:
        for name in col:
            if re.fullmatch(p, name):
                return name
    return None


def deep_columns(col):
    """The columns deep_rows reads, by what they measure: single columns (None where the
    report lacks one) and the lists it sums or takes the largest of."""
    one = lambda *patterns: first_column(col, *patterns)  # noqa: E731
    pick = {"us": one(r"gpu__time_duration\.sum"),
            "issue_pct": one(r"smsp__issue_active\.avg\.pct_of_peak_sustained_active",
                             r"sm__inst_issued\.avg\.pct_of_peak_sustained_active"),
            "warps_pct": one(r"sm__warps_active\.avg\.pct_of_peak_sustained_active"),
            "registers": one(r"launch__registers_per_thread"),
            "cycles_per_issue": one(r"smsp__average_warp_latency_per_inst_issued\.ratio")}
    # Bank conflicts: the shared-memory total where the report has it, else its loads' and stores'.
    total = one(r"l1tex__data_bank_conflicts_pipe_lsu_mem_shared\.sum")
    pick["conflicts"] = [total] if total else [n for n in (
        one(r"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld\.sum"),
        one(r"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st\.sum")) if n]
    pick["tensor"] = [n for n in col if "pipe_tensor" in n and n.endswith("pct_of_peak_sustained_active")]
    pick["shared"] = [n for n in col if n in ("launch__shared_mem_per_block_static",
                                              "launch__shared_mem_per_block_dynamic")]
    # "selected" is the cycle a warp issues (1 per issue by definition), not a stall.
    pick["stalls"] = {m.group(1): n for n in col for m in [STALL.match(n)] if m and m.group(1) != "selected"}
    return pick


def deep_rows(csv_text, stalls=4):
    """One row per profiled launch, in the report's order: name, us, issue_pct (issue
    slots busy), tensor_pct (the busiest tensor pipe, of its peak while active), warps_pct
    (achieved occupancy), registers, shared_kib (static and dynamic shared memory a
    block), bank_conflicts (shared-memory loads and stores), cycles_per_issue (a warp's
    cycles between two of its instructions) and stalls: the `stalls` largest reasons a
    warp did not issue, in cycles per issued instruction, largest first. A figure the
    report lacks is None."""
    rows = list(csv.reader(line for line in csv_text.splitlines() if line.strip()))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        return []
    col = {name: i for i, name in enumerate(rows[head])}
    c = deep_columns(col)
    out = []
    for r in rows[head + 1:]:
        if len(r) != len(rows[head]):
            continue
        value = lambda name: number(r[col[name]]) if name else None  # noqa: E731
        total = lambda names: sum(value(n) or 0 for n in names) if names else None  # noqa: E731
        us = value(c["us"])
        if us is None:  # the units row
            continue
        tensors = [v for v in (value(n) for n in c["tensor"]) if v is not None]
        reasons = sorted(((reason, value(n)) for reason, n in c["stalls"].items() if value(n)), key=lambda x: -x[1])
        shared = total(c["shared"])
        out.append({"name": short_name(r[col["Kernel Name"]]), "us": us / 1e3,
                    "issue_pct": value(c["issue_pct"]), "tensor_pct": max(tensors) if tensors else None,
                    "warps_pct": value(c["warps_pct"]), "registers": value(c["registers"]),
                    "shared_kib": None if shared is None else shared / 1024,
                    "bank_conflicts": total(c["conflicts"]), "cycles_per_issue": value(c["cycles_per_issue"]),
                    "stalls": reasons[:stalls]})
    return out


def deep_table(rows):
    """Markdown lines for deep_rows."""
    show = lambda v, f="{:.0f}": "?" if v is None else f.format(v)  # noqa: E731
    lines = ["| kernel | us | issue slots busy % | tensor pipe % | warps active % | registers | shared KiB | "
             "bank conflicts | cycles per issue | the largest stalls (cycles per issue) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        stalls = ", ".join(f"{reason} {v:.1f}" for reason, v in r["stalls"]) or "?"
        lines.append(f"| {r['name']} | {show(r['us'], '{:.1f}')} | {show(r['issue_pct'])} | {show(r['tensor_pct'])} | "
                     f"{show(r['warps_pct'])} | {show(r['registers'])} | {show(r['shared_kib'], '{:.1f}')} | "
                     f"{show(r['bank_conflicts'])} | {show(r['cycles_per_issue'], '{:.1f}')} | {stalls} |")
    return lines
