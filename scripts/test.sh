#!/usr/bin/env bash
# Set everything up (idempotent) and run the whole test suite against real mpirun, Horovod and a
# real local SLURM cluster. Extra arguments go to pytest, e.g. scripts/test.sh -k equivalence -x
#   --quick   the daily tier: the gates, then the unit and in-process tests only (no mpirun, no
#             SLURM; about 4 minutes with the gates). CI runs everything but the GPU tier.
#   --gpu     the GPU tier, on a machine with at least one CUDA GPU: the tests marked gpu (tests/gpu),
#             those needing more GPUs than the machine has listed as not run with the count they
#             need; exits non-zero on a machine without a GPU. HPCTRAIN_PYTHON=python3 uses that
#             interpreter as it is (a GPU image with torch and the packages installed) instead of
#             setting up the virtual environment.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
cd "$ROOT"
build="" second_pid="" share=""
running() { [ -n "$1" ] && jobs -rp | grep -qx "$1"; }  # a job of this script that still runs
stop_background() {
  # At exit (a failed gate, Ctrl-C, the end), what still runs in the background: the 24.11
  # session is stopped as Ctrl-C stops it, so that its fixtures stop its cluster; the image build
  # with its process group. Only jobs that still run: an ended one's pid may be another's by now.
  if running "$second_pid"; then kill -INT "$second_pid"; wait "$second_pid" || true; fi
  if running "$build"; then kill -- "-$build"; wait "$build" || true; fi
  [ -z "$share" ] || rmdir "$share" || true
  # the sessions' idle CPU cgroups (tests/conftest.py idle_ranks_of), where a test left one
  rmdir /sys/fs/cgroup/cpu/hpctrain-tests-idle-* /sys/fs/cgroup/hpctrain-tests-idle-* 2>/dev/null || true
}
if [ "${1:-}" = "--gpu" ]; then
  shift
  PY=${HPCTRAIN_PYTHON:-}
  if [ -z "$PY" ]; then
    bash "$ROOT/scripts/setup.sh"
    PY=$VENV/bin/python
  fi
  # one import of torch, not two: what it is and whether it sees a GPU (its error, if it fails)
  if ! seen=$("$PY" -c 'import sys, torch; print("torch", torch.__version__, "CUDA", torch.version.cuda); sys.exit(not torch.cuda.is_available())' 2>&1); then
    echo "test.sh --gpu: torch sees no CUDA GPU here ($(echo "$seen" | tail -1)): run the GPU tier on a GPU node" >&2
    exit 1
  fi
  exec "$PY" -m pytest -m gpu -rs tests/gpu "$@"
fi
tier=full
select="not gpu"
if [ "${1:-}" = "--quick" ]; then
  shift
  tier=quick
  select="not mpi and not slurm and not container and not gpu"
fi
CACHE=${HPCTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpctrain}
if [ "$tier" = full ] && [ "$(id -u)" -ne 0 ]; then
  # the tests mount small tmpfs file systems (a full disk, a read-only store), start a SLURM
  # cluster's daemons and register the account in its database as root
  echo "test.sh: the full test command runs as root (sudo bash scripts/test.sh); --quick runs as any user" >&2
  exit 1
fi
if [ "$tier" = quick ]; then
  bash "$ROOT/scripts/setup.sh"
else
  HPCTRAIN_CONTAINERS=1 bash "$ROOT/scripts/setup.sh"
  # The container tests' image (cached after the first build on a machine) builds in the
  # background while the gates and the other tests run; its tests wait for it. Its own process
  # group, so that stopping it stops debootstrap and ch-image too.
  mkdir -p "$CACHE"
  setsid "$VENV/bin/hpctrain" container build > "$CACHE/container-build.out" 2>&1 &
  build=$!
  trap 'rc=$?; stop_background 2>/dev/null || true; exit $rc' EXIT
fi
# hpctrain's own modules byte-compiled once: where PYTHONDONTWRITEBYTECODE is set (as on this
# machine) every process would otherwise compile them again (about 0.1 s of CPU each; a suite
# starts some 1,500: CLIs, supervisors, ranks)
"$VENV/bin/python" -m compileall -q -j 0 hpctrain hydra_plugins tests
if [ "$tier" = full ]; then
  # Started before the gates, whose one busy core leaves the other to its start.
  # The chosen SLURM tests against SLURM 24.11 too (slurm/rootfs.sh builds its root file system once,
  # cached as the image is): a second session with its own cluster, beside the first; its report
  # follows the first's. It runs in a CPU cgroup of its own, which holds its cluster's daemons and
  # its jobs' ranks too (nice does not: slurmd and the ranks start sessions of their own, and the
  # kernel's autogroups share the CPU between sessions whatever their nice). The cgroup weighs as
  # two of the first session's sessions: that session's pytest, supervisors, daemons and SLURM
  # ranks each form an autogroup of the ordinary weight, so with four of them busy this one gets a
  # third of the CPU, and all of it when they wait. Its tests mostly wait on the scheduler, but
  # their jobs' starts need the CPU within the tests' deadlines: at an eighth of one autogroup's
  # weight, on a machine half as fast, they got (by the weights) some 3 % of it, and a 4-rank job
  # did not reach its fifth step in 5 minutes (CI, 2026-11-28: 6 of its 14 tests failed).
  cpu_share() {  # prints the cgroup directory made for it, or nothing where none can be made
    local v1=/sys/fs/cgroup/cpu v2=/sys/fs/cgroup cg
    if [ -w "$v1" ] && [ -e "$v1/cpu.shares" ]; then
      cg=$v1/hpctrain-tests-second && mkdir -p "$cg" 2>/dev/null && echo 2048 > "$cg/cpu.shares" 2>/dev/null && echo "$cg"
    elif grep -qw cpu "$v2/cgroup.subtree_control" 2>/dev/null; then
      cg=$v2/hpctrain-tests-second && mkdir -p "$cg" 2>/dev/null && echo 200 > "$cg/cpu.weight" 2>/dev/null && echo "$cg"
    fi
    return 0
  }
  second="$CACHE/test-slurm-24.11.log"
  share=$(cpu_share)
  (
    if [ -z "$share" ] || ! echo "$BASHPID" > "$share/cgroup.procs"; then
      echo "test.sh: no CPU cgroup could be made here: the 24.11 session shares the CPU as its sessions fall" >&2
    fi
    SLURM_VERSION=24.11 exec "$VENV/bin/python" -m pytest -p no:cacheprovider --durations=10 \
      -m "(slurm_versions or slurm_second or side_stream) and not gpu" "$@"
  ) > "$second" 2>&1 &
  second_pid=$!
fi
# the type checker, the linter, the formatter, the layer contract and the docs' build are gates, like the tests;
# mypy's cache lives beside the wheels, outside the clone (it checks files by hash: 28 s -> 1 s)
"$VENV/bin/python" -m mypy --cache-dir "$CACHE/mypy" hpctrain hydra_plugins
"$VENV/bin/python" -m ruff check hpctrain hydra_plugins tests scripts examples
"$VENV/bin/python" -m ruff format --check hpctrain hydra_plugins tests scripts examples
"$VENV/bin/lint-imports"
# the documentation site: the generated references current, every link and anchor resolving, the
# sample report made again by today's analysis, warnings as errors (tests/docs checks its commands)
HPCTRAIN_VENV="$VENV" bash "$ROOT/scripts/docs.sh"
if [ "$tier" = quick ]; then
  exec "$VENV/bin/python" -m pytest -n 2 --dist loadgroup --durations=30 -m "$select" "$@"
fi
# two workers: the SLURM stream and the local stream side by side (tests/conftest.py); the local
# tests that mostly wait (side_stream) run in the second session, which otherwise waits on its
# scheduler (fresh40: 541 s of them, against its 559 s of 24.11 tests and each worker's 1,600 s)
status=0
"$VENV/bin/python" -m pytest -n 2 --dist loadgroup --durations=30 -m "$select and not side_stream" "$@" || status=$?
wait $second_pid || { rc=$?; [ $rc -eq 5 ] || status=$((status ? status : rc)); }  # 5: none selected (-k)
echo "=== the SLURM tests against SLURM 24.11 (SLURM_VERSION=24.11; log: $second) ==="
cat "$second"
exit $status
