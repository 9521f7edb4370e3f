"""The run-directory contract: every file name, and a typed record for each file.

    config.yaml          the resolved configuration (what the ranks read)
    plan.json            PlanRecord: world size, batch sizes, lr, and the launcher's details
    job.json             JobRef: launcher and job id, for status / logs / cancel
    state.json           LocalState: a local run's state, written by its supervisor
    env.json             versions, host names, MPI flavour, Horovod build (rank 0)
    container.json       cluster.container: runtime and version, image and digest, binds
    steps-rank{R}.jsonl  StepRecord per step and rank
    steps-rank{R}.jsonl.N  an earlier attempt's records, kept when a restart drops some of them
    summary.json         RunSummary: rank 0's aggregate over all ranks, written last
    error-rank{R}.json   ErrorRecord: why a rank failed, written before it exits
    heartbeat-rank{R}.json  a rank's last completed step and current phase, once a second
    stall.json, stack-rank{R}.txt  a detected stall: who held the run up, when it was found, and their stacks
    logs/rank{R}.log     everything a rank printed (local runs; SLURM keeps submitit's logs)
    logs/launcher.log    the local launcher's own output (mpirun's messages)
    model.pt             final weights (rank 0), when train.save_model is true
    checkpoints/         step-NNNNNN.pt and the `latest` pointer
    sweep.json           SweepManifest (in a sweep directory)
    study.json           StudyManifest, allreduce-n{N}.json AllreduceResult (in a study directory)
    tune.json            TuneManifest, best.yaml, trial-{K}/ run directories (in a tune directory)
    remote.json          RemoteRef: where a run, sweep or study made from here lives on a cluster behind SSH

Writes are atomic (temporary file + rename), so a reader never sees half a file; readers check
every field and raise RecordError naming the file (and line) and what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from hpctrain import bounded
from hpctrain.errors import RecordError, RecordMissing
from hpctrain.records.io import one_sync, read_new_lines, write_atomic
from hpctrain.records.states import DONE, State
from hpctrain.records.tune import TuneManifest, TuneTrial
from hpctrain.records.typed import FORMAT_VERSION, from_dict, to_dict
from hpctrain.records.types import (
    LAST_LOSS_STEPS,
    AllreduceResult,
    AllreduceRow,
    ArrayRef,
    Batch,
    ErrorRecord,
    Failure,
    JobRef,
    Layout,
    LocalState,
    MemoryBound,
    PlanRecord,
    RankNeeds,
    RankPlan,
    RankSummary,
    RemoteRef,
    RunSummary,
    StepRecord,
    StudyManifest,
    StudyRun,
    SweepManifest,
    SweepRun,
    new,
    wire_bytes_per_param,
)

__all__ = [
    "LAST_LOSS_STEPS",
    "DONE",
    "State",
    "AllreduceResult",
    "AllreduceRow",
    "ArrayRef",
    "Batch",
    "Layout",
    "ErrorRecord",
    "Failure",
    "FORMAT_VERSION",
    "JobRef",
    "LocalState",
    "PlanRecord",
    "MemoryBound",
    "RankNeeds",
    "RankPlan",
    "RankSummary",
    "RemoteRef",
    "RecordError",
    "RecordMissing",
    "RunSummary",
    "StepRecord",
    "StudyManifest",
    "StudyRun",
    "TuneManifest",
    "TuneTrial",
    "SweepManifest",
    "SweepRun",
    "new",
    "wire_bytes_per_param",
    "read",
    "write",
    "read_json",
    "write_json",
    "one_sync",
    "write_atomic",
    "read_new_lines",
    "read_steps",
    "step_line",
]

T = TypeVar("T")

CONFIG = "config.yaml"
PLAN = "plan.json"
PLAN_VAR = "HPCTRAIN_PLAN"  # a job step's own plan in the run directory (an elastic restart's)


def plan_file(run_dir: Path, env: Mapping[str, str]) -> Path:
    """The plan this rank follows: the step's own (HPCTRAIN_PLAN, a file name in the run
    directory, set for the steps of an elastic restart) or the run's plan.json."""
    name = env.get(PLAN_VAR, "")
    return run_dir / (name if re.fullmatch(r"plan[-\w.]*\.json", name) else PLAN)


JOB = "job.json"
REMOTE = "remote.json"  # RemoteRef: this machine's record of a run that lives on a remote cluster
STATE = "state.json"
ENV = "env.json"
SUMMARY = "summary.json"
MODEL = "model.pt"
LOGS = "logs"
LAUNCHER_LOG = f"{LOGS}/launcher.log"
CHECKPOINTS = "checkpoints"
LATEST_CHECKPOINT = f"{CHECKPOINTS}/latest"
SUPERVISOR_LOG = "supervisor.log"  # the local supervisor's own output (run or sweep directory)
RELEASED = "released"  # the waiting command gave up waiting: its supervisor keeps the runs going
SWEEP = "sweep.json"
STUDY = "study.json"
TUNE = "tune.json"
BEST = (
    "best.yaml"  # in a tune directory: the best settings as an override file (hpctrain run --overrides-file)
)
REPORT = "report"


def steps_file(rank: int) -> str:
    return f"steps-rank{rank}.jsonl"


def error_file(rank: int) -> str:
    return f"error-rank{rank}.json"


def heartbeat_file(rank: int) -> str:
    return f"heartbeat-rank{rank}.json"


def stack_file(rank: int) -> str:
    return f"stack-rank{rank}.txt"


def flight_file(rank: int) -> str:
    """A rank's torch.distributed flight recorder dump, written when a stall is reported."""
    return f"flight-rank{rank}.json"


STALL = "stall.json"
CONTAINER = "container.json"  # the image a run's ranks ran in: runtime, version, digest, binds
COST = "cost.json"  # node-hours, core-hours and energy of the run (driver side, at its end)
CODE = "code.json"  # the snapshot of the user's code: source, git commit, dirty, files
CODE_DIFF = "code.diff"  # uncommitted changes of a dirty tree at submission


def script_result_file(rank: int) -> str:
    """A script rank's own result (its RankSummary), gathered by rank 0 into summary.json."""
    return f"result-rank{rank}.json"


def resume_steps(path: Path, start: int) -> list[StepRecord]:
    """Records of the steps before `start` from an earlier attempt: the resumed run keeps them and
    never counts a step twice. If any record is dropped (steps after the checkpoint, or all of
    them on a fresh start), the earlier attempt's file is first kept as steps-rank{R}.jsonl.N."""
    if not path.exists():
        return []
    earlier = list(iter_steps(path))
    kept = [r for r in earlier if r.step < start]
    if len(kept) < len(earlier):
        keep_attempt(path)
    return kept


def log_file(rank: int) -> str:
    return f"{LOGS}/rank{rank}.log"


def published_checkpoints(d: Path) -> list[Path]:
    """The complete checkpoints in a checkpoints directory, either format (step-NNNNNN.pt, or a
    sharded step-NNNNNN.dcp directory); a save in progress has a hidden name until it is done."""
    return [*d.glob("step-*.pt"), *d.glob("step-*.dcp")]


def read_jsonl(path: Path) -> list[Any]:
    """The documents of a file of JSON lines; a damaged line (a writer killed mid-line) is
    skipped, and a missing file has none."""
    try:
        text = bounded.read_text(path, bounded.RECORD, errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def result_written(run_dir: Path) -> bool:
    """Rank 0 left what its workload produces: the run summary, or an allreduce benchmark."""
    return (run_dir / SUMMARY).exists() or any(run_dir.glob("allreduce-n*.json"))


def allreduce_file(n: int) -> str:
    return f"allreduce-n{n}.json"


def allreduce_dir(n: int) -> str:
    """In a study directory: the run of the allreduce benchmark on n ranks."""
    return f"allreduce-{n}"


ANALYSIS = "analysis"  # in a study directory: the run of its analysis (study --analyze-as-job)
ALLOCATION = "allocation"  # in a tune directory: the allocation its trials ran in (SLURM)


def study_jobs_dirs(study_dir: Path) -> list[Path]:
    """A study's own jobs besides its points, where they were started: the allreduce benchmarks,
    the analysis job and the allocation its points ran in (study.one_allocation); never an
    attempt set aside, NAME.failed-T."""
    found = [d for d in study_dir.glob("allreduce-*") if re.fullmatch(r"allreduce-\d+", d.name)]
    found = sorted(found, key=lambda d: int(d.name.split("-")[1])) + [
        study_dir / ANALYSIS,
        study_dir / ALLOCATION,
    ]
    return [d for d in found if (d / JOB).is_file()]


def keep_writes_private() -> None:
    """Nothing hpctrain creates is writable by other users, whatever the umask (a group-writable
    one is common on clusters): the ranks import the code snapshot, unpickle submitit's job files
    and run the plan's command from the run directory, so whoever could write there could run code
    as this user. Reading stays as the umask allows."""
    os.umask(os.umask(0) | 0o022)


def write_json(path: Path, obj: Any, indent: int | None = 2) -> None:
    """indent=None: one line, through json's C encoder (~5x faster; for the files a sweep writes
    per point, and for manifests of 10,000 runs)."""
    try:  # standard JSON: no NaN or Infinity (records.to_dict writes them as null)
        text = json.dumps(obj, indent=indent, sort_keys=True, default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(finite(obj), indent=indent, sort_keys=True, default=str, allow_nan=False)
    write_atomic(path, text + "\n")


def finite(obj: Any) -> Any:
    """`obj` with every float that is not finite replaced by null, as records write them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def read_json(path: Path) -> Any:
    """Parsed JSON, or RecordError naming the file (RecordMissing if it does not exist)."""
    try:
        text = bounded.read_text(path, bounded.RECORD)
    except FileNotFoundError as e:
        raise RecordMissing(f"{path}: missing") from e
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: cannot be read ({e})") from e
    try:
        return json.loads(text)
    except RecursionError:
        raise RecordError(f"{path}: nests deeper than a record does") from None
    except json.JSONDecodeError as e:
        what = (
            "empty" if not text.strip() else f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        )
        raise RecordError(f"{path}: {what}") from e


def read(path: Path, cls: type[T]) -> T:
    """The typed record in `path`; RecordError names the file and the bad field."""
    data = read_json(path)
    try:
        return from_dict(cls, data)
    except RecordError as e:
        raise RecordError(f"{path}: not a valid {cls.__name__} record: {e}") from None


def write(path: Path, record: Any, indent: int | None = 2) -> None:
    write_json(path, to_dict(record), indent)


def step_line(rec: StepRecord) -> str:
    return json.dumps(to_dict(rec)) + "\n"


def iter_steps(path: Path, tolerate_partial_tail: bool = True) -> Iterator[StepRecord]:
    """Step records of a steps-rank{R}.jsonl file. A last line without its newline (a rank
    killed mid-write) is skipped when `tolerate_partial_tail`; any other bad line is an error
    naming the file and the line."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - a generator's file, closed below
    except FileNotFoundError as e:
        raise RecordMissing(f"{path}: missing") from e
    with f:
        # line by line, each bounded: a planted file of one endless line cannot fill the memory
        for no, line in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), start=1):
            if not line.endswith(b"\n"):
                if len(line) > MAX_LINE:
                    raise RecordError(f"{path}, line {no}: longer than {MAX_LINE} bytes: not a step record")
                if line.strip() and not tolerate_partial_tail:  # a rank killed mid-write
                    yield _step(path, no, line)
                return
            if line.strip():
                yield _step(path, no, line)


MAX_LINE = 1 << 20  # a step record is a few hundred bytes


def _step(path: Path, no: int, line: bytes) -> StepRecord:
    try:
        return from_dict(StepRecord, json.loads(line))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}, line {no}: not valid JSON ({e})") from None
    except RecordError as e:
        raise RecordError(f"{path}, line {no}: not a valid step record: {e}") from None


def read_study(study_dir: Path) -> StudyManifest:
    """A study directory's manifest; a directory without one is named as not a study."""
    if not (Path(study_dir) / STUDY).is_file():
        raise RecordError(f"{study_dir} is not a study directory (no {STUDY})")
    return read(Path(study_dir) / STUDY, StudyManifest)


def member_dir(home: Path, recorded: str) -> Path:
    """Where a sweep's or study's run lives: inside its directory, found by name, so a directory
    copied or moved as a whole reads its own runs, never the original's. Only a run recorded
    outside any sweep or study (its recorded parent holds no manifest) keeps its absolute path."""
    p = Path(recorded)
    if not p.is_absolute():
        return Path(home) / p
    inside = Path(home) / p.name
    if inside.exists() or not p.exists() or (p.parent / STUDY).exists() or (p.parent / SWEEP).exists():
        return inside
    return p


def keep_attempt(path: Path) -> Path:
    """Keep an earlier attempt's file before it is rewritten: the first free PATH.1, PATH.2, ..."""
    n = 1
    while path.with_name(f"{path.name}.{n}").exists():
        n += 1
    kept = path.with_name(f"{path.name}.{n}")
    path.rename(kept)  # the rewrite then starts a new file (truncating would lose these bytes)
    return kept


def read_steps(path: Path, tolerate_partial_tail: bool = True) -> list[StepRecord]:
    return list(iter_steps(path, tolerate_partial_tail))


def read_errors(run_dir: Path) -> dict[int, ErrorRecord]:
    """error-rank{R}.json files by rank; unreadable ones are skipped (a rank may die mid-write)."""
    out = {}
    for p in sorted(Path(run_dir).glob("error-rank*.json")):
        try:
            out[int(p.stem.removeprefix("error-rank"))] = read(p, ErrorRecord)
        except (ValueError, RecordError):
            continue
    return out


# What a surviving rank's collective library says when a peer process vanished: the effect of
# another rank's failure, never its cause (Gloo's TCP pairs, Horovod's shutdown after a peer).
PEER_LOST = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|Horovod has been shut down|"
    r"NCCL communicator was aborted|peer process"
)


def is_peer_loss(error: ErrorRecord) -> bool:
    return bool(PEER_LOST.search(error.message))


def first_error(run_dir: Path, causes_only: bool = False) -> ErrorRecord | None:
    """The earliest error-rank{R}.json: the rank that failed first (the others were stopped).
    An error that only says a peer vanished comes after every other (with `causes_only`, it is
    left out: the launcher's report of the vanished rank names the cause better)."""
    errors = [e for e in read_errors(run_dir).values() if not (causes_only and is_peer_loss(e))]
    # a stall is the cause of whatever the other ranks said after it (a pipeline's peers time out)
    return min(errors, key=lambda e: (e.type != "Stalled", is_peer_loss(e), e.time)) if errors else None
