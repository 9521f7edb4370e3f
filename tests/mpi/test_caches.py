"""Round 5, class 5: caches that lie are caught. A planted peak (`{"tflops": 1e-9}`) or FLOP count
made a run report an MFU of 164,694,825%; now an MFU above 100% from a cached figure has the figure
measured again, the cache mended, and the summary says where each figure came from and how old
the probe is. An MFU above 100% that no cache explains (a user's cluster.peak_tflops) is flagged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CNN, hpctrain

pytestmark = pytest.mark.mpi


def _run(tmp: Path, name: str, cache: Path, *extra: str) -> tuple[dict, str]:
    env = {"HPCTRAIN_CACHE": str(cache)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the CLI runs in this process; the ranks inherit its environment
    try:
        r = hpctrain("run", "--no-progress", f"run.dir={tmp / name}", *DIGITS_CNN, *extra)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((tmp / name / "summary.json").read_text()), r.stdout


def test_a_planted_peak_or_flop_count_is_measured_again_and_mended(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, "first", cache)
    assert 0 < first["mfu"] <= 1 and first["flops_source"] == "FlopCounterMode"
    [peak] = list((cache / "peak").glob("*.json"))
    [count] = list((cache / "flops").glob("*.json"))
    second, _ = _run(tmp_path, "second", cache)
    assert second["flops_source"] == "FlopCounterMode (cached)" and "cached" in second["peak_source"]
    assert second["peak_source"].endswith("min ago")  # the probe's age is in the record
    for planted in ({"tflops": 1e-9}, None):
        if planted is not None:
            peak.write_text(json.dumps(planted))
        else:
            count.write_text(json.dumps({"flops_per_sample": first["flops_per_sample"] * 1e9}))
        s, out = _run(tmp_path, f"planted-{'peak' if planted else 'count'}", cache)
        assert s["mfu"] is not None and 0 < s["mfu"] <= 1, s
        assert "cached" not in s["peak_source"] and s["flops_source"] == "FlopCounterMode"
        assert s["flops_per_sample"] == pytest.approx(first["flops_per_sample"])
        assert json.loads(peak.read_text())["tflops"] > 1e-6  # mended
        assert json.loads(count.read_text())["flops_per_sample"] == pytest.approx(first["flops_per_sample"])


def test_an_mfu_above_100_percent_no_cache_explains_is_flagged(tmp_path: Path) -> None:
    s, out = _run(tmp_path, "low-peak", tmp_path / "cache", "cluster.peak_tflops=1e-9")
    assert s["mfu"] > 1 and s["peak_source"] == "config: cluster.peak_tflops"
    assert "above 100%, so that peak is too low" in out, out
