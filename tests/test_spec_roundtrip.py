"""Printing any declaration gives spec text that parses back to the same IR (Hypothesis-generated
declarations, beyond the seed's which tests/test_spec_parse.py covers), and no spec text, however
mangled, gets past the front end as anything but a SpecError or Python that compiles."""

from __future__ import annotations

from pathlib import Path

from convgen.generator import emit
from convgen.generator.checks import check_specs
from convgen.generator.lower import lower_spec
from convgen.generator.model import App, Attribute, Binder, Decl, Forall, Ident, NatLit, Ne, Prod, SpecError
from convgen.generator.parse import parse_spec
from hypothesis import given, settings
from hypothesis import strategies as st

# Words the grammar reserves or rewrites (`Nat` is read as `ℕ`), so no identifier prints as one.
NOT_IDENTIFIERS = {"def", "x", "forall", "Nat"}

words = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,5}", fullmatch=True).filter(lambda w: w not in NOT_IDENTIFIERS)
dotted = st.lists(words, min_size=1, max_size=3).map(".".join)
names = st.lists(dotted, min_size=1, max_size=3).map(tuple)


def binders(types: st.SearchStrategy) -> st.SearchStrategy:
    """Implicit binders, and explicit ones with or without a default (an implicit one has none)."""
    implicit = st.builds(Binder, names, types, st.just(False))
    explicit = st.builds(Binder, names, types, st.just(True), st.none() | types)
    return implicit | explicit


leaves = st.one_of(dotted.map(Ident), st.just(Ident("ℕ")), st.integers(0, 10**12).map(NatLit))
exprs = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.builds(App, inner, st.lists(inner, min_size=1, max_size=3).map(tuple)),
        st.builds(Prod, inner, inner),
        st.builds(Ne, inner, inner),
        st.builds(Forall, st.lists(binders(inner), min_size=1, max_size=2).map(tuple), inner),
    ),
    max_leaves=12,
)
docs = st.none() | st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40).filter(
    lambda text: "-/" not in text).map(str.strip)
attributes = st.lists(st.builds(Attribute, words, st.none() | words), max_size=2).map(tuple)
decls = st.builds(Decl, docs, attributes, dotted, st.lists(binders(exprs), max_size=4).map(tuple), exprs)


@settings(deadline=None)
@given(decls)
def test_printed_declaration_parses_back_to_itself(decl):
    (parsed,) = parse_spec(decl.to_spec(), "generated.lean").decls
    assert parsed == decl


OPS_TEXT = (Path(__file__).resolve().parent.parent / "spec" / "ops.lean").read_text(encoding="utf-8")
# Pieces of spec syntax and of the generated languages, besides arbitrary characters.
TOKENS = ["def ", "(", ")", "{", "}", ":", " × ", " x ", "≠", "∀", ",", "ℕ", "Nat", "@[family conv]", "]", "/--",
          "-/", "/-", "--", "\n", "0", "Tape", "Float", "Vector ℕ d", "_", '"', '"""', "\\", "\x00", "2d", "ops",
          "value", "leaf", "natural", "class", "__", "$\\le 8$", "é", "\u2028", "{d : ℕ}", "(beta : Float)", " := ",
          "(batch : Option ℕ := none)", "(groups : ℕ := 1)", "(dilation : Vector ℕ d := 1)", "PaddingMode", "zeros",
          "outputPadding", "none", "1"]
edits = st.tuples(
    st.sampled_from(["insert", "delete", "duplicate"]),
    st.floats(0, 1),  # where, as a fraction of the text
    st.integers(1, 60),  # how much to delete or duplicate
    st.one_of(st.sampled_from(TOKENS), st.text(max_size=3)),
)


def mutate(text: str, changes: list[tuple[str, float, int, str]]) -> str:
    for kind, where, length, piece in changes:
        at = int(where * len(text))
        if kind == "insert":
            text = text[:at] + piece + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + length:]
        else:
            text = text[:at] + text[at:at + length] * 2 + text[at + length:]
    return text


@settings(deadline=None, max_examples=150)
@given(st.lists(edits, min_size=1, max_size=4))
def test_mangled_spec_is_a_spec_error_or_compiling_python(changes):
    text = mutate(OPS_TEXT, changes)
    try:
        specs = [parse_spec(text, "spec/ops.lean")]
        check_specs(specs)
        ops = lower_spec(specs)
    except SpecError:
        return
    # The Python files only: the CUDA sources take nothing from the spec but its families and name.
    for path, source in emit.python_sources(emit.environment(), ops, "spec/ops.lean").items():
        compile(source, path, "exec", dont_inherit=True)
