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
