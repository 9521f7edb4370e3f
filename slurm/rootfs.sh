#!/usr/bin/env bash
# Build (once) the root file system that carries SLURM 24.11 for the local test cluster: Debian 13
# (trixie) from the Debian mirror this machine's apt uses, by debootstrap, with SLURM's daemons and
# clients. The host's Open MPI (the one Horovod and mpi4py were built against, as a site's module
# would provide it) is copied in, so the ranks run the project's own Python, torch and Horovod under
# either SLURM version. Cached in $ROOTFS (a new build only when its inputs change); prints its path.
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ -n "$ROOTFS" ] || { echo "[slurm] SLURM $SLURM_VERSION runs from the host's packages: no root file system" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "slurm/rootfs.sh runs debootstrap and chroot: use sudo" >&2; exit 1; }
SUITE=trixie
PKGS=slurmctld,slurmd,slurmdbd,slurm-client,libpmix2t64,libhwloc15,libevent-core-2.1-7t64,libevent-pthreads-2.1-7t64,libudev1,zlib1g,libssl3t64,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,libreadline8t64,libncursesw6,libuuid1,libgomp1,procps,hostname
MPI_PKGS=(libopenmpi3 openmpi-common openmpi-bin)
mpi=$(dpkg-query -W -f='${Package}=${Version} ' "${MPI_PKGS[@]}" 2>/dev/null) ||
  { echo "[slurm] the host's Open MPI (${MPI_PKGS[*]}) is not installed: run scripts/setup.sh first" >&2; exit 1; }
stamp="$SUITE $PKGS $mpi v1"
if [ -f "$ROOTFS/.hpctrain-stamp" ] && [ "$(cat "$ROOTFS/.hpctrain-stamp")" = "$stamp" ]; then
  echo "$ROOTFS"; exit 0
fi
mirror=$(sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\)[[:space:]].*/\2/p' \
  /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | grep -v security | sed -n 1p || true)
[ -n "$mirror" ] || { echo "[slurm] no Debian mirror in /etc/apt/sources.list*: debootstrap needs one" >&2; exit 1; }
command -v debootstrap >/dev/null || {
  echo "[slurm] installing debootstrap"
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends debootstrap >/dev/null  # waits for another apt
}
mkdir -p "$(dirname "$ROOTFS")"
exec 8>"$ROOTFS.lock"; flock 8   # one build at a time
if [ -f "$ROOTFS/.hpctrain-stamp" ] && [ "$(cat "$ROOTFS/.hpctrain-stamp")" = "$stamp" ]; then
  echo "$ROOTFS"; exit 0
fi
new="$ROOTFS.new"; rm -rf "$new"
log="$(dirname "$ROOTFS")/rootfs-build.log"
echo "[slurm] building the SLURM $SLURM_VERSION root file system (debootstrap $SUITE, about a minute; log: $log)" >&2
# policy-rc.d 101: the packages' scripts must not start daemons in the new root
if ! debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$new" "$mirror" >"$log" 2>&1; then
  tail -n 20 "$log" >&2; echo "[slurm] debootstrap failed; the log: $log" >&2; exit 1
fi
# The host's Open MPI, file by file as its packages list them (links kept), and the alternatives'
# mpirun/mpiexec resolved; MCA components whose libraries the new root lacks are left out (Open MPI
# would warn about each one at every start)
dpkg -L "${MPI_PKGS[@]}" | grep "^/" | sort -u | while read -r f; do
  if [ -d "$f" ] && [ ! -L "$f" ]; then mkdir -p "$new$f"; else mkdir -p "$new$(dirname "$f")"; cp -a "$f" "$new$f"; fi
done
for t in mpirun mpiexec; do [ -e "/usr/bin/$t" ] && cp -L "/usr/bin/$t" "$new/usr/bin/$t"; done
cp -a /etc/openmpi "$new/etc/" 2>/dev/null || true
chroot "$new" ldconfig
for so in "$new"/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
  chroot "$new" ldd "${so#"$new"}" 2>/dev/null | grep -q "not found" && rm -f "$so"
done
# mount points for what start.sh binds from the host, and the mark that a client is inside
mkdir -p "$new/run/munge" "$new/work" "$new/home"; touch "$new/etc/hosts"
echo "$SLURM_VERSION" > "$new/etc/hpctrain-slurm-root"
rm -rf "$new/var/cache/apt/archives"/*.deb
echo "$stamp" > "$new/.hpctrain-stamp"
rm -rf "$ROOTFS"; mv "$new" "$ROOTFS"
echo "$ROOTFS"
