"""The entry point every rank runs: `python -m hpctrain.rank RUN_DIR` under mpirun, or
`run_rank(RUN_DIR, control)` inside a SLURM task started by submitit.

Reads the resolved config and plan the launcher wrote, initialises Horovod, trains, and leaves
its records in RUN_DIR. On any failure it writes error-rank{R}.json and exits at once with
os._exit, so neither Horovod's nor MPI's shutdown can hang waiting for ranks that are gone;
the launcher then stops the others.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.engine.base import Engine
    from hpctrain.train.stop import StopControl

from hpctrain import heap, records
from hpctrain.config.derived import Derived
from hpctrain.config.run_file import planned_config
from hpctrain.engine.world import finalize_mpi, launcher_rank
from hpctrain.events import format_event
from hpctrain.lifeline import die_with_parent
from hpctrain.parallel import kind_of
from hpctrain.parallel.dimensions import declared_parts, with_dimensions


def base_environment() -> dict[str, Any]:
    """What every run's env.json holds, whatever the workload: versions, launcher, user code. A
    script that has not imported torch is not made to (2 s of a rank's CPU): its versions then
    come from the installed packages, and the devices once the script has run (torch_facts)."""
    from hpctrain.workload.code import CODE_DIR_VAR

    rec: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": _installed("torch"),
        "numpy": _installed("numpy"),
        "platform": platform.platform(),
        "cuda_devices": None,
        "torch_threads": None,
        "launcher": {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("SLURM_JOB", "SLURM_NNODES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))
        },
        **torch_facts(),
    }
    if "SLURM_JOB_ID" in os.environ:
        rec["slurm"] = slurm_version()
    box = container_facts()
    if box:
        rec["container"] = box
    code = os.environ.get(CODE_DIR_VAR)
    if code:
        rec["code"] = {"dir": code}
        snap = Path(code).parent / records.CODE
        if snap.exists():  # the snapshot's source, git commit and dirty flag
            rec["code"].update(records.read_json(snap))
    return rec


def torch_facts() -> dict[str, Any]:
    """The devices and threads torch sees, where this process has imported torch already."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    return {
        "torch": torch.__version__,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch_threads": torch.get_num_threads(),
    }


def slurm_version() -> str | None:
    """The SLURM this job runs under, as the node's `scontrol --version` says ("slurm 24.11.5";
    Debian's packages say "slurm-wlm 22.05.8"):
    it reads the job's slurm.conf and sends the controller nothing. None where it cannot say."""
    try:
        said = subprocess.run(
            ["scontrol", "--version"], capture_output=True, text=True, timeout=30
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return said[1] if len(said) == 2 and said[0].startswith("slurm") else None


def _installed(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    module = sys.modules.get(package)
    if module is not None:
        return str(module.__version__)
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def container_facts() -> dict[str, Any] | None:
    """What a rank in a container sees of it: the runtime and image the plan named, whether it
    is inside one (each runtime marks its processes), and the image's record (digest) if hpctrain
    built it."""
    named = os.environ.get("HPCTRAIN_CONTAINER")
    if not named:
        return None
    marks = ("CH_RUNNING", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "PYXIS_VERSION", "ENROOT_ROOTFS")
    out: dict[str, Any] = {**json.loads(named), "inside": any(m in os.environ for m in marks)}
    try:
        image = json.loads(Path("/etc/hpctrain-image.json").read_text())
        out.update(digest=image.get("digest"), key=image.get("key"))
    except (OSError, ValueError):
        out["digest"] = None
    return out


def run(run_dir: Path, control: StopControl | None = None) -> bool:
    """Run this rank's workload: True when it finished, False when it stopped to be requeued."""
    from hpctrain.workload.code import activate

    cfg = planned_config(run_dir)
    plan = records.read(records.plan_file(run_dir, os.environ), records.PlanRecord)
    activate()  # the user's code (if any) on sys.path and PYTHONPATH
    interval: int = getattr(cfg.cluster, "checkpoint_interval", 0)
    if control is None and interval:  # local runs checkpoint too
        from hpctrain.train.stop import StopControl

        control = StopControl(checkpoint_interval=interval)
    if cfg.bench.allreduce:
        from hpctrain.workload.allreduce import run_allreduce

        run_allreduce(cfg, run_dir)
        return True
    if cfg.script.path:
        from hpctrain.workload.script import run_script, script_environment

        if launcher_rank(os.environ) in (0, None):
            records.write_json(run_dir / records.ENV, {**base_environment(), **script_environment(cfg)})
        finished = run_script(cfg, run_dir, plan)
        facts = torch_facts()  # empty unless the script imported torch
        if launcher_rank(os.environ) in (0, None) and facts:
            records.write_json(run_dir / records.ENV, {**records.read_json(run_dir / records.ENV), **facts})
        return finished
    return train_builtin(cfg, plan, run_dir, control)


def parallelism_about(cfg: Config, plan: records.PlanRecord, engine: type[Engine]) -> dict[str, object]:
    """The summary's account of how the model was spread (stages, or the shard degree: the
    parallelism's) and how its gradients travel (the engine's groups)."""
    grads: dict[str, object] = {
        "grad_bucket_bytes": engine.grad_bucket_bytes(cfg),
        "grad_grouping": engine.grouping,
        "collective": engine.collective,
    }
    about = kind_of(cfg).about(cfg, plan.layout, grads)
    held = about.get("parts")
    # the parts its dimensions declare first (the summary lists them in this order), then its own
    parts = {**declared_parts(cfg, plan.layout), **(held if isinstance(held, dict) else {})}
    return {**about, "parts": parts} if parts else about


FLIGHT_RECORDS = 2000  # collectives torch.distributed's flight recorder keeps per rank (a ring)


def train_builtin(cfg: Config, plan: records.PlanRecord, run_dir: Path, control: StopControl | None) -> bool:
    """The built-in trainer (on built-in or user models and data) under the configured engine."""
    from hpctrain.engine.device import bind_device
    from hpctrain.engine.registry import engine_on_ranks
    from hpctrain.train.loop import start_fault, train
    from hpctrain.train.stats import summarize

    # derived once, by the planner: the rank uses the plan's world size, batch and lr as they are
    derived = Derived(plan.world_size, plan.batch, plan.lr, plan.layout)
    if cfg.train.stall_timeout_s > 0:  # a stall report shows torch.distributed's last collectives
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(FLIGHT_RECORDS))
    engine = engine_on_ranks(cfg, plan.layout)
    start_fault(cfg, launcher_rank(os.environ))  # debug.fail_mode=start_segfault
    bind_device(cfg.train.device, os.environ)  # before the first collective (engine/device.py)
    info = engine.init(plan.layout)
    hosts = engine.allgather_object(socket.gethostname())
    if cfg.cluster.preflight.enabled:  # before any step: a bad node ends the run here
        from hpctrain.engine.device import current_device
        from hpctrain.train.preflight import preflight

        preflight(cfg, info.rank, current_device(cfg.train.device), engine.allgather_object, run_dir)
    engine_env = engine.environment() if info.rank == 0 else {}  # rank 0 writes env.json and the summary
    if info.rank == 0:
        records.write_json(run_dir / records.ENV, {**base_environment(), "hosts": hosts, **engine_env})
    if cfg.cluster.preflight.only:  # hpctrain preflight: the check was the whole job
        engine.shutdown()
        return True
    started = time.time()
    build = partial(with_dimensions, kind_of(cfg).build)  # the layout's named dimensions wrap first
    stats = train(cfg, engine, info, derived, run_dir, build, control=control)
    if stats is None:
        return False
    everyone = engine.allgather_object(stats)
    finished = time.time()
    # The last collective: the other ranks leave now instead of waiting (Horovod over MPI spins a
    # core while it waits) for rank 0's summary and its FLOP count and GEMM probe, which need no peer
    engine.shutdown()
    if info.rank != 0:
        return True
    about = dict(
        started=started,
        finished=finished,
        precision=cfg.precision.name,
        model=cfg.model._target_ or cfg.model.name,
        backend=str(engine_env.get("backend", cfg.parallelism.backend)),  # what it ran on: nccl, gloo, mpi
        compression=cfg.parallelism.compression,
        engine=cfg.parallelism.engine,
        parallelism=str(cfg.parallelism.name),
        **parallelism_about(cfg, plan, type(engine)),
        **restarts_about(run_dir),
    )
    if plan.memory is not None:  # the check it passed: measured against the prediction and the limit
        parts = about.get("parts")
        about["parts"] = {
            **(parts if isinstance(parts, dict) else {}),
            "memory": dataclasses.asdict(plan.memory),
        }
    summary = summarize(everyone, plan.batch.global_, **model_flops(cfg, plan), **about)
    if implausible(summary):  # a cached count or peak that lies: measured again, the cache mended
        summary = summarize(everyone, plan.batch.global_, **model_flops(cfg, plan, fresh=True), **about)
    records.write(run_dir / records.SUMMARY, summary)
    print(format_event("done", throughput=summary.throughput_samples_per_s), flush=True)
    return True


def restarts_about(run_dir: Path) -> dict[str, object]:
    """The summary's account of the restarts the run needed (records/restarts.py) and of the
    nodes it left out (judged bad before training, or lost during it)."""
    from hpctrain.records.preflight import excluded
    from hpctrain.records.restarts import counted, read_restarts

    done = read_restarts(run_dir)
    restarts = counted(done)
    return {
        "restarts": len(restarts),
        "start_retries": len(done) - len(restarts),
        "steps_redone": sum(r.steps_redone for r in done),
        "restart_node_hours_lost": sum(r.node_hours_lost for r in done),
        "nodes_excluded": excluded(run_dir),
        "nodes_lost": list(dict.fromkeys(n for r in done for n in r.lost_nodes)),
    }


def implausible(s: records.RunSummary) -> bool:
    """An MFU above 100% from a cached figure: the cache was damaged or planted (a peak below what
    the run itself achieved, a count above what the model does)."""
    cached = "cached" in s.peak_source or "cached" in s.flops_source
    return cached and s.mfu is not None and s.mfu > 1


def model_flops(cfg: Config, plan: records.PlanRecord, fresh: bool = False) -> dict[str, object]:
    """The summary's MFU inputs, on rank 0 (after the others left): the model's FLOPs per
    sample and one device's peak (train/flops.py), from their caches unless `fresh`."""
    from hpctrain.engine.device import current_device
    from hpctrain.train.flops import device_peak, flops_per_sample
    from hpctrain.train.parts import make_dataset

    batch = max(plan.batch.micro, 1)
    flops, counted = flops_per_sample(cfg, make_dataset(cfg, plan.batch.global_), batch, fresh)
    peak = device_peak(cfg, current_device(cfg.train.device), fresh)
    return {
        "flops_per_sample": flops,
        "flops_source": counted,
        "peak_tflops": peak.tflops,
        "peak_source": peak.source,
    }


def fail(run_dir: Path, error: BaseException) -> NoReturn:
    """Record why this rank failed, then leave at once (no Horovod/MPI shutdown that could hang)."""
    rank = launcher_rank(os.environ)
    # an error that says all there is (a script's exit status) is not dressed in hpctrain's stack
    tb = (
        f"{type(error).__name__}: {error}"
        if getattr(error, "quiet", False)
        else "".join(traceback.format_exception(error))
    )
    # a peer's loss is the consequence of another rank's failure, which the launcher names: one
    # line here, the stack in error-rank{R}.json
    said = f"{type(error).__name__}: {str(error)[:300]}" if records.PEER_LOST.search(str(error)) else tb
    print(said, file=sys.stderr, flush=True)
    path = run_dir / records.error_file(rank if rank is not None else -1)
    try:
        if _stalled(path):  # the watchdog named this rank stalled: what follows is its consequence
            _exit_now()
        records.write_json(
            path,
            {
                "rank": rank,
                "host": socket.gethostname(),
                "type": type(error).__name__,
                "message": str(error),
                "traceback": tb,
                "time": time.time(),
            },
        )
    finally:
        _exit_now()


def _stalled(path: Path) -> bool:
    try:
        return records.read_json(path).get("type") == "Stalled"
    except (records.RecordError, AttributeError):
        return False


def _exit_now(code: int = 1) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpctrain.rank RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    heap.hold()  # until the trainer is built (hpctrain/heap.py)
    records.keep_writes_private()  # what the ranks write (checkpoints, records) too
    # a rank never outlives mpirun (a stuck one would keep a core busy for ever)
    die_with_parent(signal.SIGKILL)
    # Whole lines per write: mpirun --tag-output tags every write, so an unbuffered print (text and
    # newline written separately) would come out as two tagged fragments.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    try:
        run(run_dir)
        finalize_mpi()
    except BaseException as e:  # noqa: BLE001 - every failure must be recorded and end the process
        fail(run_dir, e)
    # Everything is recorded: leave without the interpreter's teardown, where torch's Gloo process
    # group destructor can deadlock with its own worker thread over the GIL (seen in a suite run: a DDP
    # rank hung at exit for ever), and where the frameworks' threads would be waited for.
    _exit_now(0)


if __name__ == "__main__":
    sys.exit(main())
