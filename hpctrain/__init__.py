"""hpctrain: distributed training from a laptop to a SLURM cluster."""

__version__ = "0.1.0"
