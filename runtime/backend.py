"""The contract between the tape and a compute backend (NumPy on the CPU, CuPy on the GPU).

The tape validates, records and walks the graph; a backend only stores arrays and runs the
forward and backward of one op on inputs the tape has already checked and shaped.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from convgen.checking import describe
from convgen.generated.contract import PRECISION_MMA_MODES
from convgen.geometry import Geometry


class BackendError(Exception):
    """A failure inside a backend (a device error, a failed compile); the tape turns it into a
    `Result` error `autograd: {backend}: {op}: {message}`."""


class OutOfMemory(BackendError):
    """The machine cannot hold the buffers an op needs: `out of memory (needs 26.8 GiB)`."""

    def __init__(self, needed_bytes: int) -> None:
        super().__init__(f"out of memory (needs {needed_bytes / 2**30:.1f} GiB)")
        self.needed_bytes = needed_bytes

    @classmethod
    def of(cls, error: MemoryError, fallback_bytes: int) -> OutOfMemory:
        """A plain `MemoryError` as an `OutOfMemory`: NumPy's says how much it asked for
        (`_total_size`); others are taken to need `fallback_bytes`."""
        needed = getattr(error, "_total_size", None)
        return cls(needed if type(needed) is int else fallback_bytes)


# What NumPy makes of values that are not real numbers, and converts to floats all the same: strings parsed ('1.5',
# b'2', 'nan'), None read as NaN, dates counted in days, an imaginary part dropped. A tape refuses them
# (real_numbers), by the array's kind and, in an array of Python objects, by each object's type.
_NOT_REAL = {"U": "strings", "S": "bytes", "c": "complex numbers", "M": "dates", "m": "time spans", "V": "raw bytes"}
_NOT_REAL_OBJECTS = {str: "strings", bytes: "bytes", type(None): "None values"}


def real_numbers(array: Any) -> Any:
    """`array` (a NumPy or CuPy array) when it holds real numbers: booleans, integers, floats, or Python objects other
    than strings and None (the float conversion reads those, or refuses them). Else a TypeError saying what it
    holds."""
    kind = array.dtype.kind
    if kind == "O":
        for value in array.flat:
            if type(value) in _NOT_REAL_OBJECTS:
                raise TypeError(f"{_NOT_REAL_OBJECTS[type(value)]} are not real numbers")
    elif kind in _NOT_REAL:
        raise TypeError(f"{_NOT_REAL[kind]} are not real numbers")
    return array


def host_numbers(value: Any, dtype: Any, copy: bool) -> np.ndarray:
    """`value` on the host as a C-contiguous array of `dtype` when it holds real numbers (real_numbers), a copy of it
    when `copy`. A value past the dtype's range rounds to ±inf, as IEEE's conversion has it, without NumPy's overflow
    warning: the rounding is the documented conversion, and a warning made an error would stand in for leaf's own."""
    with np.errstate(over="ignore"):
        try:
            raw = np.asarray(value)
        except (TypeError, ValueError, OverflowError, MemoryError):
            raise
        except Exception as error:  # a foreign object's own conversion refused (torch: a tensor that requires grad)
            raise TypeError(f"{type(error).__name__}: {error}") from None
        array = real_numbers(raw)
        return np.array(array, dtype=dtype, order="C", copy=True) if copy else np.ascontiguousarray(array, dtype=dtype)


DTYPES = ("float32", "float64")  # what a tape records: float32 is the contract, float64 an option (SEMANTICS §8)
# The 16-bit element types of convgen.torch's tensors: stored in 16 bits, computed in float32.
HALF_DTYPES = ("float16", "bfloat16")
# How the conv families' GEMMs multiply (docs/DESIGN.md, the tensor-core slice): "highest" FMAs in the
# tape's dtype (the default, the contract), "high" 3xTF32 and "medium" TF32 tensor cores (float32 only;
# 16-bit elements take "highest", FMAs in float32, and "medium", whose TF32 holds their values exactly).
PRECISIONS = tuple(PRECISION_MMA_MODES)


def precision_refusal(dtype: str, precision: object) -> str | None:
    """Why a `dtype` tape cannot compute in `precision`, or None when it can."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        known = ", ".join(repr(p) for p in PRECISIONS[:-1]) + f" or {PRECISIONS[-1]!r}"
        return f"precision must be {known}, got {describe(precision)}"
    if PRECISION_MMA_MODES[precision] and dtype == "float64":
        return (f"precision {precision!r} runs on TF32 tensor cores, which take float32 only; "
                f"a {dtype} tape takes 'highest'")
    if precision == "high" and dtype in HALF_DTYPES:
        return (f"precision 'high' splits float32 operands into two TF32 parts; {dtype} values are exact "
                f"in TF32, so {dtype} takes 'medium' (tensor cores) or 'highest'")
    return None


class Backend(Protocol):
    """A tape makes one backend per tape class, dtype and precision: `backend_class(dtype, precision)`,
    `dtype` one of DTYPES and `precision` one of PRECISIONS that the dtype takes (the tape has checked
    both). Every array the backend stores, makes or returns has that dtype; its conv GEMMs are at least
    as accurate as `precision` asks."""

    name: str  # "cpu" | "cuda": messages start `autograd: {name}: {op}: `
    buffer_label: str  # "CPU" | "CUDA": `autograd: {buffer_label} buffer size mismatch (...)`
    dtype: str  # "float32" | "float64", as given to the constructor
    precision: str  # one of PRECISIONS, as given to the constructor

    def store(self, value: Any) -> Any:
        """A leaf's (or a seed's) value as this backend's array of `dtype` (copied or taken as is,
        per SEMANTICS §6)."""

    def zeros(self, shape: tuple[int, ...]) -> Any:
        """An array of zeros of `dtype`."""

    def device_of(self, array: Any) -> str:
        """Where `array` lives, as messages print it: `cpu`, `cuda:0`."""

    @property
    def device(self) -> str:
        """Where this backend's arrays live."""

    def is_native(self, array: Any) -> bool:
        """Whether `array` is one of this backend's arrays: of `dtype`, on `device` (the tape checks every
        output; a cheap test, the message is made only when it fails)."""

    def forward(self, geom: Geometry, inputs: tuple[Any, ...]) -> tuple[Any, Any]:
        """Run the op. `inputs` are (kernel, bias, input) or (x,), of `dtype`, shaped per
        `geom.parent_shapes` (a leading batch axis on the input when `geom.batch` is not None); the
        output has no elements only if a dimension is zero, which the tape handles itself. Returns
        (output of `dtype` shaped `geom.output_shape`, saved state for backward)."""

    def backward(self, geom: Geometry, inputs: tuple[Any, ...], saved: Any, grad: Any,
                 wanted: tuple[bool, ...] | None = None) -> tuple[Any, ...]:
        """Gradients of the op, one per input, of `dtype` and shaped like it, given `grad` of `dtype`
        shaped like the output. `wanted` (one flag per input, None for all) leaves out the gradients
        nobody reads: each is None and costs nothing (a frozen weight, an image that needs no gradient)."""
