"""The launch side: every job of a Hydra sweep becomes one hpctrain run whose ranks all run the
app's task function (rank.py), started together through hpctrain's own launcher for the cluster
(a local sweep one point after another, a SLURM sweep as one job array), followed to its end, and
answered with each point's JobReturn from rank 0.

The jobs of one launch are one hpctrain sweep in <hydra.sweep.dir>/.hpctrain (.hpctrain-2, ... for
a sweeper's later batches, or the app run again into the same sweep.dir), beside Hydra's own
output directories, job i of the batch in its directory i: `hpctrain status`, `logs`, `cancel`,
`analyze` and `track` work on them as on any hpctrain sweep.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.errors import CompactHydraException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from hpctrain.errors import Problem
from hydra_plugins.hpctrain_launcher.config import RunSettings
from hydra_plugins.hpctrain_launcher.rank import path_file, return_file

if TYPE_CHECKING:  # hpctrain's launch side is imported when a sweep is launched: Hydra imports
    # every plugin module of every installed plugin at each app's start
    from hpctrain.config.schema import Config
    from hpctrain.launch.base import Job
    from hpctrain.launch.base import JobStatus as RunStatus
    from hpctrain.launch.base import Launcher as RunLauncher

log = logging.getLogger(__name__)

RUNS_DIR = ".hpctrain"  # in hydra.sweep.dir: the sweep's hpctrain runs, one per job
TASKS = "tasks"  # in RUNS_DIR: each job's payload <i>.pkl (what its ranks run), rank 0's JobReturn
ENTRY = "hydra_task.py"  # in RUNS_DIR: the script every rank runs
ENTRY_TEXT = (
    '"""Written by hpctrain\'s Hydra launcher: every rank runs the sweep point\'s task function."""\n'
    "import sys\n\n"
    "from hydra_plugins.hpctrain_launcher.rank import main\n\n"
    "sys.exit(main(sys.argv[1]))\n"
)
RUN_KEYS = {"backend", "stall_timeout_s", "timeout_min", "_target_"}


class Reporter:
    """hpctrain's progress, as the app's log and output: rank 0's lines of a point running on this
    machine are printed, as the basic launcher's task would print them."""

    def note(self, text: str) -> None:
        log.info(text)

    def line(self, text: str) -> None:
        print(text, flush=True)

    def event(self, event: dict[str, Any]) -> None:
        pass

    def begin(self, label: str, steps: int) -> None:
        if label:
            log.info(label)


class HpctrainLauncher(Launcher):
    cluster: ClassVar[str]

    def __init__(self, **settings: Any) -> None:
        self.settings = plain(settings)
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """hpctrain's errors reach Hydra as a compact exception: its message alone, as Hydra shows
        its own configuration errors, with the launcher's settings named as the user set them."""
        from hpctrain.errors import HpctrainError

        try:
            return self._launch(job_overrides, initial_job_idx)
        except HpctrainError as e:
            raise HpctrainLauncherError(launcher_message(e)) from None

    def _launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        from hpctrain.errors import ConfigError
        from hpctrain.launch.registry import launcher_for
        from hpctrain.launch.rundir import claim_fresh
        from hpctrain.orchestrate.runs import follow, placed, start
        from hpctrain.orchestrate.validate import validate_points

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        settings = run_settings(self.settings)
        points = [list(o) for o in job_overrides]
        labels = [f"job {initial_job_idx + i}" for i in range(len(points))]
        # everything is checked before anything is created: the settings, every point's run (its
        # entry script stands in for the one written below) and every point's Hydra config
        if bad := settings_problems(settings):
            raise ConfigError(bad)
        draft = self._config(Path(__file__).with_name("rank.py"), settings)
        launcher = launcher_for(draft)
        validate_points([draft] * len(points), labels, launcher.facts)
        payloads = [self._payload(o, initial_job_idx + i) for i, o in enumerate(points)]
        # each call its own: a sweeper's later batch, or the app run again into the same sweep.dir
        home = claim_fresh(Path(str(self.config.hydra.sweep.dir)).absolute() / RUNS_DIR)
        (home / ENTRY).write_text(ENTRY_TEXT)
        base = self._config(home / ENTRY, settings)
        configs = [  # each point's own payload; placed() gives each its run directory home/<i>
            dataclasses.replace(
                base, script=dataclasses.replace(base.script, args=[str(payload_file(home, i))])
            )
            for i in range(len(points))
        ]
        for i, payload in enumerate(payloads):
            self._write_payload(payload_file(home, i), payload)
        prep = placed(launcher, list(zip(points, configs)), home, sweep=True, dated=False)
        log.info(f"hpctrain: {len(points)} job(s) on cluster {self.cluster}; runs in {home}")
        jobs = start(prep, detach=False)
        states = follow(
            launcher, jobs, Reporter(), settings.timeout_min * 60, labels=job_labels(points, initial_job_idx)
        )
        return [
            job_return(
                read_return(return_file(payload_file(home, i))), points[i], launcher, job, states[job.job_id]
            )
            for i, job in enumerate(jobs)
        ]

    def _config(self, entry: Path, settings: RunSettings) -> Config:
        """The points' hpctrain config: the cluster settings as given, the task as its script."""
        import yaml

        from hpctrain.config.load import config_from_yaml

        cluster = {k: v for k, v in self.settings.items() if k not in RUN_KEYS}
        data = {
            "cluster": {**cluster, "name": self.cluster},
            "parallelism": {"backend": str(settings.backend)},
            "script": {
                "path": str(entry),
                "stall_timeout_s": settings.stall_timeout_s,
            },
            # every rank starts where the app was started, as the basic launcher's task runs (the
            # app's own modules reach the ranks through its import path: rank.py)
            "code": {"dir": os.getcwd(), "snapshot": False},
        }
        return config_from_yaml(yaml.safe_dump(data))

    def _payload(self, overrides: list[str], num: int) -> bytes:
        """What the point's ranks need: the task function, the point's config (composed here, so a
        bad override fails before anything is created), the launcher's Hydra context and
        singletons (the ConfigStore, resolvers), as submitit's launcher sends them."""
        assert self.config is not None and self.hydra_context is not None
        import cloudpickle

        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{num}"  # rank.py: the SLURM job id where there is one
            sweep_config.hydra.job.num = num
        payload = {
            "task_function": self.task_function,
            "config": sweep_config,
            "hydra_context": self.hydra_context,
            "singletons": Singleton.get_state(),
        }
        return bytes(cloudpickle.dumps(payload))

    def _write_payload(self, path: Path, payload: bytes) -> None:
        from hpctrain import records

        path.parent.mkdir(parents=True, exist_ok=True)
        path_file(path).write_text("\n".join(p for p in sys.path if p) + "\n")
        records.write_atomic(path, payload)


class HpctrainLocalLauncher(HpctrainLauncher):
    cluster = "local"


class HpctrainSlurmLauncher(HpctrainLauncher):
    cluster = "slurm"


def plain(value: Any) -> Any:
    """Hydra's instantiate hands nested settings over as DictConfig/ListConfig, enums as members."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value.value if isinstance(value, Enum) else value


class HpctrainLauncherError(CompactHydraException):
    """An hpctrain error in a Hydra launch: Hydra prints its message, without a traceback."""


# the launcher's settings as the user sets them, for what hpctrain's rules call them
SETTING_NAMES = {"script.stall_timeout_s": "stall_timeout_s", "parallelism.backend": "backend"}


def launcher_message(e: Exception) -> str:
    """The error with hpctrain's keys renamed to the hydra.launcher settings they came from."""
    from hpctrain.errors import ConfigError

    if not isinstance(e, ConfigError):
        return f"hpctrain's launcher: {e}"

    def named(text: str) -> str:
        for old, new in SETTING_NAMES.items():
            text = text.replace(old, f"hydra.launcher.{new}")
        return re.sub(r"\bcluster\.", "hydra.launcher.", text)

    renamed = [
        dataclasses.replace(p, key=named(p.key), rule=named(p.rule), fix=named(p.fix)) for p in e.problems
    ]
    return f"hpctrain's launcher: {ConfigError(renamed)}"


def settings_problems(s: RunSettings) -> list[Problem]:
    """The launcher's own settings (the rest are hpctrain's cluster settings, checked as such)."""
    if math.isfinite(s.timeout_min) and s.timeout_min > 0:
        return []
    return [
        Problem(
            "hydra.launcher.timeout_min",
            f"must be a positive number of minutes (got {s.timeout_min})",
            "e.g. hydra.launcher.timeout_min=60: how long the app waits for its jobs",
        )
    ]


def run_settings(settings: dict[str, Any]) -> RunSettings:
    return RunSettings(
        **{k: settings[k] for k in ("backend", "stall_timeout_s", "timeout_min") if k in settings}
    )


def job_labels(points: Sequence[Sequence[str]], first: int) -> list[str]:
    return [
        f"job {first + i}: {' '.join(filter_overrides(list(p))) or '(no overrides)'}"
        for i, p in enumerate(points)
    ]


def job_return(
    ret: JobReturn | None, overrides: list[str], launcher: RunLauncher[Any], job: Job, status: RunStatus
) -> JobReturn:
    """What Hydra gets for a job: rank 0's JobReturn; where the run failed on another rank (or
    before rank 0 returned), FAILED with hpctrain's error naming the rank, as the return value
    Hydra raises. A task that failed on rank 0 keeps its own exception, as under Hydra's basic
    launcher."""
    from hpctrain.errors import HpctrainError
    from hpctrain.records import State

    if status.state == State.COMPLETED and ret is not None:
        return ret
    if ret is not None and ret.status == JobStatus.FAILED:
        return ret
    err: HpctrainError = launcher.failure(job, status)
    if ret is None:
        return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=err)
    ret.status, ret._return_value = JobStatus.FAILED, err
    return ret


def payload_file(home: Path, i: int) -> Path:
    return home / TASKS / f"{i}.pkl"


def read_return(path: Path) -> JobReturn | None:
    """Rank 0's JobReturn, or None where the run ended before it was written."""
    import cloudpickle

    from hpctrain.errors import LaunchError

    try:
        ret = cloudpickle.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - a damaged file says so
        raise LaunchError(f"{path} does not load ({type(e).__name__}: {e})") from e
    return ret if isinstance(ret, JobReturn) else None
