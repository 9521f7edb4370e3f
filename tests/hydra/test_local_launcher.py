"""hydra/launcher=hpctrain_local passes Hydra's own launcher test suites, unmodified, as
hydra-submitit-launcher's tests run them: every sweep point is one hpctrain run under mpirun
running the task function, with rank 0's JobReturn handed back to Hydra. The suites check Hydra's
contract (sweeps, directories, overrides) with one rank a point; the tests below check what two
ranks add (every rank runs the task, rank 0's return, a failure on rank 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.core.utils import JobStatus
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import OmegaConf

from hpctrain.errors import RankFailure
from tests.conftest import hpctrain
from tests.hydra.tasks import fail_on_rank_1, sweep_of, train

pytestmark = pytest.mark.mpi

LOCAL = ["hydra/launcher=hpctrain_local", "hydra.launcher.ranks=2"]
ONE_RANK = ["hydra/launcher=hpctrain_local", "hydra.launcher.ranks=1"]


@pytest.mark.parametrize("launcher_name, overrides", [("hpctrain_local", ONE_RANK[1:])])
class TestHpctrainLocalLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", *ONE_RANK])])
class TestHpctrainLocalLauncherIntegration(IntegrationTestSuite):
    pass


def test_a_task_failing_on_one_rank_fails_its_job_naming_the_rank_and_leaves_records(
    hydra_sweep_runner: TSweepRunner, hydra_restore_singletons: None, tmp_path: Path
) -> None:
    """Rank 0 returns; rank 1 raises: the job is FAILED with hpctrain's error naming rank 1 and its
    exception (what Hydra raises), and `hpctrain status` reads the sweep's records."""
    sweep = sweep_of(hydra_sweep_runner, tmp_path, fail_on_rank_1, [*LOCAL, "+x=7"])
    with pytest.raises(RankFailure, match=r"rank 1 failed: ValueError: rank 1 refuses x=7"):
        with sweep:
            pass
    status = hpctrain("status", str(tmp_path / "sweep" / ".hpctrain"))
    assert "FAILED" in status.stdout and "rank 1" in status.stdout, status.stdout + status.stderr


def test_every_rank_runs_the_task_and_hydra_gets_rank_0s_return(
    hydra_sweep_runner: TSweepRunner, hydra_restore_singletons: None, tmp_path: Path
) -> None:
    """Two points, each a two-rank run of DDP over Gloo, each ending on one rank's weights."""
    sweep = sweep_of(hydra_sweep_runner, tmp_path, train, [*LOCAL, "+engine=ddp", "+steps=3", "+lr=0.05,0.1"])
    with sweep:
        assert sweep.returns is not None
        (rets,) = sweep.returns
        for ret, lr in zip(rets, (0.05, 0.1)):
            assert ret.status == JobStatus.COMPLETED and ret.overrides == [
                "+engine=ddp",
                "+steps=3",
                f"+lr={lr}",
            ]
            alone = train(OmegaConf.create({"engine": "ddp", "steps": 3, "lr": lr}))
            assert ret.return_value == pytest.approx(alone, rel=1e-5, abs=1e-6)
        for i in (0, 1):
            summary = json.loads((tmp_path / "sweep" / ".hpctrain" / str(i) / "summary.json").read_text())
            assert summary["world_size"] == 2
