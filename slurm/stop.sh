#!/usr/bin/env bash
# Stop the local test cluster and leave nothing running. --purge also deletes its state
# (the next job id is kept, so job ids never restart at 1).
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=procs.sh
. "$(dirname "${BASH_SOURCE[0]}")/procs.sh"
say() { printf '\033[1m[slurm]\033[0m %s\n' "$*"; }
if [ -d "$STATE" ]; then exec 9>"$STATE.lock"; flock 9; fi  # not while start.sh runs
[ -z "$ROOTFS" ] || export PATH="$SLURM_BIN:$PATH"   # the 24.11 cluster's own clients
if [ -f "$SLURM_CONF" ] && command -v sacct >/dev/null && scontrol ping >/dev/null 2>&1; then
  scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
  top=$(sacct -X -n -P -o jobid --starttime=1970-01-01 2>/dev/null | sed 's/[_.].*//' | sort -n | tail -1 || true)  # none: no accounting
  [ -n "$top" ] && echo $((top + 1)) > "$STATE.next-job-id"
fi
stop_running() {  # stop_running NAME PID...: SIGTERM to all at once; every one gone before it returns
  local what=$1 left
  shift
  [ $# -gt 0 ] || return 0
  say "stopping $what"
  kill "$@" 2>/dev/null || true
  for _ in $(seq 50); do  # until none is left (not until the first is gone), at most 10 s
    [ -z "$(running "$@")" ] && return 0
    sleep 0.2
  done
  left=$(running "$@")
  say "killing $what: $(echo "$left" | tr '\n' ' ')did not stop within 10 s"
  # shellcheck disable=SC2086
  kill -9 $left 2>/dev/null || true
  # shellcheck disable=SC2086
  for _ in $(seq 25); do [ -z "$(running $left)" ] && return 0; sleep 0.2; done
}
stop_pids() {  # stop_pids NAME PIDFILE...: the daemons their pid files name, then the files
  local what=$1 f pid pids=()
  shift
  for f in "$@"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    # with its children: slurmctld's slurmscriptd outlived it by a moment, and a start right then
    # could meet the old controller's helper
    if kill -0 "$pid" 2>/dev/null; then pids+=("$pid" $(pgrep -P "$pid" || true)); fi
  done
  stop_running "$what" "${pids[@]}"
  rm -f "$@"
}
# each node's UTS namespace (start.sh gives every slurmd one): what is left in them after their
# daemons stop is this cluster's (its step daemons and tasks), not another cluster's
namespaces=()
for f in "$STATE"/run/slurmd-*.pid; do
  [ -f "$f" ] && ns=$(readlink "/proc/$(cat "$f")/ns/uts" 2>/dev/null) && namespaces+=("$ns")
done
# the node daemons and the controller together (each takes ~2 s to stop), then the accounting
# daemon, then its database
stop_pids "slurmd and slurmctld" "$STATE"/run/slurmd-*.pid "$STATE/run/slurmctld.pid"
stop_pids slurmdbd "$STATE/run/slurmdbd.pid"
stop_pids MariaDB "$STATE/run/mariadb.pid"
# Job steps and anything a daemon left behind (slurmstepd, its tasks) go too: what is left in the
# nodes' namespaces is this cluster's, not another's
if ((${#namespaces[@]})); then
  for proc in /proc/[0-9]*; do
    ns=$(readlink "$proc/ns/uts" 2>/dev/null) || continue
    for n in "${namespaces[@]}"; do [ "$ns" = "$n" ] && kill -9 "${proc#/proc/}" 2>/dev/null; done
  done
fi
# munged is every local cluster's: stopped with the last of them that start.sh started it for
if [ -f "$STATE/run/munged.ours" ]; then mv "$STATE/run/munged.ours" "$MUNGED_OURS"; fi
if [ -f "$MUNGED_OURS" ] && [ -z "$(live '(^|/)slurmctld( |$)')" ]; then
  # waited for: a start right after this one would otherwise find it exiting and not start its own
  # shellcheck disable=SC2046
  stop_running munged $(live '(^|/)munged( |$)')
  rm -f "$MUNGED_OURS"
fi
if [ "${1:-}" = "--purge" ]; then rm -rf "$STATE"; say "state removed"; fi
say "stopped"
