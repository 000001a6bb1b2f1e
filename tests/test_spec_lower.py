"""Lowering: snake_case names, the family from the name (or `@[family]`), and the full `OpSpec` of
the seed's ops, with the checks of SEMANTICS §5 in order, and those of §8 for the optional arguments."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from convgen.generator import checks
from convgen.generator.checks import check_specs
from convgen.generator.contract import Family
from convgen.generator.lower import (
    GEOMETRY_ROLES,
    Check,
    CheckKind,
    GeometryParam,
    OpSpec,
    Role,
    family_from_name,
    lower_spec,
    snake_case,
)
from convgen.generator.parse import parse_spec

ROOT = Path(__file__).resolve().parent.parent
SEED_DECLS = ROOT / "tests" / "data" / "seed_decls.lean"
OPS_SPEC = ROOT / "spec" / "ops.lean"
SEED_OPS = ("avg_pool avg_pool2d avg_pool2d_pad conv conv2d conv_transpose conv_transpose2d max_pool max_pool2d "
            "max_pool2d_pad smooth_max_pool smooth_max_pool2d smooth_max_pool2d_pad").split()
K = CheckKind
ND_VECTORS = ("in_spatial", "kernel", "stride", "padding")


def load(path: Path) -> tuple[OpSpec, ...]:
    specs = [parse_spec(path.read_text(encoding="utf-8"), path.name)]
    check_specs(specs)
    return lower_spec(specs)


def by_name(path: Path = OPS_SPEC) -> dict[str, OpSpec]:
    return {op.name: op for op in load(path)}


def scalar(lean: str, role: Role, axis: int | None = None) -> GeometryParam:
    return GeometryParam(snake_case(lean), lean, role, axis, is_vector=False)


def vector(lean: str, role: Role) -> GeometryParam:
    return GeometryParam(snake_case(lean), lean, role, None, is_vector=True)


def option(lean: str, role: Role, default: int | str | None, is_vector: bool = False) -> GeometryParam:
    return GeometryParam(snake_case(lean), lean, role, None, is_vector, optional=True, default=default)


BATCH_DILATION = (option("batch", Role.BATCH, None), option("dilation", Role.DILATION, None, is_vector=True))


@pytest.mark.parametrize(("lean", "python"), [
    ("maxPool2dPad", "max_pool2d_pad"), ("convTranspose2d", "conv_transpose2d"),
    ("smoothMaxPool", "smooth_max_pool"), ("avgPool2dPad", "avg_pool2d_pad"), ("conv2d", "conv2d"),
    ("inC", "in_c"), ("kH", "k_h"), ("inSpatial", "in_spatial"), ("kernelId", "kernel_id"),
    ("xId", "x_id"), ("C", "c"), ("beta", "beta"), ("HTTPServer", "http_server"), ("IDFoo", "id_foo"),
    ("ABcDEf", "a_bc_d_ef"), ("a1B", "a1_b"), ("aBC", "a_bc"), ("conv_2d", "conv_2d"), ("ℕx", "ℕx"),
])
def test_snake_case(lean, python):
    assert snake_case(lean) == python


def test_snake_case_is_linear():
    # A regex with nested repetition took minutes here: 100000 capitals then a lower-case letter.
    start = time.perf_counter()
    assert snake_case("A" * 100_000 + "a") == "a" * 99_999 + "_aa"
    assert time.perf_counter() - start < 1


@pytest.mark.parametrize(("name", "family"), [
    ("conv2d", Family.CONV), ("conv", Family.CONV), ("convTranspose2d", Family.CONV_TRANSPOSE),
    ("maxPool2dPad", Family.MAX_POOL), ("avgPool", Family.AVG_POOL),
    ("smoothMaxPool2d", Family.SMOOTH_MAX_POOL), ("convex2d", None), ("pool2d", None), ("MaxPool2d", None),
    # Exact camelCase prefixes: snake_case would read as a forward conv.
    ("conv_transpose2d", None), ("conv_transpose", None), ("max_pool", None), ("conv_", None),
])
def test_family_from_name(name, family):
    assert family_from_name(name) is family


def lower_text(text: str) -> OpSpec:
    specs = [parse_spec(text, "t.lean")]
    check_specs(specs)
    (op,) = lower_spec(specs)
    return op


def test_family_attribute_overrides_the_name():
    max_pool2d = SEED_DECLS.read_text(encoding="utf-8").splitlines()[4]
    assert ".maxPool2d " in max_pool2d
    op = lower_text("@[family avg_pool]\n" + max_pool2d)
    assert op.family is Family.AVG_POOL and op.name == "max_pool2d"


def test_every_geometry_binder_checks_accept_has_a_role():
    for family in Family:
        for rank in (2, None):
            assert set(checks._expected_geometry(family, rank)) <= set(GEOMETRY_ROLES)


def test_all_thirteen_lower_from_both_files_sorted_by_name():
    from_seed, from_ops = load(SEED_DECLS), load(OPS_SPEC)
    assert [op.name for op in from_seed] == [op.name for op in from_ops] == SEED_OPS
    assert all(op.doc == "" for op in from_seed) and all(op.doc for op in from_ops)
    for seed_op, ops_op in zip(from_seed, from_ops, strict=True):
        assert seed_op.geometry == ops_op.geometry and seed_op.options == ()
        # Only the N-D ops take optional arguments; the *2d* ops are the seed's.
        assert (seed_op.checks == ops_op.checks) == (ops_op.options == ()) == (ops_op.rank == 2), ops_op.name


def test_lowering_does_not_depend_on_file_order():
    lines = SEED_DECLS.read_text(encoding="utf-8").splitlines()
    first, second = parse_spec("\n".join(lines[:6]), "a.lean"), parse_spec("\n".join(lines[6:]), "b.lean")
    assert lower_spec([first, second]) == lower_spec([second, first])


# The geometry of the unpadded *2d* pools, in the seed's order.
POOL2D_GEOMETRY = (
    scalar("kH", Role.KERNEL, 0), scalar("kW", Role.KERNEL, 1), scalar("inH", Role.IN_SPATIAL, 0),
    scalar("inW", Role.IN_SPATIAL, 1), scalar("inC", Role.IN_C), scalar("stride", Role.STRIDE),
)
POOL2D_NAMES = ("k_h", "k_w", "in_h", "in_w", "in_c", "stride")


def test_conv2d():
    assert by_name()["conv2d"] == OpSpec(
        name="conv2d",
        lean_name="Runtime.Autograd.Cuda.Tape.conv2d",
        doc="Conv2D forward/backward via ConvPool FFI (single image, channels-first).",
        family=Family.CONV,
        rank=2,
        id_params=("kernel_id", "bias_id", "input_id"),
        beta_param=None,
        geometry=(
            scalar("inC", Role.IN_C), scalar("outC", Role.OUT_C), scalar("kH", Role.KERNEL, 0),
            scalar("kW", Role.KERNEL, 1), scalar("stride", Role.STRIDE), scalar("padding", Role.PADDING),
            scalar("inH", Role.IN_SPATIAL, 0), scalar("inW", Role.IN_SPATIAL, 1),
        ),
        checks=(
            Check(K.NATURAL, ("in_c", "out_c", "k_h", "k_w", "stride", "padding", "in_h", "in_w")),
            Check(K.NONZERO, ("in_c",)),
            Check(K.NONZERO, ("k_h",)),
            Check(K.NONZERO, ("k_w",)),
            Check(K.STRIDE, ("stride",)),
            Check(K.U32_SCALARS, ("in_c", "out_c", "k_h", "k_w", "stride", "padding", "in_h", "in_w")),
        ),
    )


def test_conv():
    assert by_name()["conv"] == OpSpec(
        name="conv",
        lean_name="Runtime.Autograd.Cuda.Tape.conv",
        doc="N-D convolution (CUDA) via ConvPool FFI (rank $\\le 8$).",
        family=Family.CONV,
        rank=None,
        id_params=("kernel_id", "bias_id", "input_id"),
        beta_param=None,
        geometry=(
            scalar("inC", Role.IN_C), scalar("outC", Role.OUT_C), vector("kernel", Role.KERNEL),
            vector("stride", Role.STRIDE), vector("padding", Role.PADDING), vector("inSpatial", Role.IN_SPATIAL),
        ),
        checks=(
            Check(K.NATURAL, ("in_c", "out_c")),
            Check(K.NATURAL_EACH, ("kernel", "stride", "padding", "in_spatial")),
            Check(K.NATURAL, ("batch",)),
            Check(K.NATURAL_EACH, ("dilation",)),
            Check(K.NATURAL, ("groups",)),
            Check(K.SAME_LENGTH, (*ND_VECTORS, "dilation")),
            Check(K.NONZERO_EACH, ("dilation",)),
            Check(K.NONZERO, ("groups",)),
            Check(K.DIVISIBLE, ("in_c", "out_c", "groups")),
            Check(K.PADDING_MODE, ("padding_mode",)),
            Check(K.CIRCULAR_PADDING, ("padding_mode", "padding", "in_spatial")),
            Check(K.NONZERO, ("in_c",)),
            Check(K.NONZERO_EACH, ("kernel",)),
            Check(K.RANK, ("in_spatial",)),
            Check(K.STRIDE, ("stride",)),
            Check(K.U32_SCALARS, ("in_c", "out_c", "batch", "groups")),
            Check(K.U32_ENTRIES, (*ND_VECTORS, "dilation")),
            Check(K.U32_SHAPES, ("in_spatial", "kernel")),
            Check(K.U32_INPUT_SHAPE, ("batch", "in_c", "in_spatial")),
        ),
        options=(*BATCH_DILATION, option("groups", Role.GROUPS, 1), option("paddingMode", Role.PADDING_MODE, "zeros")),
    )


def test_conv_transpose_checks_output_padding_types_before_groups_and_its_bound_last():
    """SEMANTICS §8's order, whatever the signature's: the types of batch, dilation, output_padding,
    then groups; the output padding bound after the groups checks."""
    op = by_name()["conv_transpose"]
    assert op.options == (*BATCH_DILATION, option("groups", Role.GROUPS, 1),
                          option("outputPadding", Role.OUTPUT_PADDING, None, is_vector=True))
    assert op.checks[2:10] == (
        Check(K.NATURAL, ("batch",)),
        Check(K.NATURAL_EACH, ("dilation",)),
        Check(K.NATURAL_EACH, ("output_padding",)),
        Check(K.NATURAL, ("groups",)),
        Check(K.SAME_LENGTH, (*ND_VECTORS, "dilation", "output_padding")),
        Check(K.NONZERO_EACH, ("dilation",)),
        Check(K.NONZERO, ("groups",)),
        Check(K.DIVISIBLE, ("in_c", "out_c", "groups")),
    )
    assert op.checks[10] == Check(K.OUTPUT_PADDING, ("output_padding", "stride", "dilation"))
    assert Check(K.U32_ENTRIES, (*ND_VECTORS, "dilation", "output_padding")) in op.checks


def test_optional_arguments_lower_in_signature_order_and_checks_in_semantics_order():
    text = ("def T.convTranspose {d inC outC : ℕ} {kernel stride padding inSpatial : Vector ℕ d} (t : Tape) "
            "(kernelId biasId inputId : ℕ) (outputPadding : Vector ℕ d := 0) (groups : ℕ := 1) "
            ": Result (Tape × ℕ)")
    op = lower_text(text)
    assert [p.python_name for p in op.options] == ["output_padding", "groups"]
    assert [c for c in op.checks if c.kind in (K.NATURAL, K.NATURAL_EACH)][2:] == [
        Check(K.NATURAL_EACH, ("output_padding",)), Check(K.NATURAL, ("groups",))]
    # Without a dilation the bound reads the stride only.
    assert Check(K.OUTPUT_PADDING, ("output_padding", "stride")) in op.checks
    assert not any(c.kind is K.U32_INPUT_SHAPE for c in op.checks)


def test_max_pool2d():
    assert by_name()["max_pool2d"] == OpSpec(
        name="max_pool2d",
        lean_name="Runtime.Autograd.Cuda.Tape.maxPool2d",
        doc="MaxPool2D via ConvPool FFI (no padding).",
        family=Family.MAX_POOL,
        rank=2,
        id_params=("x_id",),
        beta_param=None,
        geometry=POOL2D_GEOMETRY,
        checks=(
            Check(K.NATURAL, POOL2D_NAMES),
            Check(K.NONZERO, ("k_h",)),
            Check(K.NONZERO, ("k_w",)),
            Check(K.STRIDE, ("stride",)),
            Check(K.U32_SCALARS, POOL2D_NAMES),
        ),
    )


def test_smooth_max_pool2d_pad():
    op = by_name()["smooth_max_pool2d_pad"]
    assert op == OpSpec(
        name="smooth_max_pool2d_pad",
        lean_name="Runtime.Autograd.Cuda.Tape.smoothMaxPool2dPad",
        doc="Smooth max-pool2d (log-sum-exp surrogate) via ConvPool FFI, with symmetric padding. beta is "
            "checked after conversion to Float32, because conversion can underflow a nonzero Float to zero or "
            "overflow a finite one to infinity.",
        family=Family.SMOOTH_MAX_POOL,
        rank=2,
        id_params=("x_id",),
        beta_param="beta",
        geometry=(*POOL2D_GEOMETRY, scalar("padding", Role.PADDING)),
        checks=(
            Check(K.BETA, ("beta",)),
            Check(K.NATURAL, (*POOL2D_NAMES, "padding")),
            Check(K.NONZERO, ("k_h",)),
            Check(K.NONZERO, ("k_w",)),
            Check(K.STRIDE, ("stride",)),
            Check(K.U32_SCALARS, (*POOL2D_NAMES, "padding")),
        ),
    )
    assert op.padded and op.reads_first


def test_avg_pool():
    assert by_name()["avg_pool"] == OpSpec(
        name="avg_pool",
        lean_name="Runtime.Autograd.Cuda.Tape.avgPool",
        doc="N-D average pooling (CUDA) via ConvPool FFI (rank $\\le 8$).",
        family=Family.AVG_POOL,
        rank=None,
        id_params=("x_id",),
        beta_param=None,
        geometry=(
            scalar("C", Role.CHANNELS), vector("inSpatial", Role.IN_SPATIAL), vector("kernel", Role.KERNEL),
            vector("stride", Role.STRIDE), vector("padding", Role.PADDING),
        ),
        checks=(
            Check(K.NATURAL, ("c",)),
            Check(K.NATURAL_EACH, ND_VECTORS),
            Check(K.NATURAL, ("batch",)),
            Check(K.NATURAL_EACH, ("dilation",)),
            Check(K.SAME_LENGTH, (*ND_VECTORS, "dilation")),
            Check(K.NONZERO_EACH, ("dilation",)),
            Check(K.NONZERO_EACH, ("kernel",)),
            Check(K.RANK, ("in_spatial",)),
            Check(K.STRIDE, ("stride",)),
            Check(K.U32_SCALARS, ("c", "batch")),
            Check(K.U32_ENTRIES, (*ND_VECTORS, "dilation")),
            Check(K.U32_SHAPES, ("in_spatial", "kernel")),
            Check(K.U32_INPUT_SHAPE, ("batch", "c", "in_spatial")),
        ),
        options=BATCH_DILATION,
    )


def test_hypotheses_keep_signature_order_implicit_or_explicit():
    text = ("def T.avgPool2dPad {kH kW inH inW inC stride padding : ℕ} (h1 : kW ≠ 0) {h2 : inC ≠ 0}"
            " (t : Tape) (xId : ℕ) (h3 : kH ≠ 0) : Result (Tape × ℕ)")
    op = lower_text(text)
    assert [c.params for c in op.checks if c.kind is K.NONZERO] == [("k_w",), ("in_c",), ("k_h",)]
