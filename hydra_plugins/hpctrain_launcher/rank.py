"""What every rank of a point's run does (as its script, under hpctrain's script workload: the
variables of torch.distributed and Horovod are set, failures are recorded and named, the rank ends
with its launcher): the task function runs through Hydra's own run_job, as the basic launcher runs
it, in the job's output directory with HydraConfig set.

Rank 0 is the job as Hydra knows it: it writes .hydra/, configures the job's logging, runs the
callbacks and sends its JobReturn back to the launcher. The other ranks run the same function in
the same directory without those side effects, and their return values are dropped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def return_file(payload: Path) -> Path:
    """Where rank 0 leaves its JobReturn for the launcher."""
    return payload.with_name(f"{payload.stem}-return.pkl")


def path_file(payload: Path) -> Path:
    """The launching process's sys.path, one entry a line."""
    return payload.with_suffix(".path")


def main(payload_path: str) -> int:
    import cloudpickle

    path = Path(payload_path)
    payload = load(path)
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job
    from omegaconf import open_dict, read_write

    Singleton.set_state(payload["singletons"])
    config = payload["config"]
    rank = int(os.environ.get("RANK", "0"))
    context = payload["hydra_context"]
    with read_write(config), open_dict(config):
        if os.environ.get("SLURM_JOB_ID"):  # as submitit's launcher: the scheduler's job id
            config.hydra.job.id = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ["SLURM_JOB_ID"])
        if rank != 0:
            config.hydra.output_subdir = None  # rank 0 writes .hydra/
    if rank != 0:
        from hydra._internal.callbacks import Callbacks
        from hydra.types import HydraContext

        context = HydraContext(config_loader=context.config_loader, callbacks=Callbacks())
    ret = run_job(
        hydra_context=context,
        task_function=payload["task_function"],
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
        configure_logging=rank == 0,
    )
    if rank == 0:
        from hpctrain.records import write_atomic

        write_atomic(return_file(path), cloudpickle.dumps(ret))
    if ret.status == JobStatus.FAILED:
        # recorded by hpctrain as this rank's failure (named, with its traceback); the launcher
        # hands rank 0's JobReturn, with the exception, back to Hydra
        raise ret._return_value
    return 0


def load(path: Path) -> dict[str, Any]:
    """The payload. The launching process's import path goes first, before anything is unpickled:
    the task function is pickled by reference where it is importable (the app's own modules, a
    test module), and loading it imports that module."""
    import cloudpickle

    for p in reversed(path_file(path).read_text().splitlines()):
        if p and p not in sys.path:
            sys.path.insert(0, p)
    return cloudpickle.loads(path.read_bytes())
