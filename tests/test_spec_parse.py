"""The spec parser: the seed's thirteen `def` lines parse verbatim, ASCII spellings mean the same,
comments are skipped, locations are right, optional arguments keep their defaults, and printing a
declaration parses back to it."""

from __future__ import annotations

from pathlib import Path

import pytest
from convgen.generator import parse
from convgen.generator.model import (
    App,
    Attribute,
    Binder,
    Decl,
    Forall,
    Ident,
    Loc,
    NatLit,
    Ne,
    Prod,
    SpecError,
    format_expr,
)
from convgen.generator.parse import parse_spec
from lark import Lark
from lark.exceptions import GrammarError, LexError

ROOT = Path(__file__).resolve().parent.parent
SEED_DECLS = ROOT / "tests" / "data" / "seed_decls.lean"
OPS_SPEC = ROOT / "spec" / "ops.lean"
SEED_LINES = SEED_DECLS.read_text(encoding="utf-8").splitlines()

NAT = Ident("ℕ")
RESULT = App(Ident("Result"), (Prod(Ident("Tape"), NAT),))


def parse_one(text: str) -> Decl:
    (decl,) = parse_spec(text, "t.lean").decls
    return decl


def test_seed_has_thirteen_declarations():
    assert len(SEED_LINES) == 13
    assert len(parse_spec("\n".join(SEED_LINES), str(SEED_DECLS)).decls) == 13


def test_conv_nd_parses_to_the_expected_ir():
    (conv,) = [parse_one(line) for line in SEED_LINES if ".conv " in line]
    vector = App(Ident("Vector"), (NAT, Ident("d")))
    kernel_nonzero = Forall(
        (Binder(("i",), App(Ident("Fin"), (Ident("d"),)), explicit=True),),
        Ne(App(Ident("kernel.get"), (Ident("i"),)), NatLit(0)),
    )
    assert conv == Decl(
        doc=None,
        attributes=(),
        name="Runtime.Autograd.Cuda.Tape.conv",
        binders=(
            Binder(("d", "inC", "outC"), NAT, explicit=False),
            Binder(("kernel", "stride", "padding", "inSpatial"), vector, explicit=False),
            Binder(("t",), Ident("Tape"), explicit=True),
            Binder(("kernelId", "biasId", "inputId"), NAT, explicit=True),
            Binder(("hInC",), Ne(Ident("inC"), NatLit(0)), explicit=True),
            Binder(("hKernel",), kernel_nonzero, explicit=True),
        ),
        result=RESULT,
    )


def test_ops_spec_holds_the_seed_declarations_with_docs_and_optional_arguments():
    seed = parse_spec("\n".join(SEED_LINES), "seed").decls
    ops = parse_spec(OPS_SPEC.read_text(encoding="utf-8"), "spec/ops.lean").decls
    assert [d.name for d in ops] == [d.name for d in seed]
    assert all(d.doc for d in ops)
    without_options = [Decl(None, d.attributes, d.name, tuple(b for b in d.binders if b.default is None), d.result)
                       for d in ops]
    assert without_options == list(seed)
    optional = {d.short_name: [(b.names, format_expr(b.type), format_expr(b.default)) for b in d.binders
                               if b.default is not None] for d in ops}
    batch_dilation = [(("batch",), "Option ℕ", "none"), (("dilation",), "Vector ℕ d", "1")]
    assert optional == {
        "conv": [*batch_dilation, (("groups",), "ℕ", "1"), (("paddingMode",), "PaddingMode", "zeros")],
        "convTranspose": [*batch_dilation, (("groups",), "ℕ", "1"), (("outputPadding",), "Vector ℕ d", "0")],
        "maxPool": batch_dilation, "avgPool": batch_dilation, "smoothMaxPool": batch_dilation,
        **{d.short_name: [] for d in seed if "2d" in d.short_name},
    }


def test_an_explicit_binder_may_have_a_default():
    text = "def A.f (t : Tape) (batch : Option Nat := none) (a b : ℕ := 1) : Result (Tape × ℕ)"
    decl = parse_one(text)
    assert decl.binders == (
        Binder(("t",), Ident("Tape"), explicit=True),
        Binder(("batch",), App(Ident("Option"), (NAT,)), explicit=True, default=Ident("none")),
        Binder(("a", "b"), NAT, explicit=True, default=NatLit(1)),
    )
    assert decl.binders[2].default.loc == Loc("t.lean", 1, text.index(":= 1") + len(":= ") + 1)
    assert decl.to_spec() == ("def A.f (t : Tape) (batch : Option ℕ := none) (a b : ℕ := 1) : "
                              "Result (Tape × ℕ)")


def test_an_implicit_binder_has_no_default():
    with pytest.raises(SpecError, match="expected '}', got ':='"):
        parse_one("def A.f {a : ℕ := 1} : T")


def test_ascii_spellings_parse_to_the_unicode_ir():
    unicode_text = "\n".join(SEED_LINES)
    ascii_text = (unicode_text.replace("ℕ", "Nat").replace("≠", "!=").replace("∀", "forall")
                  .replace("×", "x"))
    assert ascii_text.isascii()
    assert parse_spec(ascii_text, "a").decls == parse_spec(unicode_text, "u").decls


def test_comments_are_skipped_and_docs_kept():
    text = (
        "-- a line comment\n"
        "/- a block comment\n   over two lines -/\n"
        "/-- The doc,\n  on two lines. -/\n"
        "@[family conv, family conv]\n"
        "def A.f {inC : ℕ} -- trailing\n"
        "  : Result (Tape × ℕ) /- inside -/\n"
    )
    decl = parse_one(text)
    assert decl.doc == "The doc,\n  on two lines."
    assert decl.attributes == (Attribute("family", "conv"), Attribute("family", "conv"))
    assert decl.binders == (Binder(("inC",), NAT, explicit=False),)
    assert decl.result == RESULT


def test_empty_doc_differs_from_no_doc():
    assert parse_one("/-- -/ def A.f : T").doc == ""
    assert parse_one("def A.f : T").doc is None


def test_locations_point_at_names_and_binders():
    decl = parse_one("\n/-- d -/\ndef A.conv2d {inC outC : ℕ}\n  (h : inC ≠ 0) : Result (Tape × ℕ)")
    assert decl.loc == Loc("t.lean", 3, 5)
    implicit, hypothesis = decl.binders
    assert implicit.loc == Loc("t.lean", 3, 14)
    assert implicit.name_locs == (Loc("t.lean", 3, 15), Loc("t.lean", 3, 19))
    assert hypothesis.type.loc == Loc("t.lean", 4, 8)
    assert decl.result.loc == Loc("t.lean", 4, 19)


def test_precedence_follows_lean():
    # `×` is right-associative and binds looser than `≠`; application binds tightest.
    assert parse_one("def A.f : a × b × c").result == Prod(Ident("a"), Prod(Ident("b"), Ident("c")))
    assert parse_one("def A.f : f a ≠ 0 × b").result == Prod(
        Ne(App(Ident("f"), (Ident("a"),)), NatLit(0)), Ident("b"))
    assert parse_one("def A.f : (f a) b").result == App(App(Ident("f"), (Ident("a"),)), (Ident("b"),))


@pytest.mark.parametrize("line", SEED_LINES, ids=lambda line: line.split()[1].rsplit(".", 1)[-1])
def test_seed_declaration_prints_verbatim_and_round_trips(line):
    decl = parse_one(line)
    assert decl.to_spec() == line  # the seed is already in canonical spelling
    assert parse_one(decl.to_spec()) == decl


def test_ops_spec_round_trips():
    for decl in parse_spec(OPS_SPEC.read_text(encoding="utf-8"), "spec/ops.lean").decls:
        assert parse_one(decl.to_spec()) == decl


def test_printing_parenthesises_where_needed():
    every_i = Forall((Binder(("i",), Ident("T"), explicit=True),), Ne(Ident("i"), NatLit(0)))
    assert format_expr(Prod(Prod(Ident("a"), Ident("b")), every_i)) == "(a × b) × (∀ (i : T), i ≠ 0)"
    assert format_expr(Ne(Prod(Ident("a"), Ident("b")), Ident("c"))) == "(a × b) ≠ c"
    assert format_expr(App(App(Ident("f"), (Ident("a"),)), (Prod(Ident("b"), NAT),))) == "(f a) (b × ℕ)"


@pytest.mark.parametrize("grammar", [
    'start: e\ne: e "+" e | "n"\n',  # a shift/reduce conflict
    'start: A | B\nA: /a+/\nB: /a|b/\n',  # colliding terminals: both match "a"
])
def test_the_parser_options_reject_an_ambiguous_grammar(grammar):
    """PARSER is built with PARSER_OPTIONS, whose strict mode refuses what lark would otherwise
    resolve silently (it builds the same grammars without it)."""
    Lark(grammar, **{**parse.PARSER_OPTIONS, "strict": False})
    with pytest.raises((GrammarError, LexError)):
        Lark(grammar, **parse.PARSER_OPTIONS)
    assert parse.PARSER.options.strict
