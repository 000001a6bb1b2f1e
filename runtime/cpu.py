"""The CPU backend: NumPy forward and backward of the five op families (SEMANTICS §3-§4, with §8's
batch, dilation, groups, circular padding and output padding) at every rank, turning inputs shaped
per `Geometry.parent_shapes` into outputs and gradients of the tape's dtype (float32 or float64),
and `Tape`, the CPU tape that runs on it.

Precision: every sum (conv, avg pool, smooth max, every backward, max pool's included) accumulates
in float64 and rounds to the tape's dtype once at the end, so the CPU tape is at least as exact as
a float32 kernel and serves as the oracle of the CUDA tape; max pool's forward selects values as is.

Special values: only in-bounds terms are formed, each an IEEE product (`0 · inf` is NaN, zero
padding is skipped, never multiplied). Products go through `np.einsum`, whose own loops multiply
every pair; BLAS (`tensordot`, `matmul`) may skip a zero factor and turn `0 · inf` into 0.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from convgen.backend import host_numbers
from convgen.geometry import Family, Geometry

# DLPack device types (dlpack.h): host memory, and the accelerators `device_of` names.
_DLPACK_HOST = (1, 3)  # kDLCPU, kDLCUDAHost
_DLPACK_DEVICES = {2: "cuda", 10: "rocm"}


@dataclass(frozen=True, slots=True)
class _Axis:
    """One spatial axis of a frame: the big and small extents, kernel size, stride, padding,
    dilation, and whether padding wraps around (circular) instead of reading zeros."""

    big: int
    small: int
    k: int
    s: int
    p: int
    d: int
    circular: bool


@dataclass(frozen=True, slots=True)
class _Reach:
    """A run of small-side cells that read real big-side cells through kernel offset κ along one
    axis (`pos = o·s + κ·δ − p`, shifted by ±big when a circular read wraps), and those big cells."""

    offset: int
    small: slice
    big: slice


def _reaching_offsets(axis: _Axis) -> np.ndarray:
    """The offsets κ < k for which some small cell o reads a big cell 0 <= o·s + κ·δ − p < n, in
    increasing order, found without visiting the others: κ·δ must lie in [p − o·s, p − o·s + n − 1]
    for some o. Work is proportional to the result (or to the output when strides leave gaps)."""
    n, m, k, s, p, d = axis.big, axis.small, axis.k, axis.s, axis.p, axis.d
    if n == 0 or m == 0:
        return np.empty(0, np.int64)
    if s <= n:  # consecutive o's intervals touch: their union is one interval
        lowest = max(0, p - (m - 1) * s)
        return np.arange(-(-lowest // d), min(k - 1, (p + n - 1) // d) + 1, dtype=np.int64)
    first, last = max(0, -(((k - 1) * d - p) // s)), min(m - 1, (p + n - 1) // s)  # o meeting [0, (k−1)·δ]
    starts = p - np.arange(last, first - 1, -1, dtype=np.int64) * s  # increasing, disjoint intervals
    spans = (starts[:, None] + np.arange(n, dtype=np.int64)).ravel()
    return spans[(spans >= 0) & (spans <= (k - 1) * d) & (spans % d == 0)] // d


@functools.lru_cache(maxsize=1024)
def _axis_reaches(axis: _Axis) -> tuple[_Reach, ...]:
    """The runs of one axis, by increasing offset. Zero padding: one run per reaching offset (see
    `_reaching_offsets`). Circular padding: every offset reaches, in up to three runs (reads left
    of the input, inside it, right of it); p <= n, so a read wraps at most once."""
    n, m, s, p, d = axis.big, axis.small, axis.s, axis.p, axis.d
    if n == 0 or m == 0:
        return ()
    offsets = np.arange(axis.k, dtype=np.int64) if axis.circular else _reaching_offsets(axis)
    first = np.maximum(0, -((offsets * d - p) // s))  # the first o with o·s + κ·δ − p >= 0
    last = np.minimum(m - 1, (p + n - 1 - offsets * d) // s)  # the last o with o·s + κ·δ − p < n
    reaches = []
    for kappa, lo, hi in zip(offsets.tolist(), first.tolist(), last.tolist()):
        runs = [(lo, hi, 0)]  # (first o, last o, shift of the read)
        if axis.circular:
            runs = [(0, min(lo, m) - 1, n), *runs, (max(hi + 1, 0), m - 1, -n)]
        for first_o, last_o, shift in runs:
            if first_o <= last_o:
                start, stop = (o * s + kappa * d - p + shift for o in (first_o, last_o))
                reaches.append(_Reach(kappa, slice(first_o, last_o + 1), slice(start, stop + 1, s)))
    return tuple(reaches)


@dataclass(frozen=True, slots=True)
class _View:
    """One visited kernel offset, one run per axis: the offset's row-major index j, κ, and the
    [..., *S] index expressions of the small-side and big-side cells it joins (the leading batch and
    channel axes taken whole)."""

    index: int
    offset: tuple[int, ...]
    small: tuple[Any, ...]
    big: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _Frame:
    """An op seen as a convolution: each cell of the `small` side reads one window of the `big`
    side. Conv and pools read windows of the input; a transposed convolution is the adjoint, so
    its output is the big side and its input the small one.

    Every op below loops over the kernel offsets that reach a real cell, in row-major order; for
    one offset, the cells it joins are one strided slice on each side (up to 3 per axis with
    circular padding). Zero padding is never built, so work and memory are those of the operands
    and of the in-bounds terms, whatever K and p are.

    Arrays are [*L, C, *S] with L the batch axis when there is one; conv operands are seen grouped,
    [*L, g, C/g, *S], and their kernel [g, A/g, B/g, *K] with A the small side's channels and B the
    big side's."""

    kernel: tuple[int, ...]
    big: tuple[int, ...]
    small: tuple[int, ...]
    axes: tuple[_Axis, ...]
    views: tuple[_View, ...]
    lead: int  # leading axes before the channels: 1 with a batch axis, else 0
    groups: int

    @classmethod
    def of(cls, geom: Geometry) -> _Frame:
        return _frame(geom)

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def in_bounds(self) -> np.ndarray:
        """[*small]: how many of the K cells of each window are real (not padding)."""
        return functools.reduce(np.multiply.outer, (_in_bounds(axis) for axis in self.axes), np.ones((), np.int64))

    def grouped(self, array: np.ndarray) -> np.ndarray:
        """[*L, C, *S] seen as [*L, g, C/g, *S]."""
        lead, channels = array.shape[:self.lead], array.shape[self.lead]
        return array.reshape(*lead, self.groups, channels // self.groups, *array.shape[self.lead + 1:])

    def grouped_kernel(self, weight: np.ndarray) -> np.ndarray:
        """A kernel [A, B/g, *K] seen as [g, A/g, B/g, *K]."""
        return weight.reshape(self.groups, weight.shape[0] // self.groups, *weight.shape[1:])

    def ungrouped(self, array: np.ndarray) -> np.ndarray:
        """[*L, g, C/g, *S] seen as [*L, C, *S]."""
        lead, (groups, per_group) = array.shape[:self.lead], array.shape[self.lead:self.lead + 2]
        return array.reshape(*lead, groups * per_group, *array.shape[self.lead + 2:])

    def labels(self, side: str) -> list[int]:
        """einsum's sublist labels: 0 = batch, 1 = group, 2 = a, 3 = b, then the spatial axes."""
        channel = 2 if side == "small" else 3
        return [*range(self.lead), 1, channel, *range(4, 4 + self.rank)]


_WEIGHT_LABELS = [1, 2, 3]  # a kernel tap [g, A/g, B/g]


@functools.lru_cache(maxsize=32)
def _frame(geom: Geometry) -> _Frame:
    big, small = geom.in_spatial, geom.out_spatial
    if geom.family is Family.CONV_TRANSPOSE:
        big, small = small, big
    axes = tuple(_Axis(*axis, geom.circular)
                 for axis in zip(big, small, geom.kernel, geom.stride, geom.padding, geom.dilation))
    steps = [math.prod(geom.kernel[a + 1:]) for a in range(len(axes))]  # row-major strides of κ
    views = tuple(
        _View(sum(r.offset * step for r, step in zip(reaches, steps)), tuple(r.offset for r in reaches),
              (..., *(r.small for r in reaches)), (..., *(r.big for r in reaches)))
        for reaches in itertools.product(*(_axis_reaches(axis) for axis in axes)))
    return _Frame(geom.kernel, big, small, axes, views, int(geom.batch is not None), geom.groups)


def _in_bounds(axis: _Axis) -> np.ndarray:
    """[m]: how many of the k cells of each window (every δ-th from o·s − p) lie in [0, n)."""
    start = np.arange(axis.small, dtype=np.int64) * axis.s - axis.p
    first = np.maximum(0, -(start // axis.d))
    last = np.minimum(axis.k - 1, (axis.big - 1 - start) // axis.d)
    return np.maximum(last - first + 1, 0)


def _tap(weight: np.ndarray, offset: tuple[int, ...]) -> np.ndarray:
    """The [g, A/g, B/g] matrices of a [g, A/g, B/g, *K] kernel at offset κ."""
    return weight[(slice(None), slice(None), slice(None), *offset)]


def _correlate(frame: _Frame, weight: np.ndarray, big: np.ndarray) -> np.ndarray:
    """out[a, o] = Σ_{b, κ} weight[a, b, κ] · big[b, pos(o, κ)] within each group:
    [g, A/g, B/g, *K] × [*L, g, B/g, *big] → [*L, g, A/g, *small]."""
    out = np.zeros((*big.shape[:frame.lead + 1], weight.shape[1], *frame.small))
    small_labels, big_labels = frame.labels("small"), frame.labels("big")
    for view in frame.views:
        out[view.small] += np.einsum(_tap(weight, view.offset), _WEIGHT_LABELS, big[view.big], big_labels,
                                     small_labels)
    return out


def _spread(frame: _Frame, weight: np.ndarray, small: np.ndarray) -> np.ndarray:
    """The adjoint of `_correlate`: [g, A/g, B/g, *K] × [*L, g, A/g, *small] → [*L, g, B/g, *big]."""
    out = np.zeros((*small.shape[:frame.lead + 1], weight.shape[2], *frame.big))
    small_labels, big_labels = frame.labels("small"), frame.labels("big")
    for view in frame.views:  # one view reads distinct cells: in place, no np.add.at
        out[view.big] += np.einsum(_tap(weight, view.offset), _WEIGHT_LABELS, small[view.small], small_labels,
                                   big_labels)
    return out


def _weight_grad(frame: _Frame, small: np.ndarray, big: np.ndarray) -> np.ndarray:
    """dW[a, b, κ] = Σ_{images, o} small[a, o] · big[b, pos(o, κ)] within each group:
    [*L, g, A/g, *small] × [*L, g, B/g, *big] → [g, A/g, B/g, *K]."""
    d_weight = np.zeros((frame.groups, small.shape[frame.lead + 1], big.shape[frame.lead + 1], *frame.kernel))
    small_labels, big_labels = frame.labels("small"), frame.labels("big")
    for view in frame.views:  # circular padding visits an offset once per run: add, not assign
        _tap(d_weight, view.offset)[...] += np.einsum(small[view.small], small_labels, big[view.big], big_labels,
                                                      _WEIGHT_LABELS)
    return d_weight


def _scatter(frame: _Frame, shape: tuple[int, ...], share) -> np.ndarray:
    """Adds `share(view)` [*L, C, *cells of view.small] of every offset into the big-side cells it
    reads: a pool's input gradient [*L, C, *big] (`shape` gives *L, C)."""
    out = np.zeros((*shape, *frame.big))
    for view in frame.views:
        out[view.big] += share(view)
    return out


def _max_pool_forward(frame: _Frame, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first in-bounds cell of each window, replaced only by a later strictly greater one, so
    a NaN first cell stays; returns the values and the chosen offsets' row-major indices. A dilated
    window can hold no real cell: -inf, and index -1, which no offset has (no gradient)."""
    best = np.full((*x.shape[:-frame.rank], *frame.small), -np.inf, x.dtype)
    chosen = np.full(best.shape, -1, np.intp)
    for view in frame.views:
        values, region_best, region_chosen = x[view.big], best[view.small], chosen[view.small]
        take = (region_chosen < 0) | (values > region_best)
        np.copyto(region_best, values, where=take)
        np.copyto(region_chosen, view.index, where=take)
    return best, chosen


def _smooth_max_forward(frame: _Frame, x: np.ndarray, beta: float) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The log-sum-exp of each window, padded zeros included, and what backward needs: the pivot
    and Z. The pivot is the extremum on β's side, so every exponent is ≤ 0 and β·v is never formed.
    The padded cells of a window all hold 0: they enter as a count, not one by one."""
    padded = math.prod(frame.kernel) - frame.in_bounds()
    extremum = np.maximum if beta > 0 else np.minimum
    pivot = np.broadcast_to(np.where(padded > 0, 0.0, -math.inf if beta > 0 else math.inf),
                            (*x.shape[:-frame.rank], *frame.small)).copy()
    for view in frame.views:
        region = pivot[view.small]
        extremum(region, x[view.big], out=region)
    total = np.where(padded > 0, padded * np.exp(-beta * pivot), 0.0)
    for view in frame.views:
        total[view.small] += np.exp(beta * (x[view.big] - pivot[view.small]))
    return pivot + np.log(total) / beta, (pivot, total)


def _one_image(geom: Geometry) -> Geometry:
    """A batch of one as the same op without a batch axis."""
    return dataclasses.replace(geom, batch=None)


class NumpyBackend:
    """Runs every op with NumPy on the host; deterministic, and exact up to one rounding to `dtype`."""

    name = "cpu"
    buffer_label = "CPU"
    device = "cpu"

    def __init__(self, dtype: str = "float32", precision: str = "highest") -> None:
        self.dtype = dtype
        # Every precision is computed as "highest" here (exact up to one rounding): at least as accurate
        # as any asks, so the CPU tape is the reference of each.
        self.precision = precision
        self._numpy_dtype = np.dtype(dtype)

    def store(self, value: Any) -> np.ndarray:
        """A C-contiguous copy of `dtype`; DLPack producers are read through `np.from_dlpack`
        where they allow it (a host tensor), anything else through `np.array`."""
        if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
            try:
                value = np.from_dlpack(value)
            except (BufferError, RuntimeError, TypeError, ValueError):
                pass  # e.g. device memory: np.array below copies or raises itself
        return host_numbers(value, self.dtype, copy=True)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, self.dtype)

    def is_native(self, array: Any) -> bool:
        return isinstance(array, np.ndarray) and array.dtype == self._numpy_dtype

    def device_of(self, array: Any) -> str:
        if isinstance(array, np.ndarray):
            return "cpu"
        kind, index = (int(v) for v in array.__dlpack_device__())
        return "cpu" if kind in _DLPACK_HOST else f"{_DLPACK_DEVICES.get(kind, f'dlpack device {kind}')}:{index}"

    def forward(self, geom: Geometry, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, Any]:
        """Returns the output and the state backward needs: max pool's chosen offsets, smooth
        max's pivot and Z. Overflow, inf − inf and 0 · inf give their IEEE values silently."""
        if geom.batch == 1:  # the unbatched op's arithmetic exactly: batch=1 is bit-identical to no batch
            output, saved = self.forward(_one_image(geom), (*inputs[:-1], inputs[-1][0]))
            return output[None], saved
        with np.errstate(all="ignore"):
            output, saved = self._forward(_Frame.of(geom), geom, inputs)
            return self._rounded(output), saved

    def backward(self, geom: Geometry, inputs: tuple[np.ndarray, ...], saved: Any, grad: np.ndarray,
                 wanted: tuple[bool, ...] | None = None) -> tuple[np.ndarray | None, ...]:
        wanted = (True,) * len(inputs) if wanted is None else tuple(wanted)
        if geom.batch == 1:
            *shared, d_x = self.backward(_one_image(geom), (*inputs[:-1], inputs[-1][0]), saved, grad[0], wanted)
            return (*shared, None if d_x is None else d_x[None])
        with np.errstate(all="ignore"):
            grads = self._backward(_Frame.of(geom), geom, inputs, saved, np.asarray(grad, np.float64), wanted)
            return tuple(None if g is None else self._rounded(g) for g in grads)

    def _rounded(self, array: np.ndarray) -> np.ndarray:
        """One rounding to `dtype`; beyond float32's range is ±inf, as a float32 kernel gives."""
        return np.ascontiguousarray(array, self.dtype)

    @staticmethod
    def _forward(frame: _Frame, geom: Geometry, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, Any]:
        family = geom.family
        if family.is_conv:
            weight, bias, x = (np.asarray(a, np.float64) for a in inputs)
            weight, x = frame.grouped_kernel(weight), frame.grouped(x)
            body = _correlate(frame, weight, x) if family is Family.CONV else _spread(frame, weight, x)
            body = frame.ungrouped(body) + bias.reshape(-1, *(1,) * frame.rank)
            return body, None
        if family is Family.MAX_POOL:
            return _max_pool_forward(frame, inputs[0])
        x = np.asarray(inputs[0], np.float64)
        if family is Family.AVG_POOL:  # count-include-pad: padded zeros add nothing but count in K
            total = np.zeros((*x.shape[:-frame.rank], *frame.small))
            for view in frame.views:
                total[view.small] += x[view.big]
            return total / math.prod(geom.kernel), None
        return _smooth_max_forward(frame, x, geom.beta)

    @staticmethod
    def _backward(frame: _Frame, geom: Geometry, inputs: tuple[np.ndarray, ...], saved: Any,
                  g: np.ndarray, wanted: tuple[bool, ...]) -> tuple[np.ndarray | None, ...]:
        family = geom.family
        if family.is_conv:
            wants_weight, wants_bias, wants_x = wanted
            weight, _, x = (np.asarray(a, np.float64) for a in inputs)
            channel_axis = frame.lead
            d_bias = g.sum(axis=tuple(a for a in range(g.ndim) if a != channel_axis)) if wants_bias else None
            x, g = frame.grouped(x), frame.grouped(g)
            # conv: x is the big side, the output the small one; conv_transpose: the output is the big side,
            # and its dX is a convolution of g.
            big, small = (x, g) if family is Family.CONV else (g, x)
            d_weight = _weight_grad(frame, small, big).reshape(weight.shape) if wants_weight else None
            d_x = None
            if wants_x:
                grouped_weight = frame.grouped_kernel(weight)
                d_x = frame.ungrouped(_spread(frame, grouped_weight, g) if family is Family.CONV
                                      else _correlate(frame, grouped_weight, g))
            return d_weight, d_bias, d_x
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
        return (_scatter(frame, g.shape[:-frame.rank], share),)


from convgen.tape import Tape as _BaseTape  # noqa: E402  (last: the backend above needs no tape)


class Tape(_BaseTape):
    """The CPU tape: NumPy arrays of the tape's dtype, computed on the host."""

    backend_class = NumpyBackend

    def value(self, node_id: int) -> np.ndarray:
        """The node's array as a read-only view: the record is shared by every tape made from this
        one, and recorded outputs would not follow a change."""
        view = super().value(node_id).view()
        view.flags.writeable = False
        return view
