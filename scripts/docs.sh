#!/usr/bin/env bash
# Build the documentation site into docs/_build/html, warnings as errors (a broken link or anchor,
# a page outside the table of contents, a stale generated reference all fail it):
#   1. the reference pages are compared with what the code generates now (python -m hpctrain.docgen
#      --check; regenerate with: python -m hpctrain.docgen docs/reference)
#   2. the sample report the tutorial shows is made again from its recorded study
#   3. sphinx-build -W, every page read and written again (-E -a: a changed title reaches every
#      page's navigation)
# Extra arguments go to sphinx-build. HPCTRAIN_VENV: the environment (default .venv).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
cd "$ROOT"
"$VENV/bin/python" -m hpctrain.docgen docs/reference --check
# the sample report of tutorials/report.md, from a copy of the recorded study (analyze writes a
# summary cache beside the study it reads)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -a tests/fixtures/studies/local-strong-waits "$work/study"
rm -rf docs/_generated/report
"$VENV/bin/hpctrain" analyze "$work/study" --out docs/_generated/report > "$work/analyze.out" 2>&1 \
  || { cat "$work/analyze.out" >&2; exit 1; }
"$VENV/bin/python" -m sphinx -W --keep-going -q -E -a -b html -d docs/_build/doctrees docs docs/_build/html "$@"
echo "docs: $ROOT/docs/_build/html/index.html"
