"""Typed records: dataclasses checked field by field when read, so a truncated, corrupt or foreign
file is reported with its name and what is wrong, never as a traceback or wrong numbers."""

from __future__ import annotations

import dataclasses
import functools
import math
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
            if v is None:  # how a NaN or infinity is written (to_dict): not a finite number
                return math.nan
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
        arg = typing.get_args(tp)[0]
        item = _checker(arg)
        exact = arg if arg in (float, int, str) else None  # JSON gives these types as they are

        def check_list(v: Any, where: str) -> Any:
            if type(v) is not list:
                raise _fail(where, "a list", v)
            if exact is not None and all(type(x) is exact for x in v):
                return list(v)  # the common case, without a where-string per element
            return [item(x, f"{where}[{i}]") for i, x in enumerate(v)]

        return check_list
    if origin is dict:
        value = _checker(typing.get_args(tp)[1])

        def check_dict(v: Any, where: str) -> Any:
            if type(v) is not dict:
                raise _fail(where, "a mapping", v)
            return {str(k): value(x, f"{where}.{k}") for k, x in v.items()}

        return check_dict
    if hasattr(tp, "check_record"):  # a type that reads itself (records/parts.py: Parts)
        return typing.cast(Check, tp.check_record)
    if dataclasses.is_dataclass(tp):
        return lambda v, where: from_dict(tp, v, where)  # type: ignore[arg-type]
    return _scalar(tp)


@functools.cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(name for name, _, _ in _fields(cls))


@functools.cache
def _required(cls: type) -> frozenset[str]:
    return frozenset(name for name, required, _ in _fields(cls) if required)


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


_CONDITIONS = {
    int: "type(v) is int",
    float: "type(v) is float",
    str: "type(v) is str",
    bool: "v is True or v is False",
}


@functools.cache
def _flat_reader(cls: type) -> Callable[[Any], Any] | None:
    """For a record of scalar fields and parts only (RankSummary: 10,000 runs x their ranks in a
    study; StepRecord: a line per step), a reader generated once that checks every scalar inline,
    reads the parts and builds the record, or returns None when anything is off (an older form of
    the record included), for the general path to say what. None if `cls` is not flat."""
    hints = typing.get_type_hints(cls)
    checks: list[str] = []
    nulls: list[str] = []
    readers: dict[str, Check] = {}  # fields of a type that reads itself (parts): called as such
    if "format_version" in hints or hasattr(cls, "__post_init__"):  # the general path's checks
        return None
    for name, required, check in _fields(cls):
        tp, optional = hints[name], False
        if hasattr(tp, "check_record") and not required:
            readers[name] = check
            continue
        if typing.get_origin(tp) in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp, optional = (args[0], True) if len(args) == 1 else (None, False)
        if tp not in _CONDITIONS:
            return None
        cond = _CONDITIONS[tp].replace("v", f"d[{name!r}]")
        if tp is float and not optional:
            nulls.append(name)  # null is how a NaN is written: read back as NaN (check_float)
        cond = f"(d[{name!r}] is None or {cond})" if optional or tp is float else f"({cond})"
        checks.append(cond if required else f"({name!r} not in d or {cond})")
    code = (
        "def read(d):\n"
        "    if len(d) > N or not REQUIRED <= d.keys() or not d.keys() <= NAMES:\n        return None\n"
        f"    if not ({' and '.join(checks) or 'True'}):\n        return None\n"
        "    record = NEW(CLS)\n"
        "    record.__dict__.update(DEFAULTS)\n"
        "    record.__dict__.update(d)\n"  # what CLS(**d) does, without a frozen __setattr__ per field
        "    for name in NULLS:\n"
        "        if record.__dict__[name] is None:\n            record.__dict__[name] = NAN\n"
        "    for name, read in READERS.items():\n"
        "        try:\n"
        "            record.__dict__[name] = read(d[name], name) if name in d else FACTORIES[name]()\n"
        "        except RecordError:\n            return None\n"
        "    return record\n"
    )
    scope: dict[str, Any] = {
        "CLS": cls,
        "N": len(_fields(cls)),
        "REQUIRED": _required(cls),
        "NAMES": frozenset(name for name, _, _ in _fields(cls)),
        "NEW": object.__new__,
        "NULLS": tuple(nulls),
        "NAN": math.nan,
        "READERS": readers,
        "RecordError": RecordError,
        "FACTORIES": {f.name: f.default_factory for f in dataclasses.fields(cls) if f.name in readers},
        "DEFAULTS": {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        },
    }
    exec(code, scope)  # noqa: S102 - code built above from the record's own field names
    return scope["read"]  # type: ignore[no-any-return]


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """An instance of the record dataclass `cls` from parsed JSON, every field checked."""
    fast = _flat_reader(cls)  # type: ignore[arg-type]
    if fast is not None and type(data) is dict:
        record = fast(data)
        if record is not None:
            return record  # type: ignore[no-any-return]
    if type(data) is not dict:
        raise RecordError(f"{where or cls.__name__}: expected a JSON object, found {type(data).__name__}")
    migrate = getattr(cls, "migrate", None)  # an older form of the record (RunSummary)
    if migrate is not None:
        data = migrate(data)
    fields = _fields(cls)  # type: ignore[arg-type]
    names = _names(typing.cast(type, cls))
    if not data.keys() <= names and not getattr(cls, "EXTRA_KEYS_OK", False):
        unknown = ", ".join(sorted(set(data) - names))
        raise RecordError(f"{where or cls.__name__}: unknown key(s) {unknown}")
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


SCALARS = (int, float, str, bool, type(None))


def to_dict(record: Any) -> dict[str, Any]:
    """The JSON form of a record. A float that is not finite (a NaN loss, a zero throughput's
    ratio) becomes null: JSON has no NaN, and readers that follow the standard refuse Python's
    extension; reading null into a float field gives NaN back. dataclasses.asdict deep-copies
    every value; records hold only scalars, lists and dicts."""
    out = _plain(record)
    if not isinstance(out, dict):
        raise TypeError(f"{type(record).__name__} is not a record")  # a bug, never user input
    return out


_FIELDS: dict[type, tuple[str, ...]] = {}  # a record type's field names, asked once (a step record a step)


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind in SCALARS:
        return value
    names = _FIELDS.get(kind)
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {n: _plain(getattr(value, n)) for n in names}
    if isinstance(value, list | tuple):
        if all(type(x) in SCALARS and (type(x) is not float or math.isfinite(x)) for x in value):
            return list(value)
        return [_plain(x) for x in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
