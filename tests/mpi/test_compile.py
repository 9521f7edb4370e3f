"""train.compile: the built-in transformer compiled block by block (torch.compile, inductor's C++
backend on this machine's compiler) trains what the eager model trains, under DDP, FSDP2 and
tensor parallelism on 2 ranks. The tolerance is the suite's N ranks = 1 rank one: inductor fuses
elementwise kernels and may reorder a reduction, each a few fp32 ulps (1.2e-7 relative), and 6
SGD steps of this model keep the weights within 1.2e-7 of the eager run's (measured); 1e-5 would
catch a compiled block computing anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY_LM, assert_same_weights, run_ok

pytestmark = pytest.mark.mpi

LAYOUTS = {
    "ddp": ["parallelism.engine=ddp", "train.batch_per_rank=16"],
    "fsdp": ["parallelism=fsdp", "parallelism.engine=ddp", "train.batch_per_rank=16"],
    "tp2": ["parallelism.engine=ddp", "parallelism.tp.degree=2", "train.batch_per_rank=32"],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_compiled_transformer_trains_what_the_eager_one_trains(
    tmp_path: Path, lm_one_rank: tuple[Path, dict], layout: str
) -> None:
    run, s = run_ok(tmp_path, layout, *TINY_LM, "cluster.ranks=2", "train.compile=true", *LAYOUTS[layout])
    assert_same_weights(lm_one_rank[0], run, rtol=1e-5, atol=1e-6)
    # the compile is recorded apart from the steps, and its kernels are cached in the run directory
    assert s["compile_s"] > 0.5 and all(r["compile_s"] > 0 for r in s["per_rank"]), s["compile_s"]
    assert s["compile_s"] > 10 * s["step_p95_s"]  # in the warm-up steps, not the timed ones
    assert any((run / "cache" / "inductor").rglob("*")), "no inductor cache in the run directory"
