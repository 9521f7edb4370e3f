"""CHANGELOG.md keeps the Keep a Changelog form (keepachangelog.com 1.1.0): versions newest first,
each `## [X.Y.Z] - YYYY-MM-DD` (or `- Unreleased` while it is being made), their changes under
the six kinds of change; the newest version is the package's, and the site shows the file."""

from __future__ import annotations

import re
from pathlib import Path

from hpctrain import __version__

ROOT = Path(__file__).parents[2]
VERSION = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2}|Unreleased)$")
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def versions(text: str) -> list[tuple[tuple[int, int, int], str]]:
    """The file's versions in order, ((major, minor, patch), date or "Unreleased"); ValueError on a
    heading or a kind of change outside the form."""
    out: list[tuple[tuple[int, int, int], str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            m = VERSION.match(line)
            if m is None:
                raise ValueError(f"line {n}: {line!r} is not '## [X.Y.Z] - YYYY-MM-DD' or '- Unreleased'")
            out.append(((int(m[1]), int(m[2]), int(m[3])), m[4]))
        elif line.startswith("### ") and line[4:] not in KINDS:
            raise ValueError(f"line {n}: {line[4:]!r} is not one of {sorted(KINDS)}")
        elif line.startswith("### ") and not out:
            raise ValueError(f"line {n}: a kind of change before any version")
    return out


def test_the_changelog_is_in_form_and_its_newest_version_is_the_packages() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    found = versions(text)
    assert found and ".".join(map(str, found[0][0])) == __version__
    assert [v for v, _ in found] == sorted((v for v, _ in found), reverse=True)
    assert all(date != "Unreleased" for _, date in found[1:])  # only the newest may be unreleased
    assert "{include} ../CHANGELOG.md" in (ROOT / "docs" / "changelog.md").read_text()


def test_the_form_check_catches_a_wrong_heading_and_a_made_up_kind() -> None:
    assert versions("# Changelog\n## [1.2.0] - 2026-12-01\n### Added\n") == [((1, 2, 0), "2026-12-01")]
    for bad in (
        "## 1.2.0\n",
        "## [1.2] - 2026-12-01\n",
        "## [1.2.0] - 2026-12-01\n### Improved\n",
        "### Added\n",
    ):
        try:
            versions(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted: {bad!r}")
