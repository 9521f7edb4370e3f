"""User models, datasets, losses and optimizers by import path (Hydra's `_target_` convention).

Checked when the config is validated (the target imports, is callable, and takes the keyword
arguments given), so a typo fails before anything is submitted; built on every rank with
hydra.utils.instantiate, where a failing constructor or a dataset of the wrong shape becomes a
WorkloadError naming the key.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hpctrain.config.schema import Config
from hpctrain.errors import Problem

SECTIONS = ("model", "data", "loss", "optim")


class WorkloadError(RuntimeError):
    """The user's model, data or loss could not be built or used."""


@contextmanager
def importable(code_dir: str | None) -> Iterator[None]:
    """code_dir first on sys.path for the duration (validation imports the user's code)."""
    if not code_dir:
        yield
        return
    sys.path.insert(0, code_dir)
    try:
        yield
    finally:
        try:
            sys.path.remove(code_dir)
        except ValueError:
            pass


def locate(path: str) -> Any:
    from hydra._internal.utils import _locate  # get_object without its error log line

    return _locate(path)


def _spec(cfg: Config, section: str) -> tuple[str | None, dict[str, Any]]:
    node = getattr(cfg, section)
    return node._target_, dict(node.kwargs)


def nested_targets(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """(key, _target_) of every mapping with a `_target_` inside a section's keyword arguments,
    at any depth of mappings and lists: Hydra's instantiate builds each of them first. Pure."""
    if isinstance(value, dict):
        if "_target_" in value:
            yield f"{key}._target_", str(value["_target_"])
        for k, v in value.items():
            yield from nested_targets(v, f"{key}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from nested_targets(v, f"{key}[{i}]")


def nested_problems(cfg: Config) -> list[Problem]:
    """A `_target_` inside a section's keyword arguments is held to the section's own rules (it
    imports, and is a class or function outside Python's standard library): Hydra builds it
    with the rest, at plan time where the model is traced, and on every rank."""
    p: list[Problem] = []
    for section in SECTIONS:
        for key, target in nested_targets(dict(getattr(cfg, section).kwargs), f"{section}.kwargs"):
            p.extend(_factory(cfg, key, target)[1])
    return p


def _factory(cfg: Config, key: str, target: str) -> tuple[Any, list[Problem]]:
    """`target` imported, and what is wrong with it as a factory: it does not import (or not in
    time), is not callable, or is the standard library's ([] if nothing)."""
    with importable(cfg.code.dir):
        try:
            obj = _locate_in_time(target, float(os.environ.get(IMPORT_TIMEOUT_VAR, "60")))
        except ImportTimeout as e:
            fix = (
                "make the import return (do slow work in the constructor, or under "
                f"if __name__ == '__main__'), or raise {IMPORT_TIMEOUT_VAR}"
            )
            return None, [Problem(key, str(e), fix)]
        except (Exception, SystemExit) as e:  # noqa: BLE001 - any import-time failure of user code
            cause = e.__cause__ or e
            why = f"{target!r} does not import: {type(cause).__name__}: {_first_line(cause)}"
            fix = f"give module.attribute of code under code.dir={cfg.code.dir} (or an installed package)"
            return None, [Problem(key, why, fix)]
    if not callable(obj):
        return obj, [Problem(key, f"{target!r} is not callable", "name a class or a function")]
    unsafe = _not_a_factory(obj)
    if unsafe:
        why = f"{target!r} {unsafe}: a _target_ builds a model, dataset or loss"
        fix = "name a class or function of your code, torch, torchvision or another installed package"
        return obj, [Problem(key, why, fix)]
    return obj, []


def target_problems(cfg: Config) -> list[Problem]:
    """Each _target_ must import, be callable and accept its keyword arguments; a `_target_`
    nested in its keyword arguments must import and be callable (nested_problems)."""
    p: list[Problem] = nested_problems(cfg)
    for section in SECTIONS:
        target, kwargs = _spec(cfg, section)
        if target is None:
            continue
        key = f"{section}._target_"
        obj, found = _factory(cfg, key, target)
        if found:
            p.extend(found)
            continue
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue  # a builtin without a signature: instantiate will tell
        # an optimizer is built as CLASS(parameters, lr=..., **kwargs)
        optim = section == "optim"
        try:
            sig.bind(*([[]] if optim else []), **kwargs, **({"lr": 1.0} if optim else {}))
        except TypeError as e:
            p.append(
                Problem(
                    f"{section}.kwargs",
                    f"{target}{sig} cannot take {sorted(kwargs)}: {e}",
                    f"give {section}'s keyword arguments as +{section}.NAME=VALUE with names from the signature",
                )
            )
    return p


IMPORT_TIMEOUT_VAR = "HPCTRAIN_IMPORT_TIMEOUT_S"


class ImportTimeout(Exception):
    pass


def _locate_in_time(target: str, timeout_s: float) -> Any:
    """locate(target) in a daemon thread: a module that blocks at import (a network call, a lock,
    input()) is reported after `timeout_s` instead of hanging validation."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["obj"] = locate(target)
        except BaseException as e:  # noqa: BLE001 - handed to the caller as it is
            box["error"] = e

    t = threading.Thread(target=work, name=f"import {target}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise ImportTimeout(f"importing {target!r} did not finish in {timeout_s:g} s (it blocks at import)")
    if "error" in box:
        raise box["error"]
    return box["obj"]


def _not_a_factory(obj: Any) -> str:
    """Why `obj` cannot be a model/dataset/loss factory, or "": the standard library's callables
    (os.system, subprocess.run, shutil.rmtree, eval...) would run commands or touch files with the
    config's arguments; anything that is not a class or a function is refused as well."""
    top = (getattr(obj, "__module__", None) or "").split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        return f"belongs to Python's standard library ({obj.__module__})"
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        return f"is a {type(obj).__name__}, not a class or a function"
    return ""


def orphan_kwargs(cfg: Config) -> list[Problem]:
    """Keyword arguments with no _target_ to take them."""
    return [
        Problem(
            f"{s}.kwargs",
            f"are given without {s}._target_",
            f"set {s}._target_=your.module.Callable, or drop {s}.kwargs",
        )
        for s in SECTIONS
        if getattr(cfg, s)._target_ is None and getattr(cfg, s).kwargs
    ]


def build(cfg: Config, section: str) -> Any:
    """Instantiate the section's _target_ with its keyword arguments (plain dicts and lists)."""
    from hydra.utils import instantiate

    target, kwargs = _spec(cfg, section)
    for key, nested in nested_targets(kwargs, f"{section}.kwargs"):  # a config.yaml edited since
        for problem in _factory(cfg, key, nested)[1]:
            raise WorkloadError(f"{problem.key}: {problem.rule}; {problem.fix}")
    try:
        return instantiate({"_target_": target, **kwargs}, _convert_="all")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever the user's constructor raises or exits with
        cause = e.__cause__ or e
        said = (
            f"called sys.exit({e.code!r})"
            if isinstance(e, SystemExit)
            else f"failed: {type(cause).__name__}: {_first_line(cause)}"
        )
        raise WorkloadError(f"{section}._target_={target} {said}") from e


def build_optimizer(target: str, kwargs: dict[str, Any], params: Any, lr: float) -> Any:
    """optim._target_ over the parameters at the run's learning rate, with its keyword arguments
    (called directly: Hydra's instantiate would copy the parameters into its config)."""
    try:
        return locate(target)(params, lr=lr, **kwargs)
    except Exception as e:  # noqa: BLE001 - whatever the user's constructor raises
        cause = e.__cause__ or e
        raise WorkloadError(
            f"optim._target_={target} failed: {type(cause).__name__}: {_first_line(cause)}"
        ) from e


def check_dataset(dataset: Any, target: str, global_batch: int) -> None:
    """A map-style dataset of (input, target) pairs, with at least one global batch of samples."""
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise WorkloadError(
            f"data._target_={target} returned a {type(dataset).__name__}, not a map-style dataset "
            "(with __len__ and __getitem__, e.g. torch.utils.data.TensorDataset)"
        )
    n = len(dataset)
    if n < global_batch:
        raise WorkloadError(
            f"data._target_={target} has {n} samples, fewer than one global batch of {global_batch}: "
            "lower train.batch_per_rank / train.global_batch or give more data"
        )
    first = dataset[0]
    if not (isinstance(first, tuple | list) and len(first) == 2):
        raise WorkloadError(
            f"data._target_={target}: a sample must be an (input, target) pair, got "
            f"{type(first).__name__}{'' if not hasattr(first, '__len__') else f' of length {len(first)}'}"
        )


def one_sample(dataset: Any, device: Any) -> tuple[Any, Any]:
    """The dataset's first sample as a batch of one on the device: (inputs, targets)."""
    import torch

    x, y = dataset[0]
    return torch.as_tensor(x).unsqueeze(0).to(device), torch.as_tensor(y).unsqueeze(0).to(device)


def probe(model: Any, objective: Any, dataset: Any, device: Any, what: str, hint: str = "") -> None:
    """One sample through the model and the loss (eval mode, no gradients: nothing changes), so a
    model and data that do not fit fail with the shapes named, not deep inside the first step;
    `objective` (train/objective.py) makes the loss as a step does."""
    import torch

    x, y = one_sample(dataset, device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            objective(model, x, y)
    except Exception as e:  # noqa: BLE001 - any mismatch of the user's model and data
        raise WorkloadError(
            f"{what}: one sample does not go through the model and the loss: input "
            f"{tuple(x.shape[1:])} {x.dtype}, target {tuple(y.shape[1:])} {y.dtype}: "
            f"{type(e).__name__}: {_first_line(e)}{hint}"
        ) from e
    finally:
        model.train(was_training)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"
