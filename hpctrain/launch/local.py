"""Local launch with mpirun: run directory, rendezvous (Gloo), output streaming, failure report."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from collections import defaultdict, deque
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from .. import records
from ..config.load import to_yaml
from ..config.schema import Config
from ..errors import LaunchError, RankFailure
from ..events import parse_event
from ..plan import JobPlan
from ..plan_slurm import SlurmPlan
from .output import Line, mpirun_failure, split_tag

TERM_GRACE_S = 10.0


def prepare_run_dir(run_dir: Path) -> Path:
    """Create the run directory; refuse one that already holds files (runs never share one)."""
    if run_dir.exists() and any(run_dir.iterdir()):
        raise LaunchError(f"run directory {run_dir} already exists and is not empty; "
                          "choose another run.dir (or leave it unset for a fresh dated one)")
    try:
        (run_dir / records.LOGS).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LaunchError(f"cannot create run directory {run_dir}: {e}") from e
    return run_dir


def write_run_files(run_dir: Path, cfg: Config, plan: JobPlan | SlurmPlan) -> None:
    """config.yaml (what the ranks read) and plan.json, for every launcher."""
    records.write_atomic(run_dir / records.CONFIG, to_yaml(cfg))
    records.write_json(run_dir / records.PLAN, plan.to_dict())


class GlooRendezvous:
    """Horovod's HTTP rendezvous server for Gloo, run inside the launcher (as horovodrun does)."""

    def __init__(self, hostname: str, ranks: int) -> None:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        self._server = RendezvousServer(verbose=0)
        self.port = self._server.start()
        self._server.init(get_host_assignments(parse_hosts(f"{hostname}:{ranks}"), ranks))

    def close(self) -> None:
        self._server.stop()


def _pump(stream: IO[str], name: str, out: "queue.Queue[tuple[str, str] | None]") -> None:
    for raw in stream:
        out.put((name, raw.rstrip("\n")))
    out.put(None)


def _lines(proc: subprocess.Popen[str]) -> Iterator[Line]:
    q: queue.Queue[tuple[str, str] | None] = queue.Queue()
    threads = [threading.Thread(target=_pump, args=(s, n, q), daemon=True)
               for s, n in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for t in threads:
        t.start()
    open_streams = len(threads)
    while open_streams:
        item = q.get()
        if item is None:
            open_streams -= 1
            continue
        yield split_tag(item[1], item[0])


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to mpirun's process group (mpirun forwards it to the ranks), then SIGKILL."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_local(plan: JobPlan, on_output: Callable[[Line], None],
              on_event: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Start mpirun for `plan` (run files already written); return summary.json's content.

    Every rank's lines go to logs/rank{R}.log; `on_output` sees rank 0's ordinary lines and
    mpirun's own, `on_event` rank 0's progress events. Raises RankFailure naming the rank.
    """
    run_dir = Path(plan.run_dir)
    tails: dict[int | None, deque[str]] = defaultdict(lambda: deque(maxlen=20))
    mpirun_text: list[str] = []
    with ExitStack() as stack:
        logs = {r: stack.enter_context(open(run_dir / records.log_file(r), "a"))
                for r in range(plan.world_size)}
        try:
            proc = subprocess.Popen(plan.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, bufsize=1, start_new_session=True)
        except FileNotFoundError as e:
            raise LaunchError(f"cannot start {plan.argv[0]!r}: {e.strerror}; install OpenMPI "
                              "(apt-get install openmpi-bin) or set cluster.mpirun") from e
        stack.callback(_stop, proc)
        try:
            for line in _lines(proc):
                if line.rank is None:
                    mpirun_text.append(line.text)
                    on_output(line)
                    continue
                logs[line.rank].write(line.text + "\n")
                tails[line.rank].append(line.text)
                if line.rank == 0:
                    event = parse_event(line.text)
                    if event is not None:
                        on_event(event)
                    else:
                        on_output(line)
            code = proc.wait()
        except KeyboardInterrupt:
            _stop(proc)
            raise
    if code != 0:
        raise _failure(run_dir, code, tails, "\n".join(mpirun_text))
    try:
        return records.read_json(run_dir / records.SUMMARY)
    except FileNotFoundError as e:
        raise RankFailure(0, "mpirun exited 0 but rank 0 wrote no summary.json", run_dir=str(run_dir)) from e


def _failure(run_dir: Path, code: int, tails: dict[int | None, deque[str]], mpirun_text: str) -> RankFailure:
    """The first rank that failed, from its error file, else from mpirun's report."""
    first = records.first_error(run_dir)
    if first is not None:
        rank = first.get("rank")
        return RankFailure(rank, records.describe_error(first), "\n".join(tails.get(rank, [])), str(run_dir))
    found = mpirun_failure(mpirun_text)
    if found:
        rank, cause = found
        return RankFailure(rank, cause, "\n".join(tails.get(rank, [])), str(run_dir))
    tail = "\n".join(mpirun_text.splitlines()[-15:])
    return RankFailure(None, f"mpirun exited with status {code}", tail, str(run_dir))
