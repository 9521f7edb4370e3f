#!/usr/bin/env bash
# Set everything up (idempotent) and run the whole test suite against real mpirun, Horovod and a
# real local SLURM cluster. Extra arguments go to pytest, e.g. scripts/test.sh -k equivalence -x
#   --quick   the daily tier: the gates, then the unit and in-process tests only (no mpirun, no
#             SLURM; about 2 minutes). CI runs everything.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
quick=()
if [ "${1:-}" = "--quick" ]; then
  shift
  quick=(-m "not mpi and not slurm and not container")
fi
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
cd "$ROOT"
CACHE=${HPCTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpctrain}
if ((${#quick[@]})); then
  bash "$ROOT/scripts/setup.sh"
else
  HPCTRAIN_CONTAINERS=1 bash "$ROOT/scripts/setup.sh"
  # The container tests' image (cached after the first build on a machine) builds in the
  # background while the gates and the other tests run; its tests wait for it. Its own process
  # group, so that stopping it stops debootstrap and ch-image too.
  mkdir -p "$CACHE"
  setsid "$VENV/bin/hpctrain" container build > "$CACHE/container-build.out" 2>&1 &
  build=$!
  trap 'kill -- -$build 2>/dev/null || true; wait $build 2>/dev/null || true' EXIT
fi
# the type checker, the linter, the formatter and the layer contract are gates, like the tests;
# mypy's cache lives beside the wheels, outside the clone (it checks files by hash: 28 s -> 1 s)
"$VENV/bin/python" -m mypy --cache-dir "$CACHE/mypy" hpctrain
"$VENV/bin/python" -m ruff check hpctrain tests scripts
"$VENV/bin/python" -m ruff format --check hpctrain tests scripts
"$VENV/bin/lint-imports"
# two workers: the SLURM stream and the local stream side by side (tests/conftest.py)
"$VENV/bin/python" -m pytest -n 2 --dist loadgroup --durations=30 "${quick[@]}" "$@"
