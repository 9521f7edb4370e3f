#!/usr/bin/env bash
# Sets up everything hpctrain needs on a bare Debian 12 machine: system packages, a virtual
# environment, torch, mpi4py, submitit, hydra-core and a Horovod wheel built from source.
# Idempotent: a second run only checks, and takes seconds (the Horovod wheel is cached).
#
# Environment knobs:
#   HPCTRAIN_VENV   where the virtual environment lives        (default: <repo>/.venv)
#   HPCTRAIN_CACHE  where built wheels are kept across clones  (default: ~/.cache/hpctrain)
#   HPCTRAIN_TORCH  the torch requirement                      (default: torch==2.13.0, CPU here)
#   HPCTRAIN_GPU=1  a GPU install: a CUDA build of torch (from HPCTRAIN_TORCH_INDEX, PyTorch's CUDA
#                   wheel index for the nodes' CUDA version) and Horovod built with NCCL
#                   (HOROVOD_GPU_OPERATIONS=NCCL; the cache key then includes "nccl"). An existing
#                   environment is checked against the request: a CPU torch or a Horovod without
#                   NCCL is replaced, and each change is said.
#   HPCTRAIN_WHEELS install offline from this directory of wheels (a container build: every
#                   dependency prebuilt on the host, mpi4py and Horovod included; no compilers)
#   HPCTRAIN_EXTRAS the extras of hpctrain to install (default: dev; empty: none)
#   HPCTRAIN_HOROVOD=0  no Horovod: the torch engines (DDP, FSDP, pipelines over DDP) only; engine=horovod
#                   is then refused with the fix. For an interpreter or torch Horovod does not build with.
#   HPCTRAIN_CONTAINERS=1  also Charliecloud and debootstrap, to build and run the training image
#                   (hpctrain container build; ch-image runs on Debian's python3 with python3-lark)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HPCTRAIN_VENV:-$ROOT/.venv}
CACHE=${HPCTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpctrain}
TORCH_SPEC=${HPCTRAIN_TORCH:-torch==2.13.0}
HOROVOD_VERSION=0.28.1
PY=${PYTHON:-python3}
WHEELS=${HPCTRAIN_WHEELS:-}
EXTRAS=${HPCTRAIN_EXTRAS-dev}
if [ -n "$WHEELS" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS"; fi
GPU=${HPCTRAIN_GPU:-}
if [ -n "$GPU" ]; then export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}; fi

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
# What of pyproject.toml decides what gets installed: the build system, the project (its
# dependencies, extras, entry points) and setuptools' settings; not the tools' own sections (pytest's
# markers, ruff's rules), whose edits would otherwise build the environment again (two minutes).
# The whole file where this Python has no tomllib (before 3.11).
requirements() {
  "$PY" - "$ROOT/pyproject.toml" 2>/dev/null <<'PYEOF' || cat "$ROOT/pyproject.toml"
import json, sys, tomllib
with open(sys.argv[1], "rb") as f:
    d = tomllib.load(f)
print(json.dumps([d.get("build-system"), d.get("project"), d.get("tool", {}).get("setuptools")], sort_keys=True))
PYEOF
}
# the environments a new clone may link (step 2): one per key, which covers everything that
# decides what gets installed; `setup.sh --template-key` prints it
template_key=$({
  requirements
  cat "$ROOT/scripts/setup.sh"
  "$PY" -VV
  echo "$TORCH_SPEC $HOROVOD_VERSION ${HOROVOD_GPU_OPERATIONS:-} $GPU ${HPCTRAIN_TORCH_INDEX:-} $EXTRAS ${HPCTRAIN_HOROVOD:-1}"
} | sha256sum | cut -c1-16)
template="$CACHE/venvs/$template_key"
if [ "${1:-}" = "--template-key" ]; then echo "$template_key"; exit 0; fi

# --- 1. system tools ---------------------------------------------------------------------------
# Checked as commands, not packages: on a cluster's login node MPI, compilers and CMake come from
# environment modules (module load openmpi gcc cmake). Missing ones are installed only on
# Debian/Ubuntu as root or with passwordless sudo; elsewhere they are named with where clusters
# keep them, and setup goes on with what it can do (without mpicc: mpi4py's wheel, Horovod without
# MPI or none).
declare -A DEB=([mpirun]=openmpi-bin [mpicc]=libopenmpi-dev [c++]=g++ [make]=make [cmake]=cmake [git]=git [ps]=procps)
declare -A MODULE=([mpirun]="module load openmpi" [mpicc]="module load openmpi" [c++]="module load gcc"
  [make]="your OS's make" [cmake]='module load cmake, or pip install "cmake<4"' [git]="module load git"
  [ps]="your OS's procps")
TOOLS=(mpirun mpicc c++ make cmake git ps)
[ -z "$WHEELS" ] || TOOLS=(mpirun ps)  # nothing to compile
[ -z "${HPCTRAIN_CONTAINERS:-}" ] || { TOOLS+=(ch-image debootstrap); DEB[ch-image]=charliecloud; DEB[debootstrap]=debootstrap
  MODULE[ch-image]="module load charliecloud"; MODULE[debootstrap]="your OS's debootstrap"; }
missing=()
for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
[ -z "${HPCTRAIN_CONTAINERS:-}" ] || /usr/bin/python3 -c 'import lark' >/dev/null 2>&1 || { missing+=(lark); DEB[lark]=python3-lark; MODULE[lark]="Debian's python3-lark"; }
"$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || { missing+=(venv); DEB[venv]="python3-venv python3-dev"; MODULE[venv]="module load python (a Python with venv)"; }
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
if ((${#missing[@]})) && [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1 &&
   { [ -z "$SUDO" ] || sudo -n true 2>/dev/null; }; then
  pkgs=(); for t in "${missing[@]}"; do pkgs+=(${DEB[$t]}); done
  say "installing Debian packages: ${pkgs[*]}"
  # another apt (the system's own updates, a cluster's install) is waited for, not failed on
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  missing=()
fi
for t in "${missing[@]}"; do say "missing: $t (${MODULE[$t]}); going on without it"; done
has() { command -v "$1" >/dev/null 2>&1; }
[[ " ${missing[*]} " != *" venv "* ]] || { echo "this Python ($PY) cannot make a virtual environment: ${MODULE[venv]}, or set PYTHON" >&2; exit 1; }

# --- 2. virtual environment and Python packages ----------------------------------------------
# A new clone's environment is this machine's last one for the same requirements (the template
# key above), hard-linked (cp -al: 39,000 files in 0.6 s, no space taken) instead of installed
# and byte-compiled again (a minute on 2 cores). Hard links are safe as pip uses them: it removes
# and writes files, it never edits one in place.
clone_venv() {
  "$PY" -m venv --without-pip "$VENV" && cp -al "$template/lib/." "$VENV/lib/" || return 1
  local f name
  for f in "$template/bin"/*; do
    name=${f##*/}
    [ -e "$VENV/bin/$name" ] && continue  # python, activate: the new environment's own
    if head -n 1 "$f" | grep -q '^#!.*python'; then  # a console script: run by this environment
      sed "1s|^#!.*|#!$VENV/bin/python|" "$f" > "$VENV/bin/$name" && chmod +x "$VENV/bin/$name" || return 1
    else
      cp -al "$f" "$VENV/bin/$name" || return 1  # a binary (ruff, py-spy)
    fi
  done
}
cloned=
if [ ! -x "$VENV/bin/python" ] && [ -z "$WHEELS" ] && [ -d "$template/bin" ]; then
  say "creating virtual environment $VENV from this machine's last one for the same requirements"
  if clone_venv; then cloned=1; else rm -rf "$VENV"; say "could not link $template: installing"; fi
fi
created=
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
  created=1
fi
PIP=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)
# pip byte-compiles what it installs in one process: pip_install() leaves that to one compileall on
# every core at the end (torch and the dependencies: 87 s -> 64 s on 2 cores)
installed=
pip_install() { installed=1; "${PIP[@]}" install --no-compile "$@"; }
if [ -n "$GPU" ] && "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' >/dev/null 2>&1; then
  # a GPU install asked for on an environment whose torch is a CPU build: replace it
  [ -n "${HPCTRAIN_TORCH_INDEX:-}" ] || { echo "HPCTRAIN_GPU=1 needs HPCTRAIN_TORCH_INDEX: PyTorch's CUDA wheel index for your CUDA version" >&2; exit 1; }
  say "torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') is a CPU build; replacing it with $TORCH_SPEC from $HPCTRAIN_TORCH_INDEX"
  pip_install --force-reinstall --no-deps --index-url "$HPCTRAIN_TORCH_INDEX" "$TORCH_SPEC"
fi
if ! "$VENV/bin/python" -c 'import torch, mpi4py' >/dev/null 2>&1; then
  say "installing $TORCH_SPEC and build tools"
  pip_install --upgrade pip setuptools wheel packaging
  if [ -n "$GPU" ]; then
    [ -n "${HPCTRAIN_TORCH_INDEX:-}" ] || { echo "HPCTRAIN_GPU=1 needs HPCTRAIN_TORCH_INDEX: PyTorch's CUDA wheel index for your CUDA version" >&2; exit 1; }
    pip_install --index-url "$HPCTRAIN_TORCH_INDEX" "$TORCH_SPEC"
  fi
  pip_install "$TORCH_SPEC" numpy
  # mpi4py is built against the system OpenMPI so that it and Horovod share one MPI library.
  if [ -n "$WHEELS" ] || ! has mpicc; then
    pip_install 'mpi4py>=4,<5'   # a wheel (the host's own in a container build)
  else
    say "building mpi4py against $(mpirun --version 2>/dev/null | head -1)"
    pip_install --no-binary mpi4py 'mpi4py>=4,<5'
  fi
fi

# Re-install hpctrain only when its dependencies changed (or the venv serves another clone). The
# checkout goes on the import path as it is (setuptools' compat mode: a .pth), so Hydra finds the
# hydra_plugins namespace there, which the import hook of its default editable mode hides.
COMPAT="--config-settings editable_mode=compat"
stamp="$VENV/.hpctrain-installed"
want="$(requirements | sha256sum | cut -c1-16) $ROOT"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if [ -n "$cloned" ]; then  # its dependencies came with the environment: only hpctrain itself
    say "installing hpctrain (editable)"
    "${PIP[@]}" install --no-compile --no-deps --no-build-isolation $COMPAT -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  else
    say "installing hpctrain (editable) and its dependencies"
    pip_install --no-build-isolation $COMPAT -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  fi
  echo "$want" > "$stamp"
fi
# --- 3. Horovod: `hpctrain install horovod` builds it for this environment (patched for PyTorch 2
# and Python 3.12) once per (Horovod, torch, Python, GPU ops), cached in $CACHE/wheels ----------
gpu_ops=${HOROVOD_GPU_OPERATIONS:-cpu}
# Horovod's own `horovodrun --check-build` takes ~13 s; asking horovod.torch directly takes ~3 s.
nccl_check=True
[ "${gpu_ops,,}" != nccl ] || nccl_check="h.nccl_built()"
horovod_ok() {
  "$VENV/bin/python" -c "import horovod, horovod.torch as h, sys; sys.exit(not (horovod.__version__ == '$HOROVOD_VERSION' and h.gloo_built() and $nccl_check))" >/dev/null 2>&1
}
WITH_HOROVOD=${HPCTRAIN_HOROVOD:-1}
if [ "$WITH_HOROVOD" = 0 ]; then
  say "without Horovod (HPCTRAIN_HOROVOD=0): the torch engines run, engine=horovod is refused"
elif horovod_ok; then
  say "Horovod $HOROVOD_VERSION already installed"
elif [ -z "$WHEELS" ] && ! { has c++ && has cmake; } &&
     ! "$VENV/bin/hpctrain" install horovod --dry-run 2>/dev/null | grep -q ": cached in"; then
  WITH_HOROVOD=0  # nothing cached to install, nothing to build it with: go on with the torch engines
  say "Horovod not built: it needs a C++ compiler and cmake (module load gcc cmake), then: hpctrain install horovod"
else
  installed=1
  HPCTRAIN_CACHE=$CACHE "$VENV/bin/hpctrain" install horovod ${GPU:+--gpu nccl} || exit 1
fi

if [ -n "$installed" ]; then
  # Where PYTHONDONTWRITEBYTECODE is set, nothing would ever write these: every process would
  # compile torch again. A file no Python 3 parses (a package's template) is no reason to stop.
  # Not the packages no hpctrain process imports (pip and setuptools run at setup, scikit-learn
  # only holds the digits data file, SciPy and NetworkX come with it and with torch): a quarter of
  # the files, 27 s -> 22 s on 2 cores.
  say "byte-compiling the installed packages"
  "$VENV/bin/python" -m compileall -q -j 0 -x '/site-packages/(pip|setuptools|sklearn|scipy|networkx)/' \
    "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null 2>&1 || true
fi
[ "$WITH_HOROVOD" = 0 ] || [ -z "$installed" ] || horovod_ok || { echo "Horovod $HOROVOD_VERSION with PyTorch and Gloo${GPU:+ and NCCL} is not importable from $VENV" >&2; exit 1; }
if [ -n "$GPU" ]; then
  "$VENV/bin/python" - <<'PY'
import torch
where = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
if torch.cuda.is_available():
    print(f"[setup] {where} sees {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
else:
    print(f"[setup] {where} sees no GPU on this machine (a login node?): the ranks will see theirs on the GPU nodes")
PY
fi
if [ -n "$created" ] && [ -z "$WHEELS" ] && [ ! -d "$template" ]; then
  # an environment this run installed from nothing (none other: it may hold what the user added)
  # becomes the one later clones link, published whole or not at all; the oldest beyond two
  # are dropped: a clone holds its own links, whatever happens to these
  mkdir -p "$CACHE/venvs"
  tmp=$(mktemp -d "$template.XXXX") && chmod 755 "$tmp"
  if cp -al "$VENV/lib" "$VENV/bin" "$tmp/" 2>/dev/null && mv -T "$tmp" "$template" 2>/dev/null; then
    ls -1dt "$CACHE"/venvs/*/ | tail -n +3 | xargs -r rm -rf
  else
    rm -rf "$tmp"
  fi
fi
say "ready: $VENV (activate with: source $VENV/bin/activate)"
