"""SLURM tests use the session's real local cluster: the `slurm_cluster` fixture in tests/conftest.py
(started once, stopped at the end; if it cannot start, these tests fail, never skip)."""
