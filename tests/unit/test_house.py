"""The house rules that a reviewer would otherwise check by eye: modules under 450 lines,
functions under 80, and no `type: ignore` in the trainer (issue 22). The layer contract itself is
checked by `lint-imports` in the test command."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hpctrain"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 50, f"the package was not found at {PACKAGE}"
    return found


def test_no_module_over_450_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules by concern (lines): {long}"


def test_no_function_over_80_lines() -> None:
    long = []
    for p in modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(PACKAGE)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these functions: " + ", ".join(long)


def test_the_trainer_has_no_type_ignore() -> None:
    found = [
        f"{p.relative_to(PACKAGE)}:{i}"
        for p in sorted((PACKAGE / "train").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert not found, f"type the trainer instead: {found}"


def _names_a_parallelism(node: ast.expr, names: set[str]) -> bool:
    """`cfg.parallelism.name`, `par.name`, or a literal (or tuple of literals) naming a parallelism."""
    text = ast.unparse(node)
    if text.endswith("parallelism.name") or text == "par.name":
        return True
    consts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return any(isinstance(c, ast.Constant) and c.value in names for c in consts)


def test_no_code_branches_on_a_parallelisms_name() -> None:
    """A parallelism is asked, never named: every comparison with its name (or with a literal
    name next to something called parallelism) would be a branch outside its module (issue 37).
    The registry looks names up; nothing else may."""
    from hpctrain.parallel.registry import PARALLELISMS

    names, found = set(PARALLELISMS), []
    for p in modules():
        if p == PACKAGE / "parallel" / "registry.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            by_attr = any(ast.unparse(o).endswith(("parallelism.name", "par.name")) for o in operands)
            by_literal = "parallel" in ast.unparse(node) and any(
                _names_a_parallelism(o, names) for o in operands
            )
            if by_attr or by_literal:
                found.append(f"{p.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
    assert not found, "ask the parallelism (parallel/base.py) instead of naming it: " + "; ".join(found)


# where an engine's or a schedule's name may be compared: its own package or table, the benchmarks'
# hand-written equivalents (bench/: they are the code hpctrain is measured against), and the one
# migration of records written before the engine named its grouping (records/types.py)
NAMED_IN = ("engine/", "bench/", "records/schedules.py", "records/types.py")


def test_no_code_branches_on_an_engines_or_a_schedules_name() -> None:
    """An engine is asked for its capabilities (engine/base.py), a schedule for its properties and
    its bubble (records/schedules.py); a comparison with a literal name of either outside them
    is a branch that a new engine or schedule would miss (issue 55)."""
    from hpctrain.engine.registry import engine_names
    from hpctrain.records.schedules import SCHEDULES

    found = _comparisons_with(set(engine_names()) | set(SCHEDULES), NAMED_IN)
    assert not found, "ask the engine or the schedule instead of naming it: " + "; ".join(found)


def _comparisons_with(names: set[str], allowed: tuple[str, ...]) -> list[str]:
    """Every comparison with one of `names` as a literal, in modules outside `allowed`."""
    found = []
    for p in modules():
        if str(p.relative_to(PACKAGE)).startswith(allowed):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Compare) and any(
                _names_a_parallelism(o, names) for o in [node.left, *node.comparators]
            ):
                found.append(f"{p.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_launchers_have_no_type_ignore() -> None:
    found = [
        f"{p.relative_to(PACKAGE)}:{i}"
        for p in sorted((PACKAGE / "launch").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert not found, f"type the launchers' plans instead: {found}"


def test_job_states_are_compared_as_states_never_as_bare_words() -> None:
    """A job state is a records.State, mapped from each scheduler's words in one place (State.of):
    no SLURM state word appears as a string literal elsewhere (issue 37)."""
    from hpctrain.records import State

    words = {s.value for s in State}
    allowed = {
        ("records/states.py", None),  # the vocabulary itself
        ("launch/slurm/sacct.py", "PENDING"),  # squeue's -t argument
        ("tracking/sync.py", "FAILED"),  # MLflow's word for a failed run
    }
    found = [
        f"{p.relative_to(PACKAGE)}:{node.lineno} {node.value!r}"
        for p in modules()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Constant)
        and node.value in words
        and (str(p.relative_to(PACKAGE)), None) not in allowed
        and (str(p.relative_to(PACKAGE)), node.value) not in allowed
    ]
    assert not found, "use records.State: " + ", ".join(found)


# a dimension that is one package (issue 73), and the modules outside it that may import it: the
# parallelism and dimension registries (by name) and the shared mesh, where another parallelism
# composes with it
PACKAGES_WITH_DOORS = {
    "parallel/pipeline": (
        "dimension_packages.py",  # its line: the records, rows, study view and dimension by name
        "parallel/registry.py",  # its parallelisms (pipeline, hybrid) by name
        "parallel/mesh.py",  # where fsdp takes stages
        "bench/pipeline.py",  # its benchmark: a command, above the package's layer
    ),
    # registered by one line, and found by every layer through it (docs/contributing.md)
    "parallel/context": ("dimension_packages.py",),
    # the same; the parallelisms that take it ask parallel/dimensions.py (split_degree, ...)
    "parallel/tensor": ("dimension_packages.py",),
    # the parallelisms: by name in the registry (and the sharded one's records in the table)
    "parallel/sharded": ("dimension_packages.py", "parallel/registry.py"),
    "parallel/data": ("parallel/registry.py",),
}


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import in a module, at any depth, and of every string that names a
    module of hpctrain to be imported later ("hpctrain.x.y:Class", registry tables)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("hpctrain.")
        ):
            out.append((node.lineno, node.value.partition(":")[0]))
    return out


def test_a_dimension_package_is_imported_only_through_its_doors() -> None:
    """No module outside parallel/pipeline/ imports a module of it but the registry and the shared
    mesh: the pipeline's plan, rank side and records live in one place (issue 73); context
    parallelism's package is named by its registration line alone."""
    found = []
    for package, doors in PACKAGES_WITH_DOORS.items():
        dotted = "hpctrain." + package.replace("/", ".")
        for p in modules():
            rel = str(p.relative_to(PACKAGE))
            if rel.startswith(package + "/") or rel in doors:
                continue
            for line, name in _imported(ast.parse(p.read_text())):
                if name == dotted or name.startswith(dotted + "."):
                    found.append(f"{rel}:{line} imports {name}")
    assert not found, "ask the registry or parallel/mesh.py instead: " + "; ".join(found)


def test_the_house_test_sees_each_way_of_importing_a_module() -> None:
    seen = _imported(
        ast.parse(
            "import hpctrain.parallel.pipeline.pipe\n"
            "def f():\n    from hpctrain.parallel.pipeline import step\n"
            "T = {'p': 'hpctrain.parallel.pipeline.kind:Pipeline'}\n"
        )
    )
    assert [name for _, name in seen] == [
        "hpctrain.parallel.pipeline.pipe",
        "hpctrain.parallel.pipeline.step",
        "hpctrain.parallel.pipeline.kind",
    ]


# where a dimension's name ("pp", "tp") or its part's key ("pipeline", "tensor") may be compared:
# its own package or module, the dimensions' registry, and the parts' records
DIMENSION_NAMED_IN = (
    "parallel/pipeline/",
    "parallel/context/",
    "parallel/tensor/",
    "parallel/dimensions.py",
    "records/parts.py",
)


def test_no_code_branches_on_a_dimensions_name() -> None:
    """A dimension is asked (parallel/dimensions.py), never named: a comparison with its mesh
    name or its part's key outside its package is a branch that a new dimension would miss (issue 73)."""
    from hpctrain.dimension_packages import PACKAGES
    from hpctrain.parallel.dimensions import DIMENSIONS
    from hpctrain.parallel.pipeline.figures import PipelineFigures
    from hpctrain.parallel.tensor.figures import TensorFigures

    keys = {PipelineFigures.KEY, TensorFigures.KEY} | {key for _, key in PACKAGES.values()}
    found = _comparisons_with(set(DIMENSIONS) | keys, DIMENSION_NAMED_IN)
    assert not found, "ask the dimension instead of naming it: " + "; ".join(found)
