"""config.yaml read without OmegaConf (config/plain_yaml.py): the same Config as OmegaConf's read
for what to_yaml writes, every option of every group; anything else is left to OmegaConf."""

from __future__ import annotations

import pytest

from hpctrain.config.load import config_from_yaml, load_config, omegaconf_read
from hpctrain.config.plain_yaml import plain_config, to_yaml
from hpctrain.config.search import search_path
from hpctrain.errors import ConfigError


def _points() -> list[list[str]]:
    """Every option of every group, one of each group a point (5 points, not 31 composes)."""
    found = search_path(None)
    options = {g: found.options(g) for g in sorted(found.groups())}
    each = [
        [f"{g}={o[i % len(o)]}" for g, o in options.items()] for i in range(max(map(len, options.values())))
    ]
    return [
        *each,
        ["cluster=slurm", "cluster.nodes=3", "+cluster.env.FOO=bar", "model=resnet18"],
        ["parallelism=hybrid", "model=mlp", "model.depth=4", "cluster.ranks=4", "optim.lr=1"],
        ["model._target_=torch.nn.Linear", "+model.in_features=4", "+model.bias=false", "data=synthetic"],
    ]


@pytest.mark.parametrize("overrides", _points(), ids=lambda o: " ".join(o))
def test_what_to_yaml_writes_is_read_without_omegaconf_to_the_same_config(overrides: list[str]) -> None:
    try:
        cfg = load_config(overrides)
    except ConfigError as e:  # an option that composes only with others (none today)
        pytest.fail(f"{overrides} does not compose: {e}")
    text = to_yaml(cfg)
    plain = plain_config(text)
    assert plain is not None and to_yaml(plain) == text
    assert plain == omegaconf_read(text) == cfg
    assert config_from_yaml(text) == cfg


def test_an_int_for_a_float_is_widened_as_omegaconf_widens_it() -> None:
    text = to_yaml(load_config(["optim.lr=1"]))
    assert "lr: 1.0\n" in text
    cfg = config_from_yaml(text.replace("lr: 1.0\n", "lr: 1\n"))  # not to_yaml's text: OmegaConf's way
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float


@pytest.mark.parametrize(
    ("change", "then"),
    [
        ("name: ${oc.env:HPCTRAIN_TEST_NAME}", "interpolated"),  # OmegaConf resolves it; plain text cannot
        ("name: ???", "missing"),
        ("name: interpolated\n  name: twice", "duplicate"),
        ("name: interpolated\n  nmae: typo", "unknown"),
        ("name: 5", "5"),  # an int for a str: OmegaConf converts it
    ],
)
def test_text_to_yaml_would_not_write_is_left_to_omegaconf(
    change: str, then: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCTRAIN_TEST_NAME", "interpolated")
    cfg = load_config(["run.name=original"])
    text = to_yaml(cfg)
    assert "  name: original\n" in text
    changed = text.replace("  name: original", f"  {change}", 1)
    assert to_yaml(plain_config(changed) or cfg) != changed  # not read without OmegaConf
    try:
        expected: object = omegaconf_read(changed).run.name
    except Exception as e:  # noqa: BLE001 - whatever OmegaConf raises, config_from_yaml raises too
        expected = type(e)
    try:
        got: object = config_from_yaml(changed).run.name
    except Exception as e:  # noqa: BLE001
        got = type(e)
    assert got == expected
    if then in ("interpolated", "5"):
        assert got == then


def test_a_text_that_omegaconfs_loader_takes_for_a_number_stays_text() -> None:
    """YAML 1.1 leaves `1e-3` a string, so to_yaml writes it bare; OmegaConf's loader reads it as
    a float, and the ranks got run.name "0.001" where the launcher had "1e-3"."""
    cfg = load_config(["run.name='1e-3'", "model._target_=torch.nn.Linear", "+model.eps='1e-3'"])
    text = to_yaml(cfg)
    assert "  name: 1e-3\n" in text and omegaconf_read(text).run.name == "0.001"
    again = config_from_yaml(text)
    assert again.run.name == "1e-3" and again.model.kwargs["eps"] == "1e-3" and again == cfg
