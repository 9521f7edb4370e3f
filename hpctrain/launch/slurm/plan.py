"""SlurmPlan: submitit executor parameters, rank environment and the sbatch script, computed
without I/O. `hpctrain run cluster=slurm --dry-run` prints the script and submits nothing."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config.schema import Config, SlurmClusterConf
from hpctrain.launch.needs import rank_needs
from hpctrain.parallel import derive
from hpctrain.records import FORMAT_VERSION, RankPlan, to_dict

SUBMIT_MODULE = "submitit.core._submit"  # what submitit's sbatch script runs in every task


@dataclass(frozen=True, kw_only=True)
class SlurmPlan(RankPlan):
    """A SLURM submission: the shared plan (its env exported in the sbatch script, srun passing
    it to every task) plus submitit's parameters."""

    executor: dict[str, Any]  # submitit SlurmExecutor.update_parameters(**executor)
    python: str  # the interpreter command each task runs (inside the container, if any)
    folder: str  # submitit's folder for pickles and logs (%j = job id)
    max_requeues: int
    container: dict[str, Any] | None = None  # runtime, image and binds when the ranks run in one
    max_restarts: int = 0  # train.max_restarts: the teardown restarts a failed step (restart.py)

    def shape(self) -> str:
        """Runs with the same shape share one sbatch script and so one job array."""
        params = {k: v for k, v in self.executor.items() if k != "job_name"}
        return json.dumps({"executor": params, "python": self.python}, sort_keys=True)

    def sbatch_script(self, array_size: int | None = None) -> str:
        """The script submitit would submit (via its own renderer, so it is the real text)."""
        from submitit.slurm.slurm import _make_sbatch_string

        command = f"{self.python} -u -m {SUBMIT_MODULE} {shlex.quote(self.folder)}"
        return _make_sbatch_string(command=command, folder=self.folder, map_count=array_size, **self.executor)

    def to_dict(self) -> dict[str, Any]:
        """plan.json (a records.PlanRecord plus the submitit details)."""
        d = to_dict(self)  # records' plain form: dataclasses.asdict deep-copies every value
        d.update(format_version=FORMAT_VERSION, launcher="slurm")
        return d


def executor_parameters(cfg: Config, env: dict[str, str], srun_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for this config (names as submitit spells them)."""
    c: SlurmClusterConf = cfg.cluster
    params: dict[str, Any] = {
        "job_name": cfg.run.name,
        "time": c.time_min,
        "nodes": c.nodes,
        "ntasks_per_node": c.ranks_per_node,
        "cpus_per_task": c.cpus_per_rank,
        "signal_delay_s": c.signal_delay_s,
        "array_parallelism": c.array_parallelism,
        # One task per rank; if any rank dies, srun ends the others instead of leaving them
        # blocked in an allreduce.
        "srun_args": [f"--mpi={c.mpi}", "--kill-on-bad-exit=1", *srun_args, *c.srun_args],
        "setup": [*c.setup, *(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))],
        "stderr_to_stdout": False,
    }
    optional = {
        "partition": c.partition,
        "account": c.account,
        "qos": c.qos,
        "constraint": c.constraint,
        "gpus_per_node": c.gpus_per_node or None,
        "mem": f"{c.mem_gb:g}GB" if c.mem_gb else None,
        "exclusive": True if c.exclusive else None,
        "exclude": ",".join(c.exclude) or None,  # nodes judged bad (cluster.preflight) or named
        "nodelist": ",".join(c.nodelist) or None,
        "dependency": c.dependency,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


def restart_teardown(host_python: str, folder: str) -> list[str]:
    """The batch script's last lines: after srun's step failed, restart it in the allocation while
    it failed in a way a restart can outlive, or retry a start that died before the ranks met
    (restart.py); the script exits with the last status. On the host, outside any container: it
    starts the job steps."""
    return [
        "hpctrain_status=$?",
        f'[ "$hpctrain_status" = 0 ] || {shlex.quote(host_python)} -m hpctrain.launch.slurm.restart '
        f'{shlex.quote(folder)} "$hpctrain_status"',
    ]


def plan_slurm(cfg: Config, run_dir: str, python: str, folder: str | None = None) -> SlurmPlan:
    c: SlurmClusterConf = cfg.cluster
    home = Path(folder).parent if folder else Path(run_dir)  # a sweep's runs share its directory
    folder = folder or c.submitit_folder or str(Path(run_dir) / "submitit")
    paths = [str(Path(run_dir).parent), str(Path(folder).parent)]
    d = derive(cfg)
    needs = rank_needs(
        cfg, d.layout, c.cpus_per_rank, home, paths, c.gpus_per_node > 0, c.ranks_per_node, folder
    )
    env, box = needs.env, needs.box
    py = shlex.join(box.python) if box else shlex.quote(python)
    executor = executor_parameters(cfg, env, box.srun_args if box else ())
    # restarts, a start retried once, bad nodes excluded: all decided after a failed step
    executor["teardown"] = restart_teardown(python, folder)
    if cfg.train.max_restarts:
        # a lost node leaves the job running, so the teardown decides: go on with the nodes left
        # (train.elastic) or requeue to the full size (SLURM would otherwise end the job)
        executor["additional_parameters"] = {"no_kill": True}
    return SlurmPlan(
        run_dir=run_dir,
        world_size=d.world_size,
        nodes=c.nodes,
        ranks_per_node=c.ranks_per_node,
        batch=d.batch,
        lr=d.lr,
        env=env,
        executor=executor,
        python=py,
        folder=folder,
        max_requeues=c.max_requeues,
        container=box.record if box else None,
        max_restarts=cfg.train.max_restarts,
        layout=d.layout,
        notes=needs.notes,  # what the dry run says, as the local plan says it
        needs=needs.flags,
    )
