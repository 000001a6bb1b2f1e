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
    """`{inC outC : ℕ}` (implicit) or `(t : Tape)` (explicit): names sharing one type. An explicit
    binder may have a default, Lean's optional argument: `(groups : ℕ := 1)`."""

    names: tuple[str, ...]
    type: Expr
    explicit: bool
    default: Expr | None = None
    loc: Loc = _loc()
    name_locs: tuple[Loc, ...] = field(default=(), compare=False, repr=False)  # one per name, if parsed

    def name_loc(self, name: str) -> Loc:
        """Where `name` is written, so a message can point at it (the binder's start if unknown)."""
        if len(self.name_locs) == len(self.names):
            return self.name_locs[self.names.index(name)]
        return self.loc

    def to_spec(self) -> str:
        inner = f"{' '.join(self.names)} : {format_expr(self.type)}"
        if self.default is not None:
            inner += f" := {format_expr(self.default)}"
        return f"({inner})" if self.explicit else f"{{{inner}}}"


@dataclass(frozen=True, slots=True)
class Attribute:
    """One entry of `@[name value]`, e.g. `@[family smooth_max_pool]`."""

    name: str
    value: str | None
    loc: Loc = _loc()

    def to_spec(self) -> str:
        return self.name if self.value is None else f"{self.name} {self.value}"


@dataclass(frozen=True, slots=True)
class Decl:
    """`/-- doc -/ @[attrs] def Qualified.name binders : result`."""

    doc: str | None
    attributes: tuple[Attribute, ...]
    name: str
    binders: tuple[Binder, ...]
    result: Expr
    loc: Loc = _loc()  # where the name is written

    @property
    def short_name(self) -> str:
        """The last component of the qualified name: `conv2d` of `Runtime.Autograd.Cuda.Tape.conv2d`."""
        return self.name.rsplit(".", 1)[-1]

    def to_spec(self) -> str:
        """Canonical spec text (Unicode spellings), which parses back to an equal `Decl`."""
        doc = "" if self.doc is None else f"/-- {self.doc} -/\n"
        attributes = f"@[{', '.join(a.to_spec() for a in self.attributes)}]\n" if self.attributes else ""
        binders = "".join(f" {b.to_spec()}" for b in self.binders)
        return f"{doc}{attributes}def {self.name}{binders} : {format_expr(self.result)}"


@dataclass(frozen=True, slots=True)
class SpecFile:
    path: str
    decls: tuple[Decl, ...]
    source: str = field(default="", compare=False, repr=False)  # the text, for quoting error lines


# Binding strength, as in Lean: ∀ extends furthest, then ×, then ≠; application binds tightest.
_FORALL, _PROD, _NE, _APP, _ATOM = 0, 35, 50, 1024, 1025


def format_expr(expr: Expr, context: int = _FORALL) -> str:
    """Spec text for `expr`, parenthesised where it stands in a position binding `context` tightly."""
    match expr:
        case Ident(name):
            return name
        case NatLit(value):
            return str(value)
        case App(fn, args):
            text, strength = " ".join(format_expr(e, _ATOM) for e in (fn, *args)), _APP
        case Prod(left, right):  # right-associative
            text, strength = f"{format_expr(left, _PROD + 1)} × {format_expr(right, _PROD)}", _PROD
        case Ne(left, right):
            text, strength = f"{format_expr(left, _NE + 1)} ≠ {format_expr(right, _NE + 1)}", _NE
        case Forall(binders, body):
            text = f"∀ {' '.join(b.to_spec() for b in binders)}, {format_expr(body)}"
            strength = _FORALL
    return f"({text})" if strength < context else text


# An error quotes at most this many characters of the offending line, around the caret.
QUOTE_WIDTH = 200
ELLIPSIS = "..."


def shorten(text: str, limit: int = 60) -> str:
    """`text`, cut to `limit` characters with an ellipsis, for quoting spec text in a message."""
    return text if len(text) <= limit else text[: limit - len(ELLIPSIS)] + ELLIPSIS


class SpecError(Exception):
    """A mistake in a spec file. `str(e)` is `path:line:col: error: what`, then the offending line
    (about QUOTE_WIDTH characters of it around the column) and a caret under the column: ready to
    print as is."""

    def __init__(self, loc: Loc, message: str, source: str) -> None:
        lines = source.split("\n")  # as the parser counts lines
        line = lines[loc.line - 1].rstrip("\r") if 0 < loc.line <= len(lines) else ""
        start = min(max(loc.column - 1 - QUOTE_WIDTH // 2, 0), max(len(line) - QUOTE_WIDTH, 0))
        end = start + QUOTE_WIDTH
        before = ELLIPSIS if start > 0 else ""
        after = ELLIPSIS if end < len(line) else ""
        # Keep the line's tabs so the caret lines up however the terminal expands them.
        indent = " " * len(before) + "".join(c if c == "\t" else " " for c in line[start: loc.column - 1])
        super().__init__(f"{loc}: error: {message}\n{before}{line[start:end]}{after}\n{indent}^")
        self.loc = loc
        self.message = message
