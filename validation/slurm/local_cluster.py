"""A local Slurm cluster for one test script: started on the script's own ports under its
work directory (slurm/local-cluster/start.sh), and always stopped again, also when the
script is interrupted or runs out of time.

    with deadline(560), local_cluster(scripts, work + "/cluster", "17517", "17601") as conf:
        ...  # SLURM_CONF=conf reaches this cluster
"""

import contextlib
import os
import shutil
import signal
import subprocess
import time

SBIN = ":/usr/sbin:/sbin"


class Interrupted(Exception):
    """A signal or the deadline: ends the script, and the cluster is stopped."""


class ClusterError(Exception):
    """The cluster could not be started or stopped."""


def clean_env(extra=None):
    """This environment without Slurm or PMI variables (the test may run inside a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "PMI_", "HYDRA_"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PATH"] = env.get("PATH", "") + SBIN
    env.update(extra or {})
    return env


def missing(tools=("sbatch", "srun", "scontrol", "scancel", "slurmctld", "slurmd", "munged")):
    """What this machine lacks to run a local cluster ("" if nothing): tools, or root."""
    gone = [t for t in tools if shutil.which(t, path=os.environ.get("PATH", "") + SBIN) is None]
    if os.geteuid() != 0:
        gone.append("root")
    return " ".join(gone)


@contextlib.contextmanager
def deadline(seconds):
    """SIGTERM, SIGINT, SIGHUP or `seconds` passing raise Interrupted inside the block;
    on the way out those signals are ignored, so that clean-up can finish."""
    def on_signal(signum, frame):
        raise Interrupted(f"took longer than {seconds} s" if signum == signal.SIGALRM
                          else f"interrupted by signal {signum}")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(s, on_signal)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def local_cluster(scripts, cluster_dir, ctld_port, node_port):
    """Starts a cluster in cluster_dir and yields the path of its slurm.conf; stops it on
    the way out. Raises ClusterError if it cannot be started or stopped."""
    stop = [os.path.join(scripts, "stop.sh"), cluster_dir]
    # A run killed before its clean-up may have left daemons in this directory.
    subprocess.run(stop, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=90)
    shutil.rmtree(cluster_dir, ignore_errors=True)
    try:
        t0 = time.time()
        p = subprocess.run([os.path.join(scripts, "start.sh"), cluster_dir],
                           env=clean_env({"AMSP_SLURM_CTLD_PORT": ctld_port, "AMSP_SLURM_NODE_PORT": node_port,
                                          "AMSP_SLURM_TIMEOUT": "40"}),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        if p.returncode != 0:
            raise ClusterError(f"start.sh failed ({p.returncode}):\n{p.stdout}")
        print(f"     local Slurm cluster started in {time.time() - t0:.1f} s ({cluster_dir})", flush=True)
        yield os.path.join(cluster_dir, "slurm.conf")
    finally:
        p = subprocess.run(stop, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        if p.returncode != 0:
            print(p.stdout, end="")
            raise ClusterError("stop.sh could not stop the cluster")
