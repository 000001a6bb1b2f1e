"""The CPU backend: NumPy forward and backward of the five op families (SEMANTICS §3-§4) at every
rank, turning float32 inputs shaped per `Geometry.parent_shapes` into float32 outputs and gradients,
and `Tape`, the CPU tape that runs on it.

Precision: every sum (conv, avg pool, smooth max, every backward, max pool's included) accumulates
in float64 and rounds to float32 once at the end, so the CPU tape is at least as exact as a float32
kernel and serves as the oracle of the CUDA tape; max pool's forward selects float32 values as is.

Special values: only in-bounds terms are formed, each an IEEE product (`0 · inf` is NaN, padding
is skipped, never multiplied). Products go through `np.einsum`, whose own loops multiply every
pair; BLAS (`tensordot`, `matmul`) may skip a zero factor and turn `0 · inf` into 0.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from convgen.geometry import Family, Geometry

# DLPack device types (dlpack.h): host memory, and the accelerators `device_of` names.
_DLPACK_HOST = (1, 3)  # kDLCPU, kDLCUDAHost
_DLPACK_DEVICES = {2: "cuda", 10: "rocm"}


@dataclass(frozen=True, slots=True)
class _Reach:
    """A kernel offset κ along one axis that reaches a real cell: the small-side cells whose
    windows read a real cell through it, and the big-side cells they read (`pos = o·s + κ − p`)."""

    offset: int
    small: slice
    big: slice


def _reaching_offsets(n: int, m: int, k: int, s: int, p: int) -> np.ndarray:
    """The offsets κ < k for which some small cell o < m reads a big cell 0 <= o·s + κ − p < n, in
    increasing order, found without visiting the others: offset κ reaches the big cells of o in
    [p − o·s, p − o·s + n − 1]. Work is proportional to the result."""
    if n == 0 or m == 0:
        return np.empty(0, np.int64)
    if s < n:  # consecutive o's intervals touch: their union is one interval
        return np.arange(max(0, p - (m - 1) * s), min(k - 1, p + n - 1) + 1, dtype=np.int64)
    first, last = max(0, -((k - 1 - p) // s)), min(m - 1, (p + n - 1) // s)  # o whose interval meets [0, k)
    starts = p - np.arange(last, first - 1, -1, dtype=np.int64) * s  # increasing, disjoint intervals
    offsets = (starts[:, None] + np.arange(n, dtype=np.int64)).ravel()
    return offsets[(offsets >= 0) & (offsets < k)]


@functools.lru_cache(maxsize=1024)
def _axis_reaches(n: int, m: int, k: int, s: int, p: int) -> tuple[_Reach, ...]:
    """Every reaching offset of one axis with the cells it joins (see `_reaching_offsets`)."""
    offsets = _reaching_offsets(n, m, k, s, p)
    first = np.maximum(0, -((offsets - p) // s))  # the first o with o·s + κ − p >= 0
    last = np.minimum(m - 1, (p + n - 1 - offsets) // s)  # the last o with o·s + κ − p < n
    return tuple(_Reach(kappa, slice(lo, hi + 1), slice(lo * s + kappa - p, hi * s + kappa - p + 1, s))
                 for kappa, lo, hi in zip(offsets.tolist(), first.tolist(), last.tolist()))


@dataclass(frozen=True, slots=True)
class _View:
    """One visited kernel offset: its row-major index j, κ, and the [C, ...] index expressions of
    the small-side and big-side cells it joins."""

    index: int
    offset: tuple[int, ...]
    small: tuple[slice, ...]
    big: tuple[slice, ...]


@dataclass(frozen=True, slots=True)
class _Frame:
    """An op seen as a convolution: each cell of the `small` side reads one window of the `big`
    side. Conv and pools read windows of the input; a transposed convolution is the adjoint, so
    its output is the big side and its input the small one.

    Every op below loops over the kernel offsets that reach a real cell, in row-major order; for
    one offset, the cells it joins are one strided slice on each side. Padding is never built, so
    work and memory are those of the operands and of the in-bounds terms, whatever K and p are."""

    kernel: tuple[int, ...]
    big: tuple[int, ...]
    small: tuple[int, ...]
    axes: tuple[tuple[int, int, int, int, int], ...]  # per axis (big, small, k, s, p)
    views: tuple[_View, ...]

    @classmethod
    def of(cls, geom: Geometry) -> _Frame:
        return _frame(geom)

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def in_bounds(self) -> np.ndarray:
        """[*small]: how many of the K cells of each window are real (not padding)."""
        return functools.reduce(np.multiply.outer, (_in_bounds(*axis) for axis in self.axes), np.ones((), np.int64))


@functools.lru_cache(maxsize=32)
def _frame(geom: Geometry) -> _Frame:
    big, small = geom.in_spatial, geom.out_spatial
    if geom.family is Family.CONV_TRANSPOSE:
        big, small = small, big
    axes = tuple(zip(big, small, geom.kernel, geom.stride, geom.padding))
    steps = [math.prod(geom.kernel[a + 1:]) for a in range(len(axes))]  # row-major strides of κ
    views = tuple(
        _View(sum(r.offset * step for r, step in zip(reaches, steps)), tuple(r.offset for r in reaches),
              (slice(None), *(r.small for r in reaches)), (slice(None), *(r.big for r in reaches)))
        for reaches in itertools.product(*(_axis_reaches(*axis) for axis in axes)))
    return _Frame(geom.kernel, big, small, axes, views)


def _in_bounds(n: int, m: int, k: int, s: int, p: int) -> np.ndarray:
    """[m]: how many of the k cells of each window lie in [0, n)."""
    start = np.arange(m, dtype=np.int64) * s - p
    return np.maximum(np.minimum(start + k, n) - np.maximum(start, 0), 0)


def _tap(weight: np.ndarray, offset: tuple[int, ...]) -> np.ndarray:
    """The [A, B] matrix of a [A, B, *K] kernel at offset κ."""
    return weight[(slice(None), slice(None), *offset)]


def _correlate(frame: _Frame, weight: np.ndarray, big: np.ndarray) -> np.ndarray:
    """out[a, o] = Σ_{b, κ} weight[a, b, κ] · big[b, pos(o, κ)]: [A, B, *K] × [B, *big] → [A, *small]."""
    out = np.zeros((weight.shape[0], *frame.small))
    for view in frame.views:
        out[view.small] += np.einsum("ab,b...->a...", _tap(weight, view.offset), big[view.big])
    return out


def _spread(frame: _Frame, weight: np.ndarray, small: np.ndarray) -> np.ndarray:
    """The adjoint of `_correlate`: [A, B, *K] × [A, *small] → [B, *big]."""
    out = np.zeros((weight.shape[1], *frame.big))
    for view in frame.views:  # one κ reads distinct cells: in place, no np.add.at
        out[view.big] += np.einsum("ab,a...->b...", _tap(weight, view.offset), small[view.small])
    return out


def _weight_grad(frame: _Frame, small: np.ndarray, big: np.ndarray) -> np.ndarray:
    """dW[a, b, κ] = Σ_o small[a, o] · big[b, pos(o, κ)]: [A, *small] × [B, *big] → [A, B, *K]."""
    d_weight = np.zeros((small.shape[0], big.shape[0], *frame.kernel))
    spatial = list(range(2, 2 + frame.rank))  # einsum's sublist form: 0 = a, 1 = b, then the summed axes
    for view in frame.views:
        cells = small[view.small], [0, *spatial], big[view.big], [1, *spatial]
        _tap(d_weight, view.offset)[...] = np.einsum(*cells, [0, 1])
    return d_weight


def _scatter(frame: _Frame, channels: int, share) -> np.ndarray:
    """Adds `share(view)` [C, *cells of view.small] of every offset into the big-side cells it
    reads: a pool's input gradient [C, *big]."""
    out = np.zeros((channels, *frame.big))
    for view in frame.views:
        out[view.big] += share(view)
    return out


def _max_pool_forward(frame: _Frame, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first in-bounds cell of each window, replaced only by a later strictly greater one, so
    a NaN first cell stays; returns the values and the chosen offsets' row-major indices."""
    best = np.zeros((x.shape[0], *frame.small), x.dtype)
    chosen = np.zeros(best.shape, np.intp)
    seen = np.zeros(best.shape, bool)
    for view in frame.views:
        values, region_best, region_seen = x[view.big], best[view.small], seen[view.small]
        take = ~region_seen | (values > region_best)
        np.copyto(region_best, values, where=take)
        np.copyto(chosen[view.small], view.index, where=take)
        region_seen[...] = True
    return best, chosen


def _smooth_max_forward(frame: _Frame, x: np.ndarray, beta: float) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The log-sum-exp of each window, padded zeros included, and what backward needs: the pivot
    and Z. The pivot is the extremum on β's side, so every exponent is ≤ 0 and β·v is never formed.
    The padded cells of a window all hold 0: they enter as a count, not one by one."""
    padded = math.prod(frame.kernel) - frame.in_bounds()
    extremum = np.maximum if beta > 0 else np.minimum
    pivot = np.broadcast_to(np.where(padded > 0, 0.0, -math.inf if beta > 0 else math.inf),
                            (x.shape[0], *frame.small)).copy()
    for view in frame.views:
        region = pivot[view.small]
        extremum(region, x[view.big], out=region)
    total = np.where(padded > 0, padded * np.exp(-beta * pivot), 0.0)
    for view in frame.views:
        total[view.small] += np.exp(beta * (x[view.big] - pivot[view.small]))
    return pivot + np.log(total) / beta, (pivot, total)


def _to_float32(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, np.float32)  # beyond float32's range is ±inf, as a float32 kernel gives


class NumpyBackend:
    """Runs every op with NumPy on the host; deterministic, and exact up to one float32 rounding."""

    name = "cpu"
    buffer_label = "CPU"
    device = "cpu"

    def store(self, value: Any) -> np.ndarray:
        """A float32 C-contiguous copy; DLPack producers are read through `np.from_dlpack`
        where they allow it (a host tensor), anything else through `np.array`."""
        if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
            try:
                value = np.from_dlpack(value)
            except (BufferError, RuntimeError, TypeError, ValueError):
                pass  # e.g. device memory: np.array below copies or raises itself
        return np.array(value, dtype=np.float32, order="C", copy=True)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def device_of(self, array: Any) -> str:
        if isinstance(array, np.ndarray):
            return "cpu"
        kind, index = (int(v) for v in array.__dlpack_device__())
        return "cpu" if kind in _DLPACK_HOST else f"{_DLPACK_DEVICES.get(kind, f'dlpack device {kind}')}:{index}"

    def forward(self, geom: Geometry, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, Any]:
        """Returns the output and the state backward needs: max pool's chosen offsets, smooth
        max's pivot and Z. Overflow, inf − inf and 0 · inf give their IEEE values silently."""
        with np.errstate(all="ignore"):
            return self._forward(_Frame.of(geom), geom, inputs)

    def backward(self, geom: Geometry, inputs: tuple[np.ndarray, ...], saved: Any,
                 grad: np.ndarray) -> tuple[np.ndarray, ...]:
        with np.errstate(all="ignore"):
            return self._backward(_Frame.of(geom), geom, inputs, saved, np.asarray(grad, np.float64))

    @staticmethod
    def _forward(frame: _Frame, geom: Geometry, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, Any]:
        family = geom.family
        if family.is_conv:
            weight, bias, x = (np.asarray(a, np.float64) for a in inputs)
            body = _correlate(frame, weight, x) if family is Family.CONV else _spread(frame, weight, x)
            body += bias.reshape(-1, *(1,) * frame.rank)
            return _to_float32(body), None
        if family is Family.MAX_POOL:
            best, chosen = _max_pool_forward(frame, inputs[0])
            return _to_float32(best), chosen
        x = np.asarray(inputs[0], np.float64)
        if family is Family.AVG_POOL:  # count-include-pad: padded zeros add nothing but count in K
            total = np.zeros((x.shape[0], *frame.small))
            for view in frame.views:
                total[view.small] += x[view.big]
            return _to_float32(total / math.prod(geom.kernel)), None
        y, saved = _smooth_max_forward(frame, x, geom.beta)
        return _to_float32(y), saved

    @staticmethod
    def _backward(frame: _Frame, geom: Geometry, inputs: tuple[np.ndarray, ...], saved: Any,
                  g: np.ndarray) -> tuple[np.ndarray, ...]:
        family = geom.family
        if family.is_conv:
            weight, _, x = (np.asarray(a, np.float64) for a in inputs)
            d_bias = g.sum(axis=tuple(range(1, 1 + frame.rank)))
            if family is Family.CONV:  # x is the big side, the output the small one
                d_x, d_weight = _spread(frame, weight, g), _weight_grad(frame, g, x)
            else:  # the output is the big side: its dX is a convolution of g
                d_x, d_weight = _correlate(frame, weight, g), _weight_grad(frame, x, g)
            return _to_float32(d_weight), _to_float32(d_bias), _to_float32(d_x)
        # What the in-bounds cells of each offset receive.
        if family is Family.MAX_POOL:  # the whole gradient to the chosen cell
            def share(view):
                return np.where(saved[view.small] == view.index, g[view.small], 0.0)
        elif family is Family.AVG_POOL:
            scaled = g / math.prod(geom.kernel)

            def share(view):
                return scaled[view.small]
        else:
            pivot, total = saved
            scaled = g / total
            x = np.asarray(inputs[0], np.float64)

            def share(view):
                return scaled[view.small] * np.exp(geom.beta * (x[view.big] - pivot[view.small]))
        return (_to_float32(_scatter(frame, g.shape[0], share)),)


from convgen.tape import Tape as _BaseTape  # noqa: E402  (last: the backend above needs no tape)


class Tape(_BaseTape):
    """The CPU tape: NumPy arrays, float32, computed on the host."""

    backend_class = NumpyBackend

    def value(self, node_id: int) -> np.ndarray:
        """The node's array as a read-only view: the record is shared by every tape made from this
        one, and recorded outputs would not follow a change."""
        view = super().value(node_id).view()
        view.flags.writeable = False
        return view
