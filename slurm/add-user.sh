#!/usr/bin/env bash
# Admit a (non-root) user to the local test cluster: an association in its accounting (account
# `users` of cluster hpctrain), so the user's jobs are accounted to them as on a real cluster.
# Idempotent. Use it:  sudo bash slurm/add-user.sh alice
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ "$(id -u)" -eq 0 ] || { echo "slurm/add-user.sh changes the cluster's accounting: use sudo" >&2; exit 1; }
user=${1:?usage: slurm/add-user.sh USER}
id -u "$user" >/dev/null 2>&1 || { echo "no such user: $user" >&2; exit 1; }
export SLURM_CONF
# sacctmgr's add exits 1 for what exists already ("Nothing new added"): ask first, then check
listed() { sacctmgr -i -n -P show "$@" 2>/dev/null || true; }
[ -n "$(listed account users format=account)" ] ||
  sacctmgr -i add account users Cluster=hpctrain Description=users Organization=hpctrain >/dev/null || true
[ -n "$(listed assoc where user="$user" account=users format=user)" ] ||
  sacctmgr -i add user "$user" Account=users DefaultAccount=users Cluster=hpctrain >/dev/null || true
[ "$(listed assoc where user="$user" account=users format=user)" = "$user" ] ||
  { echo "[slurm] could not admit $user: sacctmgr show assoc lists no association in account users" >&2; exit 1; }
echo "[slurm] $user may submit (account users)"
