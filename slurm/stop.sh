#!/usr/bin/env bash
# Stop the local test cluster and leave nothing running. --purge also deletes its state
# (the next job id is kept, so job ids never restart at 1).
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
say() { printf '\033[1m[slurm]\033[0m %s\n' "$*"; }
if [ -d "$STATE" ]; then exec 9>"$STATE.lock"; flock 9; fi  # not while start.sh runs
if [ -f "$SLURM_CONF" ] && command -v sacct >/dev/null && scontrol ping >/dev/null 2>&1; then
  scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
  top=$(sacct -X -n -P -o jobid --starttime=1970-01-01 2>/dev/null | sed 's/[_.].*//' | sort -n | tail -1)
  [ -n "$top" ] && echo $((top + 1)) > "$STATE.next-job-id"
fi
stop_pids() {  # stop_pids NAME PIDFILE...: SIGTERM to all at once, each killed after 10 s
  local what=$1 f pid pids=()
  shift
  for f in "$@"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  if [ ${#pids[@]} -gt 0 ]; then
    say "stopping $what"
    for _ in $(seq 50); do
      kill -0 "${pids[@]}" 2>/dev/null || break  # false once none is left
      sleep 0.2
    done
    kill -9 "${pids[@]}" 2>/dev/null || true
  fi
  rm -f "$@"
}
# the node daemons and the controller together (each takes ~2 s to stop), then the accounting
# daemon, then its database
stop_pids "slurmd and slurmctld" "$STATE"/run/slurmd-*.pid "$STATE/run/slurmctld.pid"
stop_pids slurmdbd "$STATE/run/slurmdbd.pid"
stop_pids MariaDB "$STATE/run/mariadb.pid"
# Job steps and anything a daemon left behind (slurmstepd, its tasks) go too.
pkill -9 -x slurmstepd 2>/dev/null || true
if [ -f "$STATE/run/munged.ours" ]; then
  say "stopping munged"; pkill -x munged 2>/dev/null || true; rm -f "$STATE/run/munged.ours"
fi
if [ "${1:-}" = "--purge" ]; then rm -rf "$STATE"; say "state removed"; fi
say "stopped"
