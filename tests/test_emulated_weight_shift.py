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
from convgen.cpu import Tape as CpuTape
from convgen.cuda_launch import plan
from half_support import draw_half, run_backend
from precision_bounds import HALF_BOUND
from test_emulated_kernels import assert_same_non_finite
from test_emulated_wgmma import channels_last_backend
from weight_shift_support import (
    WEIGHT_SHIFT_GEOMETRIES,
    WEIGHT_SHIFT_IDS,
    weight_gradient_excess,
    weight_shift_chooser,
)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++")


@pytest.mark.parametrize("geom", WEIGHT_SHIFT_GEOMETRIES, ids=WEIGHT_SHIFT_IDS)
def test_the_shifted_16_bit_weight_gradient_matches_the_float64_tape_element_by_element(geom) -> None:
    """Each element of dW within a 16-bit rounding of the float64 tape's and float32's sums (no block on the rare
    path: it would trap), every result within issue 11's bound, and a second run the same bits."""
    made = plan(geom, dtype="bfloat16", precision="medium", wgmma_chooser=weight_shift_chooser)
    assert made.defines["BWW_WG_SHIFT"] == 1 and "backward_weight" in made.copied_packs
    inputs, grad = draw_half(reference.case_rng("emulated shifted weight", geom), geom, "bfloat16")
    backend = channels_last_backend("bfloat16", trap_rare_path=True, chooser=weight_shift_chooser)
    got, excess = weight_gradient_excess(backend, geom, "bfloat16", inputs, grad)
    assert excess.max() <= 0, f"{geom}: dW {np.unravel_index(excess.argmax(), excess.shape)} off by {excess.max():.3g}"
    errors = half_support.relative_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
    again = run_backend(backend, geom, inputs, grad)
    for a, b in zip(got, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def test_shifted_weight_gradient_blocks_with_non_finite_sums_take_the_rare_path() -> None:
    """An inf in x (U) at a line's last cell and in its first, and a -inf in the upstream gradient (D): the blocks
    whose sums end non-finite compute their dW again with FMAs over their slices' cells (padding skipped), and
    exactly the elements the CPU tape makes non-finite are, with the same signs."""
    geom = WEIGHT_SHIFT_GEOMETRIES[0]
    made = plan(geom, dtype="bfloat16", precision="medium", wgmma_chooser=weight_shift_chooser)
    assert made.defines["BWW_WG_SHIFT"] == 1
    inputs, grad = draw_half(reference.case_rng("emulated shifted weight non-finite"), geom, "bfloat16")
    weight, bias, x = (a.copy() for a in inputs)
    inf = half_support.stored(np.array([np.inf], np.float32), "bfloat16")[0]
    x[0, 3, 2, 15], x[1, 20, 4, 0] = inf, inf
    grad = grad.copy()
    grad[1, 40, 3, 7] = inf ^ np.uint16(0x8000)
    backend = channels_last_backend("bfloat16", chooser=weight_shift_chooser)
    wide = [half_support.widened(a, "bfloat16") for a in (weight, bias, x)]
    ref_output, ref_grads = reference.run_on_tape(CpuTape(dtype="float64"), geom, wide,
                                                  half_support.widened(grad, "bfloat16"))
    got = run_backend(backend, geom, (weight, bias, x), grad)
    assert not np.isfinite(np.asarray(ref_grads[0])).all()
    for result, ref in zip(got, [ref_output, *ref_grads], strict=True):
        assert_same_non_finite(half_support.widened(result, "bfloat16"), np.asarray(ref), 1e-2)
