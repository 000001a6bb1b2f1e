"""A float64 brute-force reference of SEMANTICS §2-§4 and §8 (batch, dilation, groups, circular
padding, output padding), written from the formulas alone, sharing no code with convgen.cpu: plain
loops over images, output (or input) cells, kernel offsets and groups turn a `Geometry` and its
inputs into the output and every gradient. Also the test helpers shared by the CPU and CUDA tests: random geometry (and
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
RTOL_FLOAT64 = 1e-12  # a float64 tape against a float64 oracle: sums of a few hundred terms, rounded once


def cells(shape: tuple[int, ...]):
    """Every index of `shape` in row-major order."""
    return itertools.product(*(range(n) for n in shape))


def _window(n: int, k: int, s: int, p: int) -> int:
    return 0 if k == 0 or s == 0 or n + 2 * p < k else (n + 2 * p - k) // s + 1


def out_extent(family: Family, n: int, k: int, s: int, p: int, d: int = 1, extra: int = 0) -> int:
    """SEMANTICS §2, one axis, with §8's dilation d (the kernel spans d·(k − 1) + 1 cells) and, for
    a transposed convolution, output padding `extra`."""
    span = d * (k - 1) + 1 if k else 0
    if family is Family.CONV:
        return _window(n, span, s, p)
    if family is Family.CONV_TRANSPOSE:
        extent = 0 if n == 0 or k == 0 or s == 0 else max((n - 1) * s + span - 2 * p, 0)
        return extent + extra if extent else 0
    return 0 if n == 0 or k == 0 or p > span // 2 else _window(n, span, s, p)


def out_spatial(geom: Geometry) -> tuple[int, ...]:
    axes = zip(geom.in_spatial, geom.kernel, geom.stride, geom.padding, geom.dilation, geom.output_padding)
    return tuple(out_extent(geom.family, *axis) for axis in axes)


def _position(cell, offset, geom: Geometry, bounds: tuple[int, ...]) -> tuple[int, ...] | None:
    """`cell·s + κ·δ − p` per axis, taken modulo the extent with circular padding; None where it
    falls outside `bounds`."""
    pos = tuple(c * s + k * d - p for c, k, s, p, d in zip(cell, offset, geom.stride, geom.padding, geom.dilation))
    if geom.circular:
        pos = tuple(q % n for q, n in zip(pos, bounds))
    return pos if all(0 <= q < n for q, n in zip(pos, bounds)) else None


def _matvec(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """matrix @ vector with every product formed (BLAS may skip a zero factor: 0 · inf must be NaN)."""
    return (matrix * vector).sum(axis=1)


def _group_slices(geom: Geometry):
    """Per group, the slices of its input channels and of its output channels."""
    per_in, per_out = geom.in_c // geom.groups, geom.out_c // geom.groups
    for group in range(geom.groups):
        yield slice(group * per_in, (group + 1) * per_in), slice(group * per_out, (group + 1) * per_out)


# Forward and backward of each family for one image. Every function takes float64 arrays shaped
# per `geom.parent_shapes` without the batch axis and returns float64 arrays.

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
            for ins, outs in _group_slices(geom):
                w = weight[(outs, slice(None), *offset)]  # [outC/g, inC/g]
                xs, g = x[(ins, *pos)], grad[(outs, *o)]
                y[(outs, *o)] += _matvec(w, xs)
                d_weight[(outs, slice(None), *offset)] += np.outer(g, xs)
                d_x[(ins, *pos)] += _matvec(w.T, g)
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
            for ins, outs in _group_slices(geom):
                w = weight[(ins, slice(None), *offset)]  # [inC/g, outC/g]
                xs, g = x[(ins, *i)], grad[(outs, *q)]
                y[(outs, *q)] += _matvec(w.T, xs)
                d_weight[(ins, slice(None), *offset)] += np.outer(xs, g)
                d_x[(ins, *i)] += _matvec(w, g)
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
            if chosen is None:  # a dilated window of padding only
                y[(c, *o)] = -math.inf
                continue
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
    images = () if geom.batch is None else (geom.batch,)
    return (*images, geom.out_c, *out_spatial(geom))


def run(geom: Geometry, inputs, grad=None) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The output and the gradients of every input given the upstream `grad` (zeros if None). A
    batch is its images one by one; the kernel and bias gradients add up over them."""
    inputs = [np.asarray(a, np.float64) for a in inputs]
    grad = np.zeros(output_shape(geom)) if grad is None else np.asarray(grad, np.float64)
    one_image = _FAMILIES[geom.family]
    with np.errstate(all="ignore"):  # special values give their IEEE results silently
        if geom.batch is None:
            return one_image(geom, *inputs, grad)
        *shared, x = inputs
        output, grads = np.zeros(output_shape(geom)), [np.zeros_like(a) for a in inputs]
        for image in range(geom.batch):
            output[image], image_grads = one_image(geom, *shared, x[image], grad[image])
            for total, image_grad in zip(grads[:-1], image_grads[:-1]):
                total += image_grad
            grads[-1][image] = image_grads[-1]
        return output, tuple(grads)


def forward(geom: Geometry, inputs) -> np.ndarray:
    return run(geom, inputs)[0]


# Random cases.

def case_rng(*key: object) -> np.random.Generator:
    """A generator seeded by a test's parameters, so that every case is reproducible on its own."""
    return np.random.default_rng(list(str(key).encode()))


def random_geometry(rng: np.random.Generator, family: Family, rank: int, *, allow_empty: bool = False,
                    budget: int = 400, extended: bool = False) -> Geometry:
    """A valid geometry (nonzero kernel, conv in_c ≥ 1) with strides 1-3, conv paddings up to k+1,
    kernels larger than the input and, for conv, input axes of 0 read only through padding. With
    `allow_empty`, half the geometries have an empty output: one axis of extent 0 (pool padding
    k//2+1, an empty input, ...), no output channels or (extended) a batch of 0. With `extended`,
    the §8 arguments are mixed in: a batch of None or 1-3 images, dilations 1-3, groups 1-3 and, for
    conv, circular padding (p ≤ n) and, for conv transpose, output padding. The reference's loop
    count, output (input for conv transpose) cells times kernel offsets times images, stays within
    `budget` at every rank."""
    n_max = {1: 12, 2: 7, 3: 5}.get(rank, 3)
    k_max = {1: 5, 2: 4}.get(rank, 3)
    c_max = 3 if rank <= 4 else 2
    empty_axis, no_channels, batch = None, False, None
    if allow_empty and rng.random() < 0.5:
        empty = int(rng.integers(3)) if extended else int(rng.random() >= 0.5)  # channels, axis, batch
        no_channels, batch = empty == 0, 0 if empty == 2 else None
        if empty == 1:
            empty_axis = int(rng.integers(rank))
    if extended and batch is None:
        batch = [None, 1, 2, 3][int(rng.integers(4))]
    circular = extended and family is Family.CONV and rng.random() < 0.4
    remaining = budget // max(1, batch or 1)
    axes = []
    for axis in range(rank):
        cap = max(1, int(remaining ** (1 / (rank - axis))))
        while True:
            k = int(rng.integers(1, k_max + 1))
            n = int(rng.integers(0, n_max + 1))
            s = int(rng.integers(1, 4))
            d = int(rng.integers(1, 4)) if extended else 1
            span = d * (k - 1) + 1
            p_max = (n if circular else span + 1) if family.is_conv else span // 2 + int(axis == empty_axis)
            p = int(rng.integers(0, p_max + 1))
            extra = int(rng.integers(max(s, d))) if extended and family is Family.CONV_TRANSPOSE else 0
            extent = out_extent(family, n, k, s, p, d, extra)
            loops = (n if family is Family.CONV_TRANSPOSE else extent) * k
            if (extent == 0) == (axis == empty_axis) and loops <= cap:
                break
        axes.append((n, k, s, p, d, extra))
        remaining = max(1, remaining // max(loops, 1))
    in_spatial, kernel, stride, padding, dilation, output_padding = (tuple(v) for v in zip(*axes))
    groups = int(rng.choice([1, 1, 2, 3])) if extended and family.is_conv else 1
    per_group = c_max if groups == 1 else 2
    channels = 0 if no_channels else groups * int(rng.integers(1, per_group + 1))
    in_c = groups * int(rng.integers(1, per_group + 1)) if family.is_conv else channels
    beta = None
    if family is Family.SMOOTH_MAX_POOL:
        beta = float(np.float32(rng.choice([-1, 1]) * rng.uniform(0.25, 4.0)))
    return Geometry.build(family, in_c, channels, in_spatial, kernel, stride, padding, beta, batch=batch,
                          dilation=dilation, groups=groups, circular=circular, output_padding=output_padding)


def torch_geometries(rng: np.random.Generator, family: Family, rank: int, count: int, *, budget: int = 400,
                     extended: bool = False):
    """`count` random geometries (see `random_geometry`) that torch.nn.functional accepts."""
    import torch_oracle  # a sibling test module; imported here so that reference needs no torch

    while count:
        geom = random_geometry(rng, family, rank, budget=budget, extended=extended)
        if torch_oracle.accepts(geom):
            count -= 1
            yield geom


def draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """Drawn in float64 and rounded to `dtype`: the reference then sees exactly these values."""
    return rng.standard_normal(shape).astype(dtype)


def draw_inputs(rng: np.random.Generator, geom: Geometry, dtype: str = "float32") -> tuple[np.ndarray, ...]:
    return tuple(draw(rng, shape, dtype) for shape in geom.parent_shapes)


def draw_grad(rng: np.random.Generator, geom: Geometry, dtype: str = "float32") -> np.ndarray:
    return draw(rng, output_shape(geom), dtype)


# Closeness.

def close_error(out, ref, ref_abs, rtol: float = RTOL) -> str | None:
    """None when ‖out − ref‖ ≤ rtol·‖ref_abs‖ (ref_abs: the reference on absolute values, so a
    cancelling sum cannot loosen the bound), else what went wrong."""
    out = np.asarray(out.get() if hasattr(out, "get") else out, np.float64)  # CuPy: to the host
    if out.shape != ref.shape:
        return f"shape {out.shape}, expected {ref.shape}"
    exact = ~np.isfinite(ref)  # -inf of a max pool window of padding only: equal, not close
    if not np.array_equal(out[exact], ref[exact], equal_nan=True):
        return f"non-finite {out[exact]}, expected {ref[exact]}"
    error, scale = np.linalg.norm(out[~exact] - ref[~exact]), np.linalg.norm(ref_abs[~exact])
    if error <= rtol * scale:
        return None
    return f"‖out − ref‖ = {error:.3g} > {rtol:g} · {scale:.3g}"


def check_against_reference(geom: Geometry, inputs, grad, output, grads, oracle=None, rtol: float = RTOL) -> None:
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
                if (err := close_error(got, ref, ref_abs, rtol)) is not None]
    assert not failures, f"{geom}: " + "; ".join(failures)


# The public API.

def extended_keywords(geom: Geometry) -> dict[str, Any]:
    """The §8 keywords of the N-D op that give `geom`, those left at their defaults left out (so a
    seed geometry gives none)."""
    keywords: dict[str, Any] = {}
    if geom.batch is not None:
        keywords["batch"] = geom.batch
    if any(d != 1 for d in geom.dilation):
        keywords["dilation"] = geom.dilation
    if geom.groups != 1:
        keywords["groups"] = geom.groups
    if geom.circular:
        keywords["padding_mode"] = "circular"
    if any(geom.output_padding):
        keywords["output_padding"] = geom.output_padding
    return keywords


def apply_op(tape, geom: Geometry, ids: tuple[int, ...]):
    """Calls the N-D op of `geom.family` on `tape` with the ids of its inputs; returns the Result."""
    spatial = dict(in_spatial=geom.in_spatial, kernel=geom.kernel, stride=geom.stride, padding=geom.padding,
                   **extended_keywords(geom))
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


def run_numpy_backend(geom: Geometry, inputs, grad, dtype: str = "float32") -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The NumPy backend's output and gradients, each checked to be of `dtype` and shaped as the
    geometry says."""
    backend = NumpyBackend(dtype)
    out, saved = backend.forward(geom, inputs)
    assert out.dtype == dtype and out.shape == geom.output_shape
    grads = backend.backward(geom, inputs, saved, grad)
    for got, shape in zip(grads, geom.parent_shapes, strict=True):
        assert got.dtype == dtype and got.shape == shape
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
