#!/usr/bin/env bash
# Start a real SLURM cluster on this machine: munge, a private MariaDB, slurmdbd, slurmctld and
# $NODES slurmd daemons (n1..nN), each in its own UTS+mount namespace with its own host name.
# Waits until every node is idle. Idempotent: a running cluster is left as it is.
# Use it:  . slurm/env.sh; sinfo        Stop it:  bash slurm/stop.sh
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=procs.sh
. "$(dirname "${BASH_SOURCE[0]}")/procs.sh"
[ "$(id -u)" -eq 0 ] || { echo "slurm/start.sh runs the daemons as root: use sudo" >&2; exit 1; }
bash "$SLURM_DIR/install.sh"
# The 24.11 cluster: its root file system (built once, cached), its clients first on PATH, and its
# daemons started inside it (in_root); 22.05's run from the host's packages.
if [ -n "$ROOTFS" ]; then
  bash "$SLURM_DIR/rootfs.sh" >/dev/null
  export PATH="$SLURM_BIN:$PATH"
  in_root() { "$SLURM_DIR/in-root.sh" "$ROOTFS" "$STATE/etc/binds" "$@"; }
  SBIN=/usr/sbin/
else
  in_root() { "$@"; }
  SBIN=
fi
say() { printf '\033[1m[slurm]\033[0m %s\n' "$*"; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "[slurm] timed out after ${limit}s waiting for $what; logs in $STATE/log" >&2
  local f pid
  for f in "$STATE"/run/*.pid; do  # which daemon is gone
    [ -f "$f" ] && pid=$(cat "$f") && ! kill -0 "$pid" 2>/dev/null &&
      echo "[slurm] $(basename "$f" .pid) (pid $pid) is not running" >&2
  done
  for f in "$STATE"/log/*.log; do  # what this start's daemons wrote (not the last cluster's last words)
    [ -f "$f" ] || continue
    echo "--- $f, since this start:" >&2
    tail -c +"$(( ${LOG_AT[$f]:-0} + 1 ))" "$f" | tail -n 15 >&2
  done
  exit 1
}
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ours() {  # ours PID...: those started for this cluster (their SLURM_CONF is ours), not another's
  local pid
  for pid in "$@"; do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF" && echo "$pid"
  done
  return 0
}
settled() {  # settled WHAT PATTERN: no daemon of an earlier run of this cluster still exiting (pgrep
  # -f PATTERN); waits 15 s for one (a stop that has just returned), then names it and stops
  local what=$1 pids
  for _ in $(seq 75); do
    # shellcheck disable=SC2046
    pids=$(ours $(live "$2"))
    [ -z "$pids" ] && return 0
    sleep 0.2
  done
  echo "[slurm] $what of an earlier cluster still runs (pid $(echo $pids)): stop it first (bash slurm/stop.sh)" >&2
  exit 1
}
accounting_down() {  # accounting_down WHY: what does not answer, the daemons' last words, the fix
  echo "[slurm] the cluster's accounting does not answer: $1" >&2
  tail -n 5 "$STATE/log/slurmdbd.log" "$STATE/log/mariadb.log" >&2 2>/dev/null || true
  echo "[slurm] fix: if the database was damaged (a disk that filled up), start afresh with" \
    "bash slurm/stop.sh --purge && bash slurm/start.sh" >&2
  exit 1
}

mkdir -p "$STATE"/{etc,ctld,run,log,tmp,spool,mysql}
declare -A LOG_AT  # each log's size before this start: a failure shows only what came after
for f in "$STATE"/log/*.log; do [ -f "$f" ] && LOG_AT[$f]=$(stat -c %s "$f"); done
# One start (or stop) at a time: two test sessions, or a developer and a test session, that start
# the cluster together would otherwise both see a daemon missing and both start it.
exec 9>"$STATE.lock"
flock 9   # (the daemons started below do not inherit it: 9>&-)
last=$(cat "$STATE.next-job-id" 2>/dev/null || echo 1000)  # job ids never restart at 1
nodes_range="n[1-$NODES]"; ports="[$((NODE_PORT + 1))-$((NODE_PORT + NODES))]"
sed -e "s|@STATE@|$STATE|g" -e "s|@NODE_RANGE@|$nodes_range|g" -e "s|@PORTS@|$ports|g" \
    -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@ACCOUNTING@|$SLURM_ACCOUNTING|g" \
    -e "s|@CPUS@|$CPUS|g" -e "s|@FIRST_JOB_ID@|$last|g" "$SLURM_DIR/slurm.conf.in" > "$STATE/etc/slurm.conf"
sed -e "s|@STATE@|$STATE|g" -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" "$SLURM_DIR/slurmdbd.conf.in" > "$STATE/etc/slurmdbd.conf"
chmod 600 "$STATE/etc/slurmdbd.conf"   # slurmdbd refuses a readable password file
cp /etc/slurm/plugstack.conf "$STATE/etc/" 2>/dev/null || true
# Every node resolves every node name (all of them live on 127.0.0.1).
{ cat /etc/hosts; echo "127.0.0.1 $(seq -f 'n%g' -s ' ' 1 "$NODES")"; } > "$STATE/etc/hosts"
for i in $(seq 1 "$NODES"); do mkdir -p "$STATE/tmp/n$i" "$STATE/spool/n$i"; done
if [ -n "$ROOTFS" ]; then
  # what a job reaches on the host, at the same paths, as a cluster's shared file systems are on
  # every node: every top-level directory but the system's own (so /tmp, /root, /home, /work, the
  # clone wherever it is), and the Python the virtual environment was made from where it is the
  # system's (/usr/bin/python3.X and its library)
  py=$(python3 -c 'import sys, sysconfig; print(sys.base_prefix, sys.executable, sysconfig.get_path("stdlib"))' 2>/dev/null || true)
  { for d in /*/; do
      case "${d%/}" in /bin|/boot|/dev|/etc|/lib|/lib32|/lib64|/libx32|/lost+found|/proc|/run|/sbin|/sys|/usr|/var) ;;
        *) [ -L "${d%/}" ] || echo "${d%/}" ;; esac
    done
    case "$py" in /usr\ *) tr ' ' '\n' <<<"${py#/usr }" ;; esac
    echo "$HOME"; (cd "$SLURM_DIR/.." && pwd)  # wherever they are
  } | sort -u > "$STATE/etc/binds"
  mkdir -p "$SLURM_BIN"
  for tool in sbatch srun salloc squeue sacct sacctmgr scontrol sinfo scancel sstat sattach sprio sshare sdiag; do
    printf '#!/bin/sh\n# SLURM %s: the command of its root file system (inside a job, it is there already)\n[ -e /etc/hpctrain-slurm-root ] && exec /usr/bin/%s "$@"\nexec %q %q %q /usr/bin/%s "$@"\n' \
      "$SLURM_VERSION" "$tool" "$SLURM_DIR/in-root.sh" "$ROOTFS" "$STATE/etc/binds" "$tool" > "$SLURM_BIN/$tool"
    chmod +x "$SLURM_BIN/$tool"
  done
fi

# munge: authentication between all daemons and clients
if [ -z "$(live '(^|/)munged( |$)')" ]; then
  say "starting munged"
  mkdir -p /run/munge && chown munge:munge /run/munge
  [ -f /etc/munge/munge.key ] || { mungekey --create >/dev/null 2>&1 || /usr/sbin/create-munge-key -f; chown munge:munge /etc/munge/munge.key; }
  runuser -u munge -- /usr/sbin/munged 9>&-
  touch "$MUNGED_OURS"   # stop.sh stops only a munged that start.sh started
fi
wait_for 10 munge bash -c 'munge -n | unmunge'

start_accounting() {  # MariaDB, slurmdbd, the cluster registered in it
  # MariaDB, private to the cluster, on 127.0.0.1:$DB_PORT
  DB_SOCK="$STATE/run/mysql.sock"
  if ! alive "$STATE/run/mariadb.pid"; then
    if [ ! -d "$STATE/mysql/mysql" ]; then
      say "initialising MariaDB in $STATE/mysql"
      mariadb-install-db --datadir="$STATE/mysql" --user=root --auth-root-authentication-method=socket \
        --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1
    fi
    say "starting MariaDB"
    nohup mariadbd --datadir="$STATE/mysql" --socket="$DB_SOCK" --port="$DB_PORT" --bind-address=127.0.0.1 \
      --user=root --pid-file="$STATE/run/mariadb.pid" --log-error="$STATE/log/mariadb.log" \
      --skip-name-resolve --innodb-buffer-pool-size=64M >/dev/null 2>&1 9>&- &
  fi
  wait_for 60 MariaDB mariadb --socket="$DB_SOCK" -uroot -e 'select 1'
  mariadb --socket="$DB_SOCK" -uroot -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"

  # slurmdbd, then register the cluster (once)
  if ! alive "$STATE/run/slurmdbd.pid"; then
    settled slurmdbd "^${SBIN}slurmdbd( |\$)"
    say "starting slurmdbd"
    in_root "${SBIN}slurmdbd" 9>&-
  fi
  # slurmdbd answering but refused by its database (MariaDB answered above) will not get better by
  # waiting: say so after 10 s instead of waiting out the minute
  dbd_up=false
  for i in $(seq 300); do
    dbd=$(sacctmgr -n show cluster 2>&1) && { dbd_up=true; break; }
    if [ "$i" -ge 50 ] && grep -q "Unable to connect to database" <<<"$dbd"; then
      accounting_down "slurmdbd runs but cannot reach its database: $(grep -m1 'error' <<<"$dbd")"
    fi
    sleep 0.2
  done
  $dbd_up || accounting_down "slurmdbd did not answer within 60 s"
  sacctmgr -i -n show cluster format=cluster | grep -qw hpctrain || sacctmgr -i add cluster hpctrain >/dev/null
}
[ "$SLURM_ACCOUNTING" = none ] || start_accounting

# slurmctld
fresh_ctld=false
if ! alive "$STATE/run/slurmctld.pid"; then
  fresh_ctld=true
  settled slurmctld "^${SBIN}slurmctld -f $SLURM_CONF\$"
  say "starting slurmctld"
  in_root "${SBIN}slurmctld" -f "$SLURM_CONF" 9>&-
fi
wait_for 60 slurmctld scontrol ping

# slurmd n1..nN, each with its own host name and /etc/hosts (OpenMPI's shared-memory transport
# crashes across "nodes" that share one host name).
for i in $(seq 1 "$NODES"); do
  if ! alive "$STATE/run/slurmd-n$i.pid"; then
    settled "slurmd of n$i" "^${SBIN}slurmd -N n$i -f $SLURM_CONF\$"
    if [ -n "$ROOTFS" ]; then
      unshare --uts bash -c "hostname n$i && exec $(printf '%q ' "$SLURM_DIR/in-root.sh" "$ROOTFS" \
        "$STATE/etc/binds" --hosts "$STATE/etc/hosts") /usr/sbin/slurmd -N n$i -f $SLURM_CONF" 9>&-
    else
      unshare --uts --mount --propagation private bash -c \
        "hostname n$i && mount --bind '$STATE/etc/hosts' /etc/hosts && exec slurmd -N n$i -f '$SLURM_CONF'" 9>&-
    fi
  fi
done
# A controller started now recovers its nodes' saved states: a drain an earlier session left (a
# test that ended before restoring its node, "Duplicate jobid" after a starved controller launched
# a job twice) would keep the node out forever. The nodes are processes on this machine, not
# hardware that needs a look: resumed, and said. (While the controller runs, a drain is a test's.)
if $fresh_ctld; then
  drained=$(sinfo -h -N -t drain -o '%N' | sort -u | paste -sd, -)
  if [ -n "$drained" ]; then
    say "resuming $drained, drained by an earlier session ($(sinfo -h -R -o '%E' | sort -u | paste -sd';' -))"
    scontrol update NodeName="$drained" State=RESUME
  fi
fi
# Every node registered and answering: idle, or running jobs (mix, alloc, comp) when the cluster
# was already up or recovered jobs on restart. A node that stays down, drained or not responding
# (a trailing *) is a failure. (sinfo -N lists a node once per partition: count distinct names.)
all_up() {
  [ "$(sinfo -h -N -o '%N %t' | awk '$2 !~ /^(idle|mix|alloc|comp)$/' | wc -l)" -eq 0 ] &&
    [ "$(sinfo -h -N -o '%N' | sort -u | wc -l)" -eq "$NODES" ]
}
wait_for 60 "every node to answer (sinfo -N shows their states)" all_up
# accounting must answer a real query, not only the daemon's ping: slurmdbd keeps running (and
# sacctmgr answers from its cache) while its database is down, and then every sacct fails
accounting_ok() { sacct -n -X -S now-1minutes -o JobID >/dev/null 2>&1; }
if [ "$SLURM_ACCOUNTING" != none ]; then
  for _ in $(seq 150); do accounting_ok && break; sleep 0.2; done
  accounting_ok || accounting_down "sacct says: $(sacct -n -X -S now-1minutes 2>&1 | head -1)"
fi
say "SLURM $SLURM_VERSION cluster up${ROOTFS:+ (from $ROOTFS)}, accounting: $SLURM_ACCOUNTING: $(sinfo -h -p debug -o '%D nodes %T (%N)' | tr '\n' ' ')"
say "use it with: ${ROOTFS:+SLURM_VERSION=$SLURM_VERSION }. slurm/env.sh   (SLURM_CONF=$SLURM_CONF)"
