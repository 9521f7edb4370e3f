"""What the pages show is what hpctrain does: the run summary the quickstart shows is rendered
from a real run's record by today's code, the report tutorial documents every column and plot
the report has, the run-directory page every file of the records' contract, and the README stays
a front page without dated figures."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from hpctrain import records
from hpctrain.analysis.plots import PLOTS
from hpctrain.analysis.report import AFTER, BEFORE
from hpctrain.analysis.study_parts import BUILTIN, study_part
from hpctrain.commands.ui import print_summary
from hpctrain.records import RunSummary

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"


def test_the_quickstart_summary_is_a_real_runs_summary_as_hpctrain_prints_it(snapshot) -> None:
    """docs/quickstart.md includes tests/snapshots/run_summary.txt: a 2-rank run on the digits."""
    s = records.read(ROOT / "tests/fixtures/runs/digits-2ranks/summary.json", RunSummary)
    buf = io.StringIO()
    print_summary(Console(file=buf, width=96, color_system=None, force_terminal=False), s)
    text = "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
    assert "held-out accuracy" in text and "98.1%" in text
    snapshot("run_summary.txt", text)
    assert "tests/snapshots/run_summary.txt" in (DOCS / "quickstart.md").read_text()


def _table_first_cells(page: str, header: str) -> set[str]:
    """The first cells of the Markdown table whose header row starts with `| header |`."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    cells = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells.add(line.split("|")[1].strip().strip("`"))
    return cells


def test_the_report_tutorial_explains_every_column_and_plot() -> None:
    page = (DOCS / "tutorials" / "report.md").read_text()
    columns = _table_first_cells(page, "column")
    parts = [c for key in BUILTIN for c in getattr(study_part(key), "columns", ())]  # built-in parts'
    assert parts and [c for c in (*BEFORE, *parts, *AFTER) if c not in columns] == []
    files = _table_first_cells(page, "file")
    assert [p for p in PLOTS if p not in files] == []


FIRST_PAGES = ("index.md", "install.md", "quickstart.md")
CODE_WIDTH = 96  # what the site's code font fits in its content column (conf.py); longer is cut


def test_the_first_pages_code_fits_the_page_without_scrolling() -> None:
    """A new user copies from these pages: a comment cut at the page's edge ("(minutes; cached")
    hides what a command does."""
    long = []
    for name in FIRST_PAGES:
        fenced = False
        for n, line in enumerate((DOCS / name).read_text().splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            elif fenced and len(line) > CODE_WIDTH:
                long.append(f"{name}:{n}: {len(line)} characters")
    assert long == []


def test_the_report_tutorial_lists_every_column_of_points_csv() -> None:
    from hpctrain.analysis.points_csv import AFTER as CSV_AFTER
    from hpctrain.analysis.points_csv import BEFORE as CSV_BEFORE

    page = (DOCS / "tutorials" / "report.md").read_text()
    listed = _table_first_cells(page, "csv column")
    assert listed == {"series", "ranks", "reps", *(c for c, _ in (*CSV_BEFORE, *CSV_AFTER))}


def test_the_run_directory_page_names_every_file_of_the_records_contract() -> None:
    """records/__init__.py's docstring is the contract: every file it names is on the page."""
    page = (DOCS / "reference" / "run-directory.md").read_text()
    contract = records.__doc__ or ""
    names = set(re.findall(r"^\s{4}([\w.{}\-/]+)", contract, re.M))
    names |= {n.strip(",") for n in re.findall(r"^\s{4}[\w.{}\-/]+,\s*([\w.{}\-/]+)", contract, re.M)}
    assert len(names) > 15
    assert sorted(n for n in names if n.rstrip("/") not in page) == []


DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bon this machine\b|\d+ min \d+ s\b", re.I)


def test_the_readme_is_a_front_page_without_dated_figures() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert DATED.findall(text) == []
    for word in ("Horovod", "DDP", "FSDP", "HSDP", "pipeline", "tensor parallel", "SLURM"):
        assert word.lower() in text.lower(), word


def test_every_page_has_one_title_and_is_in_the_table_of_contents() -> None:
    """One `# ` heading a page (a second would split it in the navigation); Sphinx's build (-W)
    refuses a page outside every toctree, this names a page without a title."""
    pages = [p for p in DOCS.rglob("*.md") if not {"_build", "_generated", "_scratch"} & set(p.parts)]
    assert len(pages) > 25
    for page in pages:
        titles, fenced = [], False
        for line in page.read_text().splitlines():
            fenced = fenced != line.startswith("```")
            if not fenced and line.startswith("# "):
                titles.append(line)
        assert len(titles) == 1, f"{page.relative_to(DOCS)}: {titles}"


def test_the_readmes_summary_is_an_excerpt_of_the_quickstarts_snapshot() -> None:
    """The front page shows rows of the same real run, as hpctrain prints them today."""
    snapshot = (ROOT / "tests" / "snapshots" / "run_summary.txt").read_text().splitlines()
    text = (ROOT / "README.md").read_text()
    rows = [line for line in text.splitlines() if line and line[0] in "┏┃┡│└" and "..." not in line]
    assert len(rows) > 8
    assert [r for r in rows if r not in snapshot] == []


def _mesh(layout: records.Layout) -> str:
    """A layout as the layouts page's mesh column says it."""
    parts = [f"{layout.stages} stages"] if layout.stages > 1 else []
    if layout.replicate > 1:
        parts.append(f"{layout.replicate} {'groups' if layout.shard > 1 else 'replicas'}")
    parts += [f"{layout.shard} shards"] if layout.shard > 1 else []
    parts += [f"{name} {n}" for name, n in layout.dims.items()]  # context parallelism's cp
    parts += [f"tp {layout.tp}"] if layout.tp > 1 else []
    return " × ".join(parts)


def test_every_layout_in_the_layouts_table_is_valid_and_has_the_mesh_it_says() -> None:
    from hpctrain.config import load_config
    from hpctrain.orchestrate.validate import validate
    from hpctrain.parallel.registry import derive

    rows = re.findall(
        r"^\| [^|]+ \| `hpctrain run ([^`]+)` \| ([^|]+) \|$",
        (DOCS / "howto" / "layouts.md").read_text(),
        re.M,
    )
    assert len(rows) == 9, rows
    for args, mesh in rows:
        cfg = load_config(args.split())
        validate(cfg)  # ConfigError: the page shows a layout that is refused
        assert _mesh(derive(cfg).layout) == mesh.strip(), args
