"""float16 and bfloat16 on the CUDA backend, as the 16-bit tests run it (on a GPU and emulated): inputs
drawn as 16-bit values, the backend run on their storage arrays, and each result's relative error against
the float64 CPU tape on the same values (issue 11's bf16/fp16 bound, precision_bounds.HALF_BOUND).

NumPy has float16 but no bfloat16; a bfloat16 array is held as its bit patterns (uint16), as the backend
holds it. The bits are made and read here with plain shifts: a float32 cut to its top 16 bits is a
bfloat16 value, and a bfloat16 widened by a shift is exactly its float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import reference
from convgen.cpu import Tape as CpuTape
from convgen.geometry import Geometry

HALF_DTYPES = ("float16", "bfloat16")


def stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 `values` as a `dtype` storage array: float16 rounded by NumPy, bfloat16 truncated (the
    inputs only need to be 16-bit values; the tests compare against exactly these)."""
    if dtype == "float16":
        return values.astype(np.float16)
    return (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 `values` rounded to nearest even as a `dtype` storage array, as the kernels narrow a result (a NaN
    stays a NaN)."""
    if dtype == "float16":
        return values.astype(np.float16)
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    narrowed = ((bits + 0x7FFF + (bits >> 16 & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), (bits >> 16 | 0x40).astype(np.uint16), narrowed)


def widened(array: Any, dtype: str) -> np.ndarray:
    """A `dtype` storage array (NumPy or CuPy) as the float64 values it holds."""
    array = np.asarray(array.get() if hasattr(array, "get") else array)
    if dtype == "float16":
        assert array.dtype == np.float16, array.dtype
        return array.astype(np.float64)
    assert array.dtype == np.uint16, array.dtype
    return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def draw_half(rng: np.random.Generator, geom: Geometry, dtype: str) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The inputs and upstream gradient of `geom` as `dtype` storage arrays."""
    inputs = tuple(stored(a, dtype) for a in reference.draw_inputs(rng, geom))
    return inputs, stored(reference.draw_grad(rng, geom), dtype)


def run_backend(backend: Any, geom: Geometry, inputs: tuple[np.ndarray, ...], grad: np.ndarray) -> list[Any]:
    """The output and every gradient of one op on `backend` (a CupyBackend of a 16-bit dtype)."""
    arrays = tuple(backend.store(a) for a in inputs)
    output, saved = backend.forward(geom, arrays)
    return [output, *backend.backward(geom, arrays, saved, backend.store(grad))]


def relative_errors(backend: Any, geom: Geometry, inputs: tuple[np.ndarray, ...], grad: np.ndarray) -> list[float]:
    """‖got − ref‖ / scale of the output and each gradient of `backend`'s run, the reference the float64 CPU
    tape on the same 16-bit values, the scale the larger of ‖ref‖ and ‖ref on |inputs|‖ (the latter bounds
    a conv's cancelling sums; a pool's output can exceed it: smooth min on |x| is near 0). Where the
    reference is not finite (a max pool window with no cell gives -inf) the result must be the same value;
    otherwise the error is inf. Results must come back in the backend's dtype."""
    dtype = backend.dtype
    wide, wide_grad = [widened(a, dtype) for a in inputs], widened(grad, dtype)
    ref = reference.run_on_tape(CpuTape(dtype="float64"), geom, wide, wide_grad)
    ref_abs = reference.run_on_tape(CpuTape(dtype="float64"), geom, [np.abs(a) for a in wide], np.abs(wide_grad))
    errors = []
    for got, r, a in zip(run_backend(backend, geom, inputs, grad), [ref[0], *ref[1]], [ref_abs[0], *ref_abs[1]],
                         strict=True):
        got, r, a = widened(got, dtype).reshape(np.shape(r)), np.asarray(r, np.float64), np.asarray(a, np.float64)
        finite = np.isfinite(r)
        if not np.array_equal(got[~finite], r[~finite]):
            errors.append(float("inf"))
            continue
        got, r, a = got[finite], r[finite], a[finite]
        scale = max(np.linalg.norm(r), np.linalg.norm(a))
        errors.append(float(np.linalg.norm(got - r) / scale) if scale else float(np.abs(got).max(initial=0.0)))
    return errors
