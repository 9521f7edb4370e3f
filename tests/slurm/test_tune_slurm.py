"""hpctrain tune on the local SLURM cluster: each trial is a job of its own on 2 nodes, found
again by status, and the best settings are predicted at 4 nodes or the reason is given."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CNN, hpctrain

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def test_a_tune_runs_its_trials_as_slurm_jobs_on_two_nodes(tmp_path: Path) -> None:
    home = tmp_path / "tune"
    r = hpctrain(
        "tune", *DIGITS_CNN, "cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1",
        "parallelism.engine=ddp", "tune.keys=[parallelism.gradient_as_bucket_view]", "tune.target_ranks=4",
        f"run.dir={home}", timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads((home / "tune.json").read_text())
    assert [t["changed"] for t in m["trials"]] == [[], ["parallelism.gradient_as_bucket_view=true"]], m
    for t in m["trials"]:
        job = json.loads((home / t["name"] / "job.json").read_text())
        summary = json.loads((home / t["name"] / "summary.json").read_text())
        assert job["launcher"] == "slurm" and len({x["host"] for x in summary["per_rank"]}) == 2, summary
        # the view is not in the step model: tried, never predicted
        assert t["predicted_s"] is None and t["step_s"] == summary["step_s"]
    said = [line for line in r.stdout.splitlines() if line.startswith(("best at 4 ranks:", "no prediction"))]
    assert len(said) == 1, r.stdout
    status = hpctrain("status", str(home)).stdout
    assert len(re.findall(r"trial-[01] .*COMPLETED", status)) == 2, status
