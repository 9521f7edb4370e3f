"""The cluster settings (the `cluster` group): what every launcher understands, and each
built-in launcher's own (local mpirun, SLURM through submitit). Re-exported by schema.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional

from omegaconf import MISSING

from hpctrain.config.container import ContainerConf
from hpctrain.config.options import MpiPlugin, RankStarter


@dataclass
class PreflightConf:
    """cluster.preflight: before training, each rank times a GEMM and a ring exchange with the
    next rank; a node slower than (1 - tolerance) x the nodes' median (or a reference) is bad
    (analysis/preflight.py)."""

    enabled: bool = False  # run the check before training
    tolerance: float = 0.5  # a node may fall this far below the median before it is bad
    min_tflops: Optional[float] = None  # a reference: each node's compute at the run's precision
    min_link_gbps: Optional[float] = None  # a reference: each node's links to other nodes, GB/s
    max_resubmits: int = 2  # SLURM: resubmissions excluding bad nodes before the run gives up
    # an earlier run or study of the same config whose checks' good nodes are a reference too
    reference: Optional[str] = None
    only: bool = False  # check the nodes and stop before training (hpctrain preflight)


@dataclass
class ClusterConf:
    """Fields every launcher understands, and what planning asks of any cluster (its world size,
    what a study scales) without asking the launcher itself."""

    name: str = (
        MISSING  # the launcher: local or slurm, set by the cluster option (a site preset builds on one)
    )
    env: Dict[str, str] = field(default_factory=dict)  # extra environment for every rank
    container: ContainerConf = field(default_factory=ContainerConf)
    # one device's dense peak at the run's precision, for MFU; null = the known-device table on
    # GPUs (analysis/peak.py), a GEMM probe on CPUs
    peak_tflops: Optional[float] = None
    preflight: PreflightConf = field(default_factory=PreflightConf)
    # the memory each rank has, GiB: a point predicted to need more is refused before it starts;
    # null = what the launcher knows (a GPU's memory; SLURM: mem_gb / ranks_per_node)
    memory_per_rank_gib: Optional[float] = None
    study_scale: ClassVar[str] = "ranks"  # what a study scales: study.<x> -> cluster.<x>
    # whether a run can lose some of its nodes and go on with the rest (train.elastic)
    loses_nodes: ClassVar[bool] = False
    # its scheduler can hold one allocation for many runs, each a job step (study.one_allocation)
    holds_allocations: ClassVar[bool] = False
    # jobs may start, or restart, long after submission: user code is copied at submission so an
    # edit meanwhile changes nothing (code.snapshot=null follows this)
    snapshots_code: ClassVar[bool] = True
    # a short probe run is started for `--estimate` (locally it costs seconds; on a scheduler it
    # would be the submission the estimate is for, so an earlier run is named instead)
    probes_for_estimates: ClassVar[bool] = False

    @property
    def world_size(self) -> int:
        """Ranks the launcher starts."""
        raise NotImplementedError

    @property
    def node_size(self) -> int:
        """Ranks on each node (ranks are placed on nodes in blocks)."""
        return self.world_size

    def one_rank(self) -> ClusterConf:
        """The same cluster settings for one rank on one node without accelerators: a job that only
        reads records (a study's analysis, hpctrain study --analyze-as-job)."""
        raise NotImplementedError


@dataclass
class LocalClusterConf(ClusterConf):
    name: str = "local"
    ranks: int = 2  # processes started by mpirun on this machine
    mpirun: str = "mpirun"  # the mpirun executable
    # how the ranks start: mpirun, spawn (one process per rank as torchrun starts them, no MPI:
    # the torch engines and Horovod over Gloo), or auto: mpirun where it is found or something
    # needs MPI (Horovod over MPI, the allreduce benchmark), else spawn
    starter: RankStarter = RankStarter.auto
    oversubscribe: Optional[bool] = None  # null = only when ranks exceed this machine's cores
    threads_per_rank: Optional[int] = None  # torch/OpenMP threads; null = cores // ranks
    extra_args: List[str] = field(default_factory=list)  # extra mpirun arguments, one per item
    checkpoint_interval: int = 0  # write a checkpoint every N steps (0: none)
    snapshots_code: ClassVar[bool] = False  # the ranks start now, from the code as it is
    probes_for_estimates: ClassVar[bool] = True

    @property
    def world_size(self) -> int:
        return self.ranks

    def one_rank(self) -> LocalClusterConf:
        return dataclasses.replace(
            self, ranks=1, threads_per_rank=1, checkpoint_interval=0, preflight=PreflightConf()
        )


@dataclass
class SlurmClusterConf(ClusterConf):
    """Submission with submitit; parameter names follow submitit's SLURM executor."""

    name: str = "slurm"
    partition: Optional[str] = None  # sbatch --partition; null = the cluster's default
    account: Optional[str] = None  # sbatch --account (the project charged); null = yours
    qos: Optional[str] = None  # sbatch --qos; null = the account's default
    time_min: int = 60  # wall-clock limit per job (requeues start a fresh limit)
    nodes: int = 1  # nodes of each job (world size = nodes x ranks_per_node)
    ranks_per_node: int = 1  # tasks per node; with GPUs, one rank per GPU
    gpus_per_node: int = 0  # GPUs requested per node (--gpus-per-node); 0 = a CPU job
    cpus_per_rank: int = 1  # also the torch/OpenMP threads of each rank
    mem_gb: Optional[float] = None  # memory per node; null = the partition's default
    constraint: Optional[str] = None  # node features, e.g. "a100"
    exclusive: bool = False  # whole nodes only
    setup: List[str] = field(default_factory=list)  # one simple command per line, e.g. "module load cuda"
    srun_args: List[str] = field(default_factory=list)  # extra srun arguments, one per item
    mpi: MpiPlugin = MpiPlugin.pmix  # srun --mpi plugin that starts MPI for Horovod (backend=mpi)
    signal_delay_s: int = 120  # SIGUSR2 this long before the time limit: checkpoint and requeue
    max_requeues: int = 3  # requeues after time-outs before giving up (submitit's max_num_timeout; a preemption's requeue is not counted)
    checkpoint_interval: int = 0  # also checkpoint every N steps (0: only on the signal)
    array_parallelism: int = 64  # array tasks of a sweep running at once
    submitit_folder: Optional[str] = None  # submitit's pickles and logs; null = <run dir>/submitit
    exclude: List[str] = field(default_factory=list)  # nodes never to run on (sbatch --exclude)
    nodelist: List[str] = field(default_factory=list)  # nodes the job must include (sbatch --nodelist)
    dependency: Optional[str] = None  # sbatch --dependency, e.g. afterok:123 (run.after sets it)
    # the cluster behind SSH, from this machine: user@login.example.org or an ~/.ssh/config alias;
    # its hpctrain plans and submits (null: SLURM is here)
    remote: Optional[str] = None
    remote_dir: str = "hpctrain"  # there: code bundles and run directories (relative: to the remote home)
    remote_hpctrain: str = "hpctrain"  # there: the hpctrain command (on the login PATH, or a path)
    remote_ssh_config: Optional[str] = None  # an ssh config file for it (ssh -F); null = ~/.ssh/config
    # SLURM commands (sbatch, squeue, sacct, scontrol, ...) per minute once a burst of 30 is spent:
    # a good citizen under a cluster's per-user RPC limits (hpctrain/launch/slurm/scheduler.py)
    queries_per_min: float = 30.0
    study_scale: ClassVar[str] = "nodes"
    loses_nodes: ClassVar[bool] = True  # --no-kill: the allocation outlives a lost node
    holds_allocations: ClassVar[bool] = True  # sbatch a holding job, srun --jobid steps in it

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def node_size(self) -> int:
        return self.ranks_per_node

    def one_rank(self) -> SlurmClusterConf:
        # nodelist cleared: one node cannot include several; dependency: set by whoever holds it
        return dataclasses.replace(
            self,
            nodes=1,
            ranks_per_node=1,
            gpus_per_node=0,
            cpus_per_rank=1,
            exclusive=False,
            nodelist=[],
            dependency=None,
            checkpoint_interval=0,
            preflight=PreflightConf(),
        )
