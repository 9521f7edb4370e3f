"""cluster.container: the image every rank runs in, and the runtime that runs it (the options;
what each runtime makes of them is hpctrain/launch/container/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class ContainerRuntime(StrEnum):  # cluster.container.runtime
    none = "none"
    charliecloud = "charliecloud"
    apptainer = "apptainer"
    pyxis = "pyxis"


@dataclass
class ContainerConf:
    """Every rank runs inside an image (cluster.container.*); the driver stays on the host."""

    runtime: ContainerRuntime = ContainerRuntime.none  # what runs the image; none = no image
    # charliecloud: an image name in ch-image storage (null = the one `hpctrain container build`
    # made) or an image directory; apptainer: a .sif file; pyxis: what enroot imports (a .sqsh)
    image: str | None = None
    python: str = "/opt/venv/bin/python3"  # the interpreter inside the image (hpctrain's images)
    binds: list[str] = field(default_factory=list)  # more host paths the ranks see, at the same path
    storage: str | None = None  # charliecloud: ch-image storage; null = hpctrain's cache
    # the ranks run the hpctrain of the command that launched them (bound over the image's copy):
    # what the driver plans and pickles is what the ranks read, whatever the image was built from
    host_code: bool = True
