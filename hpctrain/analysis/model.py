"""The alpha-beta (Hockney) communication model and the step-time prediction built on it.

Ring allreduce of m bytes over n ranks takes T(n, m) = 2(n-1) * alpha + 2(n-1)/n * m * beta
(Hockney 1994 cost model; ring allreduce cost as in Thakur, Rabenseifner & Gropp 2005).
alpha is the per-message latency, beta the seconds per byte (1 / link bandwidth).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AlphaBeta:
    alpha_s: float  # latency per message step
    beta_s_per_byte: float  # inverse bandwidth

    def allreduce_s(self, n: int, size_bytes: float) -> float:
        if n <= 1:
            return 0.0
        return 2 * (n - 1) * self.alpha_s + 2 * (n - 1) / n * size_bytes * self.beta_s_per_byte

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")


def fit_alpha_beta(samples: Sequence[tuple[int, float, float]]) -> AlphaBeta:
    """Non-negative least squares over (n, size_bytes, seconds) samples with n > 1; relative
    residuals, so that 1 KiB and 256 MiB messages weigh alike."""
    rows = [(2 * (n - 1), 2 * (n - 1) / n * m, t) for n, m, t in samples if n > 1 and t > 0]
    if len(rows) < 2:
        raise ValueError("the alpha-beta fit needs at least two allreduce timings with n > 1")
    a = np.array([[x1 / t, x2 / t] for x1, x2, t in rows])
    b = np.ones(len(rows))
    (alpha, beta), *_ = np.linalg.lstsq(a, b, rcond=None)
    if alpha < 0 or beta < 0:  # non-negative least squares for two unknowns: refit with one at 0
        col = 1 if alpha < 0 else 0
        only = float(a[:, col] @ b / (a[:, col] @ a[:, col]))
        alpha, beta = (0.0, only) if col == 1 else (only, 0.0)
    return AlphaBeta(float(alpha), float(beta))


@dataclass(frozen=True)
class StepModel:
    """Step time = compute per sample x per-rank batch + f x allreduce time of the gradients,
    where f (the share of the allreduce not hidden behind the backward pass) is fitted."""

    ab: AlphaBeta
    compute_s_per_sample: float
    exposed_fraction: float
    gradient_bytes: float

    def step_s(self, n: int, batch_per_rank: float) -> float:
        return self.compute_s_per_sample * batch_per_rank + self.exposed_fraction * self.ab.allreduce_s(
            n, self.gradient_bytes
        )


def fit_step_model(
    ab: AlphaBeta, points: Sequence[tuple[int, float, float, float]], gradient_bytes: float
) -> StepModel:
    """points: (n, batch_per_rank, compute_s, exposed_comm_s) measured per scale."""
    per_sample = float(np.mean([c / b for _, b, c, _ in points]))
    ar = np.array([ab.allreduce_s(n, gradient_bytes) for n, _, _, _ in points])
    comm = np.array([e for _, _, _, e in points])
    f = float(comm @ ar / (ar @ ar)) if float(ar @ ar) > 0 else 0.0
    return StepModel(ab, per_sample, max(f, 0.0), gradient_bytes)
