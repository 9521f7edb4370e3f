"""The communication model: the alpha-beta (Hockney) cost of a ring allreduce plus the engine's own
coordination latency, fitted with standard errors from the allreduce benchmark.

Ring allreduce of m bytes over n ranks: T(n, m) = 2(n-1) alpha + 2(n-1)/n m beta (Hockney 1994 cost
model; ring allreduce as in Thakur, Rabenseifner & Gropp 2005). An engine adds a fixed cost per
collective it coordinates (Horovod: the cycle and the negotiation of which tensors are ready),
so T_engine = L + T(n, m), with alpha the wire's latency measured by plain MPI in the same processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpctrain.records import AllreduceRow

if TYPE_CHECKING:  # numpy is imported where a fit needs it: every CLI command imports this module
    import numpy as np

NAN = float("nan")


@dataclass(frozen=True)
class CommModel:
    alpha_s: float  # latency per ring step (the wire)
    beta_s_per_byte: float  # inverse bandwidth
    latency_s: float = 0.0  # the engine's coordination cost per collective
    alpha_se: float = NAN  # standard errors (NaN: no spare degree of freedom)
    beta_se: float = NAN
    latency_se: float = NAN

    def latency_part(self, n: int, messages: int = 1) -> float:
        return 0.0 if n <= 1 else messages * (self.latency_s + 2 * (n - 1) * self.alpha_s)

    def bandwidth_part(self, n: int, size_bytes: float) -> float:
        return 0.0 if n <= 1 else 2 * (n - 1) / n * size_bytes * self.beta_s_per_byte

    def allreduce_s(self, n: int, size_bytes: float, messages: int = 1) -> float:
        """`size_bytes` reduced as `messages` collectives (fusion buffers, DDP buckets)."""
        return self.latency_part(n, messages) + self.bandwidth_part(n, size_bytes)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")

    def problems(self) -> list[str]:
        """Parameters outside their physical range (beyond their uncertainty): the fit does not
        describe the benchmark, so it must not be used."""
        out = []
        for name, value, se in (
            ("latency α", self.alpha_s, self.alpha_se),
            ("inverse bandwidth β", self.beta_s_per_byte, self.beta_se),
            ("engine latency L", self.latency_s, self.latency_se),
        ):
            if value < 0:
                out.append(f"the fitted {name} is negative ({value:.3g} ± {se:.2g})")
        return out


def _wls(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of y ~ x @ coef with residuals relative to the measured time t (1 KiB and
    256 MiB messages weigh alike); the coefficients and their standard errors."""
    import numpy as np

    a = x / t[:, None]
    b = y / t
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    dof = len(t) - x.shape[1]
    if dof <= 0:
        return coef, np.full(x.shape[1], NAN)
    resid = b - a @ coef
    cov = float(resid @ resid) / dof * np.linalg.pinv(a.T @ a)
    return coef, np.sqrt(np.clip(np.diag(cov), 0, None))


def _settle(x: np.ndarray, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fit; a coefficient negative within two standard errors of zero, or adding less than 5% (timing noise) to
    every timing, is consistent with zero: fixed at 0 and the others refitted. A clearly negative
    one is kept, to be reported."""
    import numpy as np

    coef, se = _wls(x, y, t)
    for j in np.argsort(coef):
        negligible = bool(np.all(np.abs(coef[j] * x[:, j]) < 0.05 * t))
        if coef[j] < 0 and (negligible or not coef[j] < -2 * se[j]) and x.shape[1] > 1:
            keep = [k for k in range(x.shape[1]) if k != j]
            sub, sub_se = _wls(x[:, keep], y, t)
            coef, se = np.zeros(x.shape[1]), np.full(x.shape[1], NAN)
            coef[keep], se[keep] = sub, sub_se
            se[j] = 0.0
            break
    return coef, se


def fit_alpha_beta(samples: Sequence[tuple[int, float, float]]) -> CommModel:
    """alpha and beta from (n, size_bytes, seconds) samples with n > 1."""
    rows = [(2 * (n - 1), 2 * (n - 1) / n * m, t) for n, m, t in samples if n > 1 and t > 0]
    if len(rows) < 2:
        raise ValueError("the alpha-beta fit needs at least two allreduce timings with n > 1")
    import numpy as np

    arr = np.array(rows, dtype=float)
    (alpha, beta), (a_se, b_se) = _settle(arr[:, :2], arr[:, 2], arr[:, 2])
    return CommModel(float(alpha), float(beta), 0.0, float(a_se), float(b_se), 0.0)


def _column(rows: Sequence[AllreduceRow], column: str) -> list[tuple[int, float, float]]:
    # older benchmark records have no torch.distributed timing (NaN)
    timed = [(r.n, float(r.bytes), float(getattr(r, column, NAN))) for r in rows]
    return [(n, b, t) for n, b, t in timed if n > 1 and math.isfinite(t) and t > 0]


def fit_comm_model(rows: Sequence[AllreduceRow], column: str, wire: str = "mpi_s") -> CommModel | None:
    """The engine's allreduce (benchmark column `column`) as L + alpha-beta, with alpha from the
    plain MPI timings (`wire`) of the same processes; None with fewer than two timings. Without
    wire timings, alpha and L cannot be told apart (both are constant at one world size): L = 0."""
    engine = _column(rows, column)
    if len(engine) < 2:
        return None
    wire_rows = _column(rows, wire) if column != wire else []
    if len(wire_rows) < 2:
        return fit_alpha_beta(engine)
    w = fit_alpha_beta(wire_rows)
    import numpy as np

    arr = np.array(engine, dtype=float)
    n, m, t = arr[:, 0], arr[:, 1], arr[:, 2]
    # t - 2(n-1) alpha = L + 2(n-1)/n m beta
    x = np.column_stack([np.ones(len(t)), 2 * (n - 1) / n * m])
    (lat, beta), (l_se, b_se) = _settle(x, t - 2 * (n - 1) * w.alpha_s, t)
    return CommModel(w.alpha_s, float(beta), float(lat), w.alpha_se, float(b_se), float(l_se))


def from_probe(n: int, size_bytes: float, small_s: float, full_s: float) -> CommModel | None:
    """A run's own two-point curve: an allreduce of one value (all latency) and one of the
    gradients' size (latency + bandwidth), timed with the run's engine at its world size."""
    if n <= 1 or small_s <= 0 or full_s <= 0 or size_bytes <= 0:
        return None
    beta = max(full_s - small_s, 0.0) / (2 * (n - 1) / n * size_bytes)
    return CommModel(0.0, beta, small_s)
