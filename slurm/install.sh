#!/usr/bin/env bash
# Install what the local test cluster needs (Debian 12): SLURM 22.05 controller, node daemon,
# client and accounting daemon, munge for authentication, MariaDB for accounting (sacct), and an
# sshd for the tests of a cluster reached over SSH (cluster.remote; started on loopback by them).
# Idempotent: installs only what is missing. Services are NOT enabled; slurm/start.sh runs them.
# One install at a time: the test command starts both versions' clusters at once, and on a bare
# machine both found the packages missing; the second apt-get then failed on dpkg's lock (and the
# first one's exit would have removed policy-rc.d under the second's install).
set -euo pipefail
PKGS=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server util-linux iproute2 procps openssh-server)
missing() { local p; for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done; }
[ -n "$(missing)" ] || exit 0
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
LOCK=${HPCTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpctrain}/slurm-install.lock
mkdir -p "$(dirname "$LOCK")"
exec 9>"$LOCK"
flock 9
mapfile -t todo < <(missing)  # again: an install that held the lock may have done it
((${#todo[@]})) || exit 0
echo "[slurm] installing: ${todo[*]}"
# policy-rc.d 101: Debian's postinst must not start the daemons; start.sh starts them our way.
# (HPCTRAIN_POLICY_RC: elsewhere, for the test of this script, which must not touch the system's)
POLICY_RC=${HPCTRAIN_POLICY_RC:-/usr/sbin/policy-rc.d}
printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY_RC" >/dev/null
$SUDO chmod +x "$POLICY_RC"
trap '$SUDO rm -f "$POLICY_RC"' EXIT
# another apt (the setup, the system's own updates) is waited for, not failed on
APT=(-o DPkg::Lock::Timeout=600)
$SUDO apt-get "${APT[@]}" update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${APT[@]}" install -y -qq --no-install-recommends "${todo[@]}" >/dev/null
