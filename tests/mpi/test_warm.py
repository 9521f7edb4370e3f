"""The suite's ranks do start warm (tests/warm): a regression there fails no other test, it only
costs minutes of every run, so it is asserted here: a 2-rank local run's ranks were forked by the
zygote."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import MLP, run_ok

pytestmark = pytest.mark.mpi


@pytest.mark.skipif(
    bool(os.environ.get("HPCTRAIN_TEST_COLD")), reason="HPCTRAIN_TEST_COLD=1: no zygote, asked for"
)
def test_the_ranks_of_a_local_run_are_forked_from_the_warm_zygote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also after the tests' own process has done what in-process tests do to its environment,
    which the ranks inherit: torch's inductor set its cache directory (fresh36 started every rank
    cold after the first such test), user code went on PYTHONPATH, rank.py set the flight recorder."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cache_dir()  # sets TORCHINDUCTOR_CACHE_DIR in os.environ
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    run_dir, s = run_ok(tmp_path, "warm", *MLP, "cluster.ranks=2", "train.steps=4")
    assert s["world_size"] == 2
    served = Path(f"{os.environ['HPCTRAIN_TEST_ZYGOTE']}.served").read_text().splitlines()
    assert served.count(f"-m hpctrain.rank {run_dir}") == 2, served
