"""Helpers the generated validators call to read Python arguments as the spec's types: natural
numbers, sequences of them (`Vector ℕ d`) and β as a float32 (SEMANTICS §5 steps 1-2), and
`describe`, which shows any argument in a message; `validated`, a validator's answer remembered for
arguments that cannot be told apart by equality alone.
"""

from __future__ import annotations

import collections.abc
import functools
import itertools
import math
import numbers
import reprlib
from collections.abc import Callable
from typing import Any

import numpy as np

TOO_LARGE = "autograd: tensor too large (numel does not fit in UInt32)"
DESCRIBE_LIMIT = 100  # characters: a message shows the argument, not all of it
# Entries of a geometry sequence (other than a list or tuple, which already holds them) read at most: a longer one is
# refused by its length, unread. Entry by entry, `range(10**9)` took 5 s and 4 GB to be refused, and an object that
# claims 2**62 entries and never stops ended its process.
SEQUENCE_ENTRIES_READ = 1 << 16
_INT_DIGITS_SHOWN = 40  # an int with more digits is shown by its digit count


class _BoundedRepr(reprlib.Repr):
    """`reprlib` with the few limits messages need; ints too long to print are counted, not printed
    (repr of an int past Python's int-to-str limit raises)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxtuple, self.maxlist, self.maxarray = 3, 8, 8, 8
        self.maxdict, self.maxset, self.maxfrozenset, self.maxdeque = 4, 8, 8, 8
        self.maxstring, self.maxother = 60, DESCRIBE_LIMIT

    def repr_int(self, value: int, level: int) -> str:
        digits = _decimal_digits(abs(value))
        if digits <= _INT_DIGITS_SHOWN:
            return int.__repr__(value)
        return f"{'a negative' if value < 0 else 'an'} integer of {digits} digits"

    def repr_instance(self, value: object, level: int) -> str:
        return _bounded(repr(value))  # failures go to describe's fallback (no address: messages stay stable)


def _decimal_digits(n: int) -> int:
    """Decimal digits of n >= 0, without converting it to a string."""
    estimate = max(1, math.floor((n.bit_length() - 1) * math.log10(2)) + 1)
    return estimate + 1 if n >= 10**estimate else estimate


_BOUNDED_REPR = _BoundedRepr()


def describe(value: object) -> str:
    """`value` as messages show it: its repr, at most DESCRIBE_LIMIT characters; never raises
    (a huge int is given by its digit count, an object whose repr fails by its type)."""
    try:
        text = _BOUNDED_REPR.repr(value)
    except Exception:  # a hostile __repr__ or __iter__: say what it is instead
        text = f"<{type(value).__name__} object>"
    return _bounded(text)


def _bounded(text: str) -> str:
    """`text` cut in the middle to DESCRIBE_LIMIT characters."""
    if len(text) <= DESCRIBE_LIMIT:
        return text
    half = (DESCRIBE_LIMIT - 3) // 2
    return text[:half] + "..." + text[len(text) - half:]


def natural(value: object) -> int | None:
    """`value` as an int when it is a natural number (an integer >= 0, not a bool), else None."""
    if type(value) is int:  # the common case, kept cheap
        return value if value >= 0 else None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        return None
    try:
        value = int(value)
    except Exception:  # a registered Integral whose conversion fails is not a number the op can use
        return None
    return value if value >= 0 else None


def natural_sequence(param: str, value: object) -> tuple[int, ...] | str:
    """`value` as a tuple of natural numbers, or the message (without the op prefix) saying why not."""
    if type(value) is tuple or type(value) is list:  # the common case, kept cheap
        for entry in value:
            if type(entry) is not int or entry < 0:
                break
        else:
            return tuple(value)
    entries = _sized_entries(value)
    if entries is None:
        return f"{param} must be a sequence of natural numbers, got {describe(value)}"
    if type(entries) is int:
        return (f"{param} must be a sequence of at most {SEQUENCE_ENTRIES_READ} natural numbers (an op has at most 8 "
                f"axes), got {describe(value)} of {entries} entries")
    naturals = tuple(natural(entry) for entry in entries)
    for i, n in enumerate(naturals):
        if n is None:
            return f"{param}[{i}] must be a natural number, got {describe(entries[i])}"
    return naturals  # type: ignore[return-value]


def _sized_entries(value: object) -> tuple[object, ...] | int | None:
    """The entries of a sized sequence (a list, a tuple, a 1-d array, ...); its length, unread, where that passes
    SEQUENCE_ENTRIES_READ; or None for anything else: a string, a set or mapping (no order), a 0-d array, an
    iterator or generator (which could be endless), or an object whose len() or iteration fails or disagree."""
    if isinstance(value, (str, bytes, bytearray, collections.abc.Set, collections.abc.Mapping)):
        return None
    try:
        length = len(value)  # type: ignore[arg-type]
        if length > SEQUENCE_ENTRIES_READ:
            return length
        entries = tuple(itertools.islice(iter(value), length + 1))  # type: ignore[call-overload]
    except Exception:  # no len() (an iterator, a 0-d array) or a failing __iter__
        return None
    return entries if len(entries) == length else None


def real(value: object) -> float | None:
    """`value` as a Python float when it is a real number (int or float, not a bool), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float range: as infinite as float32 will make it
        return math.inf if value > 0 else -math.inf
    except Exception:  # a registered Real whose conversion fails is not a number the op can use
        return None


def float32(value: float) -> float:
    """`value` rounded to float32 (to ±inf past its range, to ±0 below it), as a Python float."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(value))


def plain(args: tuple[Any, ...], sequence_type: type = tuple, floats: bool = False) -> bool:
    """Whether every argument is None, an int, a str or a tuple (or `sequence_type`) of ints, exactly those types,
    and with `floats` a float other than zero and NaN: arguments that a remembered answer may be keyed by. 1 == 1.0
    == True would share a key (floats need a key that holds their type), -0.0 == 0.0 too, a NaN never equals
    itself, and a list has no hash. Plain loops: this runs on every op call."""
    for value in args:
        kind = type(value)
        if kind is int or kind is str or value is None:
            continue
        if kind is float and floats and value == value and value != 0.0:
            continue
        if kind is not tuple and kind is not sequence_type:
            return False
        for entry in value:
            if type(entry) is not int:
                return False
    return True


class _Refused(Exception):
    """A validator's message, raised out of `_remembered` so that its cache keeps no refusal."""


@functools.lru_cache(maxsize=4096, typed=True)
def _remembered(check: Callable[..., Any], *args: Any) -> Any:
    """`check(*args)` where it is a Geometry, remembered (keyed with each argument's type): the validators are
    pure. A refusal is raised, and so not kept: the arguments of an accepted call are bounded (at most 8 axes, 32-bit
    extents), a refused one's need not be (a tuple of a million ints), and a cache of 4096 of those would keep
    them all alive."""
    answer = check(*args)
    if type(answer) is str:
        raise _Refused(answer)
    return answer


def validated(check: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """A validator's answer (a Geometry or the message) for `args`: an accepted call's remembered when its
    arguments are plain, so that a repeated call skips its checks (half a tiny op's Python on the N-D pools)."""
    if not plain(args, floats=True):
        return check(*args)
    try:
        return _remembered(check, *args)
    except _Refused as refusal:
        return refusal.args[0]
