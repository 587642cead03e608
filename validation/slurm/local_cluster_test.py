#!/usr/bin/env python3
"""The port choice of the local Slurm clusters (local_cluster.cluster_ports), without Slurm:
one directory always starts from the same place, two directories from different ones,
every port chosen is free, a taken port moves the choice on, and the places a failed start
tried are left out. Ends with "N passed, M failed".
"""

import contextlib
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import local_cluster as lc  # noqa: E402


@contextlib.contextmanager
def listening(ports):
    """Something listens on each of `ports` for the duration."""
    socks = []
    try:
        for p in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", p))
            s.listen()
            socks.append(s)
        yield
    finally:
        for s in socks:
            s.close()


def main():
    results = []

    def check(ok, what):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)

    # Fixed paths (they need not exist): which places they hash to never changes.
    a, b = "/work/amsp/build-a/test-work/slurm/cluster", "/work/amsp/build-b/test-work/slurm/cluster"
    ctld, node = lc.cluster_ports(a)
    check(node == ctld + 1 and lc.PORT_RANGE[0] <= ctld and node + 3 < lc.PORT_RANGE[1],
          f"{a}: slurmctld {ctld}, slurmd {node}-{node + 3}, consecutive, in {lc.PORT_RANGE}")
    check(lc.cluster_ports(a) == (ctld, node), "the same directory gets the same ports again")
    check(all(lc.port_free(p) for p in range(ctld, ctld + 5)), "all five are free")
    other = lc.cluster_ports(b)
    check(abs(other[0] - ctld) >= 5, f"another build directory's cluster gets other ports ({other[0]})")
    with listening([node + 2]):
        moved = lc.cluster_ports(a)
        check(moved[0] != ctld and all(lc.port_free(p) for p in range(moved[0], moved[0] + 5)),
              f"with {node + 2} taken the choice moves on, to free ports ({moved[0]})")
    check(lc.cluster_ports(a, skip=[ctld])[0] != ctld, "a place a failed start tried is left out")
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
