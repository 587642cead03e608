"""A local Slurm cluster for one test script: started under its work directory
(slurm/local-cluster/start.sh) on ports of its own, and always stopped again, also when the
script is interrupted or runs out of time.

    with deadline(560), local_cluster(scripts, work + "/cluster") as conf:
        ...  # SLURM_CONF=conf reaches this cluster

Ports: five consecutive ones (slurmctld, then the four slurmd) found free when the cluster
starts, searched from a place derived from the cluster directory's path. Two suites in two
build directories, or two tests of one suite, thus start from different places; where they
meet anyway, the second finds the first's ports taken and moves on, and a start that loses a
race for a port is retried on the next free ones.
"""

import contextlib
import hashlib
import os
import shutil
import signal
import socket
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


# Below Linux's ephemeral ports (32768-60999), so that no outgoing connection holds one,
# and away from Slurm's defaults (6817, 6818) and start.sh's (16817, 17001-17004).
PORT_RANGE = (20000, 32760)
SLOT = 8          # ports per place in the range; a cluster uses the first five
STARTS = 4        # attempts to start when a daemon could not bind its port


def port_free(port):
    """Nothing listens on or holds `port` (TCP, any address) at this moment."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def cluster_ports(cluster_dir, skip=()):
    """(slurmctld port, first of the four slurmd ports): five consecutive ports free now,
    the first place from the one the directory's path hashes to on, leaving out the
    places in `skip` (their first ports). Raises ClusterError if none is free."""
    places = (PORT_RANGE[1] - PORT_RANGE[0]) // SLOT
    digest = hashlib.sha256(os.path.realpath(cluster_dir).encode()).digest()
    first = int.from_bytes(digest[:8], "big") % places
    for k in range(places):
        base = PORT_RANGE[0] + SLOT * ((first + k) % places)
        if base not in skip and all(port_free(p) for p in range(base, base + 5)):
            return base, base + 1
    raise ClusterError(f"no five consecutive free ports in {PORT_RANGE[0]}-{PORT_RANGE[1]}")


def _stop(stop):
    """Runs stop.sh with the signals that end a script held back until it is done, so that
    an interruption cannot leave the cluster running; they are delivered afterwards."""
    held = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        return subprocess.run(stop, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=120)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def local_cluster(scripts, cluster_dir, ctld_port=None, node_port=None):
    """Starts a cluster in cluster_dir and yields the path of its slurm.conf; stops it on
    the way out. Its ports are chosen free (cluster_ports) unless both are given. Raises
    ClusterError if it cannot be started or stopped."""
    stop = [os.path.join(scripts, "stop.sh"), cluster_dir]
    # A run killed before its clean-up may have left daemons in this directory.
    _stop(stop)
    shutil.rmtree(cluster_dir, ignore_errors=True)
    try:
        t0 = time.time()
        tried = []
        for attempt in range(STARTS if ctld_port is None else 1):
            ctld, node = (int(ctld_port), int(node_port)) if ctld_port else cluster_ports(cluster_dir, tried)
            tried.append(ctld)
            p = subprocess.run([os.path.join(scripts, "start.sh"), cluster_dir],
                               env=clean_env({"AMSP_SLURM_CTLD_PORT": str(ctld), "AMSP_SLURM_NODE_PORT": str(node),
                                              "AMSP_SLURM_TIMEOUT": "40"}),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
            if p.returncode == 0:
                break
            # Another process took a port between the choice and the daemon's bind.
            lost = "is in use" in p.stdout or "exited during start-up" in p.stdout
            if not lost or ctld_port:
                raise ClusterError(f"start.sh failed ({p.returncode}):\n{p.stdout}")
            print(f"     ports {ctld}, {node}-{node + 3} were taken meanwhile; trying others", flush=True)
            _stop(stop)
        else:
            raise ClusterError(f"start.sh failed on {len(tried)} sets of free ports:\n{p.stdout}")
        print(f"     local Slurm cluster started in {time.time() - t0:.1f} s ({cluster_dir}, ports {ctld} and "
              f"{node}-{node + 3})", flush=True)
        yield os.path.join(cluster_dir, "slurm.conf")
    finally:
        p = _stop(stop)
        if p.returncode != 0:
            print(p.stdout, end="")
            raise ClusterError("stop.sh could not stop the cluster")
