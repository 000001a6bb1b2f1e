"""Block tiles forced onto every GEMM stage, for the CUDA tests (run), the plan tests and the compile
tests (no GPU): the FMA tiles that reach every path of the implicit-GEMM kernels in float32 and float64,
the tensor-core tiles of the precisions "high" and "medium", the geometries they run on and the chooser
that forces them; direct choosers forcing the small-channel direct kernels' tiles; and a geometry for the
tensor-core kernels. No CuPy."""

from __future__ import annotations

import dataclasses
import math

from convgen.cuda_launch import GemmTile
from convgen.direct_model import (
    MMA_DIRECT_CB,
    DirectChooser,
    DirectTile,
    choose_direct,
    cut_tile,
    direct_tile,
    mma_slices,
)
from convgen.direct_shapes import MMA_DIRECT_MODE, DirectShape, mma_box
from convgen.direct_weight_model import MMA_WEIGHT_MAX_WARPS, WeightTile, weight_mma_tile
from convgen.generated.contract import SHARED_BUFFERS
from convgen.geometry import Family, Geometry
from convgen.pipeline_tiles import pipelines
from convgen.tile_model import Hardware, whole_parts

# Every path of the implicit-GEMM kernels at small sizes, forced onto all three stages: a thread
# staging several B columns (BN > threads) or several rows (BN < threads), scalar (TM < 4) and
# 16-byte fragments, split fragments (TN = 8, TM = 8), uneven splits, channel slices that do not
# divide the channels, output rows that are and are not a multiple of 4, and A read from the
# weight as given and repacked by the `_pack` kernels (the last field), repacked A staged one element
# or four rows at a time (tests/test_launch_plans.py checks that FORCED_GEOMETRY takes both).
FORCED_TILES = [  # (bm, bn, tm, tn, split, packed)
    (4, 256, 4, 4, 1, False),
    (64, 64, 4, 4, 3, True),
    (32, 128, 4, 8, 2, False),
    (128, 64, 8, 4, 1, True),
    (16, 64, 1, 4, 5, False),
    (8, 64, 2, 8, 2, True),
]
FORCED_GEOMETRY = [
    Geometry.build(Family.CONV, 17, 6, (13, 10), (3, 2), (2, 1), (1, 1)),
    Geometry.build(Family.CONV, 3, 5, (9, 12), (3, 3), (1, 1), (1, 1)),
    Geometry.build(Family.CONV_TRANSPOSE, 5, 9, (7, 6), (3, 3), (2, 1), (1, 0)),
    # Repacked A staged four rows at a time (A_VECTOR): the conv's gather stage (12 rows over 16 source
    # channels) and both stages of the transpose (16 over 16); the conv's direct stage (16 over 12) not.
    Geometry.build(Family.CONV, 12, 16, (9, 10), (3, 3), (2, 1), (1, 1)),
    Geometry.build(Family.CONV_TRANSPOSE, 16, 16, (7, 6), (3, 3), (2, 1), (1, 0)),
]


def forced_chooser(bm: int, bn: int, tm: int, tn: int, split: int, packed: bool = False, wide: bool = False,
                   stages: int = SHARED_BUFFERS):
    """A tile chooser that takes the given tile everywhere, its split cut down to the slices there are
    (`packed` on every conv-shaped stage: the weight gradient has no pack kernel), its slices the stage's
    deepest (GemmShape.slice_depths) when `wide`, else the usual bk; `stages` slices in shared memory on
    the conv-shaped stages that the cp.async pipeline may take (pipelines), else the register loop's."""
    def choose(shape, hardware):
        bk = shape.slice_depths[-1] if wide else shape.bk
        piped = stages if pipelines(shape) else SHARED_BUFFERS
        return GemmTile(bm, bn, bk, tm, tn, whole_parts(shape.chunks_at(bk), split), packed and shape.conv, stages=piped)
    return choose


# Slices of WIDE_BK channels (float32 FMA conv-shaped stages of 64 source channels here; the 40-channel stages keep
# slices of 14): 128 x 64 at 32 channels stages 51 KB in dynamic shared memory, past the 48 KB a block may have
# statically (its launch opts in); 32 x 128 stays static; a split, A as given and repacked.
WIDE_FORCED_TILES = [  # (bm, bn, tm, tn, split, packed, wide)
    (128, 64, 8, 4, 1, True, True),
    (32, 128, 4, 8, 2, False, True),
]
WIDE_FORCED_GEOMETRY = [
    Geometry.build(Family.CONV, 64, 40, (7, 6), (3, 3), (2, 1), (1, 1), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 40, 64, (5, 4), (3, 2), (2, 1), (1, 0), batch=2),
]


# FORCED_TILES with the paths kept and the staged slices within 48 KB of double elements:
# several B columns per thread (BN > threads), several rows (BN < threads), scalar (TM < 4) and
# 16-byte fragments (two double2 accesses), TM = 8, TN = 8, uneven splits, A as given and repacked.
FORCED_TILES_FLOAT64 = [  # (bm, bn, tm, tn, split, packed)
    (8, 128, 4, 4, 1, False),
    (64, 64, 4, 4, 3, True),
    (32, 128, 4, 8, 2, False),
    (64, 64, 8, 4, 1, True),
    (16, 64, 1, 4, 5, False),
    (8, 64, 2, 8, 2, True),
]

# The tensor-core paths (MMA_MODE 1, 3): warp tiles of 16x16 (tm 2, tn 4), 32x32 (4, 8), 64x16 (8, 4),
# 16x32 (2, 8) and 32x16 (4, 4); one warp across (bm 16) and eight; a B column per thread and several
# (bn 256); splits; A repacked; every one mma_tile_fits.
MMA_FORCED_TILES = [  # (bm, bn, tm, tn, split, packed)
    (16, 64, 2, 4, 1, False),
    (32, 32, 2, 4, 3, True),
    (64, 64, 4, 8, 2, False),
    (128, 64, 8, 4, 1, True),
    (16, 256, 2, 8, 5, False),
    (32, 128, 4, 4, 2, True),
]


# The cp.async pipeline on forced tiles (the conv-shaped stages it takes; the weight gradient keeps the register
# loop): warp tiles of 16x32 (tm 2, tn 8) and 32x16 (4, 4), several B columns a thread (bn 256) and several rows
# (bn 32), a split, A as given (one element a copy) and repacked, three and five stages.
PIPELINE_FORCED_TILES = [  # (bm, bn, tm, tn, split, packed, wide, stages)
    (32, 256, 2, 8, 1, False, False, 3),
    (64, 32, 4, 4, 2, True, False, 5),
]


def staged_channels(max_cb: int | None) -> DirectChooser:
    """A direct chooser of V = 4 at 256 threads staging, with `max_cb`, that many source channels a step in as much
    shared memory as a block may opt in to (the launch's dynamic shared memory past 48 KB), else within the static
    48 KB; the weight gradient's tile as the plans cut it."""
    def chooser(shape, hardware):
        if shape.weight:
            return direct_tile(shape, hardware)
        if max_cb is None:
            return cut_tile(shape, 4, 256, hardware, shared_bytes=hardware.shared_per_block)
        return cut_tile(shape, 4, 256, hardware, max_cb=max_cb, shared_bytes=hardware.shared_optin_per_block)
    return chooser


def weight_channel_blocks(blocks: int) -> DirectChooser:
    """A direct chooser whose weight-gradient tile shares each group's U channels among `blocks` blocks (which must
    divide them), its V, lanes, box and parts those of the one-block tile the plans cut, so that every weight's sum
    runs in the same order as there; the conv-shaped stages' tiles as direct_tile cuts them."""
    def chooser(shape, hardware):
        tile = direct_tile(shape, hardware)
        if not shape.weight or tile is None:
            return tile
        assert tile.channel_blocks == 1 and shape.source_c % blocks == 0, (tile, shape)
        return dataclasses.replace(tile, channel_blocks=blocks, rows=tile.rows // blocks)
    return chooser


def mma_direct(cells: int, tiles: int, slices: int = 1) -> DirectChooser:
    """A direct chooser that puts every conv-shaped stage it can on the TF32 tensor cores (DirectShape.mma): boxes of
    at most `cells` cells, `tiles` tiles of 16 a warp, the first axis's window offsets in `slices` steps where they
    divide them (else in one); the weight gradient's tile as the plans cut it."""
    def chooser(shape, hardware):
        if shape.weight or shape.mma != MMA_DIRECT_MODE:
            return direct_tile(shape, hardware)
        mb = -(-shape.m // 8) * 8
        return DirectTile(v=tiles, mb=mb, cb=MMA_DIRECT_CB, box=mma_box(shape.cells, cells), mma=MMA_DIRECT_MODE,
                          slices=slices if slices in mma_slices(shape) else 1)
    return chooser


def mma_weight_direct(cells: int, rows_a_warp: int, parts: int, channel_blocks: int = 1) -> DirectChooser:
    """mma_direct's conv-shaped stages (boxes of `cells`, two tiles a warp) and the weight gradient on the tensor cores
    too: boxes of at most `cells` of D's cells, `rows_a_warp` outer window offsets a warp (more where the warps would
    be past MMA_WEIGHT_MAX_WARPS), `parts` blocks splitting the items and `channel_blocks` blocks sharing the U channels
    where they divide them (else one)."""
    conv = mma_direct(cells, 2)

    def chooser(shape, hardware):
        if not (shape.weight and shape.mma == MMA_DIRECT_MODE):
            return conv(shape, hardware)
        blocks = channel_blocks if shape.source_c % channel_blocks == 0 else 1
        outer = math.prod(shape.taps[:-1])
        return WeightTile(v=max(rows_a_warp, -(-outer // MMA_WEIGHT_MAX_WARPS)), lanes=1, box=mma_box(shape.cells, cells),
                          parts=parts, rows=outer, channel_blocks=blocks, mma=MMA_DIRECT_MODE)
    return chooser


def modelled_weight_mma(shape: DirectShape, hardware: Hardware) -> DirectTile | WeightTile | None:
    """The plans' chooser, but the weight gradient on the tensor cores wherever weight_mma_tile cuts a tile, as it cuts
    it: also where the plans leave it to the GEMM (past 16 channels with 64 registers a thread)."""
    if shape.weight and shape.mma == MMA_DIRECT_MODE and (tile := weight_mma_tile(shape, hardware)) is not None:
        return tile
    return choose_direct(shape, hardware)


def tensor_core_geometry(family: Family, rank: int) -> Geometry:
    """A geometry whose GEMM stages all take the cp.async pipeline or the `_wgmma` kernels in the TF32 modes: two
    groups of 32 channels each way (both conv-shaped stages fill 32-row blocks over 32 source channels), a batch,
    dilation and padding on the first axis, stride 1 (no phases), about 150 cells. Its weight gradient at rank 7 (a 2^7
    window) is one that weight_mma_tile cuts and the plans leave to the GEMM (modelled_weight_mma takes it)."""
    spatial = {1: (150,), 2: (13, 11), 3: (6, 5, 5)}.get(rank, (4, 3, 3) + (2,) * (rank - 3))
    kernel, dilation, padding = (2,) + (2,) * (rank - 1), (2,) + (1,) * (rank - 1), (1,) + (0,) * (rank - 1)
    return Geometry.build(family, 64, 64, spatial, kernel, (1,) * rank, padding, dilation=dilation, groups=2, batch=2)
