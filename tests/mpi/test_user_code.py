"""The user's own code, launched locally with real mpirun and Horovod: a model class and a
dataset factory by import path, unmodified Horovod and torch.distributed scripts, a script
instrumented with hpctrain.api (records, summary, a scaling study), and what goes wrong."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests import conftest
from tests.conftest import assert_same_weights, flat, hpctrain

pytestmark = pytest.mark.mpi

USER_MODEL = [
    "model._target_=mypkg.nets.TwoLayer",
    "+model.hidden=32",
    "data._target_=mypkg.data.blobs",
    "+data.n=512",
    "train.steps=12",
    "train.warmup_steps=2",
]
HVD_THROUGHPUT = 'script.throughput_regex="Total img/sec on [0-9]+ rank.s.: ([0-9.]+)"'


def run(project: Path, name: str, *overrides: str) -> tuple[int, str, Path]:
    run_dir = project.parent / name
    r = hpctrain("run", "--no-progress", f"run.dir={run_dir}", *overrides, cwd=project)
    return r.returncode, r.stdout + r.stderr, run_dir


def run_ok(project: Path, name: str, *overrides: str) -> tuple[Path, dict]:
    """A run of the user's project, started from its directory (code.dir's default)."""
    return conftest.run_ok(project.parent, name, *overrides, cwd=project)


def rank_lines(run_dir: Path, world: int) -> list[str]:
    return [(run_dir / "logs" / f"rank{r}.log").read_text() for r in range(world)]


@pytest.fixture(scope="module")
def user_model_one_rank(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The user's model on one rank with the global batch of 32 (in a project of its own): what
    the 2-rank and the pipelined runs of the same code must equal. Run once, only read."""
    project = conftest.make_user_project(tmp_path_factory.mktemp("user-one"))
    return run_ok(project, "one", *USER_MODEL, "cluster.ranks=1", "train.batch_per_rank=32")


def test_a_user_model_and_dataset_train_and_2_ranks_match_1(user_project: Path, user_model_one_rank) -> None:
    one, s1 = user_model_one_rank
    two, s2 = run_ok(user_project, "two", *USER_MODEL, "cluster.ranks=2", "train.batch_per_rank=16")
    assert_same_weights(one, two, rtol=1e-5, atol=1e-6)
    assert s2["model"] == "mypkg.nets.TwoLayer" and s2["world_size"] == 2
    assert s2["parameters"] == (8 * 32 + 32) + (32 * 3 + 3)  # +model.hidden=32 reached the class
    assert s2["last_loss"] < 0.5 * s2["first_loss"]  # the blobs are separable: it learns
    env = json.loads((two / "env.json").read_text())
    assert env["code"]["dir"] == str(user_project)  # code.dir defaults to where hpctrain started


def test_a_user_model_cut_where_the_user_says_matches_1_rank(user_project: Path, user_model_one_rank) -> None:
    one, _ = user_model_one_rank
    pipe, s = run_ok(
        user_project,
        "pipe",
        *USER_MODEL,
        "parallelism=pipeline",
        "parallelism.split_at=[net.2]",  # the second Linear starts stage 1
        "cluster.ranks=2",
        "train.batch_per_rank=32",
    )
    assert_same_weights(one, pipe, rtol=1e-5, atol=1e-6)
    assert flat(s)["stages"] == 2 and s["parameters"] == (8 * 32 + 32) + (32 * 3 + 3)  # the whole model's


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_an_unmodified_horovod_script_runs_on_every_rank(user_project: Path, backend: str) -> None:
    """Over Gloo too: without the launcher's rendezvous each rank would train alone as rank 0 of 1."""
    run_dir, s = run_ok(
        user_project,
        "hvd",
        "script=scripts/hvd_train.py",
        "script.args=[--steps,5]",
        HVD_THROUGHPUT,
        f"parallelism.backend={backend}",
    )
    logs = rank_lines(run_dir, 2)
    assert "rank 0 of 2 (local 0)" in logs[0] and "rank 1 of 2 (local 1)" in logs[1]
    printed = re.search(r"Total img/sec on 2 rank\(s\): ([0-9.]+)", logs[0])
    assert printed is not None
    assert s["throughput_samples_per_s"] == pytest.approx(float(printed.group(1)))
    assert s["timed_steps"] == 0 and s["finished"] > s["started"]


def test_an_unmodified_ddp_script_gets_torch_distributed_env(user_project: Path) -> None:
    run_dir, s = run_ok(user_project, "ddp", "script=scripts/ddp_train.py", "script.args=[3]")
    logs = rank_lines(run_dir, 2)
    assert "rank 0 of 2 local 0" in logs[0] and "rank 1 of 2 local 1" in logs[1]
    assert s["world_size"] == 2 and s["throughput_samples_per_s"] is None  # not measured: null, not NaN


def test_an_api_script_gets_records_summary_and_a_study(user_project: Path) -> None:
    run_dir, s = run_ok(
        user_project,
        "api",
        "script=scripts/api_train.py",
        "script.args=[30]",
        "train.steps=30",
        "train.warmup_steps=4",
        "train.batch_per_rank=16",
    )
    for rank in (0, 1):
        steps = [json.loads(line) for line in (run_dir / f"steps-rank{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in steps] == list(range(30))
        assert [r["timed"] for r in steps] == [False] * 4 + [True] * 26
        assert all(r["samples"] == 16 for r in steps)
    assert s["timed_steps"] == 26 and s["global_batch"] == 32
    assert (run_dir / "weights.pt").exists()
    # a scaling study of the script: hpctrain sets batch and steps, the script reads them (api)
    study = user_project.parent / "study"
    r = hpctrain(
        "study",
        "strong",
        "--no-progress",
        "script=scripts/api_train.py",
        "study.ranks=[1,2]",
        "study.repetitions=1",
        "study.steps=12",
        "study.warmup_steps=2",
        "study.global_batch=32",
        "study.allreduce_bench=false",
        f"run.dir={study}",
        cwd=user_project,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    study_dir = Path(f"{study}-strong")
    x = {}
    for n, per_rank in ((1, 32), (2, 16)):
        summary = json.loads((study_dir / f"n{n}-r0" / "summary.json").read_text())
        assert summary["batch_per_rank"] == per_rank and summary["timed_steps"] == 10
        x[n] = summary["throughput_samples_per_s"]
    rows = list(csv.DictReader((study_dir / "report" / "points.csv").open()))
    assert [int(row["ranks"]) for row in rows] == [1, 2]
    for row in rows:
        assert float(row["throughput_samples_per_s"]) == pytest.approx(x[int(row["ranks"])])
        assert float(row["speedup"]) == pytest.approx(x[int(row["ranks"])] / x[1])
    assert "data:image/png;base64," in (study_dir / "report" / "report.html").read_text()


@pytest.mark.parametrize(
    "overrides, rule",
    [
        (["model._target_=mypkg.nope.Net"], "'mypkg.nope.Net' does not import: ModuleNotFoundError"),
        (["model._target_=mypkg.nets.TwoLayer", "+model.hiddn=3"], "unexpected keyword argument 'hiddn'"),
        (
            ["model._target_=mypkg.nets.TwoLayer", "parallelism=pipeline", "cluster.ranks=2"],
            "parallelism.split_at: your model does not declare where it may be cut",
        ),
        (["data._target_=mypkg.nets"], "is not callable"),
        (["script=scripts/nothere.py"], "does not exist or is not a file"),
        (["script=scripts/hvd_train.py", "script.throughput_regex=no-group"], "has no group"),
        (["script=scripts/hvd_train.py", "model._target_=mypkg.nets.TwoLayer"], "a script brings its own"),
    ],
)
def test_bad_user_code_settings_are_config_errors_before_anything_starts(
    user_project: Path, overrides: list[str], rule: str
) -> None:
    code, out, run_dir = run(user_project, "bad", *overrides)
    assert code == 2, out
    assert rule in out, out
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model._target_=mypkg.bad.Broken", "data._target_=mypkg.data.blobs"],
            "model._target_=mypkg.bad.Broken failed: ValueError: width must be even",
        ),
        (
            ["model._target_=mypkg.nets.TwoLayer", "data._target_=mypkg.bad.wrong_shapes"],
            "one sample does not go through the model and the loss: input (5,) torch.float32",
        ),
        (["script=scripts/exit_on_rank.py", "script.args=[1]"], "exit_on_rank.py exited with status 3"),
        (["script=scripts/exit_on_rank.py", "script.args=[1,kill]"], "killed by signal 9"),
    ],
)
def test_user_code_that_fails_on_a_rank_is_named(
    user_project: Path, overrides: list[str], message: str
) -> None:
    code, out, run_dir = run(user_project, "fails", *overrides, "train.steps=5", "train.warmup_steps=1")
    assert code == 4, out
    assert message in out, out
    if "exit_on_rank" in overrides[0]:
        assert "rank 1 failed" in out, out  # the rank that failed, not the ones mpirun stopped
        assert "rank 1 starting" in out  # its last output
    assert (run_dir / "config.yaml").exists() and not (run_dir / "summary.json").exists()


def test_output_that_is_not_utf8_is_kept_escaped_and_the_run_ends(user_project: Path) -> None:
    """A rank's bytes need not be UTF-8 (a cut multi-byte character, raw binary): the run still
    ends (the local supervisor once waited forever on a stream that failed to decode)."""
    code, out, run_dir = run(user_project, "raw", "script=scripts/raw_bytes.py", "cluster.ranks=2")
    assert code == 0, out
    for log in rank_lines(run_dir, 2):
        assert "raw \\xff\\xfe bytes" in log and "GLHF! \\xf0\\x9f" in log and "last line" in log, log


def test_what_a_script_starts_ends_with_it_and_does_not_hold_the_run(user_project: Path) -> None:
    """A detached grandchild and a child holding stdout, on each of 2 ranks: the run ends COMPLETED
    as soon as the script does (not when the sleeps would), and none of the 4 sleeps is left."""
    run_dir = user_project.parent / "children"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        "script=scripts/children.py",
        "cluster.ranks=2",
        cwd=user_project,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((run_dir / "state.json").read_text())["state"] == "COMPLETED"
    left = subprocess.run(["pgrep", "-f", "sleep 300[12]"], capture_output=True, text=True).stdout.split()
    assert not left, left


@pytest.mark.side_stream  # mostly waits for the stall timeout
def test_a_script_hung_on_one_rank_is_named_with_its_stack(user_project: Path) -> None:
    """No api.step, no output, no CPU on rank 1 for script.stall_timeout_s: the run ends (exit 4)
    naming rank 1 and where it hangs; nothing is left running."""
    run_dir = user_project.parent / "hang"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        "script=scripts/hang.py",
        "cluster.ranks=2",
        "script.stall_timeout_s=8",
        cwd=user_project,
        timeout=180,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert (
        "rank 1 failed: Stalled: no api.step, output or CPU use for 8 s (script.stall_timeout_s)" in r.stderr
    )
    assert "in its script for" in r.stderr and "hang.py" in r.stderr, r.stderr
    assert json.loads((run_dir / "stall.json").read_text())["stalled"][0]["rank"] == 1
    assert not conftest.processes_of(run_dir)


@pytest.mark.side_stream  # mostly waits for the stall timeout
def test_a_horovod_script_hung_on_one_rank_is_found_within_its_timeout(user_project: Path) -> None:
    """Horovod's background thread polls in every rank: counted as progress, it kept rank 1 (asleep
    in its script) looking busy, and a 10 s timeout named it after 48 s. Only the main thread's CPU
    counts now, and rank 0, idle too but waiting inside hvd.allreduce, is not named."""
    run_dir, mark = user_project.parent / "hvd-hang", user_project.parent / "hvd-hang.mark"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        "script=scripts/hvd_hang.py",
        "cluster.ranks=2",
        "script.stall_timeout_s=8",
        f"+cluster.env.HANG_MARK={mark}",
        cwd=user_project,
        timeout=180,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    stall = json.loads((run_dir / "stall.json").read_text())
    assert [s["rank"] for s in stall["stalled"]] == [1], stall
    # the timeout, counted from rank 1's last CPU use, plus heartbeats: not a multiple of it
    assert 8 <= stall["found"] - float(mark.read_text()) <= 8 + 6, stall
    assert "hvd_hang.py" in r.stderr and not conftest.processes_of(run_dir)


@pytest.mark.side_stream  # mostly waits for the stall timeout
def test_a_model_constructor_hung_on_one_rank_is_named_with_its_stack(user_project: Path) -> None:
    run_dir = user_project.parent / "ctor"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        "model._target_=mypkg.bad.HangsOnRank1",
        "data._target_=mypkg.data.blobs",
        "cluster.ranks=2",
        "train.stall_timeout_s=8",
        conftest.HOROVOD_IDLE,  # rank 0 waits for the hung one
        cwd=user_project,
        timeout=180,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert "rank 1 failed: Stalled: no step completed for 8 s (train.stall_timeout_s)" in r.stderr
    assert "rank 1 on" in r.stderr and "in build of step 0" in r.stderr, r.stderr
    assert "hung in the constructor" in r.stderr or "HangsOnRank1" in r.stderr, r.stderr
    assert not conftest.processes_of(run_dir)


def test_a_target_module_that_hangs_on_import_is_a_config_error(
    user_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCTRAIN_IMPORT_TIMEOUT_S", "3")
    r = hpctrain("run", "--dry-run", "model._target_=mypkg.blocks.Net", cwd=user_project, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        "model._target_: importing 'mypkg.blocks.Net' did not finish in 3 s (it blocks at import)" in r.stderr
    )
