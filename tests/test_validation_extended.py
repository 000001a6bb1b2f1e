"""SEMANTICS §8's optional arguments (batch, dilation, groups, padding_mode, output_padding) at the
validators: every rejection with its exact text and in check order, through the CPU tape; the
Geometry a valid call builds; and, left at their defaults, validators that are the seed's (compared
with validators generated from the seed's declarations alone). Expected texts and extents are
written out here by hand."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import convgen
import numpy as np
import pytest
from convgen.generated import validators
from convgen.generator import emit
from convgen.generator.checks import check_specs
from convgen.generator.lower import lower_spec
from convgen.generator.parse import parse_spec
from convgen.geometry import Family, Geometry
from hypothesis import given, settings
from hypothesis import strategies as st
from test_validation import naturalish
from test_validation import vectors as naturalish_vectors

TOO_LARGE = "autograd: tensor too large (numel does not fit in UInt32)"
SEED_DECLS = Path(__file__).resolve().parent / "data" / "seed_decls.lean"

CONV = dict(in_c=4, out_c=6, kernel=(2, 2), stride=(1, 1), padding=(0, 0), in_spatial=(4, 4))
POOL = dict(c=2, in_spatial=(4, 4), kernel=(2, 2), stride=(1, 1), padding=(0, 0))
# The N-D ops: positional arguments (ids, β) and valid geometry. The tape is empty: every call
# below fails in the validator, before any id is read.
CALLS = {
    "conv": ((0, 1, 2), CONV),
    "conv_transpose": ((0, 1, 2), CONV),
    "max_pool": ((0,), POOL),
    "avg_pool": ((0,), POOL),
    "smooth_max_pool": ((0, 0.5), POOL),
}


def error(op: str, **changes) -> str:
    positional, geometry = CALLS[op]
    result = getattr(convgen.cpu.Tape(), op)(*positional, **{**geometry, **changes})
    assert not result.is_ok(), "expected an error"
    return result.error


def test_the_methods_take_the_optional_arguments_keyword_only_with_their_defaults():
    def optional(op):
        parameters = inspect.signature(getattr(convgen.cpu.Tape, op)).parameters.values()
        return [(p.name, p.default) for p in parameters
                if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty]

    batch_dilation = [("batch", None), ("dilation", None)]
    assert optional("conv") == [*batch_dilation, ("groups", 1), ("padding_mode", "zeros")]
    assert optional("conv_transpose") == [*batch_dilation, ("groups", 1), ("output_padding", None)]
    assert optional("max_pool") == optional("avg_pool") == optional("smooth_max_pool") == batch_dilation
    assert optional("conv2d") == optional("max_pool2d_pad") == []
    from convgen.generated.ops import CONV_TRANSPOSE, MAX_POOL2D

    assert CONV_TRANSPOSE.option_params == ("batch", "dilation", "groups", "output_padding")
    assert MAX_POOL2D.option_params == ()


REJECTIONS = [
    # Step 2: the types of batch, dilation, output_padding, groups.
    ("conv", dict(batch=-1), "batch must be a natural number, got -1"),
    ("max_pool", dict(batch=True), "batch must be a natural number, got True"),
    ("avg_pool", dict(batch=2.0), "batch must be a natural number, got 2.0"),
    ("smooth_max_pool", dict(batch="3"), "batch must be a natural number, got '3'"),
    ("conv", dict(dilation=2), "dilation must be a sequence of natural numbers, got 2"),
    ("smooth_max_pool", dict(dilation=(1, -1)), "dilation[1] must be a natural number, got -1"),
    ("conv_transpose", dict(output_padding="00"), "output_padding must be a sequence of natural numbers, got '00'"),
    ("conv_transpose", dict(output_padding=[0, None]), "output_padding[1] must be a natural number, got None"),
    ("conv", dict(groups=None), "groups must be a natural number, got None"),
    ("conv_transpose", dict(groups=-2), "groups must be a natural number, got -2"),
    # Step 3: every sequence given has one length.
    ("conv", dict(dilation=(1, 1, 1)),
     "in_spatial, kernel, stride, padding, dilation must have the same length, got 2, 2, 2, 2, 3"),
    ("max_pool", dict(kernel=(2,), dilation=(1, 1)),
     "in_spatial, kernel, stride, padding, dilation must have the same length, got 2, 1, 2, 2, 2"),
    ("conv_transpose", dict(output_padding=(0,)),
     "in_spatial, kernel, stride, padding, output_padding must have the same length, got 2, 2, 2, 2, 1"),
    ("conv_transpose", dict(dilation=(1,), output_padding=(0, 0, 0)),
     "in_spatial, kernel, stride, padding, dilation, output_padding must have the same length, got 2, 2, 2, 2, 1, 3"),
    ("avg_pool", dict(dilation=()), "in_spatial, kernel, stride, padding, dilation must have the same length, "
                                    "got 2, 2, 2, 2, 0"),
    # Step 4.
    ("conv", dict(dilation=(1, 0)), "dilation[1] must be nonzero"),
    ("max_pool", dict(dilation=[0, 0]), "dilation[0] must be nonzero"),
    ("conv", dict(groups=0), "groups must be nonzero"),
    ("conv", dict(groups=4), "in_c and out_c must be divisible by groups, got in_c=4, out_c=6, groups=4"),
    ("conv_transpose", dict(groups=3), "in_c and out_c must be divisible by groups, got in_c=4, out_c=6, groups=3"),
    ("conv", dict(padding_mode="reflect"), "padding_mode must be 'zeros' or 'circular', got 'reflect'"),
    ("conv", dict(padding_mode="Circular"), "padding_mode must be 'zeros' or 'circular', got 'Circular'"),
    ("conv", dict(padding_mode=None), "padding_mode must be 'zeros' or 'circular', got None"),
    ("conv", dict(padding_mode=b"zeros"), "padding_mode must be 'zeros' or 'circular', got b'zeros'"),
    ("conv", dict(padding_mode="circular", padding=(0, 5)),
     "circular padding must not exceed the input extent, got padding[1]=5, in_spatial[1]=4"),
    ("conv_transpose", dict(stride=(2, 2), output_padding=(2, 0)),
     "output_padding[0] must be smaller than stride[0] or dilation[0], got output_padding[0]=2, stride[0]=2, "
     "dilation[0]=1"),
    ("conv_transpose", dict(dilation=(1, 3), output_padding=(0, 3)),
     "output_padding[1] must be smaller than stride[1] or dilation[1], got output_padding[1]=3, stride[1]=1, "
     "dilation[1]=3"),
    # Step 5: the u32 checks, with batch and groups among the scalars, the dilation and output padding
    # among the entries, and the batched input read as a shape.
    ("conv", dict(batch=2**32), f"{TOO_LARGE} (cpu: conv: batch=4294967296 does not fit in UInt32)"),
    ("max_pool", dict(batch=10**50), f"{TOO_LARGE} (cpu: max_pool: batch=an integer of 51 digits does not fit in "
                                     "UInt32)"),
    ("max_pool", dict(dilation=(1, 2**32)), "dimension does not fit in UInt32"),
    ("conv", dict(batch=2**12, in_spatial=(2**10, 2**10)),
     f"{TOO_LARGE} (cpu: conv: input shape (4096, 4, 1024, 1024) has 17179869184 elements)"),
    ("avg_pool", dict(batch=2**31), f"{TOO_LARGE} (cpu: avg_pool: input shape (2147483648, 2, 4, 4) has 68719476736 "
                                    "elements)"),
]


@pytest.mark.parametrize(("op", "changes", "message"), REJECTIONS,
                         ids=[f"{op}-{'-'.join(changes)}" for op, changes, _ in REJECTIONS])
def test_rejection(op, changes, message):
    prefix = "" if message.startswith(TOO_LARGE) else f"autograd: cpu: {op}: "
    assert error(op, **changes) == prefix + message


def test_an_iterator_is_no_dilation():
    assert error("max_pool", dilation=iter((1, 1))).startswith(
        "autograd: cpu: max_pool: dilation must be a sequence of natural numbers, got <tuple_iterator object")


# Two rules broken at once: the first in check order is reported (SEMANTICS §5 and §8).
FIRST_OF_TWO = [
    ("conv", dict(in_c=-1, batch=-1), "in_c must be a natural number, got -1"),
    ("conv", dict(padding=(0, -1), batch=-1), "padding[1] must be a natural number, got -1"),
    ("conv", dict(batch=-1, dilation=(1, -1)), "batch must be a natural number, got -1"),
    ("conv", dict(dilation=(1, -1), groups=-1), "dilation[1] must be a natural number, got -1"),
    ("conv_transpose", dict(dilation=5, output_padding=5), "dilation must be a sequence of natural numbers, got 5"),
    ("conv_transpose", dict(output_padding=(-1, 0), groups=-1), "output_padding[0] must be a natural number, got -1"),
    ("conv", dict(groups=-1, stride=(1, 1, 1)), "groups must be a natural number, got -1"),
    ("conv", dict(stride=(1, 1, 1), dilation=(0, 1)),
     "in_spatial, kernel, stride, padding, dilation must have the same length, got 2, 2, 3, 2, 2"),
    ("conv", dict(dilation=(0, 1), groups=0), "dilation[0] must be nonzero"),
    ("conv", dict(groups=0, padding_mode="reflect"), "groups must be nonzero"),
    ("conv", dict(groups=4, padding_mode="reflect"),
     "in_c and out_c must be divisible by groups, got in_c=4, out_c=6, groups=4"),
    ("conv", dict(padding_mode="reflect", in_c=0), "padding_mode must be 'zeros' or 'circular', got 'reflect'"),
    ("conv", dict(padding_mode="circular", padding=(5, 0), in_c=0),
     "circular padding must not exceed the input extent, got padding[0]=5, in_spatial[0]=4"),
    ("conv_transpose", dict(groups=4, output_padding=(1, 0)),
     "in_c and out_c must be divisible by groups, got in_c=4, out_c=6, groups=4"),
    ("conv_transpose", dict(output_padding=(1, 0), in_c=0),
     "output_padding[0] must be smaller than stride[0] or dilation[0], got output_padding[0]=1, stride[0]=1, "
     "dilation[0]=1"),
    # The output padding bound comes before the seed's stride check: stride 0 there reads as 0.
    ("conv_transpose", dict(stride=(0, 1), output_padding=(1, 0)),
     "output_padding[0] must be smaller than stride[0] or dilation[0], got output_padding[0]=1, stride[0]=0, "
     "dilation[0]=1"),
    ("conv", dict(in_c=0, groups=2), "in_c must be nonzero"),
    ("max_pool", dict(dilation=(0, 1), kernel=(0, 1)), "dilation[0] must be nonzero"),
    ("max_pool", dict(batch=2**32, dilation=(2**32, 1)), f"{TOO_LARGE} (cpu: max_pool: batch=4294967296 does not "
                                                         "fit in UInt32)"),
    ("conv", dict(in_spatial=(2**16, 2**16), batch=2**32 - 1),
     f"{TOO_LARGE} (cpu: conv: in_spatial (65536, 65536) has 4294967296 elements)"),
]


@pytest.mark.parametrize(("op", "changes", "message"), FIRST_OF_TWO,
                         ids=[f"{op}-{'-'.join(changes)}" for op, changes, _ in FIRST_OF_TWO])
def test_the_first_broken_rule_is_reported(op, changes, message):
    prefix = "" if message.startswith(TOO_LARGE) else f"autograd: cpu: {op}: "
    assert error(op, **changes) == prefix + message


def test_the_batched_output_is_sized_by_the_tape():
    huge = dict(in_c=1, out_c=1, kernel=(1, 1), in_spatial=(1, 1), padding=(2**15, 2**15), batch=2)
    assert error("conv", **huge) == (
        f"{TOO_LARGE} (cpu: conv: output shape (2, 1, 65537, 65537) has {2 * 65537**2} elements)")


def test_conv_geometry():
    geometry = validators.conv("cpu", **dict(CONV, padding=(1, 1)), batch=3, dilation=(2, 1), groups=2,
                               padding_mode="circular")
    assert geometry == Geometry.build(Family.CONV, 4, 6, (4, 4), (2, 2), (1, 1), (1, 1), batch=3, dilation=(2, 1),
                                      groups=2, circular=True)
    # Axis 0: the dilated kernel spans 3 cells, (4 + 2 - 3) // 1 + 1 = 4; axis 1: (4 + 2 - 2) // 1 + 1 = 5.
    assert geometry.out_spatial == (4, 5)
    assert geometry.output_shape == (3, 6, 4, 5)
    assert geometry.parent_shapes == ((6, 2, 2, 2), (6,), (3, 4, 4, 4))


def test_numpy_values_are_taken():
    geometry = validators.conv("cpu", **CONV, batch=np.int64(2), dilation=np.array([1, 2]), groups=np.uint8(2),
                               padding_mode=np.str_("circular"))
    assert (geometry.batch, geometry.dilation, geometry.groups, geometry.circular) == (2, (1, 2), 2, True)
    assert type(geometry.batch) is int and type(geometry.groups) is int


def test_conv_transpose_geometry():
    geometry = validators.conv_transpose("cpu", **dict(CONV, stride=(2, 2)), batch=None, dilation=None, groups=1,
                                         output_padding=(1, 0))
    # (4 - 1) * 2 + 2 = 8 per axis, plus the output padding.
    assert geometry.out_spatial == (9, 8)
    assert geometry.output_padding == (1, 0) and geometry.output_shape == (6, 9, 8)
    dilated = validators.conv_transpose("cpu", **CONV, batch=0, dilation=(3, 1), groups=2, output_padding=(2, 0))
    # Axis 0: (4 - 1) * 1 + 4 = 7, + 2 (allowed: 2 < dilation 3); axis 1: (4 - 1) + 2 = 5.
    assert dilated.out_spatial == (9, 5)
    assert dilated.output_shape == (0, 6, 9, 5) and dilated.parent_shapes[0] == (4, 3, 2, 2)


def test_a_dilated_pool_window_may_hold_no_real_cell():
    geometry = validators.max_pool("cpu", c=1, in_spatial=(1,), kernel=(2,), stride=(1,), padding=(2,), batch=None,
                                   dilation=(3,))
    # The window spans 4 cells; padding 2 <= 4 // 2, so (1 + 4 - 4) // 1 + 1 = 2 windows.
    assert geometry.out_spatial == (2,)
    # Without dilation, padding 2 > 2 // 2 gives no window (SEMANTICS §2).
    undilated = validators.max_pool("cpu", c=1, in_spatial=(1,), kernel=(2,), stride=(1,), padding=(2,), batch=None,
                                    dilation=None)
    assert undilated.out_spatial == (0,)


# At their defaults the optional arguments leave every op the seed's: the validators generated from
# the seed's declarations alone give the same Geometry or the same message for any argument.


def generated_validators(spec_text: str, folder: Path, name: str):
    """The validators module generated from `spec_text`, imported as `name`."""
    specs = [parse_spec(spec_text, f"{name}.lean")]
    check_specs(specs)
    path = folder / f"{name}.py"
    path.write_text(emit.python_sources(emit.environment(), lower_spec(specs), path.name)["validators.py"],
                    encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_an_output_padding_without_dilation_is_bounded_by_the_stride(tmp_path):
    spec = ("def T.convTranspose {d inC outC : ℕ} {kernel stride padding inSpatial : Vector ℕ d} (t : Tape) "
            "(kernelId biasId inputId : ℕ) (outputPadding : Vector ℕ d := 0) : Result (Tape × ℕ)\n")
    module = generated_validators(spec, tmp_path, "transpose_validators")
    assert module.conv_transpose("cpu", **dict(CONV, stride=(2, 2)), output_padding=(1, 0)).out_spatial == (9, 8)
    assert module.conv_transpose("cpu", **CONV, output_padding=(0, 1)) == (
        "autograd: cpu: conv_transpose: output_padding[1] must be smaller than stride[1], got output_padding[1]=1, "
        "stride[1]=1")


@pytest.fixture(scope="module")
def seed_validators(tmp_path_factory):
    return generated_validators(SEED_DECLS.read_text(encoding="utf-8"), tmp_path_factory.mktemp("seed"),
                                "seed_validators")


def mostly(valid: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """`valid` about nine times in ten, else `odd` (a plain one_of draws the odd values far more often)."""
    return st.integers(0, 9).flatmap(lambda n: valid if n < 9 else odd)


naturals = mostly(st.integers(1, 6), st.sampled_from([0, -1, True, 2.0, None, "2", 2**32, np.int64(3)]))
odd_sequences = st.one_of(st.lists(naturals, max_size=9), st.sampled_from([3, "ab", None, (2**32,), (2**16, 2**16)]))


def sequences(rank: int, least: int) -> st.SearchStrategy:
    """Mostly valid sequences of one rank, entries >= least, so that many calls pass every check."""
    valid = st.lists(st.integers(least, 4), min_size=rank, max_size=rank).map(tuple)
    return mostly(valid, odd_sequences)


# in_spatial, kernel, stride, padding
vector_sets = st.integers(1, 3).flatmap(lambda rank: st.tuples(*(sequences(rank, least) for least in (0, 1, 1, 0))))
DEFAULTS = {"conv": dict(batch=None, dilation=None, groups=1, padding_mode="zeros"),
            "conv_transpose": dict(batch=None, dilation=None, groups=1, output_padding=None)}


@settings(deadline=None, max_examples=300)
@given(op=st.sampled_from(sorted(CALLS)), channels=st.tuples(naturals, naturals),
       vectors=vector_sets, beta=st.sampled_from([0.5, 0.0, -2, None]))
def test_at_their_defaults_the_validators_are_the_seeds(seed_validators, op, channels, vectors, beta):
    geometry = dict(zip(("in_spatial", "kernel", "stride", "padding"), vectors))
    if op.startswith("conv"):
        geometry.update(in_c=channels[0], out_c=channels[1])
    else:
        geometry.update(c=channels[0])
    positional = ("cpu", beta) if op == "smooth_max_pool" else ("cpu",)
    seed = getattr(seed_validators, op)(*positional, **geometry)
    defaults = DEFAULTS.get(op, dict(batch=None, dilation=None))
    assert getattr(validators, op)(*positional, **geometry, **defaults) == seed


@pytest.mark.parametrize(("stride", "message"), [
    ((True, 1), "stride[0] must be a natural number, got True"),
    ((1.0, 1), "stride[0] must be a natural number, got 1.0"),
    ([1, 1], None), ((np.int64(1), 1), None),
], ids=["bool", "float", "list", "numpy int"])
def test_a_remembered_geometry_is_not_given_to_equal_arguments_of_another_type(stride, message):
    """A valid call's geometry is remembered; a later call whose stride equals it but in a type the validator
    treats otherwise gets its own answer (the bool and the float rejected with their texts, the others the same
    geometry)."""
    tape, x = convgen.cpu.Tape().leaf(np.ones((2, 4, 4), np.float32))
    pooled = tape.max_pool(x, **{**POOL, "stride": (1, 1)}).unwrap()
    result = tape.max_pool(x, **{**POOL, "stride": stride})
    if message is None:
        again = result.unwrap()
        assert again[0].shape(again[1]) == pooled[0].shape(pooled[1]) == (2, 3, 3)
    else:
        assert result.error == f"autograd: cpu: max_pool: {message}"


_OPTIONAL = {"conv": ("batch", "dilation", "groups", "padding_mode"),
             "conv_transpose": ("batch", "dilation", "groups", "output_padding"),
             "max_pool": ("batch", "dilation"), "avg_pool": ("batch", "dilation"), "smooth_max_pool": ("batch", "dilation")}


def _optional_values(images: int | None, valid: bool) -> dict:
    """Strategies for the optional arguments: values the inputs below take, or with `valid` False any mix of those,
    near misses and hostile objects (tests/test_validation.py's strategies)."""
    pair = st.tuples(st.integers(1, 2), st.integers(1, 2))
    good = {"batch": st.just(images), "dilation": st.one_of(st.none(), pair), "groups": st.sampled_from([1, 2]),
            "padding_mode": st.sampled_from(["zeros", "circular"]),
            "output_padding": st.one_of(st.none(), st.tuples(st.integers(0, 1), st.integers(0, 1)))}
    if valid:
        return good
    bad = {"batch": naturalish, "dilation": naturalish_vectors, "groups": naturalish,
           "padding_mode": st.one_of(st.sampled_from(["reflect", "", "ZEROS"]), naturalish),
           "output_padding": naturalish_vectors}
    return {name: st.one_of(good[name], bad[name]) for name in good}


@settings(max_examples=400, deadline=None)
@given(op=st.sampled_from(sorted(_OPTIONAL)), data=st.data(), padding=st.sampled_from([(0, 0), (1, 1), (1, 0)]),
       batched=st.booleans())
def test_no_optional_argument_makes_an_op_raise(op, data, padding, batched):
    """SEMANTICS §8's arguments, drawn valid, off by a little or hostile, on a tape holding inputs that a valid call
    reads: every call returns a Result (an "autograd: " error or a new node), and the tape it was called on is
    unchanged."""
    images = 2 if batched else None
    x_shape = (2, 2, 4, 4) if batched else (2, 4, 4)
    tape = convgen.cpu.Tape()
    ids = []
    for shape in ((2, 2, 2, 2), (2,), x_shape):
        tape, node = tape.leaf(np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 7)
        ids.append(node)
    geometry = dict(CONV, in_c=2, out_c=2) if op.startswith("conv") else dict(POOL)
    geometry["padding"] = padding
    positional = tuple(ids) if op.startswith("conv") else (ids[2], 0.5) if op == "smooth_max_pool" else (ids[2],)
    strategies = _optional_values(images, data.draw(st.booleans(), label="valid"))
    optional = {name: data.draw(strategies[name], label=name) for name in _OPTIONAL[op]}
    before = [tape.value(i).copy() for i in range(len(tape))]
    result = getattr(tape, op)(*positional, **geometry, **optional)
    if result.is_ok():
        new_tape, node = result.unwrap()
        assert node == 3 and new_tape.value(node).dtype == np.float32
    else:
        assert result.error.startswith("autograd: ") and len(result.error) < 400, result.error
    assert len(tape) == 3 and all(np.array_equal(tape.value(i), value) for i, value in enumerate(before))
