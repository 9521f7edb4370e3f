"""Nothing injected: every string field that reaches the sbatch script, filled with hostile text
(Hypothesis), is either rejected naming that field, or rendered into a script that bash parses
and whose lines are exactly the lines of a harmless config's script (no line the config did not
intend). Pure: plans and renders, submits nothing."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctrain.config import load_config
from hpctrain.config.container import ContainerRuntime
from hpctrain.errors import ConfigError
from hpctrain.launch.container.pyxis import Pyxis
from hpctrain.launch.slurm.plan import plan_slurm
from hpctrain.orchestrate.validate import validate

# characters that break scripts, plus ordinary ones so that some values are valid
HOSTILE = st.text(
    alphabet=st.sampled_from(list("\n\r\0\t\x1b;&|`$()<>'\"\\%*?#{}[]!~ =,:/.-_aZ0")) | st.characters(),
    min_size=1,
    max_size=24,
)
# ... also after a command word, so that setup lines get past their first rule and reach the others
HOSTILE_LINE = HOSTILE | st.builds(
    "{} {}".format, st.sampled_from(["export", "module load", "source", ".", "echo", "A["]), HOSTILE
)
# field -> (where it goes, a harmless value)
FIELDS = {
    "run.dir": "/runs/r1",
    "run.output_root": "/runs",
    "cluster.submitit_folder": "/runs/sub",
    "cluster.partition": "gpu",
    "cluster.account": "proj1",
    "cluster.qos": "high",
    "cluster.constraint": "a100",
    "cluster.setup": "module load cuda",
    "cluster.srun_args": "--exclusive",
    "cluster.container.image": "/images/x.sqsh",  # pyxis: the image is an srun argument
    "cluster.env.value": "1",
    "cluster.env.key": "NCCL_DEBUG",
    "run.name": "train",
}
BASE = load_config(["cluster=slurm"])
# as on a cluster that has pyxis (this machine has none): the rules about the image itself apply
PYXIS_HERE = mock.patch.object(Pyxis, "probe", classmethod(lambda cls: "pyxis (srun --container-image)"))


def with_value(key: str, value: str):
    cfg = copy.deepcopy(BASE)
    section, name = key.split(".", 1)
    if key == "cluster.env.value":
        cfg.cluster.env = {"X": value}
    elif key == "cluster.env.key":
        cfg.cluster.env = {value: "1"}
    elif name in ("setup", "srun_args"):
        setattr(cfg.cluster, name, [value])
    elif key == "cluster.container.image":
        cfg.cluster.container.runtime = ContainerRuntime.pyxis
        cfg.cluster.container.image = value
    else:
        setattr(getattr(cfg, section), name, value)
    return cfg


def script(cfg) -> str:
    run_dir = cfg.run.dir or str(Path(cfg.run.output_root) / "2026-01-01" / "12-00-00-train")
    return plan_slurm(cfg, run_dir, "/venv/bin/python").sbatch_script()


def shape(text: str) -> list[str]:
    """Each line's kind: a #SBATCH flag name, a comment, blank, or the first word of a command."""
    out = []
    for line in text.split("\n"):
        m = re.match(r"#SBATCH --([a-z-]+)", line)
        out.append(f"sbatch:{m.group(1)}" if m else "#" if line.startswith("#") else line.split(" ")[0])
    return out


def bash_parses(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_a_harmless_value_renders_a_parsable_script(key: str) -> None:
    cfg = with_value(key, FIELDS[key])
    with PYXIS_HERE:
        validate(cfg)
    assert bash_parses(script(cfg)).returncode == 0


@pytest.mark.parametrize("key", sorted(FIELDS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=HOSTILE_LINE)
def test_a_hostile_value_is_rejected_by_name_or_rendered_harmlessly(key: str, value: str) -> None:
    cfg = with_value(key, value)
    try:
        with PYXIS_HERE:
            validate(cfg)
    except ConfigError as e:
        named = key.rsplit(".", 1)[0] if key.startswith("cluster.env") else key
        assert any(k.startswith(named) or k.startswith("cluster.env") for k in e.keys), (key, e.keys)
        assert str(e)  # it renders
        return
    text = script(cfg)
    parsed = bash_parses(text)
    assert parsed.returncode == 0, (key, value, parsed.stderr, text)
    expected = shape(script(with_value(key, FIELDS[key])))
    got = shape(text)
    if key == "cluster.setup":  # the setup line is the user's own command: its first word varies
        i = expected.index("module")
        expected[i] = got[i]
    assert got == expected, (key, value, text)
