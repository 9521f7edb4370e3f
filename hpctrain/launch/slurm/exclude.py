"""A SLURM job whose pre-flight check judged nodes bad (cluster.preflight) is submitted again
without them by its own batch script's teardown (restart.py), so it goes on whether or not an
`hpctrain run` waits for it (--no-wait): the new job runs in the same run directory with the bad
nodes in cluster.exclude (sbatch --exclude) and out of cluster.nodelist, job.json names it, and a
waiting `hpctrain run` follows it (orchestrate/runs.py resubmitted), at most
cluster.preflight.max_resubmits times. (SLURM refuses to change a running job's excluded nodes,
and a requeued job cannot change them itself: its batch script is gone by then.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpctrain import records
from hpctrain.config.schema import Config
from hpctrain.launch.base import RunSpec
from hpctrain.records.preflight import bad_hosts, checks

FAILED = "PreflightFailed"  # train/preflight.py's exception, as the ranks' error records name it
# the failed job's own variables, which the new job's batch script would otherwise inherit
# (SLURM_CONF, where the cluster is, stays)
JOB_VARS = ("SLURM_", "SUBMITIT_", "HPCTRAIN_ATTEMPT", "HPCTRAIN_PLAN")
KEEP = frozenset({"SLURM_CONF"})


def _say(text: str) -> None:
    print(f"hpctrain: {text}", file=sys.stderr, flush=True)


def bad_nodes_to_leave(cfg: Config, run_dir: Path) -> list[str]:
    """The nodes the step's failed check judged bad, when the job should go again without them;
    [] when it should not (another failure, or max_resubmits checks found bad nodes already)."""
    first = records.first_error(run_dir, causes_only=True)
    done = checks(run_dir)
    if first is None or first.type != FAILED or not done or not bad_hosts(done[-1]):
        return []
    failed, most = sum(1 for c in done if bad_hosts(c)), cfg.cluster.preflight.max_resubmits
    if failed > most:
        _say(
            f"not submitted again: {failed} pre-flight check(s) found bad nodes (cluster.preflight.max_resubmits={most})"
        )
        return []
    return bad_hosts(done[-1])


def resubmitted_without_bad_nodes(cfg: Config, run_dir: Path) -> bool:
    """True when the step failed its check and the run is submitted again without the bad nodes."""
    bad = bad_nodes_to_leave(cfg, run_dir)
    if not bad:
        return False
    from hpctrain.launch.slurm.launcher import SlurmLauncher

    for var in [v for v in os.environ if v.startswith(JOB_VARS) and v not in KEEP]:
        del os.environ[var]
    launcher = SlurmLauncher()
    spec = RunSpec(0, [], cfg, launcher.plan(cfg, run_dir))
    try:
        _, job = launcher.resubmit_excluding(spec, bad)
    except Exception as e:  # noqa: BLE001 - sbatch refused, the cluster is unreachable: the run ends as it failed
        _say(f"could not submit the run again without {', '.join(bad)}: {type(e).__name__}: {e}")
        return False
    _say(f"pre-flight check judged {', '.join(bad)} bad: submitted again as job {job.job_id} without them")
    return True
