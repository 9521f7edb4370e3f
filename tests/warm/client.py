"""A rank's stand-in under mpirun: hands its argv, environment, working directory and standard
streams to the warm zygote (tests/warm/zygote.py), which forks the rank from a process that has
imported torch already; forwards the signals it gets to that rank and leaves as the rank left.
Standard library only, started with -I -S: its own start costs some 20 ms, not a rank's 2 s."""

import array
import ctypes
import json
import os
import signal
import socket
import struct
import sys

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGQUIT,
)


def zygote() -> str:
    """The zygote's socket; on a node of SLURM 24.11's root file system (slurm/rootfs.sh marks
    it), the one started inside that root (tests/conftest.py), whose libraries are the node's."""
    path = os.environ["HPCTRAIN_TEST_ZYGOTE"]
    if os.path.exists("/etc/hpctrain-slurm-root") and os.path.exists(f"{path}.rooted"):
        return f"{path}.rooted"
    return path


def main() -> None:
    # as the rank does itself (hpctrain/lifeline.py): gone with mpirun, and its rank with it
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    rank: list[int] = []  # its pid, once the zygote has forked it
    pending: list[int] = []  # signals that came before

    def forward(sig: int, _frame: object) -> None:
        if not rank:
            pending.append(sig)
            return
        try:
            os.kill(rank[0], sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0)
    os.umask(mask)
    request = json.dumps(
        {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "umask": mask}
    ).encode()
    fds = array.array("i", [0, 1, 2])
    try:
        conn.connect(zygote())
        conn.sendmsg(
            [struct.pack("!I", len(request)), request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
        )
        reader = conn.makefile("rb")
        answer = reader.readline()
    except OSError:  # no zygote answers (gone): a rank is never lost to it
        answer = b"cold\n"
    if answer == b"cold\n":  # the zygote's start differs from the one asked for: start as asked
        conn.close()
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        for sig in pending:  # what would have met the process this early
            os.kill(os.getpid(), sig)
        os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
    rank.append(int(answer))
    for sig in pending:
        forward(sig, None)
    line = reader.readline()  # the zygote writes the rank's wait status when it has ended
    status = int(line) if line else 137 << 8
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


main()
