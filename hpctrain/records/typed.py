"""Typed records: dataclasses checked field by field when read, so a truncated, corrupt or foreign
file is reported with its name and what is wrong, never as a traceback or wrong numbers."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, Union

from hpctrain.errors import RecordError

T = TypeVar("T")
FORMAT_VERSION = 1  # of every JSON document hpctrain writes; readers refuse newer ones


Check = Callable[[Any, str], Any]  # (value, where) -> the value, converted; or RecordError


def _fail(where: str, expected: str, value: Any) -> RecordError:
    found = type(value).__name__ if expected in ("a list", "a mapping") else repr(value)
    return RecordError(f"{where}: expected {expected}, found {found}")


def _scalar(tp: type) -> Check:
    if tp is bool:

        def check_bool(v: Any, where: str) -> Any:
            if v is True or v is False:
                return v
            raise _fail(where, "true/false", v)

        return check_bool
    if tp is int:

        def check_int(v: Any, where: str) -> Any:
            if type(v) is int:
                return v
            raise _fail(where, "an integer", v)

        return check_int
    if tp is float:

        def check_float(v: Any, where: str) -> Any:
            if type(v) is float:
                return v
            if type(v) is int:
                return float(v)
            raise _fail(where, "a number", v)

        return check_float
    if tp is str:

        def check_str(v: Any, where: str) -> Any:
            if type(v) is str:
                return v
            raise _fail(where, "a string", v)

        return check_str
    if tp is Any:
        return lambda v, where: v
    raise TypeError(f"unsupported record field type {tp!r}")  # a bug in a record definition


@functools.cache
def _checker(tp: Any) -> Check:
    """A checker for values of type `tp`, built once per type (reading is on the analysis path)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = _checker(next(a for a in typing.get_args(tp) if a is not type(None)))
        return lambda v, where: None if v is None else inner(v, where)
    if origin is list:
        item = _checker(typing.get_args(tp)[0])

        def check_list(v: Any, where: str) -> Any:
            if type(v) is not list:
                raise _fail(where, "a list", v)
            return [item(x, f"{where}[{i}]") for i, x in enumerate(v)]

        return check_list
    if origin is dict:
        value = _checker(typing.get_args(tp)[1])

        def check_dict(v: Any, where: str) -> Any:
            if type(v) is not dict:
                raise _fail(where, "a mapping", v)
            return {str(k): value(x, f"{where}.{k}") for k, x in v.items()}

        return check_dict
    if dataclasses.is_dataclass(tp):
        return lambda v, where: from_dict(tp, v, where)  # type: ignore[arg-type]
    return _scalar(tp)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, bool, Check], ...]:
    """(name, required, checker) of each field of a record class."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            f.name,
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            _checker(hints[f.name]),
        )
        for f in dataclasses.fields(cls)
    )


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """An instance of the record dataclass `cls` from parsed JSON, every field checked."""
    if type(data) is not dict:
        raise RecordError(f"{where or cls.__name__}: expected a JSON object, found {type(data).__name__}")
    fields = _fields(cls)  # type: ignore[arg-type]
    if len(data) > len(fields) or not all(k in data for k, required, _ in fields if required):
        names = {name for name, _, _ in fields}
        unknown = sorted(set(data) - names)
        if unknown and not getattr(cls, "EXTRA_KEYS_OK", False):
            raise RecordError(f"{where or cls.__name__}: unknown key(s) {', '.join(unknown)}")
    values = {}
    prefix = f"{where}." if where else ""
    for name, required, check in fields:
        if name in data:
            values[name] = check(data[name], prefix + name)
        elif required:
            raise RecordError(f"{prefix}{name}: missing")
    if values.get("format_version", 0) > FORMAT_VERSION:
        raise RecordError(
            f"format_version {values['format_version']} is newer than this hpctrain "
            f"reads ({FORMAT_VERSION}): upgrade hpctrain"
        )
    return cls(**values)


def to_dict(record: Any) -> dict[str, Any]:
    """The JSON form of a record (floats stay floats: NaN is written as JSON's NaN extension)."""
    return dataclasses.asdict(record)
