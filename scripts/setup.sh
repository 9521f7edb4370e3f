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
# the environments a new clone may link (step 2): one per key, which covers everything that
# decides what gets installed; `setup.sh --template-key` prints it
template_key=$({
  cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh"
  "$PY" -VV
  echo "$TORCH_SPEC $HOROVOD_VERSION ${HOROVOD_GPU_OPERATIONS:-} $GPU ${HPCTRAIN_TORCH_INDEX:-} $EXTRAS ${HPCTRAIN_HOROVOD:-1}"
} | sha256sum | cut -c1-16)
template="$CACHE/venvs/$template_key"
if [ "${1:-}" = "--template-key" ]; then echo "$template_key"; exit 0; fi

# --- 1. system packages (Debian) -------------------------------------------------------------
APT_PKGS=(openmpi-bin libopenmpi-dev g++ make cmake git procps)
[ -z "$WHEELS" ] || APT_PKGS=(openmpi-bin libopenmpi3 procps)  # nothing to compile
[ -z "${HPCTRAIN_CONTAINERS:-}" ] || APT_PKGS+=(charliecloud debootstrap python3-lark)
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then missing+=(python3-venv python3-dev); fi
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

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
  if [ -n "$WHEELS" ]; then
    pip_install 'mpi4py>=4,<5'   # the wheel built against the same OpenMPI on the host
  else
    say "building mpi4py against $(mpirun --version 2>/dev/null | head -1)"
    pip_install --no-binary mpi4py 'mpi4py>=4,<5'
  fi
fi

# --- 3. Horovod, built once per (Horovod, torch, Python, GPU ops) and cached ------------------
# (asked only when a wheel is needed: each question imports torch, 1.5 s)
torch_tag() { "$VENV/bin/python" -c 'import sys, torch; print(torch.__version__.replace("+", "_"), f"cp{sys.version_info[0]}{sys.version_info[1]}", sep="_")'; }
gpu_ops=${HOROVOD_GPU_OPERATIONS:-cpu}
# Horovod's own `horovodrun --check-build` takes ~13 s; asking horovod.torch directly takes ~3 s.
nccl_check=True
[ "${gpu_ops,,}" != nccl ] || nccl_check="h.nccl_built()"
horovod_ok() {
  "$VENV/bin/python" -c "import horovod, horovod.torch as h, sys; sys.exit(not (horovod.__version__ == '$HOROVOD_VERSION' and h.mpi_built() and h.gloo_built() and $nccl_check))" >/dev/null 2>&1
}
horovod_build_failed() {
  tail -40 "$1" >&2
  echo "Horovod build failed; the end of its log is above" >&2
  if grep -q "Could NOT find CUDAToolkit" "$1"; then
    # a CUDA build of torch makes Horovod compile its CUDA parts, whatever HOROVOD_GPU_OPERATIONS says
    echo "this torch is a CUDA build ($("$VENV/bin/python" -c 'import torch; print(torch.__version__)')): Horovod's torch" \
      "extension then needs the CUDA toolkit (nvcc and libcudart): load it (e.g. module load cuda, or set" \
      "CUDA_HOME) and run setup again, or set HPCTRAIN_HOROVOD=0 to go on without Horovod" >&2
  fi
}
if [ "${gpu_ops,,}" = nccl ] && "$VENV/bin/python" -c 'import horovod.torch as h, sys; sys.exit(h.nccl_built())' >/dev/null 2>&1; then
  say "the installed Horovod has no NCCL operations and a GPU build was asked for: building one with NCCL"
fi
WITH_HOROVOD=${HPCTRAIN_HOROVOD:-1}
if [ "$WITH_HOROVOD" = 0 ]; then
  say "without Horovod (HPCTRAIN_HOROVOD=0): the torch engines run, engine=horovod is refused"
elif horovod_ok; then
  say "Horovod $HOROVOD_VERSION already installed"
else
  wheel_dir="$CACHE/wheels/horovod-${HOROVOD_VERSION}_torch-$(torch_tag)_${gpu_ops,,}"
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    say "building Horovod $HOROVOD_VERSION from source (about 8 minutes on 2 cores; cached in $wheel_dir)"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    "${PIP[@]}" download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$build"
    tar -xzf "$build"/horovod-*.tar.gz -C "$build"
    src="$build/horovod-$HOROVOD_VERSION"
    # PyTorch 2.x headers need C++17; Horovod 0.28.1 asks for C++14. Both files must change, or the
    # link fails on a duplicate gloo::rendezvous::Store::kDefaultTimeout (see shared design notes).
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" || { echo "C++17 patch did not apply" >&2; exit 1; }
    # Python 3.12 has no distutils: Python's include directory from sysconfig, `which` from shutil
    sed -i "s/from distutils.sysconfig import get_python_inc; print(get_python_inc())/import sysconfig; print(sysconfig.get_paths()['include'])/" "$src/horovod/torch/CMakeLists.txt"
    sed -i 's/^from distutils.spawn import find_executable$/from shutil import which as find_executable/' "$src/horovod/runner/js_run.py"
    ! grep -rq 'distutils' "$src/horovod/torch/CMakeLists.txt" "$src/horovod/runner/js_run.py" || { echo "distutils patch did not apply" >&2; exit 1; }
    mkdir -p "$wheel_dir.tmp"
    (cd "$src" && HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        MAKEFLAGS="-j$(nproc)" \
        "$VENV/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$wheel_dir.tmp" . ) \
        > "$build/build.log" 2>&1 || { horovod_build_failed "$build/build.log"; exit 1; }
    rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"   # publish the cache entry atomically
  fi
  say "installing cached Horovod wheel from $wheel_dir"
  pip_install --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
  pip_install "$wheel_dir"/horovod-*.whl  # its own requirements (psutil, cloudpickle, ...)
fi
# Re-install hpctrain only when its dependencies changed (or the venv serves another clone).
stamp="$VENV/.hpctrain-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16) $ROOT"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if [ -n "$cloned" ]; then  # its dependencies came with the environment: only hpctrain itself
    say "installing hpctrain (editable)"
    "${PIP[@]}" install --no-compile --no-deps --no-build-isolation -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  else
    say "installing hpctrain (editable) and its dependencies"
    pip_install --no-build-isolation -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  fi
  echo "$want" > "$stamp"
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
[ "$WITH_HOROVOD" = 0 ] || [ -z "$installed" ] || horovod_ok || { echo "Horovod $HOROVOD_VERSION with PyTorch, MPI and Gloo${GPU:+ and NCCL} is not importable from $VENV" >&2; exit 1; }
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
