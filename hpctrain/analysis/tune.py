"""`hpctrain tune`'s search, pure: which settings to try next, which to leave out and why, and
which trial won. The trials' runs come in as their summaries (orchestrate/tune.py runs them).

A trial is a short run of the config with some settings changed. The search is coordinate
descent, one knob at a time (as Horovod's own tuning guide takes the fusion threshold, then the
cycle time): round 0 runs the config as given; each later round tries one knob's other values on
top of the best settings so far. Before a round, the step model predicts each value's step from
the trials so far: the best trial's step, plus the exposed share f of the change in the
collectives' expected time that the value makes (the roofline's alpha-beta model on the trial's
own probe, analysis/roofline.py: the messages a group size gives, the bytes a compression puts on
the wire). f is refitted over every trial (least squares through the origin). A value predicted
slower than the best measured step by more than PRUNE is not tried. The next knob is the one
whose best value the model expects to gain most; knobs the model cannot see (Horovod's cycle
time, DDP's bucket views, FSDP's resharding, a pipeline's micro-batches) come after, and are tried.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hpctrain.analysis.metrics import through_origin
from hpctrain.analysis.roofline import MIB, for_run
from hpctrain.records import RunSummary

# A value predicted this much slower than the best measured step is left out: a short trial's
# step varies by about 5% from launch to launch on this machine (`hpctrain bench estimate`),
# twice that is clearly worse.
PRUNE = 0.10
# A trial must beat the best by more than this to take its place: what is within a launch's noise
# keeps the settings the user already has.
MIN_GAIN = 0.02


class Effect(StrEnum):
    """What a knob changes in the step model."""

    grouping = "grouping"  # the value is the gradients' group size in MB (fusion buffer, bucket)
    wire = "wire"  # the value is a compression: the bytes on the wire
    unmodelled = "unmodelled"  # the model cannot say: the knob is tried


@dataclass(frozen=True)
class Knob:
    """A setting `hpctrain tune` searches: an override key and the values to try (an engine's or
    a parallelism's tune_knobs says which)."""

    key: str  # e.g. parallelism.bucket_mb
    values: tuple[Any, ...]
    effect: Effect = Effect.unmodelled


def divisors(n: int) -> tuple[int, ...]:
    """The degrees a setting over n ranks may take: powers of two dividing n, and n."""
    found = {d for d in (2**k for k in range(n.bit_length())) if n % d == 0} | {max(n, 1)}
    return tuple(sorted(found))


def override_text(value: Any) -> str:
    """A value as Hydra's override grammar reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"  # 25.0 and 25 are one value
    return str(value)


Settings = tuple[tuple[str, str], ...]  # (key, value as override text), in knob order


def with_setting(settings: Settings, key: str, value: str) -> Settings:
    return tuple((k, value if k == key else v) for k, v in settings) + (
        () if any(k == key for k, _ in settings) else ((key, value),)
    )


@dataclass(frozen=True)
class Trial:
    """A trial that ran: its settings and its run's summary (None: it failed)."""

    name: str
    settings: Settings
    summary: RunSummary | None
    predicted_s: float = math.nan  # its step as the model predicted before it ran (NaN: not predicted)
    error: str = ""
    knob: str = ""  # the knob whose value it tried ("": the config as given)

    @property
    def step_s(self) -> float:
        return self.summary.step_s if self.summary else math.inf


@dataclass(frozen=True)
class Candidate:
    """A value of a knob, on top of the best settings so far, and its predicted step."""

    knob: Knob
    value: str
    settings: Settings
    predicted_s: float = math.nan  # NaN: the model cannot predict it
    pruned: str = ""  # why it is not tried ("" : it is)


@dataclass
class Search:
    """Where the search stands: the trials so far and the knobs done."""

    knobs: list[Knob]
    trials: list[Trial] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # knob keys whose round ran

    @property
    def best(self) -> Trial | None:
        """The first trial unless a later one beat the best by more than MIN_GAIN."""
        best: Trial | None = None
        for t in self.trials:
            if t.summary is None:
                continue
            if best is None or t.step_s < best.step_s * (1 - MIN_GAIN):
                best = t
        return best


def _expected(s: RunSummary, bucket_bytes: float, compression: str) -> float | None:
    """The collectives' expected time per step for the run `s` with another group size or
    compression (None: no probe, a single rank, a pipeline)."""
    rf = for_run(s, bucket_bytes, compression)
    return rf.expected_s if rf else None


def exposed_share(trials: Sequence[Trial]) -> float:
    """f: the measured exposed communication over the expected, fitted over every trial that
    has a roofline (NaN: none has)."""
    xs, ys = [], []
    for t in trials:
        rf = for_run(t.summary) if t.summary else None
        if rf is not None and rf.expected_s > 0:
            xs.append(rf.expected_s)
            ys.append(rf.exposed_s)
    f, _, _ = through_origin(xs, ys)
    return max(f, 0.0) if math.isfinite(f) else math.nan


def predict(best: Trial, knob: Knob, value: str, f: float) -> float:
    """The step with knob=value on top of the best trial's settings (NaN: the model cannot say)."""
    s = best.summary
    if s is None or knob.effect == Effect.unmodelled or not math.isfinite(f):
        return math.nan
    bucket, compression = float(s.grad_bucket_bytes), s.compression
    if knob.effect == Effect.grouping:
        bucket = float(value) * MIB
    else:
        compression = value
    now = _expected(s, s.grad_bucket_bytes, s.compression)
    then = _expected(s, bucket, compression)
    if now is None or then is None:
        return math.nan
    return s.step_s + f * (then - now)


def miss(search: Search, knob: Knob) -> tuple[float, int]:
    """What the model missed on this knob's values tried so far, to add to its prediction of
    another value: the mean of measured - predicted (seconds) over those trials, and how many
    (the model does not charge a setting's own compute, such as a compression's casts). When the
    best trial is one of them, its step holds its own miss already: that is taken out."""
    tried = [
        t
        for t in search.trials
        if t.knob == knob.key and t.summary is not None and math.isfinite(t.predicted_s)
    ]
    if not tried:
        return 0.0, 0
    mean = sum(t.step_s - t.predicted_s for t in tried) / len(tried)
    best = search.best
    own = best.step_s - best.predicted_s if best is not None and any(t is best for t in tried) else 0.0
    return mean - own, len(tried)


def candidate(search: Search, knob: Knob, value: str) -> Candidate:
    """knob=value on top of the best settings so far, predicted from every trial so far (f refitted,
    the knob's own misses added), and pruned when clearly slower than the best measured step."""
    best = search.best
    if best is None:
        raise ValueError("no trial to predict from")
    f = exposed_share(search.trials)
    bias, n = miss(search, knob)
    p = predict(best, knob, value, f) + bias
    why = ""
    if math.isfinite(p) and p > best.step_s * (1 + PRUNE):
        why = (
            f"predicted {1e3 * p:.2f} ms, {100 * (p / best.step_s - 1):.0f}% slower than the best "
            f"measured {1e3 * best.step_s:.2f} ms (f={f:.2f}"
            + (f"; {1e3 * bias:+.2f} ms: what {n} other value(s) of it missed by" if n else "")
            + ")"
        )
    return Candidate(knob, value, with_setting(best.settings, knob.key, value), p, why)


def candidates(search: Search, knob: Knob) -> list[Candidate]:
    """The knob's values other than the best settings' own, each as `candidate` says."""
    best = search.best
    if best is None:
        return []
    have = dict(best.settings).get(knob.key)
    return [candidate(search, knob, override_text(v)) for v in knob.values if override_text(v) != have]


def next_knob(search: Search) -> Knob | None:
    """The knob whose best value the model expects to gain most; then those it cannot predict, in
    the order given; None when every knob had its round."""
    left = [k for k in search.knobs if k.key not in search.done]
    if not left or search.best is None:
        return None
    best_s = search.best.step_s

    def gain(k: Knob) -> float:
        ps = [c.predicted_s for c in candidates(search, k) if math.isfinite(c.predicted_s)]
        return best_s - min(ps) if ps else -math.inf

    return max(left, key=lambda k: (gain(k), -left.index(k)))


def verdict(search: Search, t: Trial) -> str:
    """A trial's line in the table: chosen, slower or within noise of the best, or failed."""
    best = search.best
    if t.summary is None:
        return f"failed: {t.error}" if t.error else "failed"
    if best is not None and t is best:
        return "best"
    if best is not None and t.step_s < best.step_s:
        return f"within {100 * MIN_GAIN:.0f}% of the best: kept the earlier settings"
    return f"{100 * (t.step_s / best.step_s - 1):.0f}% slower" if best else ""


def changed(base: Settings, settings: Settings) -> list[str]:
    """The overrides by which `settings` differ from `base`."""
    mine = dict(base)
    return [f"{k}={v}" for k, v in settings if mine.get(k) != v]
