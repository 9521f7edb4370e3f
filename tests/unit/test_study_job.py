"""A study's analysis as a job (hpctrain study --analyze-as-job): its config is one rank of the
study's cluster, a study directory's jobs include its benchmarks and analysis, and an analysis
with nothing to report fails saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain import records
from hpctrain.cli import parse
from hpctrain.commands.study import REPORT_SCRIPT
from hpctrain.commands.study_report import AnalysisFailed, main
from hpctrain.config import load_config
from hpctrain.orchestrate.started import jobs_in
from hpctrain.orchestrate.study_job import analysis_config
from hpctrain.orchestrate.validate import problems


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            [
                "cluster=slurm",
                "cluster.nodes=4",
                "cluster.ranks_per_node=4",
                "cluster.gpus_per_node=4",
                "cluster.cpus_per_rank=8",
                "cluster.partition=gpu",
                "cluster.time_min=30",
                "cluster.nodelist=[a,b,c,d]",
                "cluster.exclusive=true",
            ],
            {"nodes": 1, "ranks_per_node": 1, "gpus_per_node": 0, "cpus_per_rank": 1, "partition": "gpu",
             "time_min": 30, "nodelist": [], "exclusive": False},
        ),
        (["cluster.ranks=4", "cluster.threads_per_rank=2"], {"ranks": 1, "threads_per_rank": 1}),
    ],
)  # fmt: skip
def test_the_analysis_job_is_one_rank_of_the_studys_cluster_running_the_report_script(
    overrides: list[str], expected: dict, tmp_path: Path
) -> None:
    # a study of the user's model under DDP: the analysis job runs none of it
    cfg = load_config([*overrides, "parallelism.engine=ddp", "model=mlp", "run.name=big"])
    job = analysis_config(cfg, tmp_path, REPORT_SCRIPT)
    assert {k: getattr(job.cluster, k) for k in expected} == expected
    assert job.script.path == str(REPORT_SCRIPT) and job.script.args == [str(tmp_path)]
    assert job.run.name == "big-analysis" and job.parallelism.engine == "horovod"
    assert problems(job) == []


def _job(run_dir: Path, job_id: str) -> None:
    run_dir.mkdir(parents=True)
    records.write(run_dir / records.JOB, records.JobRef(records.FORMAT_VERSION, "local", job_id, 1))


def test_a_studys_jobs_are_its_points_then_its_benchmarks_then_its_analysis(tmp_path: Path) -> None:
    runs = [records.StudyRun(n, 1, 0, 1, [], str(tmp_path / n)) for n in ("n1-r0", "n2-r0")]
    records.write(
        tmp_path / records.STUDY, records.new(records.StudyManifest, kind="weak", launcher="local", runs=runs)
    )
    for name, job_id in [
        ("analysis", "9"),
        ("allreduce-10", "8"),
        ("allreduce-2", "7"),
        ("allreduce-2.failed-1795756688", "6"),  # an earlier attempt, kept aside
        ("n1-r0", "1"),  # n2-r0 not started
    ]:
        _job(tmp_path / name, job_id)
    (tmp_path / records.allreduce_file(2)).write_text("{}")
    assert [j.job_id for j in jobs_in(tmp_path)] == ["1", "7", "8", "9"]


def test_an_analysis_with_nothing_to_report_fails_saying_so(tmp_path: Path) -> None:
    runs = [records.StudyRun("n1-r0", 1, 0, 1, [], str(tmp_path / "n1-r0"))]
    records.write(
        tmp_path / records.STUDY, records.new(records.StudyManifest, kind="weak", launcher="local", runs=runs)
    )
    with pytest.raises(AnalysisFailed, match=r"no finished run in .* \(missing: 1\)"):
        main([str(tmp_path)])
    with pytest.raises(AnalysisFailed, match="usage: study_report.py STUDY_DIR"):
        main([])


def test_a_study_that_does_not_wait_is_one_analyzed_as_a_job() -> None:
    assert parse(["study", "weak", "--no-wait"]).analyze_as_job
    assert not parse(["study", "weak"]).analyze_as_job
