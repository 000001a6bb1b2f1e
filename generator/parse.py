"""Parse: spec text -> `SpecFile`, the IR of model.py, through the LALR grammar of grammar.lark.

ASCII spellings become the canonical Unicode ones (`Nat` -> `ℕ`). A syntax error becomes a
`SpecError`: `path:line:col: error: expected ..., got ...`, the line and a caret. So does text that
is not UTF-8, and input past the limits below (deep nesting would exhaust Python's stack in the
recursive passes after parsing; huge numbers and names would make them slow).
"""

from __future__ import annotations

from pathlib import Path

from convgen.generator.model import (
    App,
    Attribute,
    Binder,
    Decl,
    Expr,
    Forall,
    Ident,
    Loc,
    NatLit,
    Ne,
    Prod,
    SpecError,
    SpecFile,
    shorten,
)
from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedToken
from lark.lexer import PatternStr
from lark.tree import Meta

PARSER_OPTIONS = {
    "parser": "lalr",
    # Not the contextual lexer: a lone `x` must be the product everywhere, not only where the
    # parser happens to accept one.
    "lexer": "basic",
    "propagate_positions": True,
    "maybe_placeholders": True,
    # Strict: no shift/reduce conflicts, no colliding terminals (lark checks the latter with
    # `interegular`, a dependency of ours for that reason).
    "strict": True,
}
PARSER = Lark(Path(__file__).with_name("grammar.lark").read_text(encoding="utf-8"), **PARSER_OPTIONS)

MAX_NESTING = 64  # levels of the parse tree under a declaration
MAX_DIGITS = 20  # a number literal (the spec only writes 0)
MAX_NAME_LENGTH = 200  # characters of a (dotted) name

# Messages name the pattern terminals in words and the ASCII alternatives by their Unicode spelling.
_TERMINAL_WORDS = {"NAME": "identifier", "NUMBER": "number", "DOC": "doc comment", "$END": "end of file"}
_UNICODE_SPELLING = {"x": "×", "!=": "≠", "forall": "∀", "Nat": "ℕ"}
# What may extend an expression: an argument, `×` or `≠`.
_CONTINUATIONS = {"'('", "'×'", "'≠'", "identifier", "number"}


def decode_spec(data: bytes, path: str) -> str:
    """The text of a spec file's bytes, or a SpecError at the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        before = data[: error.start]
        line_start = before.rfind(b"\n") + 1
        column = len(before[line_start:].decode("utf-8", errors="replace")) + 1
        loc = Loc(path, before.count(b"\n") + 1, column)
        message = f"spec is not UTF-8 text: invalid byte 0x{data[error.start]:02x}"
        raise SpecError(loc, message, data.decode("utf-8", errors="replace")) from None


def parse_spec(text: str, path: str) -> SpecFile:
    """The declarations of one spec file; `path` is only used in locations and messages."""
    try:
        tree = PARSER.parse(text)
    except (UnexpectedCharacters, UnexpectedToken) as error:
        raise _syntax_error(error, text, path) from None
    _check_limits(tree, text, path)
    return SpecFile(path, _ToModel(path).transform(tree), text)


def _check_limits(tree: Tree, text: str, path: str) -> None:
    """SpecError at the first subtree nested deeper than MAX_NESTING, number longer than MAX_DIGITS or
    name longer than MAX_NAME_LENGTH. Iterative, so that it cannot itself run out of stack."""
    pending: list[tuple[Tree | Token, int]] = [(decl, 0) for decl in tree.children]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, Token):
            if node.type == "NUMBER" and len(node) > MAX_DIGITS:
                raise SpecError(Loc(path, node.line, node.column), f"number too long (more than {MAX_DIGITS} digits)",
                                text)
            if node.type == "NAME" and len(node) > MAX_NAME_LENGTH:
                raise SpecError(Loc(path, node.line, node.column),
                                f"name too long (more than {MAX_NAME_LENGTH} characters)", text)
        elif isinstance(node, Tree):
            if depth > MAX_NESTING:
                raise SpecError(Loc(path, node.meta.line, node.meta.column),
                                f"expression nested too deeply (more than {MAX_NESTING} levels)", text)
            pending.extend((child, depth + 1) for child in node.children)


def _syntax_error(error: UnexpectedCharacters | UnexpectedToken, text: str, path: str) -> SpecError:
    if isinstance(error, UnexpectedCharacters):
        rest = text[error.pos_in_stream:]
        if rest.startswith("/-"):  # a comment the lexer could not close
            kind = "doc comment" if rest.startswith("/--") else "comment"
            message = f"unterminated {kind}: no closing '-/'"
        else:
            message = f"unexpected character {rest[0]!r}"
        return SpecError(Loc(path, error.line, error.column), message, text)
    token = error.token
    # The parser's own `expected` mixes in the lookaheads of merged LALR states; `accepts()` tries
    # each terminal on a copy of the parser and keeps only those that really fit here.
    expected = {_terminal_spelling(name) for name in error.interactive_parser.accepts()}
    if "'×'" in expected and not expected <= _CONTINUATIONS:
        expected -= _CONTINUATIONS  # after a whole expression, name what may end it, not extend it
    if token.type == "$END":  # LALR reports the end of input as this token, placed on the last one
        loc = Loc(path, token.end_line, token.end_column)
    else:
        loc = Loc(path, token.line, token.column)
    return SpecError(loc, f"expected {_join_or(sorted(expected))}, got {_token_spelling(token)}", text)


def _terminal_spelling(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    pattern = PARSER.get_terminal(name).pattern
    assert isinstance(pattern, PatternStr), f"terminal {name} needs a word in _TERMINAL_WORDS"
    return repr(_UNICODE_SPELLING.get(pattern.value, pattern.value))


def _token_spelling(token: Token) -> str:
    if token.type == "NAME":
        return f"identifier {shorten(str(token))!r}"
    if token.type == "NUMBER":
        return f"number {shorten(str(token))}"
    if token == "x":
        return "'x' (reserved: the ASCII spelling of '×')"
    return _TERMINAL_WORDS.get(token.type, repr(str(token)))


def _join_or(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


class _ToModel(Transformer):
    """Parse tree -> IR, one method per grammar rule."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def _loc(self, at: Token | Meta) -> Loc:
        return Loc(self._path, at.line, at.column)

    def start(self, decls: list[Decl]) -> tuple[Decl, ...]:
        return tuple(decls)

    @v_args(inline=True)
    def decl(self, doc: Token | None, attributes: tuple[Attribute, ...] | None, name: Token,
             *binders_and_result: Binder | Expr) -> Decl:
        *binders, result = binders_and_result
        text = None if doc is None else doc[len("/--"):-len("-/")].strip()
        return Decl(text, attributes or (), str(name), tuple(binders), result, self._loc(name))

    def attributes(self, entries: list[Attribute]) -> tuple[Attribute, ...]:
        return tuple(entries)

    @v_args(inline=True)
    def attribute(self, name: Token, value: Token | None) -> Attribute:
        return Attribute(str(name), None if value is None else str(value), self._loc(name))

    @v_args(meta=True)
    def implicit_binder(self, meta: Meta, children: list[Token | Expr]) -> Binder:
        return self._binder(meta, children, explicit=False)

    @v_args(meta=True)
    def explicit_binder(self, meta: Meta, children: list[Token | Expr]) -> Binder:
        return self._binder(meta, children, explicit=True)

    def _binder(self, meta: Meta, children: list[Token | Expr], explicit: bool) -> Binder:
        *names, type_, default = children if explicit else (*children, None)
        name_locs = tuple(self._loc(name) for name in names)
        return Binder(tuple(map(str, names)), type_, explicit, default, self._loc(meta), name_locs)

    @v_args(meta=True)
    def forall(self, meta: Meta, children: list[Binder | Expr]) -> Forall:
        *binders, body = children
        return Forall(tuple(binders), body, self._loc(meta))

    @v_args(meta=True, inline=True)
    def prod(self, meta: Meta, left: Expr, right: Expr) -> Prod:
        return Prod(left, right, self._loc(meta))

    @v_args(meta=True, inline=True)
    def ne(self, meta: Meta, left: Expr, right: Expr) -> Ne:
        return Ne(left, right, self._loc(meta))

    @v_args(meta=True, inline=True)
    def app(self, meta: Meta, fn: Expr, *args: Expr) -> App:
        return App(fn, args, self._loc(meta))

    @v_args(inline=True)
    def ident(self, name: Token) -> Ident:
        return Ident(_UNICODE_SPELLING.get(str(name), str(name)), self._loc(name))

    @v_args(inline=True)
    def number(self, digits: Token) -> NatLit:
        return NatLit(int(digits), self._loc(digits))
