"""Hopper's `_wgmma` kernels (the TF32 modes' conv stages on an sm_90 GPU) run on the CPU emulator
(tests/emulated_cupy.py: wgmma with A from registers and B through its descriptor in the 128- or 64-byte
swizzle), against the float64 CPU tape with issue 11's bounds, float16 and bfloat16 elements too, and their rare
path against the CPU tape's non-finite cells. `pytest -m cuda` runs the same kernels on the tensor cores
(tests/test_cuda_precision.py, tests/test_cuda_half.py)."""

from __future__ import annotations

import functools
import shutil

import half_support
import numpy as np
import pytest
import reference
from convgen.cpu import Tape as CpuTape
from convgen.cuda import CupyBackend
from convgen.cuda import Tape as CudaTape
from convgen.cuda_launch import plan
from convgen.generated.contract import ARRAY_ALIGNMENT
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import choose_wgmma
from emulated_cupy import emulated_cupy
from half_support import HALF_DTYPES, draw_half, run_backend
from half_support import relative_errors as half_errors
from precision_bounds import FLOAT32_UNIT, HALF_BOUND, TF32_BOUND, high_bound
from test_emulated_kernels import assert_same_non_finite, emulated_tape, imports_as, relative_errors

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++")

WGMMA_STAGES = ("forward", "backward_input", "backward_weight")
# Every conv stage of each runs its `_wgmma` kernel: a conv whose 192 cells an image are not whole tiles of 128 (its
# tiles span images) and whose weight gradient splits its slices across blocks, a grouped, dilated stride-1
# transpose (20 cells an image: a tile spans up to eight), and a conv whose images are whole tiles (and whose 16-bit
# weight gradient reads D itself: 32 channels, 128 cells).
WGMMA_GEOMETRIES = [
    Geometry.build(Family.CONV, 32, 40, (16, 12), (3, 3), (1, 1), (1, 1), batch=3),
    Geometry.build(Family.CONV_TRANSPOSE, 64, 64, (5, 4), (3, 2), (1, 1), (1, 0), dilation=(1, 2), groups=2, batch=2),
    Geometry.build(Family.CONV, 32, 32, (16, 8), (3, 3), (1, 1), (1, 1), batch=2),
]


def wgmma_tape(precision: str) -> CudaTape:
    """A CUDA tape on the emulated CuPy (an sm_90 device: the plans launch `_wgmma` kernels), outputs poisoned."""
    backend = type("WgmmaEmulatedBackend", (CupyBackend,), {"poison_outputs": True})
    with imports_as(emulated_cupy()):  # the backend imports CuPy when it is made
        return type("WgmmaEmulatedTape", (CudaTape,), {"backend_class": backend})(precision=precision)


def test_the_geometries_plan_wgmma_for_every_conv_stage() -> None:
    for geom in WGMMA_GEOMETRIES:
        for precision in ("high", "medium"):
            launches = plan(geom, precision=precision).launches
            assert [launches[stage].kernel for stage in WGMMA_STAGES] == [f"{s}_wgmma" for s in WGMMA_STAGES]
    assert plan(WGMMA_GEOMETRIES[0], precision="medium").defines["BWW_SPLIT"] > 1  # parts and their reduce


@pytest.mark.parametrize("geom", WGMMA_GEOMETRIES, ids=["conv", "transpose", "whole tiles"])
def test_wgmma_kernels_keep_the_tensor_core_bounds(geom) -> None:
    """Forward, input and weight gradient on wgmma, "high" and "medium", against the float64 reference: TF32
    within its bound and above float32's error (the tensor cores ran), 3xTF32 within 2× of the FMA path's."""
    rng = reference.case_rng("emulated wgmma", geom)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    fma = relative_errors(geom, emulated_tape("float32"), inputs, grad)
    high = relative_errors(geom, wgmma_tape("high"), inputs, grad)
    medium = relative_errors(geom, wgmma_tape("medium"), inputs, grad)
    for name, f, h, m in zip(("output", "dkernel", "dbias", "dinput"), fma, high, medium, strict=True):
        assert m <= TF32_BOUND, f"{geom}: {name}: TF32 relative error {m:.3g}"
        assert h <= high_bound(f), f"{geom}: {name}: 3xTF32 {h:.3g}, FMA {f:.3g}"
        if name != "dbias":  # the bias gradient is a plain sum in every precision, the others wgmma
            assert m > 4 * FLOAT32_UNIT, f"{geom}: {name}: TF32 error {m:.3g} is float32's: no tensor core ran"


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_wgmma_blocks_with_non_finite_sums_take_the_rare_path(precision) -> None:
    """An inf and a NaN in the weight next to padding, a -inf in the upstream gradient, an inf in the input: the
    wgmma blocks whose accumulators end non-finite compute their outputs again with FMAs on the values as given,
    and exactly the cells the CPU tape makes non-finite are, with the same signs."""
    geom = WGMMA_GEOMETRIES[0]
    rng = reference.case_rng("emulated wgmma non-finite", precision)
    weight, bias, x = reference.draw_inputs(rng, geom)
    grad = reference.draw_grad(rng, geom)
    weight[1, 3, 0, 0], weight[4, 5, 2, 1] = np.inf, np.nan
    grad[1, 2, 0, 0], x[0, 1, 4, 4] = -np.inf, np.inf
    got_output, got_grads = reference.run_on_tape(wgmma_tape(precision), geom, [weight, bias, x], grad)
    ref_output, ref_grads = reference.run_on_tape(CpuTape(), geom, [weight, bias, x], grad)
    for got, ref in zip([got_output, *got_grads], [ref_output, *ref_grads], strict=True):
        assert_same_non_finite(np.asarray(got), ref, 1e-2)


# 16-bit conv-shaped stages take slices of two blocks of k up to an N of 64 (the geometries above), one beyond: a
# conv of 128 channels whose blocks at the nine window offsets come four a channel run. And a conv of 35 cells an
# image: its `_wgsource` reads U's cells two by two in two loads (an odd count: no 4-byte load is aligned), its bias
# gradient one cell a load.
HALF_GEOMETRIES = [*WGMMA_GEOMETRIES, Geometry.build(Family.CONV, 128, 128, (6, 5), (3, 3), (1, 1), (1, 1), batch=2),
                   Geometry.build(Family.CONV, 32, 32, (7, 5), (3, 3), (1, 1), (1, 1), batch=3)]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("geom", HALF_GEOMETRIES, ids=["conv", "transpose", "whole tiles", "conv_n128",
                                          "odd cells"])
def test_16_bit_elements_on_wgmma_keep_their_bound(geom, dtype) -> None:
    """16-bit elements multiply as themselves (k16; slices of 64 in the 128-byte swizzle up to an N of 64, of 32 in
    the 64-byte one beyond; the weight gradient's A MN-major from U laid out channels-last by its `_wgsource`): every
    stage within issue 11's 1e-2 of the float64 CPU tape on the same values, and a second run gives the same bits."""
    launches = plan(geom, dtype=dtype, precision="medium").launches
    assert [launches[stage].kernel for stage in WGMMA_STAGES] == [f"{s}_wgmma" for s in WGMMA_STAGES]
    slice_k = 64 if geom.out_c // geom.groups <= 64 else 32
    assert plan(geom, dtype=dtype, precision="medium").defines["FWD_WG_K"] == slice_k
    inputs, grad = draw_half(reference.case_rng("emulated wgmma 16-bit", geom, dtype), geom, dtype)
    with imports_as(emulated_cupy()):  # the backend imports CuPy when it is made
        backend = type("WgmmaEmulatedBackend", (CupyBackend,), {"poison_outputs": True})(dtype, "medium")
    errors = half_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
    first, again = (run_backend(backend, geom, inputs, grad) for _ in range(2))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


# choose_wgmma's tiles, the 16-bit conv-shaped stages reading their source channels-last whatever its rule, their
# slices staged once for every offset of the last axis (WG_SHIFT) where its rule allows, or not.
channels_last_chooser = functools.partial(choose_wgmma, channels_last_min_uses=0, shift=False)
shifted_chooser = functools.partial(choose_wgmma, channels_last_min_uses=0)


def channels_last_backend(dtype: str, trap_rare_path: bool = False, chooser=channels_last_chooser) -> CupyBackend:
    """A backend on the emulated CuPy whose 16-bit conv-shaped `_wgmma` stages read their source channels-last, as
    `chooser` plans them; with `trap_rare_path`, compiled so that a block taking the rare path traps (on finite
    values)."""
    def functions(self, source_name, symbols, options, device):
        extra = ("-DCONVGEN_TRAP_RARE_PATH",) if trap_rare_path else ()
        return CupyBackend._functions(self, source_name, symbols, (*options, *extra), device)

    with imports_as(emulated_cupy()):  # the backend imports CuPy when it is made
        return type("ChannelsLastBackend", (CupyBackend,), {
            "poison_outputs": True, "wgmma_chooser": staticmethod(chooser), "_functions": functions})(dtype, "medium")


# Channels-last sources (by rule only from 700 products a source element) on geometries that gather by rule: 40
# channels of the upstream gradient (a block of 32 and one of 8 and zeros), tiles that span images, groups and
# dilation, odd cell counts, and groups of 40 and 48 channels (each group's rows rounded up to 64).
@pytest.mark.parametrize("geom", [*(HALF_GEOMETRIES[i] for i in (0, 1, 4)),
                                  Geometry.build(Family.CONV, 80, 96, (7, 6), (3, 3), (1, 1), (1, 1), groups=2, batch=2)],
                         ids=["conv", "transpose", "odd cells", "groups of 40"])
def test_16_bit_channels_last_sources_keep_their_bound(geom) -> None:
    """The same stages reading their source as their `_wgsource` laid it out (two threads a cell, 16-byte copies):
    within 1e-2 of the float64 CPU tape, no block on the rare path (it would trap), the same bits run after run."""
    backend = channels_last_backend("bfloat16", trap_rare_path=True)
    made = plan(geom, dtype="bfloat16", precision="medium", wgmma_chooser=channels_last_chooser)
    assert [made.defines[f"{prefix}_WG_CHANNELS_LAST"] for prefix in ("FWD", "BWI", "BWW")] == [1, 1, 1]
    assert made.defines["FWD_WG_K"] == (64 if geom.out_c // geom.groups <= 64 else 32)
    inputs, grad = draw_half(reference.case_rng("emulated wgmma channels-last", geom), geom, "bfloat16")
    errors = half_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
    first, again = (run_backend(backend, geom, inputs, grad) for _ in range(2))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


# Slices staged once for the last axis's offsets (WG_SHIFT): tiles spanning images (14 positions a row of 12 cells),
# the transpose (its forward the gather form, offsets backwards; dilation 2 on the last axis: 2 rows past a tile), a
# rank-1 conv of dilation 30 (60 rows past a tile: the copies' second pass, 4-byte stores), a 3-D conv of 7 cells a row
# (stores one by one) with stride 2 on its first axis, groups, and rows of 10 cells in 11 positions (stores one by one:
# a vector of two would cross rows), and a k5 window over 64 channels (three slices in shared memory).
SHIFT_GEOMETRIES = [
    HALF_GEOMETRIES[0], HALF_GEOMETRIES[1],
    Geometry.build(Family.CONV, 32, 32, (150,), (3,), (1,), (30,), dilation=(30,), batch=2),
    Geometry.build(Family.CONV, 32, 32, (7, 5, 7), (3, 3, 3), (2, 1, 1), (1, 1, 1), batch=2),
    Geometry.build(Family.CONV, 64, 64, (6, 9), (3, 3), (1, 1), (1, 1), groups=2, batch=2),
    Geometry.build(Family.CONV, 32, 32, (6, 11), (3, 2), (1, 1), (1, 0), batch=2),
    Geometry.build(Family.CONV, 64, 64, (90,), (5,), (1,), (2,), batch=2),
]


@pytest.mark.parametrize("geom", SHIFT_GEOMETRIES, ids=["conv", "transpose", "rank 1 dilated", "3-D odd rows", "groups",
                                                       "odd positions", "three stages"])
def test_16_bit_shifted_slices_keep_their_bound(geom) -> None:
    """The conv-shaped stages reading a slice's rows once for every window offset of the last axis: within 1e-2 of the
    float64 CPU tape, no block on the rare path (it would trap), the same bits run after run."""
    backend = channels_last_backend("bfloat16", trap_rare_path=True, chooser=shifted_chooser)
    made = plan(geom, dtype="bfloat16", precision="medium", wgmma_chooser=shifted_chooser)
    gathered = made.launches["backward_input"].kernel != "backward_input_wgmma"  # stride phases: the GEMM
    assert [made.defines[f"{prefix}_WG_SHIFT"] for prefix in ("FWD", "BWI")] == [1, 0 if gathered else 1]
    inputs, grad = draw_half(reference.case_rng("emulated wgmma shifted", geom), geom, "bfloat16")
    errors = half_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
    first, again = (run_backend(backend, geom, inputs, grad) for _ in range(2))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def test_the_transpose_s_gradients_share_one_channels_last_copy_of_the_upstream_gradient() -> None:
    """The transpose's input gradient and weight gradient both read the upstream gradient channels-last: the backward
    lays it out once, and the gradients are the same bits as with a copy each."""
    geom = HALF_GEOMETRIES[1]
    inputs, grad = draw_half(reference.case_rng("emulated wgmma shared copy", geom), geom, "bfloat16")
    launched: list[str] = []

    class Recording(CupyBackend):
        poison_outputs = True
        wgmma_chooser = staticmethod(channels_last_chooser)

        def _launch(self, compiled, stage, values, group=None):
            launched.append(stage)
            super()._launch(compiled, stage, values, group)

    with imports_as(emulated_cupy()):  # the backend imports CuPy when it is made
        backend = Recording("bfloat16", "medium")
    shared = run_backend(backend, geom, inputs, grad)
    assert "backward_input_wgsource" in launched and "backward_weight_wgsource" not in launched
    copy_each = []
    for stage in ("backward_input", "backward_weight"):  # each gradient alone lays out its own copy
        launched.clear()
        wanted = (stage == "backward_weight", False, stage == "backward_input")
        arrays = tuple(backend.store(a) for a in inputs)
        _, saved = backend.forward(geom, arrays)
        copy_each.append(backend.backward(geom, arrays, saved, backend.store(grad), wanted))
        assert f"{stage}_wgsource" in launched
    for together, alone in ((shared[3], copy_each[0][2]), (shared[1], copy_each[1][0])):
        np.testing.assert_array_equal(np.asarray(together).view(np.uint16), np.asarray(alone).view(np.uint16))


@pytest.mark.parametrize(("dtype", "channels_last"), [("float16", False), ("bfloat16", False), ("bfloat16", True),
                                                      ("bfloat16", "shifted")])
def test_16_bit_wgmma_blocks_with_non_finite_sums_take_the_rare_path(dtype, channels_last) -> None:
    """As for float32 above, in 16 bits (the weight gradient's rare path reads U as its `_wgsource` laid it out,
    channels-last, 32 channels here; with `channels_last` the conv-shaped stages' too, the upstream gradient's 40
    channels in rows of 64, "shifted": their slices staged once for the last axis's offsets, whose padded positions
    the rare path skips): exactly the cells the CPU tape makes non-finite on the same values are, with the same
    signs."""
    geom = WGMMA_GEOMETRIES[0]
    inputs, grad = draw_half(reference.case_rng("emulated wgmma 16-bit non-finite", dtype), geom, dtype)
    weight, bias, x = (a.copy() for a in inputs)
    inf, nan = half_support.stored(np.array([np.inf, np.nan], np.float32), dtype)
    weight[1, 3, 0, 0], weight[4, 5, 2, 1], x[0, 1, 4, 4] = inf, nan, inf
    grad = grad.copy()
    grad[1, 2, 0, 0] = -inf if dtype == "float16" else inf ^ np.uint16(0x8000)
    if channels_last == "shifted":
        assert plan(geom, dtype=dtype, precision="medium", wgmma_chooser=shifted_chooser).defines["FWD_WG_SHIFT"] == 1
        backend = channels_last_backend(dtype, chooser=shifted_chooser)
    elif channels_last:
        backend = channels_last_backend(dtype)
    else:
        with imports_as(emulated_cupy()):  # the backend imports CuPy when it is made
            backend = type("WgmmaEmulatedBackend", (CupyBackend,), {"poison_outputs": True})(dtype, "medium")
    wide = [half_support.widened(a, dtype) for a in (weight, bias, x)]
    ref_output, ref_grads = reference.run_on_tape(CpuTape(dtype="float64"), geom, wide,
                                                  half_support.widened(grad, dtype))
    got = run_backend(backend, geom, (weight, bias, x), grad)
    for result, ref in zip(got, [ref_output, *ref_grads], strict=True):
        assert_same_non_finite(half_support.widened(result, dtype), np.asarray(ref), 1e-2)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_the_16_bit_weight_gradient_reads_d_in_place_and_store_aligns_it(dtype) -> None:
    """Where D's layout is the packed one the weight gradient reads D itself, with no `_wgpack` launch (its bound is
    test_16_bit_elements_on_wgmma_keep_their_bound's "whole tiles"). That, and the kernels' 16-byte accesses, need
    every array to start on ARRAY_ALIGNMENT: `store` copies a device array that does not (a view two bytes into its
    buffer), and the gradients are the same bits as from an aligned copy of the same values."""
    geom = WGMMA_GEOMETRIES[2]
    assert plan(geom, dtype=dtype, precision="medium").copied_packs == frozenset({"backward_weight"})
    inputs, grad = draw_half(reference.case_rng("emulated wgmma 16-bit copied D", geom, dtype), geom, dtype)
    launched: list[str] = []

    class Recording(CupyBackend):
        poison_outputs = True

        def _launch(self, compiled, stage, values, group=None):
            launched.append(stage)
            super()._launch(compiled, stage, values, group)

    cupy = emulated_cupy()
    with imports_as(cupy):  # the backend imports CuPy when it is made
        backend = Recording(dtype, "medium")
    offset = cupy.asarray(np.zeros(grad.size + 1, grad.dtype))[1:].reshape(grad.shape)
    offset[...] = grad
    assert offset.data.ptr % ARRAY_ALIGNMENT == 2
    stored = backend.store(offset)
    assert stored is not offset and stored.data.ptr % ARRAY_ALIGNMENT == 0
    arrays = tuple(backend.store(a) for a in inputs)
    _, saved = backend.forward(geom, arrays)
    results = []
    for upstream in (backend.store(grad), stored):
        launched.clear()
        backend._compile(geom).programs.clear()  # the pass traced again: its `_launch` calls are what it launches
        results.append(backend.backward(geom, arrays, saved, upstream))
        assert "backward_weight" in launched and "backward_weight_pack" not in launched
    for aligned, copied in zip(*results, strict=True):
        np.testing.assert_array_equal(np.asarray(aligned).view(np.uint16), np.asarray(copied).view(np.uint16))
