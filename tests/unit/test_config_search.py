"""Site and user config directories join the shipped configs (config/search.py), never hide them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.config.load import load_config
from hpctrain.config.search import search_path, user_dir
from hpctrain.errors import ConfigError

SITE = (
    "defaults:\n  - slurm\n  - _self_\npartition: gpu\naccount: proj1\nsetup: ['module load openmpi cuda']\n"
)


def _site(root: Path, name: str = "mysite") -> Path:
    (root / "cluster").mkdir(parents=True)
    (root / "cluster" / f"{name}.yaml").write_text(SITE)
    return root


def test_order_is_shipped_then_flag_then_variable_then_user(tmp_path: Path) -> None:
    flag, var, home = _site(tmp_path / "a"), _site(tmp_path / "b", "other"), tmp_path / "home"
    (home / ".config" / "hpctrain").mkdir(parents=True)
    found = search_path(flag, {"HPCTRAIN_CONFIG_PATH": str(var), "HOME": str(home)})
    assert [s.origin for s in found.sources] == ["hpctrain", "--config-dir", "$HPCTRAIN_CONFIG_PATH", "user"]
    assert found.sources[1].path == flag.resolve() and found.sources[3].path == (
        home / ".config" / "hpctrain"
    )
    assert found.options("cluster") == ["local", "mysite", "other", "slurm"]
    assert user_dir({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == Path("/x/hpctrain")


def test_a_site_preset_builds_on_the_shipped_slurm_option(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no user directory of the machine's own
    cfg = load_config(["cluster=mysite", "cluster.nodes=2"], _site(tmp_path / "site"))
    assert (cfg.cluster.name, cfg.cluster.partition, cfg.cluster.account, cfg.cluster.nodes) == (
        "slurm",
        "gpu",
        "proj1",
        2,
    )
    assert cfg.cluster.setup == ["module load openmpi cuda"]
    assert load_config([], tmp_path / "site").model.name == "cnn"  # the shipped groups stay


def test_a_path_with_spaces_commas_and_quotes_is_searched(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    odd = _site(tmp_path / "a site, [x] 'q'")
    assert load_config(["cluster=mysite"], odd).cluster.partition == "gpu"


def test_a_missing_directory_and_a_file_that_would_be_hidden_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config-dir: .*nope is not a directory"):
        search_path(tmp_path / "nope", {"HOME": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"\$HPCTRAIN_CONFIG_PATH: .*gone is not a directory"):
        search_path(None, {"HPCTRAIN_CONFIG_PATH": str(tmp_path / "gone"), "HOME": str(tmp_path)})
    shadow = tmp_path / "shadow"
    (shadow / "cluster").mkdir(parents=True)
    (shadow / "cluster" / "slurm.yaml").write_text("partition: x\n")
    (shadow / "config.yaml").write_text("defaults: []\n")
    with pytest.raises(ConfigError) as e:
        search_path(shadow, {"HOME": str(tmp_path)})
    assert {p.rule.split(" is ")[0] for p in e.value.problems} == {"config.yaml", "cluster/slurm.yaml"}
    assert any("cluster=mysite" in p.fix and "defaults: [slurm, _self_]" in p.fix for p in e.value.problems)
