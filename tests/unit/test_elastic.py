"""Elastic restarts planned again on fewer nodes (parallel/elastic.py), the teardown's decision
after a lost node (launch/slurm/restart.py) and SLURM's node states read (launch/slurm/nodes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.launch.slurm.nodes import is_lost, node_states, settled_losses
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel.elastic import resize
from hpctrain.records import plan_file

CHANGED = ("world_size", "nodes", "batch", "lr", "layout", "notes")  # what an elastic plan changes
SLURM = ["cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=2", "train.max_restarts=2"]


def test_a_shrunk_run_keeps_its_global_batch_and_learning_rate_by_default() -> None:
    cfg = load_config([*SLURM, "train.elastic=true", "train.batch_per_rank=16", "optim.lr_scaling=linear"])
    r = resize(cfg, 1)
    assert r.derived is not None and not r.problems
    # 4 ranks x 16 = 64 before; on one node the 2 ranks take 32 each of the same 64
    assert (r.derived.world_size, r.derived.batch.global_, r.derived.batch.per_rank) == (2, 64, 32)
    assert r.derived.lr == pytest.approx(0.05 * 64 / 16)  # linear scaling's lr at 4 ranks, kept
    assert r.describe(4, 64, 0.2) == (
        "went on with 4 -> 2 ranks on 1 node(s), global batch 64 -> 64 (32 per replica), lr 0.2 -> 0.2"
    )


def test_keeping_the_batch_per_rank_shrinks_the_global_batch_and_rescales_the_lr() -> None:
    cfg = load_config(
        [*SLURM, "train.elastic=true", "train.elastic_keeps=batch_per_rank", "optim.lr_scaling=linear"]
    )
    d = resize(cfg, 1).derived
    assert d is not None
    assert (d.batch.global_, d.batch.per_rank, d.lr) == (64, 32, pytest.approx(0.05 * 2))


def test_a_run_that_cannot_go_on_smaller_says_why() -> None:
    cfg = load_config([*SLURM, "train.elastic=true", "train.min_ranks=3"])
    r = resize(cfg, 1)
    assert r.derived is None
    assert r.describe(4, 128, 0.05) == "train.min_ranks: 2 rank(s) are left, fewer than 3"
    # fsdp with a shard degree of 4 no longer divides 2 ranks: the parallelism's own rule
    cfg = load_config([*SLURM, "train.elastic=true", "parallelism=fsdp", "parallelism.shard.degree=4"])
    assert resize(cfg, 2).derived is not None
    r = resize(cfg, 1)
    assert r.derived is None and r.problems[0].key == "parallelism.shard.degree"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["train.elastic=true"], "train.elastic"),  # local: no nodes to lose
        (["cluster=slurm", "train.elastic=true"], "train.elastic"),  # no restarts allowed
        ([*SLURM, "train.min_ranks=2"], "train.min_ranks"),  # does nothing without elastic
        ([*SLURM, "train.elastic_keeps=batch_per_rank"], "train.elastic_keeps"),
        ([*SLURM, "train.elastic=true", "train.min_ranks=5"], "train.min_ranks"),
        ([*SLURM, "train.elastic=true", "train.min_ranks=0"], "train.min_ranks"),
    ],
)
def test_elastic_settings_that_cannot_act_are_refused(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate(load_config(overrides))
    assert key in {p.key for p in e.value.problems}


def test_node_states_are_read_as_scontrol_writes_them() -> None:
    text = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=2 State=MIXED ThreadsPerCore=1\n"
        "NodeName=n2 Arch=x86_64 State=DOWN*+NOT_RESPONDING Reason=Not_responding\n"
        "NodeName=n3 State=IDLE* ThreadsPerCore=1\n"
        "NodeName=n4 State=ALLOCATED+DRAIN\n"
    )
    states = node_states(text)
    assert states == {"n1": "MIXED", "n2": "DOWN*+NOT_RESPONDING", "n3": "IDLE*", "n4": "ALLOCATED+DRAIN"}
    assert [n for n, s in states.items() if is_lost(s)] == ["n2", "n3", "n4"]
    assert not is_lost("ALLOCATED") and not is_lost("COMPLETING") and not is_lost("")


def test_a_node_that_stops_answering_is_looked_for_until_a_ping_would_have_found_it() -> None:
    looks = iter(["State=ALLOCATED", "State=ALLOCATED", "State=ALLOCATED*"])
    now = {"s": 0.0}

    def show(*args: str) -> str:
        return "NodeName=n1 State=ALLOCATED\nNodeName=n2 " + next(looks)

    def sleep(s: float) -> None:
        now["s"] += s

    assert settled_losses(["n1", "n2"], 30.0, show, sleep) == ["n2"] and now["s"] == 2.0
    # every node answering: SlurmdTimeout and a little, then no loss
    now["s"] = 0.0
    assert settled_losses(["n1"], 30.0, lambda *a: "NodeName=n1 State=MIXED", sleep) == []
    assert now["s"] == 32.0
    assert settled_losses([], 30.0, show, sleep) == []


def test_a_node_taken_out_of_the_allocation_or_named_by_srun_is_lost() -> None:
    from hpctrain.launch.slurm.restart import lost_nodes

    # what srun and scontrol said when a 2-node --no-kill job lost n4 (the local cluster)
    said = "srun: error: Node failure on n4\nsrun: error: n3: task 0: Killed\nsrun: Force Terminated StepId=1068.0\n"
    assert lost_nodes(["n3", "n4"], ["n3"], said) == ["n4"]
    assert lost_nodes(["n3", "n4"], [], said) == ["n4"]  # scontrol could not answer: srun's word
    heard = "srun: error: n3: task 0: Exited with exit code 1\nsrun: error: n4: task 1: Killed\n"
    assert lost_nodes(["n3", "n4"], ["n3", "n4"], heard) == []  # a killed rank: both nodes answered


def test_the_nodes_srun_heard_from_were_alive() -> None:
    from hpctrain.launch.output import srun_reporting_nodes

    text = (
        "srun: error: n3: task 0: Exited with exit code 1\n"
        "srun: error: n1: tasks 2-3: Terminated\nsrun: Terminating StepId=12.0\n"
    )
    assert srun_reporting_nodes(text) == {"n1", "n3"}
    lost = "srun: error: Node failure on n4\nsrun: error: n4: task 1: Killed\n"
    assert srun_reporting_nodes(text + lost) == {"n1", "n3"}


def test_the_teardown_goes_on_with_the_nodes_left_or_requeues(tmp_path: Path) -> None:
    from hpctrain.launch.slurm.plan import plan_slurm
    from hpctrain.launch.slurm.restart import next_step

    cfg = load_config([*SLURM, "train.elastic=true"])
    plan = plan_slurm(cfg, str(tmp_path), "python").to_dict()
    assert plan["executor"]["additional_parameters"] == {"no_kill": True}
    assert "#SBATCH --no-kill" in plan_slurm(cfg, str(tmp_path), "python").sbatch_script()
    step = next_step(cfg, tmp_path, plan, ["n1"], 1, 2)
    assert step.place == ["--nodes=1", "--ntasks=2", "--nodelist=n1"] and not step.requeue
    assert step.plan == "plan-restart1.json"
    now = json.loads((tmp_path / "plan-restart1.json").read_text())
    assert (now["world_size"], now["nodes"], now["batch"]["per_rank"]) == (2, 1, 64)
    before = json.loads(json.dumps(plan))
    assert {k: v for k, v in now.items() if k not in CHANGED} == {
        k: v for k, v in before.items() if k not in CHANGED
    }
    # the ranks of that step follow it; any other rank (a requeued job at its full size) plan.json
    assert plan_file(tmp_path, {"HPCTRAIN_PLAN": "plan-restart1.json"}).name == "plan-restart1.json"
    assert plan_file(tmp_path, {"HPCTRAIN_PLAN": "../../etc/passwd"}).name == "plan.json"
    assert plan_file(tmp_path, {}).name == "plan.json"
    # not elastic: the job waits in the queue for its full size
    step = next_step(load_config(SLURM), tmp_path, plan, ["n1"], 1, 2)
    assert step.requeue and step.change == "requeued to wait for 2 node(s) (train.elastic=false)"


def test_a_restart_after_a_lost_node_says_which_and_what_changed() -> None:
    from hpctrain.records.restarts import Restart

    r = Restart(1, 0.0, "rank 0: CommError", 0, "n1", 6, 4, 2, 36.0, ["n2"], "went on with 2 -> 1 ranks")
    assert r.describe() == (
        "restart 1: rank 0 on n1: rank 0: CommError; node(s) n2 lost; went on with 2 -> 1 ranks; "
        "resumed from step 4, 2 step(s) redone, 0.0200 node-h lost"
    )


def test_a_step_on_the_nodes_left_gets_the_allocation_s_new_shape() -> None:
    from hpctrain.launch.slurm.nodes import step_env

    # the batch script's environment of a 2-node job with 2 ranks a node, n4 lost
    env = {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[3-4]", "SLURM_NTASKS": "4", "PATH": "/bin"}
    new = step_env({**env, "SLURM_JOB_CPUS_PER_NODE": "2(x2)", "SLURM_TASKS_PER_NODE": "2(x2)"}, ["n3"], 2)
    assert (new["SLURM_JOB_NUM_NODES"], new["SLURM_NNODES"], new["SLURM_JOB_NODELIST"]) == ("1", "1", "n3")
    assert (new["SLURM_NTASKS"], new["SLURM_JOB_CPUS_PER_NODE"]) == ("2", "2(x1)")
    assert "SLURM_TASKS_PER_NODE" not in new and new["PATH"] == "/bin"
