"""hydra/launcher=hpctrain_slurm passes Hydra's own launcher test suites, unmodified, on the local
SLURM cluster: every launch is one job array, each sweep point one hpctrain run whose rank runs
the task function, with its JobReturn handed back to Hydra."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import OmegaConf

from tests.hydra.tasks import sweep_of, train

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SLURM = ["hydra/launcher=hpctrain_slurm", "hydra.launcher.nodes=1", "hydra.launcher.time_min=5"]


@pytest.mark.parametrize("launcher_name, overrides", [("hpctrain_slurm", SLURM[1:])])
class TestHpctrainSlurmLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", *SLURM])])
class TestHpctrainSlurmLauncherIntegration(IntegrationTestSuite):
    pass


@pytest.mark.parametrize("engine", ["ddp", "horovod"])
def test_two_nodes_of_two_ranks_end_on_one_ranks_weights(
    hydra_sweep_runner: TSweepRunner, hydra_restore_singletons: None, tmp_path: Path, engine: str
) -> None:
    """The multi-node run users ask Hydra's SLURM launcher for: one sweep point on 2 nodes x 2
    ranks, trained with DDP over Gloo or Horovod over MPI inside the task, equal to one rank."""
    launcher = ["hydra/launcher=hpctrain_slurm", "hydra.launcher.nodes=2", "hydra.launcher.ranks_per_node=2"]
    sweep = sweep_of(
        hydra_sweep_runner, tmp_path, train, [*launcher, f"+engine={engine}", "+steps=3", "+lr=0.1"]
    )
    with sweep:
        assert sweep.returns is not None
        ((ret,),) = sweep.returns
        alone = train(OmegaConf.create({"engine": engine, "steps": 3, "lr": 0.1}))
        assert ret.return_value == pytest.approx(alone, rel=1e-5, abs=1e-6)
        run = tmp_path / "sweep" / ".hpctrain" / "0"
        env = json.loads((run / "env.json").read_text())
        assert env["launcher"]["SLURM_NNODES"] == "2" and env["torch"], env
        assert json.loads((run / "summary.json").read_text())["world_size"] == 4
