"""The precision of the conv GEMMs without a GPU: the tape's argument and its errors, the plans'
MMA_MODE define and tensor-core tiles, the ownership of the block tile by the mma fragments
(gemm_tile.cuh's formulas, replayed), mma.cuh's TF32 rounding (replayed) and the `convgen source` option."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from click.testing import CliRunner
from convgen.cpu import Tape
from convgen.cuda_launch import H200, PRECISIONS, gemm_shapes, plan, representative_geometry, tile_candidates
from convgen.gemm_shapes import MMA_K
from convgen.generated.contract import PRECISION_MMA_MODES, SHARED_ROW_PAD, TILE_FIELDS
from convgen.generator import cli
from convgen.geometry import Family, Geometry
from convgen.tile_model import mma_tile_fits

GEOMETRIES = [
    Geometry.build(Family.CONV, 3, 64, (40, 40), (7, 7), (2, 2), (3, 3), batch=2),
    Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32),
    Geometry.build(Family.CONV_TRANSPOSE, 17, 6, (13, 10), (3, 2), (2, 1), (1, 1), groups=1),
    Geometry.build(Family.CONV, 6, 6, (5,) * 8, (2,) * 8, (1,) * 8, (0,) * 8, groups=3),
]


def test_the_precisions_and_their_modes() -> None:
    assert PRECISIONS == ("highest", "high", "medium")
    assert PRECISION_MMA_MODES == {"highest": 0, "high": 3, "medium": 1}


def test_the_tape_takes_a_precision() -> None:
    assert Tape().precision == "highest" and Tape(precision="medium").precision == "medium"
    assert Tape(dtype="float64", precision="highest").precision == "highest"
    # The CPU tape computes every precision as "highest": the same values, bit for bit.
    rng = reference.case_rng("cpu precision")
    geom = Geometry.build(Family.CONV, 3, 4, (6, 5), (3, 3), (2, 1), (1, 1), batch=2)
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    expected = reference.run_on_tape(Tape(), geom, inputs, grad)
    for precision in ("high", "medium"):
        got = reference.run_on_tape(Tape(precision=precision), geom, inputs, grad)
        np.testing.assert_array_equal(got[0], expected[0])
        for a, b in zip(got[1], expected[1], strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("precision", "shown"), [("fast", "'fast'"), ("HIGH", "'HIGH'"), (None, "None"), (3, "3")])
def test_an_unknown_precision_is_a_value_error(precision, shown) -> None:
    with pytest.raises(ValueError) as info:
        Tape(precision=precision)
    assert str(info.value) == f"autograd: cpu: Tape: precision must be 'highest', 'high' or 'medium', got {shown}"


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_a_float64_tape_takes_only_the_highest_precision(precision) -> None:
    with pytest.raises(ValueError) as info:
        Tape(dtype="float64", precision=precision)
    assert str(info.value) == (f"autograd: cpu: Tape: precision '{precision}' runs on TF32 tensor cores, which take "
                               "float32 only; a float64 tape takes 'highest'")
    with pytest.raises(ValueError) as info:
        plan(GEOMETRIES[0], dtype="float64", precision=precision)
    assert str(info.value) == (f"plan: precision '{precision}' runs on TF32 tensor cores, which take float32 only; "
                               "a float64 tape takes 'highest'")


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: f"{g.family.value}_r{g.rank}_{g.in_c}to{g.out_c}")
def test_plans_set_mma_mode_and_tensor_core_tiles(geom: Geometry) -> None:
    """"highest" plans are the FMA plans with MMA_MODE 0; the tensor-core plans differ in MMA_MODE and
    the tiles only, every tile of whole mma tiles and k steps, in whole warps, but a conv-shaped stage of fewer
    source channels than a k step, which multiplies with FMAs (<PREFIX>_MMA 0) on the FMA plan's tile."""
    fma = plan(geom)
    assert fma.defines["MMA_MODE"] == 0
    for precision in ("high", "medium"):
        tensor = plan(geom, precision=precision)
        assert tensor.defines["MMA_MODE"] == PRECISION_MMA_MODES[precision]
        assert list(tensor.defines) == list(fma.defines)
        tile_free = {k: v for k, v in tensor.defines.items() if k[:4] not in ("FWD_", "BWI_", "BWW_")}
        assert tile_free == {**{k: v for k, v in fma.defines.items() if k[:4] not in ("FWD_", "BWI_", "BWW_")},
                             "MMA_MODE": PRECISION_MMA_MODES[precision]}
        for prefix in ("FWD", "BWI", "BWW"):
            if tensor.defines[f"{prefix}_MMA"] == 0:
                assert all(tensor.defines[f"{prefix}_{f}"] == fma.defines[f"{prefix}_{f}"] for f in TILE_FIELDS)
                continue
            assert tensor.defines[f"{prefix}_MMA"] == PRECISION_MMA_MODES[precision]
            bm, bn, bk, tm, tn = (tensor.defines[f"{prefix}_{f}"] for f in ("BM", "BN", "BK", "TM", "TN"))
            assert mma_tile_fits(bm, bn, bk, tm, tn) and (bm // tm) * (bn // tn) % 32 == 0, (prefix, tensor.defines)


@pytest.mark.parametrize("source_c", [1, 3, 9, 16, 17, 40])
def test_tensor_core_slices_are_whole_k_steps(source_c: int) -> None:
    """Conv slices of source channels round up to whole k steps (the extra rows staged as zeros);
    every candidate tile fits the tensor cores, and there are candidates."""
    geom = Geometry.build(Family.CONV, source_c, 8, (9, 9), (3, 3), (1, 1), (1, 1))
    fma = gemm_shapes(geom)
    for mma in (1, 3):
        for stage, shape in gemm_shapes(geom, 4, mma).items():
            assert shape.bk % MMA_K == 0 and fma[stage].bk <= shape.bk < fma[stage].bk + MMA_K
            tiles = tile_candidates(shape, H200)
            assert tiles and all(mma_tile_fits(t.bm, t.bn, t.bk, t.tm, t.tn) for t in tiles)


def test_pool_plans_ignore_the_precision() -> None:
    geom = representative_geometry(Family.MAX_POOL, 3)
    assert plan(geom, precision="high") == plan(geom)


# gemm_tile.cuh's tensor-core ownership, replayed: tile_owner, tile_row, tile_col and slice_mma's reads.

def owner(tid: int, bn: int, tn: int) -> tuple[int, int]:
    across = bn // (4 * tn)
    return tid // 32 // across, tid // 32 % across


def tile_row(tm: int, i: int, lane: int, tile_m: int) -> int:
    return tm * 8 * tile_m + i // 2 * 16 + i % 2 * 8 + lane // 4


def tile_col(tn: int, j: int, lane: int, tile_n: int) -> int:
    return tn * 4 * tile_n + j // 2 * 8 + lane % 4 * 2 + j % 2


def c_fragment(mi: int, ni: int, r: int, lane: int) -> tuple[int, int]:
    """The PTX ISA's m16n8k8 C fragment: element r of a lane in mma tile (mi, ni), as (row, column)."""
    return 16 * mi + lane // 4 + 8 * (r // 2), 8 * ni + 2 * (lane % 4) + r % 2


@pytest.mark.parametrize("mma", [1, 3])
def test_the_warps_own_every_element_of_the_block_tile_once(mma: int) -> None:
    """For every tensor-core candidate tile: the accumulators (i, j) of all threads cover the block
    tile exactly once, and accumulator (i, j) is element 2 (i % 2) + j % 2 of the C fragment of mma
    tile (i / 2, j / 2) of its warp tile (slice_mma's mma_tile)."""
    geom = Geometry.build(Family.CONV, 16, 16, (9, 9), (3, 3), (1, 1), (1, 1))
    tiles = {(t.bm, t.bn, t.tm, t.tn) for shape in gemm_shapes(geom, 4, mma).values()
             for t in tile_candidates(shape, H200)}
    assert tiles
    for bm, bn, tm, tn in tiles:
        owned = np.zeros((bm, bn), int)
        for tid in range((bm // tm) * (bn // tn)):
            warp_m, warp_n = owner(tid, bn, tn)
            lane = tid % 32
            for i in range(tm):
                for j in range(tn):
                    row, col = tile_row(warp_m, i, lane, tm), tile_col(warp_n, j, lane, tn)
                    owned[row, col] += 1
                    in_tile = c_fragment(i // 2, j // 2, 2 * (i % 2) + j % 2, lane)
                    assert (row - warp_m * 8 * tm, col - warp_n * 4 * tn) == in_tile
        assert (owned == 1).all(), (bm, bn, tm, tn)


@pytest.mark.parametrize("extent", [16, 32, 48, 64, 128, 8, 24, 256])
def test_fragment_reads_of_a_warp_hit_32_banks(extent: int) -> None:
    """slice_mma reads k position t from slice row 2t and t + 4 from 2t + 1, rows SHARED_ROW_PAD words
    longer than the tile: each of a warp's fragment loads (one A or B register, all lanes) touches 32
    distinct banks, for every block extent a tensor-core tile can have (a multiple of 8)."""
    stride = extent + SHARED_ROW_PAD
    for high in (0, 1):  # a0/a1 and b0 (k position t), a2/a3 and b1 (t + 4)
        banks = {((2 * (lane % 4) + high) * stride + lane // 4) % 32 for lane in range(32)}
        assert len(banks) == 32, (extent, high)


def test_source_command_takes_the_precision() -> None:
    args = ["source", "conv", "2", "--in-c", "16", "--out-c", "32", "--in", "12"]
    assert "#define MMA_MODE 0\n" in CliRunner().invoke(cli.main, args).output
    assert "#define MMA_MODE 3\n" in CliRunner().invoke(cli.main, [*args, "--precision", "high"]).output
    result = CliRunner().invoke(cli.main, [*args, "--precision", "medium", "--dtype", "float64"])
    assert result.exit_code == 2
    assert ("convgen source: precision 'medium' runs on TF32 tensor cores, which take float32 only; a float64 tape "
            "takes 'highest'") in result.output


# mma.cuh rounds a fragment value to TF32 as (bits + 0x1000) & 0xffffe000, for finite values below
# 0x7f7ff000 in magnitude (the main loop sends the others down the rare path). Checked here against
# round-to-nearest, ties away, to 10 stored mantissa bits, computed in float64 from the value.
TF32_FAST_LIMIT = 0x7F7FF000


def tf32_fast(bits: np.ndarray) -> np.ndarray:
    return ((bits.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)


def tf32_nearest_ties_away(x: np.ndarray) -> np.ndarray:
    magnitude = np.abs(x.astype(np.float64))
    exponent = np.maximum(np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0))), -126.0)
    unit = np.exp2(exponent - 10)  # the TF32 spacing at |x| (subnormals: 2^-136)
    return np.sign(x) * np.floor(magnitude / unit + 0.5) * unit


def test_the_fast_tf32_rounding_is_round_to_nearest_ties_away() -> None:
    rng = np.random.default_rng(20261130)
    magnitudes = rng.integers(0, TF32_FAST_LIMIT, 2_000_000, dtype=np.uint32)
    # Ties, the carries into the exponent, subnormals, zero and the largest value the fast path takes.
    edges = np.array([0, 1, 0x1000, 0x0FFF, 0x1FFF, 0x2000 | 0x1000, 0x007FF000, 0x007FFFFF, 0x00800000,
                      0x3F800FFF, 0x3F801000, 0x3FFFF000, 0x3FFFEFFF, 0x7F7FEFFF, TF32_FAST_LIMIT - 1], np.uint32)
    magnitudes = np.concatenate([magnitudes, edges])
    bits = np.concatenate([magnitudes, magnitudes | np.uint32(0x80000000)])
    x = bits.view(np.float32)
    rounded = tf32_fast(bits).view(np.float32)
    assert np.all(np.isfinite(rounded))
    np.testing.assert_array_equal(rounded.astype(np.float64), tf32_nearest_ties_away(x))
    # The split: x - big is exact in float32, and x = big + small to within 2^-22 |x|.
    big = rounded
    rest = x - big
    np.testing.assert_array_equal(rest.astype(np.float64), x.astype(np.float64) - big.astype(np.float64))
    small = tf32_fast(rest.view(np.uint32)).view(np.float32)
    error = np.abs(x.astype(np.float64) - big.astype(np.float64) - small.astype(np.float64))
    # (half the TF32 spacing of the rest; for a subnormal rest that is 2^-137)
    assert np.all(error <= np.abs(x.astype(np.float64)) * 2.0**-22 + 2.0**-137)


def test_the_fast_tf32_rounding_overflows_from_its_limit_on() -> None:
    # Why the limit: from 0x7f7ff000 on the rounding carries into the exponent's all-ones (inf).
    assert tf32_fast(np.array([TF32_FAST_LIMIT - 1], np.uint32)).view(np.float32)[0] < np.inf
    assert tf32_fast(np.array([TF32_FAST_LIMIT], np.uint32)).view(np.float32)[0] == np.inf
