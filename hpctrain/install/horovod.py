"""`hpctrain install horovod`: Horovod 0.28.1 (its last release, source only) built for the active
environment, as any user, and cached per user.

The release does not build as shipped against PyTorch 2 or Python 3.12: its CMake files ask for
C++14 where PyTorch's headers need C++17 (both files, or the link fails on a duplicate
`gloo::rendezvous::Store::kDefaultTimeout`), and two files import `distutils`, which 3.12 dropped.
`plan` (pure) decides what to build from what was found; `patch_tree` applies the patches, each
checked; `build` runs pip, the only side effect besides the cache. The wheel is cached under
`<cache>/wheels/horovod-<version>_torch-<torch>_<python>_<gpu ops>[_gloo-only]/` (with MPI: the
key scripts/setup.sh has always used), so a second environment with the same torch and Python
installs in seconds; only this version's wheel for this Python is installed from it."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import HpctrainError
from hpctrain.install.wheel_cache import verified, write_manifest

VERSION = "0.28.1"
BUILD_TOOLS = ("setuptools", "wheel", "packaging")  # --no-build-isolation: the sdist has no pyproject

Say = Callable[[str], None]


class InstallError(HpctrainError):
    exit_code = 3


@dataclass(frozen=True)
class Found:
    """What the environment offers (facts, gathered by `look`)."""

    python: str  # cp311
    torch: str | None  # 2.13.0, 2.11.0+cu130; None: not importable
    torch_cuda: str | None  # the CUDA version torch was built for
    cxx: str | None  # a C++ compiler's path
    cmake: str | None
    mpicxx: str | None  # MPI's compiler wrapper (mpicxx/mpicc): Horovod's MPI controller needs it
    nvcc: str | None
    installed: str | None  # the importable Horovod's version with its controllers, e.g. "0.28.1 mpi gloo"


@dataclass(frozen=True)
class Plan:
    """What `build` does, and why (what `--dry-run` prints)."""

    wheel_dir: Path
    env: dict[str, str]  # HOROVOD_* build switches
    python: str = "cp311"  # the wheel's Python tag
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # what a build needs and this environment lacks

    def buildable(self) -> None:
        """InstallError naming each missing tool and where clusters keep it (a cached wheel needs none)."""
        if self.missing:
            raise InstallError("cannot build Horovod here; missing:\n  - " + "\n  - ".join(self.missing))

    @property
    def cached(self) -> bool:
        return self.wheel() is not None

    def wheel(self) -> Path | None:
        """The cached wheel of this version for this plan's Python that its manifest vouches for
        (wheel_cache.py): chosen by name, never by the highest version, so a planted horovod-9.9.9
        or another Python's is never installed; None (build it) for anything else."""
        return self.cache_state()[0]

    def cache_state(self) -> tuple[Path | None, str]:
        """wheel(), and why a wheel in the cache is not it ("" when there is none)."""
        return verified(self.wheel_dir, f"horovod-{VERSION}-{self.python}-{self.python}-*.whl", self.env)


# --- pure: patches -----------------------------------------------------------------------------
# (file, old, new): each must apply, or the sdist is not the one these were written for
PATCHES: tuple[tuple[str, str, str], ...] = (
    ("CMakeLists.txt", "CMAKE_CXX_STANDARD 14", "CMAKE_CXX_STANDARD 17"),
    ("horovod/torch/CMakeLists.txt", "CMAKE_CXX_STANDARD 14", "CMAKE_CXX_STANDARD 17"),
    (
        "horovod/torch/CMakeLists.txt",
        "from distutils.sysconfig import get_python_inc; print(get_python_inc())",
        "import sysconfig; print(sysconfig.get_paths()['include'])",
    ),
    (
        "horovod/runner/js_run.py",
        "from distutils.spawn import find_executable\n",
        "from shutil import which as find_executable\n",
    ),
)


def patched(rel: str, text: str) -> str:
    """`text` of the sdist's file `rel` with every patch for it applied; InstallError if one finds
    nothing to change."""
    for name, old, new in PATCHES:
        if name != rel:
            continue
        if old not in text:
            raise InstallError(
                f"Horovod {VERSION}'s {rel} has no {old.strip()!r}: not the sdist these patches fit"
            )
        text = text.replace(old, new)
    return text


def patch_tree(src: Path) -> None:
    for rel in dict.fromkeys(name for name, _, _ in PATCHES):
        path = src / rel
        path.write_text(patched(rel, path.read_text()))


# --- pure: the plan ----------------------------------------------------------------------------
def torch_tag(found: Found) -> str:
    return f"{(found.torch or '?').replace('+', '_')}_{found.python}"


def plan(found: Found, gpu: str, cache: Path, env: Mapping[str, str] = os.environ) -> Plan:
    """The build for this environment. `gpu`: auto (NCCL where torch is a CUDA build and nvcc is
    found), nccl or none. What a build would lack is listed in `missing`, with where clusters keep it."""
    missing = []
    if found.torch is None:
        missing.append("torch is not importable in this environment: pip install torch (before Horovod)")
    if found.cxx is None:
        missing.append("a C++ compiler (c++ or g++ on PATH, or CXX): `module load gcc`, or your OS's g++")
    if found.cmake is None:
        missing.append(
            'cmake 3.13 to 3.x: `module load cmake`, or `pip install "cmake<4"` (CMake 4 rejects Gloo)'
        )
    if gpu == "nccl" and found.torch is not None and found.torch_cuda is None:
        missing.append(
            f"--gpu nccl needs a CUDA build of torch; this one ({found.torch}) is a CPU build: install "
            "torch from PyTorch's CUDA wheel index first, or build with --gpu none"
        )
    ops = str(env.get("HOROVOD_GPU_OPERATIONS", "")).lower() or None
    nccl = {"nccl": True, "none": False}.get(gpu, found.torch_cuda is not None and found.nvcc is not None)
    if ops is not None:
        nccl = ops == "nccl"
    if found.torch_cuda is not None and found.nvcc is None:
        # a CUDA torch makes Horovod's torch extension compile CUDA code, whatever the GPU ops say
        missing.append(
            f"nvcc: torch is a CUDA {found.torch_cuda} build, so Horovod's torch extension compiles CUDA "
            "code: `module load cuda` (or set CUDA_HOME)"
        )
    notes = []
    build_env = {
        "HOROVOD_WITH_PYTORCH": "1",
        "HOROVOD_WITH_GLOO": "1",
        "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
    }
    if found.mpicxx is not None:
        build_env["HOROVOD_WITH_MPI"] = "1"
    else:
        build_env["HOROVOD_WITHOUT_MPI"] = "1"
        notes.append(
            "no MPI compiler wrapper (mpicxx/mpicc) on PATH: Horovod gets Gloo only "
            "(parallelism.backend=gloo); for MPI, `module load openmpi` first and run this again"
        )
    if nccl:
        build_env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
    gpu_ops = "nccl" if nccl else "cpu"
    # without MPI another key: a Gloo-only wheel is never the MPI one (the MPI key is setup.sh's own)
    gloo_only = "" if found.mpicxx is not None else "_gloo-only"
    wheel_dir = cache / "wheels" / f"horovod-{VERSION}_torch-{torch_tag(found)}_{gpu_ops}{gloo_only}"
    return Plan(wheel_dir, build_env, found.python, notes, missing)


# --- side effects --------------------------------------------------------------------------------
def look(python: str = sys.executable) -> Found:
    """The facts `plan` needs, from PATH and the environment's interpreter."""
    probe = (
        "import sys\n"
        "print(f'cp{sys.version_info[0]}{sys.version_info[1]}')\n"
        "try:\n import torch; print(torch.__version__); print(torch.version.cuda or '')\n"
        "except Exception: print(''); print('')\n"
        "try:\n import horovod, horovod.torch as h\n"
        " print(horovod.__version__, *[n for n, f in (('mpi', h.mpi_built), ('gloo', h.gloo_built), "
        "('nccl', h.nccl_built)) if f()])\n"
        "except Exception: print('')\n"
    )
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    lines = [*out.stdout.splitlines(), "", "", "", ""]
    cxx = compiler(os.environ)
    return Found(
        python=lines[0] or f"cp{sys.version_info[0]}{sys.version_info[1]}",
        torch=lines[1] or None,
        torch_cuda=lines[2] or None,
        cxx=shutil.which(cxx) if cxx else None,
        cmake=shutil.which("cmake"),
        mpicxx=shutil.which("mpicxx") or shutil.which("mpicc"),
        nvcc=shutil.which("nvcc") or _cuda_home_nvcc(),
        installed=lines[3] or None,
    )


def compiler(env: Mapping[str, str]) -> str | None:
    """The C++ compiler's command: $CXX's first word (CXX="ccache g++" or "g++ -O2" are compilers
    too, as make and CMake read them), else c++ or g++ on PATH."""
    given = shlex.split(env.get("CXX", "")) if env.get("CXX", "").strip() else []
    first = next((w for w in given if Path(w).name != "ccache"), given[0] if given else None)
    return first or shutil.which("c++") or shutil.which("g++")


def _cuda_home_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = Path(home, "bin", "nvcc") if home else None
    return str(nvcc) if nvcc is not None and nvcc.is_file() else None


def build(p: Plan, python: str, say: Say, tick: Callable[[float, str], None]) -> float:
    """Download the sdist, patch it, build the wheel into the cache (published whole or not at
    all); the seconds it took. `tick` hears the time so far and the log's last line every second.
    The build's log is kept beside the cache on failure."""
    t0 = time.monotonic()
    ensure_pip(python)
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "install", *BUILD_TOOLS], "installing the build tools")
    with tempfile.TemporaryDirectory(prefix="hpctrain-horovod-") as tmp:
        work = Path(tmp)
        _run(
            [*pip, "download", "--no-deps", "--no-binary", ":all:", f"horovod=={VERSION}", "-d", tmp],
            "download",
        )
        (sdist,) = work.glob(f"horovod-{VERSION}.tar.gz")
        unpack(sdist, work)
        src = work / f"horovod-{VERSION}"
        patch_tree(src)
        log, heard = work / "build.log", lambda line: tick(time.monotonic() - t0, line)
        staged(p, lambda staging: compile_wheel(p, pip, src, staging, log, say, heard))
    return time.monotonic() - t0


def staged(p: Plan, make: Callable[[Path], None]) -> None:
    """`make` fills a staging directory beside the key's with one wheel; with its manifest it is
    published whole (a rename: another build never sees half a wheel), or removed whatever ends
    `make` (a failure, Ctrl-C, SIGTERM): nothing half-built is left in the cache."""
    staging = p.wheel_dir.with_name(p.wheel_dir.name + f".tmp{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    try:
        make(staging)
        (wheel,) = staging.glob("horovod-*.whl")
        write_manifest(staging, wheel, p.env)
        shutil.rmtree(p.wheel_dir, ignore_errors=True)
        staging.rename(p.wheel_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def compile_wheel(
    p: Plan, pip: list[str], src: Path, staging: Path, log: Path, say: Say, tick: Callable[[str], None]
) -> None:
    """pip wheel in `src` into `staging`, its output in `log`; an interrupt (a signal that reached
    the compilers too: they die of it) is KeyboardInterrupt, never "the build failed"."""
    env = {**os.environ, **p.env, "MAKEFLAGS": f"-j{os.cpu_count() or 1}"}
    say(f"building Horovod {VERSION} (a few minutes); its log: {log}")
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(staging), "."],
            cwd=src,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            while proc.poll() is None:
                time.sleep(1)
                tick(_last_line(log))
        finally:
            if proc.poll() is None:  # interrupted: the compilers stop with it
                proc.kill()
                proc.wait()
    if proc.returncode in (
        -signal.SIGINT,
        -signal.SIGTERM,
        -signal.SIGHUP,
        128 + signal.SIGINT,
        128 + signal.SIGTERM,
    ):
        raise KeyboardInterrupt  # the signal was the user's, as the CLI says
    if proc.returncode != 0:
        kept = p.wheel_dir.parent / f"horovod-{VERSION}-build-failed.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, kept)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise InstallError(f"Horovod's build failed; the end of its log ({kept}):\n{tail}")


def unpack(sdist: Path, into: Path) -> None:
    """The sdist's files under `into`, and nothing elsewhere (a member may name any path)."""
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
            return
        root = into.resolve()  # Pythons before 3.11.4 have no filter: check each member here
        for m in tar.getmembers():
            target = (root / m.name).resolve()
            link = (target.parent / m.linkname).resolve() if m.issym() or m.islnk() else target
            if not (target.is_relative_to(root) and link.is_relative_to(root)) or m.isdev():
                raise InstallError(f"{sdist.name} holds {m.name!r}, which would land outside {into}")
        tar.extractall(into)  # noqa: S202 - every member checked above


def _last_line(log: Path) -> str:
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 400))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:100] if lines else ""


def ensure_pip(python: str) -> None:
    """pip in the environment (uv's environments come without it): pip downloads the sdist and
    builds the wheel, which uv does not do."""
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return
    if subprocess.run([python, "-m", "ensurepip", "--upgrade"], capture_output=True).returncode != 0:
        raise InstallError(f"{python}'s environment has no pip, and ensurepip is missing: uv pip install pip")


def install(p: Plan, python: str) -> None:
    """The cached wheel its manifest vouches for into `python`'s environment; InstallError naming
    the file and why for any other (nothing of it is run)."""
    ensure_pip(python)
    wheel, why = p.cache_state()
    if wheel is None:
        raise InstallError(
            f"no wheel of Horovod {VERSION} for {p.python} hpctrain can install in {p.wheel_dir}"
            f"{f': {why}' if why else ''}; `hpctrain install horovod --rebuild` builds it"
        )
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    _run([*pip, "--force-reinstall", "--no-deps", str(wheel)], "install")
    _run([*pip, str(wheel)], "its requirements")  # psutil, cloudpickle, pyyaml, ...


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise InstallError(f"{what} failed ({' '.join(argv[:6])} ...):\n{tail}")
