"""Tiles of the cp.async pipeline: a GEMM tile whose STAGES exceed the contract's SHARED_BUFFERS. Conv-shaped
stages on the TF32 tensor cores (precisions "high" and "medium", float32 elements) copy their slices from
global to shared memory without registers, STAGES - 1 in flight, and round them to TF32 as the fragments
are read (templates/cuda/_gemm.cu.j2, gemm_async_loop). The tiles come by rule from a sweep of that loop on
the H200 (benchmarks/NOTES.md, twelfth session), not from the tile model's costs, which are fitted to the
register-staged loop. Pure Python; the shape is a tile_model.GemmShape."""

from __future__ import annotations

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


def pipelines(shape) -> bool:
    """Whether the cp.async pipeline may take the stage: the TF32 modes on float32 elements (not float64, not
    the FMAs, not 16-bit elements planned on TF32 shapes: GemmShape.pipelined), and no stride phases (their
    slices come from a cursor that the pipeline's rare path could not rewind)."""
    return shape.pipelined and shape.mma in PIPELINE_TILES and shape.element_bytes == 4 and shape.phases == 1


def pipeline_block(shape) -> tuple[int, int, int, int, int, int] | None:
    """(bm, bn, bk, tm, tn, stages) of the cp.async pipeline for a conv-shaped `shape`, or None where the stage
    keeps the register loop (pipelines) or has few rows or source channels. The weight gradient keeps it too: in
    the pipeline (the tile model's picks, four slices of 16 cells in flight) it ran 9-33% slower on four of the
    six batched cases (benchmarks/NOTES.md, twelfth session)."""
    if not (pipelines(shape) and shape.conv and shape.m >= PIPELINE_MIN_ROWS
            and shape.source_c >= PIPELINE_MIN_SOURCE_C):
        return None
    rows = 128 if shape.m > 64 else 64 if shape.m > 32 else 32
    bm, bn, tm, tn, stages = PIPELINE_TILES[shape.mma][rows]
    return bm, bn, min(PIPELINE_BK, -(-shape.source_c // 8) * 8), tm, tn, stages
