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
alpha (latency), after NCCL's own tuning model: a ring over n ranks on p1 nodes runs
n - 1 steps (all-reduce 2(n - 1)), p1 - 1 of them (2(p1 - 1)) across the network, and
every step pays one hop's latency. Two protocols, NCCL taking the faster for each size:
  LL:     3.6 us + 0.47 us per NVLink step + 5 us per network step, half the bandwidth
          (8-byte lines carrying 4 bytes of data)
  Simple: 8.4 us + 3.4 us per NVLink step + 14 us per network step, full bandwidth
All-reduce across nodes may instead take NCCL's tree: 2 x ((p0 - 1) NVLink steps +
log2(p1) network steps), the same bandwidth; the faster of ring and tree is used.
At 1024 ranks (8 x 128) a Simple ring all-gather pays 8.4 + 896 x 3.4 + 127 x 14 us =
4.8 ms of latency: many small collectives at scale are latency-bound, which is what
makes bucket sizes matter.

effects (read by `amsp plan`; doc/planner.md, "What the model adds"):
  contention         compute runs 1/(1 + c) as fast while a collective runs beside it
  jitter_1024        the slowest of 1024 ranks reaches a collective this fraction late
  nodes_per_switch, oversubscription   the leaf-spine fabric
  memory_bandwidth_GBps, memory_efficiency   HBM, for the optimizer step

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
        # The paper's cleanest compute measurement: ZeRO-1 on LLaMA-7B, 8 GPUs, 4M
        # tokens = 128 micro-batches per step, whose once-a-step communication is
        # under 1% of the step: 63% MFU. The matmuls reach that fraction of peak.
        "achievable_fraction": 0.64,
        "nvlink_busbw": 160e9,        # 200 GB/s per direction x 0.8
        "node_network": 100e9,        # 4 x 200 Gb/s
        "network_efficiency": 0.85,
        "effects": {
            "contention": 0.15,           # NCCL's kernels take SMs and HBM beside the GEMMs
            "jitter_1024": 0.03,          # a few percent late per collective at 1024 GPUs
            "nodes_per_switch": 16,       # 40-port HDR leaf: 16 nodes down, the rest up
            "oversubscription": 1.0,      # non-blocking spine (rail-optimised fabrics are)
            "memory_bandwidth_GBps": 2039,  # A800-80GB HBM2e
            "memory_efficiency": 0.8,     # a streaming multi-tensor kernel
        },
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
        "effects": {
            "contention": 0.15,
            "jitter_1024": 0.03,
            "nodes_per_switch": 32,       # 64-port NDR leaf: 32 nodes down, 32 up
            "oversubscription": 1.0,
            "memory_bandwidth_GBps": 3350,  # H100 SXM HBM3
            "memory_efficiency": 0.8,
        },
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


PROTOCOLS = {  # base, per NVLink step, per network step (seconds), bandwidth efficiency
    "LL": (3.6e-6, 0.47e-6, 5.0e-6, 0.5),
    "Simple": (8.4e-6, 3.4e-6, 14.0e-6, 1.0),
}


def latency(op, p0, p1, proto):
    base, nvlink, net, _ = PROTOCOLS[proto]
    n = p0 * p1
    rounds = 2 if op == "all_reduce" else 1
    ring = base + rounds * ((n - p1) * nvlink + (p1 - 1) * net)
    if op == "all_reduce" and p1 > 1:
        tree = base + 2 * ((p0 - 1) * nvlink + math.log2(p1) * net)
        return min(ring, tree)
    return ring


def time(c, op, p0, p1, size):
    f = factor(op, p0 * p1)
    return min(latency(op, p0, p1, proto) + size * f / (beta(c, p0, p1) * eff)
               for proto, (_, _, _, eff) in PROTOCOLS.items())


def rows(c):
    shapes = [(p0, 1) for p0 in INTRA_P0] + [(p0, p1) for p1 in INTER_P1 for p0 in INTER_P0]
    for op in OPS:
        for p0, p1 in shapes:
            n = p0 * p1
            f = factor(op, n)
            for s in SIZES:
                t = time(c, op, p0, p1, s)
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
        "effects": c["effects"],
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
