"""The JSON types scx_layered's config fields take, as serde reads them, and how a value that does
not fit is described: each check returns None when the value fits, else "expected ..., found ..."."""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional

I32_MIN, I32_MAX = -(2 ** 31), 2 ** 31 - 1

TypeCheck = Callable[[Any], Optional[str]]  # None when the value fits, else "expected ..., found ..."


def show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def found(value: Any) -> str:
    if isinstance(value, bool):
        return f"found {show(value)} (a boolean)"
    if isinstance(value, float):
        return f"found {show(value)} (a number with a fraction or exponent)"
    if is_int(value):
        return f"found {value}"
    if isinstance(value, str):
        return f"found {show(value)} (a string)"
    if value is None:
        return "found null"
    if isinstance(value, list):
        return f"found {show(value)} (an array of {len(value)})"
    return f"found {show(value)} (an object)"


def unsigned(bits: int) -> TypeCheck:
    top = 2 ** bits - 1

    def check(value: Any) -> Optional[str]:
        if is_int(value) and 0 <= value <= top:
            return None
        return f"expected an unsigned {bits}-bit integer (0..{top}, no fraction), {found(value)}"
    return check


def i32(value: Any) -> Optional[str]:
    if is_int(value) and I32_MIN <= value <= I32_MAX:
        return None
    return f"expected a 32-bit signed integer, {found(value)}"


def f64(value: Any) -> Optional[str]:
    if (is_int(value) or isinstance(value, float)) and math.isfinite(value):
        return None
    return f"expected a number, {found(value)}"


def boolean(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else f"expected true or false, {found(value)}"


def string(value: Any) -> Optional[str]:
    return None if isinstance(value, str) else f"expected a string, {found(value)}"


def optional(inner: TypeCheck) -> TypeCheck:
    def check(value: Any) -> Optional[str]:
        if value is None:
            return None
        problem = inner(value)
        return problem and problem.replace("expected ", "expected null or ", 1)
    return check


def pair(first: TypeCheck, second: TypeCheck, what: str) -> TypeCheck:
    def check(value: Any) -> Optional[str]:
        if not isinstance(value, list) or len(value) != 2 or first(value[0]) or second(value[1]):
            return f"expected a 2-element array [{what}], {found(value)}"
        return None
    return check


def vec(inner: TypeCheck, what: str) -> TypeCheck:
    def check(value: Any) -> Optional[str]:
        if not isinstance(value, list) or any(inner(item) for item in value):
            return f"expected an array of {what}, {found(value)}"
        return None
    return check


u32 = unsigned(32)
u64 = unsigned(64)
usize = u64
