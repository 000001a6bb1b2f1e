"""Printing any declaration gives spec text that parses back to the same IR (Hypothesis-generated
declarations, beyond the seed's which tests/test_spec_parse.py covers)."""

from __future__ import annotations

import pytest

pytest.importorskip("lark")
pytest.importorskip("hypothesis")
from convgen.generator.model import App, Attribute, Binder, Decl, Forall, Ident, NatLit, Ne, Prod
from convgen.generator.parse import parse_spec
from hypothesis import given, settings
from hypothesis import strategies as st

# Words the grammar reserves or rewrites (`Nat` is read as `ℕ`), so no identifier prints as one.
NOT_IDENTIFIERS = {"def", "x", "forall", "Nat"}

words = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,5}", fullmatch=True).filter(lambda w: w not in NOT_IDENTIFIERS)
dotted = st.lists(words, min_size=1, max_size=3).map(".".join)
names = st.lists(dotted, min_size=1, max_size=3).map(tuple)


def binders(types: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(Binder, names, types, st.booleans())


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
