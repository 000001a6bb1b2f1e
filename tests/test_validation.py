"""Every rejection of SEMANTICS §5 with its exact text, in check order, on the CPU tape (the CUDA
tests hold the GPU tape to the same Results). Expected texts are written out here by hand."""

from __future__ import annotations

import itertools
import math

import convgen
import numpy as np
import pytest
from convgen.backend import BackendError
from convgen.cpu import NumpyBackend
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import record_leaves

TOO_LARGE = "autograd: tensor too large (numel does not fit in UInt32)"
RNG = np.random.default_rng(7)


def leaves(t):
    """Ids 0-2: a conv's kernel [2,1,2,2], bias [2] and input [1,3,3]; ids 3-4: a transposed conv's
    bias [1] and input [2,3,3] (its kernel [inC=2, outC=1, 2, 2] is id 0)."""
    shapes = ((2, 1, 2, 2), (2,), (1, 3, 3), (1,), (2, 3, 3))
    return record_leaves(t, [RNG.standard_normal(shape).astype(np.float32) + 0.5 for shape in shapes])[0]


@pytest.fixture
def conv_tape():
    return leaves(convgen.cpu.Tape())


CONV2D = dict(in_c=1, out_c=2, k_h=2, k_w=2, stride=1, padding=0, in_h=3, in_w=3)
CONV = dict(in_c=1, out_c=2, kernel=(2, 2), stride=(1, 1), padding=(0, 0), in_spatial=(3, 3))
POOL2D = dict(k_h=2, k_w=2, in_h=3, in_w=3, in_c=1, stride=1)
POOL = dict(c=1, in_spatial=(3, 3), kernel=(2, 2), stride=(1, 1), padding=(0, 0))

# The thirteen entry points with valid arguments over `conv_tape` (x = node 2).
CALLS = {
    "conv2d": ((0, 1, 2), CONV2D),
    "conv_transpose2d": ((0, 3, 4), dict(CONV2D, in_c=2, out_c=1)),
    "conv": ((0, 1, 2), CONV),
    "conv_transpose": ((0, 3, 4), dict(CONV, in_c=2, out_c=1)),
    "max_pool2d": ((2,), POOL2D),
    "max_pool2d_pad": ((2,), dict(POOL2D, padding=1)),
    "max_pool": ((2,), POOL),
    "avg_pool2d": ((2,), POOL2D),
    "avg_pool2d_pad": ((2,), dict(POOL2D, padding=1)),
    "avg_pool": ((2,), POOL),
    "smooth_max_pool2d": ((2, 0.5), POOL2D),
    "smooth_max_pool2d_pad": ((2, 0.5), dict(POOL2D, padding=1)),
    "smooth_max_pool": ((2, 0.5), POOL),
}


def call(t, op, **changes):
    positional, geometry = CALLS[op]
    return getattr(t, op)(*positional, **{**geometry, **changes})


def error_of(result):
    assert not result.is_ok(), "expected an error"
    return result.error


def assert_too_large(result, *details):
    """The seed's text exactly, then a detail in parentheses that names each of `details`."""
    error = error_of(result)
    assert error.startswith(TOO_LARGE + " (cpu: ") and error.endswith(")"), error
    assert all(detail in error for detail in details), (error, details)


@pytest.mark.parametrize("op", sorted(CALLS))
def test_valid_call_succeeds_on_every_op(conv_tape, op):
    result = call(conv_tape, op)
    assert result.is_ok(), result.error
    t, node = result.unwrap()
    assert node == 5 and t.name(node) == op


@pytest.mark.parametrize("op", sorted(CALLS))
def test_zero_stride_is_rejected_on_every_op(conv_tape, op):
    stride = (1, 0) if CALLS[op][1]["stride"] == (1, 1) else 0
    assert error_of(call(conv_tape, op, stride=stride)) == f"autograd: cpu: {op}: stride must be > 0"


@pytest.mark.parametrize("beta", [0, 0.0, -0.0, math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-300, 10**400])
@pytest.mark.parametrize("op", ["smooth_max_pool2d", "smooth_max_pool2d_pad", "smooth_max_pool"])
def test_beta_must_stay_finite_and_nonzero_in_float32(conv_tape, op, beta):
    positional, geometry = CALLS[op]
    result = getattr(conv_tape, op)(positional[0], beta, **geometry)
    assert error_of(result) == f"autograd: cpu: {op}: beta must be finite and nonzero"


def test_beta_that_survives_float32_passes(conv_tape):
    assert conv_tape.smooth_max_pool2d(2, 1e-45, **POOL2D).is_ok()
    assert conv_tape.smooth_max_pool2d(2, np.float64(-3), **POOL2D).is_ok()


@pytest.mark.parametrize("beta", [True, "1.0", None, 1j])
def test_beta_must_be_a_real_number(conv_tape, beta):
    assert error_of(conv_tape.smooth_max_pool2d(2, beta, **POOL2D)) == (
        f"autograd: cpu: smooth_max_pool2d: beta must be a real number, got {beta!r}")


def test_beta_is_checked_before_geometry(conv_tape):
    result = conv_tape.smooth_max_pool2d(2, 0.0, **dict(POOL2D, stride=0, k_h=-1))
    assert error_of(result) == "autograd: cpu: smooth_max_pool2d: beta must be finite and nonzero"


@pytest.mark.parametrize(("value", "shown"), [(-1, "-1"), (True, "True"), (2.0, "2.0"), ("3", "'3'"), (None, "None")])
def test_scalar_geometry_must_be_natural(conv_tape, value, shown):
    assert error_of(call(conv_tape, "conv2d", out_c=value)) == (
        f"autograd: cpu: conv2d: out_c must be a natural number, got {shown}")


def test_natural_checks_follow_signature_order(conv_tape):
    # maxPool2d's binders are {kH kW inH inW inC stride}: in_h is reported before in_c.
    result = call(conv_tape, "max_pool2d", in_c=-1, in_h=-2)
    assert error_of(result) == "autograd: cpu: max_pool2d: in_h must be a natural number, got -2"


def test_numpy_integers_are_natural_numbers(conv_tape):
    assert call(conv_tape, "conv2d", in_c=np.int64(1), stride=np.uint8(1)).is_ok()
    assert call(conv_tape, "conv", kernel=np.array([2, 2])).is_ok()


def test_vector_geometry_must_be_a_sequence_of_naturals(conv_tape):
    assert error_of(call(conv_tape, "conv", kernel=2)) == (
        "autograd: cpu: conv: kernel must be a sequence of natural numbers, got 2")
    assert error_of(call(conv_tape, "conv", kernel="22")) == (
        "autograd: cpu: conv: kernel must be a sequence of natural numbers, got '22'")
    assert error_of(call(conv_tape, "conv", padding=(0, -1))) == (
        "autograd: cpu: conv: padding[1] must be a natural number, got -1")
    assert error_of(call(conv_tape, "max_pool", in_spatial=[3, False])) == (
        "autograd: cpu: max_pool: in_spatial[1] must be a natural number, got False")


def test_sequences_must_share_one_length(conv_tape):
    assert error_of(call(conv_tape, "avg_pool", kernel=(2,), padding=(0, 0, 0))) == (
        "autograd: cpu: avg_pool: in_spatial, kernel, stride, padding must have the same length, got 2, 1, 2, 3")


def test_hypotheses_in_signature_order(conv_tape):
    assert error_of(call(conv_tape, "conv2d", in_c=0, k_h=0)) == "autograd: cpu: conv2d: in_c must be nonzero"
    assert error_of(call(conv_tape, "conv2d", k_w=0, k_h=0)) == "autograd: cpu: conv2d: k_h must be nonzero"
    assert error_of(call(conv_tape, "conv_transpose2d", k_w=0)) == (
        "autograd: cpu: conv_transpose2d: k_w must be nonzero")
    assert error_of(call(conv_tape, "conv", kernel=(2, 0), in_c=0)) == "autograd: cpu: conv: in_c must be nonzero"
    assert error_of(call(conv_tape, "conv", kernel=(2, 0))) == "autograd: cpu: conv: kernel[1] must be nonzero"
    assert error_of(call(conv_tape, "avg_pool2d", k_h=0)) == "autograd: cpu: avg_pool2d: k_h must be nonzero"
    assert error_of(call(conv_tape, "smooth_max_pool", kernel=(0, 0))) == (
        "autograd: cpu: smooth_max_pool: kernel[0] must be nonzero")


def test_rank_limits(conv_tape):
    empty = dict(c=1, in_spatial=(), kernel=(), stride=(), padding=())
    assert error_of(conv_tape.max_pool(2, **empty)) == "autograd: cpu: max_pool: d=0 is not supported"
    nine = dict(c=1, in_spatial=(1,) * 9, kernel=(1,) * 9, stride=(1,) * 9, padding=(0,) * 9)
    assert error_of(conv_tape.max_pool(2, **nine)) == "autograd: cpu: max_pool: rank too large (max 8)"
    assert error_of(conv_tape.max_pool(2, **dict(nine, stride=(0,) * 9))) == (
        "autograd: cpu: max_pool: rank too large (max 8)")


def test_uint32_scalars_entries_and_shapes(conv_tape):
    big = 2**32
    assert_too_large(call(conv_tape, "conv2d", out_c=big), "conv2d", "out_c", "4294967296")
    assert_too_large(call(conv_tape, "max_pool2d", in_w=big), "max_pool2d", "in_w", "4294967296")
    assert_too_large(call(conv_tape, "conv", out_c=big), "conv", "out_c", "4294967296")
    assert error_of(call(conv_tape, "conv", stride=(1, big))) == "autograd: cpu: conv: dimension does not fit in UInt32"
    assert error_of(call(conv_tape, "max_pool", padding=(big, 0))) == (
        "autograd: cpu: max_pool: dimension does not fit in UInt32")
    # Products read as shapes, even with zero channels.
    assert_too_large(call(conv_tape, "conv", out_c=0, in_spatial=(2**16, 2**16)), "conv", "in_spatial", "4294967296")
    assert_too_large(call(conv_tape, "avg_pool", c=0, kernel=(2**16, 2**16)), "avg_pool", "kernel", "4294967296")


def test_2d_ops_read_before_sizing_nd_ops_size_before_reading(conv_tape):
    # A padding of 2**20 on a 1x1 input gives a (2**21+1)**2 output: too large to index.
    huge = dict(CONV2D, k_h=1, k_w=1, in_h=1, in_w=1, padding=2**20)
    assert error_of(conv_tape.conv2d(99, 1, 2, **huge)) == (
        "autograd: invalid node id (cpu: conv2d: kernel_id is 99, the tape has 5 nodes)")
    t, (kernel, x) = record_leaves(conv_tape, [np.ones((2, 1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32)])
    assert error_of(t.conv2d(kernel, 1, x, **huge)) == (
        f"{TOO_LARGE} (cpu: conv2d: output shape (2, 2097153, 2097153) has {2 * 2097153**2} elements)")
    huge_nd = dict(CONV, kernel=(1, 1), in_spatial=(1, 1), padding=(2**20, 2**20))
    assert error_of(conv_tape.conv(99, 1, 2, **huge_nd)) == (
        f"{TOO_LARGE} (cpu: conv: output shape (2, 2097153, 2097153) has {2 * 2097153**2} elements)")


INVALID_IDS = [
    (99, "99"), (5, "5"), (-1, "-1"), (True, "True"), (1.0, "1.0"), ("0", "'0'"), (None, "None"),
    (np.int64(0), "np.int64(0)"), (10**5000, "an integer of 5001 digits"),
]


@pytest.mark.parametrize(("bad_id", "shown"), INVALID_IDS, ids=[shown for _, shown in INVALID_IDS])
def test_invalid_node_ids(conv_tape, bad_id, shown):
    assert error_of(conv_tape.conv2d(0, 1, bad_id, **CONV2D)) == (
        f"autograd: invalid node id (cpu: conv2d: input_id is {shown}, the tape has 5 nodes)")
    assert error_of(conv_tape.max_pool(bad_id, **POOL)) == (
        f"autograd: invalid node id (cpu: max_pool: x_id is {shown}, the tape has 5 nodes)")


def test_inputs_are_read_kernel_then_bias_then_input(conv_tape):
    # Kernel (node 2 has the input's shape) is wrong, and the input id is invalid: the kernel is reported.
    assert error_of(conv_tape.conv2d(2, 1, 99, **CONV2D)) == (
        "autograd: shape mismatch (cpu: conv2d: kernel_id 2 has shape (1, 3, 3), expected (2, 1, 2, 2))")
    assert error_of(conv_tape.conv2d(0, 99, 0, **CONV2D)) == (
        "autograd: invalid node id (cpu: conv2d: bias_id is 99, the tape has 5 nodes)")


def test_shape_and_buffer_mismatches(conv_tape):
    assert error_of(call(conv_tape, "conv2d", in_h=4)) == (
        "autograd: shape mismatch (cpu: conv2d: input_id 2 has shape (1, 3, 3), expected (1, 4, 3))")
    # The kernel is read whole (id, shape, buffer) before the bias, whose shape [2] is wrong for out_c=1.
    t, short_kernel = conv_tape.leaf(np.ones(3, np.float32), shape=(1, 1, 2, 2))
    assert error_of(t.conv2d(short_kernel, 1, 2, **dict(CONV2D, out_c=1))) == (
        "autograd: CPU buffer size mismatch (shape elements=4, native elements=3)")
    t, kernel = conv_tape.leaf(np.ones(4, np.float32), shape=(1, 1, 2, 2))
    assert error_of(t.conv2d(kernel, 1, 2, **dict(CONV2D, out_c=1))) == (
        "autograd: shape mismatch (cpu: conv2d: bias_id 1 has shape (2,), expected (1,))")


def test_a_flat_buffer_with_a_matching_shape_is_used(conv_tape):
    x = conv_tape.value(2)
    t, flat = conv_tape.leaf(x.ravel(), shape=(1, 3, 3))
    a = t.max_pool2d(flat, **POOL2D).unwrap()
    b = t.max_pool2d(2, **POOL2D).unwrap()
    np.testing.assert_array_equal(a[0].value(a[1]), b[0].value(b[1]))


def test_failed_op_leaves_the_tape_unchanged(conv_tape):
    assert not call(conv_tape, "conv2d", stride=0).is_ok()
    assert len(conv_tape) == 5
    t, node = call(conv_tape, "conv2d").unwrap()
    assert node == 5 and len(t) == 6 and len(conv_tape) == 5


def test_missing_or_unknown_keywords_raise_type_error(conv_tape):
    with pytest.raises(TypeError):
        conv_tape.conv2d(0, 1, 2, **{k: v for k, v in CONV2D.items() if k != "in_w"})
    with pytest.raises(TypeError):
        conv_tape.conv2d(0, 1, 2, **CONV2D, dilation=1)
    with pytest.raises(TypeError):
        conv_tape.conv2d(0, 1, 2, 1, 2, 2, 2, 1, 0, 3, 3)  # geometry is keyword-only


class WrongDtypeBackend(NumpyBackend):
    """Returns the other float type than the tape's."""

    def forward(self, geom, inputs):
        out, saved = super().forward(geom, inputs)
        return out.astype(np.float64 if self.dtype == "float32" else np.float32), saved


class ShortOutputBackend(NumpyBackend):
    def forward(self, geom, inputs):
        out, saved = super().forward(geom, inputs)
        return out.ravel()[:-1], saved


class FailingForward(NumpyBackend):
    """Stands for a device that fails in a forward kernel (a launch error, an out-of-memory)."""

    def forward(self, geom, inputs):
        raise BackendError("forward kernel failed: cudaErrorLaunchFailure")


class FailingBackward(NumpyBackend):
    def backward(self, geom, inputs, saved, grad):
        raise BackendError("backward_input kernel failed: cudaErrorLaunchFailure")


def test_backend_failures_become_results_naming_the_op():
    t = leaves(type("FailingTape", (convgen.cpu.Tape,), {"backend_class": FailingForward})())
    assert error_of(t.max_pool(2, **POOL)) == "autograd: cpu: max_pool: forward kernel failed: cudaErrorLaunchFailure"
    assert len(t) == 5
    t = leaves(type("FailingTape", (convgen.cpu.Tape,), {"backend_class": FailingBackward})())
    t, y = t.max_pool(2, **POOL).unwrap()
    assert error_of(t.backward(y, np.ones(t.shape(y), np.float32))) == (
        "autograd: cpu: max_pool: backward_input kernel failed: cudaErrorLaunchFailure")


@pytest.mark.parametrize(("backend", "dtype", "message"), [
    (WrongDtypeBackend, "float32", "autograd: cpu: conv2d: native output is float64 on cpu, expected float32 on cpu"),
    (WrongDtypeBackend, "float64", "autograd: cpu: conv2d: native output is float32 on cpu, expected float64 on cpu"),
    (ShortOutputBackend, "float32", "autograd: CPU buffer size mismatch (shape elements=8, native elements=7)"),
    (ShortOutputBackend, "float64", "autograd: CPU buffer size mismatch (shape elements=8, native elements=7)"),
])
def test_native_output_is_checked_before_recording(backend, dtype, message):
    tape_class = type("CheckedTape", (convgen.cpu.Tape,), {"backend_class": backend})
    t = leaves(tape_class(dtype=dtype))
    assert error_of(t.conv2d(0, 1, 2, **CONV2D)) == message
    assert len(t) == 5


# Hostile arguments: no op raises, and a failed op leaves the tape as it was (SEMANTICS §5).

def test_huge_integers_are_described_not_printed(conv_tape):
    assert error_of(call(conv_tape, "avg_pool", c=-10**5000)) == (
        "autograd: cpu: avg_pool: c must be a natural number, got a negative integer of 5001 digits")
    assert error_of(call(conv_tape, "conv", kernel=[-10**5000, 2])) == (
        "autograd: cpu: conv: kernel[0] must be a natural number, got a negative integer of 5001 digits")
    assert error_of(call(conv_tape, "conv", kernel=[10**5000, 2])).startswith(
        "autograd: cpu: conv: dimension does not fit in UInt32")


@pytest.mark.parametrize(("value", "shown"), [
    (np.array(2), "array(2)"), (itertools.count(1), "count(1)"), (iter([2, 2]), "<list_iterator object"),
    ((n for n in (2, 2)), "<generator object"), ({2, 3}, "{2, 3}"), (b"\x02\x02", "b'\\x02\\x02'"),
], ids=["0-d array", "endless iterator", "iterator", "generator", "set", "bytes"])
def test_only_sized_sequences_are_sequences(conv_tape, value, shown):
    error = error_of(call(conv_tape, "conv", kernel=value))
    assert error.startswith(f"autograd: cpu: conv: kernel must be a sequence of natural numbers, got {shown}"), error


class ClaimsEndlessEntries:
    """A sequence whose len() is 2**62 and whose iterator never ends."""

    def __len__(self) -> int:
        return 2**62

    def __iter__(self):
        return itertools.repeat(1)

    def __repr__(self) -> str:
        return "ClaimsEndlessEntries()"


@pytest.mark.parametrize(("value", "shown", "length"), [
    (range(10**9), "range(0, 1000000000)", 10**9), (ClaimsEndlessEntries(), "ClaimsEndlessEntries()", 2**62),
    (np.ones(65537, np.int64), "array([1, 1, 1, ..., 1, 1, 1], shape=(65537,))", 65537),
], ids=["range", "endless", "array"])
def test_a_sequence_too_long_for_any_op_is_refused_by_its_length_unread(conv_tape, value, shown, length):
    """Read entry by entry, these took seconds and gigabytes (the range) or never ended (the object)."""
    assert error_of(call(conv_tape, "conv", kernel=value)) == (
        f"autograd: cpu: conv: kernel must be a sequence of at most 65536 natural numbers (an op has at most 8 axes), "
        f"got {shown} of {length} entries")
    assert error_of(call(conv_tape, "conv", kernel=range(65536))).startswith(  # read: its entries are checked first
        "autograd: cpu: conv: in_spatial, kernel, stride, padding must have the same length, got 2, 65536, ")


def snapshot(tape):
    return len(tape), [tape.value(i).copy() for i in range(len(tape))]


def assert_unchanged(tape, before):
    count, values = before
    assert len(tape) == count
    for node, value in enumerate(values):
        np.testing.assert_array_equal(tape.value(node), value)


def hostile_objects():
    """Values no geometry, id or β should be: each drawn fresh (iterators are consumed)."""
    fixed = [2**32, 2**64, 10**5000, -10**5000, True, None, 1.5, math.nan, "2", b"2", np.int64(2), np.array(2),
             np.array([2, 2]), [[1, 2]], (), {}, object(), 1j]
    return st.one_of(st.sampled_from(fixed), st.builds(lambda: iter([2, 2])), st.builds(lambda: itertools.count(1)),
                     st.builds(lambda: (n for n in (1, 2))))


naturalish = st.one_of(st.integers(-3, 5), hostile_objects())
vectors = st.one_of(st.lists(naturalish, max_size=10).map(tuple), st.lists(naturalish, max_size=4), naturalish)


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(sorted(CALLS)),
       ids=st.lists(st.one_of(st.sampled_from([0, 1, 2, 3, 4, 9, -1]), hostile_objects()), min_size=3, max_size=3),
       beta=st.one_of(st.floats(), st.integers(), hostile_objects()), scalars=st.lists(naturalish, min_size=8, max_size=8),
       vecs=st.lists(vectors, min_size=4, max_size=4))
def test_no_argument_makes_an_op_raise(op, ids, beta, scalars, vecs):
    t = leaves(convgen.cpu.Tape())
    before = snapshot(t)
    positional, geometry = CALLS[op]
    args = ids[: len([p for p in positional if isinstance(p, int)])]
    if op.startswith("smooth"):
        args.append(beta)
    values = iter(scalars)
    vector_values = iter(vecs)
    drawn = {name: next(vector_values) if isinstance(value, tuple) else next(values)
             for name, value in geometry.items()}
    result = getattr(t, op)(*args, **drawn)
    assert_unchanged(t, before)
    if result.is_ok():
        new_tape, node = result.unwrap()
        assert node == 5 and new_tape.value(node).dtype == np.float32
    else:
        assert result.error.startswith("autograd: ") and len(result.error) < 400, result.error
    assert call(t, "max_pool").is_ok()  # the tape is still usable
