"""Charliecloud: `ch-run IMAGE -- python …`, unprivileged through user namespaces. Built and run
by hpctrain itself (`hpctrain container build`); SLURM sites run it as `srun ch-run …`, and MPI
follows the hybrid model (the host's mpirun or srun starts one container per rank)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hpctrain.errors import LaunchError, Problem
from hpctrain.launch.container.base import Runtime, register_runtime, user
from hpctrain.launch.container.store import default_storage, image_dir, read_record

# variables of the host's Python or libraries that would point the image's python elsewhere
HOST_ONLY = ("PYTHONHOME", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")


@register_runtime("charliecloud")
class Charliecloud(Runtime):
    binaries = ("ch-run",)
    install = "apt-get install charliecloud (Debian, Ubuntu), then hpctrain container build"
    shared = ("/tmp",)  # ch-run shares the host's /tmp unless --private-tmp

    @property
    def image(self) -> str:
        return self.conf.image or "hpctrain"

    @property
    def storage(self) -> str:
        return self.conf.storage or str(default_storage())

    def wrap(self, binds: list[tuple[str, str]], gpus: bool) -> list[str]:
        argv = ["ch-run"]
        if "/" not in self.image:  # a name in ch-image storage, not a directory
            argv += ["-s", self.storage]
        argv.append("--set-env")  # the image's own environment (its PATH: the venv first) ...
        argv += [f"--unset-env={v}" for v in HOST_ONLY]  # ... without the host's Python settings
        for src, dst in binds:
            argv += ["-b", src if src == dst else f"{src}:{dst}"]
        return [*argv, self.image, "--"]

    def env(self) -> dict[str, str]:
        return {**super().env(), "USER": user()}  # ch-run refuses to start without $USER

    def directory(self) -> Path:
        return Path(self.image) if "/" in self.image else image_dir(Path(self.storage), self.image)

    def image_problems(self) -> list[Problem]:
        if not (self.directory() / "bin").is_dir():
            how = (
                "run hpctrain container build"
                if self.conf.image is None
                else f"build it (hpctrain container build --tag {self.image}) or name an image in {self.storage}"
            )
            return [
                Problem(
                    "cluster.container.image",
                    f"no Charliecloud image {self.image!r} ({self.directory()} is not an image)",
                    how,
                )
            ]
        python = self.conf.python
        bound = any(python.startswith(b.rstrip("/") + "/") for b in self.conf.binds)
        if not bound and not os.path.lexists(self.directory() / python.lstrip("/")):
            return [
                Problem(
                    "cluster.container.python",
                    f"{python} is not in image {self.image!r} (every rank would fail to start)",
                    "give the interpreter's path inside the image (hpctrain's images: /opt/venv/bin/python3)",
                )
            ]
        return []

    def digest(self) -> str | None:
        rec = read_record(self.directory())
        return str(rec["digest"]) if rec and "digest" in rec else None

    def prepare(self, binds: list[tuple[str, str]], gpus: bool = False) -> None:
        """ch-run binds only onto directories that exist in a read-only image: make the empty mount
        points a run needs (a run directory outside /tmp, say) in the image directory first. With
        GPUs, the host's driver libraries go into the image once (ch-fromhost --nvidia: ch-run has
        no --nv), as Charliecloud's documentation does it."""
        root = self.directory()
        for _, dst in binds:
            target = root / dst.lstrip("/")
            if not target.exists():
                os.makedirs(target, exist_ok=True)
        if gpus:
            inject_nvidia(root)


NVIDIA_MARK = "etc/hpctrain-fromhost-nvidia"  # in the image: the host libraries were injected


def inject_nvidia(root: Path) -> None:
    """`ch-fromhost --nvidia` on the image directory, once (a mark file records it)."""
    mark = root / NVIDIA_MARK
    if mark.exists():
        return
    try:
        r = subprocess.run(
            ["ch-fromhost", "--nvidia", str(root)], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        r = subprocess.CompletedProcess([], 1, "", str(e))
    if r.returncode != 0:
        said = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise LaunchError(
            f"the ranks use GPUs, but the host's NVIDIA libraries could not be injected into the "
            f"Charliecloud image {root} (ch-fromhost --nvidia: {' / '.join(said) or 'failed'}); install "
            "libnvidia-container-tools (nvidia-container-cli) on the GPU nodes, or set train.device=cpu"
        )
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(r.stdout)
