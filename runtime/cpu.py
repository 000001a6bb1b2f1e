"""The CPU backend: NumPy forward and backward of the five op families (SEMANTICS §3-§4) at every
rank, turning float32 inputs shaped per `Geometry.parent_shapes` into float32 outputs and gradients,
and `Tape`, the CPU tape that runs on it.

Precision: every sum (conv, avg pool, smooth max, every backward, max pool's included) accumulates
in float64 and rounds to float32 once at the end, so the CPU tape is at least as exact as a float32
kernel and serves as the oracle of the CUDA tape; max pool's forward selects float32 values as is.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from convgen.geometry import Family, Geometry

# DLPack device types (dlpack.h): host memory, and the accelerators `device_of` names.
_DLPACK_HOST = (1, 3)  # kDLCPU, kDLCUDAHost
_DLPACK_DEVICES = {2: "cuda", 10: "rocm"}


@dataclass(frozen=True, slots=True)
class _Frame:
    """An op seen as a convolution: each cell of the `small` side reads one window of the
    zero-padded `big` side. Conv and pools read windows of the input; a transposed convolution
    is the adjoint, so its output is the big side and its input the small one.

    Every op below loops over the kernel offsets κ only: for one κ, the big-side cells that all
    small-side cells read form one strided slice of the padded array. Memory stays that of the
    operands, whatever K is."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    big: tuple[int, ...]
    small: tuple[int, ...]

    @classmethod
    def of(cls, geom: Geometry) -> _Frame:
        big, small = geom.in_spatial, geom.out_spatial
        if geom.family is Family.CONV_TRANSPOSE:
            big, small = small, big
        return cls(geom.kernel, geom.stride, geom.padding, big, small)

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def offsets(self):
        """The kernel offsets in row-major order, the order windows are walked in."""
        return np.ndindex(*self.kernel)

    def pad(self, big: np.ndarray) -> np.ndarray:
        """`big` [C, *big] with zeros around every spatial axis."""
        return np.pad(big, [(0, 0)] + [(p, p) for p in self.padding])

    def read(self, padded: np.ndarray, offset: tuple[int, ...]) -> np.ndarray:
        """The view [C, *small] of the padded cells that offset κ reads: pos = o·s + κ (− p)."""
        cells = (slice(k, k + m * s, s) for k, m, s in zip(offset, self.small, self.stride))
        return padded[(slice(None), *cells)]

    def reads(self, padded: np.ndarray) -> list[np.ndarray]:
        """`read` at every offset, in row-major order."""
        return [self.read(padded, offset) for offset in self.offsets()]

    def scatter(self, channels: int, share) -> np.ndarray:
        """The adjoint of `read`: adds `share(j, κ)` [C, *small] of every offset (j its row-major
        index) into the cells it reads, giving [C, *big]; what lands in the padding is dropped."""
        padded = np.zeros((channels, *(n + 2 * p for n, p in zip(self.big, self.padding))))
        for j, offset in enumerate(self.offsets()):
            view = self.read(padded, offset)
            view += share(j, offset)  # one κ reads distinct cells: in place, no np.add.at
        return padded[(slice(None), *(slice(p, p + n) for p, n in zip(self.padding, self.big)))]


def _tap(weight: np.ndarray, offset: tuple[int, ...]) -> np.ndarray:
    """The [A, B] matrix of a [A, B, *K] kernel at offset κ."""
    return weight[(slice(None), slice(None), *offset)]


def _correlate(frame: _Frame, weight: np.ndarray, big: np.ndarray) -> np.ndarray:
    """out[a, o] = Σ_{b, κ} weight[a, b, κ] · big[b, pos(o, κ)]: [A, B, *K] × [B, *big] → [A, *small]."""
    padded = frame.pad(big)
    out = np.zeros((weight.shape[0], *frame.small))
    for offset in frame.offsets():
        out += np.tensordot(_tap(weight, offset), frame.read(padded, offset), axes=1)
    return out


def _spread(frame: _Frame, weight: np.ndarray, small: np.ndarray) -> np.ndarray:
    """The adjoint of `_correlate`: [A, B, *K] × [A, *small] → [B, *big]."""
    def share(j, offset):
        return np.tensordot(_tap(weight, offset), small, axes=([0], [0]))
    return frame.scatter(weight.shape[1], share)


def _weight_grad(frame: _Frame, small: np.ndarray, big: np.ndarray) -> np.ndarray:
    """dW[a, b, κ] = Σ_o small[a, o] · big[b, pos(o, κ)]: [A, *small] × [B, *big] → [A, B, *K]."""
    padded = frame.pad(big)
    spatial = range(1, 1 + frame.rank)
    d_weight = np.empty((small.shape[0], big.shape[0], *frame.kernel))
    for offset in frame.offsets():
        _tap(d_weight, offset)[...] = np.tensordot(small, frame.read(padded, offset), axes=(spatial, spatial))
    return d_weight


def _max_pool_forward(frame: _Frame, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first in-bounds cell of each window, replaced only by a later strictly greater one, so
    a NaN first cell stays; returns the values and the chosen offsets' row-major indices."""
    padded = frame.pad(x)
    in_bounds = frame.pad(np.ones((1, *frame.big), bool))  # padding reads False
    best = np.zeros((x.shape[0], *frame.small), x.dtype)
    chosen = np.zeros(best.shape, np.intp)
    seen = np.zeros(best.shape, bool)
    for j, offset in enumerate(frame.offsets()):
        values, valid = frame.read(padded, offset), frame.read(in_bounds, offset)
        take = valid & (~seen | (values > best))
        best = np.where(take, values, best)
        chosen = np.where(take, j, chosen)
        seen |= valid
    return best, chosen


def _smooth_max_forward(frame: _Frame, x: np.ndarray, beta: float) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The log-sum-exp of each window, padded zeros included, and what backward needs: the padded
    input, the pivot and Z. The pivot is the extremum on β's side, so every exponent is ≤ 0 and
    β·v is never formed."""
    padded = frame.pad(x)
    views = frame.reads(padded)
    pivot = functools.reduce(np.maximum if beta > 0 else np.minimum, views)
    total = sum(np.exp(beta * (v - pivot)) for v in views)
    return pivot + np.log(total) / beta, (padded, pivot, total)


def _to_float32(array: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond float32's range is ±inf, as a float32 kernel gives
        return np.ascontiguousarray(array, np.float32)


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
        max's padded input, pivot and Z."""
        frame, family = _Frame.of(geom), geom.family
        if family.is_conv:
            weight, bias, x = (np.asarray(a, np.float64) for a in inputs)
            body = _correlate(frame, weight, x) if family is Family.CONV else _spread(frame, weight, x)
            return _to_float32(body + bias.reshape(-1, *(1,) * frame.rank)), None
        if family is Family.MAX_POOL:
            best, chosen = _max_pool_forward(frame, inputs[0])
            return _to_float32(best), chosen
        x = np.asarray(inputs[0], np.float64)
        if family is Family.AVG_POOL:  # count-include-pad: padded zeros count in the sum and in K
            return _to_float32(sum(frame.reads(frame.pad(x))) / math.prod(geom.kernel)), None
        y, saved = _smooth_max_forward(frame, x, geom.beta)
        return _to_float32(y), saved

    def backward(self, geom: Geometry, inputs: tuple[np.ndarray, ...], saved: Any,
                 grad: np.ndarray) -> tuple[np.ndarray, ...]:
        frame, family = _Frame.of(geom), geom.family
        g = np.asarray(grad, np.float64)
        if family.is_conv:
            weight, _, x = (np.asarray(a, np.float64) for a in inputs)
            d_bias = g.sum(axis=tuple(range(1, 1 + frame.rank)))
            if family is Family.CONV:  # x is the big side, the output the small one
                d_x, d_weight = _spread(frame, weight, g), _weight_grad(frame, g, x)
            else:  # the output is the big side: its dX is a convolution of g
                d_x, d_weight = _correlate(frame, weight, g), _weight_grad(frame, x, g)
            return _to_float32(d_weight), _to_float32(d_bias), _to_float32(d_x)
        # What each offset's cells receive; shares of padded cells land in the padding and are dropped.
        if family is Family.MAX_POOL:  # the whole gradient to the chosen cell
            def share(j, offset):
                return np.where(saved == j, g, 0.0)
        elif family is Family.AVG_POOL:
            def share(j, offset):
                return g / math.prod(geom.kernel)
        else:
            padded, pivot, total = saved
            scaled = g / total

            def share(j, offset):
                return scaled * np.exp(geom.beta * (frame.read(padded, offset) - pivot))
        return (_to_float32(frame.scatter(g.shape[0], share)),)


from convgen.tape import Tape as _BaseTape  # noqa: E402  (last: the backend above needs no tape)


class Tape(_BaseTape):
    """The CPU tape: NumPy arrays, float32, computed on the host."""

    backend_class = NumpyBackend
