"""The direct kernels on TF32 tensor cores (a conv-shaped stage's DIRECT_MMA, templates/cuda/_direct_mma.cu.j2) run
on the CPU emulator against the float64 CPU tape with the TF32 bound, and their careful path against the CPU tape's
non-finite cells. `pytest -m cuda` runs the same kernels on a GPU (tests/test_cuda_direct.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import reference
from convgen.cpu import Tape as CpuTape
from convgen.cuda import CupyBackend
from convgen.cuda_launch import plan
from convgen.direct_model import choose_direct
from convgen.geometry import Family, Geometry
from emulated_cupy import emulated_cupy
from forced_tiles import mma_direct, mma_weight_direct, modelled_weight_mma, tensor_core_geometry
from half_support import HALF_DTYPES, draw_half, rounded, run_backend, widened
from half_support import relative_errors as half_errors
from precision_bounds import FLOAT32_UNIT, HALF_BOUND, TF32_BOUND
from test_emulated_kernels import assert_same_non_finite, emulated_tape, imports_as, relative_errors

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++")

CONV_STAGES = ("forward", "backward_input")
# Ranks 1-4; source channels that are not whole steps of 8 (10, 12: a part step), dst channels that are not whole
# tiles of 8 (6, 10), two tiles (16) and up to the kernel's four (24, 32); stride phases (the gather form), among
# them phases no window offset reaches (gcd(S, D) = 2: their cells get the bias alone), dilation, groups, a batch; a
# transpose with output padding; boxes that do not divide the cells.
MMA_DIRECT_GEOMETRIES = [
    Geometry.build(Family.CONV, 10, 16, (9, 10), (3, 3), (1, 1), (1, 1), batch=2),
    Geometry.build(Family.CONV, 12, 6, (23,), (5,), (2,), (2,), dilation=(2,), batch=2),
    Geometry.build(Family.CONV, 8, 10, (5, 6, 4), (3, 2, 3), (1, 2, 1), (1, 0, 1), groups=2, batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 16, 8, (6, 7), (3, 3), (2, 1), (1, 0), output_padding=(1, 0), batch=2),
    Geometry.build(Family.CONV, 8, 8, (4, 5, 4, 6), (3, 3, 3, 3), (1, 1, 1, 1), (1, 1, 1, 1), batch=2),
    Geometry.build(Family.CONV, 8, 9, (11, 9), (3, 3), (2, 2), (1, 1), dilation=(2, 2), batch=2),
    Geometry.build(Family.CONV, 16, 32, (6, 7), (3, 3), (1, 1), (1, 1), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 24, 32, (5, 4, 3), (3, 3, 3), (2, 1, 1), (1, 1, 0), output_padding=(1, 0, 0)),
]


@pytest.mark.parametrize("cells, tiles", [(64, 2), (160, 4)], ids=["one-tile-warps", "four-tile-warps"])
@pytest.mark.parametrize("geom", MMA_DIRECT_GEOMETRIES, ids=lambda g: f"{g.family.value}_r{g.rank}_{g.in_c}to{g.out_c}")
def test_direct_kernels_on_tensor_cores_keep_the_tf32_bound(geom: Geometry, cells: int, tiles: int) -> None:
    """Forward and input gradient on the tensor cores within TF32's bound of the float64 reference, and not float32's
    error (the tensor cores ran); the weight gradient stays the FMA direct kernel's."""
    chooser = mma_direct(cells, tiles)
    defines = plan(geom, precision="medium", direct_chooser=chooser).defines
    assert defines["FWD_DIRECT_MMA"] == defines["BWI_DIRECT_MMA"] == 1
    assert_tensor_cores_within_tf32(geom, chooser, ("emulated direct mma", geom, cells))


def assert_tensor_cores_within_tf32(geom: Geometry, chooser, seed: tuple) -> None:
    """Every output within TF32's bound of the float64 reference, the forward's and the input gradient's not within
    float32's (the tensor cores ran)."""
    rng = reference.case_rng(*seed)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    errors = relative_errors(geom, emulated_tape("float32", precision="medium", direct_chooser=chooser), inputs, grad)
    for name, error in zip(("output", "dkernel", "dbias", "dinput"), errors, strict=True):
        assert error <= TF32_BOUND, f"{name}: TF32 relative error {error:.3g}"
        if name in ("output", "dinput"):
            assert error > 4 * FLOAT32_UNIT, f"{name}: error {error:.3g} is float32's: no tensor core ran"


# The first axis's window offsets in slices (a step each): 3 of 3 offsets, in both forms (a transpose's gather form
# with 2 offsets a phase takes 2), phases no offset reaches among them; a 4-D k5 window in 5 slices, as the plans cut
# the windows whose weights a step would not hold at once.
SLICED_GEOMETRIES = [
    (MMA_DIRECT_GEOMETRIES[0], 3),
    (MMA_DIRECT_GEOMETRIES[2], 3),
    (Geometry.build(Family.CONV_TRANSPOSE, 8, 10, (5, 6), (4, 3), (2, 1), (1, 1), batch=2), 2),
    (MMA_DIRECT_GEOMETRIES[5], 3),
    (Geometry.build(Family.CONV, 10, 10, (5, 4, 3, 6), (5, 5, 5, 5), (1, 1, 1, 1), (2, 2, 2, 2)), 5),
]


@pytest.mark.parametrize("geom, slices", SLICED_GEOMETRIES,
                         ids=lambda g: f"{g.family.value}_r{g.rank}_{g.in_c}to{g.out_c}" if isinstance(g, Geometry)
                         else f"slices{g}")
def test_window_slices_keep_the_tf32_bound(geom: Geometry, slices: int) -> None:
    """Forward and input gradient with the first axis's window offsets staged a slice a step: within TF32's bound of
    the float64 reference, the tensor cores having run."""
    chooser = mma_direct(128, 2, slices)
    made = plan(geom, precision="medium", direct_chooser=chooser)
    assert made.defines["FWD_DIRECT_SLICES"] == slices or made.defines["BWI_DIRECT_SLICES"] == slices
    assert_tensor_cores_within_tf32(geom, chooser, ("emulated direct mma slices", geom, slices))


@pytest.mark.parametrize("chooser", [mma_direct(64, 2), mma_direct(64, 2, 3), mma_weight_direct(64, 1, 2)],
                         ids=["whole-window", "window-slices", "weight-gradient"])
def test_non_finite_values_take_the_careful_path(chooser) -> None:
    """An inf and a NaN in the weight, an inf in the input and a value TF32 rounding would overflow: the steps that
    stage them add their products with FMAs, padding skipped, so exactly the cells the CPU tape makes non-finite are,
    with the same signs, and the rest keeps TF32's accuracy; the same with the window in slices (steps whose offsets
    reach no non-finite value stay on the tensor cores) and with the weight gradient on the tensor cores (its items
    that stage one)."""
    geom = MMA_DIRECT_GEOMETRIES[0]
    rng = reference.case_rng("emulated direct mma non-finite")
    weight, bias, x = reference.draw_inputs(rng, geom)
    grad = reference.draw_grad(rng, geom)
    weight[1, 3, 0, 0], weight[4, 9, 2, 1] = np.inf, np.nan
    x[1, 2, 4, 4] = -np.inf
    x[0, 9, 0, 9] = np.float32(3.4e38)
    tape = emulated_tape("float32", precision="medium", direct_chooser=chooser)
    got_output, got_grads = reference.run_on_tape(tape, geom, [weight, bias, x], grad)
    ref_output, ref_grads = reference.run_on_tape(CpuTape(), geom, [weight, bias, x], grad)
    for got, ref in zip([got_output, *got_grads], [ref_output, *ref_grads], strict=True):
        assert_same_non_finite(np.asarray(got), ref, 1e-2)


def test_the_plans_take_the_tensor_cores_in_medium_for_8_to_16_channels() -> None:
    """The plans' own tile (2 tiles a warp, the box of up to 512 cells) for an 8 -> 8 conv: both conv-shaped stages on
    the tensor cores within TF32's bound in "medium"; "high" keeps the FMA direct kernels and "highest"'s bits."""
    geom = Geometry.build(Family.CONV, 8, 8, (10, 10, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=2)
    made = plan(geom, precision="medium")
    assert made.defines["FWD_DIRECT_MMA"] == made.defines["BWI_DIRECT_MMA"] == 1
    assert made.defines["FWD_DIRECT_V"] == 2 and made.launches["forward"].block == 32 * 7  # 2x10x10 cells, 13 tiles
    rng = reference.case_rng("emulated planned direct mma")
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    errors = relative_errors(geom, emulated_tape("float32", precision="medium", direct_chooser=choose_direct),
                             inputs, grad)
    assert max(errors) <= TF32_BOUND and min(errors[0], errors[3]) > 4 * FLOAT32_UNIT, errors
    high = reference.run_on_tape(emulated_tape("float32", precision="high", direct_chooser=choose_direct), geom,
                                 inputs, grad)
    highest = reference.run_on_tape(emulated_tape("float32", direct_chooser=choose_direct), geom, inputs, grad)
    for a, b in zip([high[0], *high[1]], [highest[0], *highest[1]], strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_plans_fitted_box_keeps_the_tf32_bound() -> None:
    """A 16 -> 16 conv on 7x7x9 cells: the plans' box is 4x7x9 (252 cells: 16 tiles, the last with four empty rows;
    the second box along the first axis has three of its four rows; mma_box's 4x8x9 would hold 288 cells). Both
    conv-shaped stages within TF32's bound."""
    geom = Geometry.build(Family.CONV, 16, 16, (7, 7, 9), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=2)
    made = plan(geom, precision="medium")
    for prefix, stage in (("FWD", "forward"), ("BWI", "backward_input")):
        assert made.defines[f"{prefix}_DIRECT_MMA"] == 1
        assert [made.defines[f"{prefix}_DIRECT_BOX{a}"] for a in range(3)] == [4, 7, 9]
        assert made.launches[stage].block == 256
    rng = reference.case_rng("emulated fitted direct mma")
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    errors = relative_errors(geom, emulated_tape("float32", precision="medium", direct_chooser=choose_direct),
                             inputs, grad)
    assert max(errors) <= TF32_BOUND and min(errors[0], errors[3]) > 4 * FLOAT32_UNIT, errors


@pytest.mark.parametrize("cells, rows_a_warp, parts, channel_blocks", [(64, 1, 1, 1), (40, 2, 3, 2)],
                         ids=["one-row-warps", "two-row-warps-parts-channel-blocks"])
@pytest.mark.parametrize("geom", [*MMA_DIRECT_GEOMETRIES,
                                  Geometry.build(Family.CONV, 12, 24, (7, 9), (3, 3), (1, 1), (1, 1), batch=2)],
                         ids=lambda g: f"{g.family.value}_r{g.rank}_{g.in_c}to{g.out_c}")
def test_the_weight_gradient_on_tensor_cores_keeps_the_tf32_bound(geom: Geometry, cells: int, rows_a_warp: int,
                                                                  parts: int, channel_blocks: int) -> None:
    """The direct weight gradient on the tensor cores (_direct_weight_mma.cu.j2): boxes that do not divide D's cells
    and whose cells are not whole k steps of 8 (40), warps owning one or two outer window offsets (one warp short of
    rows), parts added up by the reduce kernel, U channels shared by channel blocks, two tiles of D channels (24):
    within TF32's bound, and not float32's error."""
    chooser = mma_weight_direct(cells, rows_a_warp, parts, channel_blocks)
    defines = plan(geom, precision="medium", direct_chooser=chooser).defines
    assert defines["BWW_DIRECT_MMA"] == 1 and defines["BWW_SPLIT"] == parts
    rng = reference.case_rng("emulated direct weight mma", geom, cells)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    errors = relative_errors(geom, emulated_tape("float32", precision="medium", direct_chooser=chooser), inputs, grad)
    assert max(errors) <= TF32_BOUND, errors
    assert errors[1] > 4 * FLOAT32_UNIT, f"dkernel: error {errors[1]:.3g} is float32's: no tensor core ran"



@pytest.mark.parametrize(("geom", "blocks", "chooser"), [
    (Geometry.build(Family.CONV, 24, 24, (4, 3, 3, 5), (3,) * 4, (1,) * 4, (1,) * 4, batch=2), 3, choose_direct),
    (tensor_core_geometry(Family.CONV, 7), 4, modelled_weight_mma),
], ids=["conv4d_24", "conv7d_2x32"])
def test_the_weight_tile_past_16_channels_keeps_the_tf32_bound(geom: Geometry, blocks: int, chooser) -> None:
    """The tensor-core weight tile past 16 channels: a 4-D 24 -> 24 conv as the plans take it (3 blocks of 8 U channels,
    two tiles of D channels, 14 warps of two outer window offsets) and tensor_core_geometry's rank 7 (2 groups of 32
    channels, a 2^7 window dilated and padded on the first axis, a fitted box; 4 blocks; the plans leave it to the GEMM;
    the transpose's took 5 minutes here: tests/test_cuda_direct_mma.py runs it on a GPU); within TF32's bound, and not
    float32's error."""
    made = plan(geom, precision="medium", direct_chooser=chooser)
    assert made.defines["BWW_DIRECT_MMA"] == 1 and made.defines["BWW_DIRECT_CHANNEL_BLOCKS"] == blocks
    rng = reference.case_rng("emulated direct weight mma channel blocks", str(geom))
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    tape = emulated_tape("float32", precision="medium", direct_chooser=chooser)
    errors = relative_errors(geom, tape, inputs, grad)
    assert max(errors) <= TF32_BOUND, errors
    assert errors[1] > 4 * FLOAT32_UNIT, f"dkernel: error {errors[1]:.3g} is float32's: no tensor core ran"


# 16-bit elements: a conv of 10 -> 16 channels, a strided transpose with output padding, and a 4-D conv of 16 -> 16
# channels whose 81-offset window the plans give the weight gradient's tensor-core form.
HALF_DIRECT_GEOMETRIES = [
    MMA_DIRECT_GEOMETRIES[0],
    MMA_DIRECT_GEOMETRIES[3],
    Geometry.build(Family.CONV, 16, 16, (4, 3, 5, 4), (3, 3, 3, 3), (1, 1, 1, 1), (1, 1, 1, 1), batch=2),
]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("geom", HALF_DIRECT_GEOMETRIES, ids=lambda g: f"{g.family.value}_r{g.rank}_{g.in_c}to{g.out_c}")
def test_16_bit_elements_on_the_direct_tensor_cores_are_the_float32_sums_rounded(geom: Geometry, dtype: str) -> None:
    """float16 and bfloat16 elements take the TF32 direct kernels (TF32 holds their values exactly), every stage
    of these geometries on the tensor cores: each result is the float32 tape's on the widened values, in the same
    tiles, rounded to 16 bits, bit for bit, and within issue 11's 1e-2 of the float64 reference."""
    chooser = mma_weight_direct(64, 1, 2)
    defines = plan(geom, dtype=dtype, precision="medium", direct_chooser=chooser).defines
    assert defines["FWD_DIRECT_MMA"] == defines["BWI_DIRECT_MMA"] == defines["BWW_DIRECT_MMA"] == 1
    inputs, grad = draw_half(reference.case_rng("emulated direct mma 16-bit", geom, dtype), geom, dtype)
    backend = type("EmulatedBackend", (CupyBackend,), {"poison_outputs": True, "direct_chooser": staticmethod(chooser)})
    with imports_as(emulated_cupy()):  # the backend imports CuPy when it is made
        backend = backend(dtype, "medium")
    got = run_backend(backend, geom, inputs, grad)
    wide = [widened(a, dtype).astype(np.float32) for a in inputs]
    output, grads = reference.run_on_tape(emulated_tape("float32", precision="medium", direct_chooser=chooser), geom,
                                          wide, widened(grad, dtype).astype(np.float32))
    for name, got_array, sums in zip(("output", "dkernel", "dbias", "dinput"), got, [output, *grads], strict=True):
        expected = rounded(np.asarray(sums, np.float32), dtype)
        assert np.array_equal(np.asarray(got_array).reshape(expected.shape).view(np.uint16), expected.view(np.uint16)), \
            name
    errors = half_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, errors
