#!/usr/bin/env bash
# Stops the test cluster that start.sh started in DIR: cancels its jobs, then stops
# the slurmd daemons, slurmctld and munged by the pids in their pid files (never by
# name), and waits until each has exited.  Safe to run twice, and on a cluster that
# only half started.
#
#   usage: stop.sh [DIR]        (default /tmp/amsp-slurm)
set -uo pipefail

DIR=$(realpath -m "${1:-/tmp/amsp-slurm}")
PATH=$PATH:/usr/sbin:/sbin

# alive PID NAME: PID is running and is the program NAME (so a stale pid file whose
# pid was reused by another process is never acted on).
# A zombie (exited, not yet reaped: pid 1 of a container may never reap) is not alive.
alive() {
  local pid=$1 name=$2 comm stat
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == "$name" ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

# stop_pidfiles NAME FILE...: SIGTERM to every live NAME daemon named by the pid files,
# then wait (all at once: each takes a second or two to shut down) up to 15 s; SIGKILL
# whatever is left and wait again.  Removes the pid files of the daemons that exited.
stop_pidfiles() {
  local name=$1 file pid left i
  shift
  local -a pids=()
  for file in "$@"; do
    [[ -f $file ]] || continue
    pid=$(tr -dc '0-9' 2>/dev/null <"$file")
    if alive "$pid" "$name"; then
      kill -TERM "$pid" 2>/dev/null
      pids+=("$pid")
    fi
  done
  for i in $(seq 200); do
    left=()
    for pid in "${pids[@]}"; do alive "$pid" "$name" && left+=("$pid"); done
    [[ ${#left[@]} -eq 0 ]] && break
    if [[ $i -eq 150 ]]; then
      echo "stop.sh: $name (pid ${left[*]}) ignored SIGTERM for 15 s; killing it" >&2
      kill -KILL "${left[@]}" 2>/dev/null
    fi
    sleep 0.1
  done
  if [[ ${#left[@]} -gt 0 ]]; then
    echo "stop.sh: $name (pid ${left[*]}) is still running" >&2
    return 1
  fi
  for file in "$@"; do rm -f "$file"; done
}

status=0
ctld_pid=$(tr -dc '0-9' 2>/dev/null <"$DIR/run/slurmctld.pid")

# Cancel this cluster's jobs first and let them end, so that slurmd's step daemons
# clean up after themselves.
if [[ -f $DIR/slurm.conf ]] && alive "$ctld_pid" slurmctld; then
  export SLURM_CONF=$DIR/slurm.conf
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
  if [[ -n $jobs ]]; then
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 100); do
      [[ -z $(timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
fi

stop_pidfiles slurmd "$DIR"/run/slurmd-*.pid || status=1

# Whatever outlived that: step daemons and job processes of this cluster.  They carry
# its SLURM_CONF in their environment (slurmd passes its own on to slurmstepd, srun
# the user's to the tasks), which identifies them exactly.
leftovers() {
  local env pid
  # shellcheck disable=SC2013  # /proc/N/environ: no white space
  for env in $(grep -lzxF "SLURM_CONF=$DIR/slurm.conf" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${env#/proc/}; pid=${pid%/environ}
    [[ $pid != "$$" && $pid != "$BASHPID" && $pid != "$PPID" ]] || continue
    if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == slurmstepd ]] ||
       grep -qz '^SLURM_STEP_ID=' "$env" 2>/dev/null; then
      echo "$pid"
    fi
  done
}
for pid in $(leftovers); do
  echo "stop.sh: killing leftover $(cat "/proc/$pid/comm" 2>/dev/null) (pid $pid) of this cluster" >&2
  kill -KILL "$pid" 2>/dev/null
done
for _ in $(seq 50); do
  [[ -z $(leftovers) ]] && break
  sleep 0.1
done

stop_pidfiles slurmctld "$DIR/run/slurmctld.pid" || status=1
stop_pidfiles munged "$DIR/munge/munged.pid" || status=1
rm -f "$DIR/munge/munge.socket" "$DIR/munge/munge.socket.lock"

if [[ $status -eq 0 ]]; then
  echo "Slurm test cluster in $DIR stopped."
fi
exit $status
