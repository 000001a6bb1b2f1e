"""The shifted 16-bit weight gradient's test cases (WG_SHIFT), shared by its emulated and its CUDA tests: the
geometries, and dW checked element by element against the float64 CPU tape on the same values."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import reference
from convgen.cpu import Tape as CpuTape
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import choose_wgmma
from half_support import run_backend, widened

# The weight gradient shifted where its rule allows: the default, named so that the tests stay on it if that moves.
weight_shift_chooser = functools.partial(choose_wgmma, weight_shift=True)

# Lines of 16 (slices of 32) over 24 U channels (a row block of 64: two window offsets of the first axis, 32 rows
# each); 72 D channels (an N of 128, whose second warpgroup's half is mostly past them); the transpose with stride 2
# on its first axis and dilation 2 on the last (4 cells past a slice), output padding; rank 1 at k5 over lines of 64
# (slices of 64, five accumulator sets); a 3-D conv with stride 2 on its first axis; groups of 64 channels.
WEIGHT_SHIFT_GEOMETRIES = [
    Geometry.build(Family.CONV, 24, 64, (6, 16), (3, 3), (1, 1), (1, 1), batch=2),
    Geometry.build(Family.CONV, 40, 72, (4, 24), (3, 3), (1, 1), (0, 1), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 64, 48, (3, 8), (3, 3), (2, 1), (1, 2), dilation=(1, 2),
                   output_padding=(1, 0), batch=2),
    Geometry.build(Family.CONV, 16, 64, (64,), (5,), (1,), (2,), batch=3),
    Geometry.build(Family.CONV, 32, 64, (5, 3, 8), (3, 3, 3), (2, 1, 1), (1, 1, 1), batch=2),
    Geometry.build(Family.CONV, 128, 128, (3, 8), (3, 3), (1, 1), (1, 1), groups=2, batch=2),
]
WEIGHT_SHIFT_IDS = ["lines of 16", "N 128", "transpose", "rank 1 k5", "3-D", "groups"]


def weight_gradient_excess(backend: Any, geom: Geometry, dtype: str, inputs, grad) -> tuple[list[Any], np.ndarray]:
    """`backend`'s results, and by how much each element of its dW passes a 16-bit rounding of the float64 CPU
    tape's (2^-8 of it) plus float32's sums (2^-12 of the sum of the terms' magnitudes: a term read at a wrong cell
    is about 1/200 of it in these cases): no element may be positive."""
    got = run_backend(backend, geom, inputs, grad)
    wide, wide_grad = [widened(a, dtype) for a in inputs], widened(grad, dtype)
    ref = np.asarray(reference.run_on_tape(CpuTape(dtype="float64"), geom, wide, wide_grad)[1][0])
    ref_abs = np.asarray(reference.run_on_tape(CpuTape(dtype="float64"), geom, [np.abs(a) for a in wide],
                                               np.abs(wide_grad))[1][0])
    return got, np.abs(widened(got[1], dtype) - ref) - (2.0**-8 * np.abs(ref) + 2.0**-12 * ref_abs)
