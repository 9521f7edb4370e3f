"""`hpctrain container build`: the training image, built with Charliecloud from Debian's own
packages and this machine's wheels, without a registry (as an air-gapped site would build it).

1. base: `debootstrap --variant=minbase` of Debian 12 with Python and OpenMPI, /dev emptied (an
   import copies device files as data: /dev/full would fill the disk), `ch-image import`;
2. wheels: every runtime dependency at the version this machine's venv has (torch's CPU build as
   this machine's pip resolves it, mpi4py built against the same OpenMPI, the cached Horovod
   wheel), so the image installs offline and runs what the driver runs;
3. `ch-image build` of containers/charliecloud.Dockerfile: scripts/setup.sh installs from them;
4. the image's content digest and inputs, written into it (/etc/hpctrain-image.json).

Each product is cached by a key of what went into it, so a second build is a lookup."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from hpctrain.errors import LaunchError
from hpctrain.launch.container.store import RECORD, cache_dir
from hpctrain.resources import shipped

ROOT = Path(__file__).resolve().parents[3]  # the repository (or source tree) hpctrain runs from
RECIPE = "charliecloud.Dockerfile"  # in containers/, shipped in the package (resources.py)
SUITE = "bookworm"
# what the image needs from Debian: Python with venv, OpenMPI 4.1 (the host's major version: the
# hybrid model), procps for hpctrain's process checks
BASE_PACKAGES = ("python3", "python3-venv", "openmpi-bin", "libopenmpi3", "procps")
BUILD_TOOLS = {"pip", "setuptools", "wheel", "packaging"}  # setup.sh's editable install needs them
FROM_SOURCE = {"mpi4py"}  # built against this machine's OpenMPI, as setup.sh builds it
# the image installs hpctrain from its sources (setup.py maps conf/ and containers/ in)
CONTEXT_FILES = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "hpctrain",
    "conf",
    "containers",
    "scripts/setup.sh",
)

Say = Callable[[str], None]


@dataclass(frozen=True)
class Inputs:
    """What an image is made of; its key names the cached products."""

    pins: tuple[str, ...]  # name==version of every runtime dependency, sorted
    horovod_wheel: str  # the cached wheel's path relative to the wheel cache
    packages: tuple[str, ...]
    suite: str
    mirror: str
    dockerfile: str
    setup_sh: str  # sha256 of scripts/setup.sh

    def base_key(self) -> str:
        return _digest([self.suite, self.mirror, *self.packages])[:12]

    def wheels_key(self) -> str:
        return _digest(list(self.pins))[:12]

    def key(self) -> str:
        return _digest(json.dumps(asdict(self), sort_keys=True).split(","))[:16]


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# --- pure: what goes in ----------------------------------------------------------------------
def runtime_pins(dist: str = "hpctrain", extra: str = "horovod") -> tuple[str, ...]:
    """Every distribution `dist` needs at run time with `extra` (the image runs Horovod: its own
    requirements go in; the wheel itself comes from the cache), at its installed version."""
    seen: dict[str, str] = {}
    todo = [(dist, extra)]
    while todo:
        name, extra = todo.pop()
        try:
            d = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency not installed here: the image lacks it too
        key = _norm(d.metadata["Name"])
        if key in seen and not extra:
            continue
        seen[key] = d.version
        for text in d.requires or []:
            r = Requirement(text)
            if r.marker is None or r.marker.evaluate({"extra": extra}):
                todo += [(r.name, e) for e in r.extras] or [(r.name, "")]
    seen.pop(_norm(dist), None)
    seen.pop("horovod", None)  # from the wheel cache: built here, never from PyPI
    for tool in BUILD_TOOLS:
        if tool not in seen:
            try:
                seen[tool] = metadata.version(tool)
            except metadata.PackageNotFoundError:
                pass
    return tuple(sorted(f"{k}=={v}" for k, v in seen.items()))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def apt_mirror(sources: dict[str, str]) -> str | None:
    """The Debian mirror this machine's apt uses (deb822 .sources or one-line sources.list):
    debootstrap fetches from the same place, whatever the site's mirror is."""
    for text in sources.values():
        for m in re.finditer(r"^URIs:\s*(\S+)", text, re.M):
            if "security" not in m.group(1):
                return m.group(1)
        for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
            if "security" not in m.group(2):
                return m.group(1)
    return None


def render_dockerfile(template: str, base: str) -> str:
    return template.replace("@BASE@", base)


# --- side effects, each in one place ---------------------------------------------------------
def read_apt_sources() -> dict[str, str]:
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    return {str(f): f.read_text(errors="replace") for f in files if f.is_file()}


def horovod_wheel() -> Path:
    """The wheel `hpctrain install horovod` built for the Horovod, torch and Python of this venv,
    with MPI and CPU operations (the image's), chosen by its key and name: never another version's
    or another build's, whichever sorts last (issue 72)."""
    import importlib.metadata

    import torch  # the wheel must match the torch the image gets

    try:
        version = importlib.metadata.version("horovod")
    except importlib.metadata.PackageNotFoundError:
        raise LaunchError(
            "Horovod is not installed in this venv: run scripts/setup.sh first (it builds one)"
        ) from None
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    key = cache_dir() / "wheels" / f"horovod-{version}_torch-{torch.__version__.replace('+', '_')}_{py}_cpu"
    found = sorted(key.glob(f"horovod-{version}-{py}-{py}-*.whl"))
    if len(found) != 1:
        raise LaunchError(
            f"{key} holds {len(found)} wheels of Horovod {version} for {py}, where the build leaves one: "
            "hpctrain install horovod --rebuild"
        )
    return found[0]


def gather_inputs() -> Inputs:
    if not (ROOT / "pyproject.toml").is_file():  # a pip install carries no sources to build from
        raise LaunchError(
            "hpctrain container build installs hpctrain from its sources: run it from a clone of the "
            "repository (its scripts/setup.sh); with a pip install, use an image your site provides "
            "(cluster.container.runtime=apptainer|pyxis)"
        )
    mirror = apt_mirror(read_apt_sources())
    if mirror is None:
        raise LaunchError("no Debian mirror in /etc/apt/sources.list*: debootstrap needs one")
    wheel = horovod_wheel()
    return Inputs(
        pins=runtime_pins(),
        horovod_wheel=str(wheel.relative_to(cache_dir() / "wheels")),
        packages=BASE_PACKAGES,
        suite=SUITE,
        mirror=mirror,
        dockerfile=(shipped("containers") / RECIPE).read_text(),
        setup_sh=hashlib.sha256((ROOT / "scripts" / "setup.sh").read_bytes()).hexdigest(),
    )


def run(argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """One build step; its output goes to the log, whose tail is the error if it fails."""
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        r = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise LaunchError(f"{argv[0]} failed (exit {r.returncode}); the end of {log}:\n" + "\n".join(tail))


def ch_env() -> dict[str, str]:
    """ch-image is a Python script for Debian's /usr/bin/python3 (with python3-lark): a venv's
    python3 first on PATH would run it without lark; it also wants $USER."""
    env = dict(os.environ)
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    env.setdefault("USER", _user())
    for v in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(v, None)
    return env


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def images(storage: Path) -> set[str]:
    root = storage / "img"
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def empty_special_files(rootfs: Path) -> list[str]:
    """Remove what an import would copy as data (device nodes, FIFOs, sockets) and /dev's
    contents: bounded input for `ch-image import`, whatever debootstrap left."""
    removed = []
    dev = rootfs / "dev"
    for p in list(dev.iterdir()) if dev.is_dir() else []:
        removed.append(str(p.relative_to(rootfs)))
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                p.unlink()
                removed.append(str(p.relative_to(rootfs)))
    return removed


def tree_digest(root: Path, skip: str = RECORD) -> str:
    """sha256 over every path, type, mode and content (symlink targets) in sorted order."""
    h = hashlib.sha256()
    for path in sorted(_walk(root)):
        rel = path.relative_to(root).as_posix()
        if rel == skip:
            continue
        st = os.lstat(path)
        h.update(f"{rel}\0{st.st_mode:o}\0".encode())
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(path).encode())
        elif stat.S_ISREG(st.st_mode):
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
    return "sha256:" + h.hexdigest()


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            yield Path(dirpath) / name


def wheelhouse(inputs: Inputs, say: Say, log: Path) -> Path:
    """The pinned wheels, cached by their pins; built with this machine's pip and its config."""
    dest = cache_dir() / "wheelhouse" / inputs.wheels_key()
    if dest.is_dir():
        return dest
    say(f"wheels: {len(inputs.pins)} distributions at this venv's versions")
    tmp = Path(tempfile.mkdtemp(prefix="wheelhouse.", dir=dest.parent if _mk(dest.parent) else None))
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "wheel",
        "--no-deps",
        "-q",
        "-w",
        str(tmp),
    ]
    binary = [p for p in inputs.pins if p.split("==")[0] not in FROM_SOURCE]
    source = [p for p in inputs.pins if p.split("==")[0] in FROM_SOURCE]
    try:
        run([*pip, *binary], log)
        if source:
            run([*pip, "--no-binary", ",".join(FROM_SOURCE), *source], log)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # an interrupted or failed download leaves nothing
    return dest


def _mk(d: Path) -> bool:
    d.mkdir(parents=True, exist_ok=True)
    return True
