#!/usr/bin/env bash
# Install what the local test cluster needs (Debian 12): SLURM 22.05 controller, node daemon,
# client and accounting daemon, munge for authentication, MariaDB for accounting (sacct).
# Idempotent: installs only what is missing. Services are NOT enabled; slurm/start.sh runs them.
set -euo pipefail
PKGS=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server util-linux iproute2 procps)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "[slurm] installing: ${missing[*]}"
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  # policy-rc.d 101: Debian's postinst must not start the daemons; start.sh starts them our way.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
