"""JobPlan: everything needed to launch a run, computed without I/O. `--dry-run` prints it.

Host facts (cores, root, ...) and the Python executable are passed in, never read here, so the
same inputs always give the same plan (and the dry-run snapshot test can pin it).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.config.schema import Config, LocalClusterConf
from hpctrain.facts import HostFacts
from hpctrain.launch.needs import rank_needs
from hpctrain.launch.plan import AT_LAUNCH
from hpctrain.parallel import derive
from hpctrain.records import FORMAT_VERSION, RankNeeds, RankPlan, to_dict


@dataclass(frozen=True, kw_only=True)
class JobPlan(RankPlan):
    """A local launch: the shared plan plus the command that starts the ranks."""

    threads_per_rank: int
    argv: list[str] = field(default_factory=list)  # the launch command, one argument per item
    container: dict[str, Any] | None = None  # runtime, image and binds when the ranks run in one
    max_restarts: int = 0  # train.max_restarts: the supervisor restarts a failed run this often

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        """plan.json (a records.PlanRecord plus the mpirun details)."""
        d = to_dict(self)  # records' plain form: dataclasses.asdict deep-copies every value
        d.update(format_version=FORMAT_VERSION, launcher="local", command_line=self.command_line)
        return d


def mpirun_prefix(
    ranks: int,
    cpu_count: int,
    is_root: bool,
    mpirun: str = "mpirun",
    oversubscribe: bool | None = None,
    threads: int | None = None,
) -> tuple[list[str], list[str]]:
    """The mpirun flags every local launch uses (training and benchmarks), and notes on them."""
    notes: list[str] = []
    argv = [mpirun, "-np", str(ranks), "--bind-to", "none", "--map-by", "slot"]
    if oversubscribe if oversubscribe is not None else ranks > cpu_count:
        argv.append("--oversubscribe")
        notes.append(f"{ranks} ranks on {cpu_count} cores: oversubscribing (slower, but runs)")
    elif ranks * (threads or max(1, cpu_count // ranks)) >= cpu_count:
        # A rank waiting in MPI busy-polls a core by default; when the ranks' threads already fill
        # every core, that polling steals the core compute needs (measured: `hpctrain bench overhead`).
        # Oversubscribed runs get this from OpenMPI itself.
        argv += ["--mca", "mpi_yield_when_idle", "1"]
        notes.append(
            "ranks x threads fill the cores: MPI yields the core while it waits (mpi_yield_when_idle=1)"
        )
    if is_root:
        argv.append("--allow-run-as-root")  # OpenMPI refuses root without it
    return argv, notes


def mpirun_argv(
    c: LocalClusterConf, facts: HostFacts, env: dict[str, str], python: list[str], run_dir: str
) -> tuple[list[str], list[str]]:
    """mpirun command for a local launch, and notes on the choices made."""
    threads = c.threads_per_rank or max(1, facts.cpu_count // c.ranks)
    argv, notes = mpirun_prefix(c.ranks, facts.cpu_count, facts.is_root, c.mpirun, c.oversubscribe, threads)
    argv.append("--tag-output")  # rank-tagged lines: the launcher splits them per rank
    for key in sorted(env):
        # a value known only at launch is exported from mpirun's own environment
        argv += ["-x", key if env[key] == AT_LAUNCH else f"{key}={env[key]}"]
    argv += ["-x", "PATH"]  # so remote or wrapped shells find the same python
    argv += list(c.extra_args)
    argv += [*python, "-m", "hpctrain.rank", run_dir]
    return argv, notes


def uses_spawn(c: LocalClusterConf, facts: HostFacts, needs: RankNeeds) -> bool:
    """Start the ranks with hpctrain's spawn rather than mpirun: asked for, or (auto) when no
    mpirun is found and nothing needs MPI (a GPU node or container often has none)."""
    if c.starter != "auto":
        return c.starter == "spawn"
    return not facts.mpirun_found and c.mpirun == "mpirun" and not needs.mpi


def spawn_argv(
    c: LocalClusterConf, env: dict[str, str], host_python: str, python: list[str], run_dir: str
) -> list[str]:
    """The spawn command for a local launch: mpirun's interface (launch/local/spawn.py), so the
    supervisor reads its output and failures the same way. The spawner runs on the host; the
    ranks run `python` (a container's wrapper and interpreter, or the host's)."""
    argv = [host_python, "-m", "hpctrain.launch.local.spawn", "-np", str(c.ranks), "--tag-output"]
    for key in sorted(env):
        argv += ["-x", key if env[key] == AT_LAUNCH else f"{key}={env[key]}"]
    return [*argv, "--", *python, "-m", "hpctrain.rank", run_dir]


SPAWN_NOTE = "ranks start without MPI (cluster.starter): one process each, as torchrun starts them"

GLOO_HOST = "localhost"  # the host name local Gloo ranks and the rendezvous server agree on


def gloo_env(port: int | None) -> dict[str, str]:
    """Where local Gloo ranks meet the launcher's rendezvous server (its port is known at launch)."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port) if port is not None else AT_LAUNCH,
        "HOROVOD_GLOO_IFACE": "lo",
        "HPCTRAIN_GLOO_HOSTNAME": GLOO_HOST,
    }


def plan_local(
    cfg: Config,
    facts: HostFacts,
    run_dir: str,
    python: str,
    rendezvous_port: int | None = None,
    home: str | None = None,
) -> JobPlan:
    """`home`: where the user's code snapshot goes (the sweep directory in a sweep)."""
    c: LocalClusterConf = cfg.cluster
    d = derive(cfg)
    n = d.world_size
    threads = c.threads_per_rank or max(1, facts.cpu_count // n)
    paths = [str(Path(run_dir).parent), home or run_dir]
    needs = rank_needs(
        cfg, d.layout, threads, Path(home or run_dir), paths, facts.on_gpus(cfg.train.device), n
    )
    env = dict(needs.env)
    if needs.flags.gloo_rendezvous:
        env.update(gloo_env(rendezvous_port))  # Horovod over Gloo: the launcher's rendezvous
    if needs.flags.torch_store and "MASTER_PORT" not in env:  # its store: a free port at launch
        env["MASTER_PORT"] = AT_LAUNCH
    box = needs.box
    rank_python = box.python if box else [python]
    if uses_spawn(c, facts, needs.flags):
        argv, notes = spawn_argv(c, env, python, rank_python, run_dir), [SPAWN_NOTE]
    else:
        argv, notes = mpirun_argv(c, facts, env, rank_python, run_dir)
    return JobPlan(
        run_dir=run_dir,
        world_size=n,
        nodes=1,
        ranks_per_node=n,
        threads_per_rank=threads,
        batch=d.batch,
        lr=d.lr,
        env=env,
        argv=argv,
        notes=notes + needs.notes,
        container=box.record if box else None,
        max_restarts=cfg.train.max_restarts,
        layout=d.layout,
        needs=needs.flags,
    )
