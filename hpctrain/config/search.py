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

from hpctrain.errors import ConfigError, Problem
from hpctrain.resources import shipped

ENV = "HPCTRAIN_CONFIG_PATH"
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
        return {g.name for s in self.sources for g in s.path.iterdir() if g.is_dir()} | {"cluster"}

    def options(self, group: str) -> list[str]:
        return sorted({p.stem for s in self.sources for p in (s.path / group).glob("*.yaml")})

    def hydra_overrides(self) -> list[str]:
        """The added directories as Hydra's own override (appended after the primary directory)."""
        if not self.added:
            return []
        return ["hydra.searchpath=[" + ",".join(_quoted(f"file://{s.path}") for s in self.added) + "]"]


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
        p = Path(d).expanduser().resolve()
        if not p.is_dir():
            problems.append(Problem(origin, f"{d} is not a directory", "create it, or name an existing one"))
        elif all(p != s.path for s in sources):
            sources.append(Source(p, origin))
    user = user_dir(env)
    if user.is_dir() and all(user.resolve() != s.path for s in sources):
        sources.append(Source(user.resolve(), "user"))
    found = SearchPath(tuple(sources))
    problems += _hidden(found)
    if problems:
        raise ConfigError(problems)
    return found


def _hidden(found: SearchPath) -> list[Problem]:
    """Added files that a shipped file of the same name would hide (Hydra takes the first)."""
    own = {p.relative_to(found.shipped) for p in found.shipped.rglob("*.yaml")}
    out = []
    for s in found.added:
        for p in sorted(s.path.rglob("*.yaml")):
            rel = p.relative_to(s.path)
            if rel not in own:
                continue
            if rel.parent == Path("."):
                fix = "drop it: hpctrain's primary config stays; choose your options on the command line"
            else:
                fix = (
                    f"rename it (e.g. {rel.parent}/mysite.yaml, used as {rel.parent}=mysite); to build "
                    f"on hpctrain's, start it with `defaults: [{rel.stem}, _self_]`"
                )
            out.append(Problem(str(p), f"{rel} is hpctrain's own, which would hide it ({s.origin})", fix))
    return out


def _quoted(text: str) -> str:
    """A value of Hydra's override grammar, quoted (paths may hold spaces, commas, brackets)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
