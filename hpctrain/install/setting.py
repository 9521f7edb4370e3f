"""How hpctrain was installed here, and the fixes that fit it: `hpctrain doctor` names a command
the user can run where one exists (pip or uv into this environment, `module load` where the site
has modules, apt-get as root), and says plainly when a fix needs root or a clone of the
repository. The fixes are pure functions of an `Installed`; `Installed.here()` looks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import hpctrain

INSTALL_PAGE = "the install page: docs/install.md"


@dataclass(frozen=True)
class Installed:
    """Where hpctrain runs from and what the user may do here."""

    clone: Path | None  # the checkout hpctrain runs from (an editable install), None: a wheel
    root: bool  # root, or passwordless sudo: system packages can be installed
    sudo: bool  # ... through sudo (not root itself)
    modules: bool  # environment modules or Lmod: `module load` works in the user's shell
    apt: bool  # apt-get is here (Debian, Ubuntu)
    installer: str  # what installs into this environment: "pip", "uv pip" or "" (neither)

    @classmethod
    def here(cls) -> Installed:
        root = os.geteuid() == 0
        sudo = not root and shutil.which("sudo") is not None and _quietly(["sudo", "-n", "true"])
        return cls(
            clone=_clone(),
            root=root or sudo,
            sudo=sudo,
            modules=bool(os.environ.get("MODULESHOME") or os.environ.get("LMOD_CMD")),
            apt=shutil.which("apt-get") is not None,
            installer=_installer(),
        )


def _quietly(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _clone() -> Path | None:
    """The repository hpctrain's package sits in (its scripts/setup.sh beside the package)."""
    top = Path(hpctrain.__file__).resolve().parent.parent
    return top if (top / "scripts" / "setup.sh").is_file() and (top / "pyproject.toml").is_file() else None


def _installer() -> str:
    try:
        import pip  # noqa: F401 - only whether this environment has it
    except ImportError:
        return "uv pip" if shutil.which("uv") else ""
    return "pip"


def install_into_env(at: Installed, spec: str) -> str:
    """The command that installs a Python package (a requirement spec) into this environment."""
    if at.clone is not None:
        return f"bash {at.clone / 'scripts' / 'setup.sh'} (it installs every requirement)"
    if not at.installer:
        return f"{sys.executable} -m ensurepip, then python -m pip install '{spec}'"
    return f"{at.installer} install '{spec}'"


def torch_fix(at: Installed) -> str:
    """torch's build for this machine (uv picks PyTorch's CPU or CUDA index: --torch-backend)."""
    if at.clone is not None:
        return install_into_env(at, "torch")
    return f"uv pip install torch --torch-backend=auto (pip install uv first; {INSTALL_PAGE})"


def system_fix(at: Installed, what: str, module: str, deb: str | None, without_root: str = "") -> str:
    """A system component: `module load` where the site has modules, apt-get with root, else what
    a user can do alone (`without_root`), else that it needs root."""
    if at.modules:
        return f"module load {module} (module avail {module} lists your site's)"
    if at.root and at.apt and deb:
        return f"{'sudo ' if at.sudo else ''}apt-get install {deb}"
    if at.root and not deb:
        return f"install {what} (apt has no package of it here)"
    if at.root:
        return f"install {what} with this system's package manager ({deb} on Debian and Ubuntu)"
    if without_root:
        return without_root
    packaged = f" (the package {deb} on Debian and Ubuntu)" if deb else ""
    return f"needs root: ask your administrator for {what}{packaged}"


def needs_clone(at: Installed, what: str, command: str) -> str:
    """A fix that only a clone of the repository can run (its scripts, its recipes)."""
    if at.clone is not None:
        return command
    return f"needs a clone of hpctrain's repository: {what} ({command} there)"


def python_fix(at: Installed) -> str:
    if at.modules:
        return "module load python/3.12 (module avail python lists your site's), then a new environment"
    return "uv python install 3.12 (no root; pip install uv first), then a new environment with it"
