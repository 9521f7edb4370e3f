# Source this to talk to the local test cluster: . slurm/env.sh && sinfo
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
echo "SLURM_CONF=$SLURM_CONF" >&2
