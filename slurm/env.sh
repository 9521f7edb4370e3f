# Source this to talk to the local test cluster: . slurm/env.sh && sinfo
# It points the clients at whichever runs (22.05 first when both do; SLURM_VERSION=24.11 . slurm/env.sh
# chooses); for 24.11 its clients come first on PATH.
if [ -z "${SLURM_VERSION:-}" ] && [ -z "${HPCTRAIN_SLURM_STATE:-}" ]; then
  for _v in 22.05 24.11; do
    _s=/tmp/hpctrain-slurm; [ "$_v" = 22.05 ] || _s=/tmp/hpctrain-slurm-$_v
    if [ -f "$_s/run/slurmctld.pid" ] && kill -0 "$(cat "$_s/run/slurmctld.pid")" 2>/dev/null; then
      SLURM_VERSION=$_v; break
    fi
  done
  unset _v _s
fi
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ -n "$ROOTFS" ]; then
  case ":$PATH:" in *":$SLURM_BIN:"*) ;; *) export PATH="$SLURM_BIN:$PATH" ;; esac
fi
echo "SLURM_CONF=$SLURM_CONF (SLURM $SLURM_VERSION${ROOTFS:+: its commands from $SLURM_BIN})" >&2
