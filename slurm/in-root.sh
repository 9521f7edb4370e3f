#!/usr/bin/env bash
# in-root.sh ROOTFS BINDS [--hosts FILE] COMMAND [ARG...]: run COMMAND inside the root file system
# that carries a second SLURM version (slurm/rootfs.sh), in a mount namespace of its own (gone
# with its last process) where the host's paths listed in the file BINDS (the state, the clients'
# and ranks' files: /tmp, $HOME, the clone, the Python the ranks run) are where they are on the
# host, so a job sees the same paths and runs the same Python, torch and Horovod under either
# version. --hosts FILE is that node's /etc/hosts (else the host's). The working directory is kept when it is visible.
set -euo pipefail
root=$1 binds=$2
shift 2
hosts=/etc/hosts
if [ "${1:-}" = "--hosts" ]; then hosts=$2; shift 2; fi
[ -f "$root/etc/hpctrain-slurm-root" ] || { echo "[slurm] no SLURM root file system at $root: run slurm/start.sh" >&2; exit 1; }
exec unshare --mount --propagation private bash -c '
set -e
root=$1 binds=$2 hosts=$3 cwd=$4; shift 4
for d in proc sys dev; do mount --rbind "/$d" "$root/$d"; done
mount --bind /run/munge "$root/run/munge"
for f in /etc/passwd /etc/group; do mount --bind "$f" "$root$f"; done
mount --bind "$hosts" "$root/etc/hosts"
while IFS= read -r p; do
  [ -n "$p" ] && [ -e "$p" ] || continue
  if [ -d "$p" ]; then mkdir -p "$root$p"; else mkdir -p "$root$(dirname "$p")"; [ -e "$root$p" ] || : > "$root$p"; fi
  mount --rbind "$p" "$root$p"
done < "$binds"
cd "$root"
exec chroot "$root" /bin/sh -c "cd \"\$1\" 2>/dev/null || cd /; shift; exec \"\$@\"" _ "$cwd" "$@"
' _ "$root" "$binds" "$hosts" "$PWD" "$@"
