"""Config rules for user code: the code directory, the script and its throughput pattern, and
the _target_s (targets.py). Each problem names the key, the rule and the fix."""

from __future__ import annotations

from pathlib import Path

from hpctrain import bounded
from hpctrain.config.schema import Config, ParallelismConf, ScriptConf, TrainConf
from hpctrain.errors import Problem
from hpctrain.train.targets import orphan_kwargs, target_problems
from hpctrain.workload.code import NOT_GIT, git_top, in_snapshot, snapshot_on
from hpctrain.workload.model_rules import model_problems
from hpctrain.workload.pattern import PatternError, compile_pattern


def workload_problems(cfg: Config) -> list[Problem]:
    p = orphan_kwargs(cfg)
    if not cfg.user_code:
        return p + _unused(cfg) + model_problems(cfg)
    code = Path(cfg.code.dir or ".")
    if not code.is_dir():
        p.append(
            Problem("code.dir", f"{code} is not a directory", "point code.dir at your project's directory")
        )
        return p
    if snapshot_on(cfg) and not cfg.code.include and git_top(code.resolve()) is None:
        p.append(
            Problem("code.dir", f"{code.resolve()} {NOT_GIT}", "set code.include, or code.snapshot=false")
        )
    p += _script_problems(cfg, code)
    p += _trainer_only(cfg)
    p += target_problems(cfg)
    p += _builtin_only(cfg)
    p += _model_loss(cfg)
    return p + (model_problems(cfg) if not any(q.key.startswith(("model.", "code.")) for q in p) else [])


def _model_loss(cfg: Config) -> list[Problem]:
    """loss=model calls forward(inputs, targets), or forward(inputs, <targets_as>=targets): a
    model class whose forward takes neither is refused here, not on every rank after the start."""
    import inspect

    from hpctrain.train.targets import importable, locate

    if cfg.loss.name != "model" or not cfg.model._target_:
        return []
    with importable(cfg.code.dir):
        try:
            forward = getattr(locate(cfg.model._target_), "forward", None)
        except Exception:  # noqa: BLE001 - target_problems names what does not import
            return []
    if not inspect.isfunction(forward):
        return []  # a factory: its model is checked on the ranks, with one sample
    key, sig = cfg.loss.targets_as, inspect.signature(forward)
    names = list(sig.parameters)
    if not key and "labels" in names[3:]:  # Hugging Face's: forward(input_ids, attention_mask, ..., labels)
        return [
            Problem(
                "loss.targets_as",
                f"{cfg.model._target_}.forward takes the targets as labels, not as its second argument "
                f"({names[2]}), where loss=model would put them",
                "set loss.targets_as=labels",
            )
        ]
    try:  # (self, inputs, targets) or (self, inputs, key=targets)
        sig.bind(None, None, **{key: None}) if key else sig.bind(None, None, None)
    except TypeError:
        call = f"forward(inputs, {key}=targets)" if key else "forward(inputs, targets)"
        return [
            Problem(
                "loss.name",
                f"loss=model calls {call}, which {cfg.model._target_}.forward{sig} does not take",
                "give forward a targets argument that returns the loss, or set loss.targets_as to its keyword "
                "(labels for Hugging Face models)",
            )
        ]
    return []


# settings of the built-in models and datasets, which a _target_ does not receive
BUILTIN_ONLY = {
    "model": ("width", "depth", "heads", "tie_embeddings"),
    "data": ("num_samples", "channels", "image_size", "num_classes", "seq_len", "vocab_size", "path"),
    "optim": ("momentum", "nesterov", "betas", "eps", "alpha", "weight_decay"),
}


def _builtin_only(cfg: Config) -> list[Problem]:
    """`model.width=128` beside model._target_ would silently not reach the user's class."""
    p = []
    for section, names in BUILTIN_ONLY.items():
        node = getattr(cfg, section)
        if node._target_ is None:
            continue
        default = type(node)()
        for name in names:
            if getattr(node, name) != getattr(default, name):
                p.append(
                    Problem(
                        f"{section}.{name}",
                        f"applies to the built-in {section}s only; {section}._target_ does not receive it",
                        f"pass it to your {section} as +{section}.kwargs.{name}={getattr(node, name)}",
                    )
                )
    return p


def _trainer_only(cfg: Config) -> list[Problem]:
    """The built-in trainer's watchdog does not watch a script (script.stall_timeout_s does): a
    train.stall_timeout_s beside script= would leave a hang undetected for the other's time."""
    if not cfg.script.path or cfg.train.stall_timeout_s == TrainConf().stall_timeout_s:
        return []
    return [
        Problem(
            "train.stall_timeout_s",
            "watches the built-in trainer's steps; a script is watched by script.stall_timeout_s",
            f"set script.stall_timeout_s={cfg.train.stall_timeout_s:g} instead",
        )
    ]


def _unused(cfg: Config) -> list[Problem]:
    if (
        cfg.script.args
        or cfg.script.throughput_regex
        or cfg.script.stall_timeout_s != ScriptConf().stall_timeout_s
    ):
        return [
            Problem(
                "script.args",
                "script.args / throughput_regex / stall_timeout_s are set but no script.path",
                "add script=path/to/train.py, or drop them",
            )
        ]
    return []


def _script_problems(cfg: Config, code: Path) -> list[Problem]:
    s = cfg.script
    if not s.path:
        return _unused(cfg)
    p: list[Problem] = []
    path = Path(s.path)
    if not path.is_file():
        p.append(
            Problem("script.path", f"{path} does not exist or is not a file", "give the path of your script")
        )
    elif (bad := _not_python(path)) is not None:
        p.append(
            Problem(
                "script.path",
                f"{path} is not Python source ({bad}): every rank runs it with this Python",
                "give a Python script; to run a shell script or a binary, call it from one",
            )
        )
    elif snapshot_on(cfg) and not path.resolve().is_relative_to(code.resolve()):
        p.append(
            Problem(
                "script.path",
                f"{path} is outside code.dir={code}: the code snapshot would not hold it",
                "set code.dir to the project that holds the script, or code.snapshot=false",
            )
        )
    elif snapshot_on(cfg) and not in_snapshot(code, cfg.code.include, path):
        how = f"code.include={cfg.code.include}" if cfg.code.include else "git's tracked files"
        p.append(
            Problem(
                "script.path",
                f"{path} is not among {how}, which the code snapshot copies: the job would not find it",
                "add it to code.include, or code.snapshot=false"
                if cfg.code.include
                else f"git add {path}, or set code.include / code.snapshot=false",
            )
        )
    if s.throughput_regex is not None:
        try:
            groups = compile_pattern(s.throughput_regex).groups
        except PatternError as e:
            p.append(
                Problem(
                    "script.throughput_regex", str(e), "e.g. script.throughput_regex='([0-9.]+) samples/s'"
                )
            )
        else:
            if groups < 1:
                p.append(
                    Problem(
                        "script.throughput_regex",
                        "has no group to read the number from",
                        "put the number in parentheses, e.g. '([0-9.]+) samples/s'",
                    )
                )
    if cfg.parallelism.engine != ParallelismConf().engine:
        p.append(
            Problem(
                "parallelism.engine",
                f"{cfg.parallelism.engine} is the built-in trainer's engine: a script chooses its own "
                "(every rank gets Horovod's and torchrun's variables either way)",
                "drop parallelism.engine; choose the engine in your script",
            )
        )
    if cfg.model._target_ or cfg.data._target_ or cfg.loss._target_:
        p.append(
            Problem(
                "script.path",
                "a script brings its own model and data: model/data/loss _target_ are for the built-in trainer",
                "drop script.path, or the _target_ settings",
            )
        )
    return p


def _not_python(path: Path) -> str | None:
    """Why the file is not Python source, or None: it is compiled here (not run), so a shell script,
    a binary or a syntax error stops before any rank starts."""
    try:
        data = bounded.read_bytes(path, bounded.TEXT)
    except OSError as e:
        return f"cannot be read: {e.strerror}"
    if b"\0" in data[:4096]:
        return "a binary file"
    try:
        compile(data, str(path), "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"line {e.lineno}: {e.msg}"
    except (ValueError, UnicodeDecodeError) as e:
        return str(e)
    return None
