"""The remote cluster's pure parts (hpctrain/remote/): ssh's argv, what its failures mean, the bundle
that travels, the command line as the cluster's hpctrain gets it, and what a fetched archive may
hold. The whole path over a real sshd: tests/slurm/test_remote.py."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.errors import ConfigError, RecordError
from hpctrain.orchestrate.validate import validate
from hpctrain.remote.bundle import build
from hpctrain.remote.forward import _rewritten, hydra_quoted, may_be_remote
from hpctrain.remote.ssh import Target, control_dir, refusal
from hpctrain.remote.there import command_script, detached_script, unpack


def test_ssh_shares_one_checked_connection_and_never_prompts_without_a_terminal(tmp_path: Path) -> None:
    t = Target("me@login", None, tmp_path)
    argv = t.argv("sh -s", interactive=False)
    opts = {argv[i + 1] for i, a in enumerate(argv) if a == "-o"}
    assert {
        "ControlMaster=auto",
        f"ControlPath={tmp_path}/%C",
        "StrictHostKeyChecking=yes",
        "BatchMode=yes",
    } <= opts
    assert argv[-3:] == ["me@login", "--", "sh -s"]  # nothing after the destination is read as an option
    assert "BatchMode=no" in Target("me@login", "/etc/x", tmp_path).argv("true", interactive=True)
    assert Target("me@login", "/etc/x", tmp_path).argv("true", True)[1:3] == ["-F", "/etc/x"]


@pytest.mark.parametrize(
    "stderr, said",
    [
        ("me@login: Permission denied (publickey).", "add your key (ssh-copy-id me@login)"),
        (
            "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\nHost key verification failed.",
            "never accepts a host key itself",
        ),
        ("ssh: Could not resolve hostname nowhere: Name or service not known", "not a host name"),
        ("ssh: connect to host 127.0.0.1 port 9: Connection refused", "did not answer"),
    ],
)
def test_ssh_failures_are_named_with_their_fix(stderr: str, said: str) -> None:
    assert said in refusal("me@login", stderr)


def test_the_bundle_is_named_by_its_content(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.yaml").write_text("k: v\n")
    files = [("code/a.py", tmp_path / "a.py"), ("conf/cluster/b.yaml", tmp_path / "b.yaml")]
    one, two = build(files), build(files)
    assert one.digest == two.digest and one.data == two.data and one.files == 2  # no times, no owners
    (tmp_path / "a.py").write_text("x = 2\n")
    assert build(files).digest != one.digest
    with tarfile.open(fileobj=io.BytesIO(one.data)) as tar:
        assert tar.getnames() == ["code/a.py", "conf/cluster/b.yaml"]


def test_the_command_line_travels_with_its_overrides_files_content_and_without_local_paths() -> None:
    argv = [
        "study",
        "strong",
        "--overrides-file",
        "s.yaml",
        "--config-dir",
        "/home/me/conf",
        "x=1",
        "--no-progress",
    ]
    words = _rewritten(argv, 2, ["data=digits", "x=1"])
    assert words == ["study", "strong", "data=digits", "x=1", "--no-progress"]


HOSTILE = ["run.name=a$(touch MARK)b", "x=`touch MARK`", "y=1; touch MARK", "z=l1\nl2", "q='\"", "w=$HOME"]


def test_every_word_reaches_the_remote_hpctrain_as_data(tmp_path: Path) -> None:
    """The script the cluster's `sh -s` runs, run by a real sh with a stand-in hpctrain that
    prints its arguments: each arrives as it was typed, and nothing was executed."""
    stand_in = tmp_path / "hpctrain"
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stand_in.chmod(0o755)
    script = command_script(str(stand_in), str(tmp_path), ["run", *HOSTILE])
    r = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["run", *HOSTILE]
    assert not (tmp_path / "MARK").exists()


def _archive(*entries: tarfile.TarInfo) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for e in entries:
            tar.addfile(e, io.BytesIO(b"x" * e.size) if e.isfile() else None)
    return buf.getvalue()


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def test_a_fetched_archive_writes_only_files_inside_the_run(tmp_path: Path) -> None:
    unpack(_archive(_file("./summary.json"), _file("./logs/rank0.log")), tmp_path / "run")
    assert (tmp_path / "run" / "logs" / "rank0.log").read_text() == "x"
    link = tarfile.TarInfo("./evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    for bad in (_file("../outside"), _file("/abs"), link):
        with pytest.raises(RecordError, match="not a file inside the run"):
            unpack(_archive(bad), tmp_path / "run2")
    assert not (tmp_path / "outside").exists() and not (tmp_path / "run2" / "evil").exists()


@pytest.mark.parametrize(
    "override, key",
    [
        ("cluster.remote='-oProxyCommand=touch_x'", "cluster.remote"),
        ("cluster.remote='me@host;touch x'", "cluster.remote"),
        ("cluster.remote_dir='$(touch x)'", "cluster.remote_dir"),
        ("cluster.remote_hpctrain=../bin/hpctrain", "cluster.remote_hpctrain"),
    ],
)
def test_remote_settings_that_could_reach_a_shell_are_refused(override: str, key: str) -> None:
    cfg = load_config(["cluster=slurm", "cluster.remote=me@login", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


@pytest.mark.parametrize(
    "value", ["/h/00-a`touch M`b;touch M && x|tee M", "/h/it's a \\ b", "/h/a\\'b", "/h/end\\"]
)
def test_a_path_reaches_the_clusters_hydra_as_one_value(value: str) -> None:
    """run.dir names the run there: a run name's characters inside it are one quoted value."""
    assert load_config(["cluster=slurm", f"run.dir={hydra_quoted(value)}"]).run.dir == value


def test_the_control_socket_path_fits_a_unix_socket(tmp_path: Path) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp", prefix="h") as short_cache:  # a path short enough
        mine = control_dir(Path(short_cache))
        assert mine == Path(short_cache) / "ssh" and (mine.stat().st_mode & 0o777) == 0o700  # made now
    deep = tmp_path / ("d" * 80)
    short = control_dir(deep)
    assert len(str(short)) + 41 <= 100 and (short.stat().st_mode & 0o777) == 0o700


def test_only_a_site_preset_or_the_key_itself_can_make_a_command_remote() -> None:
    """The others are never composed twice (a run's start pays nothing for the remote path)."""
    assert not may_be_remote(["data=digits", "cluster=slurm", "cluster.nodes=2", "cluster=local"])
    assert may_be_remote(["cluster=mysite"]) and may_be_remote(["cluster.remote=me@login"])
    assert may_be_remote(["cluster=slurm,mysite"])  # a sweep over presets


def test_a_detached_command_shows_its_output_and_exit_status_and_keeps_its_words_as_data(
    tmp_path: Path,
) -> None:
    """What a run, study or tune runs there: in a session of its own (a dropped connection leaves
    it running), its stdout and stderr shown as they are, its exit status passed on."""
    stand_in = tmp_path / "hpctrain"
    stand_in.write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"
        "print('to stderr', file=sys.stderr)\nsys.exit(4)\n"
    )
    stand_in.chmod(0o755)
    session = tmp_path / "sessions" / "s1"
    script = detached_script(str(stand_in), str(tmp_path), ["run", *HOSTILE], str(session))
    r = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 4, r.stderr
    assert json.loads(r.stdout) == ["run", *HOSTILE] and r.stderr == "to stderr\n"
    assert not (tmp_path / "MARK").exists() and (session / "rc").read_text().strip() == "4"


def test_a_directory_that_lives_there_is_named_by_its_path_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--after DIR[:any] and --resume DIR of work made from here go to the cluster as its paths."""
    from hpctrain import records

    local = tmp_path / "outputs" / "d" / "12-00-00-sweep"
    local.mkdir(parents=True)
    ref = records.new(
        records.RemoteRef,
        destination="c",
        remote_dir="/home/me/hpctrain/runs/d/12-00-00-sweep",
        hpctrain="hpctrain",
        version="0",
    )
    records.write(local / records.REMOTE, ref)
    argv = ["run", "--after", f"{local}:any", "--after", str(local / "0"), "--no-progress", str(local)]
    words = _rewritten(argv, 1, [])
    there = "/home/me/hpctrain/runs/d/12-00-00-sweep"
    assert words == ["run", "--after", f"{there}:any", "--after", f"{there}/0", "--no-progress", str(local)]


def test_a_command_sent_from_another_machine_reads_only_the_configs_it_brought(tmp_path: Path) -> None:
    """The cluster user's own ~/.config/hpctrain would hide a preset of the same name sent from the
    laptop, or be hidden by it (hpctrain refuses both): the command there reads only its bundle's."""
    from hpctrain.config.search import search_path

    (tmp_path / ".config" / "hpctrain" / "cluster").mkdir(parents=True)
    env = {"HOME": str(tmp_path)}
    assert [s.origin for s in search_path(None, env).sources] == ["hpctrain", "user"]
    assert [s.origin for s in search_path(None, {**env, "HPCTRAIN_IGNORE_USER_CONFIG": "1"}).sources] == [
        "hpctrain"
    ]
