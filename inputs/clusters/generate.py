#!/usr/bin/env python3
"""Writes the cluster presets a800.json and h100.json: MODELLED bandwidth tables.

Each file is a bandwidth table in the format `amsp comm-bench --output-table` writes
(inputs/bandwidth/README.md) plus the cluster fields the planner needs (gpus_per_node,
gpu_memory, peak_tflops_bf16, peak_tflops_fp32, achievable_fraction).

These tables are not measurements. They come from an alpha-beta model of each
collective, with link figures from vendor datasheets, so that `amsp plan` can run on a
laptop before any job is submitted. Replace them with a measured `amsp comm-bench` table
(`amsp plan --bandwidth FILE`) as soon as you have one: NCCL switches algorithms (ring,
tree, NVLS) with size and scale, which no alpha-beta model captures (AMSP paper, sec. 5).

Model, per op, group shape p0 ranks per node x p1 nodes (n = p0 * p1), message of S
bytes (nccl-tests' size column), busbw factor f (all-reduce 2(n-1)/n, all-gather and
reduce-scatter (n-1)/n, broadcast 1):

    t(S) = alpha + S * f / beta          busbw(S) = S * f / t(S)

beta (asymptotic bus bandwidth, bytes/s):
  inside a node (p1 = 1):  NVLink bus bandwidth, the same for every p0 (NVSwitch gives
                           each GPU its own links, so concurrent groups do not share).
  across nodes (p1 > 1):   the node's network bandwidth x efficiency x p0 / R, capped by
                           NVLink. A ring that leaves a node crosses its NICs once per
                           direction; the engine runs the R / p0 groups of one kind at the
                           same time, so each gets p0 / R of the node's NICs.
alpha (latency):
  inside a node:           10 us + 1 us per extra rank
  ring ops across nodes:   20 us + 4 us per extra node (all-gather, reduce-scatter, broadcast)
  all-reduce across nodes: 20 us + 8 us per doubling of nodes (NCCL's tree at small sizes)

Run: python3 inputs/clusters/generate.py   (rewrites both files next to this script)
"""
import json
import math
import os

SIZES = [1024 * 4**i for i in range(12)]  # 1 KiB .. 4 GiB
INTRA_P0 = [2, 4, 8]
INTER_P0 = [1, 2, 4, 8]
INTER_P1 = [2, 4, 8, 16, 32, 64, 128, 256, 512]
OPS = ["all_gather", "reduce_scatter", "all_reduce", "broadcast"]

CLUSTERS = {
    "a800": {
        "description": "8x A800-80GB SXM per node, NVLink (400 GB/s bidirectional per GPU), "
                       "4x HDR 200 Gb/s InfiniBand per node (100 GB/s), no SHARP: the AMSP "
                       "paper's testbed",
        "gpus_per_node": 8,
        "gpu_memory": "80GiB",
        "peak_tflops_bf16": 312.0,   # A100/A800 SXM dense bf16 tensor core
        "peak_tflops_fp32": 19.5,    # non-tensor-core fp32
        "achievable_fraction": 0.55,  # matmul-heavy LLaMA layers with FlashAttention-2
        "nvlink_busbw": 160e9,        # 200 GB/s per direction x 0.8
        "node_network": 100e9,        # 4 x 200 Gb/s
        "network_efficiency": 0.85,
    },
    "h100": {
        "description": "8x H100-80GB SXM per node, NVLink 4 (900 GB/s bidirectional per GPU), "
                       "8x NDR 400 Gb/s InfiniBand per node (400 GB/s)",
        "gpus_per_node": 8,
        "gpu_memory": "80GiB",
        "peak_tflops_bf16": 989.0,   # H100 SXM dense bf16
        "peak_tflops_fp32": 67.0,
        "achievable_fraction": 0.5,
        "nvlink_busbw": 360e9,        # 450 GB/s per direction x 0.8
        "node_network": 400e9,        # 8 x 400 Gb/s
        "network_efficiency": 0.85,
    },
}


def factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def beta(c, p0, p1):
    if p1 == 1:
        return c["nvlink_busbw"]
    net = c["node_network"] * c["network_efficiency"] * p0 / c["gpus_per_node"]
    return min(c["nvlink_busbw"], net)


def alpha(op, p0, p1):
    if p1 == 1:
        return 10e-6 + 1e-6 * (p0 - 1)
    if op == "all_reduce":
        return 20e-6 + 8e-6 * math.log2(p1)
    return 20e-6 + 4e-6 * (p1 - 1)


def rows(c):
    shapes = [(p0, 1) for p0 in INTRA_P0] + [(p0, p1) for p1 in INTER_P1 for p0 in INTER_P0]
    for op in OPS:
        for p0, p1 in shapes:
            n = p0 * p1
            f = factor(op, n)
            for s in SIZES:
                t = alpha(op, p0, p1) + s * f / beta(c, p0, p1)
                yield {"op": op, "ranks_per_node": p0, "nodes": p1, "bytes": s,
                       "time_us": float(f"{t * 1e6:.6g}"),
                       "algbw_GBps": float(f"{s / t / 1e9:.6g}"),
                       "busbw_GBps": float(f"{s * f / t / 1e9:.6g}")}


def write(name, c):
    header = {
        "format": "amsp-bandwidth-table",  # what `amsp comm-bench --output-table` writes
        "version": 1,
        "cluster": name,
        "backend": "modelled",
        "dtype": "bfloat16",
        "modelled": True,
        "note": "MODELLED, NOT MEASURED: an alpha-beta model from datasheet link speeds "
                "(inputs/clusters/generate.py). Measure your cluster with `amsp comm-bench` "
                "and pass the table with --bandwidth.",
        "description": c["description"],
        "gpus_per_node": c["gpus_per_node"],
        "gpu_memory": c["gpu_memory"],
        "peak_tflops_bf16": c["peak_tflops_bf16"],
        "peak_tflops_fp32": c["peak_tflops_fp32"],
        "achievable_fraction": c["achievable_fraction"],
        "model": {k: c[k] for k in ("nvlink_busbw", "node_network", "network_efficiency")},
    }
    text = json.dumps(header, indent=2)[:-2] + ',\n  "entries": [\n'
    text += ",\n".join("    " + json.dumps(r) for r in rows(c))
    text += "\n  ]\n}\n"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".json")
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    for name, c in CLUSTERS.items():
        write(name, c)
