"""The CUDA tape (`pytest -m cuda`, skipped without CuPy or a GPU) held to the CPU tape and, for
ranks 1..3, to PyTorch's CUDA ops: random geometry of every family at every rank (forward and every
gradient), the same Results on degenerate and rejected calls, bit-identical gradients run after run.
Every output is poisoned with NaN before its kernel runs (the backend's `poison_outputs` hook), so
an element a kernel forgets to write fails the comparison. Each distinct geometry costs one NVRTC
compile, so sizes stay small and cases few.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference
from convgen import cuda_launch
from convgen.cuda_launch import H200, plan
from convgen.direct_model import no_direct
from convgen.geometry import Family, Geometry
from cuda_support import (
    CASES_PER_RANK,
    RANKS,
    G,
    GemmTape,
    PoisonTape,
    _has_gpu,
    assert_close_to,
    check_against_cpu,
    check_against_torch_cuda,
    cupy,
    forced_chooser,
    forced_tape,
    recorded,
    run,
    same_error,
)
from forced_tiles import FORCED_GEOMETRY, FORCED_TILES

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

import convgen.cpu  # noqa: E402  (after the skip: convgen.cuda needs CuPy only once a tape is made)
import convgen.cuda  # noqa: E402


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_random_geometry_matches_cpu_tape(family: Family, rank: int) -> None:
    rng = reference.case_rng("cuda", family.value, rank)
    for case in range(CASES_PER_RANK):
        geom = reference.random_geometry(rng, family, rank, allow_empty=case == CASES_PER_RANK - 1, budget=300)
        check_against_cpu(geom, rng)


def test_planned_tiles_and_splits() -> None:
    """Geometries whose plans split a reduction over blocks (forward, backward_input and weight
    gradient) and take wide tiles; the small random cases mostly run one slice. GEMMs only: the direct
    kernel of few channels would take the forwards of 24 and 16 channels."""
    rng = reference.case_rng("tiles")
    cases = {
        Geometry.build(Family.CONV, 1, 1, (300, 300), (3, 3), (1, 1), (1, 1)): ("backward_weight",),
        Geometry.build(Family.CONV, 40, 24, (9, 9), (3, 3), (1, 1), (1, 1)): ("forward", "backward_input"),
        Geometry.build(Family.CONV, 3, 16, (64, 64), (7, 7), (2, 2), (3, 3)): ("forward", "backward_weight"),
        Geometry.build(Family.CONV_TRANSPOSE, 16, 8, (92, 92), (3, 2), (2, 1), (1, 0)): ("backward_weight",),
    }
    for geom, split_stages in cases.items():
        splits = plan(geom, direct_chooser=no_direct).splits
        assert all(splits[stage] > 1 for stage in split_stages), (geom, splits)
        check_against_cpu(geom, rng, GemmTape)


@pytest.mark.parametrize("tile", FORCED_TILES, ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}".format(*t))
def test_every_gemm_tile_shape(tile) -> None:
    tape_class = forced_tape(tile)
    rng = reference.case_rng("forced", tile)
    for geom in FORCED_GEOMETRY:
        defines = plan(geom, H200, forced_chooser(*tile)).defines
        gather = "FWD" if geom.family is Family.CONV_TRANSPOSE else "BWI"
        assert (defines["FWD_BN"], defines[f"{gather}_PACKED"]) == (tile[1], tile[5])
        check_against_cpu(geom, rng, tape_class)


# The stride-phase decomposition of the gather-form stages (conv backward_input, transpose forward):
# strides 2 and 3, mixed per axis, kernels smaller than the stride on an axis (phases with no
# window offset, whose cells get 0 or the bias), extents that the stride does not divide, several
# source-channel blocks (the slice cursor's carry), ranks 1..4.
PHASE_GEOMETRY = [
    Geometry.build(Family.CONV, 3, 5, (11,), (3,), (2,), (1,)),
    Geometry.build(Family.CONV_TRANSPOSE, 4, 3, (7,), (2,), (3,), (0,)),
    Geometry.build(Family.CONV, 4, 3, (9, 8), (3, 3), (2, 3), (1, 1)),
    Geometry.build(Family.CONV, 3, 20, (10, 7), (2, 5), (3, 2), (0, 2)),
    Geometry.build(Family.CONV_TRANSPOSE, 3, 4, (5, 6), (3, 1), (2, 3), (1, 0)),
    Geometry.build(Family.CONV_TRANSPOSE, 20, 3, (4, 3, 5), (3, 2, 4), (2, 3, 2), (1, 0, 2)),
    Geometry.build(Family.CONV, 3, 2, (5, 6, 4, 5), (3, 2, 3, 1), (2, 1, 3, 2), (1, 1, 0, 0)),
    Geometry.build(Family.CONV_TRANSPOSE, 2, 2, (3, 4, 3, 2), (2, 3, 1, 2), (3, 2, 2, 1), (0, 1, 0, 1)),
]


@pytest.mark.parametrize("geom", PHASE_GEOMETRY, ids=lambda g: f"{g.family.value}_s{'x'.join(map(str, g.stride))}")
def test_stride_phases(geom: Geometry) -> None:
    stage = "backward_input" if geom.family is Family.CONV else "forward"
    shape = cuda_launch.gemm_shapes(geom)[stage]
    assert shape.phases == math.prod(geom.stride) > 1
    check_against_cpu(geom, reference.case_rng("phases", geom))


@pytest.mark.parametrize("tile", [(4, 256, 4, 4, 1, False), (16, 64, 1, 4, 5, True), (8, 64, 2, 8, 2, False)],
                         ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}".format(*t))
def test_stride_phases_forced_tiles(tile) -> None:
    """Several B columns or rows per thread, scalar and vector fragments, splits that leave some
    phases' runs empty (their slice counts differ), and the phases' window offsets in a packed A."""
    tape_class = forced_tape(tile)
    rng = reference.case_rng("phases forced", tile)
    for geom in PHASE_GEOMETRY[2:6]:
        check_against_cpu(geom, rng, tape_class)


def test_pool_offset_widths_and_long_rows() -> None:
    """Max pool saves its window offsets as uint8, uint16 or uint32 by the window size; rows of
    the window longer than the register segment are streamed; V = 1, 2, 4 cells per thread."""
    rng = reference.case_rng("pool widths")
    cases = {
        G(Family.MAX_POOL, 2, 2, (20, 37), (17, 16), (1, 1), (8, 8)): "uint16",
        G(Family.MAX_POOL, 1, 1, (65539,), (65536,), (1,), (0,)): "uint32",
        G(Family.MAX_POOL, 3, 3, (9, 7, 16), (3, 3, 3), (2, 1, 2), (1, 1, 1)): "uint8",
        G(Family.AVG_POOL, 2, 2, (101,), (50,), (3,), (25,)): None,
        G(Family.AVG_POOL, 2, 2, (6, 33), (3, 5), (2, 3), (1, 2)): None,
        G(Family.SMOOTH_MAX_POOL, 2, 2, (5, 150), (3, 70), (1, 2), (1, 30), -0.7): None,
        G(Family.SMOOTH_MAX_POOL, 2, 2, (6, 41), (3, 20), (1, 11), (1, 10), 0.7): None,
    }
    for geom, dtype in cases.items():
        if dtype is not None:
            assert plan(geom).argmax_dtype == dtype
        check_against_cpu(geom, rng)


# PyTorch on the GPU, ranks 1..3 (it has no smooth max pool).

@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("family", [f for f in Family if f is not Family.SMOOTH_MAX_POOL], ids=lambda f: f.value)
def test_random_geometry_matches_torch_cuda(family: Family, rank: int) -> None:
    rng = reference.case_rng("torch", family.value, rank)
    check_against_torch_cuda(lambda rng: reference.random_geometry(rng, family, rank, budget=300), rng, 2)


# Degenerate geometry and rejected calls: the same Result on both tapes (ok-ness, error text).

DEGENERATE = {
    "conv empty input axis": G(Family.CONV, 2, 3, (0, 3), (2, 2), (1, 1), (1, 1)),
    "conv no input channels": G(Family.CONV, 0, 2, (3, 2), (2, 1), (1, 1), (0, 0)),
    "conv no output channels": G(Family.CONV, 2, 0, (3, 2), (2, 1), (1, 1), (0, 0)),
    "conv kernel larger than padded input": G(Family.CONV, 1, 2, (2, 3), (5, 2), (1, 1), (1, 0)),
    "conv padding beyond the kernel": G(Family.CONV, 1, 1, (1,), (1,), (1,), (2,)),
    "conv transpose no input channels": G(Family.CONV_TRANSPOSE, 0, 2, (2, 2), (2, 2), (2, 1), (0, 0)),
    "conv transpose padding eats the output": G(Family.CONV_TRANSPOSE, 1, 1, (1,), (2,), (1,), (1,)),
    "conv transpose empty input axis": G(Family.CONV_TRANSPOSE, 1, 1, (0, 2), (2, 2), (1, 1), (0, 0)),
    "max pool padding over half the kernel": G(Family.MAX_POOL, 1, 1, (4,), (2,), (1,), (2,)),
    "max pool window beyond input": G(Family.MAX_POOL, 2, 2, (1, 2), (3, 3), (1, 2), (1, 1)),
    "avg pool no channels": G(Family.AVG_POOL, 0, 0, (3, 3), (2, 2), (1, 1), (0, 0)),
    "smooth max pool padded zeros": G(Family.SMOOTH_MAX_POOL, 2, 2, (2, 3), (3, 3), (1, 1), (1, 1), -0.75),
}


@pytest.mark.parametrize("geom", list(DEGENERATE.values()), ids=list(DEGENERATE))
def test_degenerate_geometry_gives_the_cpu_result(geom: Geometry) -> None:
    rng = reference.case_rng("degenerate", geom)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = recorded(convgen.cpu.Tape(), geom, inputs)[2]
    if not expected.is_ok():  # e.g. in_c = 0, which the conv signatures reject
        got = recorded(convgen.cuda.Tape(), geom, inputs)[2]
        assert not got.is_ok() and same_error(got, expected), (got, expected)
        return
    got = run(PoisonTape(), geom, inputs, grad, repeat=2)
    ref = run(convgen.cpu.Tape(), geom, inputs, grad)
    ref_abs = run(convgen.cpu.Tape(), geom, [np.abs(a) for a in inputs], np.abs(grad))
    assert_close_to(geom, got, ref, ref_abs)


POOL = dict(c=1, in_spatial=(3, 3), kernel=(2, 2), stride=(1, 1), padding=(0, 0))
CONV = dict(in_c=1, out_c=2, kernel=(2, 2), stride=(1, 1), padding=(0, 0), in_spatial=(3, 3))
# Calls on a tape holding kernel [2,1,2,2], bias [2], input [1,3,3] and a 5-element flat buffer
# recorded as [1,2,2] (ids 0..3).
REJECTED = {
    "beta nan": lambda t: t.smooth_max_pool(2, float("nan"), **POOL),
    "beta zero in float32": lambda t: t.smooth_max_pool2d(2, 1e-300, k_h=2, k_w=2, in_h=3, in_w=3, in_c=1, stride=1),
    "zero stride": lambda t: t.conv(0, 1, 2, **dict(CONV, stride=(1, 0))),
    "rank too large": lambda t: t.max_pool(2, c=1, in_spatial=(1,) * 9, kernel=(1,) * 9, stride=(1,) * 9,
                                           padding=(0,) * 9),
    "zero kernel": lambda t: t.avg_pool(2, **dict(POOL, kernel=(2, 0))),
    "invalid id": lambda t: t.conv2d(0, 1, 7, in_c=1, out_c=2, k_h=2, k_w=2, stride=1, padding=0, in_h=3, in_w=3),
    "shape mismatch": lambda t: t.conv(1, 0, 2, **CONV),
    "buffer size mismatch": lambda t: t.max_pool(3, c=1, in_spatial=(2, 2), kernel=(1, 1), stride=(1, 1),
                                                 padding=(0, 0)),
    "tensor too large": lambda t: t.conv(0, 1, 2, **dict(CONV, padding=(0, 2**31))),
}


def _rejection_tape(tape):
    rng = reference.case_rng("rejected")
    for shape in ((2, 1, 2, 2), (2,), (1, 3, 3)):
        tape, _ = tape.leaf(reference.draw(rng, shape))
    tape, _ = tape.leaf(reference.draw(rng, (5,)), shape=(1, 2, 2))
    return tape


@pytest.mark.parametrize("call", list(REJECTED.values()), ids=list(REJECTED))
def test_rejections_give_the_cpu_result(call) -> None:
    got, expected = call(_rejection_tape(convgen.cuda.Tape())), call(_rejection_tape(convgen.cpu.Tape()))
    assert not expected.is_ok()
    assert not got.is_ok() and same_error(got, expected), (got, expected)


# Values the CPU tape pins exactly.

@pytest.mark.parametrize("name", reference.SPECIAL_CASES)
def test_special_values_follow_semantics(name: str) -> None:
    """0 · inf, inf beside padding: the same IEEE results as the CPU tape (SEMANTICS §3-§4)."""
    case = reference.SPECIAL_CASES[name]
    out, grads = run(PoisonTape(), case.geom, case.inputs, case.grad)
    np.testing.assert_array_equal(out, case.output)
    for got, expected in zip(grads, case.grads, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("family", [Family.CONV, Family.CONV_TRANSPOSE], ids=lambda f: f.value)
def test_nonfinite_weights_and_gradients_skip_padding(family: Family) -> None:
    """An inf or NaN in a slice's A operand (weights; the upstream gradient, or the input of a
    transpose, in the weight gradient) that is not the block's first slice, in a split stage and a
    batch: products with padding are skipped, so exactly the cells the CPU tape makes nonfinite are."""
    rng = reference.case_rng("nonfinite", family.value)
    geom = G(family, 20, 6, (9, 8), (3, 3), (2, 1), (1, 1), batch=2)
    weight, bias, x = reference.draw_inputs(rng, geom)
    grad = reference.draw_grad(rng, geom)
    weight[1, 3, 0, 0], weight[4, 5, 2, 1] = np.inf, np.nan  # slices 0 and 7 of the forward
    (x if family is Family.CONV_TRANSPOSE else grad)[1, 2, 0, 0] = -np.inf
    got = run(PoisonTape(), geom, [weight, bias, x], grad, repeat=2)
    ref = run(convgen.cpu.Tape(), geom, [weight, bias, x], grad)
    for g, r in zip([got[0], *got[1]], [ref[0], *ref[1]], strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
        np.testing.assert_array_equal(np.isinf(g) * np.sign(g), np.isinf(r) * np.sign(r))
        finite = np.isfinite(r)
        np.testing.assert_allclose(g[finite], r[finite], rtol=1e-4, atol=1e-4)


def test_smooth_max_never_forms_beta_times_x() -> None:
    for beta, expected_grad in ((1e20, [1, 0]), (-1e20, [0, 1])):
        geom = G(Family.SMOOTH_MAX_POOL, 1, 1, (2,), (2,), (1,), (0,), beta)
        out, (d_x,) = run(PoisonTape(), geom, [np.array([[1e20, -1e20]], np.float32)], np.ones((1, 1), np.float32))
        np.testing.assert_array_equal(out, [[np.float32(np.sign(beta) * 1e20)]])
        np.testing.assert_array_equal(d_x, [expected_grad])


def test_max_pool_nan_and_ties_follow_the_cpu_tape() -> None:
    geom = G(Family.MAX_POOL, 2, 2, (5, 4), (3, 2), (1, 1), (1, 0))
    x = np.round(reference.case_rng("nan").standard_normal((2, 5, 4))).astype(np.float32)  # many ties
    x[0, 0, 0] = x[1, 2, 1] = np.nan
    grad = reference.case_rng("nan grad").standard_normal(geom.output_shape).astype(np.float32)
    got = run(PoisonTape(), geom, [x], grad)
    expected = run(convgen.cpu.Tape(), geom, [x], grad)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1][0], expected[1][0], rtol=1e-6, atol=1e-6)


def test_out_of_memory_names_the_op_and_the_bytes() -> None:
    """An allocation CuPy's allocator refuses, an output's or a scratch buffer's, is the op's error."""

    def serving(count):  # an allocator that serves `count` allocations, then refuses
        served = []

        def allocate(size):
            if len(served) == count:
                raise cupy.cuda.memory.OutOfMemoryError(size, 0)
            served.append(cupy.get_default_memory_pool().malloc(size))
            return served[-1]

        return allocate

    tape, ids = _rejection_tape(convgen.cuda.Tape()), (0, 1, 2)
    pool_tape, x = convgen.cuda.Tape().leaf(np.zeros((1, 4, 4), np.float32))
    pool = dict(c=1, in_spatial=(4, 4), kernel=(2, 2), stride=(2, 2), padding=(0, 0))
    results = []
    for tape_call, count in ((lambda: tape.conv(*ids, **CONV), 0), (lambda: pool_tape.max_pool(x, **pool), 0),
                             (lambda: pool_tape.max_pool(x, **pool), 1)):  # the output served, its argmax refused
        cupy.cuda.set_allocator(serving(count))
        try:
            results.append(tape_call().error)
        finally:
            cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    assert results == ["autograd: cuda: conv: out of memory (needs 0.0 GiB)",
                       "autograd: cuda: max_pool: out of memory (needs 0.0 GiB)",
                       "autograd: cuda: max_pool: out of memory (needs 0.0 GiB)"]


def test_hardware_comes_from_the_device() -> None:
    device = cupy.cuda.Device()
    hardware = convgen.cuda.device_hardware(device.attributes, device.compute_capability)
    assert hardware.sm_count == device.attributes["MultiProcessorCount"]
    assert hardware.shared_per_block == 48 * 1024
    assert hardware.wgmma is (device.compute_capability == "90")


def test_device_float32_input_is_taken_without_a_copy() -> None:
    value = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    tape, node = convgen.cuda.Tape().leaf(value)
    assert tape.value(node).data.ptr == value.data.ptr
    tape, node = tape.leaf(value.astype(cupy.float64))
    assert tape.value(node).dtype == cupy.float32


def test_device_and_host_values_that_are_not_real_numbers_are_refused() -> None:
    """The CUDA tape's store refuses what the CPU tape's does, a device array of complex numbers included (CuPy, like
    NumPy, would drop the imaginary part)."""
    for value, shown, what in ((cupy.asarray(np.array([1 + 2j], np.complex64)), "array([1.+2.j], dtype=complex64)",
                                "complex numbers"), (["1", "2"], "['1', '2']", "strings")):
        with pytest.raises(TypeError) as caught:
            convgen.cuda.Tape().leaf(value)
        assert str(caught.value) == (f"autograd: cuda: leaf: value must be numbers (an array, a nested sequence or a "
                                     f"scalar), got {shown}: {what} are not real numbers")


def test_host_values_past_float32s_range_are_stored_as_infinities_without_a_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tape, node = convgen.cuda.Tape().leaf(np.array([1e300, -1e300, 1.0]))
    np.testing.assert_array_equal(cupy.asnumpy(tape.value(node)), np.array([np.inf, -np.inf, 1.0], np.float32))


def test_ops_launch_on_a_thread_that_made_no_cuda_call() -> None:
    """Kernels launch through the driver, which needs a CUDA context bound to the calling thread. A new thread
    can reach its first launch without one (its input was made elsewhere, its outputs come from CuPy's pool),
    and gets one: its results are the main thread's, bit for bit."""
    import threading

    rng = np.random.default_rng(7)
    weight, bias, x = (cupy.asarray(rng.standard_normal(shape, dtype=np.float32))
                       for shape in ((4, 3, 3, 3), (4,), (3, 8, 8)))

    def run_conv() -> tuple:
        tape = convgen.cuda.Tape()
        ids = []
        for value in (weight, bias, x):
            tape, node = tape.leaf(value)
            ids.append(node)
        tape, y = tape.conv2d(*ids, in_c=3, out_c=4, k_h=3, k_w=3, stride=1, padding=1, in_h=8, in_w=8).unwrap()
        grads = tape.backward(y, cupy.asarray(np.ones(tape.shape(y), np.float32))).unwrap()
        return tuple(cupy.asnumpy(a) for a in (tape.value(y), *(grads[i] for i in ids)))

    expected = run_conv()
    got: list = []
    thread = threading.Thread(target=lambda: got.append(run_conv()))
    thread.start()
    thread.join()
    assert len(got) == 1 and all(np.array_equal(a, b) for a, b in zip(got[0], expected, strict=True))
