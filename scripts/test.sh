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
  quick=(-m "not mpi and not slurm")
fi
bash "$ROOT/scripts/setup.sh"
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
cd "$ROOT"
CACHE=${HPCTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpctrain}
# the type checker, the linter, the formatter and the layer contract are gates, like the tests;
# mypy's cache lives beside the wheels, outside the clone (it checks files by hash: 28 s -> 1 s)
"$VENV/bin/python" -m mypy --cache-dir "$CACHE/mypy" hpctrain
"$VENV/bin/python" -m ruff check hpctrain tests scripts
"$VENV/bin/python" -m ruff format --check hpctrain tests scripts
"$VENV/bin/lint-imports"
# two workers: the SLURM stream and the local stream side by side (tests/conftest.py)
exec "$VENV/bin/python" -m pytest -n 2 --dist loadgroup --durations=30 "${quick[@]}" "$@"
