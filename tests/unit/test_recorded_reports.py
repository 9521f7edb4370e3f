"""Every recorded study analyzes to the report it gave when it was recorded: the oracle for a
change of the records' shape (issue 73: per-rank and per-step parts replace the flat pipeline and
tensor-parallel fields, and old records must still read to the same report). The fixtures are
tests/fixtures/studies (local-pipeline: `hpctrain study strong study.ranks=[2,4] model=transformer
model.depth=4 data=tokens parallelism=pipeline parallelism.engine=ddp parallelism.microbatches=4
study.global_batch=16 study.steps=8 study.warmup_steps=2 study.repetitions=1
study.allreduce_bench=false`, 2026-12-07, its summaries and step records as written then); the
reports are tests/fixtures/reports/<name>.md. A deliberate change of the report rewrites them:
python -m tests.unit.test_recorded_reports, and the diff is reviewed with the change."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.analysis.analyze import analyze_dir
from hpctrain.analysis.report import markdown

FIXTURES = Path(__file__).parents[1] / "fixtures"
NAMES = ["local-strong", "local-strong-waits", "slurm-weak", "local-pipeline"]


def report(name: str) -> str:
    return markdown(analyze_dir(FIXTURES / "studies" / name), [])


@pytest.mark.parametrize("name", NAMES)
def test_a_recorded_study_analyzes_to_the_report_it_gave(name: str) -> None:
    assert report(name) == (FIXTURES / "reports" / f"{name}.md").read_text()


def test_the_pipeline_study_reports_its_bubble_transfer_and_stage_memory() -> None:
    md = report("local-pipeline")  # what the flat step and rank fields carry today, shown
    assert "| ddp | 4 | 1 | 133.0 | 0.65 | 32.6% | 8.3% |" in md  # the scaling table's row
    assert "| ddp | 4 | 0.3% | 1.7% | 48.3% | 42.9% | 2.2% | 9.3% |" in md  # where the time goes
    assert "- ddp N=4: stage 0 379 MiB, stage 1 378 MiB, stage 2 378 MiB, stage 3 382 MiB" in md


if __name__ == "__main__":
    for n in NAMES:
        (FIXTURES / "reports" / f"{n}.md").write_text(report(n))
        print(f"wrote tests/fixtures/reports/{n}.md")
