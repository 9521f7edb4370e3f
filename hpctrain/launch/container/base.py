"""What every container runtime answers: how to wrap a rank's command (under mpirun or srun),
what the ranks must see of the host, and whether it is installed. Planning is pure; `probe` and
`image_problems` are the only side effects (a version query, a file check)."""

from __future__ import annotations

import importlib
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import ClassVar, TypeVar

from hpctrain.config.container import ContainerConf
from hpctrain.config.schema import Config
from hpctrain.errors import Problem

# the hpctrain package the driver runs, bound over the image's copy (cluster.container.host_code)
HOST_PACKAGE = str(Path(__file__).resolve().parents[2])
IMAGE_SOURCE = "/opt/hpctrain/hpctrain"  # where hpctrain's images install the package (editable)
# OpenMPI's shared-memory transport copies between ranks with CMA (process_vm_readv), which fails
# between processes in different user namespaces; plain copy-in/copy-out works everywhere.
CONTAINER_ENV = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
ENV_VAR = "HPCTRAIN_CONTAINER"  # what the rank records in env.json: runtime, version, image

R = TypeVar("R", bound=type["Runtime"])
_RUNTIMES: dict[str, type[Runtime]] = {}


def register_runtime(name: str) -> Callable[[R], R]:
    def deco(cls: R) -> R:
        cls.name = name
        _RUNTIMES[name] = cls
        return cls

    return deco


class Runtime(ABC):
    name: ClassVar[str]
    binaries: ClassVar[tuple[str, ...]]  # any of these on PATH means it is installed
    install: ClassVar[str]  # how to get it, for the error that says it is missing
    shared: ClassVar[tuple[str, ...]] = ()  # host paths every container sees without a bind
    local: ClassVar[bool] = True  # can run under a local mpirun (pyxis is an srun plugin)
    detect: ClassVar[str] = ""  # how probe() tells it is installed, when not a binary on PATH
    wraps_on_host: ClassVar[bool] = True  # its command runs on the host (pyxis: srun enters the image)

    def __init__(self, conf: ContainerConf) -> None:
        self.conf = conf

    @property
    def image(self) -> str:
        return self.conf.image or ""

    @abstractmethod
    def wrap(self, binds: list[tuple[str, str]], gpus: bool) -> list[str]:
        """The command before the image's python: under mpirun, or in srun's task command."""

    def srun_args(self, binds: list[tuple[str, str]]) -> list[str]:
        """Extra srun arguments (pyxis takes the image there)."""
        return []

    def env(self) -> dict[str, str]:
        return dict(CONTAINER_ENV)

    def image_problems(self) -> list[Problem]:
        """The image exists where the ranks will look (side effect: a file check)."""
        return []

    def digest(self) -> str | None:
        """The image's content digest where hpctrain built it (its record), else None."""
        return None

    def prepare(self, binds: list[tuple[str, str]], gpus: bool = False) -> None:
        """Side effects before the ranks start (Charliecloud: mount points in the image, the
        host's GPU libraries injected when the ranks use GPUs). Raises LaunchError."""
        return None

    @classmethod
    def probe(cls) -> str | None:
        """The installed version ('charliecloud 0.31'), or None when it is not installed."""
        return probe_binaries(cls.binaries)


@cache
def probe_binaries(binaries: tuple[str, ...]) -> str | None:
    for b in binaries:
        path = shutil.which(b)
        if path is None:
            continue
        try:
            r = subprocess.run(
                [path, "--version"],
                capture_output=True,
                text=True,
                timeout=20,
                env={**os.environ, "USER": user()},
            )
        except (OSError, subprocess.TimeoutExpired):
            return f"{b} (version unknown)"
        words = (r.stdout or r.stderr).split()
        return f"{b} {words[-1] if words else '?'}"
    return None


def user() -> str:
    """$USER, which ch-run insists on (CI and cron environments often lack it)."""
    return os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name


def runtime_class(name: str) -> type[Runtime]:
    if name not in _RUNTIMES and name.isidentifier():
        importlib.import_module(f"{__package__}.{name}")
    return _RUNTIMES[name]


def runtime_for(cfg: Config) -> Runtime | None:
    c = cfg.cluster.container
    return None if str(c.runtime) == "none" else runtime_class(str(c.runtime))(c)


def container_binds(cfg: Config, runtime: Runtime, paths: Iterable[str]) -> list[tuple[str, str]]:
    """(host, container) pairs: the host's hpctrain over the image's, then every path the ranks
    read or write (run directories, user code, data, extra binds) at the same path, leaving out
    paths inside another bind or inside what the runtime shares anyway (/tmp for Charliecloud)."""
    c = cfg.cluster.container
    wanted = [*paths, *c.binds]
    for p in (cfg.code.dir, cfg.script.path and str(Path(cfg.script.path).parent), cfg.train.resume_from):
        if p:
            wanted.append(str(p))
    if str(cfg.data.name) == "folder" and cfg.data.path:
        wanted.append(str(cfg.data.path))
    roots = sorted({str(Path(p)) for p in wanted if p}, key=lambda p: (len(Path(p).parts), p))
    kept: list[str] = []
    for p in roots:
        if not any(_inside(p, k) for k in (*kept, *runtime.shared)):
            kept.append(p)
    pairs = [(HOST_PACKAGE, IMAGE_SOURCE)] if c.host_code else []
    return pairs + [(p, p) for p in kept]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


# what a path or image name may hold: it reaches srun's arguments and bind lists (':' and ','
# separate binds) unquoted on some runtimes
SAFE = re.compile(r"^[A-Za-z0-9_./+@=-][A-Za-z0-9_./+@=~-]*$")


def value_problems(cfg: Config) -> list[Problem]:
    c = cfg.cluster.container
    values = [("cluster.container.image", c.image), ("cluster.container.python", c.python)]
    values += [(f"cluster.container.binds[{i}]", b) for i, b in enumerate(c.binds)]
    return [
        Problem(
            key,
            f"{v!r} holds a character a bind list or srun line would split or run (only "
            "letters, digits and _ . / + @ = - ~)",
            "rename it, or bind it under a plain path",
        )
        for key, v in values
        if v is not None and not SAFE.match(v)
    ]


def container_problems(cfg: Config) -> list[Problem]:
    """The runtime is installed here, fits the launcher, and its image is where it is named."""
    rt = runtime_for(cfg)
    if rt is None:
        c, default = cfg.cluster.container, type(cfg.cluster.container)()
        return [
            Problem(
                f"cluster.container.{k}",
                "is a container setting, and no container runtime is chosen: the ranks would run on the host",
                "set cluster.container.runtime=charliecloud (or apptainer, pyxis), or drop it",
            )
            for k in ("image", "python", "binds", "storage")
            if getattr(c, k) != getattr(default, k)
        ]
    if value_problems(cfg):
        return value_problems(cfg)
    key = "cluster.container.runtime"
    if cfg.cluster.name == "local" and not rt.local:
        return [
            Problem(
                key,
                f"{rt.name} starts containers through srun only",
                "use cluster=slurm, or cluster.container.runtime=charliecloud (or apptainer) for local runs",
            )
        ]
    if rt.probe() is None:
        how = rt.detect or f"none of {', '.join(rt.binaries)} on PATH"
        return [Problem(key, f"{rt.name} is not installed on this machine ({how})", rt.install)]
    return _bind_problems(cfg) + rt.image_problems()


def _bind_problems(cfg: Config) -> list[Problem]:
    """A local run's binds exist here (on SLURM they are the nodes' paths): before, a missing one
    surfaced as 'mpirun exited with status 1' with ch-run's reason only on the console."""
    if cfg.cluster.name != "local":
        return []
    return [
        Problem(
            f"cluster.container.binds[{i}]",
            f"{b.split(':')[0]} does not exist on this host, so it cannot be bound into the image",
            "create it, or drop the bind",
        )
        for i, b in enumerate(cfg.cluster.container.binds)
        if not os.path.exists(b.split(":")[0])
    ]


def describe(rt: Runtime) -> str:
    """What env.json and the report say of the container (set in the ranks' environment)."""
    return json.dumps({"runtime": rt.name, "version": rt.probe(), "image": rt.image})


def quoted(argv: list[str]) -> str:
    return shlex.join(argv)
