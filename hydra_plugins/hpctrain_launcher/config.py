"""The launchers' settings under `hydra.launcher`: hpctrain's cluster settings under their own names
(cluster.ranks locally; nodes, ranks_per_node, partition, time_min, gpus_per_node, ... on SLURM:
submitit's names), plus the backend the ranks start with, registered in Hydra's ConfigStore. Typed, so
an unknown key is refused by Hydra as it is by hpctrain."""

# no `from __future__ import annotations`: Hydra's plugin scan runs this module outside
# sys.modules, where dataclasses cannot resolve string annotations
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from hpctrain.config.options import Backend
from hpctrain.config.schema import LocalClusterConf, SlurmClusterConf

PACKAGE = "hydra_plugins.hpctrain_launcher.launcher"


@dataclass
class RunSettings:
    """What every point's run needs beyond its cluster: how its ranks start and how long the
    launcher waits. The task chooses its framework itself, as a script under `hpctrain run` does:
    every rank gets torch.distributed's variables (torchrun's) and Horovod's."""

    # parallelism.backend: mpi starts the ranks under MPI (mpirun; srun --mpi on SLURM), which
    # Horovod over MPI needs; gloo gives Horovod a Gloo rendezvous instead
    backend: Backend = Backend.mpi
    # a rank with no output and no CPU use for this long is stalled: the run ends naming it, with
    # its Python stack (script.stall_timeout_s); 0 = off
    stall_timeout_s: float = 600.0
    timeout_min: float = 60.0  # how long the launcher waits for the sweep's jobs to end


@dataclass
class HpctrainLocalConf(RunSettings, LocalClusterConf):
    _target_: str = f"{PACKAGE}.HpctrainLocalLauncher"
    ranks: int = 2


@dataclass
class HpctrainSlurmConf(RunSettings, SlurmClusterConf):
    _target_: str = f"{PACKAGE}.HpctrainSlurmLauncher"


ConfigStore.instance().store(
    group="hydra/launcher", name="hpctrain_local", node=HpctrainLocalConf, provider="hpctrain"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="hpctrain_slurm", node=HpctrainSlurmConf, provider="hpctrain"
)
