"""The built site's own checks (docs/_ext/sitecheck.py), run by every build of the documentation:
an option printed with a dash in place of its `--` and a public name of the API reference without
a docstring fail the build. Proved here on a small site built with the real conf.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hpctrain

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
from sitecheck import dashed_options  # noqa: E402


def test_a_dash_before_an_options_name_is_found_and_prose_dashes_are_not() -> None:
    page = "<p>run with <code>\u2013estimate</code>, or (\u2014cfg) or \u2013no-wait</p>"
    assert len(dashed_options(page)) == 3
    prose = "<p>2\u20134 ranks, Karp\u2013Flatt e, first \u2013 last, 61.9\u201386.4%, \u2013</p>"
    assert dashed_options(prose) == []
    assert dashed_options("<pre>hpctrain run --estimate --cfg</pre>") == []


PAGE = """# Small

Run `hpctrain run --estimate` or hpctrain run --dry-run in prose.

```{eval-rst}
.. automodule:: smallmod
   :members:
   :undoc-members:
```
"""


def _build(tmp_path: Path, module: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    src, out = tmp_path / "src", tmp_path / "html"
    src.mkdir(parents=True)
    (src / "conf.py").write_text(
        f"__file__ = {str(DOCS / 'conf.py')!r}\n"
        "exec(compile(open(__file__).read(), __file__, 'exec'))\n"
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
    )
    (src / "index.md").write_text(PAGE)
    (tmp_path / "smallmod.py").write_text(module)
    r = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-E", "-b", "html", str(src), str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    return r, out


@pytest.mark.xdist_group("sphinx")
def test_the_real_configuration_prints_options_as_typed_and_fails_on_an_undocumented_name(
    tmp_path: Path,
) -> None:
    documented = '"""A module."""\n\ndef f() -> int:\n    """One."""\n    return 1\n'
    r, out = _build(tmp_path / "a", documented)
    assert r.returncode == 0, r.stderr
    html = (out / "index.html").read_text()
    assert "run --dry-run in prose" in html and "\u2013dry-run" not in html  # smart quotes are off
    assert f"hpctrain {hpctrain.__version__}" in html  # the version, on every page
    r, _ = _build(tmp_path / "b", documented + "\ndef g() -> int:\n    return 2\n")
    assert r.returncode != 0
    assert "smallmod.g (function) has no docstring" in r.stderr, r.stderr
    assert "smallmod.f" not in r.stderr


def test_every_public_name_of_the_script_api_is_on_the_api_page_with_a_docstring() -> None:
    from hpctrain import api

    page = (DOCS / "reference" / "api.md").read_text()
    assert ".. automodule:: hpctrain.api\n   :members:\n   :undoc-members:" in page
    assert [n for n in api.__all__ if not (getattr(api, n).__doc__ or "").strip()] == []
    public = {
        n
        for n, v in vars(api).items()
        if callable(v) and not n.startswith("_") and v.__module__ == api.__name__
    }
    assert public == set(api.__all__)  # a new public function is exported, so documented
    assert "reference/api" in (DOCS / "contributing.md").read_text()
