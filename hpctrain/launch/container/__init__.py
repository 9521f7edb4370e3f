"""Container runtimes: how every rank of a run is started inside an image (cluster.container.*).

One module per runtime, registered by name like launchers and engines: charliecloud (built and
run here), apptainer and pyxis (rendered for the clusters that have them). Adding one (say
podman-hpc) is a module here with a Runtime subclass decorated @register_runtime("podman-hpc")
and its name in config.container.ContainerRuntime."""

from hpctrain.launch.container.base import (
    IMAGE_SOURCE,
    Runtime,
    container_binds,
    container_problems,
    runtime_for,
)

__all__ = ["IMAGE_SOURCE", "Runtime", "container_binds", "container_problems", "runtime_for"]
