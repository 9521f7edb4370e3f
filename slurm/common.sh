# Shared settings of the local test cluster (sourced by start.sh, stop.sh, env.sh, rootfs.sh).
# SLURM_VERSION picks the cluster: 22.05 (the default: Debian 12's packages on the host) or 24.11
# (Debian 13's, from a root file system slurm/rootfs.sh builds). Each has its own state, ports and
# database, so both can run at once. SLURM_ACCOUNTING=none starts a cluster without slurmdbd (as
# some sites run): give it its own HPCTRAIN_SLURM_STATE and HPCTRAIN_SLURM_PORT_BASE.
SLURM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SLURM_VERSION=${SLURM_VERSION:-22.05}
case "$SLURM_VERSION" in
  22.05) _default_state=/tmp/hpctrain-slurm; PORT_BASE=16800; ROOTFS= ;;
  24.11) _default_state=/tmp/hpctrain-slurm-24.11; PORT_BASE=16900
         ROOTFS=${HPCTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpctrain}/slurm-24.11/root ;;
  *) echo "[slurm] SLURM_VERSION=$SLURM_VERSION: the local cluster runs 22.05 or 24.11" >&2; return 1 2>/dev/null || exit 1 ;;
esac
STATE=${HPCTRAIN_SLURM_STATE:-$_default_state}
PORT_BASE=${HPCTRAIN_SLURM_PORT_BASE:-$PORT_BASE}
SLURM_ACCOUNTING=${SLURM_ACCOUNTING:-slurmdbd}
case "$SLURM_ACCOUNTING" in slurmdbd|none) ;; *) echo "[slurm] SLURM_ACCOUNTING=$SLURM_ACCOUNTING: slurmdbd or none" >&2; return 1 2>/dev/null || exit 1 ;; esac
NODES=${HPCTRAIN_SLURM_NODES:-4}
CPUS=${HPCTRAIN_SLURM_CPUS:-2}
CTLD_PORT=$((PORT_BASE + 17)); DBD_PORT=$((PORT_BASE + 19)); DB_PORT=$((PORT_BASE + 33))
NODE_PORT=$((PORT_BASE + 200))  # slurmd of node i listens on NODE_PORT + i
MUNGED_OURS=/tmp/hpctrain-munged.ours  # start.sh started munged: the last stop.sh stops it
# the clients of a cluster in a root file system: wrappers that run the root's own commands
SLURM_BIN=$STATE/bin
export SLURM_CONF="$STATE/etc/slurm.conf"
