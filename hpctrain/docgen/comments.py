"""What each field of a schema dataclass means, read from its source: the comment on the field's
line (or lines), else the comment lines right above it. The schema keeps one comment per field
(config/schema.py's rule); this turns them into the reference's one-line meanings."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import tokenize
from functools import cache


@cache
def _module_comments(path: str) -> tuple[ast.Module, dict[int, str], list[str]]:
    """The parsed module, its comments by line number, and its lines."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    return ast.parse(text), comments, text.splitlines()


def _class_node(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def _strip_note(text: str) -> str:
    """A lint note (`noqa`, `type: ignore`) is not part of a field's meaning."""
    for marker in ("type: ignore", "noqa"):
        if text.startswith(marker):
            return ""
    return text


def _own_meanings(cls: type) -> dict[str, str]:
    path = inspect.getsourcefile(cls)
    if path is None:
        return {}
    tree, comments, lines = _module_comments(path)
    node = _class_node(tree, cls.__name__)
    if node is None:
        return {}
    out: dict[str, str] = {}
    for stmt in node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        end = stmt.end_lineno or stmt.lineno
        trailing = [_strip_note(comments[n]) for n in range(stmt.lineno, end + 1) if n in comments]
        above: list[str] = []
        n = stmt.lineno - 1
        while n in comments and lines[n - 1].lstrip().startswith("#"):
            above.insert(0, comments[n])
            n -= 1
        words = " ".join(t for t in [*above, *trailing] if t)
        out[stmt.target.id] = words
    return out


def field_meanings(cls: type) -> dict[str, str]:
    """Field name -> its comment, over the dataclass and the classes it extends (the nearest
    definition of a field wins, as in the dataclass itself)."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and base.__module__ in sys.modules:
            out.update({k: v for k, v in _own_meanings(base).items() if v or k not in out})
    return out


def summary(obj: object) -> str:
    """The first paragraph of an object's docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())
