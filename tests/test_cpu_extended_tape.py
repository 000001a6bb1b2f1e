"""The CPU tape's dtype and SEMANTICS §8 through the tape's ops: `Tape(dtype="float64")` records,
computes and differentiates in float64 (against the reference and float64 torch), an unknown dtype
is a ValueError; the §8 keywords give the reference's results, their explicit defaults are the
seed's op bit for bit, batch=1 is the unbatched op bit for bit and batch=0 is an empty node."""

from __future__ import annotations

import inspect

import convgen
import numpy as np
import pytest
import reference
import torch_oracle
from convgen.cpu import Tape
from convgen.geometry import Family, Geometry

DTYPES = ("float32", "float64")
RTOLS = {"float32": reference.RTOL, "float64": reference.RTOL_FLOAT64}
KEYWORDS = ("batch", "dilation", "groups", "padding_mode", "output_padding")
needs_keywords = pytest.mark.skipif(
    not set(KEYWORDS) <= {*inspect.signature(Tape.conv).parameters, *inspect.signature(Tape.conv_transpose).parameters},
    reason="the generated ops do not take the §8 keywords yet")


def test_a_tape_is_float32_unless_asked() -> None:
    t, a = Tape().leaf(np.arange(4.0).reshape(1, 4))
    assert t.dtype == "float32" and t.value(a).dtype == np.float32


def test_a_float64_tape_records_computes_and_differentiates_in_float64() -> None:
    source = np.array([[1, 2, 3, 1e-300]], np.float64)
    t, a = Tape(dtype="float64").leaf(source)
    source[0, 0] = 9  # the leaf is a copy
    t, p = t.avg_pool(a, c=1, in_spatial=(4,), kernel=(2,), stride=(2,), padding=(0,)).unwrap()
    t, unused = t.leaf([[1.0]])
    assert t.dtype == "float64" and Tape().dtype == "float32"  # one backend per dtype
    np.testing.assert_array_equal(t.value(p), [[1.5, 1.5 + 0.5e-300]])  # 1e-300 is 0 in float32
    grads = t.backward(p, np.array([[2, 4]], np.float32)).unwrap()
    assert all(g.dtype == np.float64 for g in grads)
    np.testing.assert_array_equal(grads[a], [[1, 1, 2, 2]])
    np.testing.assert_array_equal(grads[unused], [[0]])


@pytest.mark.parametrize(("dtype", "shown"), [
    ("float16", "'float16'"), ("Float64", "'Float64'"), (np.float64, "<class 'numpy.float64'>"), (None, "None"),
    (64, "64"),
])
def test_an_unknown_dtype_is_a_value_error(dtype, shown) -> None:
    with pytest.raises(ValueError) as info:
        Tape(dtype=dtype)
    assert str(info.value) == f"autograd: cpu: Tape: dtype must be 'float32' or 'float64', got {shown}"


def test_beta_is_checked_as_a_float32_on_a_float64_tape() -> None:
    t, x = Tape(dtype="float64").leaf(np.ones((1, 2)))
    window = dict(c=1, in_spatial=(2,), kernel=(2,), stride=(1,), padding=(0,))
    assert t.smooth_max_pool(x, 1e-300, **window).error == (
        "autograd: cpu: smooth_max_pool: beta must be finite and nonzero")
    t, y = t.smooth_max_pool(x, 0.1, **window).unwrap()  # β rounded to float32, then used in float64
    np.testing.assert_allclose(t.value(y), [[1 + np.log(2) / np.float32(0.1)]], rtol=1e-15)


def run_case(geom: Geometry, rng: np.random.Generator, dtype: str, oracle=None) -> None:
    inputs, grad = reference.draw_inputs(rng, geom, dtype), reference.draw_grad(rng, geom, dtype)
    output, grads = reference.run_on_tape(Tape(dtype=dtype), geom, inputs, grad)
    assert output.dtype == dtype and all(g.dtype == dtype for g in grads)
    if output.size == 0:  # an empty node passes zero gradients back
        for got, shape in zip(grads, geom.parent_shapes, strict=True):
            assert got.shape == shape and not got.any()
    else:
        reference.check_against_reference(geom, inputs, grad, output, grads, oracle, RTOLS[dtype])


@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_float64_seed_ops_match_the_reference(family: Family) -> None:
    rng = reference.case_rng("float64 tape", family.value)
    for rank in (1, 2, 4, 8):
        run_case(reference.random_geometry(rng, family, rank, allow_empty=True), rng, "float64")


@pytest.mark.parametrize("family", torch_oracle.FAMILIES, ids=lambda f: f.value)
def test_float64_seed_ops_match_float64_torch(family: Family) -> None:
    torch = pytest.importorskip("torch")
    for rank in (1, 2, 3):
        rng = reference.case_rng("float64 tape torch", family.value, rank)
        for geom in reference.torch_geometries(rng, family, rank, 3):
            run_case(geom, rng, "float64", oracle=lambda *args: torch_oracle.run(torch, *args))


# Through the ops' §8 keywords (once the generated ops take them).

@needs_keywords
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_extended_ops_match_the_reference(family: Family, dtype: str) -> None:
    rng = reference.case_rng("extended tape", family.value, dtype)
    for rank in (1, 2, 3, 5, 8):
        for _ in range(2):
            run_case(reference.random_geometry(rng, family, rank, allow_empty=True, extended=True), rng, dtype)


@needs_keywords
@pytest.mark.parametrize("family", torch_oracle.FAMILIES, ids=lambda f: f.value)
def test_extended_float64_ops_match_float64_torch(family: Family) -> None:
    torch = pytest.importorskip("torch")
    for rank in (1, 2, 3):
        rng = reference.case_rng("extended tape torch", family.value, rank)
        for geom in reference.torch_geometries(rng, family, rank, 3, extended=True):
            run_case(geom, rng, "float64", oracle=lambda *args: torch_oracle.run(torch, *args))


def explicit_defaults(family: Family, rank: int) -> dict[str, object]:
    keywords: dict[str, object] = dict(batch=None, dilation=(1,) * rank)
    if family.is_conv:
        keywords["groups"] = 1
    if family is Family.CONV:
        keywords["padding_mode"] = "zeros"
    if family is Family.CONV_TRANSPOSE:
        keywords["output_padding"] = (0,) * rank
    return keywords


def op_results(tape, geom: Geometry, ids, grad, **keywords) -> list[np.ndarray]:
    """The output and the input gradients of the N-D op of `geom` called with `keywords` added."""
    spatial = dict(in_spatial=geom.in_spatial, kernel=geom.kernel, stride=geom.stride, padding=geom.padding)
    if geom.family.is_conv:
        result = getattr(tape, geom.family.value)(*ids, in_c=geom.in_c, out_c=geom.out_c, **spatial, **keywords)
    else:
        betas = () if geom.beta is None else (geom.beta,)
        result = getattr(tape, geom.family.value)(*ids, *betas, c=geom.in_c, **spatial, **keywords)
    tape, out = result.unwrap()
    grads = tape.backward(out, grad).unwrap()
    return [tape.value(out), *(grads[i] for i in ids)]


@needs_keywords
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_explicit_defaults_are_the_seed_op_bit_for_bit(family: Family) -> None:
    rng = reference.case_rng("explicit defaults", family.value)
    for rank in (1, 3):
        geom = reference.random_geometry(rng, family, rank)
        tape, ids = reference.record_leaves(Tape(), reference.draw_inputs(rng, geom))
        grad = reference.draw_grad(rng, geom)
        omitted = op_results(tape, geom, ids, grad)
        given = op_results(tape, geom, ids, grad, **explicit_defaults(family, rank))
        for a, b in zip(omitted, given, strict=True):
            np.testing.assert_array_equal(a, b, strict=True)


@needs_keywords
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_batch_one_is_the_unbatched_op_bit_for_bit(family: Family) -> None:
    rng = reference.case_rng("tape batch of one", family.value)
    for rank in (1, 2):
        geom = reference.random_geometry(rng, family, rank)
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        tape, ids = reference.record_leaves(Tape(), inputs)
        single = op_results(tape, geom, ids, grad)
        tape, ids = reference.record_leaves(Tape(), (*inputs[:-1], inputs[-1][None]))
        batched = op_results(tape, geom, ids, grad[None], batch=1)
        expected = [single[0][None], *single[1:-1], single[-1][None]]
        for got, want in zip(batched, expected, strict=True):
            np.testing.assert_array_equal(got, want, strict=True)


@needs_keywords
def test_batch_zero_is_an_empty_node_with_zero_gradients() -> None:
    t, (w, b, x) = reference.record_leaves(
        convgen.cpu.Tape(), [np.ones((3, 2, 2)), np.ones(3), np.ones((0, 2, 5))])
    t, y = t.conv(w, b, x, in_c=2, out_c=3, kernel=(2,), stride=(1,), padding=(0,), in_spatial=(5,), batch=0).unwrap()
    assert t.shape(y) == (0, 3, 4) and t.value(y).size == 0
    grads = t.backward(y, np.zeros((0, 3, 4))).unwrap()
    for node, shape in ((w, (3, 2, 2)), (b, (3,)), (x, (0, 2, 5))):
        assert grads[node].shape == shape and not grads[node].any()
