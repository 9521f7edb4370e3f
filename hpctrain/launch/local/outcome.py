"""What the end of an attempt means: which rank failed first and why (its own error file, else
mpirun's report), whether mpirun failed before any rank started, what a cancel found already
dead, and a full disk as the cause of whatever the ranks then said. Read by the supervisor."""

from __future__ import annotations

import signal
from collections import deque
from pathlib import Path

from hpctrain import records
from hpctrain.launch.output import mpirun_failure
from hpctrain.lifeline import stat_fields


def unwritable(write_error: str, tail: str) -> str:
    """The log write that failed, and what the rank itself could not write (a checkpoint's shard,
    say), if its last words name another file: both are the same full disk."""
    said = next((ln.strip() for ln in reversed(tail.splitlines()) if "[Errno 28]" in ln), "")
    rank = f"; the rank's own write failed too: {said}" if said and said not in write_error else ""
    return f"the run directory cannot be written: {write_error}{rank}"


def never_started(run_dir: Path, tails: dict[int | None, deque[str]], mpirun_text: str) -> bool:
    """No rank printed a line, wrote an error file, or was reported by mpirun as failed: mpirun
    itself failed (a wrong path or flag, no slots), which is a launch error, not a rank failure."""
    return (
        not any(tails.values())
        and records.first_error(run_dir) is None
        and mpirun_failure(mpirun_text) is None
    )


def failure_of(
    run_dir: Path, code: int, tails: dict[int | None, deque[str]], mpirun_text: str
) -> records.Failure:
    """The first rank that failed, from its error file, else from mpirun's report (a rank killed
    by a signal writes nothing; the survivors' "peer vanished" errors are its effect)."""
    named = _rank_failure(run_dir, tails, mpirun_text)
    if named is not None:
        return named
    if code < 0:  # mpirun itself was signalled, not by this supervisor (cancelling is handled above)
        return records.Failure(
            None,
            f"mpirun was killed by signal {-code} ({_signame(-code)}) from outside hpctrain; its ranks "
            "ended with it",
            "\n".join(mpirun_text.splitlines()[-15:]),
        )
    first = records.first_error(run_dir)
    if first is not None:
        return records.Failure(first.rank, first.describe(), "\n".join(tails.get(first.rank, [])))
    return records.Failure(
        None, f"mpirun exited with status {code}", "\n".join(mpirun_text.splitlines()[-15:])
    )


def before_cancel(
    run_dir: Path, code: int, tails: dict[int | None, deque[str]], mpirun_text: str
) -> records.Failure | None:
    """The failure of a rank that the cancel did not cause: one with an error of its own, or one
    mpirun saw die of a signal other than the SIGTERM stopping it sends."""
    named = _rank_failure(run_dir, tails, mpirun_text) if code != 0 else None
    return None if named is None or "signal 15 " in named.cause else named


def ranks_gone(run_dir: Path) -> dict[int, int]:
    """Ranks whose process (its heartbeat's pid) no longer runs: rank -> pid."""
    out = {}
    for beat in run_dir.glob("heartbeat-rank*.json"):
        try:
            rank, pid = (
                int(beat.name[len("heartbeat-rank") : -len(".json")]),
                int(records.read_json(beat)["pid"]),
            )
        except (ValueError, KeyError, TypeError, OSError, records.RecordError):
            continue
        fields = stat_fields(f"/proc/{pid}/stat")
        if fields is None or fields[0] in ("Z", "X"):  # gone, or a zombie not yet reaped
            out[rank] = pid
    return out


def gone_before(gone: dict[int, int]) -> records.Failure | None:
    """A rank that had ended before the cancel came, though nothing said why (mpirun was stopped
    before it reported): killed from outside hpctrain, most likely."""
    if not gone:
        return None
    rank = min(gone)
    return records.Failure(
        rank, f"had ended before the cancel (pid {gone[rank]}), killed from outside hpctrain or crashed", ""
    )


def _rank_failure(
    run_dir: Path, tails: dict[int | None, deque[str]], mpirun_text: str
) -> records.Failure | None:
    """The first failed rank: from its own error file, else as mpirun saw it die."""
    first = records.first_error(run_dir, causes_only=True)
    if first is not None:
        return records.Failure(first.rank, first.describe(), "\n".join(tails.get(first.rank, [])))
    found = mpirun_failure(mpirun_text)
    if found is None:
        return None
    rank, cause = found
    silent = _silent_rank(run_dir, rank) if "signal" not in cause else None
    if silent is not None:  # mpirun saw the effect end first (a race): the cause said nothing
        rank, cause = (
            silent,
            (
                f"ended without an error of its own (killed from outside hpctrain, or out of memory, most "
                f"likely); rank {rank}, which mpirun reported first ({cause}), only lost its peer"
            ),
        )
    return records.Failure(rank, cause, "\n".join(tails.get(rank, [])))


def _silent_rank(run_dir: Path, reported: int | None) -> int | None:
    """Where the rank mpirun reported only lost a peer (its error file says so), the one rank of
    the run that wrote no error file: it ended first and without a word (SIGKILL writes nothing).
    None where that is not so clear."""
    errors = records.read_errors(run_dir)
    said = errors.get(reported) if reported is not None else None
    if said is None or not records.is_peer_loss(said):
        return None
    try:
        world = int(records.read_json(run_dir / records.PLAN)["world_size"])
    except (KeyError, TypeError, ValueError, OSError, records.RecordError):
        return None
    silent = [r for r in range(world) if r not in errors]
    return silent[0] if len(silent) == 1 else None


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return "unknown signal"
