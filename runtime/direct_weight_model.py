"""The small-channel direct weight gradient (templates/cuda/_direct_weight.cu.j2): when the plans take it instead of the
weight-gradient GEMM (direct_model.choose_direct), and how its blocks are cut, with FMAs (`weight_tile`) or on TF32
tensor cores (`weight_mma_tile`, _direct_weight_mma.cu.j2). Steers which kernel runs, never what is computed."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from convgen.direct_shapes import MMA_DIRECT_MODE, DirectShape, halo, mma_box, outer_boxes
from convgen.gemm_shapes import ceil_div
from convgen.generated.contract import weight_mma_row_words
from convgen.tile_model import SPLIT_WORKSPACE_BYTES, Hardware

# The weight gradient's direct kernel, where the plans take it: up to DIRECT_MAX_M D channels, windows of at least 9
# offsets, up to 64 U channels a group (shared by channel blocks of at most WEIGHT_MAX_ROWS rows). Measured against
# its GEMM in every such case (H100, whole backward µs, benchmarks/measured/2026-12-06-h100-s45-direct-sweep-bww.txt):
# conv4d N4 16->16 20⁴ 2131 / 4140, 16->1 358 / 2309, 1->16 305 / 562, N2 10->10 16⁴ k5 2000 / 3084, N2 16->16
# 8x32³ 1754 / 3163; conv3d N16 16->16 16³ 91 / 146; conv2d N32 16->16 56² 73 / 102, N32 64->8 56² 114 / 166.
DIRECT_WEIGHT_MIN_WINDOW = 9
DIRECT_WEIGHT_MAX_SOURCE_C = 64
# The direct weight gradient: a thread per (U channel, outer window offsets) and lane holds M x K_last sums ...
WEIGHT_MAX_ROWS = 256  # ... of at most this many rows a block (one thread each, and lanes up to this many threads)
WEIGHT_MAX_SUMS = 64  # ... and registers
WEIGHT_MAX_BOX_CELLS = 512  # a work item's box of D's cells grows to this many while its staging fits
WEIGHT_BOX_LAST = 32  # cells of the box along the last axis at most
WEIGHT_REGISTERS = 64  # a thread's registers, for the blocks an SM holds (NVRTC: 64-72 in float32, ~100 in float64)

# The direct weight gradient on TF32 tensor cores: mma tiles of 16 D channels, 8 U channels and 8 of the box's cells;
# up to this many D channels and U channels a block (more U channels: equal channel blocks) ...
MMA_WEIGHT_MAX_M = 32
MMA_WEIGHT_MAX_UCB = 16
MMA_WEIGHT_MAX_SUMS = 64  # ... each warp's outer window offsets with their sums in this many registers a thread ...
MMA_WEIGHT_MAX_WARPS = 16  # ... over at most this many warps a block (else the FMA form; 128 registers a thread)
MMA_WEIGHT_BOX_CELLS = (512, 256, 128, 64)  # D's cells of a work item: the most whose staging fits ...
MMA_WEIGHT_BLOCKS_PER_SM = 2  # ... this many blocks an SM, the registers fitted to them (the kernel's launch bounds)
MMA_WEIGHT_REGISTERS = 128  # a thread's registers where no launch bounds fit them, for the blocks an SM holds
# Its parts' partial sums may take this much scratch: at 16 -> 16 channels and 81 offsets, two blocks an SM's worth of
# parts (264 on an H100 or H200, 22 MB) against the 16 MiB of the other splits' cap (202 parts), the whole backward in
# "medium" (µs, H200; benchmarks/measured/2026-12-06-h200-s48-*-weight-bounds.txt): conv4d N4 16->16 20⁴ 1075 against
# 1183, N2 16->16 8x32³ 788 against 869, and in bfloat16 (the stage alone) 531 against 643 and 442 against 519.
MMA_WEIGHT_WORKSPACE_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class WeightTile:
    """The direct weight gradient's blocks: a group's U channels shared by `channel_blocks` blocks, and `parts`
    blocks of each split the work items (image, box of D's cells `box`); in a block `lanes` threads per (U channel,
    outer window offsets), each reading V cells at a time."""

    v: int
    lanes: int
    box: tuple[int, ...]
    parts: int
    rows: int  # the block's U channels x outer window offsets (on the tensor cores: the outer window offsets)
    channel_blocks: int = 1
    mma: int = 0  # MMA_DIRECT_MODE: on the tensor cores, each warp owning v of the rows
    min_blocks: int = 1  # on the tensor cores, the blocks an SM its registers are fitted to (launch bounds above 1)

    @property
    def blocks(self) -> int:
        """Blocks a group: its channel blocks' parts."""
        return self.channel_blocks * self.parts

    @property
    def threads(self) -> int:
        if self.mma:
            return 32 * ceil_div(self.rows, self.v)
        return self.rows * self.lanes


def weight_staged(box: tuple[int, ...], shape: DirectShape, channels: int) -> int:
    """Values a work item stages: the box of D's M channels and U's halo of a block's `channels`."""
    return shape.m * math.prod(box) + channels * halo(box, shape)


def weight_channel_blocks(shape: DirectShape) -> int | None:
    """The fewest blocks that share a group's U channels equally with at most WEIGHT_MAX_ROWS rows (U channels x
    outer window offsets) each, or None where one channel's rows are more."""
    outer = math.prod(shape.taps[:-1])
    return next((b for b in range(1, shape.source_c + 1)
                 if shape.source_c % b == 0 and shape.source_c // b * outer <= WEIGHT_MAX_ROWS), None)


def weight_tile(shape: DirectShape, hardware: Hardware) -> WeightTile | None:
    """How the direct weight kernel would cut a weight-gradient stage multiplied with FMAs, or None: rows of at most
    WEIGHT_MAX_ROWS (U channels x outer window offsets; the group's channels shared by as few channel blocks as that
    takes) holding at most WEIGHT_MAX_SUMS sums each; V = 4, 2 or 1 cells a read, the last axis of the box up to
    WEIGHT_BOX_LAST (a multiple of V), the outer axes doubled from the innermost out while the staging fits the
    shared memory and the box holds at most WEIGHT_MAX_BOX_CELLS; lanes up to WEIGHT_MAX_ROWS threads; parts to
    fill the SMs once, within the split workspace."""
    if 0 in shape.cells or not 1 <= shape.m or shape.source_c == 0:
        return None
    channel_blocks = weight_channel_blocks(shape)
    if channel_blocks is None or shape.m * shape.taps[-1] > WEIGHT_MAX_SUMS:
        return None
    channels = shape.source_c // channel_blocks
    rows = channels * math.prod(shape.taps[:-1])
    capacity = hardware.shared_per_block // shape.staged_bytes
    *outer, last = shape.cells
    v = 4 if last >= 4 else 2 if last >= 2 else 1
    box = [1] * len(outer) + [min(ceil_div(last, v) * v, WEIGHT_BOX_LAST)]
    if weight_staged(tuple(box), shape, channels) > capacity:
        return None
    grown = True
    while grown:
        grown = False
        for a in reversed(range(len(outer))):
            wider = [*box[:a], box[a] * 2, *box[a + 1:]]
            if box[a] < outer[a] and math.prod(wider) <= WEIGHT_MAX_BOX_CELLS and \
                    weight_staged(tuple(wider), shape, channels) <= capacity:
                box, grown = wider, True
    lanes = max(1, min(WEIGHT_MAX_ROWS // rows, math.prod(box[:-1])))  # lanes take the box's lines in turn
    threads = rows * lanes
    staged_bytes = max(weight_staged(tuple(box), shape, channels),
                       threads * shape.m * shape.taps[-1] if lanes > 1 else 0) * shape.staged_bytes
    if staged_bytes > hardware.shared_per_block:
        return None
    tile = WeightTile(v=v, lanes=lanes, box=tuple(box), parts=1, rows=rows, channel_blocks=channel_blocks)
    return dataclasses.replace(tile, parts=weight_parts(tile, shape, hardware, staged_bytes,
                                                        WEIGHT_REGISTERS * shape.staged_bytes // 4))


def weight_parts(tile: WeightTile, shape: DirectShape, hardware: Hardware, staged_bytes: int, registers: int,
                 workspace_bytes: int = SPLIT_WORKSPACE_BYTES) -> int:
    """Blocks that split a channel block's work items (image, box): enough to fill the SMs once with the blocks an SM
    holds (by `staged_bytes` of shared memory and `registers` a thread), at most one an item, their partial sums
    within `workspace_bytes`."""
    resident = max(1, min(hardware.shared_per_sm // (staged_bytes + hardware.shared_reserved_per_block),
                          hardware.threads_per_sm // tile.threads,
                          hardware.registers_per_sm // (registers * tile.threads), hardware.blocks_per_sm))
    items = shape.images * math.prod(ceil_div(c, b) for c, b in zip(shape.cells, tile.box))
    weights = shape.groups * shape.m * shape.source_c * math.prod(shape.taps)
    workspace = workspace_bytes // (weights * shape.staged_bytes)
    return max(1, min(items, ceil_div(resident * hardware.sm_count, shape.groups * tile.channel_blocks), workspace))


def weight_mma_shared_bytes(tile: WeightTile, shape: DirectShape) -> int:
    """Shared memory of the tensor-core weight kernel's staging (the launch's dynamic shared memory): D's box, a row
    per D channel of whole tiles of 16, and U's halo, a row per U channel of a channel block in whole tiles of 8,
    rows of weight_mma_row_words words."""
    channels = shape.source_c // tile.channel_blocks
    return (ceil_div(shape.m, 16) * 16 * weight_mma_row_words(math.prod(tile.box))
            + ceil_div(channels, 8) * 8 * weight_mma_row_words(halo(tile.box, shape))) * 4


def weight_mma_tile(shape: DirectShape, hardware: Hardware) -> WeightTile | None:
    """How the direct weight kernel would cut a weight-gradient stage on TF32 tensor cores (`shape.mma`), or None: up
    to MMA_WEIGHT_MAX_M D channels; the U channels in the fewest equal channel blocks of at most MMA_WEIGHT_MAX_UCB
    with which each warp's V outer window offsets, as many as MMA_WEIGHT_MAX_SUMS sums a thread allow, spread evenly
    over at most MMA_WEIGHT_MAX_WARPS warps (more blocks, fewer U channels a block: fewer sums an offset); the most
    cells of MMA_WEIGHT_BOX_CELLS whose mma_box staging leaves MMA_WEIGHT_BLOCKS_PER_SM blocks an SM, in the box of at
    most that many that fitted_box finds, its registers fitted to as many blocks; parts as the FMA form's."""
    if not shape.weight or shape.mma != MMA_DIRECT_MODE or not 1 <= shape.m <= MMA_WEIGHT_MAX_M \
            or shape.source_c == 0 or 0 in shape.cells:
        return None
    outer = math.prod(shape.taps[:-1])
    for channel_blocks in range(1, shape.source_c + 1):
        if shape.source_c % channel_blocks or shape.source_c // channel_blocks > MMA_WEIGHT_MAX_UCB:
            continue
        row_sums = shape.taps[-1] * ceil_div(shape.m, 16) * ceil_div(shape.source_c // channel_blocks, 8) * 4
        warps = ceil_div(outer, max(1, MMA_WEIGHT_MAX_SUMS // row_sums))
        if row_sums <= MMA_WEIGHT_MAX_SUMS and warps <= MMA_WEIGHT_MAX_WARPS:
            break
    else:
        return None
    limit = min(hardware.shared_optin_per_block,
                hardware.shared_per_sm // MMA_WEIGHT_BLOCKS_PER_SM - hardware.shared_reserved_per_block)
    for cells in MMA_WEIGHT_BOX_CELLS:
        tile = WeightTile(v=ceil_div(outer, warps), lanes=1, box=mma_box(shape.cells, cells), parts=1, rows=outer,
                          channel_blocks=channel_blocks, mma=MMA_DIRECT_MODE, min_blocks=MMA_WEIGHT_BLOCKS_PER_SM)
        if weight_mma_shared_bytes(tile, shape) <= limit:
            tile = dataclasses.replace(tile, box=fitted_box(tile, shape, limit))
            staged_bytes = weight_mma_shared_bytes(tile, shape)
            return dataclasses.replace(tile, parts=weight_parts(tile, shape, hardware, staged_bytes,
                                                                weight_mma_registers(tile, hardware),
                                                                MMA_WEIGHT_WORKSPACE_BYTES))
    return None


def weight_mma_registers(tile: WeightTile, hardware: Hardware) -> int:
    """A thread's registers in the tensor-core weight kernel: what its launch bounds (its threads, `min_blocks` blocks
    an SM) leave it, allocated 8 at a time, at most MMA_WEIGHT_REGISTERS."""
    return min(MMA_WEIGHT_REGISTERS, hardware.registers_per_sm // (tile.min_blocks * tile.threads) // 8 * 8)


def grid_staging(box: tuple[int, ...], shape: DirectShape, channels: int) -> int:
    """Values all work items of an image stage for a channel block of `channels` U channels with `box`: D's box
    (empty cells past D's extent too, which the tensor cores also multiply) and U's halo, times the boxes that cover
    D's cells."""
    return math.prod(ceil_div(c, b) for c, b in zip(shape.cells, box)) * weight_staged(box, shape, channels)


def fitted_box(tile: WeightTile, shape: DirectShape, limit: int) -> tuple[int, ...]:
    """The box of D's cells for `tile` whose work items stage the fewest values (grid_staging) among outer_boxes
    whose staging is within `limit` bytes; `tile.box` (mma_box's) where none stages fewer. A 7-D 5^7 grid of D's
    cells in mma_box's 1x2x2x2x2x2x5: 40% of the cells the tensor cores multiply are D's; in this one's
    1x1x1x2x2x5x5, 69%."""
    channels = shape.source_c // tile.channel_blocks
    fits = (box for box in outer_boxes(tile.box, shape.cells)
            if weight_mma_shared_bytes(dataclasses.replace(tile, box=box), shape) <= limit)
    return min((tile.box, *fits), key=lambda box: grid_staging(box, shape, channels))
