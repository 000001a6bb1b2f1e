"""The generated CUDA of the conv families run on the CPU, against the CPU tape: the real CUDA tape over a
CuPy made of NumPy and g++ (tests/emulated_cupy.py), so that kernel changes are checked where no GPU is.
Every GPU thread is an OS thread, so the cases are few and small: the forced tiles that read a repacked
weight (A staged four rows at a time and one element at a time, tests/test_launch_plans.py says which)
on the forced geometries and a grouped one, float32 and float64; slices in dynamic shared memory past
48 KB; the rare path of non-finite values; a circular convolution (its pad and fold kernels); the
tensor-core precisions on forced mma tiles with issue 11's bounds, and the direct kernels they take at few channels;
float16 and bfloat16 elements through
every family. `pytest -m cuda` runs the same kernels on a GPU."""

from __future__ import annotations

import math
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference
from convgen.cpu import Tape as CpuTape
from convgen.cuda import CupyBackend
from convgen.cuda import Tape as CudaTape
from convgen.cuda_launch import plan
from convgen.direct_model import DirectChooser, cut_tile, direct_tile, no_direct
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import no_wgmma
from emulated_cupy import emulated_cupy
from forced_tiles import (
    FORCED_GEOMETRY,
    FORCED_TILES,
    FORCED_TILES_FLOAT64,
    MMA_FORCED_TILES,
    WIDE_FORCED_GEOMETRY,
    WIDE_FORCED_TILES,
    forced_chooser,
    staged_channels,
    weight_channel_blocks,
)
from half_support import HALF_DTYPES, draw_half, run_backend, stored, widened
from half_support import relative_errors as half_errors
from precision_bounds import FLOAT32_UNIT, HALF_BOUND, TF32_BOUND, high_bound

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from suite.stand_in import imports_as  # how the host-path benchmark swaps CuPy in too

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++")

RTOLS = {"float32": reference.RTOL, "float64": reference.RTOL_FLOAT64}
# Two groups of 8 rows over 16 source channels, a batch: a group's repacked A in quads.
GROUPED = Geometry.build(Family.CONV, 16, 32, (7, 6), (3, 2), (2, 1), (1, 0), dilation=(2, 1), groups=2, batch=2)


def emulated_tape(dtype: str, tile: tuple | None = None, precision: str = "highest",
                  direct_chooser: DirectChooser | None = None) -> CudaTape:
    """A CUDA tape on the emulated CuPy whose outputs start as NaN (a value a kernel forgets shows), its
    plans taking `tile` everywhere when given (a tape class of its own: its own backend and modules; no
    direct kernel then) and `direct_chooser`'s direct tiles when given, its conv GEMMs in `precision`. No `_wgmma`
    kernels: the GEMMs these tests force or plan run (tests/test_emulated_wgmma.py runs the wgmma kernels)."""
    chooser = {"tile_chooser": staticmethod(forced_chooser(*tile))} if tile else {}
    chooser["wgmma_chooser"] = staticmethod(no_wgmma)
    if tile or direct_chooser:
        chooser["direct_chooser"] = staticmethod(direct_chooser or no_direct)
    backend = type("EmulatedBackend", (CupyBackend,), {"poison_outputs": True, **chooser})
    with imports_as(emulated_cupy()):  # the backend imports CuPy when it is made
        return type("EmulatedTape", (CudaTape,), {"backend_class": backend})(dtype=dtype, precision=precision)


def check(geom: Geometry, dtype: str, tile: tuple | None = None, direct_chooser: DirectChooser | None = None) -> None:
    rng = reference.case_rng("emulated", geom, dtype, tile)
    inputs, grad = reference.draw_inputs(rng, geom, dtype), reference.draw_grad(rng, geom, dtype)
    output, grads = reference.run_on_tape(emulated_tape(dtype, tile, direct_chooser=direct_chooser), geom, inputs, grad)
    assert output.dtype == dtype and all(g.dtype == dtype for g in grads)
    reference.check_against_reference(geom, inputs, grad, output, grads, rtol=RTOLS[dtype],
                                      oracle=lambda g, i, d: reference.run_on_tape(CpuTape(dtype=dtype), g, i, d))


PACKED_TILES = [(tile, "float32") for tile in FORCED_TILES if tile[5]] + \
               [(tile, "float64") for tile in FORCED_TILES_FLOAT64 if tile[5]]


@pytest.mark.parametrize(("tile", "dtype"), PACKED_TILES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple)
                         else v)
def test_forced_tiles_reading_a_repacked_weight(tile, dtype) -> None:
    for geom in (*FORCED_GEOMETRY, GROUPED):
        check(geom, dtype, tile)


def test_wide_slices_in_dynamic_shared_memory() -> None:
    """32-channel slices of a 128 x 64 tile, 51 KB of dynamic shared memory (each emulated block gets
    what the launch asks for, and a kernel that needs more traps)."""
    check(WIDE_FORCED_GEOMETRY[0], "float32", WIDE_FORCED_TILES[0])


# Run in a child process: a trapped kernel aborts the process it runs in.
SHORT_LAUNCH = """
import dataclasses
import convgen.cuda
import test_emulated_kernels as emulated
from forced_tiles import WIDE_FORCED_GEOMETRY, WIDE_FORCED_TILES

full_plan = convgen.cuda.plan

def short_plan(*args, **kwargs):
    made = full_plan(*args, **kwargs)
    forward = dataclasses.replace(made.launches["forward"], shared_bytes=made.launches["forward"].shared_bytes - 16)
    return dataclasses.replace(made, launches={**made.launches, "forward": forward})

convgen.cuda.plan = short_plan
emulated.check(WIDE_FORCED_GEOMETRY[0], "float32", WIDE_FORCED_TILES[0])
"""


def test_a_launch_short_of_its_dynamic_shared_memory_traps() -> None:
    """The 128 x 64 wide-slice forward given 16 bytes less dynamic shared memory than its slices take stops
    at its first instruction (__trap) rather than stage past the end of it."""
    child = subprocess.run([sys.executable, "-c", SHORT_LAUNCH], capture_output=True, text=True, timeout=600,
                           cwd=Path(__file__).resolve().parent)
    assert child.returncode == -signal.SIGABRT, child.stderr[-2000:]
    assert "emulated kernel: __trap()" in child.stderr


def assert_same_non_finite(got: np.ndarray, ref: np.ndarray, tolerance: float) -> None:
    """The same cells NaN, the same infinite with the same signs, the rest within `tolerance`."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(ref) * np.sign(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "gemm"])
def test_non_finite_values_take_the_rare_path(direct) -> None:
    """An inf or NaN in A (the weight; the upstream gradient for the weight gradient) sends its slice down
    the masked path, which skips padding: exactly the cells the CPU tape makes non-finite are, with the
    same signs, and the rest is close. The forward and input gradient (of 6 and 12 channels; stride 2: phases)
    run their GEMMs or the direct kernel (whose careful path skips padding too)."""
    geom = Geometry.build(Family.CONV, 12, 6, (9, 8), (3, 3), (2, 1), (1, 1), batch=2)
    chooser = direct_tile if direct else no_direct
    launches = plan(geom, direct_chooser=chooser).launches
    assert bool(launches["forward"].kernel) is direct and bool(launches["backward_input"].kernel) is direct
    rng = reference.case_rng("emulated non-finite")
    weight, bias, x = reference.draw_inputs(rng, geom)
    grad = reference.draw_grad(rng, geom)
    weight[1, 3, 0, 0], weight[4, 5, 2, 1] = np.inf, np.nan
    grad[1, 2, 0, 0] = -np.inf
    tape = emulated_tape("float32", direct_chooser=chooser)
    got_output, got_grads = reference.run_on_tape(tape, geom, [weight, bias, x], grad)
    ref_output, ref_grads = reference.run_on_tape(CpuTape(), geom, [weight, bias, x], grad)
    for got, ref in zip([got_output, *got_grads], [ref_output, *ref_grads], strict=True):
        assert_same_non_finite(np.asarray(got), ref, 1e-4)


@pytest.mark.parametrize("cells", [2052, 2051], ids=["quads", "cells"])
def test_bias_gradient_split_into_parts(cells) -> None:
    """Two channels of 2052 (16-byte loads) or 2051 cells, four images: the bias gradient in two parts a
    channel and its reduce kernel."""
    geom = Geometry.build(Family.CONV, 1, 2, (cells,), (1,), (1,), (0,), batch=4)
    assert plan(geom).splits["backward_bias"] == 2
    check(geom, "float32")


# The small-channel direct kernels (the conv-shaped stages of at most 16 dst channels and the weight gradient,
# taken wherever they can be here, not only where the plans take them): ranks 1-4, stride, padding, dilation, groups, batches, V cells a
# thread that the last extent does not divide, several channel steps (CB), a transpose with output padding; in
# the gather form phases of T and T - 1 taps, of one tap (k2 s2), and phases no offset reaches (K < S; gcd(S, D)
# = 2).
DIRECT_GEOMETRIES = [
    Geometry.build(Family.CONV, 3, 5, (11,), (3,), (1,), (1,)),
    Geometry.build(Family.CONV, 5, 3, (13,), (7,), (2,), (3,), batch=2),
    Geometry.build(Family.CONV, 19, 6, (9, 10), (3, 3), (2, 1), (1, 2), dilation=(1, 2), batch=2),
    Geometry.build(Family.CONV, 6, 3, (9, 10), (7, 5), (2, 3), (3, 1), batch=2),
    Geometry.build(Family.CONV, 6, 4, (5, 6, 7), (3, 2, 3), (1, 2, 1), (1, 0, 1), groups=2, batch=3),
    Geometry.build(Family.CONV, 2, 3, (4, 5, 4, 6), (3, 3, 3, 3), (1, 1, 1, 1), (1, 1, 1, 1), batch=2),
    Geometry.build(Family.CONV, 3, 4, (9,), (1,), (2,), (0,), batch=2),
    Geometry.build(Family.CONV, 3, 4, (11, 9), (2, 3), (2, 2), (1, 1), dilation=(2, 2), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 5, 3, (6, 7), (3, 3), (2, 1), (1, 0), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 4, 3, (5, 6), (2, 2), (2, 2), (0, 0), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 6, 4, (5, 4, 3), (3, 2, 3), (2, 1, 3), (1, 0, 1), groups=2, batch=3,
                   output_padding=(1, 0, 2)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_direct_kernel_of_few_channels(dtype) -> None:
    for geom in DIRECT_GEOMETRIES:
        launches = plan(geom, dtype=dtype, direct_chooser=direct_tile).launches
        # In both families the forward's dst channels are out_c, the input gradient's in_c.
        for stage, dst_c in (("forward", geom.out_c), ("backward_input", geom.in_c)):
            assert launches[stage].kernel == (f"{stage}_direct" if dst_c // geom.groups <= 16 else ""), geom
        # The weight gradient's direct kernel: rows of U channels x outer window offsets (a channel's at most 256,
        # the channels shared by as many blocks as that takes), M x K_last sums each.
        d_c = geom.out_c if geom.family is Family.CONV else geom.in_c
        outer, sums = math.prod(geom.kernel[:-1]), d_c // geom.groups * geom.kernel[-1]
        assert bool(launches["backward_weight"].kernel) is (outer <= 256 and sums <= 64), geom
        check(geom, dtype, direct_chooser=direct_tile)


@pytest.mark.parametrize("v", [3, 7])
def test_direct_kernel_of_more_cells_a_thread(v) -> None:
    """The V the plans take past 2 (up to 8, where the boxes cover the cells as well): lines of cells that V does
    not divide, in both forms, with strides, groups and a transpose."""
    def chooser(shape, hardware):
        return direct_tile(shape, hardware) if shape.weight else cut_tile(shape, v, 64, hardware)
    for geom in (DIRECT_GEOMETRIES[1], DIRECT_GEOMETRIES[3], DIRECT_GEOMETRIES[4], DIRECT_GEOMETRIES[8]):
        made = plan(geom, direct_chooser=chooser)
        assert made.launches["forward"].kernel == "forward_direct" and made.defines["FWD_DIRECT_V"] == v, geom
        assert made.launches["backward_input"].kernel == "backward_input_direct", geom
        check(geom, "float32", direct_chooser=chooser)


def test_direct_staging_past_the_static_limit_is_dynamic_shared_memory() -> None:
    """Eight source channels a step of a 7x7 window's halo (66 KB) go into the launch's dynamic shared memory. The
    sums run channel by channel whatever the channels a step, so the results are those of the static staging's
    fewer channels a step bit for bit, and the CPU tape's within the tolerance."""
    geom = Geometry.build(Family.CONV, 8, 4, (14, 134), (7, 7), (1, 1), (0, 0), batch=2)
    static, dynamic = plan(geom, direct_chooser=staged_channels(None)), plan(geom, direct_chooser=staged_channels(8))
    assert static.defines["FWD_DIRECT_CB"] < 8 and static.launches["forward"].shared_bytes == 0
    assert dynamic.defines["FWD_DIRECT_CB"] == 8 and dynamic.launches["forward"].shared_bytes > 48 * 1024
    rng = reference.case_rng("emulated dynamic staging")
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = reference.run_on_tape(emulated_tape("float32", direct_chooser=staged_channels(None)), geom, inputs, grad)
    got = reference.run_on_tape(emulated_tape("float32", direct_chooser=staged_channels(8)), geom, inputs, grad)
    for a, b in zip([got[0], *got[1]], [expected[0], *expected[1]], strict=True):
        np.testing.assert_array_equal(a, b)
    check(geom, "float32", direct_chooser=staged_channels(8))


@pytest.mark.parametrize("geom, blocks", [
    (DIRECT_GEOMETRIES[4], 3),  # 2 groups of 3 input channels: a block per channel
    (Geometry.build(Family.CONV, 4, 3, (4, 5, 4, 6), (3, 3, 3, 3), (1, 1, 1, 1), (1, 1, 1, 1), batch=2), 2),
    (DIRECT_GEOMETRIES[10], 2),  # the transpose's U: 2 output channels a group
], ids=["conv-3d", "conv-4d", "transpose"])
def test_direct_weight_channel_blocks_give_the_one_block_bits(geom: Geometry, blocks: int) -> None:
    """A group's U channels shared by several blocks (each staging its own channels' halo): every weight's sum runs
    in the same order as in one block, so the weight gradient is the one-block kernel's bit for bit, and the CPU
    tape's within the tolerance."""
    one, shared = (plan(geom, direct_chooser=weight_channel_blocks(b)) for b in (1, blocks))
    assert (one.defines["BWW_DIRECT_CHANNEL_BLOCKS"], shared.defines["BWW_DIRECT_CHANNEL_BLOCKS"]) == (1, blocks)
    assert shared.launches["backward_weight"].grid == blocks * one.launches["backward_weight"].grid
    rng = reference.case_rng("emulated weight channel blocks", geom)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = reference.run_on_tape(emulated_tape("float32", direct_chooser=weight_channel_blocks(1)), geom, inputs,
                                     grad)
    got = reference.run_on_tape(emulated_tape("float32", direct_chooser=weight_channel_blocks(blocks)), geom, inputs,
                                grad)
    np.testing.assert_array_equal(got[1][0], expected[1][0])
    check(geom, "float32", direct_chooser=weight_channel_blocks(blocks))


def test_few_channel_stages_take_the_direct_kernels_in_every_precision() -> None:
    """At <= 8 channels and windows of >= 27 offsets the plans of "high" and "medium" run every GEMM stage on its
    FMA direct kernel, as "highest"'s do, and the results are "highest"'s bit for bit (the sources differ in
    MMA_MODE only)."""
    geom = Geometry.build(Family.CONV, 4, 6, (6, 5, 6), (3, 3, 3), (1, 1, 1), (1, 1, 1), dilation=(1, 1, 2), batch=2)
    rng = reference.case_rng("emulated few channels")
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = reference.run_on_tape(emulated_tape("float32"), geom, inputs, grad)
    for precision in ("high", "medium"):
        launches = plan(geom, precision=precision).launches
        assert all(launches[stage].kernel == f"{stage}_direct"
                   for stage in ("forward", "backward_input", "backward_weight")), precision
        got = reference.run_on_tape(emulated_tape("float32", precision=precision), geom, inputs, grad)
        for a, b in zip([got[0], *got[1]], [expected[0], *expected[1]], strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_stage_of_few_source_channels_multiplies_with_fmas_in_every_precision() -> None:
    """3 source channels: in "high" and "medium" the forward runs its GEMM with FMAs on "highest"'s tile, so its
    output is "highest"'s bit for bit, while the input gradient keeps the tensor cores and every gradient its bound
    (the weight gradient, of 16 D channels, runs the direct kernel's FMAs)."""
    geom = Geometry.build(Family.CONV, 3, 16, (9, 8), (3, 3), (2, 1), (1, 1), batch=2)
    rng = reference.case_rng("emulated few source channels")
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = reference.run_on_tape(emulated_tape("float32"), geom, inputs, grad)
    fma = relative_errors(geom, emulated_tape("float32"), inputs, grad)
    for precision in ("high", "medium"):
        defines = plan(geom, precision=precision).defines
        assert (defines["FWD_MMA"], defines["BWI_MMA"]) == (0, defines["MMA_MODE"]), precision
        assert plan(geom, precision=precision).launches["backward_weight"].kernel == "backward_weight_direct"
        got = reference.run_on_tape(emulated_tape("float32", precision=precision), geom, inputs, grad)
        np.testing.assert_array_equal(got[0], expected[0])
        errors = relative_errors(geom, emulated_tape("float32", precision=precision), inputs, grad)
        for name, f, e in zip(("output", "dkernel", "dbias", "dinput"), fma, errors, strict=True):
            assert e <= (high_bound(f) if precision == "high" else TF32_BOUND), f"{precision} {name}: {e:.3g}"


def test_circular_padding_pads_and_folds() -> None:
    geom = Geometry.build(Family.CONV, 3, 4, (5, 6), (3, 2), (1, 2), (2, 1), batch=2, circular=True)
    check(geom, "float32")




def relative_errors(geom: Geometry, tape: CudaTape, inputs, grad) -> list[float]:
    """‖got − ref‖ / ‖ref on |inputs|‖ of the output and each gradient, the reference the float64 CPU tape."""
    wide = [a.astype(np.float64) for a in inputs]
    ref = reference.run_on_tape(CpuTape(dtype="float64"), geom, wide, grad.astype(np.float64))
    ref_abs = reference.run_on_tape(CpuTape(dtype="float64"), geom, [np.abs(a) for a in wide],
                                    np.abs(grad).astype(np.float64))
    got = reference.run_on_tape(tape, geom, inputs, grad)
    errors = []
    for g, r, a in zip([got[0], *got[1]], [ref[0], *ref[1]], [ref_abs[0], *ref_abs[1]], strict=True):
        scale = np.linalg.norm(a)
        errors.append(float(np.linalg.norm(np.asarray(g, np.float64) - r) / scale) if scale else 0.0)
    return errors


@pytest.mark.parametrize("tile", MMA_FORCED_TILES[:3], ids=lambda t: "x".join(map(str, t)))
def test_tensor_core_precisions_on_forced_mma_tiles(tile) -> None:
    """Every stage of a conv and a transpose on forced tensor-core tiles, "high" and "medium", against the
    float64 reference with issue 11's bounds; the FMA path at its planned tiles gives the reference error. A stage
    of fewer than 8 source channels (the first conv's input gradient: 6) multiplies with FMAs (stage_mma)."""
    rng = reference.case_rng("emulated precision", tile)
    for geom in (FORCED_GEOMETRY[0], FORCED_GEOMETRY[2], Geometry.build(Family.CONV, 9, 12, (7, 6), (3, 3), (1, 2),
                                                                         (1, 1), batch=2)):
        defines = plan(geom, precision="medium").defines
        tensor_cores = {"output": defines["FWD_MMA"], "dkernel": defines["BWW_MMA"], "dinput": defines["BWI_MMA"]}
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        fma = relative_errors(geom, emulated_tape("float32"), inputs, grad)
        high = relative_errors(geom, emulated_tape("float32", tile, "high"), inputs, grad)
        medium = relative_errors(geom, emulated_tape("float32", tile, "medium"), inputs, grad)
        for name, f, h, m in zip(("output", "dkernel", "dbias", "dinput"), fma, high, medium, strict=True):
            assert m <= TF32_BOUND, f"{geom}: {name}: TF32 relative error {m:.3g}"
            assert h <= high_bound(f), f"{geom}: {name}: 3xTF32 {h:.3g}, FMA {f:.3g}"
            if tensor_cores.get(name):  # the bias gradient is a plain sum in every precision
                assert m > 4 * FLOAT32_UNIT, f"{geom}: {name}: TF32 error {m:.3g} is float32's: no tensor core ran"


# The cp.async pipeline (the plans' own tiles): a dilated conv whose forward's 40 rows fill part of a 64-row
# block and whose input gradient's 40 source channels end in a part slice, and a grouped stride-1 transpose
# (its forward the plain gather).
PIPELINE_GEOMETRIES = [
    Geometry.build(Family.CONV, 32, 40, (7, 6), (3, 3), (1, 1), (2, 1), dilation=(2, 1), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 64, 64, (5, 4), (3, 2), (1, 1), (1, 0), groups=2, batch=2),
]


def test_cp_async_pipeline_keeps_the_tensor_core_bounds() -> None:
    """Both conv-shaped stages of each geometry through the cp.async pipeline, "high" and "medium", against the
    float64 reference with issue 11's bounds."""
    rng = reference.case_rng("emulated pipeline")
    for geom in PIPELINE_GEOMETRIES:
        for precision in ("high", "medium"):
            stages = plan(geom, precision=precision).defines
            assert stages["FWD_STAGES"] > 2 and stages["BWI_STAGES"] > 2 and stages["BWW_STAGES"] == 2, geom
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        fma = relative_errors(geom, emulated_tape("float32"), inputs, grad)
        high = relative_errors(geom, emulated_tape("float32", precision="high"), inputs, grad)
        medium = relative_errors(geom, emulated_tape("float32", precision="medium"), inputs, grad)
        for name, f, h, m in zip(("output", "dkernel", "dbias", "dinput"), fma, high, medium, strict=True):
            assert m <= TF32_BOUND, f"{geom}: {name}: TF32 relative error {m:.3g}"
            assert h <= high_bound(f), f"{geom}: {name}: 3xTF32 {h:.3g}, FMA {f:.3g}"


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_cp_async_pipeline_sends_non_finite_blocks_down_the_rare_path(precision) -> None:
    """An inf and a NaN in the weight next to padding, a -inf in the upstream gradient, an inf in the input:
    the pipeline's blocks whose accumulators end non-finite run their slices again on the masked FMA path,
    and exactly the cells the CPU tape makes non-finite are, with the same signs."""
    geom = Geometry.build(Family.CONV, 32, 32, (9, 8), (3, 3), (1, 1), (1, 1), batch=2)
    assert plan(geom, precision=precision).defines["FWD_STAGES"] > 2
    rng = reference.case_rng("emulated pipeline non-finite", precision)
    weight, bias, x = reference.draw_inputs(rng, geom)
    grad = reference.draw_grad(rng, geom)
    weight[1, 3, 0, 0], weight[4, 5, 2, 1] = np.inf, np.nan
    grad[1, 2, 0, 0], x[0, 1, 4, 4] = -np.inf, np.inf
    got_output, got_grads = reference.run_on_tape(emulated_tape("float32", precision=precision), geom,
                                                  [weight, bias, x], grad)
    ref_output, ref_grads = reference.run_on_tape(CpuTape(), geom, [weight, bias, x], grad)
    for got, ref in zip([got_output, *got_grads], [ref_output, *ref_grads], strict=True):
        assert_same_non_finite(np.asarray(got), ref, 1e-2)


def test_fma_pipeline_gives_the_register_loop_results_bit_for_bit() -> None:
    """fp32 FMA conv stages forced into the cp.async pipeline (three slices) against the same tile staged through
    registers: the same products in the same order, so the same bits, an inf and a NaN in the weight next to
    padding included (the pipeline's blocks take the rare path afterwards); a strided conv's input gradient in
    phases stays in the register loop."""
    rng = reference.case_rng("emulated fma pipeline")
    for geom in (PIPELINE_GEOMETRIES[0], Geometry.build(Family.CONV, 16, 24, (9, 8), (3, 3), (2, 1), (1, 1), batch=2)):
        weight, bias, x = reference.draw_inputs(rng, geom)
        weight[1, 3, 0, 0], weight[4, 5, 2, 1] = np.inf, np.nan
        grad = reference.draw_grad(rng, geom)
        tiles = [(64, 64, 4, 4, 1, True, False, stages) for stages in (2, 3)]
        assert [plan(geom, choose_tile=forced_chooser(*tile)).defines["FWD_STAGES"] for tile in tiles] == [2, 3]
        runs = [reference.run_on_tape(emulated_tape("float32", tile), geom, [weight, bias, x], grad) for tile in tiles]
        for registers, pipelined in zip([runs[0][0], *runs[0][1]], [runs[1][0], *runs[1][1]], strict=True):
            assert np.array_equal(np.asarray(registers), np.asarray(pipelined), equal_nan=True), geom


# 16-bit cases: a grouped, dilated conv whose weight is repacked and a strided transpose with output
# padding, each with channels for whole k steps of 16 (the 16-bit mma, MMA_MODE 2) and with too few (the
# TF32 mma on widened values); a circular conv, and each pool (smooth max's pivots and sums are float32
# arrays between its kernels).
HALF_MMA_GEOMETRIES = [
    Geometry.build(Family.CONV, 16, 32, (6, 5), (3, 2), (1, 2), (1, 0), dilation=(2, 1), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 32, 16, (4, 3), (3, 3), (2, 2), (1, 1), batch=2, output_padding=(1, 0)),
]
HALF_GEOMETRIES = [
    *HALF_MMA_GEOMETRIES,
    GROUPED,
    Geometry.build(Family.CONV_TRANSPOSE, 6, 4, (4, 5), (3, 2), (2, 2), (1, 0), batch=2, output_padding=(1, 0)),
    Geometry.build(Family.CONV, 3, 4, (5, 6), (3, 2), (1, 2), (2, 1), batch=2, circular=True),
    Geometry.build(Family.MAX_POOL, 3, 3, (7, 9), (3, 2), (2, 1), (1, 1), batch=2),
    Geometry.build(Family.AVG_POOL, 3, 3, (7, 9), (3, 3), (2, 2), (1, 1)),
    Geometry.build(Family.SMOOTH_MAX_POOL, 3, 3, (7, 9), (2, 3), (1, 2), (1, 1), 1.5, batch=2),
]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_16_bit_elements_are_read_and_written_in_16_bits_and_summed_in_float32(dtype) -> None:
    """Every stage of each family on float16 or bfloat16 arrays (FMAs and, for the convolutions, TF32
    tensor cores, which hold 16-bit values exactly) within issue 11's 1e-2 of the float64 reference;
    results come back in the 16-bit dtype (half_support.widened checks)."""
    rng = reference.case_rng("emulated 16-bit", dtype)
    modes = {plan(geom, dtype=dtype, precision="medium").defines["MMA_MODE"] for geom in HALF_GEOMETRIES[:4]}
    assert modes == {1, 2}  # both tensor-core paths of 16-bit elements run below
    for geom in HALF_GEOMETRIES:
        inputs, grad = draw_half(rng, geom, dtype)
        for precision in ("highest", "medium") if geom.family.is_conv else ("highest",):
            backend = type("EmulatedBackend", (CupyBackend,), {"poison_outputs": True})
            with imports_as(emulated_cupy()):
                errors = half_errors(backend(dtype, precision), geom, inputs, grad)
            assert max(errors) <= HALF_BOUND, f"{geom} {precision}: {errors}"



@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_16_bit_non_finite_values_take_the_rare_path(dtype) -> None:
    """An inf and a NaN in a 16-bit weight, a -inf in the upstream gradient: the 16-bit mma's slices go
    down the masked path (which reads the k-paired staging), and exactly the cells the float64 CPU tape
    makes non-finite are, with the same signs."""
    geom = Geometry.build(Family.CONV, 16, 16, (9, 8), (3, 3), (2, 1), (1, 1), batch=2)
    assert plan(geom, dtype=dtype, precision="medium").defines["MMA_MODE"] == 2
    rng = reference.case_rng("emulated 16-bit non-finite", dtype)
    (weight, bias, x), grad = draw_half(rng, geom, dtype)
    infinity, nan, minus_infinity = stored(np.array([np.inf, np.nan, -np.inf], np.float32), dtype)
    weight[1, 3, 0, 0], weight[4, 5, 2, 1], grad[1, 2, 0, 0] = infinity, nan, minus_infinity
    backend = type("EmulatedBackend", (CupyBackend,), {"poison_outputs": True})
    with imports_as(emulated_cupy()):
        got = run_backend(backend(dtype, "medium"), geom, (weight, bias, x), grad)
    wide = [widened(a, dtype) for a in (weight, bias, x)]
    ref_output, ref_grads = reference.run_on_tape(CpuTape(dtype="float64"), geom, wide, widened(grad, dtype))
    for got_array, ref in zip(got, [ref_output, *ref_grads], strict=True):
        assert_same_non_finite(widened(got_array, dtype).reshape(np.shape(ref)), np.asarray(ref), 1e-2)
