"""The allreduce benchmark as an ordinary run: the bench.allreduce workload, started through the
launcher's normal path (the local supervisor and mpirun, or a SLURM job and srun), so it is
planned, watched, cancelled and reported like any training run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hpctrain import records
from hpctrain.config.schema import Config
from hpctrain.launch.base import Launcher, RunSpec
from hpctrain.records import State


def allreduce_config(cfg: Config, max_mb: int) -> Config:
    """`cfg`'s resources, running the allreduce benchmark; one thread per rank, as a rank in an
    allreduce needs no more."""
    bench = dataclasses.replace(cfg.bench, allreduce=True, max_mb=max_mb)
    cluster = cfg.cluster
    if hasattr(cluster, "threads_per_rank"):
        cluster = dataclasses.replace(cluster, threads_per_rank=1)
    return dataclasses.replace(
        cfg, bench=bench, cluster=cluster, script=dataclasses.replace(cfg.script, path=None)
    )


def run_and_wait(
    launcher: Launcher, cfg: Config, run_dir: Path, overrides: list[str], timeout_s: float = 3600
) -> RunSpec:
    """Run `cfg` in `run_dir` through the launcher's normal path and wait for it to complete;
    the launcher's failure (a typed error) when it does not."""
    run = RunSpec(0, overrides, cfg, launcher.plan(cfg, run_dir))
    launcher.admit([run])
    (job,) = launcher.submit([run], None, detach=False)
    status = launcher.wait([job], timeout_s, poll_s=0.5)[job.job_id]
    if status.state != State.COMPLETED:
        raise launcher.failure(job, status)
    return run


def allreduce_overrides(max_mb: int) -> list[str]:
    return ["bench.allreduce=true", f"bench.max_mb={max_mb}"]


def run_allreduce(
    launcher: Launcher, cfg: Config, run_dir: Path, max_mb: int, timeout_s: float = 3600
) -> records.AllreduceResult:
    """Run the benchmark on the resources of `cfg` in `run_dir` and wait for its result."""
    cfg = allreduce_config(cfg, max_mb)
    run = run_and_wait(launcher, cfg, run_dir, allreduce_overrides(max_mb), timeout_s)
    return records.read(run_dir / records.allreduce_file(run.plan.world_size), records.AllreduceResult)
