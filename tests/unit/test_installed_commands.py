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
    assert (r.returncode, r.stdout.strip()) == (7, "hello there"), r.stderr
    assert "command 'broken' (hpctrain_hello:Missing) could not be loaded" in r.stderr
    r = _hpctrain(env, "--help")
    assert r.returncode == 0 and "say hello from another package" in r.stdout, r.stdout
    r = _hpctrain(env, "run", "--help")  # hpctrain's own: no search, and never replaced
    assert r.returncode == 0 and "could not be loaded" not in r.stderr and "--dry-run" in r.stdout


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
    )
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
    r = _hpctrain(env, *run, "cluster.name=ecko")
    assert (
        r.returncode == 2 and "no launcher named 'ecko': not one of local, slurm, echo, broken" in r.stderr
    ), r.stderr
