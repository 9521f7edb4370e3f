"""torch.profiler over a window of steps (profile.*): one Chrome trace per rank in
<run dir>/traces/rank{R}.pt.trace.json, and Horovod's timeline of the same window if asked.

The profiler starts one step before the window (its start-up cost falls there) and stops once the
window's last step is recorded; outside that, nothing is recorded and the trace is written after
the last step. Inside it, every phase the trainer tells
the watchdog (data, compute, comm, optimizer, ...) becomes a record_function range named
`hpctrain/<phase>#<step>`: the trace summary (analysis/traces.py) reads the steps and their
phases from them, whatever the engine (Horovod's collectives run outside torch's dispatcher and
leave no operator of their own in the trace)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hpctrain.config.schema import Config
from hpctrain.engine.base import Engine, Timeline
from hpctrain.train.watchdog import Watchdog

TRACES = "traces"
MARK = "hpctrain/"  # the prefix of the phase ranges


def trace_path(run_dir: Path, rank: int) -> Path:
    return run_dir / TRACES / f"rank{rank}.pt.trace.json"


class StepProfiler:
    """Listens to the watchdog's phases; profiles steps first..last of one rank."""

    def __init__(self, cfg: Config, rank: int, run_dir: Path, engine: Engine) -> None:
        pr = cfg.profile
        self.first, self.last = pr.window(cfg.train.warmup_steps)
        # started one step early (torch.profiler.schedule's warm-up): the profiler's start-up
        # (seconds, the first time) falls on a step outside the window, not on its first
        self.start = max(self.first - 1, 0)
        self.rank, self.run_dir = rank, run_dir
        self.timeline = engine if isinstance(engine, Timeline) and pr.horovod_timeline else None
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof: Any = profile(
            activities=activities,
            profile_memory=pr.memory,
            record_shapes=pr.record_shapes,
            with_stack=pr.with_stack,
        )
        self.running = False
        self.done = False
        self.mark: Any = None

    def phase(self, name: str, step: int) -> None:
        if self.done or (not self.running and (name != "data" or step != self.start)):
            return  # outside the window: one comparison per phase
        if not self.running:
            self._start()
        elif name == "data" and step > self.last:
            self._stop()
            return
        self._end_mark()
        if step >= self.first:
            self.mark = record_function(f"{MARK}{name}#{step}")
            self.mark.__enter__()

    def _start(self) -> None:
        trace_path(self.run_dir, self.rank).parent.mkdir(parents=True, exist_ok=True)
        if self.timeline is not None:
            self.timeline.start_timeline(self.run_dir / TRACES / "horovod_timeline.json")
        self.prof.start()
        self.running = True

    def _end_mark(self) -> None:
        if self.mark is not None:
            self.mark.__exit__(None, None, None)
            self.mark = None

    def _stop(self) -> None:
        self._end_mark()
        self.prof.stop()
        self.running, self.done = False, True
        if self.timeline is not None:
            self.timeline.stop_timeline()

    def close(self) -> None:
        """After the last step: write the trace (a shorter one when the run stopped inside the
        window). Written here rather than when the window ends, so no timed step pays for it."""
        if self.running:
            self._stop()
        if not self.done:
            return
        path = trace_path(self.run_dir, self.rank)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        self.prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)  # a reader never sees half a trace
        self.done = False


def attach(cfg: Config, rank: int, run_dir: Path, engine: Engine, watch: Watchdog) -> StepProfiler | None:
    """The profiler of this rank, listening to its phases (None: this rank does not profile)."""
    pr = cfg.profile
    if not pr.enabled or (pr.ranks is not None and rank not in pr.ranks):
        return None
    p = StepProfiler(cfg, rank, run_dir, engine)
    watch.listener = p.phase
    return p
