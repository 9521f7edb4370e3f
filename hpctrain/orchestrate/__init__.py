"""Orchestration: runs, sweeps and studies, from overrides to results, through one path for
every launcher. Below the commands, above the launchers."""
