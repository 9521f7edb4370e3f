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


def target_problems(cfg: Config) -> list[Problem]:
    """Each _target_ must import, be callable and accept its keyword arguments."""
    p: list[Problem] = []
    for section in SECTIONS:
        target, kwargs = _spec(cfg, section)
        if target is None:
            continue
        key = f"{section}._target_"
        with importable(cfg.code.dir):
            try:
                obj = _locate_in_time(target, float(os.environ.get(IMPORT_TIMEOUT_VAR, "60")))
            except ImportTimeout as e:
                p.append(
                    Problem(
                        key,
                        str(e),
                        "make the import return (do slow work in the constructor, or under "
                        f"if __name__ == '__main__'), or raise {IMPORT_TIMEOUT_VAR}",
                    )
                )
                continue
            except (Exception, SystemExit) as e:  # noqa: BLE001 - any import-time failure of user code
                cause = e.__cause__ or e
                p.append(
                    Problem(
                        key,
                        f"{target!r} does not import: {type(cause).__name__}: {_first_line(cause)}",
                        f"give module.attribute of code under code.dir={cfg.code.dir} (or an installed package)",
                    )
                )
                continue
        if not callable(obj):
            p.append(Problem(key, f"{target!r} is not callable", "name a class or a function"))
            continue
        unsafe = _not_a_factory(obj)
        if unsafe:
            p.append(
                Problem(
                    key,
                    f"{target!r} {unsafe}: a _target_ builds a model, dataset or loss",
                    "name a class or function of your code, torch, torchvision or another installed package",
                )
            )
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
    try:
        return instantiate({"_target_": target, **kwargs}, _convert_="all")
    except Exception as e:  # noqa: BLE001 - whatever the user's constructor raises
        cause = e.__cause__ or e
        raise WorkloadError(
            f"{section}._target_={target} failed: {type(cause).__name__}: {_first_line(cause)}"
        ) from e


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


def probe(model: Any, objective: Any, dataset: Any, device: Any, what: str, hint: str = "") -> None:
    """One sample through the model and the loss (eval mode, no gradients: nothing changes), so a
    model and data that do not fit fail with the shapes named, not deep inside the first step;
    `objective` (train/objective.py) makes the loss as a step does."""
    import torch

    x, y = dataset[0]
    x, y = torch.as_tensor(x).unsqueeze(0).to(device), torch.as_tensor(y).unsqueeze(0).to(device)
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
