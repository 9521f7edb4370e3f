"""The workload axis, pure parts and small real pieces: user-code settings, where ranks find the
code and the script, the torch.distributed environment, the code snapshot (a real git tree),
the throughput pattern, the target checks, and hpctrain.api outside hpctrain."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pytest
import torch

from hpctrain import api, records
from hpctrain.config import load_config
from hpctrain.config.load import config_from_yaml
from hpctrain.config.plain_yaml import to_yaml
from hpctrain.engine.world import PORT_BASE, CommError, torch_env
from hpctrain.errors import ConfigError, LaunchError
from hpctrain.facts import HostFacts
from hpctrain.launch.local.plan import plan_local
from hpctrain.launch.plan import AT_LAUNCH
from hpctrain.launch.slurm.plan import plan_slurm
from hpctrain.train import targets
from hpctrain.workload import code, kind
from hpctrain.workload.rules import workload_problems
from hpctrain.workload.script import Tee

PROJECT = Path(__file__).parents[1] / "user_project"
TARGET = ["model._target_=mypkg.nets.TwoLayer", f"code.dir={PROJECT}"]


def test_script_is_short_for_script_path_and_paths_become_absolute(tmp_path: Path) -> None:
    cfg = load_config(["script=train.py", "script.args=[--lr,0.1,--epochs,3]"])
    assert cfg.script.path == str(Path.cwd() / "train.py")
    assert cfg.script.args == ["--lr", "0.1", "--epochs", "3"]  # Hydra's numbers as the text typed
    assert cfg.code.dir == str(Path.cwd())  # user code: code.dir defaults to the current directory
    assert kind(cfg) == "script"
    assert load_config([]).code.dir is None and kind(load_config([])) == "builtin"


def test_extra_keys_of_a_target_are_its_keyword_arguments_and_survive_config_yaml() -> None:
    cfg = load_config([*TARGET, "+model.hidden=64", "+model.sizes=[1,2]", "+model.kwargs.classes=3"])
    assert cfg.model.kwargs == {"hidden": 64, "sizes": [1, 2], "classes": 3}
    assert kind(cfg) == "targets"
    again = config_from_yaml(to_yaml(cfg))
    assert again.model.kwargs == cfg.model.kwargs and again.model._target_ == "mypkg.nets.TwoLayer"
    with pytest.raises(ConfigError, match="model.hidden: unknown key"):  # without a target: a typo
        load_config(["+model.hidden=64"])


def test_target_checks_name_the_key_the_rule_and_the_signature() -> None:
    def rules(*overrides: str) -> list[str]:
        return [
            f"{p.key}: {p.rule}" for p in workload_problems(load_config([f"code.dir={PROJECT}", *overrides]))
        ]

    assert rules("model._target_=mypkg.nets.TwoLayer", "+model.hidden=8") == []
    assert rules("model._target_=mypkg.nets.TwoLayer", "model.width=8") == [
        "model.width: applies to the built-in models only; model._target_ does not receive it"
    ]
    assert rules("model._target_=mypkg.nets.TwoLayer", "+model.kwargs.width=8") == [
        "model.kwargs: mypkg.nets.TwoLayer(features: int = 8, hidden: int = 16, classes: int = 3) -> None "
        "cannot take ['width']: got an unexpected keyword argument 'width'"
    ]
    assert rules("loss._target_=torch.nn.NoSuchLoss")[0].startswith(
        "loss._target_: 'torch.nn.NoSuchLoss' does not import:"
    )
    assert rules("data._target_=mypkg") == ["data._target_: 'mypkg' is not callable"]
    assert rules("+data.kwargs.n=3") == [
        "data.kwargs: are given without data._target_"
    ]  # kwargs alone: nothing would take them
    assert rules(f"code.dir={PROJECT}/nothere", "script=x.py")[0].startswith("code.dir: ")


def test_build_and_dataset_checks_say_what_is_wrong() -> None:
    cfg = load_config([*TARGET, "+model.hidden=4", "data._target_=mypkg.bad.wrong_shapes", "+data.n=64"])
    with targets.importable(cfg.code.dir):
        model = targets.build(cfg, "model")
        data = targets.build(cfg, "data")
        assert sum(p.numel() for p in model.parameters()) == (8 * 4 + 4) + (4 * 3 + 3)
        with pytest.raises(
            targets.WorkloadError, match=r"input \(5,\) torch.float32, target \(\) torch.int64"
        ):
            targets.probe(model, torch.nn.CrossEntropyLoss(), data, torch.device("cpu"), "here")
        assert model.training  # the probe leaves the mode as it found it
        with pytest.raises(targets.WorkloadError, match="has 64 samples, fewer than one global batch of 128"):
            targets.check_dataset(data, "mypkg.bad.wrong_shapes", 128)
        with pytest.raises(targets.WorkloadError, match="not a map-style dataset"):
            targets.check_dataset(iter([]), "x", 1)
        with pytest.raises(targets.WorkloadError, match="an \\(input, target\\) pair, got Tensor"):
            targets.check_dataset(torch.zeros(4, 2), "x", 1)
        broken = load_config([*TARGET, "model._target_=mypkg.bad.Broken"])
        with pytest.raises(targets.WorkloadError, match="failed: ValueError: width must be even"):
            targets.build(broken, "model")


def test_local_plan_gives_ranks_the_code_the_script_and_a_port_chosen_at_launch() -> None:
    cfg = load_config(["script=/p/train.py", "code.dir=/p"])
    plan = plan_local(cfg, HostFacts.example(), "/runs/r1", "/venv/bin/python")
    assert plan.env["HPCTRAIN_CODE_DIR"] == "/p" and plan.env["HPCTRAIN_SCRIPT"] == "/p/train.py"
    assert plan.env["MASTER_PORT"] == AT_LAUNCH
    assert any("runs the script /p/train.py" in n for n in plan.notes)
    builtin = plan_local(load_config([]), HostFacts.example(), "/runs/r1", "/venv/bin/python")
    assert not {"HPCTRAIN_CODE_DIR", "HPCTRAIN_SCRIPT", "MASTER_PORT"} & set(builtin.env)


def test_slurm_plan_runs_the_snapshot_shared_by_a_sweep() -> None:
    cfg = load_config(["cluster=slurm", "script=/p/sub/train.py", "code.dir=/p"])
    one = plan_slurm(cfg, "/runs/r1", "python")
    assert one.env["HPCTRAIN_CODE_DIR"] == "/runs/r1/code"
    assert one.env["HPCTRAIN_SCRIPT"] == "/runs/r1/code/sub/train.py"
    swept = plan_slurm(cfg, "/runs/s-sweep/3", "python", "/runs/s-sweep/submitit")
    assert swept.env["HPCTRAIN_SCRIPT"] == "/runs/s-sweep/code/sub/train.py"
    assert "export HPCTRAIN_SCRIPT=/runs/r1/code/sub/train.py" in one.sbatch_script()
    off = load_config(["cluster=slurm", "script=/p/train.py", "code.dir=/p", "code.snapshot=false"])
    assert plan_slurm(off, "/runs/r1", "python").env["HPCTRAIN_SCRIPT"] == "/p/train.py"


def test_a_script_outside_the_snapshot_is_rejected(tmp_path: Path) -> None:
    script = tmp_path / "elsewhere.py"
    script.write_text("")
    cfg = load_config(["cluster=slurm", f"script={script}", f"code.dir={PROJECT}"])
    [p] = workload_problems(cfg)
    assert p.key == "script.path" and "outside code.dir" in p.rule


def test_a_script_the_snapshot_would_leave_out_is_rejected_before_submission(tmp_path: Path) -> None:
    """A script not yet `git add`ed (or outside code.include) would be missing on the nodes: the
    job would fail after its wait in the queue, so it is refused now, naming the fix."""
    import subprocess

    git = ["git", "-C", str(tmp_path), "-c", "user.email=u@example.org", "-c", "user.name=u"]
    (tmp_path / "lib.py").write_text("")
    (tmp_path / "train.py").write_text("print(1)\n")
    for step in (["init", "-q"], ["add", "lib.py"], ["commit", "-q", "-m", "lib"]):
        subprocess.run([*git, *step], check=True)
    slurm = ["cluster=slurm", f"script={tmp_path / 'train.py'}", f"code.dir={tmp_path}"]
    cfg = load_config(slurm)
    [p] = workload_problems(cfg)
    assert p.key == "script.path" and "not among git's tracked files" in p.rule
    assert p.fix.startswith(f"git add {tmp_path / 'train.py'}")
    subprocess.run([*git, "add", "train.py"], check=True)  # staged is enough: the snapshot copies it
    assert workload_problems(cfg) == []
    globbed = load_config([*slurm, "code.include=[lib.py]"])
    [p] = workload_problems(globbed)
    assert "not among code.include=['lib.py']" in p.rule and "add it to code.include" in p.fix
    local = load_config([f"script={tmp_path / 'train.py'}", f"code.dir={tmp_path}", "code.include=[lib.py]"])
    assert workload_problems(local) == []  # no snapshot locally: the script runs where it is


@pytest.mark.parametrize(
    "environ, expected",
    [
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "MASTER_PORT": "1234",
            },
            {
                "RANK": "3",
                "WORLD_SIZE": "4",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
            },
        ),
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "6",
                "SLURM_LOCALID": "2",
                "SLURM_NTASKS_PER_NODE": "3(x2)",
                "SLURM_JOB_ID": "20017",
            },
            {
                "RANK": "5",
                "WORLD_SIZE": "6",
                "LOCAL_RANK": "2",
                "LOCAL_WORLD_SIZE": "3",
                "MASTER_ADDR": "n7",
                "MASTER_PORT": str(PORT_BASE + 17),
            },
        ),
        (  # the user's own settings (cluster.env) win
            {
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "1",
                "SLURM_LOCALID": "0",
                "SLURM_NTASKS_PER_NODE": "1",
                "SLURM_JOB_ID": "9",
                "MASTER_PORT": "4000",
                "MASTER_ADDR": "head",
            },
            {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
        ),
    ],
)
def test_torch_distributed_environment_from_the_launchers_variables(
    environ: dict[str, str], expected: dict[str, str]
) -> None:
    assert torch_env(environ, first_node="n7") == expected


def test_torch_environment_without_a_launcher_is_an_error() -> None:
    with pytest.raises(CommError, match="SLURM_PROCID, SLURM_NTASKS"):
        torch_env({})


def _git(repo: Path, *args: str) -> str:
    git = ["git", "-C", str(repo), "-c", "user.email=u@example.org", "-c", "user.name=u"]
    return subprocess.run([*git, *args], check=True, capture_output=True, text=True).stdout


def test_snapshot_copies_tracked_files_and_records_the_commit_and_the_diff(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("A = 1\n")
    _git(src, "init", "-q")
    _git(src, "add", ".")
    _git(src, "commit", "-qm", "one")
    (src / "pkg" / "m.py").write_text("A = 2\n")  # an uncommitted edit: copied, and in the diff
    (src / "scratch.txt").write_text("untracked\n")  # not the user's code: not copied, but counted
    run = tmp_path / "run"
    run.mkdir()
    info = code.snapshot(src, run / "code", [])
    assert (run / "code" / "pkg" / "m.py").read_text() == "A = 2\n"
    assert not (run / "code" / "scratch.txt").exists()
    head = _git(src, "rev-parse", "HEAD").strip()
    assert info == records.read_json(run / "code.json")
    assert (info["commit"], info["dirty"], info["files"], info["untracked"]) == (head, True, 1, 1)
    assert "-A = 1\n+A = 2" in (run / "code.diff").read_text()
    (src / "pkg" / "m.py").write_text("A = 3\n")
    assert code.snapshot(src, run / "code", []) == info  # a sweep's second run: the same copy
    assert (run / "code" / "pkg" / "m.py").read_text() == "A = 2\n"
    with pytest.raises(LaunchError, match="sweep over one code.dir at a time"):
        code.snapshot(tmp_path, run / "code", [])


def test_snapshot_of_a_plain_directory_needs_an_include_list(tmp_path: Path) -> None:
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "src" / "a.py").write_text("")
    (tmp_path / "src" / "d" / "b.py").write_text("")
    (tmp_path / "src" / "c.dat").write_text("")
    with pytest.raises(LaunchError, match="is not a git work tree"):
        code.snapshot(tmp_path / "src", tmp_path / "r1" / "code", [])
    (tmp_path / "r2").mkdir()
    info = code.snapshot(tmp_path / "src", tmp_path / "r2" / "code", ["**/*.py"])
    assert info["files"] == 2 and (tmp_path / "r2" / "code" / "d" / "b.py").exists()
    assert not (tmp_path / "r2" / "code" / "c.dat").exists()


def test_the_throughput_pattern_keeps_the_last_match_of_whole_lines() -> None:
    out = io.StringIO()
    tee = Tee(out, re.compile(r"Total img/sec: ([0-9.]+)"))
    tee.write("Total img/sec: 10.5\nnoise\nTotal img/")
    assert tee.value == 10.5
    tee.write("sec: 99\n")  # a line written in pieces counts once it is whole
    assert tee.value == 99.0 and out.getvalue().endswith("Total img/sec: 99\n")


def test_a_throughput_that_is_not_finite_and_positive_is_refused_naming_its_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """inf, nan, 0 and negative rates would poison every efficiency; the last good value stays, and
    each refused value is said once, with the line it came from."""
    from hpctrain.workload.pattern import compile_pattern

    tee = Tee(io.StringIO(), compile_pattern(r"rate: (\S+)"))
    tee.write("rate: 12.5\nrate: inf\nrate: nan\nrate: 0\nrate: -3\nrate: inf\n")
    assert tee.value == 12.5
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 4, said  # inf once, though printed twice
    assert said[0] == (
        "hpctrain: script.throughput_regex read 'inf', not a finite positive number of samples/s, "
        "from the line: 'rate: inf' (ignored)"
    )
    assert [line.split("read ")[1].split(",")[0] for line in said] == ["'inf'", "'nan'", "'0'", "'-3'"]


def test_a_catastrophically_backtracking_pattern_cannot_spin_the_reader() -> None:
    """`(a+)+$` on 40 `a` and a `!` takes ~2**40 steps in Python's `re`; the reader's engine (RE2)
    is linear, so the line is read at once. Run in a thread so a regression fails, not hangs."""
    import threading

    from hpctrain.workload.pattern import compile_pattern

    tee = Tee(io.StringIO(), compile_pattern(r"(a+)+$"))
    worker = threading.Thread(target=tee.write, args=("a" * 40 + "!\n",), daemon=True)
    worker.start()
    worker.join(timeout=30)  # linear time: microseconds; backtracking: hours
    assert not worker.is_alive() and tee.value is None


def test_the_api_is_a_no_op_outside_hpctrain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(api.RUN_DIR_VAR, raising=False)
    api.step(samples=4, loss=1.0)
    assert api.run_dir() is None and api.should_stop() is False
    assert api.save_checkpoint({"step": 1}) is None and api.load_checkpoint() is None
