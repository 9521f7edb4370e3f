"""A summary's parts (records/parts.py): what each dimension of a layout adds, nested under its
key; summaries written before parts existed read as if they had them (the one migration); a
corrupt part is named; tracking sends each part's figures under its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain import records
from hpctrain.parallel.pipeline.figures import PipelineFigures
from hpctrain.parallel.sharded.figures import ShardFigures
from hpctrain.parallel.tensor.figures import TensorFigures
from hpctrain.records.parts import part

FIXTURE = Path(__file__).parents[1] / "fixtures" / "runs" / "digits-2ranks" / "summary.json"


def _old(**flat: object) -> dict:
    """The fixture's summary (written before parts existed, flat keys) with these flat values."""
    return {**json.loads(FIXTURE.read_text()), **flat}


def test_an_older_data_parallel_summary_has_no_parts() -> None:
    s = records.from_dict(records.RunSummary, _old())
    assert s.parts == {} and part(s, PipelineFigures) == PipelineFigures()
    assert part(s, TensorFigures).degree == 1 and part(s, ShardFigures).degree == 0


def test_an_older_3d_summary_reads_into_its_parts() -> None:
    s = records.from_dict(
        records.RunSummary,
        _old(stages=2, microbatches=4, schedule="1f1b", bubble_s=0.01, pipe_s=0.04, shard_degree=2)
        | {"tp_degree": 2, "tp_messages": 12, "tp_bytes": 2048.0},
    )
    assert sorted(s.parts) == ["pipeline", "shards", "tensor"]
    pipe = part(s, PipelineFigures)
    assert (pipe.stages, pipe.microbatches, pipe.schedule, pipe.bubble_of_schedule) == (2, 4, "1f1b", 0.25)
    assert part(s, TensorFigures) == TensorFigures(degree=2, messages=12, bytes=2048.0)
    assert part(s, ShardFigures) == ShardFigures(degree=2)
    again = records.from_dict(records.RunSummary, records.to_dict(s))  # written back: nested, the same
    assert "stages" not in records.to_dict(s) and again == s


@pytest.mark.parametrize(
    ("summary", "said"),
    [
        ({"parts": {"pipeline": {"stages": "two"}}}, "parts.pipeline.stages: expected an integer"),
        ({"parts": {"pipeline": {"stages": 2, "bogus": 1}}}, "parts.pipeline: unknown key(s) bogus"),
        ({"parts": ["pipeline"]}, "parts: expected a mapping, found list"),
        ({"parts": {"elsewhere": 3}}, "parts.elsewhere: expected a mapping, found int"),
        ({"stages": "two"}, "parts.pipeline.stages: expected an integer"),  # an older record, corrupt
    ],
)
def test_a_corrupt_part_is_named(tmp_path: Path, summary: dict, said: str) -> None:
    data = _old() | summary
    if "parts" in summary:
        for k in PipelineFigures.FLAT.keys() | TensorFigures.FLAT.keys() | ShardFigures.FLAT.keys():
            data.pop(k, None)
    (tmp_path / "summary.json").write_text(json.dumps(data))
    with pytest.raises(records.RecordError, match=said.replace("(", r"\(").replace(")", r"\)")):
        records.read(tmp_path / "summary.json", records.RunSummary)


def test_a_part_nobody_registered_is_kept_as_read_and_tracked(tmp_path: Path) -> None:
    from hpctrain.tracking.source import summary_metrics

    data = _old()
    for k in PipelineFigures.FLAT.keys() | TensorFigures.FLAT.keys() | ShardFigures.FLAT.keys():
        data.pop(k)
    data["parts"] = {"pipeline": {"stages": 2, "bubble_s": 0.01}, "elsewhere": {"widgets": 3, "name": "w"}}
    (tmp_path / "summary.json").write_text(json.dumps(data))
    s = records.read(tmp_path / "summary.json", records.RunSummary)
    assert s.parts["elsewhere"] == {"widgets": 3, "name": "w"}
    m = summary_metrics(tmp_path)
    assert (m["pipeline.stages"], m["pipeline.bubble_s"], m["elsewhere.widgets"]) == (2.0, 0.01, 3.0)
    assert "elsewhere.name" not in m  # figures only
