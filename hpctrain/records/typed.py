"""Typed records: dataclasses checked field by field when read, so a truncated, corrupt or foreign
file is reported with its name and what is wrong, never as a traceback or wrong numbers."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar, Union

from ..errors import RecordError

T = TypeVar("T")
FORMAT_VERSION = 1  # of every JSON document hpctrain writes; readers refuse newer ones


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check(tp: Any, value: Any, where: str) -> Any:
    """`value` converted to `tp`, or RecordError naming the field `where`."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(inner[0], value, where)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, found {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected a mapping, found {type(value).__name__}")
        _, item = typing.get_args(tp)
        return {str(k): _check(item, v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)  # type: ignore[arg-type]
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{where}: expected true/false, found {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{where}: expected an integer, found {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"{where}: expected a number, found {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise RecordError(f"{where}: expected a string, found {value!r}")
        return value
    raise TypeError(f"unsupported record field type {tp!r}")  # a bug in a record definition


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """An instance of the record dataclass `cls` from parsed JSON, every field checked."""
    if not isinstance(data, dict):
        raise RecordError(f"{where or cls.__name__}: expected a JSON object, found {type(data).__name__}")
    hints = _hints(cls)  # type: ignore[arg-type]
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown and not getattr(cls, "EXTRA_KEYS_OK", False):
        raise RecordError(f"{where or cls.__name__}: unknown key(s) {', '.join(unknown)}")
    values = {}
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{key}: missing")
            continue
        values[name] = _check(hints[name], data[name], key)
    if "format_version" in fields and values.get("format_version", 0) > FORMAT_VERSION:
        raise RecordError(
            f"format_version {values['format_version']} is newer than this hpctrain "
            f"reads ({FORMAT_VERSION}): upgrade hpctrain"
        )
    return cls(**values)


def to_dict(record: Any) -> dict[str, Any]:
    """The JSON form of a record (floats stay floats: NaN is written as JSON's NaN extension)."""
    return dataclasses.asdict(record)
