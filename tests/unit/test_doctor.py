"""`hpctrain doctor` verdicts, with fake checks (the real environment is checked in tests/mpi)."""

from __future__ import annotations

from rich.console import Console

from hpctrain import doctor
from hpctrain.doctor import Check


def _run(monkeypatch, checks: list[Check]) -> tuple[int, str]:
    monkeypatch.setattr(doctor, "CHECKS", [lambda: checks])
    console = Console(record=True, width=200)
    code = doctor.run_doctor(console)
    return code, console.export_text()


def test_missing_required_piece_fails_and_shows_its_fix(monkeypatch) -> None:
    code, text = _run(monkeypatch, [Check("mpirun", False, "not found", "apt-get install openmpi-bin")])
    assert code == 1
    assert "missing" in text and "apt-get install openmpi-bin" in text


def test_missing_optional_piece_is_only_reported(monkeypatch) -> None:
    code, text = _run(
        monkeypatch,
        [
            Check("slurm client", False, "missing: sbatch", "apt-get install slurm-client", required=False),
            Check("torch", True, "2.13.0"),
        ],
    )
    assert code == 0
    assert "optional" in text and "ready" in text
