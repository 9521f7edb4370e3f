"""The local launcher (launcher.py: mpirun on this machine), watched by a detached supervisor
(supervisor.py). The package imports neither: the supervisor, started for every local run, imports
what it needs without the launcher's config and Hydra (its import: 0.38 -> 0.2 CPU-s)."""
