#!/usr/bin/env bash
# Starts a real Slurm cluster on this machine: munged, slurmctld and four slurmd
# daemons pretending to be nodes n1..n4 (2 CPUs each) under two leaf switches
# (s1 = n1,n2 and s2 = n3,n4, both under "top").  Everything it writes lives in DIR:
# configuration, state, logs, pid files and a private munge key and socket, so it
# neither needs nor touches /etc/slurm or a system munged.  Stop it with stop.sh DIR.
#
#   usage: start.sh [DIR]        (default /tmp/amsp-slurm)
#   env:   AMSP_SLURM_TIMEOUT    seconds to wait for the nodes to become idle (60)
#          AMSP_SLURM_CTLD_PORT  slurmctld port (16817)
#          AMSP_SLURM_NODE_PORT  first slurmd port (17001); n1..n4 use it and the next three
#
# Needs root (slurmd must be able to start jobs as any user) and the Debian packages
# munge and slurm-wlm.  See doc/slurm-local.md.
set -euo pipefail

DIR=$(realpath -m "${1:-/tmp/amsp-slurm}")
TIMEOUT=${AMSP_SLURM_TIMEOUT:-60}
CTLD_PORT=${AMSP_SLURM_CTLD_PORT:-16817}
NODE_PORT=${AMSP_SLURM_NODE_PORT:-17001}
NODES=(n1 n2 n3 n4)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() { echo "start.sh: $*" >&2; exit 1; }

# running PID: the process exists and is not a zombie.
running() {
  local stat
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

for tool in munged slurmctld slurmd sinfo scontrol; do
  command -v "$tool" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin
  command -v "$tool" >/dev/null 2>&1 ||
    die "$tool not found: install the Debian packages munge and slurm-wlm"
done
[[ $CTLD_PORT =~ ^[0-9]+$ && $NODE_PORT =~ ^[0-9]+$ ]] || die "ports must be numbers"
[[ $(id -u) -eq 0 ]] || die "must run as root (slurmd launches jobs as their owner)"

# Refuse to start over a cluster that is still running in DIR.
for pidfile in "$DIR"/munge/munged.pid "$DIR"/run/*.pid; do
  [[ -f $pidfile ]] || continue
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if running "$pid"; then
    die "a daemon from an earlier start is still running in $DIR (pid $pid, $pidfile); run stop.sh $DIR first"
  fi
done

# A port something already listens on (another cluster, another suite's test) would only
# show as a daemon dying during start-up: say which, before starting anything.
for port in "$CTLD_PORT" $(seq "$NODE_PORT" $((NODE_PORT + 3))); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port is in use (another local cluster?); choose others with AMSP_SLURM_CTLD_PORT and AMSP_SLURM_NODE_PORT"
  fi
done

# Fresh state every time: a stale job or node state from an earlier run only confuses.
rm -rf "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run" "$DIR/munge"
mkdir -p "$DIR"/{state,log,run,munge} "${NODES[@]/#/$DIR/spool/}"
# Job owners need to reach the munge socket, so DIR/munge is world-searchable; the
# key inside it is private.
chmod 0755 "$DIR" "$DIR"/{state,spool,log,run,munge}

# --- munge: a private daemon with its own key and socket ---------------------
MUNGE_SOCKET=$DIR/munge/munge.socket
if command -v mungekey >/dev/null 2>&1; then
  mungekey --create --keyfile="$DIR/munge/munge.key" --force
else
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 0600 "$DIR/munge/munge.key"

# --- slurm.conf and topology.conf --------------------------------------------
cat >"$DIR/slurm.conf" <<EOF
# Written by slurm/local-cluster/start.sh: a 4-node test cluster on localhost.
ClusterName=amsplocal
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire is also how long a requeued job waits before it may start again
# (default 120 s); 10 s keeps the requeue tests short.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (default 60 s and 30 s), so that requeued and
# dependent jobs start soon after they become eligible.
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
ReturnToService=2
TopologyPlugin=topology/tree
# Short timeouts: this cluster only runs small test jobs. KillWait (SIGTERM to
# SIGKILL when a job is cancelled, requeued or out of time: the time a stopped amsp
# has to write its checkpoint) is 10 s, not Slurm's default 30: the tiny models of
# the tests save in well under a second, and a job whose rank died waits it out.
SlurmdTimeout=60
KillWait=10
MinJobAge=30
InactiveLimit=0
NodeName=n[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$NODE_PORT-$((NODE_PORT + 3)) CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF

cat >"$DIR/topology.conf" <<EOF
# Written by slurm/local-cluster/start.sh: two leaf switches under one top switch.
SwitchName=s1 Nodes=n[1-2]
SwitchName=s2 Nodes=n[3-4]
SwitchName=top Switches=s[1-2]
EOF

export SLURM_CONF=$DIR/slurm.conf

log_tail() {
  local f
  for f in "$@"; do
    [[ -f $f ]] || continue
    echo "--- last lines of $f:" >&2
    tail -n 15 "$f" >&2
  done
}

# If anything below fails, do not leave half a cluster behind.
started=0
cleanup_on_error() {
  if [[ $started -eq 0 ]]; then
    "$HERE/stop.sh" "$DIR" >/dev/null 2>&1 || true
  fi
}
trap cleanup_on_error EXIT

munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
  --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
  --seed-file="$DIR/munge/munged.seed" --force ||
  { log_tail "$DIR/munge/munged.log"; die "munged failed to start"; }
# The socket must accept connections before slurm daemons try to use it.
for _ in $(seq 50); do
  [[ -S $MUNGE_SOCKET ]] && break
  sleep 0.1
done
[[ -S $MUNGE_SOCKET ]] || { log_tail "$DIR/munge/munged.log"; die "munged socket $MUNGE_SOCKET did not appear"; }

slurmctld -i || { log_tail "$DIR/log/slurmctld.log"; die "slurmctld failed to start"; }
for n in "${NODES[@]}"; do
  slurmd -N "$n" || { log_tail "$DIR/log/slurmd-$n.log"; die "slurmd -N $n failed to start"; }
done

# Wait until the controller sees all four nodes idle.
deadline=$((SECONDS + TIMEOUT))
while :; do
  idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l || true)
  [[ $idle -ge ${#NODES[@]} ]] && break
  for pidfile in "$DIR/run/slurmctld.pid" "$DIR"/run/slurmd-*.pid "$DIR/munge/munged.pid"; do
    [[ -f $pidfile ]] || continue
    pid=$(tr -dc '0-9' <"$pidfile")
    if [[ -n $pid ]] && ! running "$pid"; then
      log_tail "$DIR/log/slurmctld.log" "$DIR"/log/slurmd-n1.log "$DIR/munge/munged.log"
      die "$(basename "$pidfile" .pid) (pid $pid) exited during start-up (port in use? see the logs in $DIR/log)"
    fi
  done
  if ((SECONDS >= deadline)); then
    echo "start.sh: the nodes did not become idle within ${TIMEOUT}s; sinfo says:" >&2
    sinfo -N 2>&1 | sed 's/^/  /' >&2 || true
    log_tail "$DIR/log/slurmctld.log" "$DIR"/log/slurmd-n1.log "$DIR/munge/munged.log"
    die "cluster in $DIR not ready (stopped it again)"
  fi
  sleep 0.5
done

started=1
trap - EXIT
echo "Slurm test cluster running in $DIR (nodes n[1-4], switches s1={n1,n2} s2={n3,n4} under top;"
echo "slurmctld on port $CTLD_PORT, slurmd on $NODE_PORT-$((NODE_PORT + 3)))."
echo "Use it with:"
echo "export SLURM_CONF=$DIR/slurm.conf"
