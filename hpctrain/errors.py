"""Typed exceptions. Library code raises these; only the CLI turns them into messages and exit codes."""

from __future__ import annotations

from dataclasses import dataclass


class HpctrainError(Exception):
    """Base class for every error hpctrain reports to a user."""

    exit_code = 1


@dataclass(frozen=True)
class Problem:
    """One invalid setting: which key, which rule it breaks, and how to fix it."""

    key: str
    rule: str
    fix: str
    where: str = ""  # which points of a sweep or study break it (empty: the one config)

    def __str__(self) -> str:
        where = f"\n    in: {self.where}" if self.where else ""
        return f"{self.key}: {self.rule}{where}\n    fix: {self.fix}"


class ConfigError(HpctrainError):
    """The configuration is invalid. Raised before anything is started or submitted."""

    exit_code = 2

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        head = "invalid configuration" + (f" ({len(problems)} problems)" if len(problems) > 1 else "")
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))

    @classmethod
    def one(cls, key: str, rule: str, fix: str) -> ConfigError:
        return cls([Problem(key, rule, fix)])

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.problems]


class LaunchError(HpctrainError):
    """A launcher could not start the job (missing mpirun, unwritable run directory, ...)."""

    exit_code = 3


class RecordError(HpctrainError):
    """A file of a run, sweep or study directory is corrupt, truncated or not hpctrain's."""

    exit_code = 1


class RecordMissing(RecordError):
    """A file the contract requires is not there (yet)."""


class PluginError(HpctrainError):
    """Another installed package's entry point (a command, an engine, ...) failed to load or run:
    its author's error, named with the entry point, never called hpctrain's bug."""


class RankFailure(HpctrainError):
    """A training rank failed; the whole run was stopped."""

    exit_code = 4

    def __init__(self, rank: int | None, cause: str, log_tail: str = "", run_dir: str = "") -> None:
        self.rank = rank
        self.cause = cause
        self.log_tail = log_tail
        self.run_dir = run_dir
        # without a rank, the cause names what failed (mpirun, the supervisor, the job)
        msg = f"rank {rank} failed: {cause}" if rank is not None else f"the run failed: {cause}"
        if run_dir:
            msg += f"\n  run directory: {run_dir}"
        if log_tail:
            msg += "\n  last output of that rank:\n" + "\n".join(
                "    " + line for line in log_tail.rstrip().splitlines()
            )
        super().__init__(msg)


class RunsFailed(HpctrainError):
    """Every run of a study failed: nothing to measure or report."""

    exit_code = 4


class RunCancelled(HpctrainError):
    """The run was cancelled (hpctrain cancel, scancel, or a signal to the launcher)."""

    exit_code = 130
