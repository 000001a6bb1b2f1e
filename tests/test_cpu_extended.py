"""SEMANTICS §8 on the NumPy backend: batch, dilation, groups, circular padding and output padding
against the float64 brute-force reference at every rank 1..8 and against torch.nn.functional at
ranks 1..3, in float32 and float64; batch=1 is the unbatched op bit for bit; worked examples of the
rules the reference and torch could both get wrong; finite differences in float64."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import reference
import torch_oracle
from convgen.geometry import MAX_RANK, Family, Geometry
from reference import run_numpy_backend as run_backend

RANKS = range(1, MAX_RANK + 1)
DTYPES = ("float32", "float64")
RTOLS = {"float32": reference.RTOL, "float64": reference.RTOL_FLOAT64}


def check_case(geom: Geometry, rng: np.random.Generator, dtype: str = "float32", oracle=None) -> None:
    inputs, grad = reference.draw_inputs(rng, geom, dtype), reference.draw_grad(rng, geom, dtype)
    output, grads = run_backend(geom, inputs, grad, dtype)
    reference.check_against_reference(geom, inputs, grad, output, grads, oracle, RTOLS[dtype])


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_extended_geometry_matches_reference(family: Family, rank: int) -> None:
    rng = reference.case_rng("extended", family.value, rank)
    for case in range(6):
        geom = reference.random_geometry(rng, family, rank, extended=True)
        assert reference.out_spatial(geom) == geom.out_spatial  # the reference sizes independently
        check_case(geom, rng, DTYPES[case % 2])


def test_random_extended_geometry_mixes_every_argument() -> None:
    """The draws above exercise every argument, alone and together (a test that cannot fail on
    them would be one that never draws them)."""
    seen: collections.Counter[str] = collections.Counter()
    for family in Family:
        for rank in RANKS:
            rng = reference.case_rng("extended", family.value, rank)
            for _ in range(6):
                geom = reference.random_geometry(rng, family, rank, extended=True)
                used = set(reference.extended_keywords(geom))
                seen.update(used)
                seen["three or more at once"] += len(used) >= 3
                reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)  # keep the stream in step
    assert all(seen[name] >= 5 for name in ("batch", "dilation", "groups", "padding_mode", "output_padding",
                                             "three or more at once")), seen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("family", torch_oracle.FAMILIES, ids=lambda f: f.value)
def test_extended_geometry_matches_torch(family: Family, rank: int, dtype: str) -> None:
    torch = pytest.importorskip("torch")
    rng = reference.case_rng("extended torch", family.value, rank, dtype)
    for geom in reference.torch_geometries(rng, family, rank, 8, budget=1500, extended=True):
        check_case(geom, rng, dtype, oracle=lambda *args: torch_oracle.run(torch, *args))


@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_a_batch_of_one_is_the_unbatched_op_bit_for_bit(family: Family) -> None:
    rng = reference.case_rng("batch of one", family.value)
    for rank in (1, 2, 3):
        for dtype in DTYPES:
            single = reference.random_geometry(rng, family, rank, extended=True)
            single = Geometry.build(family, single.in_c, single.out_c, single.in_spatial, single.kernel,
                                    single.stride, single.padding, single.beta, dilation=single.dilation,
                                    groups=single.groups, circular=single.circular,
                                    output_padding=single.output_padding)
            batched = Geometry.build(family, single.in_c, single.out_c, single.in_spatial, single.kernel,
                                     single.stride, single.padding, single.beta, batch=1, dilation=single.dilation,
                                     groups=single.groups, circular=single.circular,
                                     output_padding=single.output_padding)
            inputs, grad = reference.draw_inputs(rng, single, dtype), reference.draw_grad(rng, single, dtype)
            out, grads = run_backend(single, inputs, grad, dtype)
            out_1, grads_1 = run_backend(batched, (*inputs[:-1], inputs[-1][None]), grad[None], dtype)
            np.testing.assert_array_equal(out_1, out[None], strict=True)
            for got, expected in zip(grads_1, (*grads[:-1], grads[-1][None]), strict=True):
                np.testing.assert_array_equal(got, expected, strict=True)


def test_images_of_a_batch_share_the_kernel() -> None:
    """Each image's output is its own op; the kernel and bias gradients are the images' sums."""
    rng = reference.case_rng("shared kernel")
    single = Geometry.build(Family.CONV, 2, 4, (5, 4), (3, 2), (1, 2), (1, 1), groups=2, dilation=(2, 1))
    batched = Geometry.build(Family.CONV, 2, 4, (5, 4), (3, 2), (1, 2), (1, 1), batch=3, groups=2, dilation=(2, 1))
    inputs, grad = reference.draw_inputs(rng, batched, "float64"), reference.draw_grad(rng, batched, "float64")
    out, (d_weight, d_bias, d_x) = run_backend(batched, inputs, grad, "float64")
    per_image = [run_backend(single, (*inputs[:2], inputs[2][n]), grad[n], "float64") for n in range(3)]
    np.testing.assert_allclose(out, [image[0] for image in per_image], rtol=1e-14)
    np.testing.assert_allclose(d_x, [image[1][2] for image in per_image], rtol=1e-14)
    np.testing.assert_allclose(d_weight, sum(image[1][0] for image in per_image), rtol=1e-12)
    np.testing.assert_allclose(d_bias, sum(image[1][1] for image in per_image), rtol=1e-12)


# Worked examples, by hand from SEMANTICS §8.

def run_both(geom: Geometry, inputs, grad):
    """The backend's and the reference's output and gradients (float64 inputs)."""
    inputs = tuple(np.asarray(a, np.float64) for a in inputs)
    grad = np.asarray(grad, np.float64)
    return run_backend(geom, inputs, grad, "float64"), reference.run(geom, inputs, grad)


def test_circular_padding_wraps_reads_and_their_gradients() -> None:
    # x = [1, 2, 3], kernel [1, 10, 100], p = 1: the windows read [3, 1, 2], [1, 2, 3], [2, 3, 1].
    geom = Geometry.build(Family.CONV, 1, 1, (3,), (3,), (1,), (1,), circular=True)
    for out, (d_weight, d_bias, d_x) in run_both(geom, ([[[1, 10, 100]]], [0.5], [[1, 2, 3]]), [[1, 1, 1]]):
        np.testing.assert_array_equal(out, [[213.5, 321.5, 132.5]])
        np.testing.assert_array_equal(d_x, [[111, 111, 111]])  # every cell is read once per offset
        np.testing.assert_array_equal(d_weight, [[[6, 6, 6]]])
        np.testing.assert_array_equal(d_bias, [3])


def test_groups_keep_channels_apart() -> None:
    # conv, 2 groups of 1 channel: output 0 reads input 0 only, output 1 input 1 only.
    geom = Geometry.build(Family.CONV, 2, 2, (2,), (1,), (1,), (0,), groups=2)
    for out, (d_weight, _, d_x) in run_both(geom, ([[[2]], [[3]]], [0, 0], [[1, 10], [100, 1000]]), [[1, 1], [1, 0]]):
        np.testing.assert_array_equal(out, [[2, 20], [300, 3000]])
        np.testing.assert_array_equal(d_x, [[2, 2], [3, 0]])
        np.testing.assert_array_equal(d_weight, [[[11]], [[100]]])
    # conv transpose, kernel [in_c=2, out_c/g=1, 1]: input 1 writes output 1 only.
    geom = Geometry.build(Family.CONV_TRANSPOSE, 2, 2, (1,), (1,), (1,), (0,), groups=2)
    for out, (_, _, d_x) in run_both(geom, ([[[2]], [[3]]], [0, 0], [[1], [10]]), [[1], [5]]):
        np.testing.assert_array_equal(out, [[2], [30]])
        np.testing.assert_array_equal(d_x, [[2], [15]])


def test_dilation_and_output_padding_extents() -> None:
    # conv transpose, in 2, k 2, δ 3, s 2, p 1: ((2 − 1)·2 + 4) − 2 = 4, + output padding 2 = 6.
    geom = Geometry.build(Family.CONV_TRANSPOSE, 1, 1, (2,), (2,), (2,), (1,), dilation=(3,), output_padding=(2,))
    assert geom.out_spatial == (6,) == reference.out_spatial(geom)
    # q = i·2 + κ·3 − 1: (i, κ) = (0, 1) → 2, (1, 0) → 1, (1, 1) → 4; q = −1 is cut; 0, 3 and 5 get the bias.
    for out, (d_weight, _, d_x) in run_both(geom, ([[[1, 10]]], [0.5], [[1, 2]]), [[1, 2, 3, 4, 5, 6]]):
        np.testing.assert_array_equal(out, [[0.5, 2.5, 10.5, 0.5, 20.5, 0.5]])
        np.testing.assert_array_equal(d_x, [[30, 2 + 50]])
        np.testing.assert_array_equal(d_weight, [[[4, 3 + 10]]])


def test_a_dilated_max_pool_window_of_padding_only_is_minus_inf() -> None:
    # in 1, k 2, δ 3, p 2, s 2: the one window reads positions −2 and 1, both padding.
    geom = Geometry.build(Family.MAX_POOL, 1, 1, (1,), (2,), (2,), (2,), dilation=(3,))
    assert geom.out_spatial == (1,)
    for out, (d_x,) in run_both(geom, ([[7]],), [[1]]):
        np.testing.assert_array_equal(out, [[-np.inf]])
        np.testing.assert_array_equal(d_x, [[0]])
    # Avg and smooth max count the two pads as zeros (K = 2).
    for family, beta, expected in ((Family.AVG_POOL, None, 0.0), (Family.SMOOTH_MAX_POOL, 1.0, np.log(2))):
        geom = Geometry.build(family, 1, 1, (1,), (2,), (2,), (2,), beta, dilation=(3,))
        for out, (d_x,) in run_both(geom, ([[7]],), [[1]]):
            np.testing.assert_allclose(out, [[expected]], rtol=1e-15)
            np.testing.assert_array_equal(d_x, [[0]])


# Finite differences of the float64 backend's own forward.

def directional_derivative(geom: Geometry, inputs, grad, parent: int, direction, eps: float = 1e-6) -> float:
    def loss(t: float) -> float:
        moved = list(inputs)
        moved[parent] = moved[parent] + t * direction
        return float(np.sum(grad * run_backend(geom, moved, grad, "float64")[0]))
    return (loss(eps) - loss(-eps)) / (2 * eps)


@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_float64_gradients_match_finite_differences(family: Family, rank: int) -> None:
    rng = reference.case_rng("fd64", family.value, rank)
    for _ in range(3):
        geom = reference.random_geometry(rng, family, rank, budget=150, extended=True)
        inputs, grad = reference.draw_inputs(rng, geom, "float64"), reference.draw_grad(rng, geom, "float64")
        _, grads = run_backend(geom, inputs, grad, "float64")
        _, abs_grads = reference.run(geom, [np.abs(a) for a in inputs], np.abs(grad))
        for parent, (got, got_abs) in enumerate(zip(grads, abs_grads)):
            if got.size:
                direction = rng.standard_normal(got.shape)
                numeric = directional_derivative(geom, inputs, grad, parent, direction)
                scale = np.linalg.norm(direction) * np.linalg.norm(got_abs)
                assert abs(np.sum(got * direction) - numeric) <= 1e-7 * scale, (geom, parent)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_special_values_raise_no_warning_and_repeat_bit_for_bit(family: Family, dtype: str) -> None:
    rng = reference.case_rng("extended special", family.value, dtype)
    extremes = np.array([np.inf, -np.inf, np.nan, 0.0, 3e38, -3e38], dtype)
    for rank in (1, 2, 3):
        geom = reference.random_geometry(rng, family, rank, budget=150, extended=True)
        inputs = list(reference.draw_inputs(rng, geom, dtype))
        for values in inputs:
            mask = rng.random(values.shape) < 0.3
            values[mask] = rng.choice(extremes, size=int(mask.sum()))
        grad = reference.draw_grad(rng, geom, dtype)
        first, second = run_backend(geom, inputs, grad, dtype), run_backend(geom, inputs, grad, dtype)
        for a, b in zip([first[0], *first[1]], [second[0], *second[1]], strict=True):
            np.testing.assert_array_equal(a, b)
