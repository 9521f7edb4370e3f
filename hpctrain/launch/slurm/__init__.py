"""The SLURM launcher (launcher.py: submitit jobs and arrays, srun inside them, sacct/squeue for
status). The package imports none of its modules: what runs inside a job (the restart supervisor,
the ranks) imports what it needs without the launcher and submitit."""
