"""The CUDA tape on SEMANTICS §8 (`pytest -m cuda`): the batch (a kernel argument, tiles planned for
its bucket), circular padding (pad and fold kernels around the ordinary ones), dilation, output padding
and groups, against the CPU tape at every rank and against PyTorch CUDA at ranks 1..3."""

from __future__ import annotations

import numpy as np
import pytest
import reference
import torch_oracle
from convgen import cuda_launch
from convgen.cuda_launch import plan
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
    forced_tape,
    run,
)
from forced_tiles import FORCED_GEOMETRY, FORCED_TILES, WIDE_FORCED_GEOMETRY, WIDE_FORCED_TILES, forced_chooser

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

import convgen.cpu  # noqa: E402  (after the skip)
import convgen.cuda  # noqa: E402

# SEMANTICS §8 on the GPU: the batch (a kernel argument, tiles planned for its bucket).

def batched_geometry(rng: np.random.Generator, family: Family, rank: int, *, allow_empty: bool = False) -> Geometry:
    """A random §8 geometry (reference.random_geometry, extended) with what the CUDA tape computes
    kept: its batch (2 when it drew none), no dilation, groups, circular or output padding."""
    drawn = reference.random_geometry(rng, family, rank, allow_empty=allow_empty, budget=300, extended=True)
    batch = 2 if drawn.batch is None else drawn.batch
    return G(family, drawn.in_c, drawn.out_c, drawn.in_spatial, drawn.kernel, drawn.stride, drawn.padding,
             drawn.beta, batch=batch)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_batched_random_geometry_matches_cpu_tape(family: Family, rank: int) -> None:
    """Every family and rank with a batch axis: forward and gradients against the CPU tape, the
    gradients twice and bit-identical (the weight and bias gradients sum the images in a fixed order)."""
    rng = reference.case_rng("cuda batch", family.value, rank)
    for case in range(CASES_PER_RANK):
        check_against_cpu(batched_geometry(rng, family, rank, allow_empty=case == CASES_PER_RANK - 1), rng)


def test_batched_splits_and_forced_tiles() -> None:
    """Batches through split stages (the partial buffer [split][images][...] and the weight
    gradient's reduction over (image, cell) slices) and through every forced tile shape."""
    rng = reference.case_rng("batch splits")
    for geom in (G(Family.CONV, 40, 24, (9, 9), (3, 3), (1, 1), (1, 1), batch=3),
                 G(Family.CONV, 3, 16, (40, 40), (7, 7), (2, 2), (3, 3), batch=2),
                 G(Family.CONV_TRANSPOSE, 16, 8, (30, 30), (3, 2), (2, 1), (1, 0), batch=5)):
        assert max(plan(geom, direct_chooser=no_direct).splits.values()) > 1, geom
        check_against_cpu(geom, rng, GemmTape)
    # The bias gradient in parts: 2304 cells of each channel (16-byte loads), 2115 (one at a time).
    for geom in (G(Family.CONV, 4, 8, (48, 48), (3, 3), (1, 1), (1, 1), batch=3),
                 G(Family.CONV_TRANSPOSE, 4, 6, (45, 47), (3, 3), (1, 1), (1, 1), batch=4)):
        assert plan(geom).splits["backward_bias"] == 2, geom
        check_against_cpu(geom, rng)
    for tile in FORCED_TILES:
        for geom in FORCED_GEOMETRY:
            check_against_cpu(G(geom.family, geom.in_c, geom.out_c, geom.in_spatial, geom.kernel, geom.stride,
                                geom.padding, batch=3), rng, forced_tape(tile))


@pytest.mark.parametrize("tile", WIDE_FORCED_TILES, ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}_wide{}".format(*t))
def test_wide_slices_in_dynamic_shared_memory(tile) -> None:
    """Slices of 32 channels, in dynamic shared memory past the 48 KB of a static block for 128 x 64 (the launch
    opts in), static for 32 x 128, against the CPU tape."""
    rng = reference.case_rng("wide slices", tile)
    for geom in WIDE_FORCED_GEOMETRY:
        shared = max(launch.shared_bytes for launch in plan(geom, choose_tile=forced_chooser(*tile)).launches.values())
        assert (shared > 48 * 1024) is (tile[:2] == (128, 64)), (geom, shared)
        check_against_cpu(geom, rng, forced_tape(tile))


# fp32 FMA conv stages in the cp.async pipeline (forced; the plans take it on stages of many waves): three and
# four slices, 32-channel slices past 48 KB, a split, A as given and repacked, several B columns a thread.
FMA_PIPELINE_TILES = [  # (bm, bn, tm, tn, split, packed, wide, stages)
    (64, 64, 4, 4, 1, True, False, 3),
    (128, 64, 8, 4, 2, False, True, 3),
    (32, 256, 4, 8, 1, True, False, 4),
]


@pytest.mark.parametrize("tile", FMA_PIPELINE_TILES, ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}_wide{}_stages{}"
                         .format(*t))
def test_fma_pipeline_gives_the_register_loop_results_bit_for_bit(tile) -> None:
    """The same tile staged through registers and copied by cp.async: the same products in the same order, the
    same bits, with an inf and a NaN in the weight next to padding (the pipeline's rare path)."""
    rng = reference.case_rng("fma pipeline", tile)
    registers = (*tile[:7], 2)
    for geom in (*FORCED_GEOMETRY, *WIDE_FORCED_GEOMETRY):
        defines = plan(geom, choose_tile=forced_chooser(*tile)).defines
        assert defines["FWD_STAGES"] == tile[7] or defines["BWI_STAGES"] == tile[7], geom
        weight, bias, x = reference.draw_inputs(rng, geom)
        weight[0, 0, 0, 0], weight[-1, -1, -1, -1] = np.inf, np.nan
        grad = reference.draw_grad(rng, geom)
        expected = run(forced_tape(registers)(), geom, [weight, bias, x], grad)
        got = run(forced_tape(tile)(), geom, [weight, bias, x], grad, repeat=2)
        for a, b in zip([expected[0], *expected[1]], [got[0], *got[1]], strict=True):
            assert np.array_equal(a, b, equal_nan=True), geom


def test_batch_sizes_of_one_bucket_share_a_module() -> None:
    """A new batch size compiles nothing when its bucket's tiles are compiled already."""
    backend = PoisonTape()._backend
    base = dict(family=Family.CONV, in_c=5, out_c=6, in_spatial=(9, 8), kernel=(3, 3), stride=(2, 1), padding=(1, 1))
    rng = reference.case_rng("batch bucket")
    check_against_cpu(G(*base.values(), batch=4), rng)
    modules = len(backend._modules)
    check_against_cpu(G(*base.values(), batch=3), rng)
    assert len(backend._modules) == modules


# Circular padding (SEMANTICS §8): the ordinary conv kernels on the wrapped input (pad), the input
# gradient folded back (fold). Random circular geometry keeps its batch, strides and paddings up to
# the extent, dilation and groups.

def circular_geometry(rng: np.random.Generator, rank: int) -> Geometry:
    """A random circular conv (reference.random_geometry, extended) with some nonzero padding."""
    while True:
        drawn = reference.random_geometry(rng, Family.CONV, rank, budget=300, extended=True)
        if drawn.circular and any(drawn.padding):
            return drawn


@pytest.mark.parametrize("rank", RANKS)
def test_circular_padding_matches_cpu_tape(rank: int) -> None:
    """Forward and gradients against the CPU tape, the gradients twice and bit-identical (the fold
    is a gather in a fixed order)."""
    rng = reference.case_rng("cuda circular", rank)
    for _ in range(CASES_PER_RANK):
        check_against_cpu(circular_geometry(rng, rank), rng)


@pytest.mark.parametrize("rank", (1, 2, 3))
def test_circular_padding_matches_torch_cuda(rank: int) -> None:
    torch = pytest.importorskip("torch")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = reference.case_rng("torch circular", rank)
    cases = 0
    while cases < 2:
        geom = circular_geometry(rng, rank)
        if not torch_oracle.accepts(geom):
            continue
        cases += 1
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        got = run(PoisonTape(), geom, inputs, grad, repeat=2)
        ref_abs = run(convgen.cpu.Tape(), geom, [np.abs(a) for a in inputs], np.abs(grad))
        assert_close_to(geom, got, torch_oracle.run(torch, geom, inputs, grad, device="cuda"), ref_abs)


def test_circular_padding_of_a_whole_period() -> None:
    """p = in: every input cell has three copies in the padded row [x x x]. Kernel 2, stride 2 over
    in = 3, p = 3: output o reads the cells READS[o] (by hand: padded cells 2o and 2o + 1, mod 3)."""
    geom = G(Family.CONV, 1, 1, (3,), (2,), (2,), (3,), circular=True)
    reads = [(0, 1), (2, 0), (1, 2), (0, 1)]
    weight, bias, x = np.array([[[2, -1]]], np.float32), np.array([0.5], np.float32), np.array([[1, 3, -2]], np.float32)
    grad = np.array([[1, -2, 4, 0.5]], np.float32)
    out, (d_weight, d_bias, d_x) = run(PoisonTape(), geom, [weight, bias, x], grad, repeat=2)
    np.testing.assert_array_equal(out, [[2 * x[0, a] - x[0, b] + 0.5 for a, b in reads]])
    expected_dx = np.zeros(3, np.float32)
    for g, cells in zip(grad[0], reads):
        for w, cell in zip(weight[0, 0], cells):
            expected_dx[cell] += w * g
    np.testing.assert_array_equal(d_x, [expected_dx])
    np.testing.assert_array_equal(d_weight, [[[sum(g * x[0, cells[k]] for g, cells in zip(grad[0], reads))
                                               for k in range(2)]]])
    np.testing.assert_array_equal(d_bias, [grad.sum()])
    rng = reference.case_rng("circular whole period")
    check_against_cpu(G(Family.CONV, 2, 3, (3, 2), (2, 3), (1, 2), (3, 2), batch=2, circular=True), rng)
    check_against_cpu(G(Family.CONV, 3, 2, (4, 1, 3), (3, 2, 3), (2, 1, 1), (4, 1, 0), batch=3, circular=True), rng)


# Dilation, output padding and groups: window offset k reads o*S + k*D - P (the gather form by
# stride phase, some phases reaching no offset when gcd(S, D) > 1); the extra cells of output
# padding see no input (bias only); groups run block-diagonal GEMMs.

def dilated_grouped_geometry(rng: np.random.Generator, family: Family, rank: int, *,
                             allow_empty: bool = False) -> Geometry:
    """A random §8 geometry (reference.random_geometry, extended) with the batch, dilation, groups
    and output padding it drew; circular padding (tested on its own) dropped."""
    drawn = reference.random_geometry(rng, family, rank, allow_empty=allow_empty, budget=300, extended=True)
    return G(family, drawn.in_c, drawn.out_c, drawn.in_spatial, drawn.kernel, drawn.stride, drawn.padding,
             drawn.beta, batch=drawn.batch, dilation=drawn.dilation, groups=drawn.groups,
             output_padding=drawn.output_padding)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_dilated_grouped_random_geometry_matches_cpu_tape(family: Family, rank: int) -> None:
    rng = reference.case_rng("cuda dilation groups", family.value, rank)
    for case in range(CASES_PER_RANK):
        check_against_cpu(dilated_grouped_geometry(rng, family, rank, allow_empty=case == CASES_PER_RANK - 1), rng)


@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("family", [f for f in Family if f is not Family.SMOOTH_MAX_POOL], ids=lambda f: f.value)
def test_dilated_grouped_random_geometry_matches_torch_cuda(family: Family, rank: int) -> None:
    rng = reference.case_rng("torch dilation groups", family.value, rank)
    check_against_torch_cuda(lambda rng: dilated_grouped_geometry(rng, family, rank), rng, 3)


DILATED_GROUPED = [
    G(Family.CONV, 4, 6, (13, 10), (3, 2), (2, 1), (2, 1), dilation=(2, 3), groups=2),  # gcd(S, D) = 2
    G(Family.CONV, 2, 2, (23,), (3,), (4,), (2,), dilation=(6,), batch=2),  # phases with and without offsets
    G(Family.CONV_TRANSPOSE, 6, 9, (7, 6), (3, 3), (2, 3), (1, 0), dilation=(3, 2), groups=3, output_padding=(1, 2)),
    G(Family.CONV_TRANSPOSE, 2, 4, (3, 4), (2, 3), (3, 2), (0, 1), output_padding=(2, 1), batch=3),
    G(Family.CONV, 6, 4, (6, 5, 7), (2, 3, 2), (3, 2, 1), (1, 2, 0), dilation=(3, 2, 2), groups=2, batch=2),
    G(Family.CONV_TRANSPOSE, 17, 34, (5, 6), (2, 2), (2, 2), (1, 0), dilation=(2, 1), groups=17),
    # Two groups of 8 rows over 16 source channels: a group's repacked A staged four rows at a time.
    G(Family.CONV, 16, 32, (7, 6), (3, 2), (2, 1), (1, 0), dilation=(2, 1), groups=2, batch=2),
]


@pytest.mark.parametrize("tile", FORCED_TILES, ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}".format(*t))
def test_dilated_grouped_forced_tiles_and_splits(tile) -> None:
    """Every forced tile shape and split (the partial buffers [split][images][groups * M][N] and
    [split][groups * M][N]) through dilated, grouped and output-padded geometries."""
    tape_class = forced_tape(tile)
    rng = reference.case_rng("dilation groups forced", tile)
    for geom in DILATED_GROUPED:
        check_against_cpu(geom, rng, tape_class)


def test_dilated_grouped_planned_splits() -> None:
    rng = reference.case_rng("dilation groups splits")
    # Split forward (96 -> 32, a GEMM: its 8 channels a group would run the direct kernel) and weight gradient
    # (48 -> 32, two images); smaller stages run whole.
    for geom in (G(Family.CONV, 96, 32, (9, 9), (3, 3), (1, 1), (2, 2), dilation=(2, 2), groups=4),
                 G(Family.CONV, 48, 32, (9, 12), (3, 3), (1, 1), (2, 2), dilation=(2, 2), groups=4, batch=2),
                 G(Family.CONV_TRANSPOSE, 16, 8, (20, 20), (3, 2), (2, 2), (2, 0), dilation=(2, 2), groups=2,
                   output_padding=(1, 1), batch=2)):
        assert max(plan(geom, direct_chooser=no_direct).splits.values()) > 1, geom
        check_against_cpu(geom, rng, GemmTape)


def test_dilated_pools() -> None:
    """A max pool window of padding only gives -inf and passes no gradient (the saved offset is the
    poison); dilated rows held in registers (V = 4) and streamed (a window spanning > 64 cells)."""
    rng = reference.case_rng("dilated pools")
    empty_window = G(Family.MAX_POOL, 2, 2, (2,), (2,), (1,), (2,), dilation=(3,), batch=2)
    inputs, grad = reference.draw_inputs(rng, empty_window), reference.draw_grad(rng, empty_window)
    output, _ = run(PoisonTape(), empty_window, inputs, grad)
    assert np.isneginf(output[..., 1]).all() and np.isfinite(output[..., [0, 2]]).all()
    cases = [
        empty_window,
        G(Family.MAX_POOL, 2, 2, (7, 20), (3, 3), (1, 2), (2, 2), dilation=(2, 2)),
        G(Family.AVG_POOL, 2, 2, (9, 80), (2, 9), (1, 2), (1, 16), dilation=(2, 9)),
        G(Family.SMOOTH_MAX_POOL, 2, 2, (5, 12), (2, 3), (2, 1), (1, 2), 0.8, dilation=(3, 2)),
        G(Family.MAX_POOL, 1, 1, (3, 90), (1, 8), (1, 1), (0, 30), dilation=(1, 9)),
    ]
    assert cuda_launch.pool_cells_per_thread(73, 2) == 1 and plan(cases[2]).defines["POOL_V"] == 1
    for geom in cases:
        check_against_cpu(geom, rng)



@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("family", [f for f in Family if f is not Family.SMOOTH_MAX_POOL], ids=lambda f: f.value)
def test_batched_random_geometry_matches_torch_cuda(family: Family, rank: int) -> None:
    rng = reference.case_rng("torch batch", family.value, rank)
    check_against_torch_cuda(lambda rng: batched_geometry(rng, family, rank), rng, 2)


MASKS = [(True, False, False), (False, True, False), (False, False, True), (False, True, True)]  # weight, bias, x


@pytest.mark.parametrize(("family", "circular"), [(Family.CONV, False), (Family.CONV, True),
                                                   (Family.CONV_TRANSPOSE, False)], ids=("conv", "circular", "transpose"))
def test_backward_leaves_out_unwanted_gradients(family: Family, circular: bool) -> None:
    """Each gradient left out is None, the others are bit-identical to a full backward (the same kernels):
    convgen.torch asks only for what autograd reads. Circular (a conv's only): without the weight gradient no
    input is padded."""
    geom = G(family, 4, 6, (7, 6), (3, 2), (1, 2) if family is Family.CONV else (2, 1), (1, 1), batch=3,
             groups=2, circular=circular)
    rng = reference.case_rng("wanted gradients", family.value, circular)
    backend = convgen.cuda.CupyBackend()
    inputs = tuple(backend.store(a) for a in reference.draw_inputs(rng, geom))
    grad = backend.store(reference.draw_grad(rng, geom))
    _, saved = backend.forward(geom, inputs)
    full = backend.backward(geom, inputs, saved, grad)
    for mask in MASKS:
        got = backend.backward(geom, inputs, saved, grad, mask)
        for wants, part, whole in zip(mask, got, full, strict=True):
            if wants:
                assert bool(cupy.array_equal(part, whole)), f"{mask}"
            else:
                assert part is None, f"{mask}"
