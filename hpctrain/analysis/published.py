"""The step model against published multi-scale training results: fit on the smaller scales,
predict the larger ones, the error per scale, and what the model does not have where it misses.

A published result gives throughput per scale, not the parts of a step, so the check takes from it
what a study would measure: the step at each scale (batch per GPU x GPUs / throughput), compute as
the one-GPU step (weak scaling: each GPU's work is the same at every scale), and the rest as
exposed communication. The collective's alpha and beta (Hockney's model, analysis/model.py) are
fitted by least squares on the fitted scales' exposed time, as `hpctrain study` fits them on its
allreduce benchmark; the step model (analysis/stepmodel.py) then predicts every scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hpctrain.analysis.model import CommModel
from hpctrain.analysis.stepmodel import Scale, fit_step_model

MISS = 0.25  # a prediction further off than this misses, and the fixture says why


@dataclass(frozen=True)
class Published:
    """Images per second at several GPU counts, as a source reports them."""

    name: str
    source: str  # paper or report, table, page
    model: str
    parameters: float  # the model's parameters (its gradients' fp32 bytes are 4x)
    batch_per_gpu: int
    images_per_s: dict[int, float]  # GPUs -> throughput
    fit_upto: int  # the largest scale the model is fitted on
    misses: str  # what the model lacks where it misses (the source's own explanation)


# E. Bugliarello, "Distributed TensorFlow: a performance evaluation", CSCS summer internship report,
# September 2017, section 5.3 (InceptionV3, 64 images per GPU, synthetic data, TensorFlow 1.1,
# tf_cnn_benchmarks; the best of several parameter-server counts per scale)
_REPORT = "Bugliarello 2017, Distributed TensorFlow: a performance evaluation (CSCS)"
INCEPTION_V3_PARAMETERS = 23.8e6  # Szegedy et al. 2016; only scales beta: predictions do not depend on it
PUBLISHED = (
    Published(
        "Piz Daint (1 P100 per node, Aries)",
        f"{_REPORT}, sec. 5.3.3, table 'Parameters achieving peak performance on Piz Daint'",
        "InceptionV3",
        INCEPTION_V3_PARAMETERS,
        64,
        {1: 138.23, 2: 264.57, 4: 523.38, 8: 1018.18, 16: 2001.00, 32: 3840.35, 64: 7118.31, 128: 9219.70},
        16,
        "parameter servers: 116 of them at 128 nodes, whose traffic the report finds reaches the "
        "inter-node network's capacity; an all-reduce ring's alpha-beta terms have no shared "
        "capacity, so the step that grows with contention is predicted too short",
    ),
    Published(
        "AWS p2.xlarge (1 K80 per node)",
        f"{_REPORT}, sec. 5.3.4, table 'Parameters achieving peak performance on p2.xlarge systems'",
        "InceptionV3",
        INCEPTION_V3_PARAMETERS,
        64,
        {1: 30.55, 2: 57.45, 4: 114.57, 8: 228.41, 16: 431.64, 32: 825.64, 64: 996.32, 128: 1077.59},
        16,
        "one parameter server per node sending and receiving over a network slower than Piz "
        "Daint's: beyond 32 nodes its capacity is the bound (the report), which the model lacks",
    ),
    Published(
        "AWS p2.8xlarge (8 K80 per node)",
        f"{_REPORT}, sec. 5.3.5, table 'Parameters achieving peak performance on p2.8xlarge systems'",
        "InceptionV3",
        INCEPTION_V3_PARAMETERS,
        64,
        {1: 30.55, 2: 58.38, 4: 116.34, 8: 230.75, 16: 448.57, 32: 863.72, 64: 1731.31, 128: 3333.20},
        16,
        "the eight GPUs of a node aggregate before the network, so 128 GPUs send what 16 nodes do: "
        "the model, which counts ranks, charges the ring for 128",
    ),
)


@dataclass(frozen=True)
class ScaleCheck:
    gpus: int
    measured_s: float  # the step the source's throughput gives
    predicted_s: float
    fitted: bool  # the scale was among those the model was fitted on

    @property
    def error(self) -> float:
        """Of the predicted throughput against the published one (the step's inverse)."""
        return self.measured_s / self.predicted_s - 1


def steps_of(p: Published) -> dict[int, float]:
    return {n: p.batch_per_gpu * n / v for n, v in sorted(p.images_per_s.items())}


def fit_comm(p: Published, steps: dict[int, float]) -> CommModel:
    """alpha and beta by least squares on the fitted scales' exposed time: 2(N-1) alpha +
    2(N-1)/N m beta (one message of m gradient bytes; Thakur et al. 2005's ring)."""
    m = 4 * p.parameters
    fit = [n for n in steps if 1 < n <= p.fit_upto]
    x = np.array([[2 * (n - 1), 2 * (n - 1) / n * m] for n in fit])
    y = np.array([steps[n] - steps[1] for n in fit])
    (alpha, beta), *_ = np.linalg.lstsq(x, y, rcond=None)
    return CommModel(float(alpha), float(beta))


def check(p: Published) -> list[ScaleCheck]:
    """Every scale predicted by the step model fitted on the scales up to p.fit_upto."""
    steps = steps_of(p)
    if 1 not in steps or not any(1 < n <= p.fit_upto for n in steps):
        raise ValueError(f"{p.name}: needs the one-GPU step and a multi-GPU scale to fit on")
    comm = fit_comm(p, steps)
    compute = steps[1]
    scales = [
        Scale(n, p.batch_per_gpu, 0, compute, s - compute, 0.0, 0.0, s)
        for n, s in steps.items()
        if n <= p.fit_upto
    ]
    model = fit_step_model(comm, 4 * p.parameters, 1, scales)
    return [
        ScaleCheck(n, s, model.estimate(n, p.batch_per_gpu, 0).step_s, n <= p.fit_upto)
        for n, s in steps.items()
    ]


def worst_beyond(checks: list[ScaleCheck]) -> float:
    """The largest error among the predicted (not fitted) scales; NaN when there is none."""
    errs = [abs(c.error) for c in checks if not c.fitted]
    return max(errs) if errs else math.nan
