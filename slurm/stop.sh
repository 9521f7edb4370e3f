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
stop_pid() {  # stop_pid PIDFILE NAME
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping $2"; kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}
for f in "$STATE"/run/slurmd-*.pid; do [ -e "$f" ] && stop_pid "$f" "slurmd $(basename "$f" .pid)"; done
stop_pid "$STATE/run/slurmctld.pid" slurmctld
stop_pid "$STATE/run/slurmdbd.pid" slurmdbd
stop_pid "$STATE/run/mariadb.pid" MariaDB
# Job steps and anything a daemon left behind (slurmstepd, its tasks) go too.
pkill -9 -x slurmstepd 2>/dev/null || true
if [ -f "$STATE/run/munged.ours" ]; then
  say "stopping munged"; pkill -x munged 2>/dev/null || true; rm -f "$STATE/run/munged.ours"
fi
if [ "${1:-}" = "--purge" ]; then rm -rf "$STATE"; say "state removed"; fi
say "stopped"
