"""Host facts: what torch says of this host is probed once per torch installation and device set,
then read from the cache, so planning a local run (and its dry run) does not import torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import facts
from tests.conftest import ROOT


def test_torch_facts_are_probed_once_then_read_and_probed_again_when_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCTRAIN_CACHE", str(tmp_path))
    probes: list[int] = []
    truth = {
        "cuda_available": False,
        "cuda_bf16": False,
        "cpu_fp16_autocast": True,
        "cpu_bf16_autocast": True,
    }
    monkeypatch.setattr(facts, "probe_torch", lambda: probes.append(1) or dict(truth))
    assert facts.torch_facts() == truth and len(probes) == 1
    [cached] = list(tmp_path.glob("host-facts-*.json"))
    assert json.loads(cached.read_text()) == truth
    assert facts.torch_facts() == truth and len(probes) == 1  # read, not probed
    cached.write_text('{"cuda_available": "yes"')  # damaged: probed again, and rewritten
    assert facts.torch_facts() == truth and len(probes) == 2
    assert json.loads(cached.read_text()) == truth


def test_other_visible_devices_make_another_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    a = facts.torch_facts_key()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert facts.torch_facts_key() != a


def test_a_dry_run_with_the_facts_cached_imports_no_torch(tmp_path: Path) -> None:
    code = "import sys\nfrom hpctrain.cli import main\nassert main(['run', '--dry-run']) == 0\nprint('torch' in sys.modules)\n"
    env = dict(os.environ, HPCTRAIN_CACHE=str(tmp_path))

    def dry_run() -> str:
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()[-1]

    dry_run()  # the first one may probe torch and fill the cache
    assert list(tmp_path.glob("host-facts-*.json"))
    assert dry_run() == "False"  # the next one plans from the cache, without importing torch
