"""examples/: each directory's README commands, run as shown, in a copy of the directory (as a user
copies it), in an environment of its own that sees this suite's packages (so that installing the
plugin example changes nothing else). Then what each must have done, from its records."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.mpi
EXAMPLES = ROOT / "examples"
NAMES = ["slurm-script", "own-model", "hydra-app", "scaling-study", "parallelism-plugin"]


def readme_commands(name: str) -> str:
    """The first bash block of the example's README, as the user would paste it."""
    text = (EXAMPLES / name / "README.md").read_text()
    block = re.search(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)
    assert block, f"examples/{name}/README.md shows no commands"
    return block.group(1)


def test_every_example_is_listed_and_run_here() -> None:
    found = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir())
    assert found == sorted(NAMES)
    index = (EXAMPLES / "README.md").read_text()
    assert all(f"[`{n}/`]({n}/)" in index for n in NAMES)
    tutorials = "".join(p.read_text() for p in (ROOT / "docs" / "tutorials").glob("*.md"))
    assert all(f"examples/{n}/" in tutorials for n in NAMES)  # the tutorials point to them


def _environment(home: Path) -> dict[str, str]:
    """A virtual environment of its own whose Python also sees this suite's packages (a .pth that
    adds them as a site directory), with `hpctrain` on PATH as an installed hpctrain has it."""
    env_dir = home / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    py = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "suite.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    shim = env_dir / "bin" / "hpctrain"
    shim.write_text(f"#!{py}\nimport sys\nfrom hpctrain.cli import main\nsys.exit(main())\n")
    shim.chmod(0o755)
    return dict(
        os.environ,
        VIRTUAL_ENV=str(env_dir),
        PATH=f"{env_dir / 'bin'}:{os.environ['PATH']}",
        COLUMNS="200",
        TERM="dumb",
    )


@pytest.mark.parametrize("name", NAMES)
def test_an_examples_readme_commands_run_as_shown(name: str, tmp_path: Path) -> None:
    copy = tmp_path / name
    shutil.copytree(EXAMPLES / name, copy)
    env = _environment(tmp_path)
    r = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + readme_commands(name)],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-4000:]
    CHECKS[name](copy, r.stdout, r.stderr)


def _summaries(where: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(where.rglob("summary.json"))]


def _slurm_script(copy: Path, out: str, err: str) -> None:
    (s,) = _summaries(copy / "outputs")
    assert s["world_size"] == 2 and s["timed_steps"] > 0 and s["last_loss"] < s["first_loss"], s
    assert "#SBATCH --nodes=2" in out
    assert "rank 0: loss" in out and "after 5 steps" in out  # the script alone


def _own_model(copy: Path, out: str, err: str) -> None:
    runs = _summaries(copy / "outputs")
    assert [(s["world_size"], s["parallelism"]) for s in runs] == [(2, "data"), (2, "fsdp")]
    assert runs[0]["last_loss"] < 0.8 * runs[0]["first_loss"], runs[0]  # the spirals are learnt
    assert "#SBATCH --nodes=2" in out


def _hydra_app(copy: Path, out: str, err: str) -> None:
    assert "rank 0 of 1: lr=0.1" in out  # Hydra alone
    logs = "".join(p.read_text() for p in (copy / "multirun").rglob("*.log"))
    for lr in ("0.01", "0.1"):  # both points, on both ranks
        assert all(f"rank {k} of 2: lr={lr}" in logs + out for k in (0, 1)), logs[-3000:]
    assert "partition: gpu" in out and "nodes: 2" in out


def _scaling_study(copy: Path, out: str, err: str) -> None:
    import pandas as pd

    home = copy / "study-strong"
    runs = json.loads((home / "study.json").read_text())["runs"]
    assert sorted((x["world_size"], x["rep"]) for x in runs) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    df = pd.read_csv(home / "report" / "points.csv")
    assert list(df.ranks) == [1, 2] and (df.throughput_samples_per_s > 0).all()
    assert (home / "report" / "report.html").stat().st_size > 0
    assert "study.nodes" in out or "#SBATCH" in out or "nodes" in out


def _parallelism_plugin(copy: Path, out: str, err: str) -> None:
    (s,) = _summaries(copy / "outputs")
    assert s["parallelism"] == "solo" and s["world_size"] == 1 and s["timed_steps"] > 0, s
    assert "solo: rank 0 holds the whole model" in out
    assert "solo holds the model on one rank (got 2)" in err and "refused, as it should be" in out


CHECKS = {
    "slurm-script": _slurm_script,
    "own-model": _own_model,
    "hydra-app": _hydra_app,
    "scaling-study": _scaling_study,
    "parallelism-plugin": _parallelism_plugin,
}
