"""The CLI and the launchers are open as the other axes are: another installed package adds a command through an entry
point in `hpctrain.commands` (a dist-info as pip writes it), listed by --help and run with its own
arguments and exit code; it cannot take one of hpctrain's names, and one that fails to load is
named while hpctrain's own commands go on. Each built-in command's parser names its handler. A
launcher from another package (`hpctrain.launchers`) is chosen by cluster.name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HELLO = """
class Hello:
    help = "say hello from another package"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--who", default="world")

    @staticmethod
    def run(args, console):
        console.print(f"hello {args.who}")
        return 7
"""


def _install(site: Path, entries: str) -> dict[str, str]:
    pkg = site / "hpctrain_hello"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(HELLO)
    info = site / "hpctrain_hello-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hpctrain-hello\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hpctrain.commands]\n" + entries)
    return {**os.environ, "PYTHONPATH": str(site)}


def _hpctrain(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).parent / "hpctrain")
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)


def test_an_installed_command_is_listed_and_runs(tmp_path: Path) -> None:
    env = _install(
        tmp_path,
        "hello = hpctrain_hello:Hello\nrun = hpctrain_hello:Hello\nbroken = hpctrain_hello:Missing\n",
    )
    r = _hpctrain(env, "hello", "--who", "there")
    assert (r.returncode, r.stdout.strip(), r.stderr) == (7, "hello there", ""), (
        r.stderr
    )  # broken: not loaded
    r = _hpctrain(env, "hello", "--help")
    assert r.returncode == 0 and "say hello from another package" in r.stdout, r.stdout
    r = _hpctrain(env, "--help")  # listed by name and package, none imported
    assert r.returncode == 0 and "a command of hpctrain-hello 0.1 (not loaded until run)" in r.stdout, (
        r.stdout
    )
    r = _hpctrain(env, "broken")
    assert r.returncode == 1, r.stderr
    assert (
        "error: the command 'broken' (hpctrain_hello:Missing, from another installed package) cannot be "
        "loaded: AttributeError" in r.stderr
    ), r.stderr
    r = _hpctrain(env, "run", "--help")  # hpctrain's own: no search, and never replaced
    assert r.returncode == 0 and r.stderr == "" and "--dry-run" in r.stdout


ROGUES = """
import os, sys, time
print("rogue was imported")
if os.environ.get("ROGUE") == "sleep":
    time.sleep(300)
if os.environ.get("ROGUE") == "exit":
    sys.exit(5)


class Rogue:
    help = "misbehaves"

    @staticmethod
    def add_arguments(parser):
        pass

    @staticmethod
    def run(args, console):
        raise RuntimeError("the rogue's own bug")
"""


def test_a_plugin_that_hangs_exits_or_prints_at_import_or_raises_never_takes_the_cli_down(
    tmp_path: Path,
) -> None:
    """Issue 72 class 7: on 8e3c5b6 a command plugin that slept at import hung --help and
    --version, one that called sys.exit made them exit with its code and no message, its prints
    landed in --version's output, and a plugin command that raised was "a bug in hpctrain"."""
    import time

    pkg = tmp_path / "hpctrain_rogue"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(ROGUES)
    info = tmp_path / "hpctrain_rogue-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hpctrain-rogue\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hpctrain.commands]\nrogue = hpctrain_rogue:Rogue\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "ROGUE": "sleep", "HPCTRAIN_PLUGIN_TIMEOUT_S": "1"}
    for args in (("--help",), ("--version",), ("status", "--help")):
        began = time.monotonic()
        r = _hpctrain(env, *args)
        assert r.returncode == 0 and time.monotonic() - began < 10, (args, r.stderr)
        assert "rogue was imported" not in r.stdout + r.stderr, args
    r = _hpctrain(env, "rogue")
    assert r.returncode == 1, r.stderr
    assert (
        "error: the command 'rogue' (hpctrain_rogue:Rogue, from another installed package) did not finish "
        "importing in 1 s"
        in r.stderr
        and "HPCTRAIN_PLUGIN_TIMEOUT_S" in r.stderr
    ), r.stderr
    r = _hpctrain({**env, "ROGUE": "exit"}, "rogue")
    assert r.returncode == 1 and "called sys.exit(5) while it was imported" in r.stderr, r.stderr
    r = _hpctrain({**env, "ROGUE": ""}, "rogue")
    assert r.returncode == 1 and r.stdout == "", r.stdout  # its import's print went to stderr
    assert "rogue was imported" in r.stderr and "this is a bug in hpctrain" not in r.stderr, r.stderr
    assert (
        "error: the command 'rogue' (hpctrain_rogue:Rogue), from another installed package, failed: "
        "RuntimeError: the rogue's own bug" in r.stderr
    ), r.stderr


def test_every_built_in_command_names_a_handler_that_exists() -> None:
    import argparse
    import importlib

    from hpctrain.parser import build_parser

    def parsers(p: argparse.ArgumentParser):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    inner = list(parsers(child))
                    yield from inner if inner else [(name, child)]

    found = dict(parsers(build_parser()))
    assert {"run", "study", "analyze", "status", "doctor", "overhead", "predict"} <= found.keys()
    for name, p in found.items():
        module, _, attr = p.get_default("handler").partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), name


ECHO = """
from hpctrain.launch.local.launcher import LocalLauncher


class EchoLauncher(LocalLauncher):
    def describe(self, runs):
        return "echo launcher: " + self.name + "\\n" + super().describe(runs)


class Plain:
    pass


NUMBER = 7
"""


def test_an_installed_launcher_is_chosen_by_cluster_name(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "hpctrain_echo").mkdir(parents=True)
    (site / "hpctrain_echo" / "__init__.py").write_text(ECHO)
    info = site / "hpctrain_echo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hpctrain-echo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[hpctrain.launchers]\necho = hpctrain_echo:EchoLauncher\nbroken = hpctrain_echo:Missing\n"
        "not_a_launcher = hpctrain_echo:Plain\nnumber = hpctrain_echo:NUMBER\nraising = hpctrain_echo.raising:X\n"
    )
    (site / "hpctrain_echo" / "raising.py").write_text("raise RuntimeError('no, not at import')\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = ("run", "--dry-run", "data=digits", "parallelism.engine=ddp")
    r = _hpctrain(env, *run, "cluster.name=echo")
    assert r.returncode == 0 and "echo launcher: echo" in r.stdout, r.stdout + r.stderr
    r = _hpctrain(env, *run, "cluster.name=broken")
    assert r.returncode == 2, r.stderr
    assert (
        "the launcher 'broken' (hpctrain_echo:Missing, from another installed package) cannot be loaded"
        in r.stderr
    )
    for entry, said in (
        ("not_a_launcher = hpctrain_echo:Plain", "is the class Plain, not a subclass of hpctrain's Launcher"),
        ("number = hpctrain_echo:NUMBER", "is int 7, not a subclass of hpctrain's Launcher"),
        ("raising = hpctrain_echo.raising:X", "cannot be loaded: RuntimeError: no, not at import"),
    ):  # issue 72 class 6: each was "a bug in hpctrain" on 8e3c5b6
        name = entry.split(" ")[0]
        r = _hpctrain(env, *run, f"cluster.name={name}")
        assert r.returncode == 2 and said in r.stderr and "bug" not in r.stderr, r.stderr
    r = _hpctrain(env, *run, "cluster.name=ecko")
    assert r.returncode == 2 and (
        "no launcher named 'ecko': not one of local, slurm, echo, broken, not_a_launcher" in r.stderr
    ), r.stderr
