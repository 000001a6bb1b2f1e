"""The small-channel direct kernels: when a conv-shaped stage (forward or backward_input: one of the direct form,
the other gathered per stride phase) runs as a stencil (templates/cuda/_direct_conv.cu.j2), or the weight gradient
as its direct kernel (templates/cuda/_direct_weight.cu.j2; its tiles are direct_weight_model's), instead of the
stage's implicit GEMM (`choose_direct`), and how a conv-shaped stage's blocks are cut, with FMAs or on TF32 tensor
cores. Steers which kernel runs, never what is computed. The stencils themselves are direct_shapes'.

An implicit GEMM of M dst channels reuses each gathered source value M times; with few channels and a large
window the gather dominates (conv4d N8 8->8 16⁴: 298 µs forward as a GEMM, 18 TFLOP/s). The direct kernel
stages a box's source halo once per step and slides each thread's cells over the window in registers.
Measured on the H200 (benchmarks/measured/2026-12-01-h200-*direct-sweep*.txt, forward, µs, direct / GEMM, before
the staging per cell of docs/DESIGN.md, which took conv4d N8 to 178-183): conv4d N8 8->8 16⁴ k3 214 / 298 and
one image 45 / 50, N32 8->8 8⁴ 61 / 89, conv3d N8 8->8 32³ k3 40 / 59; with 16 channels it lost (conv3d N16
16->16 16³: 49 / 45), with 9-offset windows it tied (conv2d N32 16->16 56² 32 / 34, N8 3->16 224² 21 / 24,
conv1d N32 8->8 k5 19 / 19) and with many source channels it lost (conv2d N32 64->8 56²: 81 / 65). The
gather-form stages (backward_input of a conv, µs of the whole backward of one recorded forward, direct / GEMM;
2026-12-01-h200-*-direct-sweep-bwi.txt) follow the same rule: conv4d N8 8->8 16⁴ 900 / 979, N32 8⁴ 238 / 270,
conv3d N8 8->8 32³ 260 / 280; 16 channels 156 / 154, 9 offsets 111 / 113, an 8-channel dst with 64 source
channels 192 / 189. With 3 dst channels, 64 source channels and phases of 16 offsets (conv2d N32 3->64 224² k7
s2) it won, 1167 / 1310; with phases of 4 or 8 offsets (k4 s2, conv3d k3 s2) it lost, 187 / 168 and 96 / 78.

The same rule holds in the tensor-core precisions: the direct kernels' float32 FMAs are at least as accurate as
TF32 or 3xTF32 (a precision is the least accuracy a stage gets), and at so few channels the tensor cores' tiles
are mostly padding (conv4d N8 8->8 16⁴ on the H200: forward 0.176 ms on the direct kernel, 0.456 on TF32's
implicit GEMM, 0.588 on 3xTF32's; 2026-12-02-h200-60be10f-batched.log).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from convgen.direct_shapes import MMA_DIRECT_MODE, DirectShape, halo, mma_box, outer_boxes
from convgen.direct_weight_model import (
    DIRECT_WEIGHT_MAX_SOURCE_C,
    DIRECT_WEIGHT_MIN_WINDOW,
    WeightTile,
    weight_mma_registers,
    weight_mma_tile,
    weight_tile,
)
from convgen.gemm_shapes import ceil_div
from convgen.generated.contract import direct_mma_row_words
from convgen.tile_model import Hardware
from convgen.wgmma_tiles import wgmma_reaches

DIRECT_MAX_M = 16  # dst channels a block holds (MB x V accumulators a thread): the kernel takes up to this many
# When the plans take it (FMAs only): few dst and source channels and a window of many offsets ...
DIRECT_PLAN_MAX_CHANNELS = 8
DIRECT_MIN_WINDOW = 27  # offsets of the window (a 3x3x3 one; a phase's in the gather form)
# ... or very few dst channels, whatever the source channels, a window of some offsets and many cells an SM
# (measured with 27 blocks of 512 cells an SM; one image's 0.85 an SM timed within the noise of its GEMM).
DIRECT_FEW_DST = 4
DIRECT_FEW_DST_MIN_WINDOW = 16
DIRECT_FEW_DST_MIN_CELLS_PER_SM = 4 * 512  # four such blocks: dst cells of all phases, images and groups
# How its blocks are cut. V = 2 cells a thread at 256 threads ran every measured case fastest or within 5% of the
# fastest (conv4d N8 16⁴: 214 µs, V = 8 205, V = 4 216; one image 46 against 67-118 for V = 4 or 8; conv3d N8
# 32³: 40 against 43-64); padding the staged rows against bank conflicts changed nothing measurable (conv4d N8:
# 228.4 against 228.2 µs). Since the halo is staged cell by cell, a larger V pays where the grid stays large and
# the box covers the cells as well (H100, benchmarks/measured/2026-12-06-h100-s42-344401c-direct-sweep-*.txt):
# the conv4d N8 forward 167.8 µs at V = 4 against 178.5, its backward 402 against 411; the k7 s2 input gradient
# (3 dst channels, phases of 112 cells a line) 863 µs a backward at V = 7 (16 threads a line, no idle ones)
# against 1003 at V = 2 (64 threads for 112 cells) and 951-1021 at V = 4 or 8; one image's conv4d, with 64
# blocks at V = 4, 52.6 against 35.0.
DIRECT_CELLS = 2  # V: consecutive dst cells a thread owns along the last axis, unless a larger V ...
DIRECT_MAX_CELLS = 8  # ... up to this many, boxes the cells with fewer idle threads, or as few with more reuse, ...
DIRECT_MAX_SUMS = 32  # ... while a thread's V x MB sums stay within this many (V = 2 at 16 dst channels) ...
DIRECT_MIN_BLOCKS_PER_SM = 2  # ... and its grid keeps this many blocks an SM
DIRECT_MAX_SPAN = 32  # The source run a thread's V cells read stays within this many registers
DIRECT_THREADS = (256, 128, 64, 32)  # block sizes tried, largest first, until one channel's step fits 48 KB
DIRECT_MAX_CB = 8  # source channels staged per step (fewer barriers and halo positions a channel) ...
# ... within the static shared memory, or past it in dynamic shared memory up to an SM's share for this many blocks,
# or for the blocks an SM the grid has where fewer. H100 (benchmarks/measured/2026-12-06-h100-s44-direct-sweep-*):
# conv4d N8 forward 169.6 µs at 2 channels a step, 159.3 at 4 (72 KB, 3 blocks an SM), 180.1 at 8 (one block);
# one image's 64 blocks 35.2 at 2, 29.6 at 8; the k7 s2 input gradient's backward 869.4 at 4, 833.4 at 8.
DIRECT_STAGING_BLOCKS_PER_SM = 3
# The direct kernel on TF32 tensor cores (_direct_mma.cu.j2): each warp takes V tiles of MMA_TILE_CELLS of the box's
# cells against MB dst channels (whole tiles of 8, at most MMA_DIRECT_MAX_M), CB source channels a step (8: one k
# step, whose rows of 8 words keep a warp's fragment loads on distinct banks), a box of the most cells of
# MMA_DIRECT_BOX_CELLS whose staging fits an SM (the first axis's window offsets in slices where the whole window's
# weights would not). V = 2 at the largest box was fastest or within 2% of it in every case measured (H100,
# benchmarks/measured/2026-12-06-h100-s47-mma-v-sweep-*.txt, forward / whole backward µs against V = 4 at the box
# that left two blocks an SM): conv4d N4 16->16 20⁴ 407 / 1748 against 451 / 1871, N2 16->16 8x32³ (512 cells, one
# block an SM) 316 / 1401 against 416 / 1702, conv4d N8 8->8 16⁴ 98 / 332 against 96 / 341, conv3d N16 16->16 16³
# 17.8 / 65 against 18.8 / 67, conv2d N32 16->16 56² 17.3 / 54 against 17.6 / 54; V = 1 lost (480 µs on 8x32³).
MMA_TILE_CELLS = 16
MMA_DIRECT_MAX_M = 32
MMA_DIRECT_TILES = 2
MMA_DIRECT_CB = 8
MMA_DIRECT_BOX_CELLS = (512, 256, 128, 64)
MMA_DIRECT_BLOCKS_PER_SM = 1
# The plans take it in "medium" for 8 to 16 dst and source channels and windows of 9 offsets or more,
# where it was measured faster than both the FMA direct kernel and the TF32 GEMM (H100, direct_sweep.py --precision
# medium, forward µs / whole backward µs, mma against the plans' pick before): conv4d N4 16->16 20⁴ 466 / 1886 against
# 874 / 2181, N2 16->16 8x32³ 433 / 1718 against 764 / 1851, conv4d N8 8->8 16⁴ 98 / 345 against 153 / 384 (the FMA
# direct kernel), conv3d N16 16->16 16³ 37 / 69 against 44 / 87, conv2d N32 16->16 56² 30 / 84 against 34 / 85.
# With one source channel (1->16: forward 186 against 157) or one dst channel (16->1: backward 595 against 308) it
# lost. A 4-D k5 window (N2 10->10 16⁴, its first axis's offsets one a step) took 457 / 1151 µs against 1461 / 1971
# on the TF32 GEMM (-h100-s47-slices-direct-sweep-*.txt). Up to 32 channels (the kernel's MMA_DIRECT_MAX_M) it takes
# the stages no wgmma tile takes (wgmma_reaches: fewer than 32 dst channels), where the GEMM runs mma.sync tiles:
# conv4d N8 24->24 16⁴ (H100, µs, forward / whole backward of one recorded forward) 545 / 3007 against 1945 / 4343,
# in bf16 (each stage alone, forward / input gradient) 571 / 643 against 2000 / 2030 (-h100-s49-6b5ceea-sweep-*.txt).
# Where wgmma takes a stage it keeps it: at 32 channels TF32's forward ran 6-13% faster here but its backward no
# faster (N8 32->32 16⁴ 884 / 2457 against 1018 / 2436, 8x8x32² 923 / 2452 against 977 / 2395, conv3d 32³ 167 / 449
# against 183 / 440), and the 16-bit wgmma was 2.4-2.9x faster (32->32 16⁴ bf16: 324 / 316 against 774 / 924). 1-D
# windows were not measured.
MMA_PLAN_MIN_CHANNELS = 8
MMA_PLAN_MAX_CHANNELS = MMA_DIRECT_MAX_M
MMA_PLAN_MIN_WINDOW = 9
# The weight gradient's tensor-core form (direct_weight_model.weight_mma_tile), where it beat the FMA direct weight
# kernel (H100, whole backward of one recorded forward in "medium", µs, mma / FMA; -h100-s47-direct-sweep-bww.txt):
# conv4d N4 16->16 20⁴ 1384 / 1784, N2 16->16 8x32³ 840 / 1433. It lost at 8 channels (conv4d N8 8->8 16⁴ 363 / 340, N32
# 8⁴ 103 / 99: half of each 16-row tile is padding) and at windows of 27 or 9 offsets (conv3d N16 16->16 16³ 72 / 66,
# conv2d N32 16->16 56² 69 / 59). At 16 channels it beat the GEMM on windows of 64 to 256 offsets at ranks 2-8, and the
# FMA form but at rank 8 (by 1.2%) (µs, the tile / the GEMM / the FMA form where it runs, "medium" then bf16's stage
# alone; -h100-s52-*-sweep-*.txt): conv2d N8 128² k9 166 / 364, 94 / 241; k8 184 / 283, 119 / 183; conv3d N4 32³ k5 281
# / 579, 152 / 386; k4 214 / 340 / 372, 139 / 227 / 301; conv4d N4 20⁴ 1096 / 2927 / 1767; conv6d N4 8⁶ k2 1031 / 1921 /
# 1641, 439 / 1081 / 1065; conv7d N4 6⁷ k2 2928 / 3228 / 4270, 1519 / 1572 / 2868; conv8d N2 5⁸ k2 7956 / 8316 / 7864.
# Past 16 channels (µs, its pick / the plan's; -h100-s51-3eddde1-sweep-weight-*.txt) it beat what the plans took at rank
# 4, conv4d N8 24->24 16⁴ 1426 / 3007 and 770 / 1864; N8 32->32 16⁴ 2114 / 2473 and 8x8x32² 2097 / 2441 in "medium", in
# bf16 1033 / 790 against the 16-bit wgmma, which multiplies at twice TF32's rate: where a wgmma reaches a 16-bit stage
# (DirectShape.half) it keeps it. Its two m16 tiles of D channels need registers: at 448 threads (72 registers a thread
# for two blocks an SM) and at 256 it won (conv2d N8 128² k8 24->24 298 / 584 and 174 / 349, 32->32 470 / 502), at 512
# (64 registers) it lost every time (conv3d N4 32³ k4 24->24 1027 / 651, conv6d N4 8⁶ k2 24->24 4770 / 3202, conv7d N2
# 6⁷ k2 24->24 3642 / 3166, and as much at 32 channels); past 16 channels it needs MMA_WEIGHT_PLAN_WIDE_MIN_REGISTERS.
MMA_WEIGHT_PLAN_MIN_CHANNELS = 16
MMA_WEIGHT_PLAN_MAX_CHANNELS = 32
MMA_WEIGHT_PLAN_MIN_WINDOW = 64
MMA_WEIGHT_PLAN_WIDE_MIN_REGISTERS = 72


@dataclass(frozen=True, slots=True)
class DirectTile:
    """One block: MB dst channels of a box of dst cells (`box`, per axis), V cells a thread along the last
    axis, CB source channels staged per step."""

    v: int
    mb: int
    cb: int
    box: tuple[int, ...]
    mma: int = 0  # MMA_DIRECT_MODE: on the tensor cores, each warp taking v tiles of 16 of the box's cells
    slices: int = 1  # steps a channel block takes over the first axis's window offsets (on the tensor cores)

    @property
    def threads(self) -> int:
        if self.mma:
            return 32 * ceil_div(ceil_div(math.prod(self.box), MMA_TILE_CELLS), self.v)
        return math.prod(self.box[:-1]) * (self.box[-1] // self.v)


DirectChooser = Callable[[DirectShape, Hardware], "DirectTile | WeightTile | None"]


def direct_shared_bytes(tile: DirectTile, shape: DirectShape) -> int:
    """Shared memory of a block's staging: CB channels' weights (MB padded to quads) and halo (in the launch's
    dynamic shared memory past the static limit); on the tensor cores a row of CB channels per (window offset of a
    step, dst channel) and per halo cell of a step."""
    if tile.mma:
        step_taps = shape.window // tile.slices
        return (step_taps * tile.mb + halo(tile.box, shape, tile.slices)) * direct_mma_row_words(tile.cb) * 4
    weights = tile.cb * shape.window * ceil_div(tile.mb, 4) * 4
    return (weights + tile.cb * halo(tile.box, shape)) * shape.staged_bytes


def direct_box(dst_spatial: tuple[int, ...], v: int, threads: int) -> tuple[int, ...]:
    """A block's box for `threads` threads of `v` cells: the last axis first (whole if it fits), then the
    other axes doubled in turn from the innermost out, none past its extent rounded up to a power of two."""
    *outer, last = dst_spatial
    line = min(1 << (ceil_div(last, v) - 1).bit_length(), threads)
    box, room = [1] * len(outer), threads // line
    while room > 1:
        grown = False
        for a in reversed(range(len(outer))):
            if room > 1 and box[a] < outer[a]:
                box[a], room, grown = box[a] * 2, room // 2, True
        if not grown:
            break
    return (*box, line * v)


def direct_tile(shape: DirectShape, hardware: Hardware, threads_tried: tuple[int, ...] = DIRECT_THREADS
                ) -> DirectTile | None:
    """How the direct kernel would cut a stage of at most DIRECT_MAX_M dst channels multiplied with FMAs, or
    None. V = DIRECT_CELLS cells a thread (fewer while their source run exceeds DIRECT_MAX_SPAN), or a larger V
    up to DIRECT_MAX_CELLS whose tile covers the cells at least as well (the largest such), within
    DIRECT_MAX_SUMS sums a thread and DIRECT_MIN_BLOCKS_PER_SM blocks an SM. A V's tile: the first block size of
    `threads_tried` whose step of one source channel fits the static shared memory, then as many channels a step
    as `staging_bytes` holds."""
    if shape.weight:
        return weight_tile(shape, hardware)
    if not 1 <= shape.m <= DIRECT_MAX_M or shape.source_c == 0 or 0 in shape.cells:
        return None  # FMAs only, few dst channels, something to read and to write
    span = lambda v: (v - 1) * shape.step[-1] + (shape.taps[-1] - 1) * shape.spacing[-1] + 1  # noqa: E731
    first_fit = lambda v: next((tile for threads in threads_tried  # noqa: E731
                                if (tile := cut_tile(shape, v, threads, hardware))), None)
    v = min(DIRECT_CELLS, shape.cells[-1])
    while v > 1 and span(v) > DIRECT_MAX_SPAN:
        v -= 1
    base = first_fit(v) if span(v) <= DIRECT_MAX_SPAN else None
    if base is None:
        return None
    wider = (tile for wide in range(v + 1, min(DIRECT_MAX_CELLS, shape.cells[-1]) + 1)
             if wide * shape.m <= DIRECT_MAX_SUMS and span(wide) <= DIRECT_MAX_SPAN and (tile := first_fit(wide))
             and direct_grid(tile, shape) >= DIRECT_MIN_BLOCKS_PER_SM * hardware.sm_count)
    return max((base, *wider), key=lambda tile: (covered(tile, shape), tile.v))


def mma_tile(shape: DirectShape, hardware: Hardware) -> DirectTile | None:
    """How the direct kernel would cut a conv-shaped stage on TF32 tensor cores (`shape.mma`), or None: MMA_DIRECT_TILES
    tiles a warp, every dst channel of a group (up to MMA_DIRECT_MAX_M) a block, MMA_DIRECT_CB source channels a step,
    the box of the most cells of MMA_DIRECT_BOX_CELLS (mma_box) whose staging fits MMA_DIRECT_BLOCKS_PER_SM blocks an
    SM, in the fewest slices of the first axis's window offsets (mma_slices) that make it fit, then fitted to the
    extents within as many cells (fitted_mma_tile)."""
    if shape.weight or shape.mma != MMA_DIRECT_MODE or not 1 <= shape.m <= MMA_DIRECT_MAX_M or shape.source_c == 0 \
            or 0 in shape.cells:
        return None
    limit = min(hardware.shared_optin_per_block,
                hardware.shared_per_sm // MMA_DIRECT_BLOCKS_PER_SM - hardware.shared_reserved_per_block)
    for cells in MMA_DIRECT_BOX_CELLS:
        tile = fewest_slices(DirectTile(v=MMA_DIRECT_TILES, mb=ceil_div(shape.m, 8) * 8, cb=MMA_DIRECT_CB,
                                        box=mma_box(shape.cells, cells), mma=MMA_DIRECT_MODE), shape, limit)
        if tile is not None:
            return fitted_mma_tile(tile, shape, limit)
    return None


def fewest_slices(tile: DirectTile, shape: DirectShape, limit: int) -> DirectTile | None:
    """`tile` in the fewest slices of the first axis's window offsets (mma_slices) whose staging is within `limit`
    bytes, or None."""
    return next((sliced for slices in mma_slices(shape)
                 if direct_shared_bytes(sliced := dataclasses.replace(tile, slices=slices), shape) <= limit), None)


def fitted_mma_tile(tile: DirectTile, shape: DirectShape, limit: int) -> DirectTile:
    """`tile` with the box of outer_boxes, in its fewest slices, that moves the fewest rows through shared memory
    (mma_traffic); `tile` where none moves fewer."""
    fits = (sliced for box in outer_boxes(tile.box, shape.cells)
            if (sliced := fewest_slices(dataclasses.replace(tile, box=box), shape, limit)))
    return min((tile, *fits), key=lambda t: mma_traffic(t, shape))


def mma_traffic(tile: DirectTile, shape: DirectShape) -> int:
    """Rows (a source channel's word each) a launch's boxes of an image move through shared memory: the tiles' rows
    read at each window offset (whole tiles of MMA_TILE_CELLS, empty cells past the stage's extent too), the halo
    staged at each slice and the weights, a row per window offset and dst channel, staged by every box."""
    boxes = math.prod(ceil_div(c, b) for c, b in zip(shape.cells, tile.box))
    rows = ceil_div(math.prod(tile.box), MMA_TILE_CELLS) * MMA_TILE_CELLS
    return boxes * (rows * shape.window + tile.slices * halo(tile.box, shape, tile.slices) + shape.window * tile.mb)


def mma_slices(shape: DirectShape) -> list[int]:
    """The slices the tensor-core direct kernel may cut the first axis's window offsets into: its divisors (equal
    slices), or only 1 at rank 1 (whose first axis is the last, unrolled whole)."""
    first = shape.taps[0] if len(shape.taps) > 1 else 1
    return [s for s in range(1, first + 1) if first % s == 0]


def covered(tile: DirectTile, shape: DirectShape) -> float:
    """The share of the cells its boxes cover that a stage has: the rest are threads with nothing to write."""
    return math.prod(shape.cells) / math.prod(ceil_div(c, b) * b for c, b in zip(shape.cells, tile.box))


def cut_tile(shape: DirectShape, v: int, threads: int, hardware: Hardware, max_cb: int = DIRECT_MAX_CB,
             shared_bytes: int | None = None) -> DirectTile | None:
    """The tile of `v` cells a thread and a box for `threads` threads, or None when one source channel's step does
    not fit the static shared memory. It stages as many source channels a step as fit `shared_bytes` (by default
    `staging_bytes`; `max_cb`, then halves of it, none past the stage's)."""
    box = direct_box(shape.cells, v, threads)
    one_channel = DirectTile(v=v, mb=shape.m, cb=1, box=box)
    if direct_shared_bytes(one_channel, shape) > hardware.shared_per_block:
        return None
    limit = staging_bytes(direct_grid(one_channel, shape), hardware) if shared_bytes is None else shared_bytes
    for halvings in range(max_cb.bit_length()):
        tile = DirectTile(v=v, mb=shape.m, cb=min(max_cb >> halvings, shape.source_c), box=box)
        if direct_shared_bytes(tile, shape) <= limit:
            return tile
    return None


def staging_bytes(grid: int, hardware: Hardware) -> int:
    """The shared memory a block of a `grid` of blocks may stage in: an SM's share for DIRECT_STAGING_BLOCKS_PER_SM
    blocks, or for the blocks an SM the grid has where fewer (at least one), and never less than the static limit."""
    blocks = max(1, min(DIRECT_STAGING_BLOCKS_PER_SM, ceil_div(grid, hardware.sm_count)))
    share = hardware.shared_per_sm // blocks - hardware.shared_reserved_per_block
    return max(hardware.shared_per_block, min(hardware.shared_optin_per_block, share))


def choose_direct(shape: DirectShape, hardware: Hardware) -> DirectTile | None:
    """The plans' direct chooser, where it was measured faster than the GEMM: the direct tile of a conv-shaped stage
    of at most DIRECT_PLAN_MAX_CHANNELS dst and source channels and a window of at least DIRECT_MIN_WINDOW offsets, or
    of at most DIRECT_FEW_DST dst channels and DIRECT_FEW_DST_MIN_WINDOW offsets with DIRECT_FEW_DST_MIN_CELLS_PER_SM
    dst cells an SM; of a weight-gradient stage of at most DIRECT_MAX_M D channels, DIRECT_WEIGHT_MAX_SOURCE_C U
    channels and DIRECT_WEIGHT_MIN_WINDOW offsets; on TF32 tensor cores (`shape.mma`), the mma tile of a
    conv-shaped stage of MMA_PLAN_MIN_CHANNELS to MMA_PLAN_MAX_CHANNELS dst and source channels and a window of at
    least MMA_PLAN_MIN_WINDOW offsets that no wgmma tile takes, or of a weight-gradient stage of as many D as U
    channels, MMA_WEIGHT_PLAN_MIN_CHANNELS to MMA_WEIGHT_PLAN_MAX_CHANNELS, and at least MMA_WEIGHT_PLAN_MIN_WINDOW
    offsets, past MMA_WEIGHT_PLAN_MIN_CHANNELS with MMA_WEIGHT_PLAN_WIDE_MIN_REGISTERS a thread, unless its elements are
    16-bit and a wgmma reaches it; else None (the GEMM)."""
    if shape.mma and not shape.weight and MMA_PLAN_MIN_CHANNELS <= min(shape.m, shape.source_c) \
            and max(shape.m, shape.source_c) <= MMA_PLAN_MAX_CHANNELS and shape.window >= MMA_PLAN_MIN_WINDOW \
            and not wgmma_reaches(hardware, shape.phases, shape.m, shape.source_c) \
            and (mma := mma_tile(shape, hardware)):
        return mma
    if shape.mma and shape.weight and shape.m == shape.source_c \
            and MMA_WEIGHT_PLAN_MIN_CHANNELS <= shape.m <= MMA_WEIGHT_PLAN_MAX_CHANNELS \
            and shape.window >= MMA_WEIGHT_PLAN_MIN_WINDOW \
            and not (shape.half and wgmma_reaches(hardware, shape.phases, shape.m, shape.source_c)) \
            and (mma := weight_mma_tile(shape, hardware)) \
            and (shape.m == MMA_WEIGHT_PLAN_MIN_CHANNELS
                 or weight_mma_registers(mma, hardware) >= MMA_WEIGHT_PLAN_WIDE_MIN_REGISTERS):
        return mma
    tile = direct_tile(shape, hardware)
    if tile is None:
        return None
    if shape.weight:
        few = shape.m <= DIRECT_MAX_M and shape.source_c <= DIRECT_WEIGHT_MAX_SOURCE_C
        return tile if few and shape.window >= DIRECT_WEIGHT_MIN_WINDOW else None
    if max(shape.m, shape.source_c) <= DIRECT_PLAN_MAX_CHANNELS and shape.window >= DIRECT_MIN_WINDOW:
        return tile
    few_dst = shape.m <= DIRECT_FEW_DST and shape.window >= DIRECT_FEW_DST_MIN_WINDOW
    cells = shape.images * shape.groups * shape.phases * math.prod(shape.cells)
    return tile if few_dst and cells >= DIRECT_FEW_DST_MIN_CELLS_PER_SM * hardware.sm_count else None


def no_direct(shape: DirectShape, hardware: Hardware) -> None:
    """A direct chooser that always leaves the stage to its GEMM."""
    return None


def direct_grid(tile: DirectTile, shape: DirectShape) -> int:
    """Blocks of a launch: (image, group, phase, dst channel block, box)."""
    boxes = math.prod(ceil_div(d, b) for d, b in zip(shape.cells, tile.box))
    return shape.images * shape.groups * shape.phases * ceil_div(shape.m, tile.mb) * boxes


