"""Helpers the generated validators call to read Python arguments as the spec's types: natural
numbers, sequences of them (`Vector ℕ d`) and β as a float32 (SEMANTICS §5 steps 1-2).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

TOO_LARGE = "autograd: tensor too large (numel does not fit in UInt32)"


def natural(value: object) -> int | None:
    """`value` as an int when it is a natural number (an integer >= 0, not a bool), else None."""
    if type(value) is int:  # the common case, kept cheap
        return value if value >= 0 else None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        return None
    value = int(value)
    return value if value >= 0 else None


def natural_sequence(param: str, value: object) -> tuple[int, ...] | str:
    """`value` as a tuple of natural numbers, or the message (without the op prefix) saying why not."""
    if type(value) is tuple or type(value) is list:  # the common case, kept cheap
        for entry in value:
            if type(entry) is not int or entry < 0:
                break
        else:
            return tuple(value)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return f"{param} must be a sequence of natural numbers, got {value!r}"
    entries = tuple(value)
    naturals = tuple(natural(entry) for entry in entries)
    for i, n in enumerate(naturals):
        if n is None:
            return f"{param}[{i}] must be a natural number, got {entries[i]!r}"
    return naturals  # type: ignore[return-value]


def real(value: object) -> float | None:
    """`value` as a Python float when it is a real number (int or float, not a bool), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float range: as infinite as float32 will make it
        return math.inf if value > 0 else -math.inf


def float32(value: float) -> float:
    """`value` rounded to float32 (to ±inf past its range, to ±0 below it), as a Python float."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(value))
