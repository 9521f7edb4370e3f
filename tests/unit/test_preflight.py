"""Pre-flight verdicts by hand (analysis/preflight.py) and the rules of cluster.preflight."""

from __future__ import annotations

import os

import pytest

from hpctrain.analysis.preflight import Probe, judge
from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.orchestrate.validate import validate


def _ring(tflops: dict[str, float], gbps: dict[str, float]) -> list[Probe]:
    """One rank per node, in order; each rank's link goes to the next node."""
    hosts = list(tflops)
    return [Probe(i, h, tflops[h], hosts[(i + 1) % len(hosts)], 1e-5, gbps[h]) for i, h in enumerate(hosts)]


def test_a_node_below_half_the_median_is_bad_and_the_verdict_shows_the_figures() -> None:
    # compute 1.0, 0.9, 0.2, 1.1: median 0.95, held to 0.475 (tolerance 0.5): n3 alone is bad
    v = judge(
        _ring({"n1": 1.0, "n2": 0.9, "n3": 0.2, "n4": 1.1}, {h: 10.0 for h in "n1 n2 n3 n4".split()}), 0.5
    )
    assert [x.host for x in v if x.bad] == ["n3"]
    bad = v[2]
    assert bad.tflops == 0.2 and bad.tflops_reference == pytest.approx(0.475)
    assert bad.why == "compute 0.2 TFLOP/s < 0.475 (0.50 x the median, tolerance 0.5)"
    assert bad.line() == (
        "n3: 0.2 TFLOP/s (held to 0.475), link 10.00 GB/s (held to 5.00): BAD: "
        "compute 0.2 TFLOP/s < 0.475 (0.50 x the median, tolerance 0.5)"
    )
    # a reference above the job's own median condemns every node below it
    held = judge(_ring({"n1": 1.0, "n2": 0.9}, {"n1": 10.0, "n2": 10.0}), 0.5, min_tflops=0.95)
    assert [x.bad for x in held] == [False, True] and "(min_tflops, tolerance 0.5)" in held[1].why


def test_a_node_whose_every_link_is_slow_is_bad_a_slow_link_at_one_end_names_neither() -> None:
    # 4 nodes in a ring: n2's links n1->n2 and n2->n3 run at 1 GB/s, the others at 10
    probes = _ring({h: 1.0 for h in ("n1", "n2", "n3", "n4")}, {"n1": 1.0, "n2": 1.0, "n3": 10.0, "n4": 10.0})
    v = {x.host: x for x in judge(probes, 0.5)}
    assert [h for h, x in v.items() if x.bad] == ["n2"]
    assert v["n2"].why == "every link 1.00 GB/s or less < 2.75 (0.50 x the median, tolerance 0.5)"
    assert v["n1"].link_gbps == 1.0 and not v["n1"].bad  # its link to n4 is fast
    # links within a node are not the network: two ranks on n1 judge nothing by their link
    same = [Probe(0, "n1", 1.0, "n1", 1e-6, 0.1), Probe(1, "n1", 1.0, "n1", 1e-6, 0.1)]
    assert not judge(same, 0.5)[0].bad and judge(same, 0.5)[0].link_gbps == 0.0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.preflight.tolerance=1.5", "cluster.preflight.tolerance"),
        ("cluster.preflight.min_tflops=-1", "cluster.preflight.min_tflops"),
        ("cluster.preflight.max_resubmits=-1", "cluster.preflight.max_resubmits"),
        ("debug.slow_node='n1;rm'", "debug.slow_node"),
    ],
)
def test_bad_preflight_settings_are_refused_by_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(load_config([override]))


def test_an_excluded_node_reaches_sbatch_quoted_and_checked(tmp_path) -> None:
    from hpctrain.launch.slurm.plan import plan_slurm

    plan = plan_slurm(load_config(["cluster=slurm", "cluster.exclude=[n2,n3]"]), str(tmp_path), "python")
    assert "#SBATCH --exclude=n2,n3" in plan.sbatch_script()
    with pytest.raises(ConfigError, match=r"cluster\.exclude\[0\]"):
        validate(load_config(["cluster=slurm", "cluster.exclude=['n2 --uid=0']"]))


def test_preflight_records_list_every_check_and_every_node_judged_bad(tmp_path) -> None:
    import json

    from hpctrain.records.preflight import bad_hosts, checks, excluded, verdicts_text

    lines = [
        {"verdicts": [{"host": "n1", "bad": False}, {"host": "n2", "bad": True, "why": "compute 0.1 < 0.3"}]},
        {"verdicts": [{"host": "n1", "bad": False}, {"host": "n3", "bad": False}]},
    ]
    (tmp_path / "preflight.json").write_text(
        "".join(json.dumps(x) + "\n" for x in lines) + '{"verdicts": [{"ho'
    )
    found = checks(tmp_path)
    assert [bad_hosts(c) for c in found] == [["n2"], []] and excluded(tmp_path) == ["n2"]
    assert verdicts_text(found[0]) == "n1 good; n2 BAD (compute 0.1 < 0.3)"
    assert checks(tmp_path / "nowhere") == []


def test_an_earlier_study_is_a_reference_that_catches_a_job_whose_nodes_are_all_slow(tmp_path) -> None:
    import json

    from hpctrain.analysis.preflight import reference_of
    from hpctrain.records.preflight import reference_checks

    # a study of two runs whose checks found nodes at 1.0, 1.2 and 0.8 TFLOP/s (and one bad node,
    # which is no reference) with links at 10 and 12 GB/s
    for run, verdicts in {
        "r1": [{"host": "n1", "bad": False, "tflops": 1.0, "link_gbps": 10.0},
               {"host": "n2", "bad": True, "tflops": 0.1, "link_gbps": 10.0}],
        "r2": [{"host": "n3", "bad": False, "tflops": 1.2, "link_gbps": 12.0},
               {"host": "n4", "bad": False, "tflops": 0.8, "link_gbps": 0.0}],
    }.items():  # fmt: skip
        (tmp_path / run).mkdir()
        (tmp_path / run / "preflight.json").write_text(
            json.dumps({"precision": "fp32", "verdicts": verdicts})
        )
    ref = reference_of(reference_checks(tmp_path), "study-A")
    assert ref is not None and (ref.tflops, ref.link_gbps) == (1.0, 11.0)
    # both of this job's nodes are at 0.4: equal to their own median, but below 0.5 x 1.0
    v = judge(_ring({"n5": 0.4, "n6": 0.4}, {"n5": 10.0, "n6": 10.0}), 0.5, reference=ref)
    assert [x.bad for x in v] == [True, True] and judge(
        _ring({"n5": 0.4, "n6": 0.4}, {"n5": 10.0, "n6": 10.0}), 0.5
    )[0].bad is False
    assert v[0].why == "compute 0.4 TFLOP/s < 0.5 (0.50 x 1 in study-A, tolerance 0.5)"
    # the rules: the reference must hold a check at this run's precision, and the check must be on
    on = ["cluster.preflight.enabled=true", f"cluster.preflight.reference={tmp_path}"]
    validate(load_config(on))
    for overrides, rule in (
        (on[1:], "only acts with cluster.preflight.enabled=true"),
        ([*on, "precision=bf16"], "was checked at precision fp32, this run computes in bf16"),
        ([on[0], f"cluster.preflight.reference={tmp_path / 'r9'}"], "holds no pre-flight check"),
    ):
        with pytest.raises(ConfigError, match=r"cluster\.preflight\.reference") as e:
            validate(load_config(overrides))
        assert rule in str(e.value)


def test_a_failed_check_submits_the_run_again_without_its_bad_nodes(tmp_path, monkeypatch) -> None:
    """From the batch script's teardown, whether an `hpctrain run` waits or not (--no-wait)."""
    import dataclasses
    import json

    from hpctrain import records
    from hpctrain.launch.base import Job
    from hpctrain.launch.slurm import exclude
    from hpctrain.launch.slurm.launcher import SlurmLauncher

    asked: list[list[str]] = []

    def resubmit(self, spec, hosts):  # what sbatch would be asked: tested in test_an_excluded_node...
        asked.append(hosts)
        return spec, Job(spec.run_dir, records.JobRef(1, "slurm", "78", 2))

    monkeypatch.setattr(SlurmLauncher, "resubmit_excluding", resubmit)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    cfg = load_config(["cluster=slurm", "cluster.nodes=2", "cluster.preflight.enabled=true"])
    error = records.ErrorRecord(0, "n1", "PreflightFailed", "pre-flight check: node(s) n2 bad", "", 1.0)
    records.write_json(tmp_path / "error-rank0.json", dataclasses.asdict(error))
    bad = {"verdicts": [{"host": "n1", "bad": False}, {"host": "n2", "bad": True, "why": "compute"}]}
    (tmp_path / "preflight.json").write_text(json.dumps(bad) + "\n")
    assert exclude.resubmitted_without_bad_nodes(cfg, tmp_path) and asked == [["n2"]]
    assert "SLURM_JOB_ID" not in os.environ  # the new job's script does not inherit the old job's
    assert os.environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"  # but finds the same cluster
    # past cluster.preflight.max_resubmits (2): three checks found bad nodes, the run ends
    (tmp_path / "preflight.json").write_text(3 * (json.dumps(bad) + "\n"))
    assert not exclude.resubmitted_without_bad_nodes(cfg, tmp_path) and asked == [["n2"]]
    # another failure is not the check's to handle
    other = dataclasses.replace(error, type="ValueError")
    records.write_json(tmp_path / "error-rank0.json", dataclasses.asdict(other))
    (tmp_path / "preflight.json").write_text(json.dumps(bad) + "\n")
    assert not exclude.resubmitted_without_bad_nodes(cfg, tmp_path) and asked == [["n2"]]
