"""What the spec-error tests share: well-formed declarations to break, and the message a broken spec gives."""

from __future__ import annotations

import pytest
from convgen.generator.checks import check_specs
from convgen.generator.model import SpecError
from convgen.generator.parse import parse_spec

CONV2D = """\
def T.conv2d {inC outC kH kW stride padding inH inW : ℕ}
    {h1 : inC ≠ 0} {h2 : kH ≠ 0}
    (t : Tape) (kernelId biasId inputId : ℕ) : Result (Tape × ℕ)
"""
MAX_POOL = """\
def T.maxPool {d C : ℕ} {inSpatial kernel stride padding : Vector ℕ d}
    {hKernel : ∀ (i : Fin d), kernel.get i ≠ 0}
    (t : Tape) (xId : ℕ) : Result (Tape × ℕ)
"""
SMOOTH = """\
def T.smoothMaxPool2d {kH kW inH inW inC stride : ℕ}
    (t : Tape) (xId : ℕ) (beta : Float) : Result (Tape × ℕ)
"""
CONV_TRANSPOSE = """\
def T.convTranspose {d inC outC : ℕ} {kernel stride padding inSpatial : Vector ℕ d}
    (t : Tape) (kernelId biasId inputId : ℕ)
    (batch : Option ℕ := none) (groups : ℕ := 1) (outputPadding : Vector ℕ d := 0) : Result (Tape × ℕ)
"""


def error_text(*sources: str) -> str:
    """The message of the SpecError that parsing and checking `sources` (bad.lean, more.lean) raises."""
    paths = ("spec/bad.lean", "spec/more.lean")[: len(sources)]
    with pytest.raises(SpecError) as raised:
        check_specs([parse_spec(source, path) for path, source in zip(paths, sources, strict=True)])
    return str(raised.value)
