"""What a run has done so far, as `hpctrain status` shows it: its last step and its throughput,
defined as the summary and the sweep table define it. Reads the records only."""

from __future__ import annotations

import math
from pathlib import Path

from hpctrain import records
from hpctrain.errors import RecordError
from hpctrain.records.restarts import counted, read_restarts


def progress_of(run_dir: Path) -> str:
    """Latest step and throughput from rank 0's step records (a partial last line is skipped);
    between the attempts of a restart, and after a supervisor killed there, from the attempt set
    aside (steps-rank0.jsonl.N, the newest), so the progress made is not shown as none."""
    steps: list[records.StepRecord] = []
    current = run_dir / records.steps_file(0)
    kept = sorted(
        run_dir.glob(f"{current.name}.*"), key=lambda p: int(p.suffix[1:]) if p.suffix[1:].isdigit() else -1
    )
    for path in [current, *reversed(kept)]:
        try:
            steps = records.read_steps(path)
        except RecordError:
            continue
        if steps:
            break
    done = read_restarts(run_dir)
    n = len(counted(done))
    restarted = f", {n} restart{'s' if n > 1 else ''}" if n else ""
    restarted += ", start retried" if len(done) > n else ""
    if not steps:
        return "-" + restarted
    return f"step {steps[-1].step + 1}, {_throughput(run_dir, steps)}{restarted}"


def _throughput(run_dir: Path, steps: list[records.StepRecord]) -> str:
    """The throughput as the summary and the sweep table define it, the mean over the timed steps
    (global batch x steps / their time): the summary's once the run has one, else rank 0's timed
    steps so far; during warm-up, the last step's, said to be so. The status table's caption
    says so (PROGRESS_NOTE): the cell stays narrow."""
    try:
        s = records.read(run_dir / records.SUMMARY, records.RunSummary)
    except (OSError, RecordError):
        s = None
    if s is not None and math.isfinite(s.throughput_samples_per_s):
        return f"{s.throughput_samples_per_s:.1f} samples/s"
    timed = [r for r in steps if r.timed and r.samples_per_s > 0]
    if not timed:
        return f"{steps[-1].samples_per_s:.1f} samples/s (warm-up)"
    mean = len(timed) / sum(1 / r.samples_per_s for r in timed)  # batch x steps / their time
    return f"{mean:.1f} samples/s"


PROGRESS_NOTE = (
    "progress: the last step, and the throughput as the run's summary defines it (the mean over the "
    "timed steps; while a run goes on, rank 0's so far)"
)
