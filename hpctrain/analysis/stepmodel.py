"""The step-time model: step = compute + f x communication + wait for the slowest rank + data
wait (+ pipeline bubble).

Compute is measured per scale (in-sample). Elsewhere (leave-one-out, predictions) it is
c0 + c1 x batch per rank, fitted over the measured scales with the same threads per rank: a fixed
cost per step (the optimizer update, kernel launches) plus a cost per sample; with one batch size
among them, compute per sample carries over from the nearest scale. Threads matter because locally
the threads per rank change with the scale, and compute per sample with them. Data wait and bubble
carry over per sample from the nearest scale. Communication comes from the engine's fitted allreduce (model.CommModel) for the
run's gradient bytes and message count; f, the share of it the backward pass does not hide, is
fitted by least squares over every repetition at the multi-rank scales (so one such scale with
three repetitions still gives f a standard error) and must lie in [0, 1]. The wait for the
slowest rank (load imbalance, measured step by step on the ranks) is not communication: it is
taken out of the exposed time before f is fitted, and grows with N as the expected largest of N
ranks' busy times (jitter relative to the busy time, from the nearest measured multi-rank scale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from hpctrain.analysis.metrics import t975, through_origin
from hpctrain.analysis.model import CommModel

# A fitted share may miss [0, 1] by at most this much (less when its uncertainty is smaller): a
# share of 3 +- 2 fits nothing physical however wide its interval.
SLACK = 0.10


@dataclass(frozen=True)
class Scale:
    """What a study measured at one world size (means over repetitions), in seconds per step."""

    n: int
    batch_per_rank: float
    threads: int  # torch threads per rank (0: not recorded)
    compute_s: float
    comm_s: float  # exposed communication, less the wait for the slowest rank when that is known
    other_s: float  # data wait and whatever else the step spent outside compute and communication
    bubble_s: float
    step_s: float
    comm_reps: tuple[float, ...] = ()  # comm_s of each repetition (empty: the mean only)
    wait_s: float = 0.0  # waiting in the collective for the slowest rank (0: none or not measured)

    @property
    def comm_samples(self) -> tuple[float, ...]:
        return self.comm_reps or (self.comm_s,)


@dataclass(frozen=True)
class Estimate:
    n: int
    batch_per_rank: float
    compute_s: float
    comm_s: float
    other_s: float
    bubble_s: float
    source: Scale | None  # where compute, data wait and bubble came from
    wait_s: float = 0.0

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s + self.other_s + self.bubble_s + self.wait_s


@dataclass(frozen=True)
class Check:
    """One measured scale against the model: fitted with it (in-sample) and without it."""

    scale: Scale
    in_sample: Estimate
    held_out: Estimate | None  # None: the other scales cannot fit the model
    term: str = ""  # the term that carries most of the leave-one-out error
    why: str = ""

    @property
    def in_sample_err(self) -> float:
        return self.in_sample.step_s / self.scale.step_s - 1

    @property
    def loo_err(self) -> float:
        return self.held_out.step_s / self.scale.step_s - 1 if self.held_out else math.nan


@dataclass(frozen=True)
class StepModel:
    comm: CommModel
    grad_bytes: float
    messages: int  # collectives per step (fusion buffers, buckets)
    exposed: float  # f, within [0, 1]
    exposed_se: float  # NaN: fitted from one run
    exposed_raw: float  # the least-squares value before it was held to [0, 1]
    scales: tuple[Scale, ...]
    problems: tuple[str, ...] = ()  # why the model does not describe the measurements
    checks: list[Check] = field(default_factory=list)

    @property
    def described(self) -> bool:
        return not self.problems

    def expected_comm_s(self, n: int) -> float:
        return self.comm.allreduce_s(n, self.grad_bytes, self.messages)

    def estimate(self, n: int, batch_per_rank: float, threads: int, scales: Sequence[Scale] = ()) -> Estimate:
        pool = scales or self.scales
        src = nearest(pool, n, threads)
        per = batch_per_rank / src.batch_per_rank  # data wait and bubble scale with the samples
        line = compute_line([s for s in pool if s.threads == src.threads])
        compute = line[0] + line[1] * batch_per_rank if line else src.compute_s * per
        return Estimate(
            n,
            batch_per_rank,
            compute,
            self.exposed * self.expected_comm_s(n),
            src.other_s * per,
            src.bubble_s * per,
            src,
            wait_at(pool, n, threads, compute + src.other_s * per),
        )

    @property
    def loo_band(self) -> float:
        """The largest leave-one-out error (relative): how far a prediction may be off."""
        errs = [abs(c.loo_err) for c in self.checks if math.isfinite(c.loo_err)]
        return max(errs) if errs else math.nan


def nearest(scales: Sequence[Scale], n: int, threads: int) -> Scale:
    """The measured scale closest to n in log2, among those with the same threads per rank if any."""
    same = [s for s in scales if s.threads == threads and threads]
    return min(same or scales, key=lambda s: (abs(math.log2(s.n / n)), -s.n))


def spread(n: int) -> float:
    """E[max of n standard normals] (Blom 1958: the quantile (n - 0.375) / (n + 0.25)); 0 for one."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def wait_at(scales: Sequence[Scale], n: int, threads: int, busy_s: float) -> float:
    """The wait for the slowest of n ranks whose busy time per step is busy_s: the relative jitter
    of the nearest multi-rank scale that measured a wait, times the expected largest of n."""
    measured = [s for s in scales if s.n > 1 and s.wait_s > 0]
    if n <= 1 or not measured:
        return 0.0
    src = nearest(measured, n, threads)
    jitter = src.wait_s / (spread(src.n) * (src.compute_s + src.other_s))
    return jitter * spread(n) * busy_s


def compute_line(scales: Sequence[Scale]) -> tuple[float, float] | None:
    """(c0, c1) of compute = c0 + c1 x batch by least squares; None with fewer than two batch
    sizes, or when the line is unphysical (a negative cost)."""
    xs = [s.batch_per_rank for s in scales]
    if len(set(xs)) < 2:
        return None
    ys = [s.compute_s for s in scales]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    c1 = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    c0 = my - c1 * mx
    return (c0, c1) if c0 >= 0 and c1 > 0 else None


def fit_exposed(
    comm: CommModel, grad_bytes: float, messages: int, scales: Sequence[Scale]
) -> tuple[float, float, int]:
    """f = sum(e c) / sum(c^2) over every repetition at the multi-rank scales (e: its measured
    exposed time, c: the expected allreduce time at its scale), the standard error of that
    regression through the origin, and its degrees of freedom; NaN without a multi-rank run."""
    pairs = [
        (e, c)
        for s in scales
        if s.n > 1 and (c := comm.allreduce_s(s.n, grad_bytes, messages)) > 0
        for e in s.comm_samples
    ]
    return through_origin([c for _, c in pairs], [e for e, _ in pairs])


def _range_problem(f: float, se: float, dof: int) -> str:
    slack = min(t975(dof) * se, SLACK) if math.isfinite(se) else SLACK
    if f - slack > 1:
        return (
            f"the exposed communication is {f:.2f}x the allreduce the benchmark predicts for these "
            "gradients (a share above 1): inside training the collective runs slower than alone, or "
            "waits for the slowest rank (cores shared with compute, stragglers), which the allreduce "
            "benchmark cannot see"
        )
    if f + slack < 0:
        return f"the fitted exposed share is negative ({f:.2f})"
    return ""


def fit_step_model(comm: CommModel, grad_bytes: float, messages: int, scales: Sequence[Scale]) -> StepModel:
    f, se, dof = fit_exposed(comm, grad_bytes, messages, scales)
    problems = list(comm.problems())
    if math.isfinite(f) and (why := _range_problem(f, se, dof)):
        problems.append(why)
    held = min(max(f, 0.0), 1.0) if math.isfinite(f) else 0.0
    model = StepModel(comm, grad_bytes, messages, held, se, f, tuple(scales), tuple(problems))
    model.checks.extend(_check(model, s) for s in scales)
    return model


def _check(model: StepModel, s: Scale) -> Check:
    inside = replace(
        model.estimate(s.n, s.batch_per_rank, s.threads, [s]),
        compute_s=s.compute_s,
        other_s=s.other_s,
        bubble_s=s.bubble_s,
        wait_s=s.wait_s,
    )
    others = [o for o in model.scales if o is not s]
    if not others:
        return Check(s, inside, None)
    f, *_ = fit_exposed(model.comm, model.grad_bytes, model.messages, others)
    if s.n > 1 and not math.isfinite(f):
        return Check(s, inside, None, "communication", "no other multi-rank scale to fit the overlap")
    sub = replace(model, exposed=min(max(f, 0.0), 1.0) if math.isfinite(f) else 0.0)
    est = sub.estimate(s.n, s.batch_per_rank, s.threads, others)
    term, why = _blame(s, est)
    return Check(s, inside, est, term, why)


def _blame(s: Scale, est: Estimate) -> tuple[str, str]:
    """The term whose estimate is furthest from its measurement, and why it can be off."""
    diffs = {
        "compute": est.compute_s - s.compute_s,
        "communication": est.comm_s - s.comm_s,
        "data wait": est.other_s - s.other_s,
        "bubble": est.bubble_s - s.bubble_s,
        "load imbalance": est.wait_s - s.wait_s,
    }
    term = max(diffs, key=lambda k: abs(diffs[k]))
    src = est.source
    if src is None:
        return term, ""
    if term == "compute":
        per = (1e3 * s.compute_s / s.batch_per_rank, 1e3 * est.compute_s / s.batch_per_rank)
        if src.threads != s.threads and s.threads and src.threads:
            return term, (
                f"compute per sample taken from N={src.n} with {src.threads} thread(s) per rank; N={s.n} "
                f"ran {s.threads} ({per[0]:.3g} vs {per[1]:.3g} ms per sample)"
            )
        return (
            term,
            f"compute per sample at N={s.n} is {per[0]:.3g} ms; from the other scales' compute "
            f"(fixed + per sample, nearest N={src.n}) {per[1]:.3g} ms",
        )
    if term == "load imbalance":
        return term, (
            f"waiting for the slowest rank: {1e3 * s.wait_s:.2f} ms measured at N={s.n}, "
            f"{1e3 * est.wait_s:.2f} ms from the other scales' jitter grown to N ranks"
        )
    if term == "communication":
        return term, (
            f"exposed communication {1e3 * s.comm_s:.2f} ms measured, {1e3 * est.comm_s:.2f} ms predicted "
            "from the other scales' overlap"
        )
    return term, (
        f"{term} {1e3 * getattr(s, 'other_s' if term == 'data wait' else 'bubble_s'):.2f} ms at N={s.n}, "
        f"{1e3 * (est.other_s if term == 'data wait' else est.bubble_s):.2f} ms carried over from N={src.n}"
    )
