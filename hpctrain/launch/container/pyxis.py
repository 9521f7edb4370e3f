"""Pyxis (NVIDIA's SPANK plugin over enroot): the image goes to srun itself,
`srun --container-image=… --container-mounts=… python …`. SLURM only; rendered and snapshot-tested
here (no enroot in Debian 12)."""

from __future__ import annotations

import shutil
import subprocess

from hpctrain.errors import Problem
from hpctrain.launch.container.apptainer import _need_image
from hpctrain.launch.container.base import Runtime, register_runtime


@register_runtime("pyxis")
class Pyxis(Runtime):
    binaries = ("srun",)
    install = "ask the site for pyxis + enroot (srun --help lists --container-image when it is there)"
    local = False
    wraps_on_host = False  # the task starts inside the image: a requeue needs scontrol there
    detect = "srun --help lists no --container-image"

    def wrap(self, binds: list[tuple[str, str]], gpus: bool) -> list[str]:
        return []  # srun itself starts the task inside the image

    def srun_args(self, binds: list[tuple[str, str]]) -> list[str]:
        args = [f"--container-image={self.image}"]
        if binds:
            args.append("--container-mounts=" + ",".join(f"{s}:{d}" for s, d in binds))
        return args

    def image_problems(self) -> list[Problem]:
        return (
            [] if self.conf.image else [_need_image("pyxis", "cluster.container.image=/images/hpctrain.sqsh")]
        )

    @classmethod
    def probe(cls) -> str | None:
        srun = shutil.which("srun")
        if srun is None:
            return None
        try:
            text = subprocess.run([srun, "--help"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        return "pyxis (srun --container-image)" if "--container-image" in text else None
