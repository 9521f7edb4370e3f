# Source this to talk to the local test cluster: . slurm/env.sh && sinfo
# (SLURM_VERSION=24.11 . slurm/env.sh: the 24.11 cluster's clients come first on PATH)
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ -n "$ROOTFS" ]; then
  case ":$PATH:" in *":$SLURM_BIN:"*) ;; *) export PATH="$SLURM_BIN:$PATH" ;; esac
fi
echo "SLURM_CONF=$SLURM_CONF${ROOTFS:+ (SLURM $SLURM_VERSION: its commands from $SLURM_BIN)}" >&2
