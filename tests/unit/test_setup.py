"""scripts/setup.sh gives a new clone this machine's last environment for the same requirements,
hard-linked, instead of installing and byte-compiling everything again: the packages are the same
files, the console scripts run the new environment's Python, and hpctrain is this clone's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_new_environment_links_the_last_one_and_works(tmp_path: Path) -> None:
    setup = ROOT / "scripts" / "setup.sh"
    key = subprocess.run(
        ["bash", str(setup), "--template-key"], capture_output=True, text=True
    ).stdout.strip()
    # this machine's last environment for these requirements: the one running the tests
    template = tmp_path / "cache" / "venvs" / key
    template.mkdir(parents=True)
    subprocess.run(["cp", "-al", f"{sys.prefix}/lib", f"{sys.prefix}/bin", str(template)], check=True)
    venv = tmp_path / "venv"
    env = {**os.environ, "HPCTRAIN_VENV": str(venv), "HPCTRAIN_CACHE": str(tmp_path / "cache")}
    r = subprocess.run(["bash", str(setup)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "from this machine's last one for the same requirements" in r.stdout, r.stdout
    assert "installing hpctrain (editable)\n" in r.stdout and "byte-compiling" not in r.stdout, r.stdout
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = Path(sys.prefix) / "lib" / site.parent.name / "site-packages"
    assert (site / "torch" / "__init__.py").stat().st_nlink > 1  # linked, not copied
    assert (site / "torch" / "__init__.py").read_bytes() == (ours / "torch" / "__init__.py").read_bytes()
    assert (venv / "bin" / "lint-imports").read_text().splitlines()[0] == f"#!{venv}/bin/python"
    out = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import hpctrain, horovod.torch as h; print(hpctrain.__file__, h.mpi_built())",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.stdout.split() == [str(ROOT / "hpctrain" / "__init__.py"), "True"], out.stdout + out.stderr
    help_ = subprocess.run([venv / "bin" / "hpctrain", "--help"], capture_output=True, text=True)
    assert help_.returncode == 0 and "usage: hpctrain" in help_.stdout, help_.stderr


def test_the_environments_key_follows_what_is_installed_not_the_tools_settings(tmp_path: Path) -> None:
    """An edit of pytest's markers or ruff's rules reuses the environment; one of the dependencies
    or the extras builds another (before, any edit of pyproject.toml built it again: two minutes)."""
    (tmp_path / "scripts").mkdir()
    setup = tmp_path / "scripts" / "setup.sh"
    setup.write_bytes((ROOT / "scripts" / "setup.sh").read_bytes())
    project = tmp_path / "pyproject.toml"
    original = (ROOT / "pyproject.toml").read_text()

    def key(text: str) -> str:
        project.write_text(text)
        r = subprocess.run(["bash", str(setup), "--template-key"], capture_output=True, text=True)
        assert r.returncode == 0 and len(r.stdout.strip()) == 16, r.stdout + r.stderr
        return r.stdout.strip()

    first = key(original)
    assert "[tool.pytest.ini_options]" in original and '"mpi: ' in original
    assert key(original.replace('"mpi: ', '"mpi: (edited) ')) == first
    assert "line-length = 110" in original
    assert key(original.replace("line-length = 110", "line-length = 111", 1)) == first
    assert "dependencies = [" in original
    assert key(original.replace("dependencies = [", 'dependencies = [\n    "rich",', 1)) != first
