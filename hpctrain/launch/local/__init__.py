"""The local launcher: mpirun on this machine, watched by a detached supervisor."""

from hpctrain.launch.local.launcher import LocalLauncher

__all__ = ["LocalLauncher"]
