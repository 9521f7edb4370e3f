"""A real local tune on 2 ranks: its trials are ordinary runs, the best one is chosen as the table
says from their own summaries, its settings run again through --overrides-file, and an
interrupted tune resumes running only what did not finish."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from hpctrain.analysis.tune import MIN_GAIN
from tests.conftest import DIGITS_CNN, hpctrain

pytestmark = pytest.mark.mpi

TUNE = [*DIGITS_CNN, "parallelism.engine=ddp", "tune.keys=[parallelism.compression]", "tune.target_ranks=4"]


def _steps(home: Path, names: list[str]) -> dict[str, float]:
    return {n: json.loads((home / n / "summary.json").read_text())["step_s"] for n in names}


def test_a_tune_chooses_from_its_trials_runs_its_best_settings_and_resumes(tmp_path: Path) -> None:
    home = tmp_path / "tune"
    r = hpctrain("tune", *TUNE, f"run.dir={home}", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads((home / "tune.json").read_text())
    names = [t["name"] for t in m["trials"]]
    assert names == ["trial-0", "trial-1", "trial-2"] and m["finished"], m
    assert [t["changed"] for t in m["trials"]] == [
        [], ["parallelism.compression=fp16"], ["parallelism.compression=bf16"]
    ]  # fmt: skip
    # each trial is a short run of its own settings, as --estimate's probe: 2 warm-up steps and a
    # tenth of train.steps timed, at least 20 but never more than train.steps (12)
    for t in m["trials"]:
        summary = json.loads((home / t["name"] / "summary.json").read_text())
        assert summary["compression"] == (t["changed"][0].split("=")[1] if t["changed"] else "none")
        assert summary["timed_steps"] == 12 and summary["world_size"] == 2
        assert math.isclose(t["step_s"], summary["step_s"])
    # the best: the first trial unless a later one was faster by more than MIN_GAIN than the best so far
    steps = _steps(home, names)
    best = "trial-0"
    for n in names[1:]:
        if steps[n] < steps[best] * (1 - MIN_GAIN):
            best = n
    assert m["best_trial"] == best and re.search(rf"│ {best} .*│ best +│", r.stdout), r.stdout
    assert all(t["predicted_s"] > 0 for t in m["trials"][1:]), m  # both compressions were predicted
    said = [line for line in r.stdout.splitlines() if line.startswith(("best at 4 ranks:", "no prediction"))]
    assert len(said) == 1 and ("samples/s" in said[0] or "no prediction" in said[0]), r.stdout
    # best.yaml: the command's overrides (less run. and tune.) and the best settings, taken back as is
    best_file = yaml.safe_load((home / "best.yaml").read_text())
    assert best_file == [*DIGITS_CNN, "parallelism.engine=ddp", *m["best"]]
    r = hpctrain("run", "--overrides-file", str(home / "best.yaml"), "--cfg")
    assert r.returncode == 0 and "engine: ddp" in r.stdout, r.stdout + r.stderr
    compression = m["best"][0].split("=")[1] if m["best"] else "none"
    assert f"compression: {compression}" in r.stdout, r.stdout
    status = hpctrain("status", str(home)).stdout
    assert all(re.search(rf"{n} .*COMPLETED", status) for n in names), status
    # the tune's best trial is an estimate's evidence, as a run or a study is
    est = hpctrain("run", "--overrides-file", str(home / "best.yaml"), "--estimate", "--from", str(home))
    assert (
        est.returncode == 0 and "measured at N=2" in est.stdout and "nothing was submitted" in est.stdout
    ), est.stdout + est.stderr
    shown = hpctrain("analyze", str(home))  # from tune.json: nothing runs
    assert shown.returncode == 0 and re.search(rf"│ {best} .*│ best +│", shown.stdout), shown.stdout
    assert f"best: {' '.join(m['best']) or 'the config as given'}: " in shown.stdout, shown.stdout

    # interrupted before its last trial finished: resuming runs that one only, its remains set aside
    (home / "trial-2" / "summary.json").unlink()
    r = hpctrain("tune", "--resume", str(home), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = re.findall(r"^(trial-\d+): ", r.stdout, re.M)
    assert ran == ["trial-2"] and "trial-2: parallelism.compression=bf16" in r.stdout, r.stdout
    assert len(list(home.glob("trial-2.failed-*"))) == 1
    assert json.loads((home / "tune.json").read_text())["finished"]
    assert _steps(home, names[:2]) == {n: steps[n] for n in names[:2]}  # read back, not run again
