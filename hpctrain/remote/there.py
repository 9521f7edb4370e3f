"""The cluster's hpctrain, through the shared SSH connection: its version compared with this one,
a bundle sent once, a command run (attached, or detached from the connection for the work a
dropped connection must not stop), and a run's records fetched back. The scripts that `sh -s`
runs there are pure; every word in them is quoted."""

from __future__ import annotations

import io
import secrets
import shlex
import subprocess
import sys
import tarfile
from datetime import datetime
from pathlib import Path

from hpctrain import __version__, records
from hpctrain.errors import LaunchError, RecordError
from hpctrain.remote.bundle import CONF, Bundle
from hpctrain.remote.ssh import SSH_FAILED, Target, call, interactive

# what does not come back: the code snapshot (it went there from here), pickles, weights
LEFT_THERE = ("code", "submitit", "checkpoints", "model.pt", "cache")


# there, a command reads the configs sent from here (--config-dir of its bundle) and no others:
# the cluster's own presets could hide them, or be hidden (hpctrain refuses both)
OWN_CONFIGS = ["env", "HPCTRAIN_CONFIG_PATH=", "HPCTRAIN_CONF_DIR=", "HPCTRAIN_IGNORE_USER_CONFIG=1"]


def command_script(hpctrain: str, cwd: str, words: list[str]) -> str:
    """The script `sh -s` runs there: every word quoted, so an override holding `$(...)`, quotes,
    `;` or a newline reaches hpctrain as the value it is. The login shell sees only `sh -s`."""
    return f"cd {shlex.quote(cwd)} || exit 3\nexec {shlex.join([*OWN_CONFIGS, hpctrain, *words])}\n"


def detached_script(hpctrain: str, cwd: str, words: list[str], session: str) -> str:
    """The script `sh -s` runs there for a command that must outlive the connection: hpctrain in
    a session of its own (setsid), its output into `session`'s files, which are shown here until
    it ends; then its exit status. The command line is written into the session's driver script
    as one quoted string (never a here-document a word could end)."""
    s = shlex.quote(session)
    driver = (
        f"cd {shlex.quote(cwd)} || exit 3\n"
        f"{shlex.join([*OWN_CONFIGS, hpctrain, *words])} >{s}/out 2>{s}/err </dev/null\n"
        f"echo $? >{s}/rc.part && mv {s}/rc.part {s}/rc\n"
    )
    return (
        f"mkdir -p {s} && cd {s} || exit 3\n"
        f"printf '%s' {shlex.quote(driver)} >driver.sh && : >out && : >err || exit 3\n"
        "setsid sh driver.sh </dev/null >/dev/null 2>&1 &\n"
        "pid=$!\n"
        "tail -s 0.2 -n +1 --pid=$pid -f out &\n"
        "tail -s 0.2 -n +1 --pid=$pid -f err >&2\n"
        "wait\n"
        '[ -f rc ] && exit "$(cat rc)"\n'
        "exit 1\n"
    )


CAUSES = ("No space left on device", "Disk quota exceeded", "Permission denied", "Read-only file system")


def cause(stderr: bytes) -> str:
    """The line of a failed command's stderr that says why (tar's last line only says it failed)."""
    lines = [x for x in stderr.decode(errors="replace").strip().splitlines() if x.strip()]
    return next((x for c in CAUSES for x in lines if c in x), lines[0] if lines else "no message")


class Remote:
    """The cluster's hpctrain, through one shared SSH connection."""

    def __init__(self, target: Target, root: str, hpctrain: str) -> None:
        self.target, self.root, self.hpctrain = target, root, hpctrain

    def check_version(self) -> None:
        """The cluster's hpctrain is this one's version, or the command is refused naming both;
        and `root` made absolute (the remote home's, where it is relative or starts with ~/)."""
        r = call(self.target, f"pwd && {shlex.quote(self.hpctrain)} --version", timeout=60)
        home, _, said = r.stdout.decode(errors="replace").strip().partition("\n")
        if not self.root.startswith("/"):
            self.root = f"{home}/{self.root.removeprefix('~/')}"
        if r.returncode == 127 or not said.startswith("hpctrain "):
            raise LaunchError(
                f"{self.target.destination} has no `{self.hpctrain}` on its login PATH: install hpctrain "
                f"{__version__} there (the install page), or set cluster.remote_hpctrain to its path"
            )
        theirs = said.split()[1]
        if theirs != __version__:
            raise LaunchError(
                f"hpctrain here is {__version__}, on {self.target.destination} it is {theirs}: the "
                f"two must match. Install hpctrain {__version__} there (e.g. `uv pip install "
                f"hpctrain-{__version__}-py3-none-any.whl` in its environment), or hpctrain {theirs} here"
            )

    def send(self, bundle: Bundle) -> str:
        """The bundle's directory there (`<root>/bundles/<hash>`), sent only if it is not there yet."""
        home = f"{self.root}/bundles/{bundle.digest[:24]}"
        q = shlex.quote(home)
        if call(self.target, f"test -d {q}/code").returncode == 0:
            return home
        tmp = shlex.quote(f"{home}.part")
        script = (
            f"rm -rf {tmp} && mkdir -p {tmp} && tar -x -f - -C {tmp} && mkdir -p {tmp}/{CONF} && mv {tmp} {q}"
        )
        r = call(self.target, f"sh -c {shlex.quote(script)}", stdin=bundle.data, timeout=600)
        if r.returncode != 0:
            call(self.target, f"rm -rf {tmp}")
            raise LaunchError(
                f"the code could not be written on {self.target.destination} under {self.root}: "
                f"{cause(r.stderr)} (a full disk or a directory you may not write: free space "
                "there, or set cluster.remote_dir)"
            )
        return home

    def check(self, cwd: str, words: list[str]) -> int | None:
        """The command as a dry run there: None where it plans, else its exit status, its output
        shown here (a refusal: exit 2, nothing submitted, nothing created here or there)."""
        script = command_script(self.hpctrain, cwd, [*words, "--dry-run"])
        r = call(self.target, "sh -s", stdin=script.encode(), timeout=600)
        if r.returncode == 0:
            return None
        sys.stdout.write(r.stdout.decode(errors="replace"))
        sys.stderr.write(r.stderr.decode(errors="replace"))
        return r.returncode

    def run(self, cwd: str, words: list[str], follow_up: str = "") -> int:
        """`hpctrain WORDS` there, in `cwd`, its output shown here as it comes; its exit status.
        With `follow_up` (what to run here to follow it again), the command runs detached from the
        connection there (detached_script): a dropped connection, or Ctrl-C here, leaves it
        running, and the error says how to follow it."""
        if follow_up:
            session = f"{self.root}/sessions/{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
            script = detached_script(self.hpctrain, cwd, words, session)
        else:
            script = command_script(self.hpctrain, cwd, words)
        argv = self.target.argv("sh -s", interactive=interactive())
        try:
            proc = subprocess.run(argv, input=script.encode(), stdout=sys.stdout, stderr=sys.stderr)
        except KeyboardInterrupt:
            if follow_up:
                print(f"hpctrain: it goes on on {self.target.destination}: {follow_up}", file=sys.stderr)
            raise
        if proc.returncode == SSH_FAILED:  # ssh's own failure, its reason printed above
            goes_on = f"; the command goes on there: {follow_up}" if follow_up else ""
            raise LaunchError(f"the connection to {self.target.destination} was lost (ssh exit 255){goes_on}")
        return proc.returncode

    def pull(self, remote_dir: str, local: Path) -> None:
        """The records, summary, report and plots of `remote_dir` into `local` (never the code
        snapshot, pickles or weights); only regular files and directories inside it are taken."""
        skip = " ".join(f"--exclude=./{x}" for x in LEFT_THERE)
        r = call(self.target, f"tar -c -f - -C {shlex.quote(remote_dir)} {skip} .", timeout=600)
        if r.returncode != 0:
            raise LaunchError(f"could not fetch {remote_dir}: {cause(r.stderr)}")
        unpack(r.stdout, local)


def unpack(data: bytes, into: Path) -> None:
    """A fetched archive into `into`: regular files and directories whose names stay inside it;
    anything else (a link, a device, `..`, an absolute name) is refused, not written."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            name = Path(m.name)
            if name.is_absolute() or ".." in name.parts or not (m.isfile() or m.isdir()):
                raise RecordError(f"the fetched records hold {m.name!r}, which is not a file inside the run")
            dest = into / name
            if m.isdir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            if src is not None:
                records.write_atomic(dest, src.read())
