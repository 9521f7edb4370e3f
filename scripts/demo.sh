#!/usr/bin/env bash
# Set everything up (idempotent) and run the main job: a 2-rank local Horovod training of the
# default CNN with mpirun. Extra arguments are Hydra overrides, e.g. scripts/demo.sh precision=bf16
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
cd "$ROOT"
exec "$VENV/bin/hpctrain" run cluster.ranks=2 "$@"
