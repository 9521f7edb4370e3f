"""Rules for a SLURM cluster config: every value that reaches the sbatch script is checked here."""

from __future__ import annotations

import re
import shlex

from hpctrain.config.schema import Config, SlurmClusterConf
from hpctrain.config.validate import at_least
from hpctrain.errors import Problem

# Values that become #SBATCH flags: SLURM names and lists, no white space or shell characters.
SLURM_TOKEN = re.compile(r"^[A-Za-z0-9_.,:+-]+$")
SLURM_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:+|&!*\[\]()-]+$")
# A setup line is one simple command (module load, source, export): no chaining, substitution
# or redirection, so what runs is exactly what the line says.
# sbatch(1) --dependency: after, afterany, afterok, ... with job ids (123, 123_4, 123+60), or singleton
_DEP = r"(?:[a-z]+(?::[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?)+|singleton)"
SLURM_DEPENDENCY = re.compile(rf"^{_DEP}(?:[,?]{_DEP})*$")
SHELL_META = re.compile(r"[;&|`<>\n\r\0]|\$\(")
COMMAND_NAME = re.compile(r"^[A-Za-z0-9_./+-][A-Za-z0-9_./:+-]*$")
VARIABLE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")
# bash(1) RESERVED WORDS: a line starting with one is part of a compound command
BASH_RESERVED = frozenset(
    "! case coproc do done elif else esac fi for function if in select then until while { } [[ ]] time".split()
)


def slurm_problems(cfg: Config, c: SlurmClusterConf) -> list[Problem]:
    p: list[Problem] = []
    for key, value, low in [
        ("nodes", c.nodes, 1),
        ("ranks_per_node", c.ranks_per_node, 1),
        ("gpus_per_node", c.gpus_per_node, 0),
        ("cpus_per_rank", c.cpus_per_rank, 1),
        ("time_min", c.time_min, 1),
        ("signal_delay_s", c.signal_delay_s, 0),
        ("max_requeues", c.max_requeues, 0),
        ("array_parallelism", c.array_parallelism, 1),
        ("checkpoint_interval", c.checkpoint_interval, 0),
    ]:
        p += at_least(f"cluster.{key}", value, low)
    if c.queries_per_min <= 0:
        p.append(
            Problem(
                "cluster.queries_per_min",
                f"must be > 0 (got {c.queries_per_min:g})",
                "set how many SLURM commands a minute hpctrain may make, e.g. 30",
            )
        )
    if c.mem_gb is not None and c.mem_gb <= 0:
        p.append(Problem("cluster.mem_gb", f"must be > 0 (got {c.mem_gb:g})", "set a positive size, or null"))
    # sbatch(1) --signal: "the signal may be sent up to 60 seconds earlier than specified"; a
    # requeued job signalled before its handlers exist dies of the signal.
    if c.time_min >= 1 and c.signal_delay_s > c.time_min * 60 - 60:
        p.append(
            Problem(
                "cluster.signal_delay_s",
                f"{c.signal_delay_s} s leaves less than SLURM's 60 s signal resolution before the time "
                f"limit ({c.time_min} min): the job could be signalled as soon as it starts",
                f"set cluster.signal_delay_s to at most {c.time_min * 60 - 60}, or raise cluster.time_min",
            )
        )
    if c.gpus_per_node > 0 and c.ranks_per_node != c.gpus_per_node:
        p.append(
            Problem(
                "cluster.ranks_per_node",
                f"{c.ranks_per_node} ranks on {c.gpus_per_node} GPUs per node: Horovod runs one rank per GPU",
                f"set cluster.ranks_per_node={c.gpus_per_node}",
            )
        )
    return p + _script_problems(c) + _rank_problems(cfg, c) + _remote_problems(c)


# what reaches ssh's command line: a destination ssh cannot read as an option, paths of plain words
SSH_DESTINATION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.%+-]*(@[A-Za-z0-9_][A-Za-z0-9_.:%+-]*)?$")
REMOTE_PATH = re.compile(r"^[A-Za-z0-9_.~/+-]+$")


def _remote_problems(c: SlurmClusterConf) -> list[Problem]:
    """cluster.remote and its settings: each value reaches ssh or the remote shell, so only
    plain words are taken (hpctrain quotes them too)."""
    if c.remote is None:
        return []
    p = []
    if not SSH_DESTINATION.match(c.remote):
        p.append(
            Problem(
                "cluster.remote",
                f"{c.remote!r} is not an ssh destination (user@host or an alias of your ssh config)",
                "set it to user@login.example.org, or to a Host of ~/.ssh/config",
            )
        )
    for key, value in (("remote_dir", c.remote_dir), ("remote_hpctrain", c.remote_hpctrain)):
        if not REMOTE_PATH.match(value) or value.startswith("-") or ".." in value.split("/"):
            p.append(
                Problem(
                    f"cluster.{key}",
                    f"{value!r} is not a plain path (letters, digits, . _ ~ / + - only, no ..)",
                    f"set cluster.{key} to a path without spaces, quotes or shell characters",
                )
            )
    return p


def _script_problems(c: SlurmClusterConf) -> list[Problem]:
    """Values written into the sbatch script: SLURM names, constraint expressions, setup lines."""
    p = []
    for key in ("partition", "account", "qos"):
        value = getattr(c, key)
        if value is not None and not SLURM_TOKEN.fullmatch(value):
            p.append(
                Problem(
                    f"cluster.{key}",
                    f"{value!r} is not a SLURM name (letters, digits, '_.,:+-')",
                    f"use the name sinfo/sacctmgr shows, e.g. cluster.{key}=gpu",
                )
            )
    if c.constraint is not None and not SLURM_CONSTRAINT.fullmatch(c.constraint):
        p.append(
            Problem(
                "cluster.constraint",
                f"{c.constraint!r} is not a SLURM constraint expression",
                "use features joined by & or |, e.g. cluster.constraint='a100&ib'",
            )
        )
    if c.dependency is not None and not SLURM_DEPENDENCY.fullmatch(c.dependency):
        p.append(
            Problem(
                "cluster.dependency",
                f"{c.dependency!r} is not a SLURM dependency list",
                "use TYPE:JOBID[:JOBID...] joined by ',' (all) or '?' (any), e.g. afterok:123:124, "
                "or name the earlier runs with hpctrain run --after DIR",
            )
        )
    for i, line in enumerate(c.setup):
        if SHELL_META.search(line) or not line.strip() or not _whole_words(line):
            p.append(
                Problem(
                    f"cluster.setup[{i}]",
                    f"{line!r} is not one simple command (no ; & | ` $( < >, line breaks, "
                    "unbalanced quotes or a trailing backslash)",
                    "put each command in its own entry: cluster.setup='[module load cuda,export X=1]'",
                )
            )
    return p


def _rank_problems(cfg: Config, c: SlurmClusterConf) -> list[Problem]:
    """What srun must give the ranks: MPI for Horovod over MPI, GPUs for CUDA."""
    p = []
    if cfg.parallelism.backend == "mpi" and c.mpi == "none":
        p.append(
            Problem(
                "cluster.mpi",
                "backend=mpi needs srun to start MPI (PMIx or PMI2)",
                "set cluster.mpi=pmix, or parallelism.backend=gloo",
            )
        )
    if cfg.train.device == "cuda" and c.gpus_per_node == 0:
        p.append(
            Problem(
                "cluster.gpus_per_node",
                "train.device=cuda but no GPUs are requested",
                "set cluster.gpus_per_node (and ranks_per_node) to the GPUs per node",
            )
        )
    return p


def _whole_words(line: str) -> bool:
    """The line is one simple command by itself: a plain command name first (not a reserved word
    like `if` or `{`, nor an assignment), balanced quotes, no final backslash (which would join the
    script's next line to it), no unquoted ( ) ; < > | &, and variables only as $NAME or ${NAME}
    (an unclosed ${ or $(( swallows the rest of the script)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    # shlex ends a word at '#' ("0#)" -> "0"); bash starts a comment only at a word's start and
    # reads "0#" and ")": a '#' is kept in the word, so what follows it is checked too
    lexer.commenters = ""
    try:  # shlex raises on an open quote and on a final backslash ("No escaped character")
        words = list(lexer)
    except ValueError:
        return False
    if not words or words[0] in BASH_RESERVED or not COMMAND_NAME.match(words[0]):
        return False
    if any(w and set(w) <= set("();<>|&") for w in words):
        return False
    return all(VARIABLE.match(line, i) for i, ch in enumerate(line) if ch == "$")
