"""Dataclasses to JSON and back, driven by their fields' types: what the typed status
(`status`) and a training observation are written and read with (a dict keyed by int comes
back with int keys). Fields keep their declared order; a dataclass field marked
FLATTEN writes its fields into its parent's object (absent where it is None). Reading ignores
keys it does not know (a newer sender's), and a missing key without a default is a KeyError."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Dict, List, Tuple, Type, TypeVar, Union

T = TypeVar("T")

FLATTEN = {"flatten": True}  # field(metadata=FLATTEN): written into the parent object


def to_json(value: Any) -> Any:
    """Plain JSON data (dicts, lists, numbers, strings, None) of a dataclass or container."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("flatten"):
                out.update(to_json(item) if item is not None else {})
            else:
                out[f.name] = to_json(item)
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(cls: Type[T], data: Any) -> T:
    """An instance of the dataclass cls from what to_json() wrote. KeyError, TypeError or
    ValueError where data is not one."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("flatten"):
            inner = _optional_of(hints[f.name])
            first = dataclasses.fields(inner)[0].name
            own = {k: v for k, v in data.items() if k in json_keys(inner)}
            kwargs[f.name] = from_json(inner, own) if first in data else None
        elif f.name in data:
            kwargs[f.name] = _decode(hints[f.name], data[f.name], f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            raise KeyError(f"{cls.__name__}.{f.name}")
    return cls(**kwargs)  # type: ignore[call-arg]


def json_keys(cls: type) -> Tuple[str, ...]:
    """The keys cls is written with, a flattened field's own included."""
    hints = _hints(cls)
    keys: List[str] = []
    for f in dataclasses.fields(cls):
        keys.extend(json_keys(_optional_of(hints[f.name])) if f.metadata.get("flatten") else (f.name,))
    return tuple(keys)


def _decode(tp: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        return _decode(_optional_of(tp), value, where)
    if dataclasses.is_dataclass(tp):
        return from_json(tp, value)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise TypeError(f"{where}: expected a list, got {type(value).__name__}")
        return [_decode(args[0], v, where) for v in value] if args else list(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object, got {type(value).__name__}")
        key = int if args and args[0] is int else str  # JSON's keys are strings
        return {key(k): _decode(args[1], v, where) for k, v in value.items()} if args else dict(value)
    if tp in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TypeError(f"{where}: expected a number, got {type(value).__name__}")
    if tp is str and not isinstance(value, str):
        raise TypeError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def _optional_of(tp: Any) -> Any:
    """X of Optional[X]."""
    kept = [a for a in typing.get_args(tp) if a is not type(None)]
    return kept[0] if len(kept) == 1 else Any


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> Dict[str, Any]:
    return typing.get_type_hints(cls)
