"""Malformed specs: every parse and check error is `path:line:col: error: ...`, the offending line
and a caret, never a traceback. This file pins the syntax errors and the errors about names, long
lines and duplicates; tests/test_spec_check_errors.py pins what the checks reject."""

from __future__ import annotations

import importlib.util

import pytest
from convgen.generator import emit
from convgen.generator.checks import TAPE_ATTRIBUTES, check_specs
from convgen.generator.lower import lower_spec
from convgen.generator.model import QUOTE_WIDTH
from convgen.generator.parse import parse_spec
from spec_cases import CONV2D, CONV_TRANSPOSE, MAX_POOL, SMOOTH, error_text


@pytest.mark.parametrize("source", [CONV2D, MAX_POOL, SMOOTH, CONV_TRANSPOSE])
def test_the_bases_of_the_malformed_cases_are_well_formed(source):
    check_specs([parse_spec(source, "spec/good.lean")])


MALFORMED = [
    pytest.param(
        CONV2D.replace(") : Result", ") Result"),
        """\
spec/bad.lean:3:46: error: expected '(', ':' or '{', got identifier 'Result'
    (t : Tape) (kernelId biasId inputId : ℕ) Result (Tape × ℕ)
                                             ^""",
        id='missing_colon',
    ),
    pytest.param(
        CONV2D.replace("inW : ℕ", "inW ℕ"),
        """\
spec/bad.lean:1:54: error: expected ':' or identifier, got '}'
def T.conv2d {inC outC kH kW stride padding inH inW ℕ}
                                                     ^""",
        id='missing_colon_in_binder',
    ),
    pytest.param(
        "def T.conv2d {inC outC : ℕ\n\n",
        """\
spec/bad.lean:1:27: error: expected '}', got end of file
def T.conv2d {inC outC : ℕ
                          ^""",
        id='unclosed_brace',
    ),
    pytest.param(
        CONV2D.replace("(Tape × ℕ)", "(Tape × ℕ") + "-- the end\n",
        """\
spec/bad.lean:3:64: error: expected ')', got end of file
    (t : Tape) (kernelId biasId inputId : ℕ) : Result (Tape × ℕ
                                                               ^""",
        id='unclosed_paren',
    ),
    pytest.param(
        "/-- Conv2D.\n" + CONV2D,
        """\
spec/bad.lean:1:1: error: unterminated doc comment: no closing '-/'
/-- Conv2D.
^""",
        id='unterminated_doc_comment',
    ),
    pytest.param(
        CONV2D + "/- note\n",
        """\
spec/bad.lean:4:1: error: unterminated comment: no closing '-/'
/- note
^""",
        id='unterminated_block_comment',
    ),
    pytest.param(
        CONV2D.replace("inC ≠ 0", "inC ≠"),
        """\
spec/bad.lean:2:16: error: expected '(', identifier or number, got '}'
    {h1 : inC ≠} {h2 : kH ≠ 0}
               ^""",
        id='bad_hypothesis_syntax',
    ),
    pytest.param(
        CONV2D + "}\n",
        """\
spec/bad.lean:4:1: error: expected '@[', 'def', doc comment or end of file, got '}'
}
^""",
        id='stray_token_at_top_level',
    ),
    pytest.param(
        "/-- Conv2D. -/ T.conv2d : Result (Tape × ℕ)\n",
        """\
spec/bad.lean:1:16: error: expected '@[' or 'def', got identifier 'T.conv2d'
/-- Conv2D. -/ T.conv2d : Result (Tape × ℕ)
               ^""",
        id='missing_def',
    ),
    pytest.param(
        CONV2D.replace("padding inH", "x inH"),
        """\
spec/bad.lean:1:37: error: expected ':' or identifier, got 'x' (reserved: the ASCII spelling of '×')
def T.conv2d {inC outC kH kW stride x inH inW : ℕ}
                                    ^""",
        id='reserved_x',
    ),
    pytest.param(
        CONV2D.replace("(t : Tape)", "$ (t : Tape)"),
        """\
spec/bad.lean:3:5: error: unexpected character '$'
    $ (t : Tape) (kernelId biasId inputId : ℕ) : Result (Tape × ℕ)
    ^""",
        id='unexpected_character',
    ),
    pytest.param(
        MAX_POOL.replace("∀ (i : Fin d)", "∀ i"),
        """\
spec/bad.lean:2:18: error: expected '(' or '{', got identifier 'i'
    {hKernel : ∀ i, kernel.get i ≠ 0}
                 ^""",
        id='bare_forall_binder',
    ),
]


@pytest.mark.parametrize(("source", "message"), [case for case in MALFORMED if case.values[1]])
def test_malformed_spec_message(source, message):
    assert error_text(source) == message


@pytest.mark.parametrize(("op", "node", "beta"), [
    ("natural", "checked", "device"), ("real", "validators", "math"), ("math", "describe", "real"),
    ("device", "geometry", "natural"), ("checked", "math", "validators"),
])
def test_names_the_generated_code_uses_are_free_for_ops_ids_and_beta(tmp_path, op, node, beta):
    """The generated modules name everything of their own with a leading `_`, so such spec names
    build, and the generated validators import and check."""
    source = (f"@[family smooth_max_pool]\ndef T.{op} {{d C : ℕ}} {{inSpatial kernel stride padding : Vector ℕ d}} "
              f"(t : Tape) ({node} : ℕ) ({beta} : Float) : Result (Tape × ℕ)\n")
    specs = [parse_spec(source, "spec/names.lean")]
    check_specs(specs)
    files = emit.generate(lower_spec(specs), "spec/names.lean")
    compile(files["ops.py"], "ops.py", "exec", dont_inherit=True)
    (tmp_path / "validators.py").write_text(files["validators.py"])
    module_spec = importlib.util.spec_from_file_location(f"validators_{op}", tmp_path / "validators.py")
    validators = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(validators)
    validate = getattr(validators, op)
    geometry = {"c": 1, "in_spatial": (4,), "kernel": (2,), "stride": (1,), "padding": (0,)}
    assert validate("cpu", 1.0, **geometry).out_spatial == (3,)
    assert validate("cpu", 0.0, **geometry) == f"autograd: cpu: {op}: {beta} must be finite and nonzero"


def test_tape_attributes_are_reserved_op_names():
    """Every public attribute of the tapes that is not a generated op is in TAPE_ATTRIBUTES, so an op
    cannot be hidden by one (and the list cannot go stale)."""
    from convgen import cpu, tape
    from convgen.generated.ops import OPS

    for tape_class in (tape.Tape, cpu.Tape):
        public = {name for name in dir(tape_class) if not name.startswith("_")}
        assert public - set(OPS) <= TAPE_ATTRIBUTES, tape_class


def test_a_long_line_is_quoted_in_part_with_the_caret_aligned():
    line = "def T.conv2d " + "{a : ℕ} " * 10_000 + "(t : Tape) :: R"
    text = error_text(line)
    head, quoted, caret = text.split("\n")
    column = line.index("::") + 2
    assert head == f"spec/bad.lean:1:{column}: error: expected '(', '∀', identifier or number, got ':'"
    assert quoted.startswith("...") and not quoted.endswith("...") and len(quoted) == len("...") + QUOTE_WIDTH
    assert caret.index("^") == quoted.index("::") + 1


def test_an_empty_spec_is_an_error():
    assert error_text("-- nothing here\n") == """\
spec/bad.lean:1:1: error: no op declared in spec/bad.lean: a spec needs at least one 'def' (building would leave the tape without ops)
-- nothing here
^"""


def test_duplicate_declaration_across_files():
    assert error_text(CONV2D, "-- again\n" + CONV2D) == """\
spec/more.lean:2:5: error: duplicate declaration 'conv2d' (first declared at spec/bad.lean:1:5)
def T.conv2d {inC outC kH kW stride padding inH inW : ℕ}
    ^"""


def test_declarations_whose_python_names_collide_are_duplicates():
    assert error_text(MAX_POOL + "@[family max_pool]\n" + MAX_POOL.replace("maxPool", "max_pool")) == """\
spec/bad.lean:5:5: error: duplicate declaration 'max_pool' (first declared at spec/bad.lean:1:5)
def T.max_pool {d C : ℕ} {inSpatial kernel stride padding : Vector ℕ d}
    ^"""


def test_caret_keeps_the_tabs_of_the_line():
    assert error_text(CONV2D.replace("    (t : Tape)", "\t\t(t : Tape)").replace("kernelId", "class")) == (
        "spec/bad.lean:3:15: error: 'class' cannot appear in generated C or Python: a Python keyword\n"
        "\t\t(t : Tape) (class biasId inputId : ℕ) : Result (Tape × ℕ)\n"
        "\t\t            ^"
    )
