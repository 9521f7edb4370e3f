"""Containers, in-process: the commands each runtime renders (snapshots for Apptainer and pyxis,
which this machine does not have), what the ranks see of the host, the rules a container config
must pass before anything starts, and the build's pure parts (mirror, pins, key)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.launch.container import base
from hpctrain.launch.container import plan as container_plan
from hpctrain.launch.container.apptainer import Apptainer
from hpctrain.launch.container.build import Inputs, apt_mirror, render_dockerfile, runtime_pins
from hpctrain.launch.container.charliecloud import Charliecloud
from hpctrain.launch.container.pyxis import Pyxis
from hpctrain.launch.local.plan import plan_local
from hpctrain.launch.slurm.plan import plan_slurm
from hpctrain.orchestrate.validate import problems, validate

CH = ["cluster.container.runtime=charliecloud", "cluster.container.storage=/images/ch"]


def _hide_host(text: str) -> str:
    """The snapshot holds no path or name of the machine it was taken on."""
    return text.replace(base.HOST_PACKAGE, "<hpctrain>").replace(f"USER={base.user()} ", "USER=<user> ")


def test_a_local_charliecloud_run_matches_snapshot(snapshot) -> None:
    cfg = load_config([*CH, "cluster.ranks=2"])
    plan = plan_local(cfg, HostFacts.example(), "/runs/r1", "/venv/bin/python")
    snapshot("local_charliecloud.txt", _hide_host(plan.command_line) + "\n")
    assert plan.container == {
        "runtime": "charliecloud",
        "image": "hpctrain",
        "binds": [[base.HOST_PACKAGE, base.IMAGE_SOURCE], ["/runs", "/runs"]],
        "gpus": False,
    }
    assert plan.env["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"  # no CMA across namespaces
    assert plan.env["USER"]  # ch-run refuses to start without it


@pytest.mark.parametrize(
    ("runtime", "extra"),
    [
        ("apptainer", ["cluster.container.image=/images/hpctrain.sif", "cluster.gpus_per_node=2"]),
        ("pyxis", ["cluster.container.image=/images/hpctrain.sqsh"]),
    ],
)
def test_rendered_runtimes_match_their_sbatch_snapshots(snapshot, runtime: str, extra: list[str]) -> None:
    cfg = load_config(
        ["cluster=slurm", f"cluster.container.runtime={runtime}", "cluster.ranks_per_node=2", *extra]
    )
    plan = plan_slurm(cfg, "/runs/r1", "/venv/bin/python")
    snapshot(f"slurm_{runtime}.txt", _hide_host(plan.sbatch_script()))


def test_binds_are_what_the_ranks_read_and_write_once_each(tmp_path: Path) -> None:
    code = tmp_path / "proj"
    cfg = load_config(
        [*CH, f"code.dir={code}", "cluster.container.binds=[/data,/data/sub,/scratch]", "cluster.ranks=1"]
    )
    binds = base.container_binds(cfg, Charliecloud(cfg.cluster.container), ["/runs/sweep", "/runs"])
    # /data/sub lies inside /data; the code under /tmp is shared by ch-run anyway
    assert binds == [
        (base.HOST_PACKAGE, base.IMAGE_SOURCE),
        ("/data", "/data"),
        ("/runs", "/runs"),
        ("/scratch", "/scratch"),
    ]
    apptainer = load_config(
        ["cluster.container.runtime=apptainer", f"code.dir={code}", "cluster.container.host_code=false"]
    )
    assert base.container_binds(apptainer, Apptainer(apptainer.cluster.container), []) == [
        (str(code), str(code))
    ]


def _wrapped(tmp_path: Path, scontrol: str, inside: str) -> tuple[list[str], dict[str, str]]:
    """The host wrapper around `inside` (the container, as a shell line), as rank 0's task of job
    77, with a stand-in scontrol (a shell body) first on PATH."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\n{scontrol}\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURM_PROCID": "0"}
    env[container_plan.REQUEUE_DIR_VAR] = str(tmp_path)
    return ["sh", "-c", container_plan.HOST_REQUEUE, "hpctrain-task", "sh", "-c", inside], env


def test_the_host_wrapper_hands_rank_0s_requeue_request_to_scontrol(tmp_path: Path) -> None:
    """In the image there is no scontrol: rank 0 leaves a request file, and the task's wrapper on
    the host passes it on after the container exits, keeping the exit status; SIGUSR2 (the time
    limit's warning) does not end the wrapper. scontrol is a stand-in that records its arguments."""
    import subprocess

    inside = f"kill -USR2 $PPID; sleep 0.2; echo 77_3 > {tmp_path}/requeue-77; exit 5"
    argv, env = _wrapped(tmp_path, f'echo "$@" > {tmp_path}/called', inside)
    assert subprocess.run(argv, env=env, timeout=30).returncode == 5
    assert (tmp_path / "called").read_text() == "requeue 77_3\n"
    assert not (tmp_path / "requeue-77").exists()
    env["SLURM_PROCID"] = "1"  # only rank 0's task asks
    (tmp_path / "called").unlink()
    assert subprocess.run(argv, env=env, timeout=30).returncode == 5
    assert not (tmp_path / "called").exists()


def test_a_requeue_that_ends_the_wrapper_leaves_no_request_behind(tmp_path: Path) -> None:
    """SLURM ends the task when it requeues the job, possibly before scontrol returns: the request
    must be gone by then, or the next incarnation's wrapper would requeue the job again when it
    finishes (seen on the local cluster: a second requeue, then a FAILED job). The stand-in
    scontrol ends its caller as SLURM's requeue does."""
    import subprocess

    inside = f"echo 77_3 > {tmp_path}/requeue-77; exit 0"
    argv, env = _wrapped(tmp_path, f'echo "$@" > {tmp_path}/called\nkill -TERM $PPID', inside)
    subprocess.run(argv, env=env, timeout=30)
    assert (tmp_path / "called").read_text() == "requeue 77_3\n"
    assert not (tmp_path / "requeue-77").exists()


def test_a_slurm_run_in_a_container_is_wrapped_on_the_host_except_under_pyxis() -> None:
    ch = plan_slurm(load_config(["cluster=slurm", *CH]), "/runs/r1", "/venv/bin/python")
    assert ch.python.startswith("sh -c ") and " hpctrain-task ch-run " in ch.python
    assert ch.env[container_plan.REQUEUE_DIR_VAR] == "/runs/r1/submitit"
    px = load_config(["cluster=slurm", "cluster.container.runtime=pyxis", "cluster.container.image=/i.sqsh"])
    assert plan_slurm(px, "/runs/r1", "/venv/bin/python").python == "/opt/venv/bin/python3"


def test_a_runtime_that_is_not_installed_is_refused_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Apptainer, "probe", classmethod(lambda cls: None))
    cfg = load_config(
        ["cluster=slurm", "cluster.container.runtime=apptainer", "cluster.container.image=/x.sif"]
    )
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    text = str(e.value)
    assert "cluster.container.runtime" in text and "apptainer is not installed" in text
    assert "cluster.container.runtime=charliecloud" in text  # the fix names the runtime that works here


def test_pyxis_is_refused_for_local_runs_and_wants_an_image(monkeypatch: pytest.MonkeyPatch) -> None:
    local = load_config(["cluster.container.runtime=pyxis"])
    assert [p.key for p in problems(local, HostFacts.example())] == ["cluster.container.runtime"]
    monkeypatch.setattr(Pyxis, "probe", classmethod(lambda cls: "pyxis (srun --container-image)"))
    slurm = load_config(["cluster=slurm", "cluster.container.runtime=pyxis"])
    assert [(p.key, p.rule) for p in problems(slurm)] == [("cluster.container.image", "pyxis needs an image")]


def test_an_image_that_is_not_built_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Charliecloud, "probe", classmethod(lambda cls: "ch-run 0.31"))
    cfg = load_config(["cluster.container.runtime=charliecloud", f"cluster.container.storage={tmp_path}"])
    [p] = problems(cfg, HostFacts.example())
    assert p.key == "cluster.container.image" and p.fix == "run hpctrain container build"
    (tmp_path / "img" / "hpctrain" / "bin").mkdir(parents=True)  # an image directory...
    [p] = problems(cfg, HostFacts.example())  # ...without the interpreter the ranks start
    assert p.key == "cluster.container.python" and "/opt/venv/bin/python3 is not in image" in p.rule
    (tmp_path / "img" / "hpctrain" / "opt" / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "img" / "hpctrain" / "opt" / "venv" / "bin" / "python3").symlink_to("/usr/bin/python3.11")
    assert problems(cfg, HostFacts.example()) == []  # an image: accepted (a link into the image counts)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cluster.container.image", "'img;reboot'"),
        ("cluster.container.image", "'a b'"),
        ("cluster.container.binds", "['/data,/etc:/x']"),
        ("cluster.container.binds", "['/a:/b']"),
        ("cluster.container.python", "'python3 -c x'"),
    ],
)
def test_a_value_that_would_split_a_bind_list_or_srun_line_is_refused(key: str, value: str) -> None:
    cfg = load_config(["cluster=slurm", "cluster.container.runtime=pyxis", f"{key}={value}"])
    found = problems(cfg)
    assert found and found[0].key.startswith(key), found


def test_the_old_key_still_means_apptainer_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(["cluster=slurm", "cluster.container=/images/x.sif"])
    assert (str(cfg.cluster.container.runtime), cfg.cluster.container.image) == ("apptainer", "/images/x.sif")
    assert "deprecated" in capsys.readouterr().err


def test_the_debian_mirror_is_read_from_either_sources_format() -> None:
    deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\n"
    deb822 += "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    assert apt_mirror({"/etc/apt/sources.list.d/debian.sources": deb822}) == "http://mirror.example/debian"
    one_line = "# x\ndeb [arch=amd64] http://local/debian-security bookworm-security main\n"
    one_line += "deb http://local/debian bookworm main\n"
    assert apt_mirror({"/etc/apt/sources.list": one_line}) == "http://local/debian"
    assert apt_mirror({}) is None


def test_the_image_gets_the_venvs_runtime_versions_and_no_dev_tools() -> None:
    pins = dict(p.split("==") for p in runtime_pins())
    assert pins["torch"] == torch.__version__  # the CPU build this venv has, not PyPI's newest
    # Horovod's own requirements too (an optional extra of hpctrain's; the image runs it)
    for needed in ("submitit", "hydra-core", "mpi4py", "pip", "setuptools", "wheel", "psutil", "cloudpickle"):
        assert needed in pins, needed
    for absent in ("pytest", "mypy", "ruff", "hpctrain", "horovod"):
        assert absent not in pins, absent


def test_the_cache_key_follows_what_goes_in() -> None:
    a = Inputs(("torch==2.13.0",), "h/horovod.whl", ("python3",), "bookworm", "m", "FROM @BASE@", "s")
    assert a.key() == Inputs(*a.__dict__.values()).key()
    assert a.key() != Inputs(("torch==2.13.1",), *list(a.__dict__.values())[1:]).key()
    assert a.base_key() == Inputs(("torch==2.13.1",), *list(a.__dict__.values())[1:]).base_key()
    assert render_dockerfile("FROM @BASE@\nRUN x\n", "hpctrain-base:1") == "FROM hpctrain-base:1\nRUN x\n"


def test_a_local_apptainer_run_gets_the_hosts_gpus_exactly_when_its_ranks_use_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Apptainer, "image_problems", lambda self: [])
    app = ["cluster.container.runtime=apptainer", "cluster.container.image=/images/hpctrain.sif"]
    gpu_host = HostFacts.example(cuda_available=True, cuda_bf16=True, cuda_devices=2)
    for overrides, facts, nv in [
        ([], gpu_host, True),  # auto on a GPU host
        (["train.device=cpu"], gpu_host, False),
        ([], HostFacts.example(), False),  # auto without a GPU
    ]:
        plan = plan_local(load_config([*app, *overrides]), facts, "/runs/r1", "/venv/bin/python")
        assert ("--nv" in plan.argv) is nv, overrides
        assert plan.container is not None and plan.container["gpus"] is nv


def test_charliecloud_with_gpus_injects_the_host_libraries_once_or_names_the_fix(tmp_path: Path) -> None:
    from hpctrain.errors import LaunchError
    from hpctrain.launch.container.charliecloud import NVIDIA_MARK, inject_nvidia

    image = tmp_path / "img"
    (image / "bin").mkdir(parents=True)
    if not torch.cuda.is_available():  # this machine: the real ch-fromhost finds no NVIDIA driver
        with pytest.raises(LaunchError) as e:
            inject_nvidia(image)
        assert "ch-fromhost --nvidia" in str(e.value) and "nvidia-container-cli" in str(e.value)
        assert not (image / NVIDIA_MARK).exists()
    (image / NVIDIA_MARK).parent.mkdir(parents=True, exist_ok=True)
    (image / NVIDIA_MARK).write_text("injected\n")
    inject_nvidia(image)  # marked: not run again (it would fail here)
