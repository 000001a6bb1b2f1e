"""The direct kernels on TF32 tensor cores (a conv-shaped stage's DIRECT_MMA) on the GPU (`pytest -m cuda`): forward
and input gradient (one of the direct form, one gathered per stride phase) at every rank 1..8, both families, with
stride, padding, dilation, groups and batches, within TF32's bound of the float64 CPU tape and bit-identical run
after run; an inf or NaN takes the careful path, in both forms; float16 and bfloat16 elements on the same kernels are
the float32 sums rounded."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from convgen.cuda_launch import H200, plan
from convgen.direct_model import choose_direct, direct_shared_bytes
from convgen.direct_shapes import direct_shapes
from convgen.geometry import Family, Geometry
from cuda_support import RANKS, G, PoisonBackend, PoisonTape, _has_gpu, run
from forced_tiles import mma_direct, mma_weight_direct, modelled_weight_mma, tensor_core_geometry
from half_support import HALF_DTYPES, draw_half, rounded, run_backend, widened
from half_support import relative_errors as half_errors
from precision_bounds import FLOAT32_UNIT, HALF_BOUND, TF32_BOUND

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

import convgen.cpu  # noqa: E402  (after the skip)

STAGES = ("forward", "backward_input")


def mma_tape(chooser) -> type:
    """A poisoning "medium" tape whose stages run the direct kernels `chooser` gives (forced_tiles' mma choosers)."""
    backend = type("MmaDirectBackend", (PoisonBackend,), {"direct_chooser": staticmethod(chooser)})
    tape = type("MmaDirectTape", (PoisonTape,), {"backend_class": backend})
    return lambda: tape(precision="medium")


def mma_geometry(family: Family, rank: int) -> Geometry:
    """Up to rank 4 windows of 3, padding and a dilation on the first axis; past it windows of 2 (the staged window of
    the weights fits shared memory at rank 8); stride 2 on the last axis, 2 groups of 3 and 8 channels, 2 images."""
    kernel = (3,) * rank if rank <= 4 else (2,) * rank
    stride = tuple(2 if a == rank - 1 and rank > 1 else 1 for a in range(rank))
    padding = tuple(1 if k == 3 else 0 for k in kernel)
    dilation = tuple(2 if a == 0 and 1 < rank <= 4 else 1 for a in range(rank))
    in_spatial = tuple(7 + a % 3 if rank <= 2 else 5 + a % 2 if rank <= 4 else 3 for a in range(rank))
    return G(family, 6, 16, in_spatial, kernel, stride, padding, batch=2, dilation=dilation, groups=2)


def errors(tape_class, geom: Geometry, inputs, grad) -> list[float]:
    """The relative error of the output and each gradient against the float64 CPU tape; the run twice, bit for bit."""
    first, second = run(tape_class(), geom, inputs, grad, repeat=2), run(tape_class(), geom, inputs, grad)
    for a, b in zip([first[0], *first[1]], [second[0], *second[1]], strict=True):
        assert np.array_equal(a, b, equal_nan=True), f"{geom}: two runs differ"
    wide = [a.astype(np.float64) for a in inputs]
    ref = run(convgen.cpu.Tape(dtype="float64"), geom, wide, grad.astype(np.float64))
    ref_abs = run(convgen.cpu.Tape(dtype="float64"), geom, [np.abs(a) for a in wide], np.abs(grad).astype(np.float64))
    out = []
    for g, r, a in zip([first[0], *first[1]], [ref[0], *ref[1]], [ref_abs[0], *ref_abs[1]], strict=True):
        out.append(float(np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(a)))
    return out


@pytest.mark.parametrize("cells, tiles, sliced, weight", [(32, 1, False, False), (64, 2, False, True),
                                                           (64, 2, True, False)],
                         ids=["one-tile-warps", "weight-gradient-too", "first-axis-slices"])
@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", [Family.CONV, Family.CONV_TRANSPOSE], ids=lambda f: f.value)
def test_direct_kernels_on_tensor_cores_keep_the_tf32_bound(family: Family, rank: int, cells: int, tiles: int,
                                                            sliced: bool, weight: bool) -> None:
    """`sliced`: the first axis's window offsets one a step (past rank 1); `weight`: the weight gradient on the tensor
    cores too (one outer window offset a warp where the warps allow, two parts)."""
    geom = mma_geometry(family, rank)
    slices = geom.kernel[0] if sliced and rank > 1 else 1
    chooser = mma_weight_direct(cells, 1, 2) if weight else mma_direct(cells, tiles, slices)
    made = plan(geom, precision="medium", direct_chooser=chooser)
    shapes = direct_shapes(geom, 4, 1)
    for stage in STAGES:
        prefix = made_prefix(stage)
        assert made.launches[stage].kernel == f"{stage}_direct" and made.defines[f"{prefix}_DIRECT_MMA"]
        assert made.defines[f"{prefix}_DIRECT_SLICES"] == slices
        assert direct_shared_bytes(chooser(shapes[stage], H200), shapes[stage]) <= H200.shared_optin_per_block
    assert made.defines["BWW_DIRECT_MMA"] == int(weight)
    rng = reference.case_rng("cuda direct mma", family.value, rank, cells)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    output, dkernel, dbias, dinput = errors(mma_tape(chooser), geom, inputs, grad)
    for name, error in (("output", output), ("dkernel", dkernel), ("dbias", dbias), ("dinput", dinput)):
        assert error <= TF32_BOUND, f"{geom}: {name}: TF32 relative error {error:.3g}"
    assert min(output, dinput, *([dkernel] if weight else [])) > 4 * FLOAT32_UNIT, \
        f"{geom}: float32's error: no tensor core ran"


@pytest.mark.parametrize("geom, blocks, chooser", [
    (G(Family.CONV, 24, 24, (4, 3, 3, 5), (3,) * 4, (1,) * 4, (1,) * 4, batch=2), 3, choose_direct),
    (G(Family.CONV, 32, 32, (4, 3, 3, 5), (3,) * 4, (1,) * 4, (1,) * 4, batch=2), 4, choose_direct),
    (tensor_core_geometry(Family.CONV, 7), 4, modelled_weight_mma),
    (tensor_core_geometry(Family.CONV_TRANSPOSE, 7), 4, modelled_weight_mma),
], ids=["conv4d_24", "conv4d_32", "conv7d_2x32", "conv_transpose7d_2x32"])
def test_the_weight_tile_past_16_channels_keeps_the_tf32_bound(geom: Geometry, blocks: int, chooser) -> None:
    """The tensor-core weight tile for a 4-D conv of 24 or 32 channels each way as the plans take it (U channels in 3 or
    4 blocks of 8), and for tensor_core_geometry's rank 7 (2 groups of 32 channels, a 2^7 window dilated and padded on
    the first axis, a fitted box; the plans leave it to the GEMM), both families: within TF32's bound, bit-identical
    run after run, and not float32's error."""
    made = plan(geom, precision="medium", direct_chooser=chooser)
    assert made.defines["BWW_DIRECT_MMA"] == 1 and made.defines["BWW_DIRECT_CHANNEL_BLOCKS"] == blocks
    rng = reference.case_rng("cuda direct weight mma channel blocks", str(geom))
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    output, dkernel, dbias, dinput = errors(mma_tape(chooser), geom, inputs, grad)
    assert max(output, dkernel, dbias, dinput) <= TF32_BOUND, (output, dkernel, dbias, dinput)
    assert dkernel > 4 * FLOAT32_UNIT, f"dkernel: error {dkernel:.3g} is float32's: no tensor core ran"


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", [Family.CONV, Family.CONV_TRANSPOSE], ids=lambda f: f.value)
def test_16_bit_elements_are_the_float32_sums_rounded(family: Family, rank: int, dtype: str) -> None:
    """float16 and bfloat16 elements on the same tensor-core direct kernels, every stage (TF32 holds their values
    exactly): each result is the float32 "medium" tape's on the widened values, rounded to 16 bits, bit for bit, and
    within issue 11's 1e-2 of the float64 CPU tape."""
    geom = mma_geometry(family, rank)
    chooser = mma_weight_direct(64, 1, 2)
    defines = plan(geom, dtype=dtype, precision="medium", direct_chooser=chooser).defines
    assert defines["FWD_DIRECT_MMA"] == defines["BWI_DIRECT_MMA"] == defines["BWW_DIRECT_MMA"] == 1
    inputs, grad = draw_half(reference.case_rng("cuda direct mma 16-bit", family.value, rank, dtype), geom, dtype)
    backend = type("MmaDirectBackend", (PoisonBackend,), {"direct_chooser": staticmethod(chooser)})(dtype, "medium")
    got = run_backend(backend, geom, inputs, grad)
    wide = [widened(a, dtype).astype(np.float32) for a in inputs]
    output, grads = run(mma_tape(chooser)(), geom, wide, widened(grad, dtype).astype(np.float32))
    for name, got_array, sums in zip(("output", "dkernel", "dbias", "dinput"), got, [output, *grads], strict=True):
        expected = rounded(np.asarray(sums, np.float32), dtype)
        assert np.array_equal(got_array.get().reshape(expected.shape).view(np.uint16), expected.view(np.uint16)), \
            f"{geom}: {name}"
    errors = half_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"


def made_prefix(stage: str) -> str:
    return {"forward": "FWD", "backward_input": "BWI"}[stage]


@pytest.mark.parametrize("stride", [1, 2])
def test_non_finite_values_take_the_careful_path(stride: int) -> None:
    """0 * inf must not reach a sum, and TF32 rounding must not make a finite value inf: a step that stages an inf, a
    NaN or a value near float32's largest adds its products with FMAs, padded cells skipped (SEMANTICS §3), so
    exactly the output and input gradient cells the CPU tape makes non-finite are, with the same signs."""
    geom = G(Family.CONV, 10, 16, (7, 9), (3, 3), (1, stride), (1, 1), batch=2)
    rng = reference.case_rng("cuda direct mma non-finite", stride)
    weight, bias, x = reference.draw_inputs(rng, geom)
    weight[1, 2, 0, 0], weight[3, 9, 2, 1] = np.inf, np.nan
    x[1, 4, 3, 3], x[0, 2, 0, 5] = -np.inf, np.float32(3.4e38)
    grad = reference.draw_grad(rng, geom)
    got = run(mma_tape(mma_direct(64, 2))(), geom, [weight, bias, x], grad)
    ref = run(convgen.cpu.Tape(), geom, [weight, bias, x], grad)
    for got_value, ref_value in ((got[0], ref[0]), (got[1][2], ref[1][2])):
        np.testing.assert_array_equal(np.isnan(got_value), np.isnan(ref_value))
        np.testing.assert_array_equal(np.isinf(got_value) * np.sign(got_value), np.isinf(ref_value) * np.sign(ref_value))
        assert not np.isfinite(ref_value).all() and np.isfinite(ref_value).any()
        finite = np.isfinite(ref_value)
        np.testing.assert_allclose(got_value[finite], ref_value[finite], rtol=1e-2, atol=1e-2)


def test_the_plans_take_the_tensor_cores_in_medium_for_8_to_32_channels() -> None:
    """The plans' own tile (2 tiles a warp, the box of up to 512 cells): an 8 -> 8, a 16 -> 12, a 10 -> 10, a 16 -> 16
    and a 24 -> 24 conv, the 10 -> 10 one's 4-D k5 window staged in 5 slices of its first axis, the 16 -> 16 and
    24 -> 24 ones' weight gradients on the tensor cores too, and a 16 -> 16 conv on 7x7x9 cells in the fitted box
    4x7x9 (the last tile and the second box partly empty), "medium" within TF32's bound with both
    conv-shaped stages on the tensor cores; in "high" the 8 -> 8 conv keeps the FMA direct kernels and "highest"'s
    bits."""
    for geom, fma_in_high, slices, weight_mma in (
            (G(Family.CONV, 8, 8, (10, 10, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=2), True, 1, 0),
            (G(Family.CONV, 16, 12, (6, 7, 5, 9), (3, 3, 3, 3), (1,) * 4, (1, 0, 1, 1), batch=2), False, 1, 0),
            (G(Family.CONV, 10, 10, (6, 5, 6, 7), (5,) * 4, (1,) * 4, (2,) * 4, batch=2), False, 5, 0),
            (G(Family.CONV, 16, 16, (5, 6, 5, 7), (3,) * 4, (1,) * 4, (1,) * 4, batch=2), False, 1, 1),
            (G(Family.CONV, 24, 24, (5, 4, 6, 7), (3,) * 4, (1,) * 4, (1,) * 4, batch=2), False, 1, 1),
            (G(Family.CONV, 16, 16, (7, 7, 9), (3,) * 3, (1,) * 3, (1,) * 3, batch=2), False, 1, 0)):
        made = plan(geom, precision="medium")
        assert all(made.launches[stage].kernel == f"{stage}_direct" for stage in STAGES)
        assert made.defines["FWD_DIRECT_MMA"] == made.defines["BWI_DIRECT_MMA"] == 1
        assert made.defines["FWD_DIRECT_SLICES"] == made.defines["BWI_DIRECT_SLICES"] == slices
        assert made.defines["BWW_DIRECT_MMA"] == weight_mma
        rng = reference.case_rng("cuda planned direct mma", geom.out_c)
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        medium = errors(lambda: PoisonTape(precision="medium"), geom, inputs, grad)
        assert max(medium) <= TF32_BOUND and min(medium[0], medium[3]) > 4 * FLOAT32_UNIT, medium
        assert not weight_mma or medium[1] > 4 * FLOAT32_UNIT, medium
        if fma_in_high:
            high, highest = run(PoisonTape(precision="high"), geom, inputs, grad), run(PoisonTape(), geom, inputs, grad)
            for a, b in zip([high[0], *high[1]], [highest[0], *highest[1]], strict=True):
                np.testing.assert_array_equal(a, b)
