"""What a run shows outside hpctrain: experiment tracking (MLflow, TensorBoard) and profiler
traces. Schema only, like schema.py; the rules are in validate.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass
class TrackingConf:
    """The `tracking` group: none | mlflow | tensorboard | both. hpctrain's driver writes the
    tracking from the run records (one tracking run per run, whatever the world size), live while
    the waiting command is present and completed at the end; `hpctrain track DIR` logs it again
    later (from a login node, for runs of an offline cluster) and never duplicates."""

    name: str = "none"  # the option chosen (conf/tracking/)
    mlflow: bool = False  # one MLflow run per run (a parent run per sweep or study)
    tensorboard: bool = False  # event files in <run dir>/tensorboard (one writer, all ranks' tags)
    # MLflow tracking URI (a server, or sqlite:///path.db); null = sqlite:///<output_root>/mlflow.db
    # with artifacts in <output_root>/mlartifacts: no server, no network
    uri: Optional[str] = None
    experiment: Optional[str] = None  # null = run.name (a sweep or study: its directory's name)


@dataclass
class ProfileConf:
    """torch.profiler over a window of steps: one Chrome trace per rank in <run dir>/traces/."""

    enabled: bool = False  # profile a window of steps with torch.profiler
    # the first and last profiled step (both included); null = the 3 steps after the warm-up
    steps: Optional[List[int]] = None
    ranks: Optional[List[int]] = None  # the ranks that profile; null = all
    memory: bool = False  # also record allocations (the trace's memory view)
    record_shapes: bool = False  # also record the operators' input shapes
    with_stack: bool = False  # Python stacks of the operators (larger traces)
    horovod_timeline: bool = False  # also Horovod's timeline of the window (engine=horovod)

    def window(self, warmup_steps: int) -> tuple[int, int]:
        """The first and last profiled step."""
        if self.steps is None:
            return warmup_steps, warmup_steps + 2
        first, last = self.steps
        return first, last
