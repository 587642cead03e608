#!/usr/bin/env python3
"""ncu_table.py on a raw CSV written as Nsight Compute writes one (a header of the
launch's fields and the metrics, a row of units, a row per launch), worked by hand:
launches of one function summed whatever their template arguments, percentages
weighted by time, the units row and a launch without figures left out, library
kernel names kept, a missing metric named."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncu_table  # noqa: E402

FIELDS = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC"]
METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "gpu__time_duration.sum", "launch__registers_per_thread",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active"]
SWIGLU = ("void amsp::kernels::cuda::(anonymous namespace)::swiglu_forward_kernel<amsp::kernels::cuda::"
          "Sized<{p}, __nv_bfloat16>>(const T1::Type *, const T1::Type *, long, T1::Type *, long, long)")


def row(i, name, read, write, dram, ns, regs, sm, warps):
    return [str(i), "4242", "amsp", "127.0.0.1", name, "1", "7", "(256, 1, 1)", "(3, 4096, 1)", "0", "9.0",
            f"{read:,}", f"{write:,}", str(dram), str(ns), str(regs), str(sm), str(warps)]


def csv_text(rows, fields=FIELDS + METRICS):
    quote = lambda r: ",".join(f'"{x}"' for x in r)
    units = [""] * len(FIELDS) + ["byte", "byte", "%", "ns", "register/thread", "%", "%"]
    return "==PROF== Disconnected\n" + "\n".join([quote(fields), quote(units[:len(fields)])] + [quote(r) for r in rows])


failures = []


def expect(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL " + what)


def near(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


rows = ncu_table.kernel_rows(csv_text([
    row(0, SWIGLU.format(p=8), 100_000_000, 50_000_000, 80.0, 100_000, 32, 20.0, 90.0),
    row(1, "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", 10_000_000, 5_000_000, 10.0, 300_000, 168, 70.0, 12.0),
    row(2, SWIGLU.format(p=1), 60_000_000, 30_000_000, 40.0, 300_000, 40, 10.0, 50.0),
    ["3", "4242", "amsp", "127.0.0.1", "void late_kernel(int)", "1", "7", "(1, 1, 1)", "(1, 1, 1)", "0", "9.0",
     "", "", "", "n/a", "", "", ""],
]))
names = [r["name"] for r in rows]
expect(names == ["nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "swiglu_forward_kernel"] or
       names == ["swiglu_forward_kernel", "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT"],
       f"one row per function, the launch without figures left out: {names}")
sw = next((r for r in rows if r["name"] == "swiglu_forward_kernel"), {})
expect(sw.get("calls") == 2 and near(sw.get("ms", 0), 0.4), f"swiglu: 2 calls, 0.4 ms: {sw}")
expect(near(sw.get("mean_us", 0), 200.0), f"swiglu: mean 200 us: {sw}")
expect(near(sw.get("gb_per_s", 0), 240e6 / 400_000), f"swiglu: 240 MB over 400 us is 600 GB/s: {sw}")
expect(near(sw.get("dram_pct", 0), (80 * 1 + 40 * 3) / 4), f"swiglu: DRAM % weighted by time, 50: {sw}")
expect(near(sw.get("sm_pct", 0), (20 * 1 + 10 * 3) / 4) and near(sw.get("warps_pct", 0), (90 + 50 * 3) / 4),
       f"swiglu: SM and warps weighted by time: {sw}")
expect(sw.get("registers") == 40, f"swiglu: the most registers of its launches, 40: {sw}")
expect(rows and rows[0]["ms"] >= rows[-1]["ms"], "the longest first")
lines = ncu_table.table(rows)
expect(len(lines) == 2 + len(rows) and "| swiglu_forward_kernel | 2 | 0.40 | 200.0 | 600 | 50 |" in "\n".join(lines),
       "the table's swiglu line:\n" + "\n".join(lines))
expect(ncu_table.short_name("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_nn_"
                            "align8>(T1::Params)") == "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_nn_align8",
       "CUTLASS's Kernel2 named by its template argument")
expect(ncu_table.kernel_rows("no report here\n") == [], "no header: no rows")
try:
    ncu_table.kernel_rows(csv_text([], fields=FIELDS + METRICS[:3]))
    expect(False, "a CSV without the time column must be refused")
except ValueError as e:
    expect("gpu__time_duration.sum" in str(e), f"the missing metric named: {e}")

# The full set's CSV: one row per launch (not summed), the stall reasons largest first,
# the busiest tensor pipe, shared memory static and dynamic together, bank conflicts of
# loads and stores together where the report lacks their total, "selected" (the
# issue itself) not a stall, and a figure the report lacks shown as "?".
DEEP = ["gpu__time_duration.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
        "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
        "smsp__average_warp_latency_per_inst_issued.ratio",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_barrier_per_warp_active.pct",
        "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"]
FORWARD = ("void amsp::kernels::cuda::(anonymous namespace)::attention_forward_bf16_kernel<amsp::kernels::cuda::"
           "Sized<64, __nv_bfloat16>>(const T1::Type *, float *, amsp::kernels::cuda::Shape)")


def deep_row(i, name, figures):
    return [str(i), "4242", "amsp", "127.0.0.1", name, "1", "7", "(128, 1, 1)", "(64, 32, 1)", "0", "9.0"] + figures


deep = ncu_table.deep_rows(csv_text([
    deep_row(0, FORWARD, ["570,000", "41.5", "22.0", "0", "48.0", "128", "36,864", "0", "9.6", "2.5", "0.4", "1.1",
                          "3.0", "0.2", "88", "1.0", "1,200", "34"]),
    deep_row(1, "void k2(int)", ["10,000", "5", "", "", "90", "32", "0", "1,024", "", "", "", "", "", "", "", "",
                                 "", ""]),
], fields=FIELDS + DEEP))
expect(len(deep) == 2 and deep[0]["name"] == "attention_forward_bf16_kernel" and near(deep[0]["us"], 570.0),
       f"one row per launch, in order, time in us: {deep}")
f = deep[0] if deep else {}
expect(near(f.get("issue_pct", 0), 41.5) and near(f.get("tensor_pct", 0), 22.0) and near(f.get("warps_pct", 0), 48.0),
       f"issue, the busiest tensor pipe, warps: {f}")
expect(near(f.get("shared_kib", 0), 36.0) and near(f.get("cycles_per_issue", 0), 9.6) and f.get("registers") == 128,
       f"shared memory in KiB, cycles per issue, registers: {f}")
expect(near(f.get("bank_conflicts", 0), 1234.0), f"bank conflicts of loads and stores together, 1234: {f}")
expect(f.get("stalls") == [("short_scoreboard", 3.0), ("barrier", 2.5), ("math_pipe_throttle", 1.1),
                           ("long_scoreboard", 0.4)], f"the four largest stalls per issue, largest first: {f}")
k2 = deep[1] if len(deep) > 1 else {}
expect(k2.get("tensor_pct") is None and k2.get("stalls") == [] and near(k2.get("shared_kib", 0), 1.0),
       f"figures a launch lacks are None: {k2}")
dt = "\n".join(ncu_table.deep_table(deep))
expect("| attention_forward_bf16_kernel | 570.0 | 42 | 22 | 48 | 128 | 36.0 | 1234 | 9.6 | short_scoreboard 3.0, barrier "
       "2.5, math_pipe_throttle 1.1, long_scoreboard 0.4 |" in dt and "| k2 | 10.0 | 5 | ? |" in dt,
       "the deep table's lines:\n" + dt)

print("ncu_table: " + ("FAILED" if failures else "ok"))
sys.exit(1 if failures else 0)
