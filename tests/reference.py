"""A float64 brute-force reference of SEMANTICS §2-§4, written from the formulas alone: plain loops
over output (or input) cells and kernel offsets turn a `Geometry` and its inputs into the output
and every gradient. Also the test helpers shared by the CPU and CUDA tests: random geometry (and
the geometry PyTorch accepts), input drawing, the closeness check of DESIGN.md, recording leaves
and calling the N-D op on a tape, running the NumPy backend, and the special-value cases whose
results SEMANTICS §3 fixes exactly.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from convgen.cpu import NumpyBackend
from convgen.geometry import Family, Geometry

RTOL = 1e-5  # DESIGN.md "How close is close"


def cells(shape: tuple[int, ...]):
    """Every index of `shape` in row-major order."""
    return itertools.product(*(range(n) for n in shape))


def _window(n: int, k: int, s: int, p: int) -> int:
    return 0 if k == 0 or s == 0 or n + 2 * p < k else (n + 2 * p - k) // s + 1


def out_extent(family: Family, n: int, k: int, s: int, p: int) -> int:
    """SEMANTICS §2, one axis."""
    if family is Family.CONV:
        return _window(n, k, s, p)
    if family is Family.CONV_TRANSPOSE:
        return 0 if n == 0 or k == 0 or s == 0 else max((n - 1) * s + k - 2 * p, 0)
    return 0 if n == 0 or k == 0 or p > k // 2 else _window(n, k, s, p)


def out_spatial(geom: Geometry) -> tuple[int, ...]:
    axes = zip(geom.in_spatial, geom.kernel, geom.stride, geom.padding)
    return tuple(out_extent(geom.family, *axis) for axis in axes)


def _position(cell, offset, geom: Geometry, bounds: tuple[int, ...]) -> tuple[int, ...] | None:
    """`cell·s + κ − p` per axis, or None where it falls outside `bounds`."""
    pos = tuple(c * s + k - p for c, k, s, p in zip(cell, offset, geom.stride, geom.padding))
    return pos if all(0 <= q < n for q, n in zip(pos, bounds)) else None


def _matvec(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """matrix @ vector with every product formed (BLAS may skip a zero factor: 0 · inf must be NaN)."""
    return (matrix * vector).sum(axis=1)


# Forward and backward of each family. Every function takes float64 arrays shaped per
# `geom.parent_shapes` and returns float64 arrays.

def _conv(geom, weight, bias, x, grad):
    out_shape = out_spatial(geom)
    y = np.zeros((geom.out_c, *out_shape))
    d_weight, d_x = np.zeros_like(weight), np.zeros_like(x)
    for o in cells(out_shape):
        y[(slice(None), *o)] = bias
        for offset in cells(geom.kernel):
            pos = _position(o, offset, geom, geom.in_spatial)
            if pos is None:
                continue
            w = weight[(slice(None), slice(None), *offset)]  # [outC, inC]
            y[(slice(None), *o)] += _matvec(w, x[(slice(None), *pos)])
            g = grad[(slice(None), *o)]
            d_weight[(slice(None), slice(None), *offset)] += np.outer(g, x[(slice(None), *pos)])
            d_x[(slice(None), *pos)] += _matvec(w.T, g)
    return y, (d_weight, grad.sum(axis=tuple(range(1, grad.ndim))), d_x)


def _conv_transpose(geom, weight, bias, x, grad):
    out_shape = out_spatial(geom)
    y = np.broadcast_to(bias.reshape(-1, *(1,) * geom.rank), (geom.out_c, *out_shape)).copy()
    d_weight, d_x = np.zeros_like(weight), np.zeros_like(x)
    for i in cells(geom.in_spatial):  # the scatter form: input cells, not output cells
        for offset in cells(geom.kernel):
            q = _position(i, offset, geom, out_shape)
            if q is None:
                continue
            w = weight[(slice(None), slice(None), *offset)]  # [inC, outC]
            y[(slice(None), *q)] += _matvec(w.T, x[(slice(None), *i)])
            g = grad[(slice(None), *q)]
            d_weight[(slice(None), slice(None), *offset)] += np.outer(x[(slice(None), *i)], g)
            d_x[(slice(None), *i)] += _matvec(w, g)
    return y, (d_weight, grad.sum(axis=tuple(range(1, grad.ndim))), d_x)


def _pool_windows(geom):
    """(output cell, [input cell or None for padding, in row-major kernel order])."""
    for o in cells(out_spatial(geom)):
        yield o, [_position(o, offset, geom, geom.in_spatial) for offset in cells(geom.kernel)]


def _max_pool(geom, x, grad):
    y = np.zeros((geom.in_c, *out_spatial(geom)))
    d_x = np.zeros_like(x)
    for o, window in _pool_windows(geom):
        for c in range(geom.in_c):
            chosen = None
            for pos in window:
                if pos is not None and (chosen is None or x[(c, *pos)] > x[(c, *chosen)]):
                    chosen = pos
            y[(c, *o)] = x[(c, *chosen)]
            d_x[(c, *chosen)] += grad[(c, *o)]
    return y, (d_x,)


def _avg_pool(geom, x, grad):
    size = math.prod(geom.kernel)
    y = np.zeros((geom.in_c, *out_spatial(geom)))
    d_x = np.zeros_like(x)
    for o, window in _pool_windows(geom):
        for pos in window:
            if pos is not None:
                y[(slice(None), *o)] += x[(slice(None), *pos)] / size
                d_x[(slice(None), *pos)] += grad[(slice(None), *o)] / size
    return y, (d_x,)


def _smooth_max_pool(geom, x, grad):
    beta = geom.beta
    y = np.zeros((geom.in_c, *out_spatial(geom)))
    d_x = np.zeros_like(x)
    for o, window in _pool_windows(geom):
        for c in range(geom.in_c):
            values = [x[(c, *pos)] if pos is not None else 0.0 for pos in window]
            pivot = max(values) if beta > 0 else min(values)
            total = sum(math.exp(beta * (v - pivot)) for v in values)
            y[(c, *o)] = pivot + math.log(total) / beta
            for pos, v in zip(window, values):
                if pos is not None:
                    d_x[(c, *pos)] += grad[(c, *o)] * math.exp(beta * (v - pivot)) / total
    return y, (d_x,)


_FAMILIES = {
    Family.CONV: _conv,
    Family.CONV_TRANSPOSE: _conv_transpose,
    Family.MAX_POOL: _max_pool,
    Family.AVG_POOL: _avg_pool,
    Family.SMOOTH_MAX_POOL: _smooth_max_pool,
}


def output_shape(geom: Geometry) -> tuple[int, ...]:
    return (geom.out_c, *out_spatial(geom))


def run(geom: Geometry, inputs, grad=None) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The output and the gradients of every input given the upstream `grad` (zeros if None)."""
    inputs = [np.asarray(a, np.float64) for a in inputs]
    grad = np.zeros(output_shape(geom)) if grad is None else np.asarray(grad, np.float64)
    with np.errstate(all="ignore"):  # special values give their IEEE results silently
        return _FAMILIES[geom.family](geom, *inputs, grad)


def forward(geom: Geometry, inputs) -> np.ndarray:
    return run(geom, inputs)[0]


# Random cases.

def case_rng(*key: object) -> np.random.Generator:
    """A generator seeded by a test's parameters, so that every case is reproducible on its own."""
    return np.random.default_rng(list(str(key).encode()))


def random_geometry(rng: np.random.Generator, family: Family, rank: int, *, allow_empty: bool = False,
                    budget: int = 400) -> Geometry:
    """A valid geometry (nonzero kernel, conv in_c ≥ 1) with strides 1-3, conv paddings up to k+1,
    kernels larger than the input and, for conv, input axes of 0 read only through padding. With
    `allow_empty`, half the geometries have an empty output: one axis of extent 0 (pool padding
    k//2+1, an empty input, ...) or no output channels. The reference's loop count, output (input
    for conv transpose) cells times kernel offsets, stays within `budget` at every rank."""
    n_max = {1: 12, 2: 7, 3: 5}.get(rank, 3)
    k_max = {1: 5, 2: 4}.get(rank, 3)
    c_max = 3 if rank <= 4 else 2
    empty_axis, no_channels = None, False
    if allow_empty and rng.random() < 0.5:
        if rng.random() < 0.5:
            no_channels = True
        else:
            empty_axis = int(rng.integers(rank))
    remaining = budget
    axes = []
    for axis in range(rank):
        cap = max(1, int(remaining ** (1 / (rank - axis))))
        while True:
            k = int(rng.integers(1, k_max + 1))
            n = int(rng.integers(0, n_max + 1))
            s = int(rng.integers(1, 4))
            p_max = k + 1 if family.is_conv else k // 2 + int(axis == empty_axis)
            p = int(rng.integers(0, p_max + 1))
            extent = out_extent(family, n, k, s, p)
            loops = (n if family is Family.CONV_TRANSPOSE else extent) * k
            if (extent == 0) == (axis == empty_axis) and loops <= cap:
                break
        axes.append((n, k, s, p))
        remaining = max(1, remaining // max(loops, 1))
    in_spatial, kernel, stride, padding = (tuple(v) for v in zip(*axes))
    channels = 0 if no_channels else int(rng.integers(1, c_max + 1))
    in_c = int(rng.integers(1, c_max + 1)) if family.is_conv else channels
    beta = None
    if family is Family.SMOOTH_MAX_POOL:
        beta = float(np.float32(rng.choice([-1, 1]) * rng.uniform(0.25, 4.0)))
    return Geometry.build(family, in_c, channels, in_spatial, kernel, stride, padding, beta)


def torch_geometries(rng: np.random.Generator, family: Family, rank: int, count: int, *, budget: int = 400):
    """`count` random geometries (see `random_geometry`) that torch.nn.functional accepts."""
    import torch_oracle  # a sibling test module; imported here so that reference needs no torch

    while count:
        geom = random_geometry(rng, family, rank, budget=budget)
        if torch_oracle.accepts(geom):
            count -= 1
            yield geom


def draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Drawn in float64 and rounded to float32: the reference then sees exactly these values."""
    return rng.standard_normal(shape).astype(np.float32)


def draw_inputs(rng: np.random.Generator, geom: Geometry) -> tuple[np.ndarray, ...]:
    return tuple(draw(rng, shape) for shape in geom.parent_shapes)


def draw_grad(rng: np.random.Generator, geom: Geometry) -> np.ndarray:
    return draw(rng, output_shape(geom))


# Closeness.

def close_error(out, ref, ref_abs) -> str | None:
    """None when ‖out − ref‖ ≤ RTOL·‖ref_abs‖ (ref_abs: the reference on absolute values, so a
    cancelling sum cannot loosen the bound), else what went wrong."""
    out = np.asarray(out.get() if hasattr(out, "get") else out, np.float64)  # CuPy: to the host
    if out.shape != ref.shape:
        return f"shape {out.shape}, expected {ref.shape}"
    error, scale = np.linalg.norm(out - ref), np.linalg.norm(ref_abs)
    if error <= RTOL * scale:
        return None
    return f"‖out − ref‖ = {error:.3g} > {RTOL:g} · {scale:.3g}"


def check_against_reference(geom: Geometry, inputs, grad, output, grads, oracle=None) -> None:
    """Asserts the output and every gradient are close to `oracle(geom, inputs, grad)` (by
    default `run`, this reference) on the same inputs, scaled by the oracle on absolute values."""
    oracle = oracle or run
    ref_out, ref_grads = oracle(geom, inputs, grad)
    abs_out, abs_grads = oracle(geom, [np.abs(a) for a in inputs], np.abs(grad))
    labels = ("kernel", "bias", "input") if geom.family.is_conv else ("x",)
    assert len(grads) == len(labels), f"{len(grads)} gradients, expected {len(labels)}"
    results = [("output", output, ref_out, abs_out)] + [
        (f"d{label}", got, ref, ref_abs) for label, got, ref, ref_abs in zip(labels, grads, ref_grads, abs_grads)]
    failures = [f"{what}: {err}" for what, got, ref, ref_abs in results
                if (err := close_error(got, ref, ref_abs)) is not None]
    assert not failures, f"{geom}: " + "; ".join(failures)


# The public API.

def apply_op(tape, geom: Geometry, ids: tuple[int, ...]):
    """Calls the N-D op of `geom.family` on `tape` with the ids of its inputs; returns the Result."""
    spatial = dict(in_spatial=geom.in_spatial, kernel=geom.kernel, stride=geom.stride, padding=geom.padding)
    if geom.family.is_conv:
        return getattr(tape, geom.family.value)(*ids, in_c=geom.in_c, out_c=geom.out_c, **spatial)
    betas = () if geom.beta is None else (geom.beta,)
    return getattr(tape, geom.family.value)(*ids, *betas, c=geom.in_c, **spatial)


def record_leaves(tape, values) -> tuple[Any, tuple[int, ...]]:
    """`tape` with every value recorded as a leaf, and their ids."""
    ids = []
    for value in values:
        tape, node = tape.leaf(value)
        ids.append(node)
    return tape, tuple(ids)


def run_on_tape(tape, geom: Geometry, inputs, grad) -> tuple[Any, list[Any]]:
    """Records `inputs` as leaves, applies the op and runs backward from it with `grad`: the
    output and the gradients of the inputs, as the tape's arrays."""
    tape, ids = record_leaves(tape, inputs)
    tape, out = apply_op(tape, geom, ids).unwrap()
    grads = tape.backward(out, grad).unwrap()
    return tape.value(out), [grads[i] for i in ids]


def run_numpy_backend(geom: Geometry, inputs, grad) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The NumPy backend's output and gradients, each checked to be float32 and shaped as the
    geometry says."""
    backend = NumpyBackend()
    out, saved = backend.forward(geom, inputs)
    assert out.dtype == np.float32 and out.shape == geom.output_shape
    grads = backend.backward(geom, inputs, saved, grad)
    for got, shape in zip(grads, geom.parent_shapes, strict=True):
        assert got.dtype == np.float32 and got.shape == shape
    return out, grads


# Special values: SEMANTICS §3-§4 form only in-bounds terms, each an IEEE product, so 0 · inf is
# NaN whatever the other dimensions, and padding (skipped, not multiplied) never meets an inf.
# Expected values are worked out by hand from the formulas.

@dataclass(frozen=True)
class SpecialCase:
    geom: Geometry
    inputs: tuple[np.ndarray, ...]  # as `geom.parent_shapes`
    grad: np.ndarray  # the upstream gradient, shaped like the output
    output: np.ndarray
    grads: tuple[np.ndarray, ...]  # one per input


def _f32(*arrays) -> tuple[np.ndarray, ...]:
    return tuple(np.array(a, np.float32) for a in arrays)


INF, NAN = math.inf, math.nan
_CONV_1D = dict(in_spatial=(2,), kernel=(1,), stride=(1,), padding=(0,))
SPECIAL_CASES = {
    # y = b + 0·x: 0·inf is NaN with one output channel as with two (BLAS may return 0 for a 1×N product).
    "conv 0*inf, one output channel": SpecialCase(
        Geometry.build(Family.CONV, 1, 1, **_CONV_1D), _f32([[[0]]], [1], [[INF, 2]]), *_f32([[1, 1]], [[NAN, 1]]),
        _f32([[[INF]]], [2], [[0, 0]])),
    "conv 0*inf, two output channels": SpecialCase(
        Geometry.build(Family.CONV, 1, 2, **_CONV_1D), _f32([[[0]], [[0]]], [1, 1], [[INF, 2]]),
        *_f32([[1, 1], [1, 1]], [[NAN, 1], [NAN, 1]]), _f32([[[INF]], [[INF]]], [2, 2], [[0, 0]])),
    # Padding 1 around one cell: the outer outputs see only padding, so they are the bias.
    "conv inf weight, cells of only padding": SpecialCase(
        Geometry.build(Family.CONV, 1, 1, (1,), (1,), (1,), (1,)), _f32([[[INF]]], [1], [[1]]),
        *_f32([[1, 1, 1]], [[1, INF, 1]]), _f32([[[1]]], [3], [[INF]])),
    # The weight gradient pairs g with in-bounds x only: the inf gradients at the padded cells add nothing.
    "conv inf gradient over padding": SpecialCase(
        Geometry.build(Family.CONV, 1, 1, (1,), (1,), (1,), (1,)), _f32([[[1]]], [0], [[2]]),
        *_f32([[INF, 1, INF]], [[0, 2, 0]]), _f32([[[2]]], [INF], [[1]])),
    # Output extent (1 − 1)·1 + 3 − 2 = 1: only κ = 1 lands inside the output.
    "conv transpose inf input and weights off the output": SpecialCase(
        Geometry.build(Family.CONV_TRANSPOSE, 1, 1, (1,), (3,), (1,), (1,)), _f32([[[INF, 1, INF]]], [0], [[INF]]),
        *_f32([[1]], [[INF]]), _f32([[[0, INF, 0]]], [1], [[1]])),
    # Windows [pad, inf], [inf, 1], [1, pad]; padded cells count as zeros in the sum and in K = 2.
    "avg pool inf beside padding": SpecialCase(
        Geometry.build(Family.AVG_POOL, 1, 1, (2,), (2,), (1,), (1,)), _f32([[INF, 1]]),
        *_f32([[1, 1, 1]], [[INF, INF, 0.5]]), _f32([[1, 1]])),
}
