"""The launch plan: mpirun flags, the rank environment table, and the dry-run snapshot."""

from __future__ import annotations

from datetime import datetime

import pytest

from hpctrain.config import load_config
from hpctrain.config.derived import default_run_dir
from hpctrain.facts import HostFacts
from hpctrain.launch.local.plan import plan_local
from hpctrain.launch.plan import rank_env
from hpctrain.train.schedule import lr_at, target_lr


def _plan(overrides: list[str], **facts: object):
    return plan_local(load_config(overrides), HostFacts.example(**facts), "/runs/r1", "/venv/bin/python")


def test_dry_run_command_matches_snapshot(snapshot) -> None:
    plan = _plan(
        [
            "parallelism.fusion_threshold_mb=32",
            "parallelism.cycle_time_ms=2.5",
            "+cluster.env.NCCL_DEBUG=INFO",
        ],
        is_root=True,
    )
    snapshot("local_dry_run.txt", plan.command_line + "\n")


def test_no_oversubscribe_within_cores_and_no_root_flag_for_users() -> None:
    argv = _plan(["cluster.ranks=2"], cpu_count=2, is_root=False).argv
    assert "--oversubscribe" not in argv
    assert "--allow-run-as-root" not in argv
    assert argv[:3] == ["mpirun", "-np", "2"]
    assert argv[argv.index("--bind-to") + 1] == "none"
    assert argv[-4:] == ["/venv/bin/python", "-m", "hpctrain.rank", "/runs/r1"]


def test_oversubscribe_when_ranks_exceed_cores() -> None:
    p = _plan(["cluster.ranks=4"], cpu_count=2)
    assert "--oversubscribe" in p.argv
    assert p.notes and "oversubscrib" in p.notes[0]
    assert (
        "--oversubscribe" not in _plan(["cluster.ranks=4", "cluster.oversubscribe=false"], cpu_count=2).argv
    )


def test_mpi_yields_when_the_ranks_threads_fill_the_cores() -> None:
    yields = ["--mca", "mpi_yield_when_idle", "1"]

    def has(argv: list[str]) -> bool:
        return any(argv[i : i + 3] == yields for i in range(len(argv)))

    full = _plan(["cluster.ranks=2"], cpu_count=4)  # 2 ranks x 2 threads = 4 cores: full
    assert has(full.argv) and any("mpi_yield_when_idle=1" in n for n in full.notes)
    assert has(_plan(["cluster.ranks=2", "cluster.threads_per_rank=3"], cpu_count=4).argv)
    assert not has(_plan(["cluster.ranks=2", "cluster.threads_per_rank=1"], cpu_count=4).argv)  # 2 free
    assert not has(_plan(["cluster.ranks=4"], cpu_count=2).argv)  # oversubscribed: OpenMPI yields itself


def test_root_gets_allow_run_as_root() -> None:
    assert "--allow-run-as-root" in _plan([], is_root=True).argv


def test_env_table_maps_settings_to_horovod_variables() -> None:
    env = rank_env(
        load_config(
            [
                "parallelism.fusion_threshold_mb=32",
                "parallelism.cycle_time_ms=2.5",
                "parallelism.backend=gloo",
            ]
        ),
        threads=3,
    )
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert env["HOROVOD_CYCLE_TIME"] == "2.5"
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert env["OMP_NUM_THREADS"] == "3"
    defaults = rank_env(load_config([]), threads=1)
    assert "HOROVOD_FUSION_THRESHOLD" not in defaults and "HOROVOD_CYCLE_TIME" not in defaults


def test_every_env_value_is_one_mpirun_argument() -> None:
    # A value with spaces or shell characters stays one argv item: nothing is parsed by a shell.
    p = _plan(["+cluster.env.WEIRD='a b;$(x)'"])
    assert "WEIRD=a b;$(x)" in p.argv
    assert "'WEIRD=a b;$(x)'" in p.command_line  # shlex-quoted when shown


def test_threads_per_rank_share_the_cores() -> None:
    assert _plan(["cluster.ranks=2"], cpu_count=8).threads_per_rank == 4
    assert _plan(["cluster.ranks=4"], cpu_count=2).threads_per_rank == 1
    assert _plan(["cluster.threads_per_rank=3"], cpu_count=8).threads_per_rank == 3


def test_gloo_plan_points_ranks_at_the_rendezvous() -> None:
    p = plan_local(load_config(["parallelism.backend=gloo"]), HostFacts.example(), "/r", "py", 4567)
    assert p.env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4567"
    assert p.env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"


def test_run_dir_is_dated_like_hydra() -> None:
    cfg = load_config(["run.name=exp1"])
    d = default_run_dir(cfg, datetime(2026, 1, 2, 3, 4, 5))
    assert str(d) == "outputs/2026-01-02/03-04-05-exp1"
    assert str(default_run_dir(load_config(["run.dir=/x/y"]), datetime.now())) == "/x/y"


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["optim.lr=0.1"], 0.1),  # no scaling
        (["optim.lr=0.1", "optim.lr_scaling=linear", "cluster.ranks=4", "train.batch_per_rank=32"], 0.4),
        (
            [
                "optim.lr=0.1",
                "optim.lr_scaling=linear",
                "optim.reference_batch=256",
                "cluster.ranks=4",
                "train.batch_per_rank=128",
            ],
            0.2,
        ),  # 0.1 x 512 / 256
    ],
)
def test_linear_lr_scaling(overrides: list[str], expected: float) -> None:
    assert _plan(overrides).lr == pytest.approx(expected)


def test_warmup_goes_linearly_from_base_to_target() -> None:
    o = load_config(["optim.lr=0.1", "optim.warmup_steps=4"]).optim
    assert [lr_at(s, o, 0.5) for s in range(6)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.5])
    assert target_lr(o, 64, 32) == 0.1
