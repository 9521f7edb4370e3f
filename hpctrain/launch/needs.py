"""What the ranks need from whatever starts them, decided once at plan time from the engine, the
workload, the parallelism and the container, for every launcher alike: their environment (the
engine's variables, threads, where the user's code is, the image's variables, the user's
cluster.env), whether they need MPI, a Gloo rendezvous server or a torch.distributed store, the
image they run in, and what the dry run says of each. A launcher adds only what it alone knows
(a port, mpirun's or srun's arguments); plan.json keeps the flags (records.RankNeeds)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hpctrain.config.schema import Config
from hpctrain.engine.registry import needs_gloo_rendezvous, needs_mpi
from hpctrain.launch.container.plan import ContainerPlan, container_plan
from hpctrain.launch.plan import rank_env
from hpctrain.parallel import parallel_notes
from hpctrain.parallel.needs import needs_torch_store
from hpctrain.records import Layout, RankNeeds
from hpctrain.workload import workload_env, workload_notes


@dataclass(frozen=True)
class Needs:
    env: dict[str, str]
    flags: RankNeeds
    box: ContainerPlan | None  # the image the ranks run in (None: on the host)
    notes: list[str]  # the container's, the workload's, then the layout's


def rank_needs(
    cfg: Config,
    layout: Layout,
    threads: int,
    home: Path,
    paths: Iterable[str],
    gpus: bool,
    ranks_per_node: int,
    requeue_dir: str | None = None,
) -> Needs:
    """`layout`: the plan's (parallel.derive); `home`: where the user's code snapshot goes (the run's directory, or its sweep's);
    `paths`: the directories the launcher writes to (bound into an image); `gpus`: whether the
    ranks use GPUs; `requeue_dir`: a SLURM job's submitit folder."""
    env = rank_env(cfg, threads)  # the engine's, threads, the user's
    flags = RankNeeds(
        mpi=needs_mpi(cfg), gloo_rendezvous=needs_gloo_rendezvous(cfg), torch_store=needs_torch_store(cfg)
    )
    env.update(workload_env(cfg, home))
    workload = workload_notes(cfg)
    box = container_plan(cfg, paths, gpus, requeue_dir=requeue_dir)
    env.update(box.env if box else {})
    notes = [*([box.note] if box else []), *workload, *parallel_notes(cfg, layout, ranks_per_node)]
    return Needs(env, flags, box, notes)
