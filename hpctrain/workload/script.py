"""Running the user's script on a rank: as `python script.py ARGS` would (as __main__, with its
directory first on sys.path and its arguments in sys.argv), inside hpctrain's rank process, so
that failures are recorded, the rank dies with its launcher, and the records and summary follow.

Every rank writes its own result (result-rank{R}.json); rank 0 gathers them through the run
directory, not a collective, because the script may already have shut its framework down.
"""

from __future__ import annotations

import dataclasses
import math
import os
import runpy
import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from hpctrain import api, heap, records
from hpctrain.config.schema import Config
from hpctrain.engine.world import CommError, export_torch_env, gloo_env, gloo_timeout_env, launcher_world
from hpctrain.lifeline import become_subreaper, end_descendants
from hpctrain.train.memory import host_peak_bytes
from hpctrain.train.stats import rank_stats, summarize
from hpctrain.workload.code import CODE_DIR_VAR
from hpctrain.workload.pattern import compile_pattern
from hpctrain.workload.script_watch import Noticing, PassThrough, ScriptWatchdog

SCRIPT_VAR = "HPCTRAIN_SCRIPT"
GATHER_TIMEOUT_S = 120.0


class ScriptExit(RuntimeError):
    """The script ended with a non-zero exit status."""

    quiet = True  # the script's own output says why; hpctrain's stack would not


class Tee(PassThrough):
    """Rank 0's stdout, passed through, with the last match of the throughput pattern kept (RE2:
    linear time in the line's length). A match that is not a finite positive number is refused,
    naming the line, and the last good value kept."""

    MAX_LINE = 1 << 16  # a line longer than this is matched on its last 64 KiB

    def __init__(self, out: TextIO, pattern: Any) -> None:
        super().__init__(out)
        self.pattern, self.partial = pattern, ""
        self.value: float | None = None
        self.refused: set[str] = set()

    def write(self, text: str) -> int:
        self.out.write(text)
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        self.partial = self.partial[-self.MAX_LINE :]
        for line in lines:
            m = self.pattern.search(line[-self.MAX_LINE :])
            if m:
                self._take(m.group(1), line)
        return len(text)

    def _take(self, text: str, line: str) -> None:
        try:
            value = float(text)
        except (TypeError, ValueError):
            value = float("nan")
        if math.isfinite(value) and value > 0:
            self.value = value
        elif text not in self.refused:  # once per distinct value: a loop may print it every step
            self.refused.add(text)
            print(
                f"hpctrain: script.throughput_regex read {text!r}, not a finite positive number of "
                f"samples/s, from the line: {line[:200]!r} (ignored)",
                file=sys.stderr,
                flush=True,
            )


def prepare_environment(cfg: Config, run_dir: Path, plan: records.PlanRecord) -> None:
    """What the script's framework expects (torch.distributed, Horovod over Gloo), and the check
    that the launcher started the world the plan has."""
    env = os.environ
    world = launcher_world(env)
    if world is not None and world != plan.world_size:
        raise CommError(
            f"the launcher started {world} rank(s) but the plan has {plan.world_size}; "
            "the launcher and the plan disagree"
        )
    export_torch_env(env)
    if cfg.parallelism.backend == "gloo" and "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env:
        # Horovod's identity; the rendezvous is the launcher's (or the SLURM job's: launch/slurm/job.py)
        env.update(gloo_env(env))
        env.update(gloo_timeout_env(env, cfg.script.stall_timeout_s))
    env.update(
        {
            api.RUN_DIR_VAR: str(run_dir),
            "HPCTRAIN_BATCH_PER_RANK": str(plan.batch.per_rank),
            "HPCTRAIN_GLOBAL_BATCH": str(plan.batch.global_),
            "HPCTRAIN_STEPS": str(cfg.train.steps),
            "HPCTRAIN_WARMUP_STEPS": str(cfg.train.warmup_steps),
        }
    )


def run_script(cfg: Config, run_dir: Path, plan: records.PlanRecord) -> bool:
    """Run the script on this rank; True if it finished, False if it left to be requeued (it saw
    api.should_stop() after the launcher's api.request_stop())."""
    prepare_environment(cfg, run_dir, plan)
    heap.release()  # the script runs under Python's own collector, as it would alone
    script = Path(os.environ.get(SCRIPT_VAR) or str(cfg.script.path))
    rank = int(os.environ.get("RANK", "0"))
    tee = None
    out, err = sys.stdout, sys.stderr
    if rank == 0 and cfg.script.throughput_regex:
        out = tee = Tee(sys.stdout, compile_pattern(cfg.script.throughput_regex))
    watch = None
    if cfg.script.stall_timeout_s > 0:
        watch = ScriptWatchdog(run_dir, rank, plan.world_size, cfg.script.stall_timeout_s)
        out, err = Noticing(out, watch), Noticing(err, watch)
        watch.start()
    started = time.time()
    become_subreaper()  # what the script starts, detached or not, is this rank's to end
    try:
        _run_as_main(script, list(cfg.script.args), os.environ.get(CODE_DIR_VAR), out, err)
    finally:
        if watch is not None:
            watch.stop()
        left = end_descendants()
        if left:
            print(f"hpctrain: processes {left} of the script would not end", file=sys.stderr, flush=True)
    finished = time.time()
    steps = api._finish()
    if api._state.stopped:
        return False
    topology = os.environ.get("SLURM_TOPOLOGY_ADDR", "")
    result = rank_stats(steps, rank, socket.gethostname(), host_peak_bytes(), 0, topology=topology)
    if not steps:  # no api.step calls: the wall time of the whole script
        result = dataclasses.replace(result, wall_s=finished - started)
    records.write(run_dir / records.script_result_file(rank), result)
    if rank == 0:
        everyone = _gather(run_dir, plan.world_size)
        summary = summarize(
            everyone,
            plan.batch.global_,
            started=started,
            finished=finished,
            precision=str(cfg.precision.name),
            model=f"script:{script.name}",
            backend=str(cfg.parallelism.backend),
            compression=str(cfg.parallelism.compression),
            engine="script",
        )
        if not steps:
            value = tee.value if tee is not None else None
            summary = _from_printed(summary, value)
        records.write(run_dir / records.SUMMARY, summary)
    return True


# What the script made, kept until the rank leaves with os._exit (hpctrain/rank.py), as `python
# script.py` keeps its module's globals until the interpreter's teardown. Freed mid-process, a DDP
# model whose process group the script destroyed would take the group down in ~Reducer with the
# GIL held, while Gloo's worker thread waits for the GIL to free its last work's thread-local state
# (backward's stashed context): a deadlock at the script's end (pytorch/pytorch#56297).
_KEPT: list[object] = []


def _run_as_main(script: Path, args: list[str], code: str | None, out: TextIO, err: TextIO) -> None:
    """`python script.py args` inside this process, its output through `out` and `err`; a
    non-zero sys.exit is a ScriptExit. The script's objects outlive the call (_KEPT)."""
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))
    if code:
        os.chdir(code)  # the job runs from its code (the snapshot on SLURM)
    saved, saved_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        _KEPT.append(runpy.run_path(str(script), run_name="__main__"))
    except BaseException as e:
        _KEPT.append(e.__traceback__)  # its frames hold the script's globals
        if not isinstance(e, SystemExit):
            raise
        if e.code not in (0, None):
            raise ScriptExit(f"{script.name} exited with status {e.code}") from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved, saved_err


def _gather(run_dir: Path, world: int) -> list[records.RankSummary]:
    """Every rank's result file; the ranks end within moments of each other."""
    deadline = time.monotonic() + GATHER_TIMEOUT_S
    paths = [run_dir / records.script_result_file(r) for r in range(world)]
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            missing = [str(r) for r, p in enumerate(paths) if not p.exists()]
            raise ScriptExit(
                f"rank(s) {', '.join(missing)} did not finish the script within {GATHER_TIMEOUT_S:.0f} s of rank 0"
            )
        time.sleep(0.1)
    return [records.read(p, records.RankSummary) for p in paths]


def _from_printed(summary: records.RunSummary, value: float | None) -> records.RunSummary:
    """A script that reports no steps: throughput is what it printed (script.throughput_regex),
    or unknown (NaN)."""
    throughput = value if value is not None else float("nan")
    return dataclasses.replace(
        summary, throughput_samples_per_s=throughput, throughput_per_rank=throughput / summary.world_size
    )


def script_environment(cfg: Config) -> dict[str, object]:
    """env.json's part for a script run: the script, and what the rank process can tell of the
    frameworks without starting them."""
    rec: dict[str, object] = {}
    rec["script"] = {"path": os.environ.get(SCRIPT_VAR) or cfg.script.path, "args": list(cfg.script.args)}
    try:
        import horovod

        rec["horovod"] = horovod.__version__
    except ImportError:
        pass
    return rec
