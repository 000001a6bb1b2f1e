"""Plans of the small-channel direct kernel (convgen.direct_model), without a GPU: which conv-shaped stages
run it (the direct form, and the gather form per stride phase), how its blocks are cut, and that everything
else keeps its GEMM."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from convgen.cuda_launch import H200, plan, representative_geometry
from convgen.direct_model import (
    DirectTile,
    covered,
    cut_tile,
    direct_box,
    direct_grid,
    direct_shared_bytes,
    direct_tile,
    mma_slices,
    mma_tile,
    mma_traffic,
    no_direct,
    staging_bytes,
)
from convgen.direct_shapes import MMA_DIRECT_MODE, DirectShape, direct_shapes, halo, mma_box, weight_shape
from convgen.direct_weight_model import grid_staging, weight_mma_registers, weight_mma_shared_bytes, weight_mma_tile
from convgen.geometry import Family, Geometry

CONV4D_N8 = Geometry.build(Family.CONV, 8, 8, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8)


def test_the_batched_4d_convolution_of_8_channels_runs_its_forward_and_input_gradient_direct():
    p = plan(CONV4D_N8)
    forward = p.launches["forward"]
    assert forward.kernel == "forward_direct"
    # 4 x 4 x 4 x 16 cells a block, 4 a thread along the last axis (32 sums of 8 channels): 256 threads; 8 images
    # x 64 boxes, 3.9 blocks an SM.
    assert (forward.block, forward.grid) == (256, 512)
    assert [p.defines[f"FWD_DIRECT_BOX{a}"] for a in range(4)] == [4, 4, 4, 16]
    assert (p.defines["FWD_DIRECT"], p.defines["FWD_DIRECT_V"], p.defines["FWD_DIRECT_MB"]) == (1, 4, 8)
    # Four channels a step: 4 x (81 x 8 weights + 6 x 6 x 6 x 18 halo cells) floats, 72 KB of dynamic shared memory,
    # under a third of an SM's 228 KB (its grid has 3.9 blocks an SM); eight would leave room for one block.
    assert p.defines["FWD_DIRECT_CB"] == 4
    assert forward.shared_bytes == 4 * (81 * 8 + 6 * 6 * 6 * 18) * 4
    # Nothing else of the GEMM forward runs: no pack, no split, no reduce.
    assert (p.launches["forward_pack"].grid, p.launches["forward_reduce"].grid, p.splits["forward"]) == (0, 0, 1)
    # Stride 1: the gather-form backward_input is one phase of the same stencil, flipped.
    backward_input = p.launches["backward_input"]
    assert (backward_input.kernel, backward_input.block, backward_input.grid) == ("backward_input_direct", 256, 512)
    assert [p.defines[f"BWI_DIRECT_{field}"] for field in ("V", "MB", "CB")] == [4, 8, 4]
    # The weight gradient: a thread per (input channel, outer window offsets), 8 x 27 = 216; boxes of 2 x 2 x 2 x
    # 16 cells of the output gradient (8 x 128 of it and 8 x 4 x 4 x 4 x 18 of the input's halo: 40 KB), 4 cells a
    # read; 528 blocks (4 an SM by the registers) split 8 images x 512 boxes, their partial sums reduced.
    weight = p.launches["backward_weight"]
    assert (weight.kernel, weight.block, weight.grid) == ("backward_weight_direct", 216, 528)
    assert [p.defines[f"BWW_DIRECT_{field}"] for field in ("V", "LANES")] == [4, 1]
    assert [p.defines[f"BWW_DIRECT_BOX{a}"] for a in range(4)] == [2, 2, 2, 16]
    assert p.splits["backward_weight"] == p.defines["BWW_SPLIT"] == 528
    assert p.launches["backward_weight_reduce"].grid > 0


def test_a_transpose_runs_both_stages_direct_where_its_phases_have_27_offsets():
    geom = Geometry.build(Family.CONV_TRANSPOSE, 5, 3, (6, 7, 5), (3, 3, 3), (1, 1, 1), (1, 0, 1), batch=2)
    p = plan(geom)
    assert p.launches["backward_input"].kernel == "backward_input_direct"
    assert p.launches["forward"].kernel == "forward_direct"
    assert set(direct_shapes(geom, 4)) == {"forward", "backward_input"}
    # Stride 2 on one axis: the forward's phases have at most 2 x 3 x 3 offsets, its GEMM runs.
    strided = Geometry.build(Family.CONV_TRANSPOSE, 5, 3, (6, 7, 5), (3, 3, 3), (2, 1, 1), (1, 0, 1), batch=2)
    p = plan(strided)
    assert p.launches["backward_input"].kernel == "backward_input_direct" and not p.launches["forward"].kernel


def test_the_gather_form_runs_per_stride_phase():
    """k7 s2: per axis 2 phases of ceil(224 / 2) cells u, at most 4 taps (offsets 0, 2, 4, 6 or 1, 3, 5) one
    source cell apart; a dilation 2 over stride 2 leaves phases no offset reaches (gcd 2: SG = 1, DG = 1)."""
    geom = Geometry.build(Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3), batch=32)
    shape = direct_shapes(geom, 4)["backward_input"]
    assert (shape.cells, shape.taps, shape.step, shape.spacing, shape.phases) == ((112, 112), (4, 4), (1, 1),
                                                                                  (1, 1), 4)
    assert (shape.m, shape.source_c, shape.window) == (3, 64, 16)
    dilated = Geometry.build(Family.CONV, 3, 4, (11, 9), (2, 3), (2, 2), (1, 1), dilation=(2, 4), batch=2)
    shape = direct_shapes(dilated, 4)["backward_input"]
    assert (shape.cells, shape.taps, shape.spacing, shape.phases) == ((6, 5), (2, 3), (1, 2), 4)


def test_an_empty_input_axis_leaves_the_input_gradient_to_its_gemm():
    """Padding alone gives an empty input axis output cells: the input gradient has no cells to write."""
    geom = Geometry.build(Family.CONV, 3, 2, (5, 5, 0), (3, 3, 3), (1, 1, 3), (1, 1, 3), batch=2)
    assert geom.out_spatial == (5, 5, 2)
    assert direct_shapes(geom, 4)["backward_input"].cells == (5, 5, 0)
    p = plan(geom)
    assert p.launches["forward"].kernel == "forward_direct"
    assert not p.launches["backward_input"].kernel and p.launches["backward_input"].grid == 0


def test_three_dst_channels_over_many_source_channels_run_direct_when_the_grid_is_large():
    """Where the GEMM reuses each gathered value 3 times: the k7 s2 input gradient of 32 images runs direct (896
    blocks of 16 x 112 cells), that of one image (112 blocks at V = 2) and phases of 4 offsets (k4 s2) keep the
    GEMM."""
    batched = Geometry.build(Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3), batch=32)
    p = plan(batched)
    assert p.launches["backward_input"].kernel == "backward_input_direct" and p.launches["backward_input"].grid == 896
    assert not p.launches["forward"].kernel  # 64 dst channels
    one_image = Geometry.build(Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3))
    assert not plan(one_image).launches["backward_input"].kernel
    k4 = Geometry.build(Family.CONV, 3, 64, (112, 112), (4, 4), (2, 2), (1, 1), batch=32)
    assert not plan(k4).launches["backward_input"].kernel


@pytest.mark.parametrize(("in_c", "out_c", "kernel", "precision", "dtype", "direct", "mma"), [
    (8, 8, (3, 3, 3), "highest", "float32", True, 0), (8, 9, (3, 3, 3), "highest", "float32", False, 0),
    (9, 8, (3, 3, 3), "highest", "float32", False, 0), (8, 8, (3, 3, 2), "highest", "float32", False, 0),
    (3, 16, (3, 3, 3), "highest", "float32", False, 0), (8, 17, (3, 3, 3), "highest", "float32", False, 0),
    (8, 8, (3, 3, 3), "high", "float32", True, 0), (8, 8, (3, 3, 3), "medium", "float32", True, 1),
    (8, 9, (3, 3, 3), "medium", "float32", True, 1), (8, 8, (3, 3, 2), "medium", "float32", True, 1),
    (3, 16, (3, 3, 3), "medium", "float32", False, 0),
    (8, 8, (3, 3, 3), "highest", "float64", True, 0),
    (8, 8, (3, 3, 3), "highest", "bfloat16", True, 0), (8, 8, (3, 3, 3), "medium", "bfloat16", True, 1),
    (16, 16, (3, 3, 3), "medium", "float16", True, 1),
])
def test_the_plans_take_it_for_stages_of_few_channels_and_large_windows(in_c, out_c, kernel, precision, dtype,
                                                                        direct, mma):
    """FMAs in every precision where it was measured faster than the GEMM, at least as accurate as TF32; in "medium"
    (float32 or 16-bit elements) the tensor-core form for 8 to 16 dst and source channels, windows of 9 offsets or
    more (past 16 channels: the next test)."""
    geom = Geometry.build(Family.CONV, in_c, out_c, (12, 12, 12), kernel, (1, 1, 1), (1, 1, 1), batch=2)
    made = plan(geom, dtype=dtype, precision=precision)
    assert made.launches["forward"].kernel == ("forward_direct" if direct else "")
    assert made.defines["FWD_DIRECT_MMA"] == mma
    assert made.launches["backward_weight"].kernel == ("backward_weight_direct" if direct else
                                                       made.launches["backward_weight"].kernel)
    # Where a direct tile exists at all (at most 16 dst channels), direct_tile gives it regardless of the rule.
    assert (direct_tile(direct_shapes(geom, 4)["forward"], H200) is not None) == (out_c <= 16)


@pytest.mark.parametrize(("in_c", "out_c", "dtype", "forward", "backward_input"), [
    (8, 17, "float32", "forward_direct", "backward_input_direct"),
    (17, 8, "float32", "forward_direct", "backward_input_direct"),
    (24, 24, "float32", "forward_direct", "backward_input_direct"),
    (24, 24, "bfloat16", "forward_direct", "backward_input_direct"),
    (16, 32, "float32", "forward_wgmma", "backward_input_direct"),  # wgmma takes 32 dst and 16 source channels
    (32, 32, "float16", "forward_wgmma", "backward_input_wgmma"),
    (8, 33, "float32", "", ""),  # 33 channels: more than the kernel holds; the GEMM (too few for wgmma)
])
def test_the_tensor_core_form_takes_up_to_32_channels_where_no_wgmma_does(in_c, out_c, dtype, forward,
                                                                          backward_input):
    """In "medium" the tensor-core direct form takes conv-shaped stages of 8 to 32 (MMA_DIRECT_MAX_M) dst and source
    channels that no wgmma tile takes (at least 32 dst and 16 source channels, no stride phases); the gather form's
    stride phases, which no wgmma takes, run direct at 32 channels too."""
    geom = Geometry.build(Family.CONV, in_c, out_c, (12, 12, 12), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=2)
    made = plan(geom, dtype=dtype, precision="medium")
    kernels = {stage: made.launches[stage].kernel for stage in ("forward", "backward_input")}
    assert kernels == {"forward": forward, "backward_input": backward_input}
    for stage, prefix in (("forward", "FWD"), ("backward_input", "BWI")):
        assert made.defines[f"{prefix}_DIRECT_MMA"] == int(kernels[stage].endswith("_direct"))
    # k5 s2: the gather form's 8 phases of up to 27 offsets
    strided = Geometry.build(Family.CONV, 32, 32, (12, 12, 12), (5, 5, 5), (2, 2, 2), (2, 2, 2), batch=2)
    phases = plan(strided, dtype=dtype, precision="medium").launches
    assert (phases["forward"].kernel, phases["backward_input"].kernel) == ("forward_wgmma", "backward_input_direct")


def test_groups_count_their_own_channels():
    """Depthwise-like: 64 channels in 32 groups are 2 a group, a direct stage of 32 groups x images x boxes."""
    geom = Geometry.build(Family.CONV, 64, 64, (10, 10, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), groups=32, batch=2)
    assert max(shape.m for shape in direct_shapes(geom, 4).values()) == 2
    p = plan(geom)
    assert p.launches["forward"].kernel == "forward_direct" and p.defines["FWD_DIRECT_MB"] == 2
    boxes = math.prod(-(-10 // p.defines[f"FWD_DIRECT_BOX{a}"]) for a in range(3))
    assert p.launches["forward"].grid == 2 * 32 * boxes
    tile_cells = math.prod(p.defines[f"FWD_DIRECT_BOX{a}"] for a in range(3))
    assert tile_cells == p.defines["FWD_DIRECT_V"] * p.launches["forward"].block


def test_without_a_direct_tile_every_stage_runs_its_gemm_and_the_defines_say_so():
    p = plan(CONV4D_N8, direct_chooser=no_direct)
    assert not any(launch.kernel for launch in p.launches.values())
    assert p.defines["FWD_DIRECT"] == p.defines["BWI_DIRECT"] == p.defines["BWW_DIRECT"] == 0
    assert all(p.defines[f"FWD_DIRECT_{field}"] == 1 for field in ("V", "MB", "CB", "BOX0", "BOX3"))
    assert all(p.defines[f"BWW_DIRECT_{field}"] == 1 for field in ("V", "LANES", "BOX0", "BOX3"))
    assert p.defines["BWW_SPLIT"] == p.splits["backward_weight"]  # the GEMM tile's own split


def test_the_weight_gradient_runs_direct_for_few_channels_and_large_windows():
    """The conv's (input channels x outer offsets rows) and the transpose's (output channels); the split is chosen
    for the batch's bucket (a power of two), so batches of 5 to 8 share the defines. Up to 16 D channels, 64 U
    channels and windows from 9 offsets run direct in every precision, a 4-D window's 16 U channels in two channel
    blocks of 216 rows; more D or U channels, or fewer offsets, keep the GEMM."""
    for family in (Family.CONV, Family.CONV_TRANSPOSE):
        geom = Geometry.build(family, 8, 4, (10, 10, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=6)
        shape = weight_shape(geom, 4)
        rows = (8 if family is Family.CONV else 4) * 9
        assert (shape.m * shape.source_c, direct_tile(shape, H200).rows) == (32, rows)
        p = plan(geom)
        assert p.launches["backward_weight"].kernel == "backward_weight_direct"
        assert p.defines == plan(dataclasses.replace(geom, batch=8)).defines
        assert plan(geom, precision="medium").launches["backward_weight"].kernel == "backward_weight_direct"
    for geom in (Geometry.build(Family.CONV, 16, 16, (10, 10, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=2),
                 Geometry.build(Family.CONV, 8, 8, (30, 30), (3, 3), (1, 1), (1, 1), batch=2),
                 Geometry.build(Family.CONV, 64, 8, (30, 30), (3, 3), (1, 1), (1, 1), batch=2)):
        for precision in ("highest", "high", "medium"):
            assert plan(geom, precision=precision).launches["backward_weight"].kernel == "backward_weight_direct"
    four_d = plan(Geometry.build(Family.CONV, 16, 16, (8,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=2))
    assert four_d.launches["backward_weight"].kernel == "backward_weight_direct"
    assert four_d.defines["BWW_DIRECT_CHANNEL_BLOCKS"] == 2 and four_d.launches["backward_weight"].block == 216
    for geom in (Geometry.build(Family.CONV, 16, 32, (10, 10, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), batch=2),
                 Geometry.build(Family.CONV, 128, 8, (30, 30), (3, 3), (1, 1), (1, 1), batch=2),
                 Geometry.build(Family.CONV, 8, 8, (300,), (5,), (1,), (2,), batch=2)):
        assert not plan(geom).launches["backward_weight"].kernel
        assert not plan(geom, precision="medium").launches["backward_weight"].kernel.endswith("_direct")


def test_boxes_fill_the_last_axis_first_then_double_the_others_innermost_first():
    assert direct_box((16, 16, 16, 16), 2, 256) == (2, 4, 4, 16)
    assert direct_box((16, 16, 16, 16), 4, 128) == (2, 4, 4, 16)
    assert direct_box((4096,), 4, 128) == (512,)
    assert direct_box((3, 5), 4, 128) == (4, 8)  # no axis grows past its extent's power of two
    assert direct_box((1, 1, 7), 4, 64) == (1, 1, 8)


def test_a_thread_takes_more_cells_where_its_boxes_cover_the_cells_as_well_and_the_grid_stays_large():
    """V = 2 unless a larger V (up to 8, within 32 sums a thread) boxes the cells with fewer idle threads, or as
    few (then the largest V), and keeps 2 blocks an SM."""
    k7 = direct_shapes(Geometry.build(Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3), batch=32), 4)
    # 112 cells a line: 16 threads of 7 cover them; 64 of 2, 32 of 4 and 16 of 8 cover 128.
    assert [covered(cut_tile(k7["backward_input"], v, 256, H200), k7["backward_input"]) for v in (2, 4, 7, 8)] == \
        [0.875, 0.875, 1.0, 0.875]
    assert direct_tile(k7["backward_input"], H200) == DirectTile(v=7, mb=3, cb=8, box=(16, 112))
    one_image = direct_shapes(Geometry.build(Family.CONV, 8, 8, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4), 4)
    batched = direct_shapes(CONV4D_N8, 4)
    # 8 dst channels: V = 4 at most (32 sums); its 64 boxes of one image are under 2 an SM, 8 images' 512 are not.
    assert direct_tile(one_image["forward"], H200).v == 2
    assert direct_tile(batched["forward"], H200).v == 4
    sixteen = DirectShape(cells=(8, 40), taps=(3, 3), step=(1, 1), spacing=(1, 1), phases=1, m=16, source_c=4,
                          images=64, groups=1, staged_bytes=4)
    assert direct_tile(sixteen, H200).v == 2  # 16 channels: 2 cells make the 32 sums


def test_the_direct_tile_is_chosen_for_the_batch_bucket_and_launched_for_the_batch():
    """Batches of 9 to 16 share the defines: with 9 images the k7 s2 input gradient's boxes of 16 x 112 cells
    (V = 7) would be 252 blocks, under 2 an SM; the bucket's 16 images make 448."""
    k7 = Geometry.build(Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3), batch=9)
    p, bucket = plan(k7), plan(dataclasses.replace(k7, batch=16))
    assert p.defines == bucket.defines and p.defines["BWI_DIRECT_V"] == 7
    assert (p.launches["backward_input"].grid, bucket.launches["backward_input"].grid) == (9 * 28, 16 * 28)


def test_a_long_dilated_window_leaves_the_stage_to_its_gemm():
    """V shrinks until a thread's source run fits DIRECT_MAX_SPAN registers; a run over that even for one
    cell means no direct tile."""
    common = {"cells": (40,), "step": (1,), "phases": 1, "m": 4, "source_c": 4, "images": 1, "groups": 1,
              "staged_bytes": 4}
    assert direct_tile(DirectShape(taps=(3,), spacing=(15,), **common), H200).v == 2  # 1 + 30 + 1 cells
    assert direct_tile(DirectShape(taps=(3,), spacing=(16,), **common), H200) is None  # 0 + 32 + 1


def test_every_direct_tile_stages_within_its_share_of_the_shared_memory():
    """A step of one channel fits the static shared memory; the channels a step fit the grid's share of an SM's
    (staging_bytes), and a launch past the static limit takes them as its dynamic shared memory."""
    for family, rank, dtype in itertools.product((Family.CONV, Family.CONV_TRANSPOSE), range(1, 9),
                                                 ("float32", "float64")):
        geom = representative_geometry(family, rank)
        launches = plan(geom, dtype=dtype, direct_chooser=direct_tile).launches
        for stage, shape in direct_shapes(geom, 8 if dtype == "float64" else 4).items():
            tile = direct_tile(shape, H200)
            if tile is not None:
                staged = direct_shared_bytes(tile, shape)
                assert direct_shared_bytes(dataclasses.replace(tile, cb=1), shape) <= H200.shared_per_block
                assert staged <= staging_bytes(direct_grid(tile, shape), H200)
                assert tile.threads <= 256 and tile.box[-1] % tile.v == 0
                assert launches[stage].shared_bytes == (staged if staged > H200.shared_per_block else 0)


def test_the_channels_a_step_leave_room_for_three_blocks_an_sm_or_the_grid_s_fewer():
    """An SM's 228 KB less 1 KB a block: 75 KB a block for 3 blocks, 113 KB for 2, the opt-in limit for one; never
    under the static 48 KB."""
    assert [staging_bytes(grid, H200) for grid in (0, 132, 133, 264, 265, 10_000)] == \
        [227 * 1024, 227 * 1024, 113 * 1024, 113 * 1024, 75 * 1024, 75 * 1024]
    few = dataclasses.replace(H200, shared_per_sm=96 * 1024)
    assert staging_bytes(10_000, few) == 48 * 1024


def test_the_halo_is_the_windows_of_the_box():
    shape = DirectShape(cells=(16, 16), taps=(3, 5), step=(2, 1), spacing=(1, 2), phases=1, m=8, source_c=4,
                        images=1, groups=1, staged_bytes=4)
    assert halo((4, 16), shape) == (3 * 2 + 3) * (15 + 8 + 1)
    tile = DirectTile(v=4, mb=8, cb=2, box=(4, 16))
    assert direct_shared_bytes(tile, shape) == (2 * 15 * 8 + 2 * 9 * 24) * 4


NC_16 = Geometry.build(Family.CONV, 16, 16, (20,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=4)


def test_the_tensor_core_direct_tile_of_a_16_channel_4d_stage():
    """mma_tile: 16 dst channels (two n tiles of 8), 8 source channels a step; the box of 2 x 2 x 4 x 20 cells (the
    last axis whole, the others doubled while within 512), 20 tiles of 16 in 10 warps of 2; its staging a row of 8
    words per (window offset, dst channel) and per halo cell: (81 x 16 + 4 x 4 x 6 x 22) x 8 x 4 bytes, within an SM's
    share for one block, so the whole window a step."""
    shape = direct_shapes(NC_16, 4, MMA_DIRECT_MODE)["forward"]
    tile = mma_tile(shape, H200)
    assert tile == DirectTile(v=2, mb=16, cb=8, box=(2, 2, 4, 20), mma=MMA_DIRECT_MODE, slices=1)
    assert tile.threads == 320
    assert direct_shared_bytes(tile, shape) == (81 * 16 + 4 * 4 * 6 * 22) * 8 * 4
    assert direct_shared_bytes(tile, shape) <= H200.shared_optin_per_block
    assert mma_tile(direct_shapes(NC_16, 4)["forward"], H200) is None  # FMAs: no tensor cores
    assert mma_tile(dataclasses.replace(shape, m=33), H200) is None  # past four n tiles


def test_a_window_too_large_for_one_step_is_staged_in_slices_of_its_first_axis():
    """A 4-D k5 window of 10 -> 10 channels: its 625 offsets' weights alone (625 x 16 rows of 8 words, 320 KB) exceed a
    block's shared memory, so the first axis's 5 offsets go one a step: 125 x 16 weight rows and a halo of 1 x 8 x 12 x
    20 cells (the fitted box 1 x 4 x 8 x 16 of 512 cells: one cell deep along the sliced axis, no halo row staged
    twice). The slices divide the first axis's offsets; at rank 1 there are none (its first axis is the last, unrolled
    whole)."""
    geom = Geometry.build(Family.CONV, 10, 10, (16,) * 4, (5,) * 4, (1,) * 4, (2,) * 4, batch=2)
    shape = direct_shapes(geom, 4, MMA_DIRECT_MODE)["forward"]
    tile = mma_tile(shape, H200)
    assert tile == DirectTile(v=2, mb=16, cb=8, box=(1, 4, 8, 16), mma=MMA_DIRECT_MODE, slices=5)
    assert direct_shared_bytes(tile, shape) == (125 * 16 + 1 * 8 * 12 * 20) * 8 * 4
    assert direct_shared_bytes(dataclasses.replace(tile, slices=1), shape) > H200.shared_optin_per_block
    assert mma_slices(shape) == [1, 5]
    assert mma_slices(dataclasses.replace(shape, taps=(6, 5))) == [1, 2, 3, 6]
    assert mma_slices(dataclasses.replace(shape, cells=(64,), taps=(9,), step=(1,), spacing=(1,))) == [1]
    made = plan(geom, precision="medium")
    assert made.defines["FWD_DIRECT_SLICES"] == made.defines["BWI_DIRECT_SLICES"] == 5
    assert made.defines["FWD_DIRECT_MMA"] == 1 and plan(geom).defines["FWD_DIRECT_SLICES"] == 1  # FMAs: whole


def test_the_tensor_core_direct_box_is_fitted_to_extents_that_are_not_powers_of_two():
    """mma_box doubles the outer axes: on a 7-D grid of 5^7 dst cells (a 6^7 input, k2, 24 channels) its box 2 x 2 x 2 x
    2 x 2 x 2 x 5 holds 320 cells for every 125 of the grid and needs the window's first axis in two slices. The
    fitted box 1 x 1 x 1 x 1 x 5 x 5 x 5 (125 cells, eight tiles) moves about 40% of the rows through shared memory
    (mma_traffic) and fits in one slice. On a 25^4 grid fewer padded cells (2 x 2 x 2 x 25) stage more halo and
    weights than mma_box's 2 x 2 x 4 x 25, which stays."""
    geom = Geometry.build(Family.CONV, 24, 24, (6,) * 7, (2,) * 7, (1,) * 7, (0,) * 7, batch=2)
    shape = direct_shapes(geom, 4, MMA_DIRECT_MODE)["forward"]
    tile = mma_tile(shape, H200)
    assert tile == DirectTile(v=2, mb=24, cb=8, box=(1, 1, 1, 1, 5, 5, 5), mma=MMA_DIRECT_MODE, slices=1)
    doubled = DirectTile(v=2, mb=24, cb=8, box=(2, 2, 2, 2, 2, 2, 5), mma=MMA_DIRECT_MODE, slices=2)
    assert mma_box(shape.cells, 512) == doubled.box
    assert mma_traffic(doubled, shape) == 3 ** 6 * (320 * 128 + 2 * 2 * 3 ** 5 * 6 + 128 * 24)
    assert mma_traffic(tile, shape) == 5 ** 4 * (128 * 128 + 6 ** 3 * 2 ** 4 + 128 * 24)
    assert mma_traffic(tile, shape) / mma_traffic(doubled, shape) < 0.4
    geom = Geometry.build(Family.CONV, 16, 16, (25,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=4)
    shape = direct_shapes(geom, 4, MMA_DIRECT_MODE)["forward"]
    tile = mma_tile(shape, H200)
    assert tile.box == mma_box(shape.cells, 512) == (2, 2, 4, 25)
    assert mma_traffic(tile, shape) < mma_traffic(dataclasses.replace(tile, box=(2, 2, 2, 25)), shape)


@pytest.mark.parametrize(("dtype", "precision", "mode"), [("float32", "medium", MMA_DIRECT_MODE),
                                                          ("float32", "high", 0), ("float32", "highest", 0),
                                                          ("float64", "highest", 0),
                                                          ("bfloat16", "medium", MMA_DIRECT_MODE),
                                                          ("float16", "medium", MMA_DIRECT_MODE),
                                                          ("bfloat16", "highest", 0)])
def test_only_tf32_offers_the_direct_kernel_tensor_cores(dtype, precision, mode):
    """The plan hands the direct chooser of every stage (the weight gradient's too) DirectShape.mma = 1 in "medium",
    on float32 or 16-bit elements (TF32 holds 16-bit values exactly): 3xTF32 keeps the FMAs, which are as accurate."""
    seen = []
    plan(NC_16, dtype=dtype, precision=precision, direct_chooser=lambda shape, hw: seen.append((shape.weight, shape.mma)))
    assert sorted(seen) == [(False, mode), (False, mode), (True, mode)]



def test_the_tensor_core_direct_box():
    """The last axis whole up to the cells (else that many of it), then the others doubled from the innermost out while
    the box stays within them."""
    assert mma_box((20, 20, 20, 20), 512) == (2, 2, 4, 20)
    assert mma_box((4096,), 256) == (256,)
    assert mma_box((3, 5, 9), 64) == (2, 2, 9)
    assert mma_box((1, 7, 30), 128) == (1, 4, 30)


def test_the_weight_gradient_takes_the_tensor_cores_for_16_channels_and_4d_windows():
    """In "medium" the weight gradient of 16 D and 16 U channels and a window of 64 offsets or more runs its
    tensor-core form (two outer window offsets a warp: 24 sums an offset row, 64 a thread at most; 14 warps for 27
    rows), where it beat the FMA form and the GEMM, as on a 4^3 or a 2^6 window; at 8 channels, at 27 offsets, and in
    "high" it keeps the FMA form."""
    made = plan(NC_16, precision="medium")
    assert made.defines["BWW_DIRECT"] == made.defines["BWW_DIRECT_MMA"] == 1 and made.defines["BWW_DIRECT_V"] == 2
    launch = made.launches["backward_weight"]
    assert launch.block == 32 * 14 and launch.shared_bytes > 0
    # Registers fitted to two blocks an SM (launch bounds) and as many parts: 2 x 132 SMs, their partial sums 22 MB.
    assert made.defines["BWW_DIRECT_MIN_BLOCKS"] == 2 and made.defines["BWW_SPLIT"] == 2 * H200.sm_count
    assert plan(NC_16, precision="high").defines["BWW_DIRECT_MMA"] == 0
    assert plan(NC_16, precision="high").defines["BWW_DIRECT_MIN_BLOCKS"] == 1  # FMAs: no launch bounds
    for geom in (Geometry.build(Family.CONV, 8, 8, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8),
                 Geometry.build(Family.CONV, 16, 16, (16,) * 3, (3,) * 3, (1,) * 3, (1,) * 3, batch=16)):
        defines = plan(geom, precision="medium").defines
        assert defines["BWW_DIRECT"] == 1 and defines["BWW_DIRECT_MMA"] == 0
    for spatial, k in (((32,) * 3, 4), ((8,) * 6, 2)):
        geom = Geometry.build(Family.CONV, 16, 16, spatial, (k,) * len(spatial), (1,) * len(spatial),
                              (k // 2,) * len(spatial), batch=4)
        assert plan(geom, precision="medium").defines["BWW_DIRECT_MMA"] == 1, spatial


@pytest.mark.parametrize(("in_c", "out_c", "dtype", "kernel"), [
    (24, 24, "float32", "backward_weight_direct"), (32, 32, "float32", "backward_weight_direct"),
    (24, 24, "bfloat16", "backward_weight_direct"), (32, 32, "bfloat16", "backward_weight_wgmma"),
    (32, 32, "float16", "backward_weight_wgmma"), (24, 32, "float32", "backward_weight_wgmma"),
    (32, 24, "float32", ""),
])
def test_the_weight_gradient_keeps_the_tensor_cores_to_32_channels_unless_a_16_bit_wgmma_reaches_it(in_c, out_c,
                                                                                                   dtype, kernel):
    """Past 16 channels, as many D as U, up to 32: the tensor-core weight tile, where it beat the GEMM and the TF32
    wgmma, and the 16-bit GEMM at 24 channels; the 16-bit wgmma, twice TF32's rate, keeps 32 16-bit channels; unequal
    channels keep what they had."""
    geom = Geometry.build(Family.CONV, in_c, out_c, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8)
    made = plan(geom, dtype=dtype, precision="medium")
    assert made.launches["backward_weight"].kernel == kernel
    assert made.defines["BWW_DIRECT_MMA"] == int(kernel.endswith("_direct"))


@pytest.mark.parametrize(("spatial", "k", "tile"), [((64, 64), 8, True), ((16,) * 3, 4, False), ((8,) * 6, 2, False),
                                                     ((6,) * 7, 2, False)], ids=["2d_k8", "3d_k4", "6d_k2", "7d_k2"])
@pytest.mark.parametrize("channels", [24, 32])
def test_past_16_channels_the_weight_tile_needs_72_registers_a_thread(spatial, k, channels, tile):
    """Past 16 channels the tensor-core weight tile's two tiles of 16 D channels hold their sums in registers: where
    the launch bounds of 16 warps at two blocks an SM leave 64 a thread (16 outer window offsets and more: 4^3, 2^6,
    2^7) it lost to the GEMM, with 8 warps (an 8^2 window, 128 registers) it won, as with 14 at rank 4 (72)."""
    rank = len(spatial)
    geom = Geometry.build(Family.CONV, channels, channels, spatial, (k,) * rank, (1,) * rank, (0,) * rank, batch=4)
    shape = weight_shape(geom, 4, MMA_DIRECT_MODE)
    registers = weight_mma_registers(weight_mma_tile(shape, H200), H200)
    assert registers == (128 if tile else 64)
    assert plan(geom, precision="medium").defines["BWW_DIRECT_MMA"] == int(tile)
    rank_4 = Geometry.build(Family.CONV, channels, channels, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8)
    assert weight_mma_registers(weight_mma_tile(weight_shape(rank_4, 4, MMA_DIRECT_MODE), H200), H200) == 72


def test_the_tensor_core_weight_tile():
    """weight_mma_tile for 16 -> 16 channels and a 3^4 window: 24 sums an outer offset (3 offsets x 2 U tiles x 4), so
    two outer offsets a warp and 14 warps for 27; the box of 2 x 2 x 2 x 20 cells, its staging 16 rows of D's 160 cells
    and 16 of U's 4 x 4 x 4 x 22 halo cells, each padded to 4 past a multiple of 8 words. Where a row's sums would
    pass 64 or the warps 16, the U channels in more blocks: 24 -> 24 channels in 3 blocks of 8 (24 sums a row, 14
    warps; 2 blocks of 12 would need 27), 32 -> 32 in 4, 32 D channels with K_last 5 in 2 (40 sums a row). None where
    even 8 U channels a block leave too many: 32 D channels with K_last 9 (72 sums a row), a 5^4 window (125 outer
    offsets, 42 warps)."""
    shape = weight_shape(NC_16, 4, MMA_DIRECT_MODE)
    tile = weight_mma_tile(shape, H200)
    assert (tile.v, tile.rows, tile.threads, tile.box, tile.channel_blocks) == (2, 27, 32 * 14, (2, 2, 2, 20), 1)
    assert weight_mma_shared_bytes(tile, shape) == (16 * (160 + 4) + 16 * (4 * 4 * 4 * 22 + 4)) * 4
    assert weight_mma_tile(weight_shape(NC_16, 4), H200) is None  # FMAs
    k5 = dataclasses.replace(shape, taps=(5,) * 4)
    assert weight_mma_tile(k5, H200) is None
    for m, source_c, taps, blocks, v in ((24, 24, (3,) * 4, 3, 2), (32, 32, (3,) * 4, 4, 2), (32, 16, (3, 3, 5), 2, 1)):
        wide = weight_mma_tile(dataclasses.replace(shape, m=m, source_c=source_c, taps=taps), H200)
        assert (wide.channel_blocks, wide.v, wide.rows) == (blocks, v, math.prod(taps[:-1])), (m, source_c, taps)
    assert weight_mma_tile(dataclasses.replace(shape, m=32, taps=(3, 3, 9)), H200) is None


def test_the_weight_tile_s_box_stages_the_fewest_values_over_the_grid():
    """fitted_box: 5^7 cells of D (24 channels, a 2^7 window) in boxes of 1x1x1x2x2x5x5 (100 cells, 69% of the grid's
    box cells D's), not mma_box's 1x2x2x2x2x2x5 (160 cells, 40%): fewer values staged over the grid, within the shared
    memory of two blocks an SM. Where the extents are powers of two mma_box's box already stages the fewest (and is
    kept on a tie): the 16^4 grid's 2x2x4x16."""
    geom = Geometry.build(Family.CONV, 24, 24, (6,) * 7, (2,) * 7, (1,) * 7, (0,) * 7, batch=2)
    shape = weight_shape(geom, 4, MMA_DIRECT_MODE)
    tile = weight_mma_tile(shape, H200)
    assert tile.box == (1, 1, 1, 2, 2, 5, 5) and mma_box(shape.cells, 256) == (1, 2, 2, 2, 2, 2, 5)
    channels = shape.source_c // tile.channel_blocks
    assert grid_staging(tile.box, shape, channels) < grid_staging(mma_box(shape.cells, 256), shape, channels)
    limit = H200.shared_per_sm // 2 - H200.shared_reserved_per_block
    assert weight_mma_shared_bytes(tile, shape) <= limit
    wide = weight_shape(Geometry.build(Family.CONV, 24, 24, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8), 4,
                        MMA_DIRECT_MODE)
    assert weight_mma_tile(wide, H200).box == mma_box(wide.cells, 256) == (2, 2, 4, 16)



@pytest.mark.parametrize("family", [Family.CONV, Family.CONV_TRANSPOSE], ids=lambda f: f.value)
@pytest.mark.parametrize(("stride", "dilation"), [((1,) * 4, (1,) * 4), ((2, 1, 1, 2), (1,) * 4), ((1,) * 4, (2, 1, 1, 1))],
                         ids=["plain", "strided", "dilated"])
def test_the_weight_kernels_launch_bounds_are_its_launch(family, stride, dilation):
    """The tensor-core weight kernel's __launch_bounds__ (_direct_weight.cu.j2: 32 threads a warp of V outer window
    offsets, from the K<a> and BWW_DIRECT_V defines) name the block its launch has: a block past them would not
    launch."""
    geom = Geometry.build(family, 16, 16, (9,) * 4, (3,) * 4, stride, (1,) * 4, dilation=dilation, batch=2)
    made = plan(geom, precision="medium")
    assert made.defines["BWW_DIRECT_MMA"] == 1 and made.defines["BWW_DIRECT_MIN_BLOCKS"] == 2
    outer = math.prod(made.defines[f"K{a}"] for a in range(3))
    assert made.launches["backward_weight"].block == 32 * -(-outer // made.defines["BWW_DIRECT_V"]) == 448
