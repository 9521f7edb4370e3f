"""Round 6 (issue 72), classes 3-8 without a cluster: nothing runs from a file or a value hpctrain
did not check, nothing the user wrote is read without a bound, and what the user wrote is never
called hpctrain's bug. Each case did harm, ran unbounded or said "this is a bug" on 8e3c5b6."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import hpctrain_here


@pytest.mark.parametrize(
    ("nested", "key", "module"),
    [
        ("+model.kwargs.x={_target_: shutil.copyfile, src: SRC, dst: DST}", "model.kwargs.x._target_", "shutil"),
        ("+model.kwargs.x=[1, {a: {_target_: os.system, _args_: [touch DST]}}]", "model.kwargs.x[1].a._target_", "posix"),
        ("+data.kwargs.fn={_target_: builtins.exec, _args_: ['open(\\'DST\\',\\'w\\')']}", "data.kwargs.fn._target_", "builtins"),
    ],
    ids=["copyfile", "os-system-in-a-list", "exec"],
)  # fmt: skip
def test_a_nested_standard_library_target_is_refused_before_anything_runs(
    tmp_path: Path, nested: str, key: str, module: str
) -> None:
    """Class 3: only the top-level _target_ was checked; Hydra built a nested one while the memory
    check traced the model, at plan time (--dry-run copied the file)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_text("secret")
    given = nested.replace("SRC", str(src)).replace("DST", str(dst))
    r = hpctrain_here(
        "run", "--dry-run", "model._target_=torch.nn.Identity", "data._target_=torch.utils.data.TensorDataset",
        given, "cluster.memory_per_rank_gib=100",
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"- {key}: " in r.stderr and f"belongs to Python's standard library ({module})" in r.stderr, (
        r.stderr
    )
    assert not dst.exists()


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        # class 3: Hydra merged these into its schema entries: every local run's launch line, every run's steps
        ("cluster/local_schema.yaml", "mpirun: /tmp/evil\n", "cluster/local_schema.yaml is the name of a config hpctrain registers"),
        ("hpctrain_schema.yaml", "train: {steps: 3}\n", "hpctrain_schema.yaml is the name of a config hpctrain registers"),
        ("hydra/job_logging/default.yaml", "version: 1\n", "hydra/job_logging/default.yaml is in Hydra's own group"),
    ],
    ids=["cluster-schema", "hpctrain-schema", "hydra-group"],
)  # fmt: skip
def test_a_preset_named_like_a_registered_config_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str, said: str
) -> None:
    home = tmp_path / "home"
    preset = home / ".config" / "hpctrain" / name
    preset.parent.mkdir(parents=True)
    preset.write_text(text)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    r = hpctrain_here("run", "--dry-run")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"- {preset}: {said} (user)" in r.stderr, r.stderr


def test_the_same_option_in_two_added_directories_is_a_named_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Class 8: the first directory's won silently, hiding the user's own."""
    site, home = tmp_path / "site", tmp_path / "home"
    for root in (site, home / ".config" / "hpctrain"):
        (root / "cluster").mkdir(parents=True)
        (root / "cluster" / "mysite.yaml").write_text("defaults: [slurm, _self_]\npartition: gpu\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HPCTRAIN_CONFIG_PATH", str(site))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    r = hpctrain_here("run", "--dry-run", "cluster=mysite")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"cluster/mysite.yaml is also in {site} ($HPCTRAIN_CONFIG_PATH), which comes first" in r.stderr, (
        r.stderr
    )


def test_a_link_loop_on_the_config_path_is_named_and_one_inside_it_searched_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Class 6: a symlink loop on $HPCTRAIN_CONFIG_PATH printed "this is a bug" (and `run --help`
    two tracebacks)."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HPCTRAIN_CONFIG_PATH", str(tmp_path / "a"))
    r = hpctrain_here("run", "--dry-run")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"- $HPCTRAIN_CONFIG_PATH: {tmp_path / 'a'} does not resolve (Symlink loop" in r.stderr, r.stderr
    r = hpctrain_here("run", "--help")
    assert r.returncode == 0 and "only hpctrain's own: $HPCTRAIN_CONFIG_PATH" in r.stdout, r.stdout + r.stderr
    site = tmp_path / "site"
    (site / "cluster").mkdir(parents=True)
    (site / "cluster" / "loop").symlink_to(site)
    (site / "cluster" / "mysite.yaml").write_text("defaults: [slurm, _self_]\npartition: gpu\n")
    monkeypatch.setenv("HPCTRAIN_CONFIG_PATH", str(site))
    r = hpctrain_here("run", "--dry-run", "cluster=mysite", "data=digits")
    assert r.returncode == 0 and "bug" not in r.stderr, r.stdout + r.stderr


EDITS = {
    "steps of 10**20": ("steps: 2\n", "steps: 100000000000000000000\n"),
    "nan learning rate": ("lr: 0.05\n", "lr: .nan\n"),
    "a missing value": ("steps: 2\n", "steps: '???'\n"),
    "a learning rate plan.json holds otherwise": ("lr: 0.05\n", "lr: 10.0\n"),
    "a duplicate key": ("steps: 2\n", "steps: 2\n  steps: 3\n"),
    "bytes that are not UTF-8": ("steps: 2\n", "steps: 2 \xff\n"),
}


@pytest.mark.mpi
def test_a_config_yaml_edited_after_planning_is_refused_on_the_ranks(tmp_path: Path) -> None:
    """Class 5: the ranks trained on `steps: 10**20`, ran the schema's 50 steps for '???', used
    plan.json's lr for `lr: 10.0` or .nan, and raised raw PyYAML or UnicodeDecodeError text.
    plan.json now records config.yaml's digest; a rank reads only the file that was planned."""
    import subprocess
    import sys

    from tests.conftest import run_ok

    run, _ = run_ok(tmp_path, "r", "data=digits", "train.steps=2", "train.warmup_steps=1", "optim.lr=0.05")
    planned = (run / "config.yaml").read_bytes()
    for what, (old, new) in EDITS.items():
        assert old.encode() in planned, what
        (run / "config.yaml").write_bytes(planned.replace(old.encode(), new.encode("latin-1"), 1))
        r = subprocess.run(
            [sys.executable, "-m", "hpctrain.rank", str(run)], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 1, (what, r.stdout, r.stderr)
        assert "ConfigChanged: invalid configuration" in r.stderr and "was changed after the run was planned" in r.stderr, (what, r.stderr)  # fmt: skip
        assert "Traceback" not in r.stderr, (what, r.stderr)
    (run / "config.yaml").write_bytes(planned)  # as planned: read again as it was
    from hpctrain.config.run_file import planned_config

    assert planned_config(run).train.steps == 2


def _bomb(levels: int = 9) -> str:
    """Nine lists of nine aliases of the list before: 9**9 values once expanded, 1 KiB written."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\nname: mlp\n"


PRESETS = {
    "bomb": (_bomb(), "expands to more than 100,000 values (aliases of aliases: a YAML bomb)"),
    "huge": ("name: mlp\nx:\n" + "  - 1\n" * 7_000_000, "cannot be read (holds more than the 1 MiB"),
    "listed": ("- name\n- mlp\n", "is a YAML list, not a mapping of keys to values"),
    "hydra-keys": ("name: mlp\nhydra:\n  job:\n    chdir: true\n", "sets `hydra:` options, which hpctrain sets itself"),
    "twice": ("name: mlp\nwidth: 8\nwidth: 9\n", "gives the key width (line 3) twice"),
}  # fmt: skip


def test_presets_that_are_no_presets_are_refused_at_once_naming_the_file(tmp_path: Path) -> None:
    """Class 4: a bomb selected as model=bomb reached 7.9 GB in 10 minutes, deaf to Ctrl-C; a 40 MB
    list was still composing at 240 s. Class 6/8: a list gave "this is a bug", `hydra:` keys were
    ignored or blamed on "<overrides>". Every preset on the search path is read with yaml_bounds'
    bounds before Hydra composes anything; one process, its peak memory measured."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "model").mkdir(parents=True)
    for name, (text, _) in PRESETS.items():
        (site / "model" / f"{name}.yaml").write_text(text)
    # The peak is the command's alone: this worker's own children (ranks of earlier tests) would
    # count in its RUSAGE_CHILDREN, so a one-child parent measures it and prints it last.
    peak_of = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]);"
        " print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)"
    )
    r = subprocess.run(
        [sys.executable, "-c", peak_of, sys.executable, "-m", "hpctrain.cli", "run", "--dry-run", "model=bomb"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HPCTRAIN_CONFIG_PATH": str(site)},
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    for name, (_, said) in PRESETS.items():
        assert f"- {site / 'model' / name}.yaml: model/{name}.yaml {said}" in r.stderr, (name, r.stderr)
    assert int(r.stderr.splitlines()[-1]) < 200 * 1024  # KiB: under 200 MB


def test_a_bomb_in_a_runs_config_yaml_is_refused_by_every_reader(tmp_path: Path) -> None:
    """Class 4: a rank's reader ran out of memory after 84 s under a 4 GiB cap; so did `track`."""
    from hpctrain.config.run_file import run_config
    from hpctrain.errors import ConfigError
    from hpctrain.tracking.source import params_of
    from hpctrain.tracking.sync import targets_of

    (tmp_path / "config.yaml").write_text(_bomb())
    with pytest.raises(ConfigError, match="expands to more than 100,000 values"):
        run_config(tmp_path / "config.yaml", None)  # a plan without a digest to hold it to
    assert targets_of(tmp_path).experiment == "hpctrain"  # tracked as a run without a config
    assert "run.name" not in params_of(tmp_path)


USER_MODELS = """
import threading, time
import torch
from torch import nn


class Gate(nn.Module):
    def forward(self, y):
        if y.sum() > 0:  # a value read: fake tensors hold none
            return y * 2
        return y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.fc(x.flatten(1)))


class Item(Net):
    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y * float(y.abs().max().item())


class Nonzero(Net):
    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y + y.nonzero().shape[0]


class Numpy(Net):
    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y + torch.from_numpy(y.detach().numpy().copy())


class Raises(Net):
    def __init__(self):
        raise ValueError("width must be even")


class Exits(Net):
    def __init__(self):
        raise SystemExit(7)


class Slow(Net):
    def __init__(self):
        time.sleep(1.5)
        super().__init__()


class Threaded(Net):
    def __init__(self):
        super().__init__()
        threading.Thread(target=time.sleep, args=(120,), name="left-running").start()
"""


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("Net", "fake tensors cannot follow the model in the forward of gate (Gate): DataDependentOutputException"),
        ("Item", "fake tensors cannot follow the model in the forward of Item: DataDependentOutputException"),
        ("Nonzero", "in the forward of Nonzero: DynamicOutputShapeException: aten.nonzero.default"),
        ("Numpy", "in the forward of Numpy: RuntimeError: .numpy() is not supported for tensor subclasses"),
        ("Raises", "model._target_=round6_models.Raises failed: ValueError: width must be even; the ranks build it"),
        ("Exits", "model._target_=round6_models.Exits called sys.exit(7); the ranks build it"),
        ("Slow", "memory: still tracing the run after 0.5 s"),
    ],
)  # fmt: skip
def test_a_model_the_memory_trace_cannot_follow_runs_unchecked_saying_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, said: str
) -> None:
    """Class 6: with a memory limit, each of these exited 1 with "this is a bug in hpctrain" (NumPy:
    refused, exit 2; sys.exit(7): exit 7 and no word; a slow constructor: silence). The estimate
    failing never refuses the run: it goes ahead unchecked, and says where the trace stopped."""
    from hpctrain.orchestrate import validate

    monkeypatch.setattr(validate, "SLOW_TRACE_S", 0.5)
    (tmp_path / "round6_models.py").write_text(USER_MODELS)
    r = hpctrain_here(
        "run", "--dry-run", f"model._target_=round6_models.{model}", "data=digits", "cluster.ranks=1",
        "cluster.memory_per_rank_gib=100", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert said in r.stdout + r.stderr and "bug" not in r.stderr, r.stdout + r.stderr


def test_a_thread_a_constructor_leaves_running_does_not_keep_the_command_alive(tmp_path: Path) -> None:
    """Class 6: a non-daemon thread a model's constructor started kept the dry run alive 129 s."""
    import subprocess
    import sys
    import time

    (tmp_path / "round6_models.py").write_text(USER_MODELS)
    began = time.monotonic()
    r = subprocess.run(
        [str(Path(sys.executable).parent / "hpctrain"), "run", "--dry-run", "model._target_=round6_models.Threaded",
         "data=digits", "cluster.ranks=1", "cluster.memory_per_rank_gib=100"],
        capture_output=True, text=True, timeout=100, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0 and time.monotonic() - began < 60, r.stderr
    assert (
        "not waiting for 1 thread(s) that code it ran (a _target_, a plugin) started and left running (left-running)"
        in r.stderr
    )


def test_an_unreadable_config_directory_is_named_by_help_run_and_doctor(tmp_path: Path) -> None:
    """Class 6: for an unreadable directory on $HPCTRAIN_CONFIG_PATH, `run --help` printed a
    traceback while `doctor` said "ok". Root reads everything, so the commands run as root without
    the capabilities that bypass file permissions (setpriv), as a user would."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "model").mkdir(parents=True)
    (site / "model" / "mine.yaml").write_text("name: mlp\n")
    site.chmod(0)
    no_bypass = [
        "setpriv",
        "--bounding-set=-dac_read_search,-dac_override",
        "--inh-caps=-dac_read_search,-dac_override",
    ]
    no_bypass = no_bypass if os.geteuid() == 0 else []  # a user (the quick tier) has no such capabilities
    env = {**os.environ, "HPCTRAIN_CONFIG_PATH": str(site), "COLUMNS": "300"}
    said = f"{site} cannot be read (Permission denied)"
    try:
        for args, code in ((["run", "--help"], 0), (["run", "--dry-run"], 2), (["doctor"], None)):
            r = subprocess.run([*no_bypass, sys.executable, "-m", "hpctrain.cli", *args], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
            assert code is None or r.returncode == code, (args, r.stdout + r.stderr)
            assert said in r.stdout + r.stderr and "Traceback" not in r.stderr, (args, r.stdout + r.stderr)
    finally:
        site.chmod(0o755)


def test_a_study_says_which_points_memory_could_not_be_predicted(tmp_path: Path) -> None:
    """Class 6: a study with a memory limit left such a point unchecked without a word."""
    (tmp_path / "round6_models.py").write_text(USER_MODELS)
    r = hpctrain_here(
        "study", "strong", "--dry-run", "model._target_=round6_models.Net", "data=digits", "study.ranks=[1,2]",
        "cluster.memory_per_rank_gib=100", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "note: memory not predicted for n1-r0: fake tensors cannot follow the model in the forward of gate"
        in r.stdout
    ), r.stdout
