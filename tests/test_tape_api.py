"""The tape's API as SEMANTICS §6 gives it, on the CPU tape: a tape is a value, `value` cannot
change the record, backward's rules, its rejections, and leaves whose recorded shape no op can
read. Expected gradients are worked out by hand for ops whose gradient is a plain sum (avg pool,
bias)."""

from __future__ import annotations

import re

import convgen
import numpy as np
import pytest
from reference import record_leaves

POOL = dict(c=1, in_spatial=(4,), kernel=(2,), stride=(2,), padding=(0,))


def test_the_documented_example():
    t = convgen.cpu.Tape()
    t, k = t.leaf(np.ones((1, 1, 2, 2), np.float32))
    t, b = t.leaf(np.zeros(1, np.float32))
    t, x = t.leaf(np.arange(9, dtype=np.float32), shape=(1, 3, 3))
    r = t.conv2d(k, b, x, in_c=1, out_c=1, k_h=2, k_w=2, stride=1, padding=0, in_h=3, in_w=3)
    assert r.is_ok() and r.error is None
    t2, y = r.unwrap()
    np.testing.assert_array_equal(t2.value(y), [[[8, 12], [20, 24]]])
    grads = t2.backward(y, np.ones((1, 2, 2), np.float32)).unwrap()
    assert [g.shape for g in grads] == [(1, 1, 2, 2), (1,), (1, 3, 3), (1, 2, 2)]
    np.testing.assert_array_equal(grads[b], [4])
    np.testing.assert_array_equal(grads[x], [[[1, 2, 1], [2, 4, 2], [1, 2, 1]]])
    np.testing.assert_array_equal(grads[k], [[[[8, 12], [20, 24]]]])


def test_ops_return_new_tapes_and_old_ones_stay_valid():
    t0 = convgen.cpu.Tape()
    t1, a = t0.leaf(np.array([[1, 2, 3, 4]], np.float32))
    t2, p = t1.avg_pool(a, **POOL).unwrap()
    t3, q = t1.max_pool(a, **POOL).unwrap()  # branch from the older tape
    assert (len(t0), len(t1), len(t2), len(t3)) == (0, 1, 2, 2)
    assert a == 0 and p == 1 and q == 1
    assert t2.name(p) == "avg_pool" and t3.name(q) == "max_pool"
    np.testing.assert_array_equal(t2.value(p), [[1.5, 3.5]])
    np.testing.assert_array_equal(t3.value(q), [[2, 4]])
    t4, r = t2.avg_pool(p, **dict(POOL, in_spatial=(2,))).unwrap()
    assert r == 2 and t4.parents(r) == (p,) and len(t2) == 2
    with pytest.raises(convgen.TapeError, match="^autograd: invalid node id$"):
        t1.value(p)


def test_leaf_stores_a_float32_copy():
    source = np.array([[1.0, 2.0]], np.float64)
    t, a = convgen.cpu.Tape().leaf(source, name="a")
    source[0, 0] = 99
    assert t.value(a).dtype == np.float32 and t.value(a)[0, 0] == 1 and t.name(a) == "a"


@pytest.mark.parametrize(("value", "error", "message"), [
    (object(), TypeError, "value must be numbers (an array, a nested sequence or a scalar), got <object object at "),
    ({1: 2}, TypeError, "value must be numbers (an array, a nested sequence or a scalar), got {1: 2}: "),
    ([[1], [2, 3]], ValueError,
     "value must be numbers (an array, a nested sequence or a scalar), got [[1], [2, 3]]: "),
    (10**400, OverflowError,
     "value must be numbers (an array, a nested sequence or a scalar), got an integer of 401 digits: "),
], ids=["object", "dict", "ragged", "huge int"])
def test_a_leaf_value_that_is_not_numbers_is_an_error_naming_the_tape_and_the_value(value, error, message):
    """leaf returns (tape, id), so what it cannot store is raised: NumPy's error, after the tape's device and what was
    given (NumPy's own text varies by version, so only what comes before it is pinned)."""
    with pytest.raises(error) as caught:
        convgen.cpu.Tape().leaf(value)
    assert str(caught.value).startswith(f"autograd: cpu: leaf: {message}")


class RefusesConversion:
    """An object whose own conversion to an array raises something other than NumPy's errors, as a torch tensor that
    requires grad does."""

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("no conversion")

    def __repr__(self) -> str:
        return "RefusesConversion()"


def test_a_leaf_value_whose_own_conversion_fails_is_a_type_error_naming_the_tape_and_the_value():
    with pytest.raises(TypeError) as caught:
        convgen.cpu.Tape().leaf(RefusesConversion())
    assert str(caught.value) == ("autograd: cpu: leaf: value must be numbers (an array, a nested sequence or a scalar), "
                                 "got RefusesConversion(): RuntimeError: no conversion")


NOT_REAL_VALUES = [
    ("1.5", "'1.5'", "strings"), (b"2", "b'2'", "bytes"), ("nan", "'nan'", "strings"),
    ([1, "2", 3.0], "[1, '2', 3.0]", "strings"), (np.array(["1"], dtype=object), "array(['1'], dtype=object)", "strings"),
    (np.array([1 + 2j]), "array([1.+2.j])", "complex numbers"),
    (np.datetime64("2020-01-01"), "np.datetime64('2020-01-01')", "dates"),
    (np.timedelta64(5, "s"), "np.timedelta64(5,'s')", "time spans"),
    (None, "None", "None values"), ([1.0, None], "[1.0, None]", "None values"),
]


@pytest.mark.parametrize(("value", "shown", "what"), NOT_REAL_VALUES, ids=repr)
def test_a_leaf_value_numpy_would_convert_but_that_is_not_real_numbers_is_an_error(value, shown, what):
    """NumPy parses '1.5' and 'nan', counts a date in days and drops an imaginary part; a tape takes none of them."""
    with pytest.raises(TypeError) as caught:
        convgen.cpu.Tape().leaf(value)
    assert str(caught.value) == (f"autograd: cpu: leaf: value must be numbers (an array, a nested sequence or a "
                                 f"scalar), got {shown}: {what} are not real numbers")


@pytest.mark.parametrize(("seed", "shown"), [([["1", "2"]], "[['1', '2']]"),
                                             (np.array([[1 + 1j, 2]]), "array([[1.+1.j, 2.+0.j]])")], ids=repr)
def test_a_seed_of_text_or_complex_values_is_an_error(seed, shown):
    t, a = convgen.cpu.Tape().leaf(np.ones((1, 2), np.float32))
    assert t.backward(a, seed).error == f"autograd: seed gradient must be an array of numbers, got {shown}"


def test_booleans_integers_and_number_objects_are_real_numbers():
    from fractions import Fraction

    for value, stored in (([True, False], [1, 0]), ([1, 2], [1, 2]), ([Fraction(1, 2)], [0.5])):
        t, a = convgen.cpu.Tape().leaf(value)
        np.testing.assert_array_equal(t.value(a), np.array(stored, np.float32))


def test_values_past_the_dtypes_range_are_stored_as_infinities_without_a_warning():
    """float32's rounding takes 1e300 to inf, as IEEE has it; NumPy's overflow warning is not the tape's to pass on
    (made an error, it would stand in for leaf's own). A seed is stored the same way."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t, a = convgen.cpu.Tape().leaf([1e300, -1e300, 1.0])
        grads = t.backward(a, np.array([1e300, 2.0, -1e300])).unwrap()
        t64, b = convgen.cpu.Tape(dtype="float64").leaf(1e300)
    np.testing.assert_array_equal(t.value(a), np.array([np.inf, -np.inf, 1.0], np.float32))
    np.testing.assert_array_equal(grads[a], np.array([np.inf, 2.0, -np.inf], np.float32))
    assert t64.value(b) == 1e300


def test_a_leaf_shape_that_is_not_a_sequence_is_an_error():
    with pytest.raises(TypeError) as caught:
        convgen.cpu.Tape().leaf(np.ones(3, np.float32), shape=3)
    assert str(caught.value) == "autograd: cpu: leaf: shape must be None or a sequence, got 3"


def test_unwrap_raises_tape_error_with_the_message():
    t, a = convgen.cpu.Tape().leaf(np.ones((1, 4), np.float32))
    result = t.avg_pool(a, **dict(POOL, stride=(0,)))
    with pytest.raises(convgen.TapeError) as info:
        result.unwrap()
    assert str(info.value) == "autograd: cpu: avg_pool: stride must be > 0"


def test_backward_rejections():
    t, a = convgen.cpu.Tape().leaf(np.ones((1, 4), np.float32))
    t, p = t.avg_pool(a, **POOL).unwrap()
    assert t.backward(5, np.ones((1, 2), np.float32)).error == "autograd: invalid output id"
    assert t.backward(-1, np.ones((1, 2), np.float32)).error == "autograd: invalid output id"
    assert t.backward(p, np.ones((2, 1), np.float32)).error == "autograd: seed gradient shape mismatch for output"


def test_contributions_add_up_and_frozen_leaves_get_none():
    t = convgen.cpu.Tape()
    t, w = t.leaf(np.full((1, 1, 1), 3, np.float32))  # a 1x1 kernel used by both layers
    t, b = t.leaf(np.zeros(1, np.float32), requires_grad=False)
    t, x = t.leaf(np.array([[2.0]], np.float32))
    t, unused = t.leaf(np.array([[1.0]], np.float32))
    geometry = dict(in_c=1, out_c=1, kernel=(1,), stride=(1,), padding=(0,), in_spatial=(1,))
    t, y1 = t.conv(w, b, x, **geometry).unwrap()
    t, y2 = t.conv(w, b, y1, **geometry).unwrap()  # y2 = w * w * x
    grads = t.backward(y2, np.ones((1, 1), np.float32)).unwrap()
    np.testing.assert_array_equal(t.value(y2), [[18]])
    np.testing.assert_array_equal(grads[w], [[[12]]])  # 2 * w * x, one contribution per layer
    np.testing.assert_array_equal(grads[x], [[9]])
    np.testing.assert_array_equal(grads[y1], [[3]])
    np.testing.assert_array_equal(grads[b], [0])  # requires_grad=False: contributions dropped
    np.testing.assert_array_equal(grads[unused], [[0]])  # not an ancestor of y2


def test_nodes_after_the_output_and_off_its_path_get_zeros():
    t, a = convgen.cpu.Tape().leaf(np.array([[1, 2, 3, 4]], np.float32))
    t, p = t.avg_pool(a, **POOL).unwrap()
    t, q = t.max_pool(a, **POOL).unwrap()
    grads = t.backward(p, np.array([[2, 4]], np.float32)).unwrap()
    np.testing.assert_array_equal(grads[a], [[1, 1, 2, 2]])
    np.testing.assert_array_equal(grads[q], [[0, 0]])
    assert len(grads) == 3


def test_empty_output_is_recorded_and_passes_back_zeros():
    t, a = convgen.cpu.Tape().leaf(np.ones((2, 3), np.float32))
    t, p = t.max_pool(a, c=2, in_spatial=(3,), kernel=(3,), stride=(1,), padding=(2,)).unwrap()  # p > k//2
    assert t.shape(p) == (2, 0) and t.value(p).size == 0
    grads = t.backward(p, np.zeros((2, 0), np.float32)).unwrap()
    np.testing.assert_array_equal(grads[a], np.zeros((2, 3)))


def test_seed_on_a_leaf_is_returned_for_that_leaf():
    t, a = convgen.cpu.Tape().leaf(np.ones((1, 2), np.float32), requires_grad=False)
    grads = t.backward(a, np.array([[5, 6]], np.float32)).unwrap()
    np.testing.assert_array_equal(grads[a], [[5, 6]])


def test_value_is_a_read_only_view_of_the_record():
    t, a = convgen.cpu.Tape().leaf(np.array([[1, 2, 3, 4]], np.float32))
    t2, p = t.max_pool(a, **POOL).unwrap()
    for node in (a, p):
        with pytest.raises(ValueError, match="read-only"):
            t2.value(node)[:] = 7
    np.testing.assert_array_equal(t2.value(a), [[1, 2, 3, 4]])  # and every tape sharing the leaf
    np.testing.assert_array_equal(t.value(a), [[1, 2, 3, 4]])
    np.testing.assert_array_equal(t2.value(p), [[2, 4]])


def test_gradients_never_alias_the_seed_or_the_record():
    t, (a, b) = record_leaves(convgen.cpu.Tape(), [np.ones((1, 4), np.float32), np.ones((1, 2), np.float32)])
    t, p = t.avg_pool(a, **POOL).unwrap()
    seed = np.array([[5, 6]], np.float32)
    for out, seed_array in ((p, seed), (b, seed), (b, t.value(b))):
        grads = t.backward(out, seed_array).unwrap()
        arrays = [seed_array, *(t.value(i) for i in range(len(t)))]
        assert not any(np.shares_memory(g, r) for g in grads for r in arrays)
        grads[out][:] = 0  # a gradient is the caller's to change
    np.testing.assert_array_equal(seed, [[5, 6]])
    np.testing.assert_array_equal(t.value(b), [[1, 1]])


@pytest.mark.parametrize(("seed", "shown"), [
    ("abc", "'abc'"), (b"ab", "b'ab'"), ([[1, 2], [3]], "[[1, 2], [3]]"), (None, "None"),
    ([["1", "x"]], "[['1', 'x']]"), (object(), "<object object at 0x"),
])
def test_a_seed_that_is_not_an_array_of_numbers_is_an_error(seed, shown):
    t, a = convgen.cpu.Tape().leaf(np.ones((1, 2), np.float32))
    error = t.backward(a, seed).error
    assert error.startswith("autograd: seed gradient must be an array of numbers, got " + shown), error


BAD_SHAPES = [(2, -1), (2.0,), (2**20, 2**20), (True, 2), ("2",)]


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=repr)
def test_a_leaf_with_a_shape_no_op_can_read_does_not_break_backward(shape):
    t, a = convgen.cpu.Tape().leaf(np.array([[1, 2, 3, 4]], np.float32))
    t, bad = t.leaf(np.ones(2, np.float32), shape=shape)  # recorded as given: leaf does not validate
    t, frozen = t.leaf(np.ones((3,), np.float32), requires_grad=False)
    t, p = t.avg_pool(a, **POOL).unwrap()
    assert t.shape(bad) == shape and t.value(bad).shape == (2,)  # the flat buffer, as given
    grads = t.backward(p, np.array([[2, 4]], np.float32)).unwrap()
    np.testing.assert_array_equal(grads[a], [[1, 1, 2, 2]])
    np.testing.assert_array_equal(grads[frozen], [0, 0, 0])
    assert grads[bad] is None  # no valid shape: no gradient at all, rather than a failure
    assert t.backward(bad, np.ones(2, np.float32)).error == "autograd: seed gradient shape mismatch for output"


def test_a_leaf_shape_of_floats_is_not_the_shape_of_ints():
    t, bad = convgen.cpu.Tape().leaf(np.ones(4, np.float32), shape=(1.0, 4.0))
    assert t.max_pool(bad, **POOL).error == (
        "autograd: shape mismatch (cpu: max_pool: x_id 0 has shape (1.0, 4.0), expected (1, 4))")
    t, good = t.leaf(np.ones(4, np.float32), shape=np.array([1, 4]))  # NumPy integers are natural numbers
    assert t.max_pool(good, **POOL).is_ok()
    assert t.value(good).shape == (1, 4)


def test_a_shaped_leaf_whose_buffer_is_short_gets_no_gradient():
    t, short = convgen.cpu.Tape().leaf(np.ones(3, np.float32), shape=(1, 4))
    t, a = t.leaf(np.ones((1, 4), np.float32))
    t, p = t.avg_pool(a, **POOL).unwrap()
    assert t.backward(p, np.ones((1, 2), np.float32)).unwrap()[short] is None
    assert re.fullmatch(r"autograd: CPU buffer size mismatch \(shape elements=4, native elements=3\)",
                        t.avg_pool(short, **POOL).error)
