"""hydra/launcher=hpctrain_slurm passes Hydra's own launcher test suites, unmodified, on the local
SLURM cluster: every launch is one job array, each sweep point one hpctrain run whose rank runs
the task function, with its JobReturn handed back to Hydra."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import OmegaConf

from tests.conftest import hpctrain, recorded_steps, signal_at_step, wait_for
from tests.hydra.tasks import sweep_of, train

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SLURM = ["hydra/launcher=hpctrain_slurm", "hydra.launcher.nodes=1", "hydra.launcher.time_min=5"]


@pytest.mark.parametrize("launcher_name, overrides", [("hpctrain_slurm", SLURM[1:])])
class TestHpctrainSlurmLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", *SLURM])])
class TestHpctrainSlurmLauncherIntegration(IntegrationTestSuite):
    pass


# against SLURM 24.11 too: Horovod over MPI, whose start (srun --mpi=pmix) is what versions change
@pytest.mark.parametrize("engine", ["ddp", pytest.param("horovod", marks=pytest.mark.slurm_versions)])
def test_two_nodes_of_two_ranks_end_on_one_ranks_weights(
    hydra_sweep_runner: TSweepRunner, hydra_restore_singletons: None, tmp_path: Path, engine: str
) -> None:
    """The multi-node run users ask Hydra's SLURM launcher for: one sweep point on 2 nodes x 2
    ranks, trained with DDP over Gloo or Horovod over MPI inside the task, equal to one rank. The
    Horovod point is sent SLURM's time-limit signal after step 5: the task checkpoints through
    hpctrain.api, the job is requeued, the task resumes at step 5, and Hydra gets the weights of
    the uninterrupted run from the requeued job."""
    launcher = ["hydra/launcher=hpctrain_slurm", "hydra.launcher.nodes=2", "hydra.launcher.ranks_per_node=2"]
    held = ["+hold=4"] if engine == "horovod" else []
    sweep = sweep_of(
        hydra_sweep_runner, tmp_path, train, [*launcher, f"+engine={engine}", "+steps=8", "+lr=0.1", *held]
    )
    run = tmp_path / "sweep" / ".hpctrain" / "0"

    def at_step_5() -> None:
        wait_for("the point's job", lambda: (run / "job.json").exists(), 120)
        signal_at_step(run, 5)

    signal = threading.Thread(target=at_step_5 if held else lambda: None, daemon=True)
    signal.start()
    with sweep:
        assert sweep.returns is not None
        ((ret,),) = sweep.returns
        alone = train(OmegaConf.create({"engine": engine, "steps": 8, "lr": 0.1}))
        assert ret.return_value == pytest.approx(alone, rel=1e-5, abs=1e-6)
        env = json.loads((run / "env.json").read_text())
        assert env["launcher"]["SLURM_NNODES"] == "2" and env["torch"], env
        assert json.loads((run / "summary.json").read_text())["world_size"] == 4
        signal.join(timeout=5)
        log = hpctrain("logs", str(run)).stdout
        resumed = f"resuming from {run / 'checkpoints' / 'step-000005.pt'} at step 5"
        assert (resumed in log) == bool(held), log
        assert recorded_steps(run, 0) == list(range(8))  # none lost, none repeated
    # (the runner removes the sweep directory when the block ends)
