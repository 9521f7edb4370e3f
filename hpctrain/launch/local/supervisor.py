"""The local launcher's supervisor: a small detached process that runs mpirun for one run (or for
the runs of a local sweep or study, one after another) and outlives the `hpctrain` command that
started it, so that `hpctrain run --no-wait`, status, logs and cancel work for local runs.

    python -m hpctrain.launch.local.supervisor [--parent PID] RUN_DIR [RUN_DIR ...]

It splits mpirun's rank-tagged output into logs/rank{R}.log (mpirun's own lines into
logs/launcher.log), records each run's state in state.json, and names the failed rank. It is the
leader of its own process group, which holds mpirun and the ranks, and their subreaper: what a
rank forked and left running (a killed script's pool workers) is ended when mpirun is. SIGTERM, SIGINT or SIGHUP
stops the current run (mpirun forwards the signal to the ranks; SIGKILL to the whole group after
a grace period) and marks it and the runs still waiting as CANCELLED. With --parent it does the
same when that process (the waiting `hpctrain run`) disappears, unless it released the runs
first (a `released` file in a run directory: it gave up waiting after --timeout-min).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from hpctrain import records
from hpctrain.events import PREFIX as EVENT
from hpctrain.facts import free_tcp_port
from hpctrain.launch.local.outcome import (
    before_cancel,
    failure_of,
    gone_before,
    never_started,
    ranks_gone,
    unwritable,
)
from hpctrain.launch.output import Demux
from hpctrain.launch.plan import AT_LAUNCH
from hpctrain.lifeline import become_subreaper, end_descendants, with_lifeline
from hpctrain.records import State, restarts

TERM_GRACE_S = 10.0
PARENT_POLL_S = 0.5


class StartError(Exception):
    """mpirun could not be started (not found, not executable)."""


@contextmanager
def _log(path: Path) -> Iterator[IO[str]]:
    """A log opened for appending, closed without raising: a full disk is reported once, by the
    writes (Supervisor._keep), not again by the flush at close."""
    f = open(path, "a", buffering=1)  # noqa: SIM115 - closed below
    try:
        yield f
    finally:
        with suppress(OSError):
            f.close()


class Cancelled(Exception):
    """A stop signal arrived (or the waiting parent went away)."""


STATE_RESERVE = 16384  # bytes state.json keeps while a run is live: its outcome fits a full disk


def write_state(run_dir: Path, state: str, at: float | None = None, **extra: Any) -> None:
    """state.json, atomically, as of `at` (None: now). A live state is padded with blanks (valid
    JSON) to STATE_RESERVE bytes, so that when the file system is full the outcome still
    overwrites it in place."""
    old = _read_state(run_dir)
    started = old.started if old and old.started is not None else None
    if state == State.RUNNING and not (old and old.state == State.RUNNING):  # a restart keeps it
        started = time.time()
    rec = records.new(
        records.LocalState, state=state, updated=time.time() if at is None else at, started=started, **extra
    )
    text = json.dumps(records.to_dict(rec), indent=2, sort_keys=True, default=str) + "\n"
    path = run_dir / records.STATE
    if state in (State.PENDING, State.RUNNING):
        text = text.ljust(STATE_RESERVE)
    try:
        records.write_atomic(path, text)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not _overwrite(path, text):
            raise


def _overwrite(path: Path, text: str) -> bool:
    """Rewrite `path` in place within its present size (no new blocks), padded with blanks."""
    raw = text.encode()
    try:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if len(raw) > size:
                return False
            f.write(raw.ljust(size))
            f.flush()
            os.fsync(f.fileno())
        return True
    except OSError:
        return False


def _read_state(run_dir: Path) -> records.LocalState | None:
    try:
        return records.read(run_dir / records.STATE, records.LocalState)
    except records.RecordError:
        return None


def _pump(stream: IO[str], name: str, out: queue.Queue[tuple[str, str] | None]) -> None:
    """Lines of one of mpirun's streams, then None: always, or the supervisor would wait forever."""
    try:
        for raw in stream:
            out.put((name, raw.rstrip("\n")))
    except (OSError, ValueError) as e:
        out.put((name, f"hpctrain: stopped reading mpirun's {name}: {e}"))
    finally:
        out.put(None)


class Supervisor:
    def __init__(self, run_dirs: list[Path], parent: int | None) -> None:
        self.run_dirs = run_dirs
        self.parent = parent
        self.proc: subprocess.Popen[str] | None = None
        self.cancelled = threading.Event()
        self.write_error: str | None = None  # the first log write that failed (a full disk)
        self.current: Path | None = None  # the run an attempt is running
        self.gone: dict[int, int] = {}  # rank -> pid of ranks already dead when the cancel came

    def on_signal(self, signum: int, _frame: object) -> None:
        if self.current is not None and not self.cancelled.is_set():
            self.gone = ranks_gone(self.current)  # before the cancel stops them all
        self.cancelled.set()
        self.stop_mpirun()

    def watch_parent(self) -> None:
        while not self.cancelled.is_set():
            if os.getppid() != self.parent:  # re-parented: the waiting hpctrain is gone
                if not any((d / records.RELEASED).exists() for d in self.run_dirs):
                    os.kill(os.getpid(), signal.SIGTERM)  # it did not let go (killed, or Ctrl-C)
                return
            time.sleep(PARENT_POLL_S)

    def stop_mpirun(self) -> None:
        """SIGTERM to mpirun (it forwards it to the ranks); SIGKILL the group if it lingers."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()

        def reap() -> None:
            try:
                proc.wait(TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(os.getpgid(0), signal.SIGKILL)  # ends this supervisor too: nothing is left

        threading.Thread(target=reap, daemon=True).start()

    def run_all(self) -> int:
        worst = 0
        for run_dir in self.run_dirs:
            if self.cancelled.is_set():
                write_state(run_dir, State.CANCELLED)
                continue
            worst = max(worst, self.run_one(run_dir))
        return worst

    def run_one(self, run_dir: Path) -> int:
        """The run's attempts: the first, then a restart after each failure a restart can outlive,
        up to the plan's max_restarts (restarts.py)."""
        try:
            plan = records.read_json(run_dir / records.PLAN)
            argv: list[str] = plan["argv"]
            world = int(plan["world_size"])
        except (records.RecordError, KeyError, TypeError, ValueError) as e:
            write_state(run_dir, State.FAILED, launch_error=f"cannot read the plan: {e}")
            return 1
        attempt = 0
        while True:
            started = time.time()
            outcome = self.attempt(run_dir, plan, argv, world, attempt)
            if not isinstance(outcome, records.Failure):
                return outcome
            restart = restarts.restart_for(run_dir, outcome.cause, outcome.rank, 1, started)
            restarts.set_aside(run_dir)
            restarts.record(run_dir, restart)
            with _log(run_dir / records.LAUNCHER_LOG) as f:  # what the waiting command follows
                self._keep(f, f"hpctrain: {restart.describe()}")
            attempt += 1

    def attempt(
        self, run_dir: Path, plan: dict[str, Any], argv: list[str], world: int, attempt: int
    ) -> int | records.Failure:
        """One attempt: mpirun until it ends; its outcome in state.json, and the exit status, or
        the failure when a restart may outlive it (the run stays RUNNING meanwhile)."""
        env = dict(os.environ)
        env[restarts.ATTEMPT_VAR] = str(attempt)
        self.current, self.gone = run_dir, {}
        rendezvous = None
        self.write_error = None
        write_state(run_dir, State.RUNNING)
        try:
            if plan.get("env", {}).get("HOROVOD_GLOO_RENDEZVOUS_PORT") == AT_LAUNCH:
                rendezvous = _gloo_rendezvous(plan["env"].get("HPCTRAIN_GLOO_HOSTNAME", "localhost"), world)
                env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(rendezvous.port)
            if plan.get("env", {}).get("MASTER_PORT") == AT_LAUNCH:  # torch.distributed scripts
                env["MASTER_PORT"] = str(free_tcp_port())
            code, tails, mpirun_text = self.run_mpirun(run_dir, argv, env, world)
        except StartError as e:
            write_state(
                run_dir,
                State.FAILED,
                launch_error=f"cannot start {argv[0]!r}: {e}; install "
                "OpenMPI (apt-get install openmpi-bin) or set cluster.mpirun",
            )
            return 3
        finally:
            if rendezvous is not None:
                rendezvous.close()
        if self.cancelled.is_set():
            # a rank that had failed before the cancel (killed from outside) is still recorded; a
            # negative status is mpirun's own death while it was being stopped, not the run's
            kept = before_cancel(run_dir, code, tails, mpirun_text) or gone_before(self.gone)
            write_state(run_dir, State.CANCELLED, exit_code=code if code >= 0 else None, failure=kept)
            return 130
        if code == 0 and records.result_written(run_dir):
            write_state(run_dir, State.COMPLETED, exit_code=0)
            return 0
        if code > 0 and never_started(run_dir, tails, mpirun_text):
            said = "\n".join(mpirun_text.strip().splitlines()[-15:]) or "(it printed nothing)"
            write_state(
                run_dir,
                State.FAILED,
                exit_code=code,
                launch_error=f"{argv[0]} failed before any rank started (exit status {code}):\n{said}\n"
                "check cluster.mpirun and cluster.extra_args",
            )
            return 3
        failure = (
            failure_of(run_dir, code, tails, mpirun_text)
            if code != 0
            else records.Failure(0, "mpirun exited 0 but rank 0 wrote no summary.json")
        )
        if self.write_error is not None:  # the cause of whatever the ranks then said
            failure = records.Failure(None, unwritable(self.write_error, failure.tail), failure.tail)
        if int(plan.get("max_restarts", 0)) > 0:
            why_not = (
                restarts.why_not(run_dir, int(plan["max_restarts"]), attempt)
                if self.write_error is None
                else "not restarted: the run directory cannot be written"
            )
            if why_not is None:
                write_state(run_dir, State.RUNNING, exit_code=code, failure=failure)  # restarting
                return failure
            failure = dataclasses.replace(failure, cause=f"{failure.cause}\n{why_not}")
        write_state(run_dir, State.FAILED, exit_code=code, failure=failure)
        return 4

    @staticmethod
    def _end_leftovers(proc: subprocess.Popen[str]) -> None:
        proc.wait()
        end_descendants()

    def _keep(self, f: IO[str], text: str) -> None:
        """A line into its log. A write that fails (a full disk) is remembered, once, and the
        streams are still drained: mpirun must never block on a pipe nobody reads."""
        if self.write_error is not None:
            return
        try:
            f.write(text + "\n")
        except OSError as e:
            self.write_error = (
                f"{e.strerror or e} (errno {errno.errorcode.get(e.errno or 0, e.errno)}) writing {f.name}"
            )

    def run_mpirun(
        self, run_dir: Path, argv: list[str], env: dict[str, str], world: int
    ) -> tuple[int, dict[int | None, deque[str]], str]:
        tails: dict[int | None, deque[str]] = defaultdict(lambda: deque(maxlen=20))
        mpirun_text: list[str] = []
        q: queue.Queue[tuple[str, str] | None] = queue.Queue()
        with ExitStack() as stack:
            logs = {r: stack.enter_context(_log(run_dir / records.log_file(r))) for r in range(world)}
            own = stack.enter_context(_log(run_dir / records.LAUNCHER_LOG))
            try:
                self.proc = subprocess.Popen(
                    with_lifeline(argv, "TERM"),  # mpirun stops the ranks if this supervisor is killed
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    errors="backslashreplace",  # a rank's bytes need not be UTF-8 (nor whole characters)
                    bufsize=1,
                    env=env,
                )
            except OSError as e:
                raise StartError(e.strerror or str(e)) from e
            if self.cancelled.is_set():  # a signal that arrived while mpirun was starting
                self.stop_mpirun()
            threads = [
                threading.Thread(target=_pump, args=(s, n, q), daemon=True)
                for s, n in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr"))
            ]
            for t in threads:
                t.start()
            # what a rank forked and left behind (a script's pool workers, when the rank was killed)
            # is re-parented to this subreaper; once mpirun is done it is ended, which also closes
            # the streams it may hold
            leftovers = threading.Thread(target=self._end_leftovers, args=(self.proc,), daemon=True)
            leftovers.start()
            open_streams = len(threads)
            demux = Demux()
            while open_streams:
                item = q.get()
                if item is None:
                    open_streams -= 1
                    lines = demux.rest() if not open_streams else []
                else:
                    lines = demux.feed(item[1], item[0])
                for line in lines:
                    if line.rank is None or line.rank not in logs:
                        mpirun_text.append(line.text)
                        self._keep(own, line.text)
                        continue
                    self._keep(logs[line.rank], line.text)
                    if not line.text.startswith(EVENT):  # progress events are not what a rank said
                        tails[line.rank].append(line.text)
            code = self.proc.wait()
            # done before the next run starts: its reaping (waitpid(-1)) must never take the next mpirun
            leftovers.join()
        return code, tails, "\n".join(mpirun_text)


def _gloo_rendezvous(hostname: str, ranks: int) -> Any:
    """Horovod's HTTP rendezvous server for Gloo, run by the launcher (as horovodrun does)."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    class Rendezvous:
        def __init__(self) -> None:
            self._server = RendezvousServer(verbose=0)
            self.port = self._server.start()
            self._server.init(get_host_assignments(parse_hosts(f"{hostname}:{ranks}"), ranks))

        def close(self) -> None:
            self._server.stop()

    return Rendezvous()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain.launch.local.supervisor")
    ap.add_argument("--parent", type=int, help="cancel the runs if this process goes away")
    ap.add_argument("run_dirs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    sup = Supervisor(args.run_dirs, args.parent)
    become_subreaper()  # nothing a rank starts outlives the run (end_descendants after mpirun)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, sup.on_signal)
    if args.parent is not None:
        threading.Thread(target=sup.watch_parent, daemon=True).start()
    return sup.run_all()


if __name__ == "__main__":
    sys.exit(main())
