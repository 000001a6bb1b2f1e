"""The shifted 16-bit weight gradient (WG_SHIFT, the default where its rule allows) on the GPU's tensor cores
(`pytest -m cuda`, skipped without CuPy, a GPU or wgmma): tests/test_emulated_weight_shift.py's cases, a line of 56
cells in slices of 64 and every rank 1..8, float16 and bfloat16, each element of dW against the float64 CPU tape, no
block on the rare path, the same bits run after run."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from convgen.cuda_launch import plan
from convgen.geometry import Family, Geometry
from cuda_support import RANKS, FiniteWgmmaBackend, _has_gpu, host
from half_support import HALF_DTYPES, draw_half, run_backend
from weight_shift_support import (
    WEIGHT_SHIFT_GEOMETRIES,
    WEIGHT_SHIFT_IDS,
    weight_gradient_excess,
    weight_shift_chooser,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

import convgen.cuda  # noqa: E402  (after the skip)
import cupy  # noqa: E402


def rank_geometry(rank: int) -> Geometry:
    """64 -> 64 channels, a 3-wide window on every axis, lines of 8 cells along the last axis, 2 images."""
    spatial = (3,) * (rank - 1) + (8,) if rank <= 4 else (2,) * (rank - 1) + (8,)
    return Geometry.build(Family.CONV, 64, 64, spatial, (3,) * rank, (1,) * rank, (1,) * rank, batch=2)


CASES = [*WEIGHT_SHIFT_GEOMETRIES, Geometry.build(Family.CONV, 64, 64, (6, 56), (3, 3), (1, 1), (1, 1), batch=3),
         *(rank_geometry(rank) for rank in RANKS)]
IDS = [*WEIGHT_SHIFT_IDS, "lines of 56", *(f"rank {rank}" for rank in RANKS)]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("geom", CASES, ids=IDS)
def test_the_shifted_16_bit_weight_gradient_on_the_tensor_cores(geom: Geometry, dtype: str) -> None:
    device = cupy.cuda.Device()
    hardware = convgen.cuda.device_hardware(device.attributes, device.compute_capability)
    if not hardware.wgmma:
        pytest.skip(f"compute capability {device.compute_capability}: no wgmma")
    made = plan(geom, hardware, dtype=dtype, precision="medium", wgmma_chooser=weight_shift_chooser)
    assert made.defines["BWW_WG_SHIFT"] == 1
    inputs, grad = draw_half(reference.case_rng("cuda shifted weight", geom, dtype), geom, dtype)
    backend = type("WeightShiftBackend", (FiniteWgmmaBackend,), {"wgmma_chooser": staticmethod(weight_shift_chooser)})(
        dtype, "medium")
    got, excess = weight_gradient_excess(backend, geom, dtype, inputs, grad)
    assert excess.max() <= 0, f"{geom}: dW {np.unravel_index(excess.argmax(), excess.shape)} off by {excess.max():.3g}"
    again = run_backend(backend, geom, inputs, grad)
    for a, b in zip(got, again, strict=True):
        np.testing.assert_array_equal(host(a).view(np.uint16), host(b).view(np.uint16))
