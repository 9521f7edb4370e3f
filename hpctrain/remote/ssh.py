"""One SSH connection to the cluster's login node, shared by every command (OpenSSH's ControlMaster):
the first command opens it, later ones reuse it for `ControlPersist` seconds, so a two-factor login
is typed once. Host keys are checked against known_hosts and never accepted silently
(StrictHostKeyChecking=yes); without a terminal (CI, --no-wait) ssh never prompts (BatchMode) and
a refusal is named with its fix. Building the argv and reading a failure are pure."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import LaunchError

CONTROL_PERSIST_S = 600  # how long the shared connection outlives the last command using it
CONNECT_TIMEOUT_S = 10
SSH_FAILED = 255  # ssh's own exit status (a remote command's is passed through)


@dataclass(frozen=True)
class Target:
    """Where the cluster's hpctrain is: the ssh destination, an ssh config file (`ssh -F`; None:
    the user's), and where the control socket lives."""

    destination: str
    ssh_config: str | None
    control_dir: Path

    def argv(self, remote: str, interactive: bool) -> list[str]:
        """ssh's argv running `remote` (a command line for the remote login shell)."""
        opts = [
            "ControlMaster=auto",
            f"ControlPath={self.control_dir}/%C",  # %C: a hash of host, port, user: short, no spaces
            f"ControlPersist={CONTROL_PERSIST_S}",
            "StrictHostKeyChecking=yes",
            f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "ServerAliveInterval=15",
            f"BatchMode={'no' if interactive else 'yes'}",
        ]
        config = ["-F", self.ssh_config] if self.ssh_config else []
        return ["ssh", *config, *(w for o in opts for w in ("-o", o)), self.destination, "--", remote]

    def stop_argv(self) -> list[str]:
        """ssh's argv that closes the shared connection (`ssh -O exit`)."""
        config = ["-F", self.ssh_config] if self.ssh_config else []
        return ["ssh", *config, "-o", f"ControlPath={self.control_dir}/%C", "-O", "exit", self.destination]


SOCKET_PATH_MAX = 100  # a Unix socket's path must fit in 108 bytes; %C is 40 characters


def control_dir(cache: Path) -> Path:
    """Where the shared connection's socket lives, made now: hpctrain's cache, or, where that path
    is too long for a socket, a directory of this user's own under /tmp (made 0700; refused if
    another user owns it)."""
    mine = cache / "ssh"
    if len(str(mine)) + 41 <= SOCKET_PATH_MAX:
        mine.mkdir(parents=True, exist_ok=True, mode=0o700)
        return mine
    short = Path(f"/tmp/hpctrain-ssh-{os.getuid()}")
    short.mkdir(mode=0o700, exist_ok=True)
    st = short.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise LaunchError(
            f"{short} is not this user's own directory (0700): remove it, or set HPCTRAIN_CACHE to a shorter path"
        )
    return short


def refusal(destination: str, stderr: str) -> str:
    """What ssh's own failure (exit 255) means, and the fix."""
    text = stderr.strip()
    if "Host key verification failed" in text or "host key for" in text.lower():
        return (
            f"the host key of {destination} is not in your known_hosts, or it changed: run `ssh "
            f"{destination}` once and check the key it shows; hpctrain never accepts a host key itself"
        )
    if "Permission denied" in text:
        return (
            f"{destination} refused the login: add your key (ssh-copy-id {destination}), or, where the "
            "cluster asks for a second factor, run the command from a terminal: it asks once, and "
            f"hpctrain's later commands reuse that connection for {CONTROL_PERSIST_S // 60} minutes"
        )
    if "Could not resolve hostname" in text:
        return f"{destination} is not a host name this machine resolves (nor an alias of your ssh config)"
    if "timed out" in text or "Connection refused" in text or "No route to host" in text:
        return f"{destination} did not answer ({text.splitlines()[-1]}): check the address and your network"
    last = text.splitlines()[-1] if text else "no message"
    return f"ssh to {destination} failed: {last}"


def interactive() -> bool:
    """May ssh ask the user (a password, a second factor)? Only with a terminal to ask on."""
    return sys.stdin.isatty() and os.environ.get("HPCTRAIN_SSH_BATCH") != "1"


def call(
    target: Target, remote: str, stdin: bytes | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run `remote` there and collect its output; ssh's own failure is a LaunchError naming it."""
    try:
        r = subprocess.run(
            # on a terminal, the first command may open the shared connection with a prompt (a
            # second factor): ssh asks on the terminal itself, whatever its pipes
            target.argv(remote, interactive=interactive()),
            input=stdin,
            capture_output=True,
            timeout=timeout,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        raise LaunchError(f"{target.destination} did not answer within {timeout:g} s") from e
    except FileNotFoundError as e:
        raise LaunchError("ssh is not installed here (OpenSSH's client: openssh-client)") from e
    if r.returncode == SSH_FAILED:
        raise LaunchError(refusal(target.destination, r.stderr.decode(errors="replace")))
    return r
