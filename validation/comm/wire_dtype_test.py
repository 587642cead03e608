#!/usr/bin/env python3
"""What the communicators hand to MPI, per dtype, against their own accounting.

The accounting (comm::Stats) comes from comm::traffic_bytes; the bf16 sums do not map
onto MPI's reductions (an all-to-all of bf16 blocks, summed in fp32 by amsp, plus an
all-gather for an all-reduce). amsp's all-to-all, in any dtype, is one MPI all-to-all
whose count is the block for each rank; the ring model counts n-1 of them, the rank's
own block not being sent. This runs `amsp_comm_collectives_test --wire DIR` under
the PMPI counter of the engine tests (validation/engine/mpi_count.c, LD_PRELOAD): one
group per (dtype, op), each op issued with counts 0, 1, 7, 1001 and 4099. For every rank
and group it checks
  - which MPI collectives carried the op, with the dtype's element size (fp32 and
    int32: 4 bytes, bf16: 2), one MPI call per amsp call and stage;
  - the per-rank bytes of those calls under the ring model (validation/engine/
    wire_test.py: ring_bytes) equal the bytes amsp accounted, sent and received; for a
    broadcast, the count times the element size equals sent + received (the root sends
    the buffer, the others receive it).

usage: wire_dtype_test.py --test PATH --preload libamsp_mpi_count.so --mpiexec PATH
                          -n RANKS --work DIR
Ends with "N passed, M failed"; exit 1 on any failure.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
from wire_test import ring_bytes  # noqa: E402  (the ring model, written once)

ELEM_BYTES = {"fp32": 4, "bf16": 2, "int32": 4}
# The MPI collectives each (dtype, op) must use: bf16 sums exchange their blocks with an
# all-to-all and sum them in amsp; a bf16 all-reduce then all-gathers the summed blocks.
MPI_OPS = {
    ("bf16", "reduce_scatter"): {"all_to_all"},
    ("bf16", "all_reduce"): {"all_to_all", "all_gather"},
}
CALLS = 5  # counts 0, 1, 7, 1001, 4099


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--test", required=True)
    ap.add_argument("--preload", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    # AMSP_COMM_CHECK=0: the mismatch check's 16-byte all-reduce per op is not data
    # movement, and the ring model here is the data's (doc/communication.md).
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.preload), AMSP_MPI_COUNT_DIR=args.work,
               AMSP_COMM_CHECK="0")
    cmd = [args.mpiexec, "-n", str(args.n), os.path.abspath(args.test), "--wire", args.work]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if p.returncode != 0:
        print(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
        print("0 passed, 1 failed")
        return 1

    passed = failed = 0
    for rank in range(args.n):
        with open(os.path.join(args.work, f"rank-{rank}.json")) as f:
            counted = json.load(f)
        with open(os.path.join(args.work, f"amsp-rank-{rank}.json")) as f:
            mine = json.load(f)
        for group, acc in sorted(mine.items()):
            _, dtype, op = group.split(".")
            n = acc["size"]
            calls, sent, received = acc[op][dtype]
            mpi = {k: v for k, v in counted.get(group, {}).items() if k != "size"}
            want_ops = MPI_OPS.get((dtype, op), {op})
            problems = []
            if set(mpi) != want_ops:
                problems.append(f"MPI collectives {sorted(mpi)}, expected {sorted(want_ops)}")
            if calls != CALLS:
                problems.append(f"amsp counted {calls} calls, issued {CALLS}")
            wire = 0
            for mop, c in mpi.items():
                if c["calls"] != CALLS:
                    problems.append(f"{c['calls']} MPI {mop} calls for {CALLS} ops")
                if c["elements"] and c["bytes"] != c["elements"] * ELEM_BYTES[dtype]:
                    problems.append(f"MPI {mop}: {c['bytes']} bytes for {c['elements']} elements, "
                                    f"expected {ELEM_BYTES[dtype]}-byte elements")
                if mop == "broadcast":
                    wire += c["bytes"]
                else:
                    wire += ring_bytes(mop, n, c["elements"], c["blocks"], ELEM_BYTES[dtype])
            if op == "broadcast":
                if wire != sent + received:
                    problems.append(f"MPI broadcast of {wire} bytes, amsp accounted {sent} sent + {received} received")
            elif not (wire == sent == received):
                problems.append(f"{wire} bytes per rank on the wire (ring model), amsp accounted {sent} sent, "
                                f"{received} received")
            ok = not problems
            passed += ok
            failed += not ok
            if rank == 0 or not ok:
                print(f"{'ok  ' if ok else 'FAIL'} rank {rank} {group:28s} {n} ranks: {sent:>8} bytes sent, "
                      f"{wire:>8} on the wire via {'+'.join(sorted(mpi))}")
                for p_ in problems:
                    print(f"     | {p_}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
