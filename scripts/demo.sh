#!/usr/bin/env bash
# Set everything up (idempotent) and run the main job: a 2-rank local training of the default CNN
# (Horovod with mpirun) on scikit-learn's handwritten digits, which it learns: the loss falls and the
# summary shows the accuracy on 360 digits it never trained on. Extra arguments are Hydra
# overrides, e.g. scripts/demo.sh precision=bf16
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
cd "$ROOT"
exec "$VENV/bin/hpctrain" run cluster.ranks=2 data=digits train.steps=100 "$@"
