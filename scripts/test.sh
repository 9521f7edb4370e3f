#!/usr/bin/env bash
# Set everything up (idempotent) and run the whole test suite against real mpirun and Horovod.
# Extra arguments go to pytest, e.g. scripts/test.sh -k equivalence -x
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
cd "$ROOT"
# the type checker, the linter and the formatter are gates, like the tests
"$VENV/bin/python" -m mypy hpctrain
"$VENV/bin/python" -m ruff check hpctrain tests
"$VENV/bin/python" -m ruff format --check hpctrain tests
exec "$VENV/bin/python" -m pytest "$@"
