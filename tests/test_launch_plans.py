"""Launch plans (pure Python, no GPU): the scratch of a split reduction stays bounded whatever the
geometry, so no op needs an im2col-sized workspace; the tile chooser is a parameter of the plan;
plans set exactly the defines of the contract."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from convgen.cuda_launch import (
    BIAS_CELLS_PER_BLOCK,
    GEMM_STAGES,
    H200,
    PACK_MIN_MACS,
    SPLIT_WORKSPACE_BYTES,
    GemmTile,
    batch_bucket,
    ceil_div,
    choose_tile,
    gemm_cost,
    gemm_shapes,
    nvrtc_options,
    opted_in_shared,
    plan,
    representative_geometry,
    tile_candidates,
)
from convgen.gemm_shapes import phase_offsets
from convgen.generated.contract import KERNELS, gemm_dynamic_shared_bytes, gemm_shared_bytes, gemm_slice_bytes
from convgen.generator import contract, stages
from convgen.geometry import Family, Geometry
from convgen.tile_calibration import HOST_LAUNCH_CYCLES, KERNEL_CYCLES, PACK_ANY_TILE_MACS, PACK_MIN_MACS_DIRECT
from convgen.tile_model import a_quads, packs_weight
from forced_tiles import FORCED_GEOMETRY, FORCED_TILES, FORCED_TILES_FLOAT64, forced_chooser

SIZES = [
    (Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3)),
    (Family.CONV, 16, 128, (128, 16, 128), (3, 5, 5), (2, 1, 1), (0, 1, 0)),
    (Family.CONV, 256, 256, (14, 14), (3, 3), (1, 1), (1, 1)),
    (Family.CONV_TRANSPOSE, 256, 128, (224, 128, 224), (1, 1, 5), (1, 1, 1), (0, 0, 0)),
    (Family.CONV_TRANSPOSE, 8, 64, (64, 64, 64), (3, 3, 3), (2, 2, 2), (1, 1, 1)),
    (Family.CONV, 8, 8, (16, 16, 16, 16), (3, 3, 3, 3), (1, 1, 1, 1), (1, 1, 1, 1)),
]


@pytest.mark.parametrize("args", SIZES, ids=lambda a: f"{a[0].value}-{a[1]}to{a[2]}-{'x'.join(map(str, a[3]))}")
def test_split_scratch_is_bounded(args):
    geom = Geometry.build(*args)
    geometry_plan = plan(geom)
    for stage, shape in gemm_shapes(geom).items():
        split = geometry_plan.splits[stage]
        scratch = split * shape.outputs * shape.m * shape.n * 4 if split > 1 else 0
        assert scratch <= SPLIT_WORKSPACE_BYTES, (stage, split, scratch)


def test_every_stage_of_every_conv_family_is_planned():
    for family, rank in itertools.product((Family.CONV, Family.CONV_TRANSPOSE), range(1, 9)):
        geom = Geometry.build(family, 2, 3, (5,) * rank, (3,) * rank, (2,) * rank, (1,) * rank)
        geometry_plan = plan(geom)
        assert set(geometry_plan.splits) == {"forward", "backward_input", "backward_weight", "backward_bias"}
        assert all(math.prod(geom.output_shape) and launch.grid > 0
                   for stage, launch in geometry_plan.launches.items()
                   if stage in geometry_plan.splits)


def test_the_bias_gradient_splits_its_cells_only_when_channels_leave_sms_idle():
    """Parts per channel from the channels, the cells and the batch's bucket: two blocks per SM, each block
    summing at least BIAS_CELLS_PER_BLOCK cells; one part, and no reduce launch, for one image or few cells."""
    few = Geometry.build(Family.CONV, 8, 8, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8)
    many = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    small = Geometry.build(Family.CONV, 4, 4, (8, 8), (3, 3), (1, 1), (1, 1), batch=32)
    one_image = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1))
    expected = {few: math.ceil(2 * H200.sm_count / 8), many: math.ceil(2 * H200.sm_count / 64), small: 1,
                one_image: 1}
    assert 32 * 56 * 56 // BIAS_CELLS_PER_BLOCK > expected[many] and 8 * 16**4 // BIAS_CELLS_PER_BLOCK > expected[few]
    for geom, parts in expected.items():
        geometry_plan = plan(geom)
        assert geometry_plan.splits["backward_bias"] == geometry_plan.defines["BIAS_SPLIT"] == parts
        assert geometry_plan.launches["backward_bias"].grid == geom.out_c * parts
        assert (geometry_plan.launches["backward_bias_reduce"].grid > 0) == (parts > 1)
        if geom.batch:  # a batch of the same bucket compiles nothing new
            assert plan(replace(geom, batch=geom.batch - 1)).defines["BIAS_SPLIT"] == parts


def test_a_reduce_sums_quads_only_where_they_leave_no_sm_idle():
    """A thread per quad of elements from SPLIT_SUM_QUAD_COUNT elements an output on, else a thread per element: bf16
    N32 64->64's dW (36864 elements, its parts summed by 36 blocks as quads) runs 144 blocks, N8 128->128's (147456)
    stays in quads, 144 blocks either way; the bias's 64 sums are a thread each."""
    assert contract.SPLIT_SUM_QUAD_COUNT == 131072
    many = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    wide = Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8)
    for geom, dw in ((many, 36864), (wide, 147456)):
        made = plan(geom, dtype="bfloat16", precision="medium")
        assert made.splits["backward_weight"] > 1 and geom.out_c * geom.in_c * 9 == dw
        assert made.launches["backward_weight_reduce"].grid == 144
    assert plan(many).launches["backward_bias_reduce"].grid == 1


def test_the_default_chooser_takes_the_cheapest_candidate():
    geom = Geometry.build(*SIZES[2])
    for shape in gemm_shapes(geom).values():
        candidates = tile_candidates(shape, H200)
        cheapest = min(gemm_cost(shape, tile, H200) for tile in candidates)
        assert gemm_cost(shape, choose_tile(shape, H200), H200) == cheapest


def test_stages_too_short_to_hide_a_second_launch_are_not_split():
    """A tiny conv (4->4 channels, 8x8) runs each stage whole, though a split would be cheaper on the GPU;
    the one-image conv1d 64->64 4096 is long enough that its forward split pays."""
    tiny = Geometry.build(Family.CONV, 4, 4, (8, 8), (3, 3), (1, 1), (1, 1))
    for stage, shape in gemm_shapes(tiny).items():
        candidates = tile_candidates(shape, H200)
        assert min(candidates, key=lambda t: gemm_cost(shape, t, H200)).split > 1, stage  # the GPU's choice
        whole = min(gemm_cost(shape, t, H200) for t in candidates if t.split == 1)
        assert whole <= KERNEL_CYCLES + HOST_LAUNCH_CYCLES
    assert plan(tiny).splits == {"forward": 1, "backward_input": 1, "backward_weight": 1, "backward_bias": 1}
    conv1d = Geometry.build(Family.CONV, 64, 64, (4096,), (5,), (1,), (2,))
    assert plan(conv1d).splits["forward"] > 1


def test_plan_takes_the_chooser_it_is_given():
    geom = Geometry.build(*SIZES[0])
    tiles = {}

    def smallest(shape, hardware):
        tiles[shape] = min(tile_candidates(shape, hardware), key=lambda t: (t.bm * t.bn, t.split))
        return tiles[shape]

    geometry_plan = plan(geom, H200, smallest)
    for stage, shape in gemm_shapes(geom).items():
        assert geometry_plan.defines[f"{GEMM_STAGES[stage]}_BM"] == tiles[shape].bm
    assert nvrtc_options(geometry_plan)[1:] == tuple(f"-D{k}={v}" for k, v in geometry_plan.defines.items())


def test_candidates_fit_the_hardware_they_are_chosen_for():
    shape = gemm_shapes(Geometry.build(*SIZES[2]))["forward"]
    small = replace(H200, shared_per_block=8 * 1024)
    fitting = tile_candidates(shape, small)
    assert fitting and all(gemm_shared_bytes(t.bm, t.bn, t.bk) <= 8 * 1024 for t in fitting)
    assert len(fitting) < len(tile_candidates(shape, H200))


def test_plans_set_the_defines_the_contract_lists():
    for family, rank in itertools.product(Family, range(1, 9)):
        geom = representative_geometry(family, rank)
        assert tuple(plan(geom).defines) == KERNELS[(family, rank)].defines


def test_an_unknown_family_stage_is_named():
    with pytest.raises(ValueError, match=r"^conv has no stage 'forwrd' \(stages: forward_pack, forward, forward_direct, forward_wgpack, "
                       r"forward_wgsource, forward_wgmma, forward_reduce, "
                       r"backward_input_pack, "):
        stages.stage(contract.Family.CONV, "forwrd")


def test_batch_sizes_share_the_defines_of_their_bucket():
    """The batch is a kernel argument: sizes of one bucket (the next power of two) plan the same
    defines, so a new batch size compiles nothing; the grids follow the batch itself."""
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]
    args = (Family.CONV, 5, 6, (9, 8), (3, 3), (2, 1), (1, 1))
    three, four = plan(Geometry.build(*args, batch=3)), plan(Geometry.build(*args, batch=4))
    assert three.defines == four.defines
    assert three.launches["forward"].grid * 4 == four.launches["forward"].grid * 3
    assert three.launches["backward_weight"].grid == four.launches["backward_weight"].grid


def test_a_batch_multiplies_conv_blocks_and_weight_slices():
    geom, batched = Geometry.build(*SIZES[2]), Geometry.build(*SIZES[2], batch=3)
    for stage, shape in gemm_shapes(batched).items():
        single = gemm_shapes(geom)[stage]
        if shape.conv:
            assert (shape.grid(32, 32, 1), shape.chunks) == (3 * single.grid(32, 32, 1), single.chunks)
        else:
            assert (shape.grid(32, 32, 1), shape.chunks) == (single.grid(32, 32, 1), 3 * single.chunks)


def test_phase_offsets_are_the_window_offsets_each_phase_reaches():
    """Per stride phase rho, the offsets k < K with k*D = rho + P (mod S), counted by enumeration:
    with dilation some phases reach none (gcd(S, D) > 1); every offset serves exactly one phase."""
    for k, s, p, d in itertools.product(range(1, 6), range(1, 6), range(4), range(1, 7)):
        counts = phase_offsets(k, s, p, d)
        assert counts == tuple(sum((rho + p - kappa * d) % s == 0 for kappa in range(k)) for rho in range(s))
    assert phase_offsets(5, 2, 0, 2) == (5, 0)  # even dilation, even stride: odd residues see nothing


def test_groups_are_block_diagonal_gemms_of_the_per_group_shape():
    """A grouped stage is `groups` GEMMs of the per-group shape: groups times the blocks, the
    per-group channels in M, the reduction and the weight gradient's N; its outputs keep all channels."""
    args = (Family.CONV_TRANSPOSE, 12, 18, (9, 8), (3, 3), (2, 1), (1, 1))
    single, grouped = gemm_shapes(Geometry.build(*args)), gemm_shapes(Geometry.build(*args, groups=3))
    assert (grouped["forward"].m, grouped["forward"].source_c) == (18 // 3, 12 // 3)
    assert (grouped["backward_input"].m, grouped["backward_input"].source_c) == (12 // 3, 18 // 3)
    assert (grouped["backward_weight"].m, grouped["backward_weight"].n) == (12 // 3, 18 // 3 * 9)
    for stage, shape in grouped.items():
        assert shape.grid(32, 32, 1) == 3 * ceil_div(shape.m, 32) * ceil_div(shape.columns, 32) * shape.phases
        assert shape.count == single[stage].count // (1 if shape.conv else 3)
    grid = plan(Geometry.build(*args, groups=3), choose_tile=lambda shape, hw: GemmTile(32, 32, shape.bk, 4, 4, 1))
    assert grid.defines["GROUPS"] == 3 and grid.launches["forward"].grid == grouped["forward"].grid(32, 32, 1)


def test_large_conv_stages_read_a_repacked_weight():
    """A large conv-shaped stage whose tile stages more of A than of B reads A from the weight repacked
    by its `_pack` kernel (one thread per weight element): a gather-form stage (weight read src-major:
    conv backward_input, transpose forward) always, a direct-form one only where A loads in 16-byte
    quads of rows (a_quads; conv2d 3->64 k7's forward slices 3 channels, too few for a quad per
    thread) and PACK_MIN_MACS_DIRECT multiply-adds. Small convs do not pack; the weight gradient has no
    pack kernel."""
    macs = 8 * 128 * 128 * 128 * 128 * 9  # images x dst channels x cells x src channels x window, per stage
    assert macs >= PACK_MIN_MACS
    weight_blocks = ceil_div(128 * 128 * 9, 256)
    for family in (Family.CONV, Family.CONV_TRANSPOSE):
        geom = Geometry.build(family, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8)
        large_plan = plan(geom)
        for stage, shape in gemm_shapes(geom).items():
            prefix = GEMM_STAGES[stage]
            if not shape.conv:
                assert f"{prefix}_PACKED" not in large_plan.defines and f"{stage}_pack" not in large_plan.launches
                continue
            assert large_plan.defines[f"{prefix}_BM"] >= large_plan.defines[f"{prefix}_BN"]
            tile = GemmTile(*(large_plan.defines[f"{prefix}_{field}"] for field in ("BM", "BN", "BK", "TM", "TN")), 1)
            assert shape.weight_src_major or a_quads(shape, tile), stage
            assert large_plan.defines[f"{prefix}_PACKED"] == 1
            assert large_plan.launches[f"{stage}_pack"].grid == weight_blocks
    k7 = Geometry.build(Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3), batch=8)  # 2^29.8 a stage
    k7_forward = gemm_shapes(k7)["forward"]
    k7_tile = GemmTile(64, 64, k7_forward.bk, 8, 8, 1)  # bm >= bn, but 3 channels a slice: no quads
    assert not a_quads(k7_forward, k7_tile) and not packs_weight(k7_forward, k7_tile)
    assert plan(k7).defines["FWD_PACKED"] == 0 and plan(k7).launches["forward_pack"].grid == 0
    # From PACK_ANY_TILE_MACS on, FMA stages pack whatever their tile; tensor-core ones keep the rules above.
    k7_n32 = gemm_shapes(replace(k7, batch=32))["forward"]
    assert k7_n32.outputs * k7_n32.m * k7_n32.n * k7_n32.source_c * k7_n32.k_size >= PACK_ANY_TILE_MACS
    assert packs_weight(k7_n32, replace(k7_tile, bn=256)) and not packs_weight(replace(k7_n32, mma=1), k7_tile)
    conv1d = Geometry.build(Family.CONV, 64, 64, (4096,), (5,), (1,), (2,))  # 2^26.3 multiply-adds a stage
    assert PACK_MIN_MACS <= 64 * 64 * 4096 * 5 < PACK_MIN_MACS_DIRECT
    assert plan(conv1d).defines["FWD_PACKED"] == 0 and plan(conv1d).defines["BWI_PACKED"] == 1
    small_plan = plan(representative_geometry(Family.CONV_TRANSPOSE, 3))
    assert small_plan.defines["FWD_PACKED"] == 0 and small_plan.defines["BWI_PACKED"] == 0
    assert small_plan.launches["forward_pack"].grid == 0 and small_plan.launches["backward_input_pack"].grid == 0


def stages_packed_a_by_quads(defines: dict[str, int], prefix: str, rows: int) -> bool:
    """_gemm_conv.cu.j2's A_VECTOR for a stage whose PACKED is 1: M and BM multiples of 4 and every thread
    the same number of four-row quads of the BM x BK slice."""
    bm, bn, bk, tm, tn = (defines[f"{prefix}_{field}"] for field in ("BM", "BN", "BK", "TM", "TN"))
    threads = (bm // tm) * (bn // tn)
    return rows % 4 == 0 and bm % 4 == 0 and (bm * bk) % (4 * threads) == 0


def test_the_forced_tiles_stage_repacked_a_both_ways():
    """The GPU tests' forced tiles and geometries stage a repacked A four rows at a time in some cases
    and one element at a time in others, in both stage forms (both paths of load_a run against the CPU
    tape): per dtype, the (form, quads) pairs that occur are all four."""
    for tiles, dtype in ((FORCED_TILES, "float32"), (FORCED_TILES_FLOAT64, "float64")):
        ways = set()
        for tile in tiles:
            if not tile[5]:
                continue
            for geom in FORCED_GEOMETRY:
                defines = plan(geom, H200, forced_chooser(*tile), dtype).defines
                transpose = geom.family is Family.CONV_TRANSPOSE
                for prefix, gather in (("FWD", transpose), ("BWI", not transpose)):
                    rows = geom.out_c if prefix == "FWD" else geom.in_c
                    assert defines[f"{prefix}_PACKED"] == 1
                    ways.add((gather, stages_packed_a_by_quads(defines, prefix, rows)))
        assert ways == {(True, True), (True, False), (False, True), (False, False)}, (dtype, ways)


def test_tensor_core_conv_stages_fit_two_blocks_per_sm():
    """MIN_BLOCKS (the __launch_bounds__ of a GEMM kernel): 2 for conv-shaped tensor-core stages of at most
    64 accumulators a thread (3xTF32 counts acc and the slice's sum twice) whose tile, in 3xTF32, stages
    no more of B than of A; 1 for the FMA path, the weight gradient and larger or B-heavy 3xTF32 tiles
    (tests/test_compile.py checks that the fitted picks compile without spills). These are the register loop's
    tiles; the cp.async pipeline's, which took these stages' place in the plan, take no bounds."""
    geom = Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8)
    for mma, fitted in ((0, set()), (3, {"forward", "backward_input"}), (1, {"forward", "backward_input"})):
        shapes = gemm_shapes(geom, 4, mma).items()
        assert {s for s, shape in shapes if choose_tile(replace(shape, pipelined=False), H200).min_blocks == 2} \
            == fitted, mma
        assert {choose_tile(shape, H200).min_blocks for _, shape in shapes} == {1}
    high = gemm_shapes(geom, 4, 3)["forward"]
    by_tile = {(t.bm, t.bn, t.tm, t.tn): t.min_blocks for t in tile_candidates(high, H200) if t.split == 1}
    assert by_tile[(128, 64, 4, 8)] == 2  # 2 x 32 accumulators, bm >= bn
    assert by_tile[(64, 128, 4, 8)] == 1  # B-heavy: spilled at 128 registers
    assert by_tile[(128, 128, 8, 8)] == 1  # 2 x 64 accumulators
    medium = gemm_shapes(geom, 4, 1)["forward"]
    assert {t.min_blocks for t in tile_candidates(medium, H200) if (t.tm, t.tn) == (8, 8)} == {2}


def test_weight_gradient_splits_fill_whole_rounds_of_resident_blocks():
    """An SM runs its blocks in rounds of as many as fit at once, and a last partial round hides latency with
    fewer warps. Measured on the H200 (benchmarks/measured/2026-12-01-h200-6065144-weight-sweep.txt), conv2d
    N32 64->64 56²'s weight gradient at 64x64 t4x4 (256 threads, 2 blocks an SM): split 44 (396 blocks, a
    round of 264 then one of 132) 326 µs, split 29 (261 blocks, one round) 304 µs."""
    geom = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    shape = gemm_shapes(geom)["backward_weight"]
    one_round = gemm_cost(shape, GemmTile(64, 64, 16, 4, 4, 29), H200)
    with_a_tail = gemm_cost(shape, GemmTile(64, 64, 16, 4, 4, 44), H200)
    assert with_a_tail > one_round
    # The rounds as the docstring counts them: 261 blocks fit one round of 2 an SM, 396 need a second.
    assert shape.grid(64, 64, 29) <= H200.sm_count * 2 < shape.grid(64, 64, 44) <= H200.sm_count * 3


# Batched weight gradients, conv (batch, in_c, out_c, spatial, k) -> (bm, bn, tm, tn, split) the model picks, and the
# µs the H200 measured for that pick and for the one the rule before it made
# (benchmarks/measured/2026-12-01-h200-08b2fc4-weight-sweep.txt and -weight-pairs.txt).
WEIGHT_PICKS = [
    ((32, 64, 64, (56, 56), 3), (64, 64, 8, 8, 58)),  # 269 µs; 64x64 t4x4 split 29 304
    ((8, 64, 64, (112, 112), 3), (64, 64, 8, 8, 58)),  # 269; t4x4 306
    ((32, 128, 64, (28, 28), 3), (64, 128, 8, 8, 29)),  # 137 (the fastest measured); 64x256 t8x8 146
    ((8, 48, 48, (24, 24, 24), 3), (64, 128, 8, 8, 24)),  # 650 (the fastest); 64x256 t8x8 704
    ((32, 64, 64, (4096,), 5), (64, 64, 4, 4, 52)),  # 215 (the fastest), unchanged; 64x64 t8x8 split 52 284
    ((8, 32, 32, (32, 32, 32), 3), (32, 128, 4, 4, 37)),  # 640 (the fastest), unchanged
    ((8, 128, 128, (128, 128), 3), (128, 128, 8, 8, 14)),  # 1166 (the fastest), unchanged
]


@pytest.mark.parametrize(("conv", "expected"), WEIGHT_PICKS)
def test_weight_gradient_credits_thread_tiles_at_every_thread_count(conv, expected):
    """The weight gradient's warps hide latency with their thread tile's multiply-adds at any thread count (a
    t8x8 warp like two of t4x8; a smaller tile's a little worse than its accumulators say): the picks of
    WEIGHT_PICKS, each the fastest of the tiles measured for its shape or within 3% of it (64->64: t4x8 at 128
    threads took 261 µs)."""
    batch, in_c, out_c, spatial, k = conv
    rank = len(spatial)
    geom = Geometry.build(Family.CONV, in_c, out_c, spatial, (k,) * rank, (1,) * rank, (k // 2,) * rank, batch=batch)
    chosen = choose_tile(gemm_shapes(geom)["backward_weight"], H200)
    assert (chosen.bm, chosen.bn, chosen.tm, chosen.tn, chosen.split) == expected


# Batched conv-shaped stages, conv (batch, in_c, out_c, spatial, k) -> forward's (bm, bn, bk, tm, tn), the µs the
# H200 measured for it and for the same block tile at 16 channels a slice
# (benchmarks/measured/2026-12-01-h200-fba8cae-depth-sweep.txt, 2026-12-02-h200-42c62c5-depth-pairs.txt).
WIDE_PICKS = [
    ((8, 128, 128, (128, 128), 3), (128, 128, 32, 8, 8)),  # 1035.1 µs; 1120.3 at bk16 (the last plan's 128x64: 1048.0)
    ((8, 32, 32, (32, 32, 32), 3), (32, 256, 32, 8, 8)),  # 421.3; 436.3
    ((32, 64, 64, (56, 56), 3), (64, 64, 32, 8, 8)),  # 222.9; 226.2
    ((32, 64, 64, (4096,), 5), (64, 128, 16, 8, 8)),  # 1-D stays at 16: 145.4; 160.1 at 32 (fba8cae's sweep)
]


@pytest.mark.parametrize(("conv", "expected"), WIDE_PICKS)
def test_wide_slices_where_they_were_measured_to_pay(conv, expected):
    """Slices of 32 channels for FMA conv stages of rank 2 and up with many waves of blocks; the 1-D stage keeps 16."""
    batch, in_c, out_c, spatial, k = conv
    rank = len(spatial)
    geom = Geometry.build(Family.CONV, in_c, out_c, spatial, (k,) * rank, (1,) * rank, (k // 2,) * rank, batch=batch)
    chosen = choose_tile(gemm_shapes(geom)["forward"], H200)
    assert (chosen.bm, chosen.bn, chosen.bk, chosen.tm, chosen.tn) == expected


def test_wide_slices_are_for_float32_fma_stages_of_many_waves():
    """The wide depth is a candidate only in float32 FMA conv stages, and there only for tiles of at least four
    waves at rank 2 and up: a stage of few blocks, float64 and the tensor cores keep slices of at most 16
    channels, and so does the weight gradient (16 cells)."""
    batched = Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8)
    shapes = gemm_shapes(batched)
    assert shapes["forward"].slice_depths == (16, 32) and shapes["backward_weight"].slice_depths == (16,)
    assert gemm_shapes(batched, 8)["forward"].slice_depths == (16,)
    assert gemm_shapes(batched, 4, 1)["forward"].slice_depths == (16,)
    few_blocks = gemm_shapes(Geometry.build(*SIZES[2]))["forward"]  # one image of 256 -> 256 channels, 14²
    assert few_blocks.slice_depths == (16, 32) and {t.bk for t in tile_candidates(few_blocks, H200)} == {16}
    wide = [t for t in tile_candidates(shapes["forward"], H200) if t.bk == 32]
    assert wide and all(shapes["forward"].grid(t.bm, t.bn, 1) >= 4 * H200.sm_count for t in wide)
    # 40 channels: slices of 14 only (three a window offset; two of 20 would not be whole slices of 32); 96: 16 or 32.
    assert gemm_shapes(Geometry.build(Family.CONV, 40, 8, (9, 9), (3, 3), (1, 1), (1, 1)))["forward"].slice_depths \
        == (14,)
    assert gemm_shapes(Geometry.build(Family.CONV, 96, 8, (9, 9), (3, 3), (1, 1), (1, 1)))["forward"].slice_depths \
        == (16, 32)


def test_slices_past_the_static_limit_take_dynamic_shared_memory():
    """The launch gives a GEMM block its slices as dynamic shared memory exactly when its shared memory passes
    the 48 KB a static block may have, and the kernels that need it are the ones the runtime opts in; Bs starts on
    a 16-byte boundary whatever As's size."""
    assert contract.STATIC_SHARED_BYTES == 48 * 1024
    assert gemm_slice_bytes(128, 128, 32) == 2 * 32 * 132 * 4 + 2 * 32 * 132 * 4
    assert gemm_slice_bytes(1, 64, 3) == 128 + 2 * 3 * 68 * 4  # As: 2 * 3 * 5 * 4 = 120 bytes, rounded up
    assert gemm_dynamic_shared_bytes(128, 64, 16) == 0 and gemm_dynamic_shared_bytes(128, 64, 32) == 51200
    geom = Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8)
    geometry_plan = plan(geom)
    three_stages = gemm_slice_bytes(128, 128, 32, 4, 3)  # the FMA pipeline's (tests/test_pipeline_plans.py)
    assert opted_in_shared(geometry_plan, H200) == {"forward": three_stages, "backward_input": three_stages}
    assert geometry_plan.launches["backward_weight"].shared_bytes == 0


def test_conv_stages_of_fewer_source_channels_than_a_k_step_multiply_with_fmas():
    """In the tensor-core modes a conv-shaped stage of fewer than 8 source channels a group runs its GEMM with FMAs
    (<PREFIX>_MMA 0) on the FMA plan's tile: its TF32 slices would be mostly zeros. The other stages keep the
    geometry's mode, and for 16-bit elements the FMA stage leaves the others' whole k steps to the 16-bit mma."""
    geom = Geometry.build(Family.CONV, 3, 64, (30, 30), (7, 7), (2, 2), (3, 3), batch=2)
    fma = plan(geom).defines
    for precision, mode in (("high", 3), ("medium", 1)):
        defines = plan(geom, precision=precision).defines
        assert [defines[f"{p}_MMA"] for p in ("FWD", "BWI", "BWW")] == [0, mode, mode]
        assert defines["MMA_MODE"] == mode
        assert all(defines[f"FWD_{field}"] == fma[f"FWD_{field}"] for field in contract.TILE_FIELDS)
    defines = plan(geom, dtype="bfloat16", precision="medium").defines
    assert (defines["MMA_MODE"], defines["FWD_MMA"], defines["BWW_MMA"]) == (2, 0, 2)
    assert all(plan(geom).defines[f"{p}_MMA"] == 0 for p in ("FWD", "BWI", "BWW"))
    eight = Geometry.build(Family.CONV, 8, 64, (30, 30), (7, 7), (2, 2), (3, 3), batch=2)
    assert plan(eight, precision="medium").defines["FWD_MMA"] == 1
