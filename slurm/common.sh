# Shared settings of the local test cluster (sourced by start.sh, stop.sh, env.sh).
SLURM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${HPCTRAIN_SLURM_STATE:-/tmp/hpctrain-slurm}
NODES=${HPCTRAIN_SLURM_NODES:-4}
CPUS=${HPCTRAIN_SLURM_CPUS:-2}
DB_PORT=16833
export SLURM_CONF="$STATE/etc/slurm.conf"
