# Shared settings of the local test cluster (sourced by start.sh, stop.sh, env.sh).
SLURM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${HPCTRAIN_SLURM_STATE:-/tmp/hpctrain-slurm}
NODES=${HPCTRAIN_SLURM_NODES:-4}
CPUS=${HPCTRAIN_SLURM_CPUS:-2}
DB_PORT=16833
export SLURM_CONF="$STATE/etc/slurm.conf"
# live PATTERN: the pids whose command line matches (pgrep -f), zombies left out: a daemon that
# exited but whose parent has not reaped it yet holds nothing, yet pgrep lists it (seen here: a
# stopped munged stayed a zombie, so the next start thought munged ran and did not start one)
live() {
  local pid
  for pid in $(pgrep -f "$1" || true); do
    [ -r "/proc/$pid/stat" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && echo "$pid"
  done
  return 0
}
