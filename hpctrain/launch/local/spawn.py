"""Local ranks without MPI, started the way torchrun starts them: one process per rank with RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (the torch engines meet at
that store; Horovod over Gloo at the launcher's rendezvous).

It stands where mpirun stands in a local plan and speaks mpirun's part of the contract, so the
supervisor, its logs, failure attribution and stall detection serve both:

    python -m hpctrain.launch.local.spawn -np N [--tag-output] [-x KEY=VALUE | -x KEY]... -- CMD...

- `-x KEY=VALUE` sets a variable for every rank; `-x KEY` passes this process's own value;
- `--tag-output` prefixes each line a rank writes as mpirun does: "[1,R]<stdout>:text";
- the first rank to fail is reported in mpirun's words ("process rank R with PID P on node H
  exited with status C", or "... exited on signal S (NAME)"), the others are stopped (SIGTERM, then
  SIGKILL), and the exit status is the failed rank's (128 + signal for a signal);
- SIGTERM, SIGINT or SIGHUP stop every rank the same way.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

GRACE_S = 5.0  # after SIGTERM, how long ranks may take to leave before SIGKILL


class UsageError(ValueError):
    pass


@dataclass
class Args:
    ranks: int
    tag: bool = False
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)


def parse(argv: Sequence[str], environ: dict[str, str]) -> Args:
    """The command line (mpirun's flags that a local plan uses)."""
    args, rest = Args(0), list(argv)
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        if flag == "--tag-output":
            args.tag = True
        elif flag in ("-np", "-x") and rest:
            value = rest.pop(0)
            if flag == "-np":
                if not value.isdigit() or int(value) < 1:
                    raise UsageError(f"-np takes a positive number of ranks, not {value!r}")
                args.ranks = int(value)
            else:
                key, eq, val = value.partition("=")
                args.env[key] = val if eq else environ.get(key, "")
        else:
            raise UsageError(f"unknown or incomplete option {flag!r}")
    args.command = rest[1:]
    if not args.ranks or not args.command:
        raise UsageError("usage: python -m hpctrain.launch.local.spawn -np N [-x K=V]... -- COMMAND...")
    return args


def rank_environment(base: dict[str, str], extra: dict[str, str], rank: int, world: int) -> dict[str, str]:
    """One rank's environment: torchrun's variables (the user's own MASTER_* win)."""
    env = {**base, **extra}
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        HPCTRAIN_SPAWNED="1",
    )
    return env


def failure_report(rank: int, pid: int, code: int) -> str:
    """mpirun's wording (hpctrain.launch.output parses it): a negative code is a signal."""
    host = socket.gethostname()
    if code < 0:
        name = signal.strsignal(-code) or f"signal {-code}"
        return f"process rank {rank} with PID {pid} on node {host} exited on signal {-code} ({name})."
    return f"process rank {rank} with PID {pid} on node {host} exited with status {code}"


class Ranks:
    """The rank processes and the threads that forward their output."""

    def __init__(self, args: Args) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.readers: list[threading.Thread] = []
        # (rank, exit code) in the order the ranks ended: the first failure is the cause, the
        # others' (a peer's connection reset) its consequence
        self.ended: queue.Queue[tuple[int, int]] = queue.Queue()

    def start(self) -> None:
        base = dict(os.environ)
        for r in range(self.args.ranks):
            env = rank_environment(base, self.args.env, r, self.args.ranks)
            p = subprocess.Popen(self.args.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.procs.append(p)
            threading.Thread(target=lambda r=r, p=p: self.ended.put((r, p.wait())), daemon=True).start()
            for name, stream, out in (("stdout", p.stdout, sys.stdout), ("stderr", p.stderr, sys.stderr)):
                t = threading.Thread(target=self._forward, args=(r, name, stream, out), daemon=True)
                t.start()
                self.readers.append(t)

    def _forward(self, rank: int, name: str, stream: IO[bytes] | None, out: IO[str]) -> None:
        if stream is None:
            return
        tag = f"[1,{rank}]<{name}>:" if self.args.tag else ""
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            with self.lock:
                out.write(tag + line + ("" if line.endswith("\n") else "\n"))
                out.flush()

    def wait_first_failure(self, stop: threading.Event) -> tuple[int, int] | None:
        """(rank, exit code) of the first rank to fail; None when every rank succeeded or a stop
        signal came first."""
        left = len(self.procs)
        while left and not stop.is_set():
            try:
                rank, code = self.ended.get(timeout=0.1)
            except queue.Empty:
                continue
            left -= 1
            if code != 0:
                return rank, code
        return None

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Every rank still running gets `sig`, then SIGKILL after the grace period."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)
        deadline = time.monotonic() + GRACE_S
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def drain(self) -> None:
        for t in self.readers:
            t.join(timeout=5)


def supervise(ranks: Ranks, stop: threading.Event) -> int:
    """Wait for every rank to succeed, the first to fail, or a stop signal; the exit status."""
    failed = ranks.wait_first_failure(stop)
    if failed is None and not stop.is_set():
        ranks.drain()
        return 0
    ranks.stop()
    ranks.drain()
    if failed is None:
        return 128 + signal.SIGTERM
    rank, code = failed
    print(failure_report(rank, ranks.procs[rank].pid, code), file=sys.stderr, flush=True)
    return code if code > 0 else 128 - code


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv, dict(os.environ))
    except UsageError as e:
        print(f"hpctrain spawn: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    ranks = Ranks(args)
    try:
        ranks.start()
    except OSError as e:
        ranks.stop()
        print(f"hpctrain spawn: cannot start {args.command[0]!r}: {e}", file=sys.stderr)
        return 127
    return supervise(ranks, stop)


if __name__ == "__main__":
    sys.exit(main())
