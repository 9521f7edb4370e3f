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
    # fp16 first, then bf16: tried, or pruned when fp16's measured step, carried over to bf16 (the
    # same bytes, the same casts), puts it more than 10% behind the best (as on a loaded machine)
    bf16 = ["parallelism.compression=bf16"]
    tried = [
        [],
        ["parallelism.compression=fp16"],
        *([bf16] if bf16 in [t["changed"] for t in m["trials"]] else []),
    ]
    assert [t["changed"] for t in m["trials"]] == tried and m["finished"], m
    assert names == [f"trial-{k}" for k in range(len(tried))]
    if len(tried) == 2:
        (left,) = m["left_out"]
        assert left["changed"] == bf16 and left["verdict"].startswith("pruned: predicted "), left
        assert left["verdict"].endswith("ms: what 1 other value(s) of it missed by)"), left
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

    # interrupted before its last trial finished: resuming runs that one again (and whatever the
    # search goes on to), never one that finished; the unfinished one's remains are set aside
    last = names[-1]
    (home / last / "summary.json").unlink()
    r = hpctrain("tune", "--resume", str(home), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = re.findall(r"^(trial-\d+): ", r.stdout, re.M)
    assert ran[:1] == [last] and not set(ran) & set(names[:-1]), r.stdout
    assert len(list(home.glob(f"{last}.failed-*"))) == 1
    again = json.loads((home / "tune.json").read_text())
    assert again["finished"] and again["spent_s"] > m["spent_s"] > 0  # the budget counts both invocations
    assert _steps(home, names[:-1]) == {n: steps[n] for n in names[:-1]}  # read back, not run again
