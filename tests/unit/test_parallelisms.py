"""The parallelism axis is open: a sixth parallelism (tests/parallelisms/solo.py, registered in
one line) is validated with its own rule, refuses another parallelism's settings, is planned with
its own notes and layout, and trains with the built-in trainer like the shipped ones."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.engine import registry as engines
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.launch.local.plan import plan_local
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel import derive, kind_of, registry
from hpctrain.records import Layout


@pytest.fixture
def solo() -> Iterator[str]:
    before = dict(registry.PARALLELISMS)
    registry.register_parallelism("solo", "tests.parallelisms.solo:Solo")  # the one registration line
    yield "solo"
    registry.PARALLELISMS.clear()
    registry.PARALLELISMS.update(before)


@pytest.fixture
def counted() -> Iterator[str]:
    before = dict(registry.PARALLELISMS)
    registry.register_parallelism("counted", "tests.parallelisms.counted:Counted")  # the one line
    yield "counted"
    registry.PARALLELISMS.clear()
    registry.PARALLELISMS.update(before)


def _cfg(*overrides: str):
    return load_config(["parallelism.name=solo", "parallelism.engine=ddp", "data=digits", *overrides])


def test_a_registered_parallelism_has_its_own_rules_notes_and_layout(solo: str) -> None:
    cfg = _cfg("cluster.ranks=1")
    validate(cfg, HostFacts.example())
    plan = plan_local(cfg, HostFacts.example(), "/tmp/r", "python")
    assert plan.layout == Layout() and "solo: rank 0 holds the whole model" in plan.notes
    with pytest.raises(ConfigError) as e:
        validate(_cfg("cluster.ranks=2", "parallelism.stages=2"), HostFacts.example())
    text = str(e.value)
    assert "cluster.ranks: solo holds the model on one rank (got 2)" in text
    assert "parallelism.stages: is a pipeline setting; with parallelism=solo it would do nothing" in text


def test_an_unknown_parallelism_names_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"parallelism.name: no parallelism named 'zero'.*data, pipeline"):
        validate(load_config(["parallelism.name=zero"]))


def test_the_built_in_trainer_trains_with_the_new_parallelism(solo: str, tmp_path: Path) -> None:
    from hpctrain.train.loop import train

    engines.register_engine("solo", "tests.engines.solo:SoloEngine")  # one rank, no launcher needed
    try:
        cfg = _cfg("cluster.ranks=1", "parallelism.engine=solo", "train.steps=3", "train.warmup_steps=1")
        engine = engines.engine_for(cfg)
        stats = train(
            cfg,
            engine,
            engine.init(Layout()),
            derive(cfg),
            tmp_path,
            kind_of(cfg).build,
            emit=lambda _: None,
        )
    finally:
        engines.ENGINES.pop("solo")
    assert stats is not None and stats.timed_steps == 2 and math.isfinite(stats.last_loss)
    assert kind_of(cfg).about(cfg, Layout(), {"grad_grouping": "buckets"}) == {"grad_grouping": "none"}


def test_a_parallelism_from_another_installed_package_is_found_by_its_entry_point(tmp_path: Path) -> None:
    """An installed distribution (a dist-info with entry_points.txt, as pip writes it) registering
    `solo` in the group hpctrain.parallelisms: `hpctrain run --dry-run parallelism.name=solo`
    plans it with its own notes, and an unknown name lists it, with no line of hpctrain changed."""
    import os
    import shutil
    import subprocess
    import sys

    pkg = tmp_path / "site" / "hpctrain_solo"
    pkg.mkdir(parents=True)
    shutil.copy(Path(__file__).parents[1] / "parallelisms" / "solo.py", pkg / "__init__.py")
    info = tmp_path / "site" / "hpctrain_solo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hpctrain-solo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hpctrain.parallelisms]\nsolo = hpctrain_solo:Solo\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    hpctrain = str(Path(sys.executable).parent / "hpctrain")
    run = [hpctrain, "run", "--dry-run", "parallelism.engine=ddp", "data=digits"]
    r = subprocess.run(
        [*run, "parallelism.name=solo", "cluster.ranks=1"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "# note: solo: rank 0 holds the whole model" in r.stdout, r.stdout
    r = subprocess.run([*run, "parallelism.name=duo"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "no parallelism named 'duo'" in r.stderr, r.stderr
    assert "hsdp, solo" in r.stderr, r.stderr  # the built-in ones first, then the installed one


def test_a_parallelism_with_a_setting_a_measurement_and_a_report_row(counted: str, tmp_path: Path) -> None:
    """tests/parallelisms/counted.py: its option is checked by type and by its own rule, refused
    by the built-in parallelisms; one rank trains 5 steps (1 warm-up) with it: each step record
    holds its step part (steps 0, 2, 4 counted), the rank its share of the timed steps 1-4 (2 of
    4) and `every`, the summary its part (2 counted), the table its row and a study its column."""
    import io

    from hpctrain import records
    from hpctrain.commands.ui import make_console, print_summary
    from hpctrain.rank import train_builtin
    from tests.parallelisms.counted import CountedFigures, CountedRank, CountedStep

    def problems(*overrides: str) -> str:
        with pytest.raises(ConfigError) as e:
            validate(_cfg("parallelism.name=counted", "cluster.ranks=1", *overrides), HostFacts.example())
        return str(e.value)

    assert "parallelism.options.every: must be >= 1" in problems("+parallelism.options.every=0")
    said = problems("+parallelism.options.evry=2")
    assert "parallelism.options.evry: is not an option of parallelism=counted" in said and "every" in said
    assert "parallelism.options.every" in problems("+parallelism.options.every=two")
    with pytest.raises(ConfigError, match="parallelism.options: parallelism=data takes no options"):
        validate(load_config(["+parallelism.options.every=2"]), HostFacts.example())

    engines.register_engine("solo", "tests.engines.solo:SoloEngine")
    try:
        cfg = _cfg(
            "parallelism.name=counted", "+parallelism.options.every=2", "parallelism.engine=solo",
            "cluster.ranks=1", "train.steps=5", "train.warmup_steps=1",
        )  # fmt: skip
        validate(cfg, HostFacts.example())
        plan = plan_local(cfg, HostFacts.example(), str(tmp_path), "python")
        assert train_builtin(cfg, records.from_dict(records.PlanRecord, plan.to_dict()), tmp_path, None)
    finally:
        engines.ENGINES.pop("solo")
    steps = records.read_steps(tmp_path / records.steps_file(0))
    assert [records.parts.part(r, CountedStep).counted for r in steps] == [1, 0, 1, 0, 1]
    summary = records.read(tmp_path / records.SUMMARY, records.RunSummary)
    assert records.parts.part(summary.per_rank[0], CountedRank) == CountedRank(every=2, counted=0.5)
    assert records.parts.part(summary, CountedFigures) == CountedFigures(every=2, counted=2)
    from hpctrain.analysis.analyze import analyze_runs
    from hpctrain.analysis.report import shown

    columns, table = shown(analyze_runs("strong", [summary], []))
    assert dict(zip(columns, table[0]))["counted"] == "2.0"
    out = io.StringIO()
    print_summary(make_console(out), summary)
    assert re.search(r"counted steps \(one in 2\)\s*\S\s+2\s", out.getvalue()), out.getvalue()


def test_a_dimension_from_another_package_is_asked_not_named() -> None:
    """A dimension registered in one line (parallel/dimensions.py) gives a study its shorthand
    (data/xp3 sets its degree's key) and a layout that has it its summary part; the built-in ones
    are still asked the same way (pp, tp)."""
    from typing import Any, ClassVar

    from hpctrain.orchestrate.study import layout_overrides
    from hpctrain.parallel import dimensions

    class Xp(dimensions.Dimension):
        degree_key: ClassVar[str] = "parallelism.microbatches"

        @classmethod
        def degree(cls, layout: Layout) -> int:
            return layout.dims.get("xp", 1)

        @classmethod
        def declared_part(cls, cfg: Any, layout: Layout) -> tuple[str, dict[str, Any]]:
            return "xp", {"degree": layout.dims["xp"]}

    import sys
    import types

    module = types.ModuleType("xp_dimension")
    module.Xp = Xp  # type: ignore[attr-defined]
    sys.modules["xp_dimension"] = module
    dimensions.DIMENSIONS["xp"] = "xp_dimension:Xp"
    try:
        assert layout_overrides("data/xp3/tp2") == [
            "parallelism=data",
            "parallelism.microbatches=3",
            "parallelism.tp.degree=2",
        ]
        cfg = load_config([])
        assert dimensions.declared_parts(cfg, Layout(dims={"xp": 2})) == {"xp": {"degree": 2}}
        assert dimensions.declared_parts(cfg, Layout(tp=2, dims={"xp": 1})) == {"tensor": {"degree": 2}}
    finally:
        dimensions.DIMENSIONS.pop("xp")
        sys.modules.pop("xp_dimension")
