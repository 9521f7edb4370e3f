"""The generated reference pages cannot drift from the code: each equals what the code generates
now, every config key and every command-line option is in them, and each has its meaning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.config.plain_yaml import to_yaml
from hpctrain.docgen import cli_ref, config_ref
from hpctrain.docgen.__main__ import main as docgen
from hpctrain.docgen.pages import generated
from hpctrain.parser import build_parser, config_groups_help

REFERENCE = Path(__file__).parents[2] / "docs" / "reference"


def test_the_committed_reference_pages_are_what_the_code_generates() -> None:
    assert docgen([str(REFERENCE), "--check"]) == 0, "regenerate: python -m hpctrain.docgen docs/reference"


def test_check_fails_on_a_stale_page_and_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, text in generated().items():
        (tmp_path / name).write_text(text)
    (tmp_path / "cli.md").write_text(generated()["cli.md"].replace("hpctrain run", "hpctrain walk", 1))
    assert docgen([str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "cli.md" in err and "python -m hpctrain.docgen" in err


def _leaves(node: object, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, v in node.items() for k in _leaves(v, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


@pytest.mark.parametrize(
    "overrides", [[], ["cluster=slurm"], ["study=strong"], ["tracking=both", "parallelism=hsdp"]]
)
def test_every_key_of_a_composed_config_is_in_the_config_reference(overrides: list[str]) -> None:
    import yaml

    page = (REFERENCE / "config.md").read_text()
    keys = _leaves(yaml.safe_load(to_yaml(load_config(overrides))))
    # a leaf is a key of the page; `study: null` (no study chosen) is the page's study section
    missing = [k for k in keys if f"`{k}`" not in page and f"\n## {k}\n" not in page]
    assert keys and not missing, f"keys missing from docs/reference/config.md: {missing}"


def test_every_config_key_has_a_meaning_type_and_default() -> None:
    keys = config_ref.all_keys()
    assert len(keys) > 150
    assert [k.path for k in keys if not k.meaning] == []
    assert [k.path for k in keys if not k.type or not k.default] == []


def test_the_config_reference_renders_types_defaults_and_choices() -> None:
    by_path = {k.path: k for k in config_ref.all_keys()}
    assert by_path["parallelism.shard.degree"].type == "int or null"
    assert by_path["parallelism.shard.degree"].default == "`null`"
    assert by_path["precision.name"].choices == "`fp32` \\| `fp16` \\| `bf16`"
    assert by_path["cluster.exclude"].type == "list of str"
    # computed where it runs: the page says how, not what this machine would say
    assert by_path["parallelism.engine"].default.startswith("computed: Horovod, the mission's engine")
    assert by_path["cluster.partition"].meaning.startswith("sbatch --partition")


def test_every_command_line_option_has_help_and_is_in_the_cli_reference() -> None:
    page = (REFERENCE / "cli.md").read_text()
    cmds = list(cli_ref.commands(build_parser()))
    assert len(cmds) > 20
    for c in cmds:
        assert f"## hpctrain {' '.join(c.words)}\n" in page
        assert c.help, f"hpctrain {' '.join(c.words)} has no help"
        for a in cli_ref.options(c.parser):
            assert a.help, f"hpctrain {' '.join(c.words)} {a.option_strings or a.dest} has no help text"
            for flag in a.option_strings:
                assert f"`{flag}" in page, f"{flag} of hpctrain {' '.join(c.words)} is not in cli.md"


def test_run_help_lists_the_config_groups_and_their_options(tmp_path: Path) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mysite.yaml").write_text("defaults: [slurm, _self_]\n")
    text = config_groups_help({"HPCTRAIN_CONFIG_PATH": str(tmp_path), "HOME": str(tmp_path)})
    assert "  cluster:     local, mysite, slurm\n" in text
    assert "  parallelism: data, fsdp, hsdp, hybrid, pipeline\n" in text
    assert f"{tmp_path} ($HPCTRAIN_CONFIG_PATH)" in text
    # a broken search path still shows hpctrain's own groups, and why the rest are missing
    broken = config_groups_help({"HPCTRAIN_CONFIG_PATH": str(tmp_path / "nope"), "HOME": str(tmp_path)})
    assert "model:" in broken and "is not a directory" in broken
    run = next(c.parser for c in cli_ref.commands(build_parser()) if c.words == ("run",))
    help_text = run.format_help()
    assert "config groups (choose with group=option" in help_text
    assert "  model:       cnn, mlp, resnet18, resnet50, transformer" in help_text


def test_the_bench_help_states_the_targets_the_benchmark_holds_itself_to() -> None:
    from hpctrain.bench.analyze import TARGETS_S

    analyze = next(c for c in cli_ref.commands(build_parser()) if c.words == ("bench", "analyze"))
    said = {
        int(n.replace(",", "")): float(s)
        for n, s in re.findall(r"([\d,]+)(?: runs)? in ([\d.]+) s", analyze.help)
    }
    assert said == TARGETS_S
