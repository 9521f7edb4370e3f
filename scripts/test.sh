#!/usr/bin/env bash
# Set everything up (idempotent) and run the whole test suite against real mpirun and Horovod.
# Extra arguments go to pytest, e.g. scripts/test.sh -k equivalence -x
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
cd "$ROOT"
"$VENV/bin/python" -m mypy hpctrain   # the type checker is a gate, like the tests
exec "$VENV/bin/python" -m pytest "$@"
