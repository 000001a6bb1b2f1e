"""The small-channel direct kernels on the GPU (`pytest -m cuda`): the conv-shaped stages of at most 16 dst
channels (forward and backward_input; one of the direct form, one gathered per stride phase) and the weight
gradient, taken wherever they can be (not only where the plans take them), against the CPU tape at every rank 1..8, in float32 and float64,
with stride, padding, dilation, groups and batches; the same geometries through the GEMM agree; an inf weight
beside padding takes the careful path in both forms."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import reference
from convgen.cuda_launch import plan
from convgen.direct_model import DIRECT_THREADS, direct_tile
from convgen.geometry import Family, Geometry
from cuda_support import RANKS, G, GemmTape, PoisonBackend, PoisonTape, _has_gpu, check_against_cpu, run
from forced_tiles import staged_channels, weight_channel_blocks

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

import convgen.cpu  # noqa: E402  (after the skip)

# Any stage of few dst channels, with blocks below a warp too, so that the boxes of ranks 7 and 8 fit shared
# memory in float64 (the plans' chooser takes only large windows of few channels and stops at 32 threads).
ANY_BLOCK = functools.partial(direct_tile, threads_tried=(*DIRECT_THREADS, 16, 8, 4, 2, 1))


class AnyBlockBackend(PoisonBackend):
    direct_chooser = staticmethod(ANY_BLOCK)


class AnyBlockTape(PoisonTape):
    backend_class = AnyBlockBackend


def direct_tape(chooser) -> type:
    """A poisoning tape whose plans take `chooser`'s direct tiles (its own backend, so its own module cache)."""
    backend = type("ChosenBackend", (PoisonBackend,), {"direct_chooser": staticmethod(chooser)})
    return type("ChosenTape", (PoisonTape,), {"backend_class": backend})


def direct_geometry(family: Family, rank: int) -> Geometry:
    """A geometry of `rank` whose direct-form stage runs the direct kernel: windows of 3 and 2, strides 1
    and 2, padding, a dilation, 2 groups of 3 and 4 channels, 2 images; extents small enough that the
    box's halo fits shared memory at rank 8."""
    kernel = tuple(3 if a % 2 == 0 and (rank <= 4 or a in (0, rank - 1)) else 2 for a in range(rank))
    stride = tuple(2 if a == rank - 1 and rank > 1 else 1 for a in range(rank))
    padding = tuple(1 if k == 3 else 0 for k in kernel)
    dilation = tuple(2 if a == 0 and rank > 1 else 1 for a in range(rank))
    in_spatial = tuple(5 + a % 3 if rank <= 4 else 4 if rank <= 6 else 3 for a in range(rank))
    return G(family, 6, 8, in_spatial, kernel, stride, padding, batch=2, dilation=dilation, groups=2)


STAGES = ("forward", "backward_input")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", [Family.CONV, Family.CONV_TRANSPOSE], ids=lambda f: f.value)
def test_direct_kernel_matches_cpu_tape(family: Family, rank: int, dtype: str) -> None:
    geom = direct_geometry(family, rank)
    launches = plan(geom, dtype=dtype, direct_chooser=ANY_BLOCK).launches
    assert all(launches[stage].kernel == f"{stage}_direct" for stage in STAGES), geom
    # The weight gradient's direct kernel: its rows (source channels x outer window offsets) shared by as many
    # blocks as keep them within 256 (ranks 7 and 8: 192 offsets, a block a channel or two).
    assert launches["backward_weight"].kernel == "backward_weight_direct", geom
    assert launches["backward_weight"].block <= 256, geom
    check_against_cpu(geom, reference.case_rng("cuda direct", family.value, rank, dtype), AnyBlockTape, dtype)


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_direct_kernel_and_gemm_agree(rank: int) -> None:
    """The same sums in another order: the direct kernels' output, input and weight gradients within float32's
    bound of the GEMMs'; the bias gradient is the same kernel."""
    geom = G(Family.CONV, 5, 7, (9,) * rank if rank < 4 else (6,) * rank, (3,) * rank, (1,) * rank, (1,) * rank,
             batch=3)
    rng = reference.case_rng("cuda direct vs gemm", rank)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    direct, gemm = run(AnyBlockTape(), geom, inputs, grad), run(GemmTape(), geom, inputs, grad)
    ref_abs = run(convgen.cpu.Tape(), geom, [np.abs(a) for a in inputs], np.abs(grad))
    scale = np.linalg.norm(ref_abs[0])
    assert np.linalg.norm(direct[0] - gemm[0]) <= 2 * reference.RTOL * scale
    weight_grad, bias_grad, input_grad = direct[1]
    assert np.linalg.norm(input_grad - gemm[1][2]) <= 2 * reference.RTOL * np.linalg.norm(ref_abs[1][2])
    assert np.linalg.norm(weight_grad - gemm[1][0]) <= 2 * reference.RTOL * np.linalg.norm(ref_abs[1][0])
    np.testing.assert_array_equal(bias_grad, gemm[1][1])


@pytest.mark.parametrize("stride", [1, 2])
def test_an_inf_weight_beside_padding_takes_the_careful_path(stride: int) -> None:
    """0 * inf must not reach a sum: padded cells are skipped (SEMANTICS §3), so exactly the output and input
    gradient cells the CPU tape makes non-finite are, with the same signs (stride 2: the gather form's phases)."""
    geom = G(Family.CONV, 5, 4, (7, 9), (3, 3), (1, stride), (1, 1), batch=2)
    launches = plan(geom, direct_chooser=ANY_BLOCK).launches
    assert all(launches[stage].kernel == f"{stage}_direct" for stage in STAGES)
    rng = reference.case_rng("cuda direct non-finite", stride)
    weight, bias, x = reference.draw_inputs(rng, geom)
    weight[1, 2, 0, 0], weight[3, 4, 2, 1] = np.inf, np.nan
    grad = reference.draw_grad(rng, geom)
    got = run(AnyBlockTape(), geom, [weight, bias, x], grad)
    ref = run(convgen.cpu.Tape(), geom, [weight, bias, x], grad)
    for got_value, ref_value in ((got[0], ref[0]), (got[1][2], ref[1][2])):
        np.testing.assert_array_equal(np.isnan(got_value), np.isnan(ref_value))
        np.testing.assert_array_equal(np.isinf(got_value) * np.sign(got_value), np.isinf(ref_value) * np.sign(ref_value))
        assert not np.isfinite(ref_value).all() and np.isfinite(ref_value).any()
        finite = np.isfinite(ref_value)
        np.testing.assert_allclose(got_value[finite], ref_value[finite], rtol=1e-4, atol=1e-4)


def test_the_plans_take_the_direct_kernel_for_few_channels_and_large_windows() -> None:
    """What the plans' own chooser picks (V = 2, 256-thread blocks where they fit): a 3-D and a 4-D forward, input
    gradient and weight gradient (split over many blocks, reduced)."""
    rng = reference.case_rng("cuda planned direct")
    for geom in (G(Family.CONV, 8, 8, (9, 10, 11), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=3),
                 G(Family.CONV, 5, 7, (6, 7, 6, 9), (3, 3, 3, 3), (1, 1, 1, 1), (1, 0, 1, 1), batch=2)):
        launches = plan(geom).launches
        assert all(launches[stage].kernel == f"{stage}_direct" for stage in (*STAGES, "backward_weight"))
        assert plan(geom).splits["backward_weight"] > 1
        check_against_cpu(geom, rng)


@pytest.mark.parametrize("geom", [G(Family.CONV, 8, 4, (14, 134), (7, 7), (1, 1), (0, 0), batch=2),
                                  G(Family.CONV, 8, 8, (10, 8, 8, 16), (3, 3, 3, 3), (1,) * 4, (1,) * 4, batch=2)],
                         ids=["k7", "conv4d"])
def test_direct_staging_in_dynamic_shared_memory_gives_the_static_bits(geom: Geometry) -> None:
    """More source channels a step than 48 KB hold, in the launch's dynamic shared memory: the sums run channel by
    channel either way, so output and gradients equal the static staging's bit for bit, and the CPU tape's within
    the bound."""
    tapes = {max_cb: direct_tape(staged_channels(max_cb)) for max_cb in (None, 8)}
    dynamic = plan(geom, direct_chooser=staged_channels(8))
    assert dynamic.launches["forward"].shared_bytes > 48 * 1024, dynamic.launches["forward"]
    assert plan(geom, direct_chooser=staged_channels(None)).launches["forward"].shared_bytes == 0
    rng = reference.case_rng("cuda direct dynamic staging", geom.rank)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    static_run, dynamic_run = (run(tapes[max_cb](), geom, inputs, grad) for max_cb in (None, 8))
    for a, b in zip([dynamic_run[0], *dynamic_run[1]], [static_run[0], *static_run[1]], strict=True):
        np.testing.assert_array_equal(a, b)
    check_against_cpu(geom, rng, tapes[8])


@pytest.mark.parametrize("blocks", [2, 4, 8])
def test_direct_weight_channel_blocks_give_the_one_block_bits(blocks: int) -> None:
    """A group's 8 input channels shared by several blocks, each staging its channels' halo: every weight's sum runs
    in the one-block kernel's order, so the weight gradient is its bit for bit, and the CPU tape's within the
    bound."""
    geom = G(Family.CONV, 8, 6, (6, 7, 5, 12), (3, 3, 3, 3), (1,) * 4, (1,) * 4, batch=2)
    assert plan(geom, direct_chooser=weight_channel_blocks(blocks)).defines["BWW_DIRECT_CHANNEL_BLOCKS"] == blocks
    shared, one = (direct_tape(weight_channel_blocks(b)) for b in (blocks, 1))
    rng = reference.case_rng("cuda weight channel blocks", blocks)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    np.testing.assert_array_equal(run(shared(), geom, inputs, grad)[1][0], run(one(), geom, inputs, grad)[1][0])
    check_against_cpu(geom, rng, shared)
