"""Tiles of the cp.async pipeline: a GEMM tile whose STAGES exceed the contract's SHARED_BUFFERS. Its conv-shaped
stages copy their slices from global to shared memory without registers, STAGES - 1 in flight
(templates/cuda/_gemm.cu.j2, gemm_async_loop); in the TF32 modes (precisions "high" and "medium") the fragments
are rounded to TF32 as they are read. The TF32 tiles come by rule from a sweep of that loop on the H200; the fp32
FMA stages keep the tile model's pick and take the pipeline where it was measured to pay (benchmarks/NOTES.md,
twelfth session). On a GPU with wgmma the TF32 modes' conv-shaped stages that convgen.wgmma_tiles takes run their
`_wgmma` kernels instead. Pure Python; the shape is a gemm_shapes.GemmShape, the tile a tile_model.GemmTile.
"""

from __future__ import annotations

from convgen.generated.contract import gemm_shared_bytes

PIPELINE_BK = 32  # source channels a slice: four k steps of 8 (fewer channels: one slice of whole k steps)
# Below these the register loop's tiles stay: a 32-row block would mostly multiply zeros, and so would the
# k steps of a few source channels.
PIPELINE_MIN_ROWS = 32
PIPELINE_MIN_SOURCE_C = 16
# MMA_MODE -> rows of the block tile -> (bm, bn, tm, tn, stages): four warps, each an 8tm x 4tn warp tile.
# TF32 takes 64x64 warp tiles where the rows allow; 3xTF32 half as wide, its fragments twice the registers
# and its slice sums (slice_mma) a second register tile. Shared memory stays near 100 KB: two blocks an SM.
PIPELINE_TILES: dict[int, dict[int, tuple[int, int, int, int, int]]] = {
    1: {128: (128, 128, 8, 16, 3), 64: (64, 128, 4, 16, 4), 32: (32, 128, 4, 8, 4)},
    3: {128: (128, 64, 8, 8, 4), 64: (64, 64, 4, 8, 4), 32: (32, 64, 4, 4, 4)},
}


# The fp32 FMA stages: the tile model's pick with this many slices, where the stage has at least
# FMA_PIPELINE_WAVES waves of blocks before any split (a stage the tile model splits has few) and
# PIPELINE_MIN_SOURCE_C source channels. Measured on the batched cases:
# forward and input gradient 5-21% faster (128->128 forward 1028 -> 810 us) and bit for bit the register loop's
# results, four stages slower than three, the 3-channel k7 forward 10% slower. One-image stages (a wave or two)
# were not measured with it and keep the register loop.
FMA_PIPELINE_STAGES = 3
FMA_PIPELINE_WAVES = 4


def pipelines(shape) -> bool:
    """Whether the cp.async pipeline may take the stage: a conv-shaped stage on float32 elements (not float64,
    not 16-bit elements, whatever their mma: GemmShape.pipelined) without stride phases (their slices come
    from a cursor that the pipeline's rare path could not rewind). The weight gradient keeps the register
    loop: pipelined with the tile model's TF32 picks (four slices of 16 cells in flight) it ran 9-33% slower on
    four of the six batched cases (benchmarks/NOTES.md, twelfth session)."""
    return shape.pipelined and shape.conv and shape.element_bytes == 4 and shape.phases == 1


def fma_pipeline_stages(shape, tile, hardware) -> int | None:
    """FMA_PIPELINE_STAGES for an fp32 FMA stage whose pick `tile` the pipeline takes (see above), else None."""
    takes = (pipelines(shape) and shape.mma == 0 and shape.source_c >= PIPELINE_MIN_SOURCE_C
             and shape.grid(tile.bm, tile.bn, 1) >= FMA_PIPELINE_WAVES * hardware.sm_count
             and gemm_shared_bytes(tile.bm, tile.bn, tile.bk, 4, FMA_PIPELINE_STAGES)
             <= hardware.shared_optin_per_block)
    return FMA_PIPELINE_STAGES if takes else None


def pipeline_block(shape) -> tuple[int, int, int, int, int, int] | None:
    """(bm, bn, bk, tm, tn, stages) of the cp.async pipeline for a stage in a TF32 mode, or None where the stage
    keeps the register loop (pipelines) or has few rows or source channels, and for the other modes."""
    if not (pipelines(shape) and shape.mma in PIPELINE_TILES and shape.m >= PIPELINE_MIN_ROWS
            and shape.source_c >= PIPELINE_MIN_SOURCE_C):
        return None
    rows = 128 if shape.m > 64 else 64 if shape.m > 32 else 32
    bm, bn, tm, tn, stages = PIPELINE_TILES[shape.mma][rows]
    return bm, bn, min(PIPELINE_BK, -(-shape.source_c // 8) * 8), tm, tn, stages
