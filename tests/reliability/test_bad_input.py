"""Bad input, table-driven through the CLI's entry point (in this process: nothing here starts a
process): each gives its documented exit status and a one-line error naming the key, file or
argument, never a traceback; nothing is started or created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import hpctrain_here

DIGITS = ["data=digits", "train.steps=8"]
NO_SNAP = ["code.snapshot=false", "--dry-run"]

# (arguments, with {tmp} for a scratch directory; exit status; what the error must say)
CASES = [
    (["run", "model=5", "--dry-run"], 2, "model: names no option of the config group (got 5)"),
    (["run", "model=null", "--dry-run"], 2, "model: names no option of the config group (got None)"),
    (["run", "cluster=7", "--dry-run"], 2, "choose one of: local, slurm"),
    (
        ["run", "--config-dir", "{tmp}/brokenconf", "model=broken", "--dry-run"],
        2,
        "model/broken.yaml is not YAML (line 3: did not find expected ',' or ']')",
    ),
    (
        ["run", "--config-dir", "{tmp}/nosuch", "--dry-run"],
        2,
        "--config-dir: {tmp}/nosuch is not a directory",
    ),
    (
        ["run", "--config-dir", "{tmp}/shadow", "--dry-run"],
        2,
        "model/cnn.yaml is hpctrain's own, which would hide",
    ),
    (["run", "run.dir={tmp}/afile", *DIGITS], 3, "is a file; choose another run.dir"),
    (["run", "optim.lr=inf", "--dry-run"], 2, "optim.lr: must be a finite number (got inf)"),
    (["run", "optim.lr=nan", "-m", "train.steps=8,9", "--dry-run"], 2, "optim.lr: must be a finite number"),
    (["run", "cluster.ranks=100", "--dry-run"], 2, "lower cluster.ranks, or say cluster.oversubscribe=true"),
    (["run", "data=folder", "data.path={tmp}/images", "data.num_classes=1"], 2, "set data.num_classes=2"),
    (["run", "data.path=7", "data=folder", "--dry-run"], 2, "7 is not a directory"),
    (["run", "no_such_key=1", "--dry-run"], 2, "no_such_key"),
    (["run", "--timeout-min", "0", "--dry-run"], 2, "--timeout-min: must be a finite number > 0"),
    (["bench", "overhead", "--ranks", "0"], 2, "--ranks: must be at least 1 (got 0)"),
    (["bench", "overhead", "--repeats", "0"], 2, "--repeats: must be at least 1 (got 0)"),
    (["bench", "overhead", "--steps", "1"], 2, "--steps: must be at least 2 (got 1)"),
    (["bench", "analyze", "--runs", "0"], 2, "--runs: must be at least 1 (got 0)"),
    (["bench", "allreduce", "--max-mb", "0"], 2, "--max-mb: must be at least 1 (got 0)"),
    (["bench", "submit", "--points", "x"], 2, "--points: 'x' is not an integer"),
    (["status", "{tmp}/nowhere"], 1, "is not a run, sweep, study or tune directory"),
    (["status", "{tmp}/afile"], 1, "is not a run, sweep, study or tune directory"),
    (["logs", "{tmp}/nowhere"], 1, "is not a run directory (no job.json)"),
    (["cancel", "{tmp}"], 1, "is not a run, sweep, study or tune directory"),
    (["analyze", "{tmp}"], 1, "is not a study directory (no study.json)"),
    (["analyze", "{tmp}/arun"], 1, "is a run without profiler traces: analyze takes a study directory"),
    (["study", "resume", "{tmp}"], 1, "is not a study directory (no study.json)"),
    (["run", "model=cnn,mlp", "--dry-run"], 2, "sweep them with -m (model=cnn,mlp)"),
    (["run", "engine=ddp", "--dry-run"], 2, "did you mean parallelism.engine=...?"),
    (["study", "resume"], 1, "usage: hpctrain study resume STUDY_DIR"),
    (["tune", "--resume", "{tmp}"], 1, "is not a tune directory (no tune.json)"),
    (["tune", "--resume", "{tmp}", "model=mlp"], 1, "takes no overrides: the tune's own are used"),
    (["tune", "tune.keys=[nope]", "--dry-run"], 2, "tune.keys: ['nope'] is not searched for engine=horovod"),
    (["tune", "cluster.ranks=1", "--dry-run"], 2, "a tune needs at least 2 ranks"),
    (["run", "--overrides-file", "{tmp}/nowhere.yaml", "--dry-run"], 2, "nowhere.yaml: cannot be read"),
    (["study", "strong", "run.dir={tmp}/taken", "--no-progress"], 1, "already exists; resume it with"),
    (["run", "cluster=slurm", "run.dir={tmp}/a%j", "--dry-run"], 2, "run.dir: '{tmp}/a%j' holds '%'"),
    (["run", "=5", "--dry-run"], 2, "=5: has no key"),
    (
        ["run", "parallelism=pipeline", "model=mlp", "parallelism.split_at=[net.99]", "--dry-run"],
        2,
        "parallelism.split_at: ['net.99'] are not places model mlp can be cut",
    ),
    (["run", "model._target_=os.system", "--dry-run"], 2, "belongs to Python's standard library (posix)"),
    (
        ["run", "parallelism=fsdp", "parallelism.engine=horovod", "--dry-run"],
        2,
        "engine horovod cannot shard a model",
    ),
    (
        ["run", "parallelism=fsdp", "cluster.ranks=2", "parallelism.shard.degree=1", "--dry-run"],
        2,
        "use parallelism=hsdp",
    ),
    (
        ["run", "parallelism=hsdp", "cluster.ranks=4", "--dry-run"],
        2,
        "it needs at least 2 groups (one node holds every rank)",
    ),
    (
        ["run", "parallelism=hsdp", "cluster.ranks=4", "parallelism.shard.degree=3", "--dry-run"],
        2,
        "4 ranks are not a multiple of 3",
    ),
    (
        [
            "run",
            "parallelism=fsdp",
            "cluster.ranks=4",
            "parallelism.shard.reshard_after_forward=yes",
            "--dry-run",
        ],
        2,
        "or one of 2",
    ),
    (
        ["run", "parallelism=fsdp", "parallelism.shard.cpu_offload=true", "train.device=cpu", "--dry-run"],
        2,
        "where the state already is",
    ),
    (["run", "parallelism=fsdp", "precision=fp16", "--dry-run"], 2, "use precision=bf16"),
    (
        ["run", "parallelism=data", "parallelism.stages=2", "--dry-run"],
        2,
        "with parallelism=data it would do nothing",
    ),
    (
        ["run", "parallelism=fsdp", "parallelism.stages=2", "--dry-run"],
        2,
        "a pipeline of sharded stages is cut along a chain of modules",
    ),
    (
        ["run", "parallelism=fsdp", "parallelism.bucket_mb=5", "--dry-run"],
        2,
        "groups gradients by shard unit",
    ),
    (
        ["run", "parallelism.shard.modules=[blocks]", "--dry-run"],
        2,
        "with parallelism=data it would do nothing",
    ),
    (["run", "parallelism=fsdp", "script={tmp}/ok.py", "--dry-run"], 2, "a script runs its own training"),
    (
        ["run", "train.resume_from={tmp}/nothere", "--dry-run"],
        2,
        "train.resume_from: {tmp}/nothere does not exist",
    ),
    (["run", "train.resume_from={tmp}/empty", "--dry-run"], 2, "is neither a checkpoint nor a run directory"),
    (["run", "data._target_=subprocess.run", "--dry-run"], 2, "belongs to Python's standard library"),
    (["run", "data=folder", "data.path={tmp}/empty", "--dry-run"], 2, "empty has no class directories"),
    (
        ["run", "data=folder", "data.path={tmp}/flat", "--dry-run"],
        2,
        "flat is flat (2 images directly in it)",
    ),
    (
        ["run", "data=folder", "data.path={tmp}/texts", "--dry-run"],
        2,
        "texts has 1 class directories but no images (1 other files)",
    ),
    (
        ["run", "data=folder", "data.path={tmp}/one", "cluster.ranks=2", "--dry-run"],
        2,
        "has 1 images, fewer than the 2 ranks that each need one per step",
    ),
    (
        ["run", "script={tmp}/ok.py", "cluster.ranks=2", "debug.slow_rank=1", "debug.slow_s=1", "--dry-run"],
        2,
        "debug.slow_rank: has no effect with script",
    ),
    (["run", "model=[mlp,cnn]", "--dry-run"], 2, "to run each, sweep them: -m model=mlp,cnn"),
    (["run", "-m", "model=[mlp,cnn]", "--dry-run"], 2, "a list would merge the options"),
    (["run", "hydra.run.dir={tmp}/x", "--dry-run"], 2, "hydra.run.dir: Hydra's own settings are not applied"),
    (["run", "-m", "hydra.job.chdir=true", "train.steps=8,9", "--dry-run"], 2, "Hydra's own settings"),
    (
        ["run", "parallelism.engine=ddp", "parallelism.backend=gloo", "--dry-run"],
        2,
        "parallelism.backend: gloo chooses Horovod's collectives; engine=ddp uses Gloo on CPUs",
    ),
    (["study", "strong", "study.engines=[]", "--dry-run"], 2, "study.engines: [] compares no engine"),
    (["run", "script={tmp}/afile", *NO_SNAP], 2, "afile is not Python source (line 1: invalid syntax)"),
    (["run", "script=/bin/true", *NO_SNAP], 2, "/bin/true is not Python source (a binary file)"),
    (["run", "script={tmp}/ok.py", "parallelism.engine=ddp", *NO_SNAP], 2, "a script chooses its own"),
    (
        ["run", "script={tmp}/ok.py", "script.throughput_regex='(?<=x)([0-9]+)'", *NO_SNAP],
        2,
        "uses what a linear-time matcher (RE2) cannot run",
    ),
    (
        ["run", "script={tmp}/ok.py", "script.throughput_regex='([0-9]+'", *NO_SNAP],
        2,
        "is not a regular expression",
    ),
    # settings that would silently do nothing (issue 36, class 8)
    (
        ["run", "script={tmp}/ok.py", "train.stall_timeout_s=10", *NO_SNAP],
        2,
        "train.stall_timeout_s: watches the built-in trainer's steps; a script is watched by script.stall_timeout_s",
    ),
    (
        ["run", "cluster.container.image=hpctrain", "--dry-run"],
        2,
        "cluster.container.image: is a container setting, and no container runtime is chosen",
    ),
    (["run", "hydra/launcher=basic", "--dry-run"], 2, "hydra/launcher: Hydra's own settings are not applied"),
    (["run", "study=strong", "--dry-run"], 2, "study: is read by `hpctrain study`"),
    (["run", "-m", "study=strong,weak", "--dry-run"], 2, "study: is read by `hpctrain study`"),
    (["run", "study.ranks=[1,2]", "--dry-run"], 2, "study.ranks: is read by `hpctrain study`"),
    (
        ["run", "debug.hold_step=2", "--dry-run"],
        2,
        "debug.hold_step: holds a SLURM run until its requeue signal",
    ),
    (
        ["run", "debug.slow_rank=1", "cluster.ranks=2", "--dry-run"],
        2,
        "debug.slow_rank: slows nothing without",
    ),
    (["run", "debug.slow_s=1", "--dry-run"], 2, "debug.slow_s: slows nothing without"),
    (
        ["run", "parallelism=pipeline", "model=mlp", "parallelism.compression=fp16", "--dry-run"],
        2,
        "parallelism.compression: compresses a data-parallel gradient allreduce; parallelism=pipeline",
    ),
    (["run", "cluster.checkpoint_interval=-1", "--dry-run"], 2, "cluster.checkpoint_interval: must be >= 0"),
    # config errors once found only on the ranks, or after something was created (class 7)
    *[
        (
            ["run", "parallelism=fsdp", "model=cnn", f"parallelism.shard.modules={m}", "--dry-run"],
            2,
            "are neither module names nor class names of the model (the model itself and parameters are "
            "not units); its modules: features, features.0,",
        )
        for m in ("[nonexistent]", "['']", "[CNN]", "[features.0.weight]")
    ],
    (
        ["run", "parallelism=pipeline", "model=mlp", "train.resume_from={tmp}/fsdprun", "--dry-run"],
        2,
        "holds only sharded checkpoints (fsdp/hsdp), which a pipeline cannot resume from",
    ),
    (
        ["run", "cluster=slurm", "script={tmp}/ok.py", "code.dir={tmp}", "run.dir={tmp}/slurmrun"],
        2,
        "code.dir: {tmp} is not a git work tree",
    ),
    (
        [
            "run",
            "cluster.container.runtime=charliecloud",
            "cluster.container.image={tmp}/img",
            "cluster.container.python=/nonexistent/python",
            "--dry-run",
        ],
        2,
        "cluster.container.python: /nonexistent/python is not in image",
    ),
    (
        [
            "run",
            "cluster.container.runtime=charliecloud",
            "cluster.container.image={tmp}/img",
            "cluster.container.binds=[/nonexistent_dir]",
            "--dry-run",
        ],
        2,
        "cluster.container.binds[0]: /nonexistent_dir does not exist on this host",
    ),
    (
        ["run", "tracking=none", "tracking.mlflow=true", "--dry-run"],
        2,
        "tracking.mlflow: =true contradicts tracking=none",
    ),
    # sweeps that cannot be listed (class 5)
    (["run", "-m", "train.seed=choice(1,choice(2,3))", "--dry-run"], 2, "a choice cannot hold another sweep"),
    (["run", "-m", "model=glob(zzz*)", "--dry-run"], 2, "matches none of the options of model"),
    (["run", "-m", "train.seed=range(0,10,0)", "--dry-run"], 2, "a step that is not 0"),
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.test_folder_data import make_folder

    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "afile").write_text("not a directory")
    (tmp / "ok.py").write_text("print('12 samples/s')\n")
    for d in ("empty", "flat", "texts/a", "one/a"):
        (tmp / d).mkdir(parents=True)
    (tmp / "flat" / "0.png").write_bytes(b"")  # validation counts files; it opens none
    (tmp / "flat" / "1.jpg").write_bytes(b"")
    (tmp / "texts" / "a" / "notes.txt").write_text("not an image")
    (tmp / "one" / "a" / "0.png").write_bytes(b"")
    (tmp / "brokenconf" / "model").mkdir(parents=True)  # a site's option that does not parse
    (tmp / "brokenconf" / "model" / "broken.yaml").write_text("name: mlp\nfoo: [1, 2\n")
    (tmp / "shadow" / "model").mkdir(parents=True)  # a site's file that hpctrain's own would hide
    (tmp / "shadow" / "model" / "cnn.yaml").write_text("name: cnn\n")
    (tmp / "taken-strong").mkdir()  # an explicit study directory that exists
    (tmp / "fsdprun" / "checkpoints" / "step-000002.dcp").mkdir(parents=True)  # a sharded run's
    (tmp / "fsdprun" / "checkpoints" / "step-000002.dcp" / ".metadata").write_bytes(b"")
    (tmp / "img" / "bin").mkdir(parents=True)  # a Charliecloud image directory, without that Python
    (tmp / "arun").mkdir()  # a run's directory, as far as analyze looks
    (tmp / "arun" / "job.json").write_text("{}")
    make_folder(tmp / "images")
    return tmp


def _cases() -> list[Any]:
    """CASES as parameters; those that need Charliecloud installed (its validation looks into the
    image) are marked container: the quick tier sets up without it and deselects them."""
    return [
        pytest.param(
            args,
            code,
            said,
            id=" ".join(args),
            marks=[pytest.mark.container] if "cluster.container.runtime=charliecloud" in args else [],
        )
        for args, code, said in CASES
    ]


@pytest.mark.parametrize(("args", "code", "said"), _cases())
def test_bad_input_gets_a_clear_error(scratch: Path, args: list[str], code: int, said: str) -> None:
    before = sorted(p.name for p in scratch.iterdir())
    r = hpctrain_here(*(a.replace("{tmp}", str(scratch)) for a in args))
    out = r.stdout + r.stderr
    assert r.returncode == code, out
    assert said.replace("{tmp}", str(scratch)) in out, out
    assert "Traceback" not in out and "bug in hpctrain" not in out, out
    assert sorted(p.name for p in scratch.iterdir()) == before  # nothing was created
