"""Spec errors found by the checks (after parsing): unknown types, hypotheses, names that cannot reach
generated code, families, ranks, arguments, geometry and the optional §8 binders. Each message is pinned
whole: location, text, the offending line and the caret."""

from __future__ import annotations

import pytest
from convgen.generator.checks import check_specs
from convgen.generator.parse import parse_spec
from spec_cases import CONV2D, CONV_TRANSPOSE, MAX_POOL, SMOOTH, error_text

CHECK_ERRORS = [
    pytest.param(
        CONV2D.replace("inW : ℕ", "inW : Int"),
        """\
spec/bad.lean:1:55: error: unknown type 'Int': a binder is ℕ, Float, Tape, Vector ℕ d, Option ℕ, PaddingMode or a hypothesis
def T.conv2d {inC outC kH kW stride padding inH inW : Int}
                                                      ^""",
        id='unknown_type',
    ),
    pytest.param(
        CONV2D.replace("inC ≠ 0", "inX ≠ 0"),
        """\
spec/bad.lean:2:11: error: unknown binder 'inX' in hypothesis: expected a ℕ geometry binder declared before it (inC, outC, kH, kW, stride, padding, inH, inW)
    {h1 : inX ≠ 0} {h2 : kH ≠ 0}
          ^""",
        id='unknown_binder_in_hypothesis',
    ),
    pytest.param(
        CONV2D.replace("conv2d {", "conv2d {h0 : inC ≠ 0} {"),
        """\
spec/bad.lean:1:20: error: unknown binder 'inC' in hypothesis: expected a ℕ geometry binder declared before it (none)
def T.conv2d {h0 : inC ≠ 0} {inC outC kH kW stride padding inH inW : ℕ}
                   ^""",
        id='hypothesis_before_its_binder',
    ),
    pytest.param(
        MAX_POOL.replace("(t : Tape)", "{h : kernel ≠ 0} (t : Tape)"),
        """\
spec/bad.lean:3:10: error: unknown binder 'kernel' in hypothesis: expected a ℕ geometry binder declared before it (C)
    {h : kernel ≠ 0} (t : Tape) (xId : ℕ) : Result (Tape × ℕ)
         ^""",
        id='hypothesis_on_a_vector',
    ),
    pytest.param(
        CONV2D.replace("inC ≠ 0", "inC ≠ 1"),
        """\
spec/bad.lean:2:11: error: unsupported hypothesis 'inC ≠ 1': expected 'x ≠ 0' or '∀ (i : Fin d), v.get i ≠ 0'
    {h1 : inC ≠ 1} {h2 : kH ≠ 0}
          ^""",
        id='unsupported_hypothesis',
    ),
    pytest.param(
        CONV2D.replace("padding inH", "lambda inH"),
        """\
spec/bad.lean:1:37: error: 'lambda' cannot appear in generated C or Python: a Python keyword
def T.conv2d {inC outC kH kW stride lambda inH inW : ℕ}
                                    ^""",
        id='python_keyword',
    ),
    pytest.param(
        CONV2D.replace("biasId", "Delete"),
        """\
spec/bad.lean:3:26: error: 'Delete' (as 'delete') cannot appear in generated C or Python: a C++ keyword
    (t : Tape) (kernelId Delete inputId : ℕ) : Result (Tape × ℕ)
                         ^""",
        id='cpp_keyword',
    ),
    pytest.param(
        CONV2D.replace("inH", "inHöhe"),
        """\
spec/bad.lean:1:45: error: 'inHöhe' (as 'in_höhe') cannot appear in generated C or Python: not ASCII
def T.conv2d {inC outC kH kW stride padding inHöhe inW : ℕ}
                                            ^""",
        id='non_ascii_identifier',
    ),
    pytest.param(
        CONV2D.replace("kernelId", "__kernel"),
        """\
spec/bad.lean:3:17: error: '__kernel' cannot appear in generated C or Python: reserved in C++ (a leading or double underscore)
    (t : Tape) (__kernel biasId inputId : ℕ) : Result (Tape × ℕ)
                ^""",
        id='dunder_identifier',
    ),
    pytest.param(
        CONV2D.replace("inH inW", "inH in_c"),
        """\
spec/bad.lean:1:49: error: duplicate binder 'in_c' ('inC' is 'in_c' too)
def T.conv2d {inC outC kH kW stride padding inH in_c : ℕ}
                                                ^""",
        id='duplicate_binder',
    ),
    pytest.param(
        CONV2D.replace("conv2d", "blur2d"),
        """\
spec/bad.lean:1:5: error: cannot tell the family of 'blur2d': the name starts with none of smoothMaxPool, convTranspose, maxPool, avgPool, conv; add '@[family X]' with X among conv, conv_transpose, max_pool, avg_pool, smooth_max_pool
def T.blur2d {inC outC kH kW stride padding inH inW : ℕ}
    ^""",
        id='undeterminable_family',
    ),
    pytest.param(
        "@[family blur]\n" + CONV2D,
        """\
spec/bad.lean:1:3: error: '@[family X]' takes X among conv, conv_transpose, max_pool, avg_pool, smooth_max_pool, got 'blur'
@[family blur]
  ^""",
        id='unknown_family_attribute',
    ),
    pytest.param(
        "@[inline]\n" + CONV2D,
        """\
spec/bad.lean:1:3: error: unknown attribute 'inline' (the one attribute is 'family')
@[inline]
  ^""",
        id='unknown_attribute',
    ),
    pytest.param(
        CONV2D.replace("conv2d", "conv3d"),
        """\
spec/bad.lean:1:5: error: cannot tell the rank of 'conv3d': put '2d' in its name or give it 'Vector ℕ d' geometry
def T.conv3d {inC outC kH kW stride padding inH inW : ℕ}
    ^""",
        id='undeterminable_rank',
    ),
    pytest.param(
        MAX_POOL.replace("{d C : ℕ}", "{C : ℕ}"),
        """\
spec/bad.lean:1:23: error: 'Vector ℕ d' needs an implicit '{d : ℕ}' before it
def T.maxPool {C : ℕ} {inSpatial kernel stride padding : Vector ℕ d}
                      ^""",
        id='vector_without_rank_binder',
    ),
    pytest.param(
        MAX_POOL.replace("{d C : ℕ}", "{d C stride : ℕ}").replace("kernel stride padding", "kernel padding"),
        """\
spec/bad.lean:1:20: error: 'stride' must be a 'Vector ℕ d' in an N-D max_pool op
def T.maxPool {d C stride : ℕ} {inSpatial kernel padding : Vector ℕ d}
                   ^""",
        id='scalar_where_vector_expected',
    ),
    pytest.param(
        CONV2D.replace("inH inW", "inH inW inD"),
        """\
spec/bad.lean:1:53: error: unknown geometry binder 'inD' for a *2d* conv op: expected inC, outC, kH, kW, stride, padding, inH, inW
def T.conv2d {inC outC kH kW stride padding inH inW inD : ℕ}
                                                    ^""",
        id='unknown_geometry_binder',
    ),
    pytest.param(
        MAX_POOL.replace("stride padding", "stride"),
        """\
spec/bad.lean:1:5: error: 'maxPool' lacks the geometry binder '{padding : Vector ℕ d}'
def T.maxPool {d C : ℕ} {inSpatial kernel stride : Vector ℕ d}
    ^""",
        id='missing_geometry_binder',
    ),
    pytest.param(
        SMOOTH.replace(" (beta : Float)", ""),
        """\
spec/bad.lean:1:5: error: a smooth_max_pool op takes '(t : Tape)', 1 node id and '(beta : Float)', in this order; got 't : Tape', 'xId : ℕ'
def T.smoothMaxPool2d {kH kW inH inW inC stride : ℕ}
    ^""",
        id='smooth_op_without_float',
    ),
    pytest.param(
        CONV2D.replace(") : Result", ") (beta : Float) : Result"),
        """\
spec/bad.lean:3:47: error: a conv op takes '(t : Tape)' and 3 node ids (kernel, bias, input), in this order; got 't : Tape', 'kernelId : ℕ', 'biasId : ℕ', 'inputId : ℕ', 'beta : Float'
    (t : Tape) (kernelId biasId inputId : ℕ) (beta : Float) : Result (Tape × ℕ)
                                              ^""",
        id='float_in_a_conv',
    ),
    pytest.param(
        CONV2D.replace("biasId ", ""),
        """\
spec/bad.lean:1:5: error: a conv op takes '(t : Tape)' and 3 node ids (kernel, bias, input), in this order; got 't : Tape', 'kernelId : ℕ', 'inputId : ℕ'
def T.conv2d {inC outC kH kW stride padding inH inW : ℕ}
    ^""",
        id='too_few_node_ids',
    ),
    pytest.param(
        SMOOTH.replace("(beta : Float)", "{beta : Float}"),
        """\
spec/bad.lean:2:26: error: a Float argument is explicit: write '(beta : Float)'
    (t : Tape) (xId : ℕ) {beta : Float} : Result (Tape × ℕ)
                         ^""",
        id='implicit_float',
    ),
    pytest.param(
        CONV2D.replace("Result (Tape × ℕ)", "Result Tape"),
        """\
spec/bad.lean:3:48: error: the result type must be 'Result (Tape × ℕ)', got 'Result Tape'
    (t : Tape) (kernelId biasId inputId : ℕ) : Result Tape
                                               ^""",
        id='wrong_result_type',
    ),
    pytest.param(
        CONV2D.replace("T.conv2d", "T.conv_transpose2d"),
        """\
spec/bad.lean:1:5: error: cannot tell the family of 'conv_transpose2d': spec names are camelCase (the Python name is derived from it: 'convTranspose2d' is 'conv_transpose2d'); rename it, or add '@[family X]' with X among conv, conv_transpose, max_pool, avg_pool, smooth_max_pool
def T.conv_transpose2d {inC outC kH kW stride padding inH inW : ℕ}
    ^""",
        id='snake_case_family',
    ),
    pytest.param(
        MAX_POOL.replace("T.maxPool", "T.maxPoolX").replace("xId", "validators"),
        None,
        id='generated_names_are_free_for_ids',
    ),
    *[pytest.param(
        "@[family max_pool]\n" + MAX_POOL.replace("T.maxPool", f"T.{name}"),
        f"""\
spec/bad.lean:2:5: error: '{name}' cannot be an op name: the tape's own '{name}' would hide the op
def T.{name} {{d C : ℕ}} {{inSpatial kernel stride padding : Vector ℕ d}}
    ^""",
        id=f'tape_attribute_{name}',
    ) for name in ("value", "leaf", "backward")],
    pytest.param(
        "@[family max_pool]\n" + MAX_POOL.replace("T.maxPool", "T.ops"),
        """\
spec/bad.lean:2:5: error: 'ops' cannot be an op name: its constant 'OPS' is taken in generated/ops.py
def T.ops {d C : ℕ} {inSpatial kernel stride padding : Vector ℕ d}
    ^""",
        id='op_table_name',
    ),
    pytest.param(
        SMOOTH.replace("beta", "len"),
        """\
spec/bad.lean:2:27: error: 'len' cannot appear in generated C or Python: a Python builtin, which the generated code uses
    (t : Tape) (xId : ℕ) (len : Float) : Result (Tape × ℕ)
                          ^""",
        id='builtin_beta',
    ),
    pytest.param(
        "@[family max_pool]\n" + MAX_POOL.replace("T.maxPool", "T.max"),
        """\
spec/bad.lean:2:5: error: 'max' cannot appear in generated C or Python: a Python builtin, which the generated code uses
def T.max {d C : ℕ} {inSpatial kernel stride padding : Vector ℕ d}
    ^""",
        id='builtin_op',
    ),
    # The optional arguments of SEMANTICS §8 (lower.OPTIONAL_ARGUMENTS).
    pytest.param(
        MAX_POOL.replace("{d C : ℕ}", "{d C : ℕ} {batch : Option ℕ}"),
        """\
spec/bad.lean:1:25: error: 'Option ℕ' is the type of an optional argument: write '(batch : Option ℕ := default)'
def T.maxPool {d C : ℕ} {batch : Option ℕ} {inSpatial kernel stride padding : Vector ℕ d}
                        ^""",
        id='optional_type_without_default',
    ),
    pytest.param(
        MAX_POOL.replace("(xId : ℕ)", "(xId : ℕ) (ceilMode : ℕ := 0)"),
        """\
spec/bad.lean:3:27: error: unknown optional argument 'ceilMode': expected one of batch, dilation, outputPadding, groups, paddingMode
    (t : Tape) (xId : ℕ) (ceilMode : ℕ := 0) : Result (Tape × ℕ)
                          ^""",
        id='unknown_optional',
    ),
    pytest.param(
        MAX_POOL.replace("(xId : ℕ)", "(xId : ℕ := 0)"),
        """\
spec/bad.lean:3:17: error: unknown optional argument 'xId': expected one of batch, dilation, outputPadding, groups, paddingMode
    (t : Tape) (xId : ℕ := 0) : Result (Tape × ℕ)
                ^""",
        id='id_with_default',
    ),
    pytest.param(
        MAX_POOL.replace("(xId : ℕ)", "(xId : ℕ) (groups : ℕ := 1)"),
        """\
spec/bad.lean:3:27: error: 'groups' is no argument of a max_pool op: it takes batch, dilation
    (t : Tape) (xId : ℕ) (groups : ℕ := 1) : Result (Tape × ℕ)
                          ^""",
        id='groups_on_a_pool',
    ),
    pytest.param(
        CONV_TRANSPOSE.replace("(groups : ℕ := 1)", "(paddingMode : PaddingMode := zeros)"),
        """\
spec/bad.lean:3:33: error: 'paddingMode' is no argument of a conv_transpose op: it takes batch, dilation, outputPadding, groups
    (batch : Option ℕ := none) (paddingMode : PaddingMode := zeros) (outputPadding : Vector ℕ d := 0) : Result (Tape × ℕ)
                                ^""",
        id='padding_mode_on_a_transpose',
    ),
    pytest.param(
        CONV2D.replace("inputId : ℕ)", "inputId : ℕ) (groups : ℕ := 1)"),
        """\
spec/bad.lean:3:47: error: a *2d* op takes no optional argument ('groups'): only the N-D ops take them
    (t : Tape) (kernelId biasId inputId : ℕ) (groups : ℕ := 1) : Result (Tape × ℕ)
                                              ^""",
        id='optional_argument_on_a_2d_op',
    ),
    pytest.param(
        CONV_TRANSPOSE.replace("(groups : ℕ := 1)", "(groups : Vector ℕ d := 1)"),
        """\
spec/bad.lean:3:42: error: 'groups' must be a 'ℕ', got 'Vector ℕ d'
    (batch : Option ℕ := none) (groups : Vector ℕ d := 1) (outputPadding : Vector ℕ d := 0) : Result (Tape × ℕ)
                                         ^""",
        id='optional_argument_of_the_wrong_type',
    ),
    pytest.param(
        MAX_POOL.replace("(xId : ℕ)", "(xId : ℕ) (dilation : Vector ℕ d := 2)"),
        """\
spec/bad.lean:3:52: error: the default of 'dilation' must be '1', which leaves the op the seed's; got '2'
    (t : Tape) (xId : ℕ) (dilation : Vector ℕ d := 2) : Result (Tape × ℕ)
                                                   ^""",
        id='dilation_default_not_1',
    ),
    pytest.param(
        CONV_TRANSPOSE.replace(":= none", ":= 1"),
        """\
spec/bad.lean:3:26: error: the default of 'batch' must be 'none', which leaves the op the seed's; got '1'
    (batch : Option ℕ := 1) (groups : ℕ := 1) (outputPadding : Vector ℕ d := 0) : Result (Tape × ℕ)
                         ^""",
        id='batch_default_not_none',
    ),
    pytest.param(
        CONV_TRANSPOSE.replace("d := 0", "d := 1"),
        """\
spec/bad.lean:3:81: error: the default of 'outputPadding' must be '0', which leaves the op the seed's; got '1'
    (batch : Option ℕ := none) (groups : ℕ := 1) (outputPadding : Vector ℕ d := 1) : Result (Tape × ℕ)
                                                                                ^""",
        id='output_padding_default_not_0',
    ),
    pytest.param(
        MAX_POOL.replace("∀ (i : Fin d)", "∀ (i : Fin d := 0)"),
        """\
spec/bad.lean:2:16: error: unsupported hypothesis '∀ (i : Fin d := 0), kernel.get i ≠ 0': expected 'x ≠ 0' or '∀ (i : Fin d), v.get i ≠ 0'
    {hKernel : ∀ (i : Fin d := 0), kernel.get i ≠ 0}
               ^""",
        id='default_in_a_forall',
    ),
]


@pytest.mark.parametrize(("source", "message"), CHECK_ERRORS)
def test_spec_check_error_message(source, message):
    if message is None:  # a name the generated code also uses, which the leading underscore keeps apart
        check_specs([parse_spec(source, "spec/good.lean")])
    else:
        assert error_text(source) == message
