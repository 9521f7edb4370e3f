"""Checks of the built site, run when Sphinx has written it (warnings, so errors under -W):

- a long option printed as "–estimate": a dash where `--` belongs, as smart quotes make one out of
  `--` (conf.py turns them off; this keeps it so, on every page, generated or written);
- a page that does not name the version it documents (the theme's title, "hpctrain 0.1.0");
- a public name of hpctrain's API reference without a docstring (`autodoc-process-docstring`)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

log = logging.getLogger(__name__)

# an en or em dash where a word starts (after a space, a bracket, a quote or the line's start),
# right before an option's name: "–estimate", "(—cfg". Not "2–4", "Karp–Flatt" or "first – last".
DASHED_OPTION = re.compile(r"(?:^|(?<=[\s(\[\"'`>]))[\u2013\u2014](?=[a-z][a-z0-9]*(?:-[a-z0-9]+)*\b)")
TAG = re.compile(r"<[^>]+>")


def dashed_options(page: str) -> list[str]:
    """Each place of an HTML page's text where a dash stands for an option's `--`, with its context."""
    text = html.unescape(TAG.sub("", page))
    return [
        text[max(0, m.start() - 30) : m.end() + 20].replace("\n", " ") for m in DASHED_OPTION.finditer(text)
    ]


def check_built_site(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    version = f"{app.config.project} {app.config.release}"
    for page in sorted(Path(app.outdir).rglob("*.html")):
        text, rel = page.read_text(encoding="utf-8"), page.relative_to(app.outdir)
        for context in dashed_options(text):
            log.warning(f"{rel}: a dash where an option's '--' belongs: ...{context}...")
        if rel.parts[0] not in ("_static", "_modules") and version not in text:
            log.warning(f"{rel}: the page does not name the version it documents ({version})")


def documented(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A public name of the API reference with no docstring of its own fails the build."""
    if name.rpartition(".")[2].startswith("_"):
        return
    if not any(line.strip() for line in lines):
        log.warning(f"{name} ({what}) has no docstring: the API reference documents every public name")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("build-finished", check_built_site)
    app.connect("autodoc-process-docstring", documented)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
