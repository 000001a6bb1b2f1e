"""`convgen.checking.describe`, which every message uses to show a value: bounded, and it never
raises, whatever the value; and `validated`, which remembers an accepted call's answer, for plain arguments only."""

from __future__ import annotations

import itertools
import numbers

import convgen.cpu
import numpy as np
import pytest
from convgen.checking import DESCRIBE_LIMIT, describe, natural, plain, real, validated


class FailingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class LongRepr:
    def __repr__(self) -> str:
        return "x" * 1000


@pytest.mark.parametrize(("value", "shown"), [
    (-3, "-3"), (10**40 - 1, "9" * 40), (10**40, "an integer of 41 digits"), (10**5000, "an integer of 5001 digits"),
    (-10**5000, "a negative integer of 5001 digits"), (True, "True"), (None, "None"), (1.5, "1.5"), ("3", "'3'"),
    (np.int64(2), "np.int64(2)"), (np.array(2), "array(2)"), (itertools.count(1), "count(1)"),
    ([1, [2, [3, [4]]]], "[1, [2, [3, [...]]]]"), (FailingRepr(), "<FailingRepr object>"),
], ids=["small", "40 digits", "41 digits", "huge", "huge negative", "bool", "None", "float", "str", "numpy int",
        "0-d array", "iterator", "nested", "failing repr"])
def test_describe_shows_the_value(value, shown):
    assert describe(value) == shown


@pytest.mark.parametrize("value", [LongRepr(), "y" * 10**6, list(range(10**5)), np.arange(10**6).reshape(1000, 1000),
                                   [10**5000] * 3], ids=["long repr", "long str", "long list", "array", "huge ints"])
def test_describe_is_bounded(value):
    text = describe(value)
    assert len(text) <= DESCRIBE_LIMIT and ("..." in text or "5001 digits" in text), text


@pytest.mark.parametrize(("args", "floats", "expected"), [
    ((), False, True), (("cpu", 1, None, (2, 3), ()), False, True), ((True,), True, False), ((1.5,), False, False),
    ((1.5, float("inf")), True, True), ((0.0,), True, False), ((-0.0,), True, False), ((float("nan"),), True, False),
    (((1, True),), False, False), ((np.int64(1),), False, False), (([1, 2],), False, False),
    (((1, 2.0),), True, False), ((((1,),),), False, False),
], ids=["none", "ints, str, None, int tuples", "bool", "float", "floats allowed", "zero", "negative zero", "nan",
        "bool in a tuple", "numpy int", "list", "float in a tuple", "nested tuple"])
def test_only_arguments_equality_cannot_confuse_are_plain(args, floats, expected):
    assert plain(args, floats=floats) is expected


def test_an_accepted_calls_answer_is_remembered_for_plain_arguments_alone():
    calls = []

    def check(*args):
        calls.append(args)
        return ("geometry", len(calls)) if args[1] != (0, 0) else f"refusal {len(calls)}"

    assert validated(check, ("cpu", (1, 2), 1)) == ("geometry", 1)
    assert validated(check, ("cpu", (1, 2), 1)) == ("geometry", 1)  # remembered: the check did not run again
    assert validated(check, ("cpu", (1, 2), 1.0)) == ("geometry", 2)  # == the first key: told apart by its type
    assert validated(check, ("cpu", (True, 2), 1)) == ("geometry", 3)  # == the first key, but not plain: checked
    assert validated(check, ("cpu", [1, 2], 1)) == ("geometry", 4)
    assert validated(check, ("cpu", (1, 2), 1.0)) == ("geometry", 2)
    assert validated(check, ("cpu", (0, 0), 1)) == "refusal 5"
    assert validated(check, ("cpu", (0, 0), 1)) == "refusal 6"  # a refusal is not kept
    assert [args[1:] for args in calls] == [((1, 2), 1), ((1, 2), 1.0), ((True, 2), 1), ([1, 2], 1), ((0, 0), 1),
                                            ((0, 0), 1)]


class UnconvertibleInteger:
    """Registered as an Integral, but its conversion fails."""

    def __int__(self) -> int:
        raise ArithmeticError("no int")

    __index__ = __int__

    def __repr__(self) -> str:
        return "UnconvertibleInteger()"


class UnconvertibleReal:
    """Registered as a Real, but its conversion fails."""

    def __float__(self) -> float:
        raise ArithmeticError("no float")

    def __repr__(self) -> str:
        return "UnconvertibleReal()"


numbers.Integral.register(UnconvertibleInteger)
numbers.Real.register(UnconvertibleReal)


def test_a_number_whose_conversion_fails_is_refused_with_a_result() -> None:
    """A registered Integral or Real whose __int__ or __float__ raises is not a number the op can use: the op's
    Result says so, as for any other non-number, instead of the conversion's exception escaping."""
    assert natural(UnconvertibleInteger()) is None and real(UnconvertibleReal()) is None
    tape = convgen.cpu.Tape()
    tape, x = tape.leaf(np.ones((1, 4), np.float32))
    refused = tape.max_pool(x, c=UnconvertibleInteger(), in_spatial=(4,), kernel=(2,), stride=(2,), padding=(0,))
    assert refused.error == "autograd: cpu: max_pool: c must be a natural number, got UnconvertibleInteger()"
    refused = tape.smooth_max_pool(x, UnconvertibleReal(), c=1, in_spatial=(4,), kernel=(2,), stride=(2,),
                                   padding=(0,))
    assert refused.error == "autograd: cpu: smooth_max_pool: beta must be a real number, got UnconvertibleReal()"
    refused = tape.max_pool(x, c=1, in_spatial=(4,), kernel=[UnconvertibleInteger()], stride=(2,), padding=(0,))
    assert refused.error == "autograd: cpu: max_pool: kernel[0] must be a natural number, got UnconvertibleInteger()"
