"""The spec's typed IR: what `parse` builds from spec text and `lower` reads.

Frozen dataclasses; every node carries its source location, which equality ignores, so a
declaration printed with `to_spec()` and parsed back compares equal to the original.
Spellings are canonical: `Nat` is stored as `ℕ`, `!=` as `Ne`, `forall` as `Forall`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Loc:
    """A position in a spec file (1-based line and column)."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


NO_LOC = Loc("<none>", 0, 0)


def _loc() -> Loc:
    return field(default=NO_LOC, compare=False, repr=False)


# Expressions: types and propositions share one small language, as in Lean.


@dataclass(frozen=True, slots=True)
class Ident:
    """A possibly dotted name: `inC`, `ℕ`, `Tape`, `kernel.get`, `Runtime.Autograd.Cuda.Tape`."""

    name: str
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class NatLit:
    value: int
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class App:
    """Application by juxtaposition: `Vector ℕ d`, `Fin d`, `kernel.get i`, `Result (Tape × ℕ)`."""

    fn: Expr
    args: tuple[Expr, ...]
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Prod:
    """The product type `a × b`."""

    left: Expr
    right: Expr
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Ne:
    """The proposition `a ≠ b`."""

    left: Expr
    right: Expr
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Forall:
    """`∀ (i : Fin d), body`."""

    binders: tuple[Binder, ...]
    body: Expr
    loc: Loc = _loc()


Expr = Ident | NatLit | App | Prod | Ne | Forall


@dataclass(frozen=True, slots=True)
class Binder:
    """`{inC outC : ℕ}` (implicit) or `(t : Tape)` (explicit): names sharing one type."""

    names: tuple[str, ...]
    type: Expr
    explicit: bool
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Attribute:
    """One entry of `@[name value]`, e.g. `@[family smooth_max_pool]`."""

    name: str
    value: str | None
    loc: Loc = _loc()


@dataclass(frozen=True, slots=True)
class Decl:
    """`/-- doc -/ @[attrs] def Qualified.name binders : result`."""

    doc: str | None
    attributes: tuple[Attribute, ...]
    name: str
    binders: tuple[Binder, ...]
    result: Expr
    loc: Loc = _loc()

    @property
    def short_name(self) -> str:
        """The last component of the qualified name: `conv2d` of `Runtime.Autograd.Cuda.Tape.conv2d`."""
        return self.name.rsplit(".", 1)[-1]


@dataclass(frozen=True, slots=True)
class SpecFile:
    path: str
    decls: tuple[Decl, ...]
