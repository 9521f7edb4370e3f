"""Every `hpctrain` command the documentation shows (README.md and docs/) is a command that works
today: it parses, its overrides compose into a config, and the config passes every rule, as
`hpctrain run --dry-run` would check it, without starting anything. A dead key, a renamed option
or a rule a documented command breaks fails the quick tier. Shown output that hpctrain prints
without starting anything (a refusal, a dry run) is compared with what it prints now. Config
presets a page defines (`cluster/NAME.yaml` blocks) are installed first, so their commands run
against the page's own preset."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain import cli
from hpctrain.config import load_config
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.facts import importable

ROOT = Path(__file__).parents[2]
PAGES = sorted(
    [ROOT / "README.md"]
    + [
        p
        for p in (ROOT / "docs").rglob("*.md")
        if not {"_build", "_generated", "_scratch"} & set(p.relative_to(ROOT / "docs").parts)
    ]
)
SHELL = {"bash", "sh", "shell", "console", ""}
# Keys whose value names the reader's own files, directories or code (a script, a dataset, a
# checkpoint, an earlier run): the documentation cannot ship them, so their existence rules
# are the only ones a documented command may break
READERS_OWN = {
    "script.path",
    "data.path",
    "model._target_",
    "data._target_",
    "loss._target_",
    "train.resume_from",
    "run.after",
    "--after",
    "--config-dir",
    "code.dir",
    "cluster.container.image",
    "cluster.container.binds",
    "cluster.preflight.reference",
}


@dataclass(frozen=True)
class Shown:
    """One command a page shows, and the output shown after it (console transcripts)."""

    page: str
    line: int
    text: str
    output: tuple[str, ...]
    transcript: bool

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """The fenced code blocks of a Markdown page: (info string, first line number, lines)."""
    out, info, start, body = [], None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^(```+|:::+)\s*(\{[^}]*\})?\s*(\S*)", line)
        if fence and info is None:
            info, start, body = (fence.group(3) if not fence.group(2) else "{directive}"), n + 1, []
        elif line.startswith("```") and info is not None:
            out.append((info, start, body))
            info = None
        elif info is not None:
            body.append(line)
    return out


def _logical(lines: list[str], start: int) -> list[tuple[int, str]]:
    """Lines with their backslash continuations joined."""
    out: list[tuple[int, str]] = []
    acc, first = "", start
    for n, line in enumerate(lines, start):
        if not acc:
            first = n
        if line.rstrip().endswith("\\"):
            acc += line.rstrip()[:-1] + " "
            continue
        out.append((first, acc + line))
        acc = ""
    return out


def shown_commands() -> list[Shown]:
    found = []
    for page in PAGES:
        rel = str(page.relative_to(ROOT))
        for info, start, body in _blocks(page.read_text()):
            if info not in SHELL:
                continue
            lines = _logical(body, start)
            for i, (n, line) in enumerate(lines):
                text = line.strip()
                prompt = text.startswith("$ ")
                text = text[2:] if prompt else text
                if not text.startswith("hpctrain "):
                    continue
                output: list[str] = []
                for _, nxt in lines[i + 1 :]:
                    if nxt.strip().startswith("$ "):
                        break
                    output.append(nxt.rstrip())
                found.append(Shown(rel, n, text, tuple(output), info == "console" and prompt))
    return found


SHOWN = shown_commands()


def test_the_pages_show_commands() -> None:
    pages = {s.page for s in SHOWN}
    assert len(SHOWN) > 60 and {"README.md", "docs/quickstart.md", "docs/tutorials/slurm.md"} <= pages


@pytest.fixture(scope="module")
def presets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The config presets the pages define, as a user's config directory."""
    home = tmp_path_factory.mktemp("config")
    for page in PAGES:
        text = page.read_text()
        for info, start, body in _blocks(text):
            if info != "yaml":
                continue
            before = "\n".join(text.splitlines()[max(0, start - 6) : start - 1])
            named = re.findall(r"cluster/(\w+)\.yaml", before)
            if named:
                (home / "hpctrain" / "cluster").mkdir(parents=True, exist_ok=True)
                (home / "hpctrain" / "cluster" / f"{named[-1]}.yaml").write_text("\n".join(body) + "\n")
    return home


# a rule about this machine rather than the command: a container runtime the test machine lacks
ABOUT_THIS_MACHINE = re.compile(r"is not installed on this machine")


def _tolerated(e: ConfigError) -> bool:
    keys = {p.key for p in e.problems if not ABOUT_THIS_MACHINE.search(p.rule)}
    if not importable("horovod"):  # a quick tier without Horovod: its refusal is the fix to show
        keys -= {"parallelism.engine"}
    return keys <= READERS_OWN


def _check(args: object) -> None:
    """Compose and validate what the command would run, as its planning does; start nothing."""
    from hpctrain.commands.preflight import ONLY
    from hpctrain.orchestrate.runs import prepare
    from hpctrain.orchestrate.study_run import plan_study
    from hpctrain.orchestrate.tune import plan_tune

    a = vars(args)
    command, overrides, config_dir = a["command"], a.get("overrides", []), a.get("config_dir")
    if command == "run" and a["cfg"]:
        load_config(overrides, config_dir)
    elif command == "run":
        prepare(overrides, config_dir, a["multirun"], after=a["after"])
    elif command == "study" and a["kind"] != "resume":
        plan_study(a["kind"], overrides, config_dir)
    elif command == "tune" and not a["resume"]:
        plan_tune(overrides, config_dir)
    elif command == "preflight":
        prepare([*overrides, *ONLY], config_dir, False)


@pytest.mark.parametrize("shown", SHOWN, ids=str)
def test_a_documented_command_parses_composes_and_validates(
    shown: Shown, presets: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(presets))
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(shown.text, comments=True)[1:]
    if any("..." in t or "…" in t for t in argv):
        pytest.skip("an elided command (...)")
    if "--help" in argv or "--version" in argv:
        with pytest.raises(SystemExit) as e:
            cli.parse(argv)
        assert e.value.code == 0
        return
    try:
        args = cli.parse(argv)
    except SystemExit as e:
        pytest.fail(f"{shown}: does not parse (exit {e.code})")
    refused = None
    try:
        _check(args)
    except ConfigError as e:
        refused = e
    except HpctrainError as e:
        pytest.fail(f"{shown}: {e}")
    if shown.transcript and shown.output and shown.output[0].startswith("error:"):
        assert refused is not None, f"{shown}: the page shows a refusal, but it is accepted now"
    elif refused is not None and not _tolerated(refused):
        pytest.fail(f"{shown}: refused:\n{refused}")
    if shown.transcript and shown.output and (refused is not None or "--dry-run" in argv or "--cfg" in argv):
        _compare_output(shown, argv, refused)


def _compare_output(shown: Shown, argv: list[str], refused: ConfigError | None) -> None:
    """The shown lines appear in the command's output, in order (a page may show an excerpt)."""
    from tests.conftest import hpctrain_here

    r = hpctrain_here(*argv, cwd=Path.cwd())
    code = r.returncode
    printed = [line.rstrip() for line in (r.stdout + r.stderr).splitlines()]
    assert code == (2 if refused is not None else 0), f"{shown}: exit {code}\n" + "\n".join(printed)
    at = 0
    for want in (w for w in shown.output if w.strip() not in ("", "...", "…")):
        while at < len(printed) and printed[at] != want:
            at += 1
        assert at < len(printed), (
            f"{shown}: the page shows\n  {want}\nwhich it no longer prints:\n" + "\n".join(printed)
        )
        at += 1


def test_the_checker_catches_a_dead_key_and_a_renamed_option(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError):
        _check(cli.parse(["run", "train.stepz=5"]))
    with pytest.raises(SystemExit):
        cli.parse(["run", "--dryrun"])
    assert not _tolerated(ConfigError.one("train.steps", "must be >= 1", "set it"))
    assert _tolerated(ConfigError.one("script.path", "does not exist", "name your script"))


def page_command(page: str, start: str, dry_run: bool | None = None) -> list[str]:
    """The arguments of the first command `page` shows that begins with `start` (and, if
    `dry_run` is given, does or does not end in --dry-run): the tutorials' tests run them as the
    page shows them."""
    found = [
        s
        for s in SHOWN
        if s.page == page
        and s.text.startswith(start)
        and (dry_run is None or ("--dry-run" in shlex.split(s.text, comments=True)) == dry_run)
    ]
    assert found, f"{page} no longer shows a command beginning {start!r}"
    return shlex.split(found[0].text, comments=True)[1:]
