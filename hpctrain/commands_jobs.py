"""`hpctrain status | logs | cancel` for SLURM runs and sweeps (by their directory)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import records
from .errors import LaunchError
from .launch.sacct import sacct
from .launch.slurm import JOB, failure_of, run_dirs_and_jobs


def _progress(run_dir: Path) -> str:
    """Latest step and throughput from rank 0's step records."""
    path = run_dir / records.steps_file(0)
    if not path.exists():
        return "-"
    last = None
    for last in records.iter_jsonl(path):
        pass
    if last is None:
        return "-"
    return f"step {last['step'] + 1}, {last.get('samples_per_s', 0):.0f} samples/s"


def status(path: Path, console: Console) -> int:
    pairs = run_dirs_and_jobs(path)
    states = sacct([j for _, j in pairs])
    table = Table(title=f"status of {path}")
    for col in ("run", "job", "state", "nodes", "elapsed", "progress", "error"):
        table.add_column(col)
    for run_dir, job_id in pairs:
        st = states.get(job_id)
        state = st.state if st else "PENDING?"
        error = ""
        if st and st.state in ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"):
            error = str(failure_of(run_dir, st)).splitlines()[0]
        color = {"COMPLETED": "green", "RUNNING": "cyan", "FAILED": "red"}.get(state, "yellow")
        table.add_row(run_dir.name, job_id, f"[{color}]{state}[/]", str(st.nodes if st else "-"),
                      st.elapsed if st else "-", _progress(run_dir), error)
    console.print(table)
    return 0


def _log_paths(run_dir: Path, rank: int) -> list[Path]:
    if (run_dir / JOB).exists():
        job = records.read_json(run_dir / JOB)
        folder = Path(job["folder"])
        return [folder / f"{job['job_id']}_{rank}_log.out", folder / f"{job['job_id']}_{rank}_log.err"]
    return [run_dir / records.log_file(rank)]  # a local (mpirun) run


def logs(run_dir: Path, rank: int, follow: bool, console: Console) -> int:
    paths = _log_paths(run_dir, rank)
    if not follow:
        found = [p for p in paths if p.exists()]
        if not found:
            raise LaunchError(f"no log for rank {rank} yet (looked for {', '.join(map(str, paths))})")
        for p in found:
            print(p.read_text(), end="")
        return 0
    offsets = {p: 0 for p in paths}
    job_id = records.read_json(run_dir / JOB)["job_id"] if (run_dir / JOB).exists() else None
    while True:
        for p in paths:
            lines, offsets[p] = records.read_new_lines(p, offsets[p])
            for line in lines:
                print(line, flush=True)
        state = sacct([job_id]).get(job_id) if job_id else None
        if job_id is None or (state is not None and state.done):
            return 0
        time.sleep(1.0)


def cancel(path: Path, console: Console) -> int:
    ids = [j for _, j in run_dirs_and_jobs(path)]
    r = subprocess.run(["scancel", *ids], capture_output=True, text=True)
    if r.returncode != 0:
        raise LaunchError(f"scancel failed: {r.stderr.strip()}")
    console.print(f"cancelled {len(ids)} job(s): {' '.join(ids)}")
    return 0
