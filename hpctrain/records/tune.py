"""A tune directory's record (hpctrain tune): tune.json."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TuneTrial:
    """A trial of hpctrain tune: a short run in <tune>/<name> with some settings changed."""

    name: str
    changed: list[str]  # the overrides it adds to the config's (empty: the config as given)
    predicted_s: float = float("nan")  # its step as predicted before it ran (NaN: not predicted)
    step_s: float = float("nan")  # measured (NaN: failed or not run)
    samples_per_s: float = float("nan")
    verdict: str = ""


@dataclass(frozen=True)
class TuneManifest:
    """tune.json: what hpctrain tune tried, what it left out and why, and the best settings."""

    format_version: int
    launcher: str
    overrides: list[str]  # the command's: the config tuned
    config_dir: str | None
    trials: list[TuneTrial]
    left_out: list[TuneTrial] = field(default_factory=list)  # pruned or past the budget (verdict: why)
    best: list[str] = field(default_factory=list)  # the best trial's changed settings
    best_trial: str = ""  # its name ("": no trial finished yet)
    finished: bool = False
    spent_s: float = 0.0  # seconds of tuning over every invocation (tune.budget_min counts them all)
