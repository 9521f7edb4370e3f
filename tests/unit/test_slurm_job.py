"""What a SLURM task does once its training finished (launch/slurm/job.py), in a real Python
process: the result is written and the process leaves without the interpreter's teardown, where
torch's process-group threads once aborted a finished DDP rank (SIGABRT, the job FAILED)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hpctrain import records
from hpctrain.config import load_config
from hpctrain.config.plain_yaml import to_yaml

TASK = """
import atexit, pathlib, sys
# stands for torch's and the frameworks' own exit hooks and destructors, registered before the job
atexit.register(lambda: pathlib.Path(sys.argv[2]).write_text("the interpreter's teardown ran"))
import hpctrain.rank
from hpctrain.launch.slurm.job import TrainingJob
hpctrain.rank.run = lambda run_dir, control: True  # training finished
print("returned", TrainingJob(sys.argv[1])(), end="")  # unflushed: must still come out
"""


def test_a_finished_task_leaves_without_the_interpreters_teardown(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / records.CONFIG).write_text(to_yaml(load_config(["cluster=slurm"])))
    marker = tmp_path / "teardown"
    r = subprocess.run(
        [sys.executable, "-c", TASK, str(run_dir), str(marker)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout == "returned True", r.stdout + r.stderr
    assert not marker.exists(), marker.read_text()
