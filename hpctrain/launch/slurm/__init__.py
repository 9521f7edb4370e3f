"""The SLURM launcher: submitit jobs and arrays, srun inside them, sacct/squeue for status."""

from hpctrain.launch.slurm.launcher import SlurmLauncher

__all__ = ["SlurmLauncher"]
