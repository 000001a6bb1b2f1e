"""Checks: parsed `SpecFile`s -> nothing, or a `SpecError` at the first declaration lowering cannot take.

Verifies every assumption of lower.py: names that are safe in C and Python, a known family and rank,
known binder types, the arguments and geometry each kind of op takes, the optional arguments of
SEMANTICS §8 each family takes (lower.OPTIONAL_ARGUMENTS), hypotheses over its geometry.
"""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Sequence
from typing import NoReturn

from convgen.generator.contract import Family
from convgen.generator.lower import (
    FAMILY_PREFIXES,
    OPTIONAL_ARGUMENTS,
    RANK_BINDER,
    RESULT_TYPE,
    BinderKind,
    CheckKind,
    binder_kind,
    family_of,
    hypothesis_check,
    is_optional,
    is_rank_binder,
    rank_from_name,
    snake_case,
)
from convgen.generator.model import Decl, Loc, SpecError, SpecFile, format_expr

# C++ (CUDA compiles C++) and C keywords in lower case: what a snake_case name can collide with.
_CPP_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
    nullptr operator or or_eq private protected public register reinterpret_cast requires restrict
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
    wchar_t while xor xor_eq
""".split())

# Every name the generated Python introduces itself starts with `_` (`_math`, `_checked`), which spec
# names cannot, so these are the names left that an op, id or β could collide with:
# - builtins, which the generated validators call (`len`, `max`) and would be shadowed;
_PYTHON_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))
# - the public attributes of the tape (convgen.tape.Tape and its backends), which would hide an op
#   method of the same name (tests/test_spec_errors.py keeps this list complete);
TAPE_ATTRIBUTES = frozenset({"backend_class", "backward", "dtype", "leaf", "name", "parents", "precision", "shape",
                             "value"})
# - the module-level names of generated/ops.py that an op's constant (its name in capitals) could take.
OPS_MODULE_NAMES = frozenset({"OPS"})

_FAMILY_VALUES = tuple(f.value for f in Family)
_EXPLICIT_ONLY = {BinderKind.TAPE, BinderKind.FLOAT}  # what the caller passes by position
_IMPLICIT_ONLY = {BinderKind.VECTOR}  # geometry, passed by keyword (unless optional)
_OPTIONAL_ONLY = {BinderKind.OPTION_NAT, BinderKind.PADDING_MODE}  # types only the optional arguments have


def check_specs(specs: Sequence[SpecFile]) -> None:
    """Raise `SpecError` for the first problem in `specs`, file by file in order; declarations must
    have distinct Python names across all the files."""
    if specs and not any(spec.decls for spec in specs):
        files = ", ".join(spec.path for spec in specs)
        raise SpecError(Loc(specs[0].path, 1, 1), f"no op declared in {files}: a spec needs at least one 'def' "
                                                  "(building would leave the tape without ops)", specs[0].source)
    first_declared: dict[str, Decl] = {}
    for spec in specs:
        for decl in spec.decls:
            _DeclChecker(decl, spec.source).check()
            op_name = snake_case(decl.short_name)
            if op_name in first_declared:
                message = f"duplicate declaration '{op_name}' (first declared at {first_declared[op_name].loc})"
                raise SpecError(decl.loc, message, spec.source)
            first_declared[op_name] = decl


def _identifier_problem(python_name: str) -> str | None:
    """Why a snake_case name cannot appear in generated C or Python, or None if it can."""
    if not python_name.isascii():
        return "not ASCII"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", python_name):
        return "not a C or Python identifier"
    if python_name.startswith("_") or "__" in python_name:
        return "reserved in C++ (a leading or double underscore)"
    if keyword.iskeyword(python_name):
        return "a Python keyword"
    if python_name == "self":
        return "the name of the tape in the generated methods"
    if python_name in _CPP_KEYWORDS:
        return "a C++ keyword"
    if python_name in _PYTHON_BUILTINS:
        return "a Python builtin, which the generated code uses"
    return None


def _op_name_problem(python_name: str) -> str | None:
    """Why an op cannot have this snake_case name beyond `_identifier_problem`, or None if it can."""
    if python_name in TAPE_ATTRIBUTES:
        return f"the tape's own '{python_name}' would hide the op"
    if python_name.upper() in OPS_MODULE_NAMES:
        return f"its constant '{python_name.upper()}' is taken in generated/ops.py"
    return None


def _expected_arguments(family: Family) -> tuple[list[BinderKind], str]:
    """The kinds of the explicit arguments an op of `family` takes, in order, and how to say so."""
    if family.is_conv:
        return [BinderKind.TAPE] + [BinderKind.NAT] * 3, "'(t : Tape)' and 3 node ids (kernel, bias, input)"
    if family is Family.SMOOTH_MAX_POOL:
        return [BinderKind.TAPE, BinderKind.NAT, BinderKind.FLOAT], "'(t : Tape)', 1 node id and '(beta : Float)'"
    return [BinderKind.TAPE, BinderKind.NAT], "'(t : Tape)' and 1 node id"


def _expected_geometry(family: Family, rank: int | None) -> dict[str, BinderKind]:
    """The geometry binders an op of this family and rank takes (Lean name -> kind), in the seed's
    order. The *2d* ops may leave out `padding`."""
    channels = ("inC", "outC") if family.is_conv else ("inC",) if rank == 2 else ("C",)
    if rank == 2:
        spatial, kind = ("kH", "kW", "stride", "padding", "inH", "inW"), BinderKind.NAT
    else:
        spatial, kind = ("inSpatial", "kernel", "stride", "padding"), BinderKind.VECTOR
    return {name: BinderKind.NAT for name in channels} | {name: kind for name in spatial}


class _DeclChecker:
    """The checks of one declaration, roughly in the order of the text they look at."""

    def __init__(self, decl: Decl, source: str) -> None:
        self.decl = decl
        self.source = source
        # Every name the signature binds, with its binder and the binder's kind, in signature order.
        self.bound = [(name, binder, binder_kind(binder.type)) for binder in decl.binders for name in binder.names]

    def fail(self, loc: Loc, message: str) -> NoReturn:
        raise SpecError(loc, message, self.source)

    def check(self) -> None:
        self.check_attributes()
        self.check_identifiers()
        family = self.family()
        self.check_binder_types()
        if self.decl.result != RESULT_TYPE:
            self.fail(self.decl.result.loc,
                      f"the result type must be 'Result (Tape × ℕ)', got '{format_expr(self.decl.result)}'")
        rank = self.rank()
        self.check_optional_arguments(family, rank)
        self.check_arguments(family)
        self.check_geometry(family, rank)
        self.check_hypotheses()

    def check_attributes(self) -> None:
        seen: set[str] = set()
        for attribute in self.decl.attributes:
            if attribute.name != "family":
                self.fail(attribute.loc, f"unknown attribute '{attribute.name}' (the one attribute is 'family')")
            if attribute.name in seen:
                self.fail(attribute.loc, f"duplicate attribute '{attribute.name}'")
            seen.add(attribute.name)
            if attribute.value not in _FAMILY_VALUES:
                got = f"'{attribute.value}'" if attribute.value else "nothing"
                self.fail(attribute.loc, f"'@[family X]' takes X among {', '.join(_FAMILY_VALUES)}, got {got}")

    def check_identifiers(self) -> None:
        """Names that reach generated code must be safe there, and binders distinct once snake_cased."""
        op_name = self.check_identifier(self.decl.short_name, self.decl.loc)
        problem = _op_name_problem(op_name)
        if problem:
            self.fail(self.decl.loc, f"'{op_name}' cannot be an op name: {problem}")
        first_of: dict[str, str] = {}
        for name, binder, _ in self.bound:
            python_name = self.check_identifier(name, binder.name_loc(name))
            if python_name in first_of:
                self.fail(binder.name_loc(name), f"duplicate binder '{name}' ('{first_of[python_name]}' "
                                                 f"is '{python_name}' too)")
            first_of[python_name] = name

    def check_identifier(self, name: str, loc: Loc) -> str:
        python_name = snake_case(name)
        problem = _identifier_problem(python_name)
        if problem:
            shown = f"'{name}'" if python_name == name else f"'{name}' (as '{python_name}')"
            self.fail(loc, f"{shown} cannot appear in generated C or Python: {problem}")
        return python_name

    def family(self) -> Family:
        family = family_of(self.decl)
        if family is None and "_" in self.decl.short_name:
            self.fail(self.decl.loc, f"cannot tell the family of '{self.decl.short_name}': spec names are camelCase "
                                     "(the Python name is derived from it: 'convTranspose2d' is "
                                     "'conv_transpose2d'); rename it, or add '@[family X]' with X among "
                                     f"{', '.join(_FAMILY_VALUES)}")
        if family is None:
            prefixes = ", ".join(prefix for prefix, _ in FAMILY_PREFIXES)
            self.fail(self.decl.loc, f"cannot tell the family of '{self.decl.short_name}': the name starts with "
                                     f"none of {prefixes}; add '@[family X]' with X among {', '.join(_FAMILY_VALUES)}")
        return family

    def check_binder_types(self) -> None:
        for binder in self.decl.binders:
            kind = binder_kind(binder.type)
            spelled = f"{' '.join(binder.names)} : {format_expr(binder.type)}"
            if kind is None:
                self.fail(binder.type.loc, f"unknown type '{format_expr(binder.type)}': a binder is ℕ, Float, "
                                           "Tape, Vector ℕ d, Option ℕ, PaddingMode or a hypothesis")
            if kind in _EXPLICIT_ONLY and not binder.explicit:
                self.fail(binder.loc, f"a {kind.value} argument is explicit: write '({spelled})'")
            if kind in _IMPLICIT_ONLY and binder.explicit and not is_optional(binder):
                self.fail(binder.loc, f"a {kind.value} argument is implicit: write '{{{spelled}}}'")
            if kind in _OPTIONAL_ONLY and not is_optional(binder):
                self.fail(binder.loc, f"'{kind.value}' is the type of an optional argument: write "
                                      f"'({spelled} := default)'")

    def rank(self) -> int | None:
        """2 for a `*2d*` name; None for an N-D op, whose vectors follow an implicit `{d : ℕ}`."""
        rank = rank_from_name(self.decl.short_name)
        has_vectors = any(kind is BinderKind.VECTOR for _, _, kind in self.bound)
        if rank is not None and has_vectors:
            self.fail(self.decl.loc, f"'{self.decl.short_name}' has '2d' in its name and 'Vector ℕ d' binders: "
                                     "a *2d* op takes ℕ geometry, an N-D op vectors")
        if rank is None and not has_vectors:
            self.fail(self.decl.loc, f"cannot tell the rank of '{self.decl.short_name}': "
                                     "put '2d' in its name or give it 'Vector ℕ d' geometry")
        rank_declared = False
        for name, binder, kind in self.bound:
            if is_rank_binder(name, binder) and rank is not None:
                self.fail(binder.name_loc(name), f"a *2d* op has no rank binder '{RANK_BINDER}'")
            rank_declared = rank_declared or is_rank_binder(name, binder)
            if kind is BinderKind.VECTOR and not rank_declared:
                self.fail(binder.loc, f"'Vector ℕ d' needs an implicit '{{{RANK_BINDER} : ℕ}}' before it")
        return rank

    def check_arguments(self, family: Family) -> None:
        """The explicit arguments other than hypotheses: the tape, the node ids, β for smooth max."""
        arguments = [(name, binder, kind) for name, binder, kind in self.bound
                     if binder.explicit and kind is not BinderKind.HYPOTHESIS and not is_optional(binder)]
        expected, described = _expected_arguments(family)
        if [kind for _, _, kind in arguments] == expected:
            return
        got = ", ".join(f"'{name} : {kind.value}'" for name, _, kind in arguments) or "none"
        message = f"a {family.value} op takes {described}, in this order; got {got}"
        for index, (name, binder, kind) in enumerate(arguments):
            if index >= len(expected) or kind is not expected[index]:
                self.fail(binder.name_loc(name), message)
        self.fail(self.decl.loc, message)  # those given are right, but some are missing

    def check_geometry(self, family: Family, rank: int | None) -> None:
        expected = _expected_geometry(family, rank)
        shape = f"a *2d* {family.value}" if rank == 2 else f"an N-D {family.value}"
        given = []
        for name, binder, kind in self.bound:
            if binder.explicit or is_rank_binder(name, binder) or kind not in (BinderKind.NAT, BinderKind.VECTOR):
                continue
            if name not in expected:
                self.fail(binder.name_loc(name), f"unknown geometry binder '{name}' for {shape} op: "
                                                 f"expected {', '.join(expected)}")
            if kind is not expected[name]:
                self.fail(binder.name_loc(name), f"'{name}' must be a '{expected[name].value}' in {shape} op")
            given.append(name)
        for name, kind in expected.items():
            if name not in given and not (name == "padding" and rank == 2):
                self.fail(self.decl.loc, f"'{self.decl.short_name}' lacks the geometry binder "
                                         f"'{{{name} : {kind.value}}}'")

    def check_optional_arguments(self, family: Family, rank: int | None) -> None:
        """Each optional argument is one of OPTIONAL_ARGUMENTS that `family` takes, on an N-D op, with its
        type and the default that leaves the op the seed's."""
        taken = [name for name, argument in OPTIONAL_ARGUMENTS.items() if family in argument.families]
        for name, binder, _ in self.bound:
            if not is_optional(binder):
                continue
            loc = binder.name_loc(name)
            if name not in OPTIONAL_ARGUMENTS:
                self.fail(loc, f"unknown optional argument '{name}': expected one of {', '.join(OPTIONAL_ARGUMENTS)}")
            if rank is not None:
                self.fail(loc, f"a *2d* op takes no optional argument ('{name}'): only the N-D ops take them")
            if name not in taken:
                self.fail(loc, f"'{name}' is no argument of a {family.value} op: it takes {', '.join(taken)}")
            argument = OPTIONAL_ARGUMENTS[name]
            if binder.type != argument.type:
                self.fail(binder.type.loc, f"'{name}' must be a '{format_expr(argument.type)}', "
                                           f"got '{format_expr(binder.type)}'")
            if binder.default != argument.default:
                self.fail(binder.default.loc, f"the default of '{name}' must be '{format_expr(argument.default)}', "
                                              f"which leaves the op the seed's; got '{format_expr(binder.default)}'")

    def check_hypotheses(self) -> None:
        """Each hypothesis constrains geometry declared before it: `x ≠ 0` a scalar, `∀` a vector."""
        declared: dict[BinderKind, list[str]] = {BinderKind.NAT: [], BinderKind.VECTOR: []}
        for name, binder, kind in self.bound:
            if kind in declared and not binder.explicit and not is_rank_binder(name, binder):
                declared[kind].append(name)
            if kind is not BinderKind.HYPOTHESIS:
                continue
            check = hypothesis_check(binder.type)
            if check is None:
                self.fail(binder.type.loc, f"unsupported hypothesis '{format_expr(binder.type)}': expected "
                                           "'x ≠ 0' or '∀ (i : Fin d), v.get i ≠ 0'")
            check_kind, target = check
            target_kind = BinderKind.NAT if check_kind is CheckKind.NONZERO else BinderKind.VECTOR
            if target not in declared[target_kind]:
                known = ", ".join(declared[target_kind]) or "none"
                self.fail(binder.type.loc, f"unknown binder '{target}' in hypothesis: expected a {target_kind.value} "
                                           f"geometry binder declared before it ({known})")
