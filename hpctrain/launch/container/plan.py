"""What a run's plan says of its container, for any launcher: the command before the image's
python, the ranks' extra environment, srun's extra arguments, and the record plan.json keeps."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain import records
from hpctrain.config.schema import Config
from hpctrain.launch.container.base import ENV_VAR, container_binds, runtime_for


@dataclass(frozen=True)
class ContainerPlan:
    python: list[str]  # the rank's interpreter command: runtime wrapper + the image's python
    env: dict[str, str]
    srun_args: tuple[str, ...]
    binds: list[tuple[str, str]]
    note: str
    record: dict[str, Any]


REQUEUE_DIR_VAR = "HPCTRAIN_REQUEUE_DIR"
# submitit requeues a job with `scontrol requeue` from rank 0's task, but an image has no SLURM
# client (nor the site's config and munge socket). Inside, rank 0 leaves the request in a file
# (launch/slurm/job.py); this wrapper, the task itself on the host around the runtime, passes it
# to scontrol once the container has exited. SIGUSR2 (the time limit's warning) is for the
# training: the wrapper's no-op trap keeps it alive until then. The request is taken (read and
# removed) before scontrol is asked: the requeue ends this very task, and a request left behind
# would requeue the next incarnation again when it finishes.
HOST_REQUEUE = (
    'trap : USR2; "$@"; rc=$?; f="$HPCTRAIN_REQUEUE_DIR/requeue-$SLURM_JOB_ID"; '
    'if [ "$SLURM_PROCID" = 0 ] && [ -e "$f" ]; then id=$(cat "$f"); rm -f "$f"; '
    'scontrol requeue "$id"; fi; exit $rc'
)


def container_plan(
    cfg: Config, paths: Iterable[str], gpus: bool, requeue_dir: str | None = None
) -> ContainerPlan | None:
    """None when the ranks run on the host. `paths`: the directories the launcher writes to;
    `gpus`: whether the ranks use GPUs (the launcher knows: its host facts, or the allocation);
    `requeue_dir`: where a SLURM job's rank 0 leaves its requeue request (submitit's folder)."""
    rt = runtime_for(cfg)
    if rt is None:
        return None
    c = cfg.cluster.container
    binds = container_binds(cfg, rt, paths)
    record = {"runtime": rt.name, "image": rt.image, "binds": [[s, d] for s, d in binds], "gpus": gpus}
    env = {**rt.env(), ENV_VAR: json.dumps({"runtime": rt.name, "image": rt.image}, sort_keys=True)}
    python = [*rt.wrap(binds, gpus), c.python]
    if requeue_dir is not None and rt.wraps_on_host:
        env[REQUEUE_DIR_VAR] = requeue_dir
        python = ["sh", "-c", HOST_REQUEUE, "hpctrain-task", *python]
    shown = ", ".join(f"{s}:{d}" if s != d else s for s, d in binds) or "nothing"
    return ContainerPlan(
        python=python,
        env=env,
        srun_args=tuple(rt.srun_args(binds)),
        binds=binds,
        note=f"every rank runs in the {rt.name} image {rt.image} (bound in: {shown})",
        record=record,
    )


def stage(cfg: Config, record: dict[str, Any], run_dir: Path) -> None:
    """At submission: what the runtime needs before the ranks start (Charliecloud's mount
    points), and container.json: the runtime's version and the image's digest as the host sees
    them (env.json adds what the ranks saw from inside)."""
    rt = runtime_for(cfg)
    if rt is None:
        return
    binds = [(str(s), str(d)) for s, d in record.get("binds", [])]
    rt.prepare(binds, bool(record.get("gpus")))
    records.write_json(run_dir / records.CONTAINER, {**record, "version": rt.probe(), "digest": rt.digest()})
