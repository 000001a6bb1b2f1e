"""The NumPy backend against the float64 brute-force reference: random geometry of every family at
every rank 1..8 (forward and every gradient), finite-difference checks of both, the degenerate
geometry it must handle, smooth max's stability, max pool's NaN and tie rules, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from convgen.geometry import MAX_RANK, Family, Geometry
from reference import run_numpy_backend as run_backend

RANKS = range(1, MAX_RANK + 1)
FD_RANKS = (1, 2, 3, 5)


def check_case(geom: Geometry, rng: np.random.Generator) -> None:
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    reference.check_against_reference(geom, inputs, grad, *run_backend(geom, inputs, grad))


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_random_geometry_matches_reference(family: Family, rank: int) -> None:
    rng = reference.case_rng("reference", family.value, rank)
    for _ in range(20):
        geom = reference.random_geometry(rng, family, rank)
        assert reference.out_spatial(geom) == geom.out_spatial  # the reference sizes independently
        check_case(geom, rng)


EDGE_CASES = {
    # conv: every read of axis 0 is padding, so the output is the bias along it
    "conv empty input axis": Geometry.build(Family.CONV, 2, 3, (0, 3), (2, 2), (1, 1), (1, 1)),
    "conv no input channels": Geometry.build(Family.CONV, 0, 2, (3, 2), (2, 1), (1, 1), (0, 0)),
    "conv kernel larger than input": Geometry.build(Family.CONV, 2, 2, (2,), (5,), (1,), (2,)),
    "conv padding beyond the kernel": Geometry.build(Family.CONV, 1, 1, (1,), (1,), (1,), (2,)),
    "conv transpose no input channels": Geometry.build(Family.CONV_TRANSPOSE, 0, 2, (2, 2), (2, 2), (2, 1), (0, 0)),
    "conv transpose padding cuts the output": Geometry.build(Family.CONV_TRANSPOSE, 2, 1, (3,), (2,), (3,), (2,)),
    "conv transpose stride gaps": Geometry.build(Family.CONV_TRANSPOSE, 1, 2, (3, 2), (1, 2), (3, 3), (0, 1)),
    "max pool window beyond input": Geometry.build(Family.MAX_POOL, 2, 2, (1, 2), (3, 3), (1, 2), (1, 1)),
    "avg pool stride skips cells": Geometry.build(Family.AVG_POOL, 2, 2, (7,), (2,), (3,), (1,)),
    "smooth max pool padded zeros": Geometry.build(Family.SMOOTH_MAX_POOL, 2, 2, (2, 3), (3, 3), (1, 1), (1, 1), -0.75),
}


@pytest.mark.parametrize("name", EDGE_CASES)
def test_edge_geometry_matches_reference(name: str) -> None:
    geom = EDGE_CASES[name]
    assert geom.out_spatial == reference.out_spatial(geom) and all(geom.out_spatial)
    check_case(geom, reference.case_rng("edge", name))


def test_conv_of_only_padding_is_the_bias() -> None:
    geom = EDGE_CASES["conv empty input axis"]
    inputs = reference.draw_inputs(reference.case_rng("bias"), geom)
    out, grads = run_backend(geom, inputs, np.ones(geom.output_shape, np.float32))
    np.testing.assert_array_equal(out, np.broadcast_to(inputs[1][:, None, None], geom.output_shape))
    np.testing.assert_array_equal(grads[0], 0)
    np.testing.assert_array_equal(grads[1], np.full(3, 4, np.float32))  # 1×4 output cells of ones


def directional_derivative(geom: Geometry, inputs, grad, parent: int, direction, eps: float = 1e-6) -> float:
    """Central difference of Σ grad·forward along `direction` on input `parent`, in float64."""
    def loss(t: float) -> float:
        moved = [np.asarray(a, np.float64) for a in inputs]
        moved[parent] = moved[parent] + t * direction
        return float(np.sum(grad * reference.forward(geom, moved)))
    return (loss(eps) - loss(-eps)) / (2 * eps)


@pytest.mark.parametrize("rank", FD_RANKS)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_gradients_match_finite_differences(family: Family, rank: int) -> None:
    """Both the reference's gradients and the backend's are derivatives of the reference forward."""
    rng = reference.case_rng("fd", family.value, rank)
    for _ in range(3):
        geom = reference.random_geometry(rng, family, rank, budget=150)
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        _, ref_grads = reference.run(geom, inputs, grad)
        _, abs_grads = reference.run(geom, [np.abs(a) for a in inputs], np.abs(grad))
        _, backend_grads = run_backend(geom, inputs, grad)
        for parent, (ref, ref_abs, got) in enumerate(zip(ref_grads, abs_grads, backend_grads)):
            if ref.size == 0:
                continue
            for _ in range(2):
                direction = rng.standard_normal(ref.shape)
                numeric = directional_derivative(geom, inputs, grad, parent, direction)
                scale = np.linalg.norm(direction) * np.linalg.norm(ref_abs)
                assert abs(np.sum(ref * direction) - numeric) <= 1e-6 * scale, (geom, parent)
                assert abs(np.sum(got * direction) - numeric) <= 1e-5 * scale, (geom, parent)


@pytest.mark.parametrize("sign", [1, -1])
def test_smooth_max_never_forms_beta_times_v(sign: int) -> None:
    geom = Geometry.build(Family.SMOOTH_MAX_POOL, 1, 1, (2,), (2,), (1,), (0,), float(np.float32(sign * 1e20)))
    x = np.array([[1e20, -1e20]], np.float32)
    out, (d_x,) = run_backend(geom, (x,), np.ones((1, 1), np.float32))
    np.testing.assert_array_equal(out, [[np.float32(sign * 1e20)]])
    np.testing.assert_array_equal(d_x, [[1, 0]] if sign > 0 else [[0, 1]])


def max_pool_1d(x, kernel: int, padding: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Output and input gradient (upstream ones) of a stride-1 max pool over one channel."""
    x = np.array([x], np.float32)
    geom = Geometry.build(Family.MAX_POOL, 1, 1, (x.shape[1],), (kernel,), (1,), (padding,))
    out, (d_x,) = run_backend(geom, (x,), np.ones(geom.output_shape, np.float32))
    return out[0], d_x[0]


def test_max_pool_nan_first_cell_stays() -> None:
    out, d_x = max_pool_1d([np.nan, 5, 3], 3)
    assert np.isnan(out[0])
    np.testing.assert_array_equal(d_x, [1, 0, 0])


def test_max_pool_later_nan_is_never_greater() -> None:
    out, d_x = max_pool_1d([1, np.nan, 0], 3)
    np.testing.assert_array_equal(out, [1])
    np.testing.assert_array_equal(d_x, [1, 0, 0])


def test_max_pool_skips_padding_not_reads_it() -> None:
    # A padded cell would win against -inf if it were read as a value; it is skipped instead,
    # and the window [pad, NaN, 2] starts at the NaN.
    out, d_x = max_pool_1d([-np.inf, -np.inf], 3, padding=1)
    np.testing.assert_array_equal(out, [-np.inf, -np.inf])
    np.testing.assert_array_equal(d_x, [2, 0])
    out, d_x = max_pool_1d([np.nan, 2], 3, padding=1)
    assert np.isnan(out).all()
    np.testing.assert_array_equal(d_x, [2, 0])


def test_max_pool_ties_go_to_the_first_maximum() -> None:
    out, d_x = max_pool_1d([2, 5, 5, 1, 5], 5)
    np.testing.assert_array_equal(out, [5])
    np.testing.assert_array_equal(d_x, [0, 1, 0, 0, 0])
    # Row-major order of the kernel offsets: (0, 1) comes before (1, 0).
    geom = Geometry.build(Family.MAX_POOL, 1, 1, (2, 2), (2, 2), (1, 1), (0, 0))
    x = np.array([[[1, 7], [7, 0]]], np.float32)
    _, (d_x,) = run_backend(geom, (x,), np.ones((1, 1, 1), np.float32))
    np.testing.assert_array_equal(d_x, [[[0, 1], [0, 0]]])


@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_backward_is_bit_identical_run_after_run(family: Family) -> None:
    rng = reference.case_rng("determinism", family.value)
    geom = reference.random_geometry(rng, family, 3)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    first, second = run_backend(geom, inputs, grad), run_backend(geom, inputs, grad)
    for a, b in zip([first[0], *first[1]], [second[0], *second[1]]):
        np.testing.assert_array_equal(a, b)
