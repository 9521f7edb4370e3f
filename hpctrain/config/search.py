"""Where configs are read from: hpctrain's own groups (shipped in the package) first, then the
directories a site or a user adds, in this order: --config-dir, $HPCTRAIN_CONFIG_PATH (directories
separated by ':'), the user's own ($XDG_CONFIG_HOME/hpctrain, else ~/.config/hpctrain, where it
exists). This is Hydra's search path: an added directory brings new options and groups
(cluster/mysite.yaml, used as cluster=mysite) beside the shipped ones, never in their place, so a
file named like a shipped one is refused rather than silently ignored."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.config.yaml_bounds import preset_problem
from hpctrain.errors import ConfigError, Problem
from hpctrain.resources import shipped

ENV = "HPCTRAIN_CONFIG_PATH"
IGNORE_USER = (
    "HPCTRAIN_IGNORE_USER_CONFIG"  # 1: not ~/.config/hpctrain (remote commands: their configs travel)
)
LEGACY_ENV = "HPCTRAIN_CONF_DIR"  # before search paths: one directory; now added like the others


@dataclass(frozen=True)
class Source:
    path: Path
    origin: str  # what put it on the search path: hpctrain, --config-dir, $HPCTRAIN_CONFIG_PATH, user


@dataclass(frozen=True)
class SearchPath:
    sources: tuple[Source, ...]  # the shipped configs first

    @property
    def shipped(self) -> Path:
        return self.sources[0].path

    @property
    def added(self) -> tuple[Source, ...]:
        return self.sources[1:]

    def groups(self) -> set[str]:
        """Every config group: the directories of every source, and `cluster` (ConfigStore)."""
        return {g.name for s in self.sources for g in _listed(s.path) if g.is_dir()} | {"cluster"}

    def options(self, group: str) -> list[str]:
        return sorted({p.stem for s in self.sources for p in _listed(s.path / group) if p.suffix == ".yaml"})

    def hydra_overrides(self) -> list[str]:
        """The added directories as Hydra's own override (appended after the primary directory)."""
        if not self.added:
            return []
        return ["hydra.searchpath=[" + ",".join(_quoted(f"file://{s.path}") for s in self.added) + "]"]


def _listed(d: Path) -> list[Path]:
    """The entries of `d`; none where it cannot be read (search_path names that directory)."""
    try:
        return list(d.iterdir())
    except OSError:
        return []


def user_dir(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "hpctrain"


def search_path(
    explicit: str | os.PathLike[str] | None = None, env: Mapping[str, str] = os.environ
) -> SearchPath:
    """The search path for this command. ConfigError for a directory that is named but missing,
    and for an added file that a shipped one would hide."""
    sources = [Source(shipped("conf"), "hpctrain")]
    named: list[tuple[str, str]] = []
    if explicit:
        named.append(("--config-dir", str(explicit)))
    for var in (ENV, LEGACY_ENV):
        named += [(f"${var}", d) for d in env.get(var, "").split(os.pathsep) if d]
    problems = []
    for origin, d in named:
        try:
            p = Path(d).expanduser().resolve()
        except (OSError, RuntimeError) as e:  # a link loop: RuntimeError before Python 3.13
            problems.append(
                Problem(origin, f"{d} does not resolve ({e})", "name a directory, not a link loop")
            )
            continue
        if not p.is_dir():
            problems.append(Problem(origin, f"{d} is not a directory", "create it, or name an existing one"))
        elif all(p != s.path for s in sources):
            sources.append(Source(p, origin))
    user = user_dir(env)
    mine = env.get(IGNORE_USER) != "1"  # a command sent from another machine brings its own
    if mine and user.is_dir() and all(user.resolve() != s.path for s in sources):
        sources.append(Source(user.resolve(), "user"))
    found = SearchPath(tuple(sources))
    problems += _hidden(found)
    if problems:
        raise ConfigError(problems)
    return found


def registered() -> set[Path]:
    """The names hpctrain and Hydra register in Hydra's ConfigStore (schema.register, Hydra's own
    primary config and placeholder): a file so named would replace the schema under every run."""
    from hpctrain.config.schema import CLUSTER_SCHEMAS

    names = ["hpctrain_schema", "_dummy_empty_config_", "hydra/config"]
    return {Path(f"{n}.yaml") for n in names} | {Path(f"cluster/{n}_schema.yaml") for n in CLUSTER_SCHEMAS}


def _yaml_files(root: Path, problems: list[Problem], origin: str) -> list[Path]:
    """Every .yaml file under `root`, following links to directories once each (a link loop
    ends), an unreadable directory named in `problems`."""
    seen: set[tuple[int, int]] = set()
    found: list[Path] = []

    def unreadable(e: OSError) -> None:
        where = e.filename or root
        problems.append(Problem(origin, f"{where} cannot be read ({e.strerror})", "make it readable, or take it off the search path"))  # fmt: skip

    for here, dirs, files in os.walk(root, followlinks=True, onerror=unreadable):
        try:
            st = os.stat(here)
        except OSError as e:
            unreadable(e)
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:  # reached again through a link: its files are listed
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        found += [Path(here) / f for f in sorted(files) if f.endswith(".yaml")]
    return found


def _conflict(rel: Path, shipped: set[Path], first: Source | None) -> tuple[str, str] | None:
    """Why an added file named `rel` cannot be used, and the fix; None if it can. `first`: an
    earlier added source that holds the same name (Hydra would take that one)."""
    if rel.parts[0] == "hydra":
        return "is in Hydra's own group", "drop it: hpctrain sets Hydra's own options (the output directory, logging, the launcher)"  # fmt: skip
    if rel in registered():
        return "is the name of a config hpctrain registers", f"rename it: {rel.stem} is the schema hpctrain registers, which every run is checked against"  # fmt: skip
    if rel in shipped and rel.parent == Path("."):
        return "is hpctrain's own, which would hide it", "drop it: hpctrain's primary config stays; choose your options on the command line"  # fmt: skip
    if rel in shipped:
        fix = f"rename it (e.g. {rel.parent}/mysite.yaml, used as {rel.parent}=mysite); to build on hpctrain's, start it with `defaults: [{rel.stem}, _self_]`"  # fmt: skip
        return "is hpctrain's own, which would hide it", fix
    if first is not None:
        return f"is also in {first.path} ({first.origin}), which comes first and would hide this one", "rename one of them, or take one directory off the search path"  # fmt: skip
    return None


def _hidden(found: SearchPath) -> list[Problem]:
    """Added files that a shipped, registered or earlier added config of the same name would hide
    or be hidden by (Hydra takes the first source; a ConfigStore entry merges with a file of its
    name), files in Hydra's own `hydra/` group (hpctrain composes it itself), files that are no
    preset (too large, a YAML bomb, not a mapping, Hydra's options: yaml_bounds.py), and
    directories that cannot be read."""
    shipped = {p.relative_to(found.shipped) for p in found.shipped.rglob("*.yaml")}
    out: list[Problem] = []
    first: dict[Path, Source] = {}
    for s in found.added:
        for p in _yaml_files(s.path, out, s.origin):
            rel = p.relative_to(s.path)
            why = _conflict(rel, shipped, first.get(rel))
            first.setdefault(rel, s)
            if why is None and (bad := preset_problem(p)) is not None:  # read with bounds, before Hydra
                why = bad, "correct it, or move it off the search path"
            if why is not None:
                out.append(Problem(str(p), f"{rel} {why[0]} ({s.origin})", why[1]))
    return out


def _quoted(text: str) -> str:
    """A value of Hydra's override grammar, quoted (paths may hold spaces, commas, brackets)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
