"""Apptainer (Singularity): `apptainer exec [--nv] --bind … IMAGE.sif python …`. Rendered and
snapshot-tested here (Debian 12 packages no Apptainer); the hybrid MPI model, as Charliecloud."""

from __future__ import annotations

from pathlib import Path

from hpctrain.errors import Problem
from hpctrain.launch.container.base import Runtime, register_runtime


@register_runtime("apptainer")
class Apptainer(Runtime):
    binaries = ("apptainer", "singularity")
    install = (
        "install Apptainer (apptainer.org packages; Debian 12 has none), or use "
        "cluster.container.runtime=charliecloud"
    )

    def wrap(self, binds: list[tuple[str, str]], gpus: bool) -> list[str]:
        argv = ["apptainer", "exec"]
        if gpus:
            argv.append("--nv")  # the host's NVIDIA driver libraries inside the container
        for src, dst in binds:
            argv += ["--bind", src if src == dst else f"{src}:{dst}"]
        return [*argv, self.image]

    def image_problems(self) -> list[Problem]:
        if not self.conf.image:
            return [_need_image("apptainer", "cluster.container.image=/images/hpctrain.sif")]
        if not Path(self.image).is_file():
            return [
                Problem(
                    "cluster.container.image",
                    f"{self.image} is not a file",
                    "build it: apptainer build hpctrain.sif containers/hpctrain.def",
                )
            ]
        return []


def _need_image(runtime: str, example: str) -> Problem:
    return Problem("cluster.container.image", f"{runtime} needs an image", f"name it, e.g. {example}")
