"""Host facts: what torch says of this host is probed once per torch installation and device set,
then read from the cache, so planning a local run (and its dry run) does not import torch."""

from __future__ import annotations

import dataclasses
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
        "cuda_devices": 0,
        "cuda_memory_bytes": 0,
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
    cached.write_text(json.dumps({**truth, "cuda_devices": True}))  # a count that is not a number
    assert facts.torch_facts() == truth and len(probes) == 3


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


def test_light_commands_import_neither_torch_nor_matplotlib_nor_numpy(tmp_path: Path) -> None:
    """--help, status, logs, cancel and --dry-run answer without importing torch, matplotlib or
    numpy (each in a fresh interpreter, the command called in-process, sys.modules read after it):
    numpy alone was a third of `status`'s CPU on a slow machine (0.97 -> 0.69 CPU-s)."""
    import socket

    from hpctrain import records
    from hpctrain.launch.local.supervisor import write_state

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "rank0.log").write_text("step 1/1\n")
    ref = records.new(records.JobRef, launcher="local", job_id="1", world_size=1, pid=1, pid_start=0)
    records.write(run / records.JOB, dataclasses.replace(ref, host=socket.gethostname()))
    write_state(run, "COMPLETED")
    env = dict(os.environ, HPCTRAIN_CACHE=str(tmp_path / "cache"))
    commands = [
        ["--help"],
        ["run", "--dry-run"],
        ["status", str(run)],
        ["logs", str(run)],
        ["cancel", str(run)],
    ]
    code = (
        "import sys\nfrom hpctrain.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'matplotlib', 'numpy') if m in sys.modules))\n"
    )
    subprocess.run([sys.executable, "-c", code, "run", "--dry-run"], cwd=ROOT, env=env, timeout=120)  # facts
    for argv in commands:
        r = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
        )
        assert r.stdout.splitlines()[-1] == "[]", (argv, r.stdout[-300:], r.stderr[-300:])


def test_a_free_port_for_the_ranks_store_is_below_the_kernels_ephemeral_range(tmp_path: Path) -> None:
    """A port the kernel picked (bind to 0) may go to any outgoing connection before the store
    binds it; one below the ephemeral range only to another explicit bind."""
    import socket

    low, high = facts.ephemeral_ports()
    assert 1024 <= low < high
    ports = {facts.free_tcp_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 1, ports
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free when asked
    (tmp_path / "range").write_text("40000\t50000\n")
    assert facts.ephemeral_ports(str(tmp_path / "range")) == (40000, 50000)
    (tmp_path / "range").write_text("garbage")
    assert facts.ephemeral_ports(str(tmp_path / "range")) == (32768, 60999)


def test_the_local_supervisor_imports_neither_the_config_nor_hydra_nor_torch() -> None:
    """A supervisor is started for every local run: it imported the launcher, the config and
    Hydra it never uses (0.38 CPU-s a start, 0.2 without)."""
    code = (
        "import sys, hpctrain.launch.local.supervisor, hpctrain.launch.local.spawn\n"
        "print(sorted(m for m in ('hydra', 'omegaconf', 'torch', 'submitit', 'hpctrain.config') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
