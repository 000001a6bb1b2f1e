"""The 16-bit weight gradient shifted (WG_SHIFT: U's cells of a slice staged once for the last axis's window offsets,
D read from its own rows) on the CPU emulator (tests/emulated_cupy.py), against the float64 CPU tape on the same
values: every element of dW within its rounding to 16 bits and float32's sums, no block on the rare path on finite
values, the same bits run after run, and the rare path's non-finite cells where the CPU tape has them. `pytest -m
cuda` runs the same kernels on the tensor cores (tests/test_cuda_half.py)."""

from __future__ import annotations

import shutil

import half_support
import numpy as np
import pytest
import reference
from convgen.cuda_launch import plan
from convgen.wgmma_tiles import choose_wgmma
from half_support import draw_half, run_backend
from precision_bounds import HALF_BOUND
from test_emulated_wgmma import channels_last_backend
from weight_shift_support import WEIGHT_SHIFT_GEOMETRIES, WEIGHT_SHIFT_IDS, weight_gradient_excess

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++")


@pytest.mark.parametrize("geom", WEIGHT_SHIFT_GEOMETRIES, ids=WEIGHT_SHIFT_IDS)
def test_the_shifted_16_bit_weight_gradient_matches_the_float64_tape_element_by_element(geom) -> None:
    """Each element of dW within a 16-bit rounding of the float64 tape's and float32's sums (no block on the rare
    path: it would trap), every result within issue 11's bound, and a second run the same bits."""
    made = plan(geom, dtype="bfloat16", precision="medium")
    assert made.defines["BWW_WG_SHIFT"] == 1 and "backward_weight" in made.copied_packs
    inputs, grad = draw_half(reference.case_rng("emulated shifted weight", geom), geom, "bfloat16")
    backend = channels_last_backend("bfloat16", trap_rare_path=True, chooser=choose_wgmma)
    got, excess = weight_gradient_excess(backend, geom, "bfloat16", inputs, grad)
    assert excess.max() <= 0, f"{geom}: dW {np.unravel_index(excess.argmax(), excess.shape)} off by {excess.max():.3g}"
    errors = half_support.relative_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
    again = run_backend(backend, geom, inputs, grad)
    for a, b in zip(got, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))
