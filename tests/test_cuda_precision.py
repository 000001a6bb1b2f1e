"""The tensor-core precisions on the GPU (`pytest -m cuda`): "high" (3xTF32) and "medium" (TF32) on
every conv family at ranks 1..8 (random §8 geometries: batch, groups, dilation, stride phases, circular
and output padding) against the float64 CPU tape, with issue 11's bounds: 3xTF32 within 2x of the FMA
path's error measured in the same test, TF32 within 1e-3 relative; the `_wgmma` kernels and the cp.async
pipeline at ranks 1..8, the pipeline also on forced tiles; forced tensor-core tiles; non-finite values;
bit-identical results run after run; and the stages of few channels, which take the FMA direct kernels in every
precision, bit for bit the FMA path's results. The tests of the tensor cores keep every stage off the direct
kernels, so that their random geometries of few channels reach the tensor cores too."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from convgen.cuda_launch import plan
from convgen.direct_model import no_direct
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import no_wgmma
from cuda_support import RANKS, PoisonBackend, PoisonTape, _has_gpu, forced_tape, run
from forced_tiles import FORCED_GEOMETRY, MMA_FORCED_TILES, PIPELINE_FORCED_TILES, tensor_core_geometry
from precision_bounds import TF32_BOUND, high_bound

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

import convgen.cpu  # noqa: E402  (after the skip)
import convgen.cuda  # noqa: E402
import cupy  # noqa: E402

CONV_FAMILIES = (Family.CONV, Family.CONV_TRANSPOSE)
TENSOR_CORE_PRECISIONS = ("high", "medium")
CASES_PER_RANK = 3


def relative_errors(got, ref, ref_abs) -> list[float]:
    """‖got − ref‖ / ‖ref_abs‖ of the output and each gradient (0 where there is nothing to compare)."""
    errors = []
    for g, r, a in zip([got[0], *got[1]], [ref[0], *ref[1]], [ref_abs[0], *ref_abs[1]], strict=True):
        scale = np.linalg.norm(a)
        errors.append(float(np.linalg.norm(np.asarray(g, np.float64) - r) / scale) if scale else 0.0)
    return errors


def deterministic_run(tape_class, geom: Geometry, inputs, grad):
    """The op on a `tape_class` tape twice, forward and backward (the backward itself twice: `run`):
    every result bit-identical between the runs (SEMANTICS §4 in every precision)."""
    first = run(tape_class(), geom, inputs, grad, repeat=2)
    second = run(tape_class(), geom, inputs, grad)
    for a, b in zip([first[0], *first[1]], [second[0], *second[1]], strict=True):
        assert np.array_equal(a, b, equal_nan=True), f"{geom}: two runs differ"
    return first


class TensorCoreBackend(PoisonBackend):
    """Every GEMM stage on the tensor cores in the TF32 precisions: no FMA direct kernel."""

    direct_chooser = staticmethod(no_direct)


class GemmOnlyBackend(TensorCoreBackend):
    """The conv-shaped stages on their GEMMs, not the `_wgmma` kernels (the cp.async pipeline's tests)."""

    wgmma_chooser = staticmethod(no_wgmma)


def precision_tape(precision: str, wgmma: bool = True) -> type:
    class Tape(PoisonTape):
        backend_class = TensorCoreBackend if wgmma else GemmOnlyBackend

        def __init__(self) -> None:
            super().__init__(precision=precision)

    return Tape


def check_precisions(geom: Geometry, rng: np.random.Generator, tapes: dict[str, type] | None = None) -> None:
    """The FMA path and both tensor-core precisions on the same float32 inputs against the float64
    CPU tape, with issue 11's bounds; `tapes`: precision -> tape class (default: the planned tiles)."""
    tapes = tapes or {p: precision_tape(p) for p in ("highest", *TENSOR_CORE_PRECISIONS)}
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    wide = [a.astype(np.float64) for a in inputs]
    ref = run(convgen.cpu.Tape(dtype="float64"), geom, wide, grad.astype(np.float64))
    ref_abs = run(convgen.cpu.Tape(dtype="float64"), geom, [np.abs(a) for a in wide], np.abs(grad).astype(np.float64))
    errors = {p: relative_errors(deterministic_run(tape, geom, inputs, grad), ref, ref_abs) for p, tape in tapes.items()}
    names = ["output", "dkernel", "dbias", "dinput"]
    for name, fma, high, medium in zip(names, errors["highest"], errors["high"], errors["medium"], strict=True):
        assert medium <= TF32_BOUND, f"{geom}: {name}: TF32 relative error {medium:.3g} > {TF32_BOUND:g}"
        bound = high_bound(fma)
        assert high <= bound, f"{geom}: {name}: 3xTF32 relative error {high:.3g} > 2 x FMA's {fma:.3g}"


def extended_geometry(rng: np.random.Generator, family: Family, rank: int, *, allow_empty: bool) -> Geometry:
    """A random §8 geometry (reference.random_geometry, extended): batch, groups, dilation, stride
    phases, circular padding (conv) and output padding (conv transpose) as drawn."""
    return reference.random_geometry(rng, family, rank, allow_empty=allow_empty, budget=300, extended=True)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", CONV_FAMILIES, ids=lambda f: f.value)
def test_tensor_core_precisions_keep_their_bounds(family: Family, rank: int) -> None:
    rng = reference.case_rng("cuda precision", family.value, rank)
    for case in range(CASES_PER_RANK):
        check_precisions(extended_geometry(rng, family, rank, allow_empty=case == CASES_PER_RANK - 1), rng)


LARGER = [  # deep reductions (many slices and k steps), splits, packed weights, channels not a multiple of 8
    Geometry.build(Family.CONV, 64, 64, (24, 24), (3, 3), (1, 1), (1, 1), batch=2),
    Geometry.build(Family.CONV, 17, 40, (19, 23), (3, 3), (2, 1), (1, 1), batch=3),
    Geometry.build(Family.CONV_TRANSPOSE, 48, 24, (11, 9), (3, 3), (2, 2), (1, 1), batch=2),
    Geometry.build(Family.CONV, 8, 8, (10, 10, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=2),
]


@pytest.mark.parametrize("geom", LARGER, ids=lambda g: f"{g.family.value}_r{g.rank}_{g.in_c}to{g.out_c}")
def test_tensor_core_precisions_on_deeper_reductions(geom: Geometry) -> None:
    check_precisions(geom, reference.case_rng("cuda precision larger", str(geom)))


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", CONV_FAMILIES, ids=lambda f: f.value)
def test_cp_async_pipeline_at_every_rank(family: Family, rank: int) -> None:
    geom = tensor_core_geometry(family, rank)
    for precision in TENSOR_CORE_PRECISIONS:
        defines = plan(geom, precision=precision, wgmma_chooser=no_wgmma).defines
        assert defines["FWD_STAGES"] > 2 and defines["BWI_STAGES"] > 2, (geom, precision)
    tapes = {p: precision_tape(p, wgmma=False) for p in ("highest", *TENSOR_CORE_PRECISIONS)}
    check_precisions(geom, reference.case_rng("cuda pipeline", family.value, rank), tapes)


def assert_wgmma(geom: Geometry, stages: tuple[str, ...] = ("forward", "backward_input", "backward_weight")) -> None:
    """The plans of this device without the direct kernels, as TensorCoreBackend's tapes run them, launch `stages` on
    their `_wgmma` kernels (skipped on a GPU without wgmma)."""
    device = cupy.cuda.Device()
    hardware = convgen.cuda.device_hardware(device.attributes, device.compute_capability)
    if not hardware.wgmma:
        pytest.skip(f"compute capability {device.compute_capability}: no wgmma")
    for precision in TENSOR_CORE_PRECISIONS:
        launches = plan(geom, hardware, precision=precision, direct_chooser=no_direct).launches
        for stage in stages:
            assert launches[stage].kernel == f"{stage}_wgmma", (geom, precision, stage)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", CONV_FAMILIES, ids=lambda f: f.value)
def test_wgmma_at_every_rank(family: Family, rank: int) -> None:
    """All three GEMM stages on the `_wgmma` kernels (32 channels a group: wgmma's N 32; the weight gradient's rows
    32 U channels at each window offset), groups, a batch, dilation and padding, against the float64 CPU tape with
    issue 11's bounds."""
    geom = tensor_core_geometry(family, rank)
    assert_wgmma(geom)
    check_precisions(geom, reference.case_rng("cuda wgmma", family.value, rank))


WGMMA_GEOMETRIES = [  # N 128 and 256 (3xTF32: two blocks of 128), channels past a slice's 32 and past N, stride 2
    Geometry.build(Family.CONV, 128, 128, (12, 13), (3, 3), (1, 1), (1, 1), batch=2),
    Geometry.build(Family.CONV, 40, 200, (9, 11), (3, 2), (1, 1), (1, 0), batch=3),
    Geometry.build(Family.CONV_TRANSPOSE, 72, 48, (7, 5, 6), (2, 3, 2), (1, 1, 1), (1, 1, 0), dilation=(2, 1, 1)),
    Geometry.build(Family.CONV, 48, 64, (17, 15), (3, 3), (2, 2), (1, 1), batch=2),
]


@pytest.mark.parametrize("geom", WGMMA_GEOMETRIES, ids=lambda g: f"{g.family.value}_r{g.rank}_{g.in_c}to{g.out_c}")
def test_wgmma_tiles(geom: Geometry) -> None:
    phased = max(geom.stride) > 1 and geom.family is Family.CONV  # the input gradient's stride phases keep the GEMM
    stages = ("forward", "backward_weight") if phased else ("forward", "backward_input", "backward_weight")
    assert_wgmma(geom, stages)
    check_precisions(geom, reference.case_rng("cuda wgmma tiles", str(geom)))


@pytest.mark.parametrize("tile", PIPELINE_FORCED_TILES, ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}".format(*t))
def test_cp_async_pipeline_on_forced_tiles(tile) -> None:
    rng = reference.case_rng("cuda pipeline tiles", tile)
    tapes = {p: forced_tape(tile, p) for p in TENSOR_CORE_PRECISIONS}
    tapes["highest"] = precision_tape("highest", wgmma=False)
    for geom in (tensor_core_geometry(Family.CONV, 2), tensor_core_geometry(Family.CONV_TRANSPOSE, 3),
                 Geometry.build(Family.CONV, 40, 36, (9, 10), (3, 3), (2, 1), (1, 1), batch=3)):
        check_precisions(geom, rng, tapes)


@pytest.mark.parametrize("tile", MMA_FORCED_TILES, ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}".format(*t))
def test_every_tensor_core_tile_shape(tile) -> None:
    """Each forced tensor-core tile on all three stages of the forced geometries (and a batch)."""
    rng = reference.case_rng("cuda precision tiles", tile)
    tapes = {p: forced_tape(tile, p) for p in ("highest", *TENSOR_CORE_PRECISIONS)}
    tapes["highest"] = precision_tape("highest")  # the FMA path at its own tiles (an mma tile may not fit FMAs)
    for geom in (*FORCED_GEOMETRY, Geometry.build(Family.CONV, 9, 12, (7, 6), (3, 3), (1, 2), (1, 1), batch=3)):
        check_precisions(geom, rng, tapes)


@pytest.mark.parametrize("path", ["registers", "pipeline", "wgmma"])
@pytest.mark.parametrize("precision", TENSOR_CORE_PRECISIONS)
@pytest.mark.parametrize("family", CONV_FAMILIES, ids=lambda f: f.value)
def test_nonfinite_values_on_the_tensor_cores(family: Family, precision: str, path: str) -> None:
    """An inf or NaN in A (weights, upstream gradient) or in B (the input) takes the masked FMA path:
    padding skipped, inf · finite = inf (not the NaN of a split's inf − inf). Exactly the cells the CPU
    tape makes nonfinite are, with the same signs. The cp.async pipeline's blocks and the `_wgmma` kernels'
    find it afterwards, by their non-finite accumulators."""
    rng = reference.case_rng("nonfinite precision", family.value, precision, path)
    geom = Geometry.build(family, 20, 6, (9, 8), (3, 3), (2, 1), (1, 1), batch=2) if path == "registers" else \
        Geometry.build(family, 32, 32, (9, 8), (3, 3), (1, 1), (1, 1), batch=2)
    wgmma = path == "wgmma"
    if wgmma:
        assert_wgmma(geom)
    else:
        assert (plan(geom, precision=precision, wgmma_chooser=no_wgmma).defines["FWD_STAGES"] > 2) is (path == "pipeline")
    weight, bias, x = reference.draw_inputs(rng, geom)
    grad = reference.draw_grad(rng, geom)
    weight[1, 3, 0, 0], weight[4, 5, 2, 1] = np.inf, np.nan
    grad[1, 2, 0, 0] = -np.inf
    x[0, 1, 4, 4] = np.inf
    got = run(precision_tape(precision, wgmma)(), geom, [weight, bias, x], grad, repeat=2)
    ref = run(convgen.cpu.Tape(), geom, [weight, bias, x], grad)
    for g, r in zip([got[0], *got[1]], [ref[0], *ref[1]], strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
        np.testing.assert_array_equal(np.isinf(g) * np.sign(g), np.isinf(r) * np.sign(r))
        finite = np.isfinite(r)
        # TF32's products are good to ~1e-3 of the terms: an absolute bound on the scale of the largest result.
        scale = max(1.0, float(np.max(np.abs(r[finite]), initial=0.0)))
        np.testing.assert_allclose(g[finite], r[finite], rtol=1e-2, atol=2e-3 * scale)


# <= 8 channels each way and windows of >= 27 offsets: every GEMM stage on its direct kernel's FMAs, each conv-shaped
# stage with fewer than 8 dst or source channels (8 and 8 take the tensor cores in "medium": test_cuda_direct_mma.py)
FEW_CHANNELS = [
    Geometry.build(Family.CONV, 8, 7, (10, 10, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=2),
    Geometry.build(Family.CONV, 8, 6, (6, 5, 6, 5), (3, 3, 3, 3), (1, 2, 1, 1), (1, 1, 0, 1), dilation=(1, 1, 2, 1),
                   batch=3),
    Geometry.build(Family.CONV_TRANSPOSE, 4, 8, (5, 4, 4, 3), (3, 3, 3, 3), (2, 1, 1, 1), (1, 1, 1, 1), batch=2,
                   output_padding=(1, 0, 0, 0)),
]


@pytest.mark.parametrize("geom", FEW_CHANNELS, ids=lambda g: f"{g.family.value}_r{g.rank}_{g.in_c}to{g.out_c}")
def test_few_channel_stages_take_the_fma_direct_kernels_in_every_precision(geom: Geometry) -> None:
    """The direct kernels' FMAs are at least as accurate as the tensor cores and faster at so few channels: the
    plans of "high" and "medium" take them as "highest"'s do, and the results are "highest"'s, bit for bit."""
    rng = reference.case_rng("cuda few channels", str(geom))
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = run(PoisonTape(), geom, inputs, grad)
    for precision in TENSOR_CORE_PRECISIONS:
        launches = plan(geom, precision=precision).launches
        assert all(launches[stage].kernel == f"{stage}_direct"
                   for stage in ("forward", "backward_input", "backward_weight")), (geom, precision)
        got = run(PoisonTape(precision=precision), geom, inputs, grad, repeat=2)
        for a, b in zip([got[0], *got[1]], [expected[0], *expected[1]], strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("family", CONV_FAMILIES, ids=lambda f: f.value)
def test_a_stage_of_few_source_channels_multiplies_with_fmas(family: Family) -> None:
    """3 source channels in the forward (a conv's input, a transpose's): in "high" and "medium" it runs its GEMM with
    FMAs on "highest"'s tile, so its output is "highest"'s bit for bit; the gradients keep the tensor cores and
    their bounds."""
    in_c, out_c = (3, 40) if family is Family.CONV else (3, 24)
    geom = Geometry.build(family, in_c, out_c, (23, 21), (5, 5), (2, 2), (2, 2), batch=3)
    rng = reference.case_rng("cuda few source channels", family.value)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = run(PoisonTape(), geom, inputs, grad)
    for precision in TENSOR_CORE_PRECISIONS:
        assert plan(geom, precision=precision).defines["FWD_MMA"] == 0, precision
        got = run(PoisonTape(precision=precision), geom, inputs, grad)
        np.testing.assert_array_equal(got[0], expected[0])
    check_precisions(geom, rng)


def test_pools_ignore_the_precision() -> None:
    """Pools have no GEMM: their results are the FMA tape's, bit for bit, in every precision."""
    rng = reference.case_rng("pool precision")
    geom = Geometry.build(Family.AVG_POOL, 3, 3, (9, 7), (3, 3), (2, 1), (1, 1), batch=2)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = run(precision_tape("highest")(), geom, inputs, grad)
    for precision in TENSOR_CORE_PRECISIONS:
        got = run(precision_tape(precision)(), geom, inputs, grad)
        for a, b in zip([got[0], *got[1]], [expected[0], *expected[1]], strict=True):
            np.testing.assert_array_equal(a, b)
