#!/usr/bin/env python3
"""System tests of topology discovery on a real (local) Slurm cluster and under mpiexec.

usage: slurm_test.py CASE --probe PATH --work DIR [--cluster-scripts DIR] [--mpiexec PATH]

CASE is one of
  hostlist      amsp_topology_probe --expand agrees with `scontrol show hostnames`
  srun-4x2      srun -N 4 --ntasks-per-node=2: 8 ranks, 2 per node, switches s1/s2
  srun-2nodes   srun -N 2 with 2+2 ranks, 3 ranks ("2,1"), cyclic distribution, and
                --require-equal failing on the unequal layout
  mpiexec-alloc mpiexec inside an allocation (ranks are not Slurm tasks): MPI fallback
  mpiexec       mpiexec -n 4 without Slurm: one node, 4 local ranks
  mesh-groups   srun -N 4 --ntasks-per-node=2: the five groups of several shard plans,
                as communicators, have the members worked out by hand below, and the
                placement line says which cross leaf switches and why

The Slurm cases start slurm/local-cluster/start.sh into a fresh directory under --work, on
ports found free (local_cluster.py), and always stop it again (finally + signal handlers +
an internal deadline below the CTest timeout).  Exit code 77 (CTest SKIP_RETURN_CODE) if
Slurm, munge or root is missing.
"""

import argparse
import json
import os
import socket
import subprocess
import sys

import local_cluster as lc

SKIP = 77
DEADLINE = 100  # seconds for a whole case, below the CTest TIMEOUT


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def clean_env(extra=None):
    """This environment without any Slurm variables (the tests may run inside a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "PMI_", "HYDRA_"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if extra:
        env.update(extra)
    return env


def run(cmd, env, timeout=45, expect_rc=0):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if expect_rc is not None and p.returncode != expect_rc:
        raise Failure(f"{' '.join(cmd)} exited with {p.returncode}, expected {expect_rc}\n"
                      f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def probe_output(stdout):
    """The probe's per-rank records (by rank) and its summary."""
    ranks, summary = {}, None
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        obj = json.loads(line)
        if "summary" in obj:
            summary = obj
        else:
            ranks[obj["rank"]] = obj
    check(summary is not None, f"no summary line in probe output:\n{stdout}")
    return [ranks[r] for r in sorted(ranks)], summary


class Cluster:
    """The cluster a case runs on: the environment whose SLURM_CONF reaches it."""

    def __init__(self, conf):
        self.env = clean_env({"SLURM_CONF": conf})


def case_hostlist(args, cluster):
    same = [
        "n[1-4]", "n[001-003]", "n[08-11]", "n[1-003]", "n[001-3]", "n[01-100]", "n[007]", "n[0-1]",
        "a[1-2,5],b7,c[01-02]x[3-4]", "rack[1-2]-n[1-2]", "n[1-2][3]", "n[1-2]x[5]",
        "r[1-2]c[01-02]n[0-1]", "n[1,3-4,10],m2", "n[1-2],n1", ",n1,,n2,", "a b", "x", "n-1",
        "node[9-11],gpu[0001-0002]", "a[1-2]b[1-2]c[1-2]d[1-2]", "x[1-3]y[0-1]z[7,9],w[5]",
    ]
    for expr in same:
        ours = run([args.probe, "--expand", expr], cluster.env).stdout.split()
        theirs = run(["scontrol", "show", "hostnames", expr], cluster.env).stdout.split()
        check(ours == theirs, f"{expr!r}: amsp expands to {ours}, Slurm to {theirs}")
        print(f"ok {expr!r} -> {len(ours)} names")
    for expr in ["n[3-1]", "n[]", "n[a-b]", "n[1,,2]", "n[-1]", "n[1-2-3]", "n[1-3]]"]:
        theirs = run(["scontrol", "show", "hostnames", expr], cluster.env)
        check("Invalid hostlist" in theirs.stdout + theirs.stderr, f"{expr!r}: Slurm accepted it: {theirs.stdout}")
        ours = run([args.probe, "--expand", expr], cluster.env, expect_rc=2)
        msg = ours.stderr.strip()
        check(ours.stdout == "" and msg.count("\n") == 0 and "bad host list" in msg,
              f"{expr!r}: expected a one-line 'bad host list' error, got {ours.stderr!r}")
        print(f"ok {expr!r} rejected by both: {msg}")


def srun(args, cluster, *opts, expect_rc=0, probe_args=()):
    return run(["srun", "--mpi=pmi2", "--time=2", *opts, args.probe, *probe_args], cluster.env, expect_rc=expect_rc)


def check_ranks(ranks, summary, world, nodes_tasks, switch_of):
    """Common checks: ranks 0..world-1, node/local consistency, positions a permutation."""
    check(len(ranks) == world, f"{len(ranks)} rank records, expected {world}")
    tasks = dict(nodes_tasks)
    for r in ranks:
        check(r["source"] == "slurm", f"rank {r['rank']}: source {r['source']}, expected slurm")
        check(r["world_size"] == world, f"rank {r['rank']}: world_size {r['world_size']}")
        check(r["num_nodes"] == len(tasks), f"rank {r['rank']}: num_nodes {r['num_nodes']}")
        check(r["local_size"] == tasks[r["node_name"]], f"rank {r['rank']}: local_size {r['local_size']} on {r['node_name']}")
        check(r["switch_path"] == switch_of[r["node_name"]], f"rank {r['rank']}: switch path {r['switch_path']}")
        check(r["leaf_switch"] == switch_of[r["node_name"]].split(".")[-1], f"rank {r['rank']}: leaf {r['leaf_switch']}")
    by_node = {}
    for r in ranks:
        by_node.setdefault(r["node_name"], []).append(r["local_rank"])
    check({n: sorted(l) for n, l in by_node.items()} == {n: list(range(c)) for n, c in tasks.items()},
          f"local ranks per node {by_node}, expected {tasks}")
    check(sorted(r["position"] for r in ranks) == list(range(world)), "positions are not a permutation")
    check(summary["ranks_in_order"] == [r["rank"] for r in sorted(ranks, key=lambda r: r["position"])],
          "ranks_in_order disagrees with the positions")


SWITCH = {"n1": "top.s1", "n2": "top.s1", "n3": "top.s2", "n4": "top.s2"}


def case_srun_4x2(args, cluster):
    ranks, summary = probe_output(srun(args, cluster, "-N", "4", "--ntasks-per-node=2").stdout)
    print(summary["summary"])
    check_ranks(ranks, summary, 8, {"n1": 2, "n2": 2, "n3": 2, "n4": 2}, SWITCH)
    for r in ranks:  # block distribution: rank r on node r // 2, node ids in list order
        check(r["node_name"] == f"n{r['rank'] // 2 + 1}" and r["node"] == r["rank"] // 2
              and r["local_rank"] == r["rank"] % 2 and r["position"] == r["rank"], f"rank record {r}")
    check(summary["node_order"] == ["n1", "n2", "n3", "n4"], f"node order {summary['node_order']}")
    check(summary["equal_tasks_per_node"] and summary["has_switch_info"], "summary flags")
    check(summary["groups_under_leaf_switch"] == {"1": True, "2": True, "3": False, "4": False},
          f"groups under one leaf switch: {summary['groups_under_leaf_switch']}")

    # Three nodes across both switches (n2 under s1, n3 and n4 under s2).
    ranks, summary = probe_output(srun(args, cluster, "-N", "3", "-w", "n2,n3,n4", "--ntasks-per-node=1").stdout)
    print(summary["summary"])
    check_ranks(ranks, summary, 3, {"n2": 1, "n3": 1, "n4": 1}, SWITCH)
    check(summary["node_order"] == ["n2", "n3", "n4"], f"node order {summary['node_order']}")
    check(summary["groups_under_leaf_switch"]["1"] and not summary["groups_under_leaf_switch"]["3"],
          f"groups {summary['groups_under_leaf_switch']}")


def case_srun_2nodes(args, cluster):
    # -w: the checks name the nodes, and Slurm may give a new job other idle nodes while
    # the previous job's are still completing.
    ranks, summary = probe_output(srun(args, cluster, "-N", "2", "-w", "n1,n2", "--ntasks-per-node=2").stdout)
    print(summary["summary"])
    check_ranks(ranks, summary, 4, {"n1": 2, "n2": 2}, SWITCH)
    check(summary["groups_under_leaf_switch"] == {"1": True, "2": True}, "n1 and n2 share s1")

    # Unequal: 3 tasks on 2 nodes, SLURM_TASKS_PER_NODE="2,1".
    ranks, summary = probe_output(srun(args, cluster, "-N", "2", "-w", "n1,n2", "-n", "3").stdout)
    print(summary["summary"])
    check_ranks(ranks, summary, 3, {"n1": 2, "n2": 1}, SWITCH)
    check(summary["tasks_per_node"] == [2, 1] and not summary["equal_tasks_per_node"],
          f"tasks per node {summary['tasks_per_node']}")
    p = srun(args, cluster, "-N", "2", "-w", "n1,n2", "-n", "3", expect_rc=None, probe_args=["--require-equal"])
    check(p.returncode != 0, "--require-equal accepted 2+1 ranks")
    lines = [l for l in p.stderr.splitlines() if l.startswith("amsp_topology_probe:")]
    check(len(lines) == 1 and "same number of ranks on every node" in lines[0] and "n1=2, n2=1" in lines[0],
          f"expected one error line from rank 0, got stderr:\n{p.stderr}")
    print("ok unequal layout refused:", lines[0])

    # Cyclic distribution: rank r on node r % 2; node-major positions regroup them.
    ranks, summary = probe_output(srun(args, cluster, "-N", "2", "-w", "n1,n2", "-n", "4", "-m", "cyclic").stdout)
    print(summary["summary"])
    check_ranks(ranks, summary, 4, {"n1": 2, "n2": 2}, SWITCH)
    check([r["node_name"] for r in ranks] == ["n1", "n2", "n1", "n2"], "cyclic placement")
    check(summary["ranks_in_order"] == [0, 2, 1, 3], f"ranks in order {summary['ranks_in_order']}")


def case_mpiexec_alloc(args, cluster):
    # Hydra starts one proxy per node through srun; the ranks are not Slurm tasks, so
    # discovery falls back to shared-memory groups, named by SLURMD_NODENAME.
    p = run(["salloc", "-N", "2", "-w", "n1,n2", "--ntasks-per-node=2", "--time=2", args.mpiexec, "-n", "4", args.probe],
            cluster.env)
    ranks, summary = probe_output(p.stdout)
    print(summary["summary"])
    check(len(ranks) == 4, f"{len(ranks)} ranks")
    for r in ranks:
        check(r["source"] == "mpi", f"rank {r['rank']}: source {r['source']}, expected mpi")
        check(r["local_rank"] == r["rank"] % 2 and r["local_size"] == 2, f"rank record {r}")
        check(r["node_name"] == f"n{r['rank'] // 2 + 1}" and r["switch_path"] == "top.s1", f"rank record {r}")
    check(summary["node_order"] == ["n1", "n2"], f"node order {summary['node_order']}")


def case_mpiexec(args):
    p = run([args.mpiexec, "-n", "4", args.probe], clean_env())
    ranks, summary = probe_output(p.stdout)
    print(summary["summary"])
    check(len(ranks) == 4, f"{len(ranks)} ranks")
    names = {r["node_name"] for r in ranks}
    check(len(names) == 1, f"node names {names}")
    host = socket.gethostname()
    check(names == {host}, f"node name {names}, host name {host}")
    for r in ranks:
        check(r["source"] == "mpi" and r["num_nodes"] == 1 and r["node"] == 0, f"rank record {r}")
        check(r["local_rank"] == r["rank"] and r["local_size"] == 4 and r["position"] == r["rank"], f"rank record {r}")
        check(r["switch_path"] == "", f"rank {r['rank']}: switch path {r['switch_path']!r} without Slurm")
    check(summary["equal_tasks_per_node"] and not summary["has_switch_info"], "summary flags")


# Expected groups on 4 nodes x 2 ranks (rank r on node n{r//2+1}; n1, n2 under switch
# s1, n3, n4 under s2), worked out by hand from the mesh's coordinates (P
# fastest, then G, OS, replica). Each entry: group -> function of the rank giving the
# world ranks of its group in group order.
def _self(r):
    return [r]


MESH_EXPECTED = {
    "zero3": {"P": lambda r: list(range(8)), "G": _self, "OS": _self, "replica": _self, "gather": _self},
    "zero1": {"P": _self, "G": _self, "OS": lambda r: list(range(8)), "replica": _self,
              "gather": lambda r: list(range(8))},
    "zero2": {"P": _self, "G": lambda r: list(range(8)), "OS": _self, "replica": _self,
              "gather": lambda r: list(range(8))},
    "mics:2": {"P": lambda r: [r - r % 2, r - r % 2 + 1], "G": _self, "OS": _self,
               "replica": lambda r: [r % 2, r % 2 + 2, r % 2 + 4, r % 2 + 6], "gather": _self},
    # Groups of two whole nodes: n1+n2 (switch s1) and n3+n4 (switch s2).
    "mics:4": {"P": lambda r: [0, 1, 2, 3] if r < 4 else [4, 5, 6, 7], "G": _self, "OS": _self,
               "replica": lambda r: [r % 4, r % 4 + 4], "gather": _self},
    # Mixed, OS spanning two nodes: G pairs a node's ranks, OS pairs the same local
    # rank of two nodes under one switch; the gather group lists OS-shards in P-shard order.
    "p=1,g=2x1,os=2x2": {"P": _self, "G": lambda r: [r - r % 2, r - r % 2 + 1],
                         "OS": lambda r: [r % 2 + 4 * (r // 4), r % 2 + 4 * (r // 4) + 2],
                         "replica": lambda r: [r % 4, r % 4 + 4],
                         "gather": lambda r: [4 * (r // 4) + i for i in (0, 2, 1, 3)]},
    "p=2x1,g=2x2,os=2x4": {"P": lambda r: [r - r % 2, r - r % 2 + 1],
                           "G": lambda r: [r % 2 + 4 * (r // 4), r % 2 + 4 * (r // 4) + 2],
                           "OS": lambda r: [r % 4, r % 4 + 4], "replica": _self,
                           "gather": lambda r: [r % 2 + i for i in (0, 4, 2, 6)]},
}

# The groups: line for each plan, from the groups above, the switches of their nodes and
# topology.conf (switches of 2 nodes).
_SIZE = "(across leaf switches: plan size, no switch holds 4 nodes)"
_ALIGNED = "(across leaf switches: block alignment, n1 (s1) and n3 (s2) in one group)"
MESH_PLACEMENT = {
    "zero3": f"P 8 ranks on 4 nodes {_SIZE}",
    "zero1": f"OS 8 ranks on 4 nodes {_SIZE}; gather 8 ranks on 4 nodes {_SIZE}",
    "zero2": f"G 8 ranks on 4 nodes {_SIZE}; gather 8 ranks on 4 nodes {_SIZE}",
    "mics:2": f"P 2 ranks in a node; replica 4 ranks on 4 nodes {_SIZE}",
    "mics:4": f"P 4 ranks on 2 nodes (under one leaf switch); replica 2 ranks on 2 nodes {_ALIGNED}",
    "p=1,g=2x1,os=2x2": "G 2 ranks in a node; OS 2 ranks on 2 nodes (under one leaf switch); "
                        f"replica 2 ranks on 2 nodes {_ALIGNED}; gather 4 ranks on 2 nodes (under one leaf switch)",
    "p=2x1,g=2x2,os=2x4": "P 2 ranks in a node; G 2 ranks on 2 nodes (under one leaf switch); "
                          f"OS 2 ranks on 2 nodes {_ALIGNED}; gather 4 ranks on 4 nodes {_SIZE}",
}


def case_mesh_groups(args, cluster):
    plans = list(MESH_EXPECTED)
    out = run(["srun", "--mpi=pmi2", "--time=2", "-N", "4", "--ntasks-per-node=2", args.mesh_probe, *plans],
              cluster.env).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    check(len(records) == 8 * len(plans), f"{len(records)} records for {len(plans)} plans x 8 ranks")
    for rec in records:
        want = MESH_EXPECTED[rec["plan"]]
        r = rec["rank"]
        for group, members in rec["groups"].items():
            check(members == want[group](r),
                  f"{rec['plan']} rank {r} group {group}: got {members}, expected {want[group](r)}")
        check(rec["placement"] == MESH_PLACEMENT[rec["plan"]],
              f"{rec['plan']}: placement {rec['placement']!r}, expected {MESH_PLACEMENT[rec['plan']]!r}")
    print(f"ok {len(plans)} plans x 8 ranks: every group has the expected members, every placement line its text")
    for rec in records:
        if rec["rank"] == 0:
            print(f"   {rec['plan']:22s} {rec['factors']:22s} {rec['placement']}")

    # n2 and n3, one under each switch: the allocation keeps a 2-node group from one switch.
    out = run(["srun", "--mpi=pmi2", "--time=2", "-N", "2", "-w", "n2,n3", "--ntasks-per-node=2", args.mesh_probe,
               "mics:4"], cluster.env).stdout
    placement = json.loads(next(line for line in out.splitlines() if line.startswith("{")))["placement"]
    want = "P 4 ranks on 2 nodes (across leaf switches: allocation, at most 1 of its nodes under one switch)"
    check(placement == want, f"mics:4 on n2, n3: placement {placement!r}, expected {want!r}")
    print(f"ok mics:4 on n2, n3: {placement}")

    # A plan that does not fit the world is refused on every rank with one line.
    r = run(["srun", "--mpi=pmi2", "--time=2", "-N", "4", "--ntasks-per-node=2", args.mesh_probe, "mics:3"],
            cluster.env, expect_rc=None)
    errors = [line for line in r.stderr.splitlines() if "amsp_mesh_probe: error" in line]
    check(r.returncode != 0 and errors and all("does not fit" in e for e in errors),
          f"mics:3 should be refused: rc {r.returncode}, stderr {r.stderr.strip()[:300]}")
    print(f"ok mics:3 refused: {errors[0]}")
    # Unequal tasks per node: a plan needs equal ones.
    r = run(["srun", "--mpi=pmi2", "--time=2", "-N", "2", "-n", "3", args.mesh_probe, "zero3"],
            cluster.env, expect_rc=None)
    check(r.returncode != 0 and "tasks" in r.stderr, f"unequal layout should be refused: {r.stderr.strip()[:300]}")
    print("ok unequal tasks per node refused:", r.stderr.strip().splitlines()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["hostlist", "srun-4x2", "srun-2nodes", "mpiexec-alloc", "mpiexec",
                                       "mesh-groups"])
    ap.add_argument("--mesh-probe", help="amsp_mesh_probe (for mesh-groups)")
    ap.add_argument("--probe", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cluster-scripts", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                              "..", "..", "slurm", "local-cluster"))
    ap.add_argument("--mpiexec", default="mpiexec")
    args = ap.parse_args()
    args.probe = os.path.abspath(args.probe)
    args.cluster_scripts = os.path.abspath(args.cluster_scripts)
    args.work = os.path.abspath(os.path.join(args.work, args.case))

    if args.case == "mpiexec":
        try:
            case_mpiexec(args)
        except (Failure, subprocess.TimeoutExpired) as e:
            print(f"FAIL: {e}", file=sys.stderr)
            return 1
        print("PASS")
        return 0

    lacking = lc.missing(("srun", "salloc", "scontrol", "sinfo", "slurmctld", "slurmd", "munged"))
    if lacking:
        print(f"SKIP: needs root and Slurm + munge (missing: {lacking})")
        return SKIP
    os.environ["PATH"] = os.environ.get("PATH", "") + lc.SBIN

    os.makedirs(args.work, exist_ok=True)

    case = {"hostlist": case_hostlist, "srun-4x2": case_srun_4x2, "srun-2nodes": case_srun_2nodes,
            "mpiexec-alloc": case_mpiexec_alloc, "mesh-groups": case_mesh_groups}[args.case]
    try:
        with lc.deadline(DEADLINE), lc.local_cluster(args.cluster_scripts, os.path.join(args.work, "cluster")) as conf:
            case(args, Cluster(conf))
        print("PASS")
        return 0
    except (Failure, lc.Interrupted, lc.ClusterError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
