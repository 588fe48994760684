"""Checks of machine-sent values (agents' reports, port lists, traces) that name the field at
fault: one error type and the number checks every such parser uses."""

from __future__ import annotations

import math


class FieldError(ValueError):
    """A value refused; ``field`` names where it is (``gpus[3].util``), nothing was written."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def number(value, where: str, lo: float, hi: float) -> float:
    """A finite number within lo..hi (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FieldError(where, f"must be a number, not {value!r}"[:200])
    if not lo <= value <= hi:
        raise FieldError(where, f"{value} is outside {lo:g}..{hi:g}")
    return value


def whole(value, where: str, lo: int, hi: int) -> int:
    """A whole number within lo..hi (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(where, f"must be a whole number, not {value!r}"[:200])
    if not lo <= value <= hi:
        raise FieldError(where, f"{value} is outside {lo}..{hi}")
    return value


def objects(value, where: str, limit: int) -> list[dict]:
    """A list of at most ``limit`` JSON objects."""
    if not isinstance(value, list):
        raise FieldError(where, "must be a list")
    if len(value) > limit:
        raise FieldError(where, f"{len(value)} entries; at most {limit}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise FieldError(f"{where}[{i}]", "must be an object")
    return value
