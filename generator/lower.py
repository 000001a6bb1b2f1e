"""Lower: checked IR declarations -> `OpSpec`, everything the templates need for one op.

The family follows from the name, the rank from `2d` or `Vector ℕ d`, β from a `Float` argument;
the hypotheses and binder types become the ordered check list of SEMANTICS §5. An explicit binder
with a default is an optional argument of SEMANTICS §8 (`(groups : ℕ := 1)`): OPTIONAL_ARGUMENTS says
which ones exist, for which families, and what they default to in Python.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from convgen.generator.contract import Family
from convgen.generator.model import (
    NO_LOC,
    App,
    Binder,
    Decl,
    Expr,
    Forall,
    Ident,
    Loc,
    NatLit,
    Ne,
    Prod,
    SpecFile,
)


class Role(enum.Enum):
    """What a geometry parameter means to the op."""

    IN_C = "in_c"  # input channels (the 2d pools' `inC` too)
    OUT_C = "out_c"
    CHANNELS = "channels"  # the N-D pools' `C`: input and output channels
    IN_SPATIAL = "in_spatial"
    KERNEL = "kernel"
    STRIDE = "stride"
    PADDING = "padding"
    # The optional arguments of SEMANTICS §8.
    BATCH = "batch"
    DILATION = "dilation"
    GROUPS = "groups"
    PADDING_MODE = "padding_mode"
    OUTPUT_PADDING = "output_padding"


@dataclass(frozen=True, slots=True)
class GeometryParam:
    """One keyword-only geometry argument of the Python method."""

    python_name: str  # `k_h`
    lean_name: str  # `kH`
    role: Role
    axis: int | None  # 0 for kH/inH, 1 for kW/inW; None for channels, vectors and 2d stride/padding
    is_vector: bool  # `Vector ℕ d`
    optional: bool = False  # an optional argument of SEMANTICS §8, which has `default`
    default: int | str | None = None  # its Python default, which gives the seed's op


class CheckKind(enum.Enum):
    """The checks of SEMANTICS §5, in the order they may appear."""

    BETA = "beta"  # §5.1: finite and nonzero after rounding to float32
    NATURAL = "natural"  # §5.2: an int >= 0, not a bool (params: scalars)
    NATURAL_EACH = "natural_each"  # §5.2: a sequence of such ints (params: vectors)
    SAME_LENGTH = "same_length"  # §5.2: params = (in_spatial, kernel, stride, padding)
    NONZERO = "nonzero"  # §5.2 hypothesis `x ≠ 0` (params: (x,))
    NONZERO_EACH = "nonzero_each"  # §5.2 hypothesis `∀ (i : Fin d), v.get i ≠ 0` (params: (v,))
    RANK = "rank"  # §5.3: 1 <= d <= 8 (params: (in_spatial,))
    STRIDE = "stride"  # §5.4: every stride > 0 (params: (stride,))
    U32_SCALARS = "u32_scalars"  # §5.5: scalars < 2**32, tape-wide "tensor too large" text
    U32_ENTRIES = "u32_entries"  # §5.5: every entry < 2**32, "dimension does not fit in UInt32"
    U32_SHAPES = "u32_shapes"  # §5.5: each vector, read as a shape, fits u32 ("tensor too large")
    # The checks of the optional arguments (SEMANTICS §8). Where a param may be None (its Python
    # default), the check skips it when it is: NATURAL, NATURAL_EACH, SAME_LENGTH, NONZERO_EACH and
    # U32_SCALARS/U32_ENTRIES read `batch`, `dilation` and `output_padding` that way.
    DIVISIBLE = "divisible"  # in_c and out_c divisible by groups (params: (in_c, out_c, groups))
    PADDING_MODE = "padding_mode"  # one of PADDING_MODES (params: (padding_mode,))
    CIRCULAR_PADDING = "circular_padding"  # circular: padding <= in_spatial (params: (mode, padding, in_spatial))
    OUTPUT_PADDING = "output_padding"  # < max(stride, dilation) (params: (output_padding, stride[, dilation]))
    U32_INPUT_SHAPE = "u32_input_shape"  # with a batch, [batch, in_c, *in_spatial] fits u32 (params: those three)


@dataclass(frozen=True, slots=True)
class Check:
    kind: CheckKind
    params: tuple[str, ...]  # Python names, in the order the check visits them


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One entry point, lowered."""

    name: str  # snake_case Python name, also the op name in messages: `max_pool2d_pad`
    lean_name: str  # `Runtime.Autograd.Cuda.Tape.maxPool2dPad`
    doc: str
    family: Family
    rank: int | None  # 2 for the *2d* ops, None for the N-D ops
    id_params: tuple[str, ...]  # positional ids in order: (`kernel_id`, `bias_id`, `input_id`) or (`x_id`,)
    beta_param: str | None  # positional after the ids, smooth max only
    geometry: tuple[GeometryParam, ...]  # keyword-only, in signature order
    checks: tuple[Check, ...]
    options: tuple[GeometryParam, ...] = ()  # keyword-only with defaults (SEMANTICS §8), after the geometry
    loc: Loc = field(default=NO_LOC, compare=False)

    @property
    def reads_first(self) -> bool:
        """SEMANTICS §5 steps 6-7: the *2d* ops read their inputs before sizing the output."""
        return self.rank is not None

    @property
    def padded(self) -> bool:
        return any(p.role is Role.PADDING for p in self.geometry)


# What the spec's names and types mean. checks.py verifies that each of these gives an answer for
# every declaration before `lower_spec` relies on it.

# Longest first, so that `convTranspose2d` is a conv transpose and not a conv.
FAMILY_PREFIXES = (
    ("smoothMaxPool", Family.SMOOTH_MAX_POOL),
    ("convTranspose", Family.CONV_TRANSPOSE),
    ("maxPool", Family.MAX_POOL),
    ("avgPool", Family.AVG_POOL),
    ("conv", Family.CONV),
)

GEOMETRY_ROLES: dict[str, tuple[Role, int | None]] = {  # Lean name -> role and axis
    "inC": (Role.IN_C, None),
    "outC": (Role.OUT_C, None),
    "C": (Role.CHANNELS, None),
    "kH": (Role.KERNEL, 0),
    "kW": (Role.KERNEL, 1),
    "inH": (Role.IN_SPATIAL, 0),
    "inW": (Role.IN_SPATIAL, 1),
    "stride": (Role.STRIDE, None),
    "padding": (Role.PADDING, None),
    "kernel": (Role.KERNEL, None),
    "inSpatial": (Role.IN_SPATIAL, None),
}

RANK_BINDER = "d"  # the length of every `Vector ℕ d`: the rank, not a geometry parameter
NAT = Ident("ℕ")
RESULT_TYPE = App(Ident("Result"), (Prod(Ident("Tape"), NAT),))


class BinderKind(enum.Enum):
    """What a binder's type makes of it; the value is how messages name the type."""

    NAT = "ℕ"  # implicit: geometry (or the rank `d`); explicit: a node id
    FLOAT = "Float"  # β
    TAPE = "Tape"
    VECTOR = "Vector ℕ d"
    HYPOTHESIS = "hypothesis"
    OPTION_NAT = "Option ℕ"  # only as an optional argument: `none` or a natural number
    PADDING_MODE = "PaddingMode"  # only as an optional argument: one of PADDING_MODES


VECTOR = App(Ident("Vector"), (NAT, Ident(RANK_BINDER)))
OPTION_NAT = App(Ident("Option"), (NAT,))
PADDING_MODE = Ident("PaddingMode")
_KIND_OF_TYPE = {
    NAT: BinderKind.NAT,
    Ident("Float"): BinderKind.FLOAT,
    Ident("Tape"): BinderKind.TAPE,
    VECTOR: BinderKind.VECTOR,
    OPTION_NAT: BinderKind.OPTION_NAT,
    PADDING_MODE: BinderKind.PADDING_MODE,
}
PADDING_MODES = {"zeros": False, "circular": True}  # a PaddingMode's values -> whether padding is circular


@dataclass(frozen=True, slots=True)
class OptionalArgument:
    """An optional argument of SEMANTICS §8 as the spec declares it and the Python API takes it."""

    role: Role
    type: Expr
    default: Expr  # the spec's default: the value that leaves the op the seed's
    python_default: int | str | None
    families: frozenset[Family]  # the families that take it
    type_check: CheckKind | None  # SEMANTICS §8 step 2
    build_keyword: str  # its keyword of `Geometry.build`


_ALL_FAMILIES = frozenset(Family)
_CONV_FAMILIES = frozenset({Family.CONV, Family.CONV_TRANSPOSE})

# Lean name -> the argument, in the order SEMANTICS §8 step 2 checks their types. Only the N-D ops
# take them (the *2d* ops stay the seed's).
OPTIONAL_ARGUMENTS: dict[str, OptionalArgument] = {
    "batch": OptionalArgument(Role.BATCH, OPTION_NAT, Ident("none"), None, _ALL_FAMILIES, CheckKind.NATURAL,
                              "batch"),
    "dilation": OptionalArgument(Role.DILATION, VECTOR, NatLit(1), None, _ALL_FAMILIES, CheckKind.NATURAL_EACH,
                                 "dilation"),
    "outputPadding": OptionalArgument(Role.OUTPUT_PADDING, VECTOR, NatLit(0), None,
                                      frozenset({Family.CONV_TRANSPOSE}), CheckKind.NATURAL_EACH, "output_padding"),
    "groups": OptionalArgument(Role.GROUPS, NAT, NatLit(1), 1, _CONV_FAMILIES, CheckKind.NATURAL, "groups"),
    "paddingMode": OptionalArgument(Role.PADDING_MODE, PADDING_MODE, Ident("zeros"), "zeros",
                                    frozenset({Family.CONV}), None, "circular"),
}
_OPTION_ORDER = {argument.role: index for index, argument in enumerate(OPTIONAL_ARGUMENTS.values())}

# SEMANTICS §8 step 4, in order: a check, the role that brings it, and the roles it reads (a role the
# op does not declare is left out of the params: the check then takes its default).
_OPTION_CHECKS = (
    (CheckKind.NONZERO_EACH, Role.DILATION, (Role.DILATION,)),
    (CheckKind.NONZERO, Role.GROUPS, (Role.GROUPS,)),
    (CheckKind.DIVISIBLE, Role.GROUPS, (Role.IN_C, Role.OUT_C, Role.GROUPS)),
    (CheckKind.PADDING_MODE, Role.PADDING_MODE, (Role.PADDING_MODE,)),
    (CheckKind.CIRCULAR_PADDING, Role.PADDING_MODE, (Role.PADDING_MODE, Role.PADDING, Role.IN_SPATIAL)),
    (CheckKind.OUTPUT_PADDING, Role.OUTPUT_PADDING, (Role.OUTPUT_PADDING, Role.STRIDE, Role.DILATION)),
)


def binder_kind(type_: Expr) -> BinderKind | None:
    """The kind of a binder of this type; None for a type the spec does not know."""
    if isinstance(type_, (Ne, Forall)):
        return BinderKind.HYPOTHESIS
    return _KIND_OF_TYPE.get(type_)


def is_rank_binder(name: str, binder: Binder) -> bool:
    """`{d : ℕ}`: the rank that the N-D ops' vectors share, not a geometry parameter."""
    return name == RANK_BINDER and not binder.explicit and binder_kind(binder.type) is BinderKind.NAT


def is_optional(binder: Binder) -> bool:
    """`(groups : ℕ := 1)`: an optional argument (SEMANTICS §8), whatever its type."""
    return binder.default is not None


def _is_upper(char: str) -> bool:
    return "A" <= char <= "Z"


def snake_case(name: str) -> str:
    """`maxPool2dPad` -> `max_pool2d_pad`, `inC` -> `in_c`, `kH` -> `k_h`, `C` -> `c`, `IDFoo` ->
    `id_foo`; digits stay with the word before them (`conv2d`). One pass, linear in the length."""
    pieces = []
    for i, char in enumerate(name):
        before, after = name[i - 1: i], name[i + 1: i + 2]
        starts_word = _is_upper(char) and i > 0 and (
            ("a" <= before <= "z" or "0" <= before <= "9")  # `inC`, `conv2dPad`
            or (_is_upper(before) and "a" <= after <= "z")  # the `F` of `IDFoo`
        )
        pieces.append("_" + char if starts_word else char)
    return "".join(pieces).lower()


def family_from_name(short_name: str) -> Family | None:
    """The family whose camelCase prefix starts the name and ends a word there: the name is the
    prefix, or goes on with a capital or a digit (`conv2d`, `convTranspose`, but not `convex` nor
    `conv_transpose2d`); None if no prefix fits."""
    for prefix, family in FAMILY_PREFIXES:
        rest = short_name.removeprefix(prefix)
        if rest != short_name and (not rest or _is_upper(rest[0]) or "0" <= rest[0] <= "9"):
            return family
    return None


def family_of(decl: Decl) -> Family | None:
    """`@[family X]` where given, else the family of the name."""
    for attribute in decl.attributes:
        if attribute.name == "family":
            return Family(attribute.value)
    return family_from_name(decl.short_name)


def rank_from_name(short_name: str) -> int | None:
    """2 for the `*2d*` ops; None for the others, whose rank is the `d` of their vectors."""
    return 2 if "2d" in short_name else None


def hypothesis_check(prop: Expr) -> tuple[CheckKind, str] | None:
    """The runtime check of a hypothesis and the Lean name it constrains: `x ≠ 0` -> (NONZERO, x),
    `∀ (i : Fin d), v.get i ≠ 0` -> (NONZERO_EACH, v); None for any other proposition."""
    match prop:
        case Ne(Ident(name), NatLit(0)):
            return CheckKind.NONZERO, name
        case Forall(
            (Binder((index,), App(Ident("Fin"), (Ident(rank),)), default=None),),
            Ne(App(Ident(getter), (Ident(indexed),)), NatLit(0)),
        ) if rank == RANK_BINDER and indexed == index and getter.endswith(".get"):
            return CheckKind.NONZERO_EACH, getter.removesuffix(".get")
    return None


def lower_spec(specs: Sequence[SpecFile]) -> tuple[OpSpec, ...]:
    """Every declaration of `specs` lowered, sorted by op name. The specs must pass `check_specs`."""
    return tuple(sorted((lower_decl(decl) for spec in specs for decl in spec.decls), key=lambda op: op.name))


def lower_decl(decl: Decl) -> OpSpec:
    family = family_of(decl)
    assert family is not None, f"{decl.loc}: declaration not checked"
    rank = rank_from_name(decl.short_name)
    id_params: list[str] = []
    beta_param = None
    geometry: list[GeometryParam] = []
    options: list[GeometryParam] = []
    hypotheses: list[Check] = []
    for binder in decl.binders:
        kind = binder_kind(binder.type)
        for name in binder.names:
            if is_optional(binder):
                argument = OPTIONAL_ARGUMENTS[name]
                options.append(GeometryParam(snake_case(name), name, argument.role, None, kind is BinderKind.VECTOR,
                                             optional=True, default=argument.python_default))
            elif kind is BinderKind.HYPOTHESIS:
                check_kind, target = hypothesis_check(binder.type)
                hypotheses.append(Check(check_kind, (snake_case(target),)))
            elif kind is BinderKind.FLOAT:
                beta_param = snake_case(name)
            elif kind is BinderKind.NAT and binder.explicit:
                id_params.append(snake_case(name))
            elif kind in (BinderKind.NAT, BinderKind.VECTOR) and not is_rank_binder(name, binder):
                role, axis = GEOMETRY_ROLES[name]
                geometry.append(GeometryParam(snake_case(name), name, role, axis, kind is BinderKind.VECTOR))
    return OpSpec(
        name=snake_case(decl.short_name),
        lean_name=decl.name,
        doc=" ".join((decl.doc or "").split()),
        family=family,
        rank=rank,
        id_params=tuple(id_params),
        beta_param=beta_param,
        geometry=tuple(geometry),
        checks=_ordered_checks(rank, beta_param, tuple(geometry), tuple(options), tuple(hypotheses)),
        options=tuple(options),
        loc=decl.loc,
    )


# The N-D vectors in the order SEMANTICS §5 names them in its messages.
_ND_VECTOR_ROLES = (Role.IN_SPATIAL, Role.KERNEL, Role.STRIDE, Role.PADDING)


def _ordered_checks(rank: int | None, beta_param: str | None, geometry: tuple[GeometryParam, ...],
                    options: tuple[GeometryParam, ...], hypotheses: tuple[Check, ...]) -> tuple[Check, ...]:
    """The checks of SEMANTICS §5 steps 1-5 with those of §8, in the order the op runs them."""
    scalars = tuple(p.python_name for p in geometry if not p.is_vector)
    vectors = tuple(p.python_name for p in geometry if p.is_vector)
    vector_of = {p.role: p.python_name for p in geometry if p.is_vector}
    nd_vectors = tuple(vector_of[role] for role in _ND_VECTOR_ROLES) if rank is None else ()
    stride = next(p.python_name for p in geometry if p.role is Role.STRIDE)
    options = tuple(sorted(options, key=lambda p: _OPTION_ORDER[p.role]))
    option_vectors = tuple(p.python_name for p in options if p.is_vector)
    option_scalars = tuple(p.python_name for p in options if OPTIONAL_ARGUMENTS[p.lean_name].type_check
                           is CheckKind.NATURAL)
    name_of = {p.role: p.python_name for p in (*geometry, *options) if p.axis is None}
    checks = [Check(CheckKind.BETA, (beta_param,))] if beta_param else []
    checks.append(Check(CheckKind.NATURAL, scalars))
    if vectors:
        checks.append(Check(CheckKind.NATURAL_EACH, vectors))
    checks += [Check(kind, (p.python_name,)) for p in options
               if (kind := OPTIONAL_ARGUMENTS[p.lean_name].type_check) is not None]
    if nd_vectors:
        checks.append(Check(CheckKind.SAME_LENGTH, nd_vectors + option_vectors))
    checks += [Check(kind, tuple(name_of[role] for role in reads if role in name_of))
               for kind, brought_by, reads in _OPTION_CHECKS if brought_by in name_of]
    checks += hypotheses
    if nd_vectors:
        checks.append(Check(CheckKind.RANK, (vector_of[Role.IN_SPATIAL],)))
    checks.append(Check(CheckKind.STRIDE, (stride,)))
    checks.append(Check(CheckKind.U32_SCALARS, scalars + option_scalars))
    if nd_vectors:
        checks.append(Check(CheckKind.U32_ENTRIES, nd_vectors + option_vectors))
        checks.append(Check(CheckKind.U32_SHAPES, (vector_of[Role.IN_SPATIAL], vector_of[Role.KERNEL])))
    if Role.BATCH in name_of:
        in_c = name_of.get(Role.IN_C) or name_of[Role.CHANNELS]
        checks.append(Check(CheckKind.U32_INPUT_SHAPE, (name_of[Role.BATCH], in_c, vector_of[Role.IN_SPATIAL])))
    return tuple(checks)
