"""Tiles of the `_wgmma` kernels: the GEMM stages in the TF32 modes on Hopper's warpgroup tensor cores
(templates/cuda/_wgmma_conv.cu.j2, _wgmma_weight.cu.j2), by rule from a prototype sweep on the H200
(benchmarks/NOTES.md, thirteenth session). Pure Python; the shape is a gemm_shapes.GemmShape (conv-shaped stages
m: dst channels of a group, n: dst cells, source_c: source channels of a group; the weight gradient m: D's channels,
source_c: U's, reduction: D's cells), the hardware a tile_model.Hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from convgen.generated.contract import (
    HALF_MMA_MODE,
    WG_BK,
    WG_NS,
    wgmma_operand_bytes,
    wgmma_planes,
    wgmma_shared_bytes,
    wgmma_staged_source_floats,
    wgmma_weight_shared_bytes,
)
from convgen.geometry import U32_LIMIT

# Two warpgroups a block, 64 dst cells each: on N8 128->128 128² one warpgroup of 128 cells (two m64 tiles a
# warp) ran 3% slower, two of 128 cells each 10% slower.
WGMMA_CELLS = 128
WGMMA_STAGES = 3  # slices in shared memory, two in flight: four ran 32% slower in TF32 on N8 128->128, 3xTF32 the same
# 16-bit elements (planned with `pipelined` off) keep a slice's products in flight while the next is prepared: the
# slices two back and one back may still be read when two ahead is copied and one ahead lands, so four buffers.
WGMMA_16BIT_STAGES = 4
# The widest N per mode: 3xTF32 keeps a slice's sums apart from the total, twice the accumulator registers.
WGMMA_MAX_N = {1: 256, 3: 128}
# Below these the GEMM's tiles stay: a block would mostly multiply zeros (wgmma's N and its 32-channel slices).
WGMMA_MIN_DST_C = 32
WGMMA_MIN_SOURCE_C = 16
# The weight gradient's reduction (the cells of every image, in slices of WG_BK) is split across blocks until the
# GPU's SMs each have this many per mode (one runs at a time: registers), each part at least WGMMA_WEIGHT_MIN_SLICES.
# Two waves ran TF32's weight gradient 5-7% faster on N8 128->128 and N32 64->64, 3xTF32's 1-4% slower (H200).
WGMMA_WEIGHT_BLOCKS_PER_SM = {1: 2, 3: 1}
WGMMA_WEIGHT_MIN_SLICES = 8
WGMMA_TWO_BLOCK_MAX_RANK = 7
WGMMA_TF32_TWO_BLOCK_RANKS = (2, 3)
WGMMA_16BIT_UNCAPPED_MAX_RANK = 2
# 16-bit conv-shaped stages up to this N take slices of two WG_BK blocks (k 64, rows of 128 bytes): a barrier and a
# wait a slice serve four k16 products instead of two. Four stages of them still fit two blocks an SM there; at an N
# of 128 they do not (one block an SM: N8 128->128 bf16 forward 146 -> 185 µs; three stages, two blocks: 151), while
# N32 64->64 went 58.6 -> 55.6, conv3d 32->32 146 -> 136 and conv1d 45.3 -> 41.3 (H200, benchmarks/NOTES.md).
# The 16-bit weight gradient likewise: slices of 64 of D's cells, B's rows of 128 bytes.
WGMMA_16BIT_WIDE_MAX_N = 64
# 16-bit conv-shaped stages read their source channels-last (a `_wgsource` pass first, then 16-byte copies: the loop's
# instructions a slice 245 -> 37 on conv3d 32->32) where each source element feeds at least this many products (the
# window's cells times the dst channels of a group), which pay for the pass. On the H200 (benchmarks/NOTES.md,
# twenty-seventh session), the stage with its pass against the gather from the channel planes: conv1d 64->64 k5 (320)
# 1.18x the time, 64->64 3x3 (576) 1.05x, conv3d 32->32 3x3x3 (864) 0.93x, 128->128 3x3 (1152) 0.94x.
WGMMA_16BIT_CHANNELS_LAST_MIN_USES = 700
# Channels-last stages of stride 1 along the last axis stage a slice's rows once for every window offset of that axis
# (WG_SHIFT): slices of one WG_BK block (rows of 64 bytes) at the other axes' offsets, each staging the tile's cells
# and the (K - 1) D cells past them, its B the weight's rows of every offset of the last axis. On the H200 conv3d
# 32->32's forward took 68 µs against 122 (benchmarks/NOTES.md, twenty-eighth session). In N blocks of up to 64 (B's
# rows grow with the offsets: an N of 128 at k3 would take 135 KB of shared memory in four stages), over up to 128 dst
# channels of a group (N8 128->128: two blocks of 64 took 109.6 µs against 119.0 unshifted in one of 128; wider
# stages were not measured), up to a tile's cells past it (the copies' second pass), and within the shared memory a
# 16-bit block was measured right in: on the H200 the 16-bit loop gave other bits past about 113 KB a block, for a
# reason not yet found (twenty-seventh session).
WGMMA_SHIFT_MAX_N = 64
WGMMA_SHIFT_MAX_M = 128
WGMMA_16BIT_MAX_SHARED = 97 * 1024
# Shifted, a stage reads a source element once for the last axis's offsets, so its pass pays from fewer products a
# source element: N32 64->64 3x3 (576) took 0.93x the gather's time shifted channels-last, its input gradient 0.92x
# (H200, benchmarks/NOTES.md, twenty-eighth session); fewer were not measured.
WGMMA_16BIT_SHIFTED_MIN_USES = 576
# The 16-bit weight gradient shifted (WG_SHIFT, _shifted_weight_tile): a block's rows of dW (both warpgroups' 64);
# from an N of 64 (each warpgroup half of it, wgmma's N 32 or more), its accumulators (the last axis's K offsets at
# half of N) at most this many a thread, and the cells U's slices take past D's at most this many. Its split plans
# one block an SM even where ptxas is asked for two: on an H100, N32 64->64's weight gradient took 62.5 µs in 44 parts
# and 78.6 in 88 (benchmarks/NOTES.md, fortieth session).
WGMMA_SHIFT_WEIGHT_ROWS = 64
WGMMA_SHIFT_WEIGHT_MIN_N = 64
WGMMA_SHIFT_WEIGHT_MAX_ACCUMULATORS = 96
WGMMA_SHIFT_WEIGHT_MAX_ROWS = 64
WGMMA_SHIFT_WEIGHT_BLOCKS_PER_SM = 1
# On since it ran on an H100: 0.77-0.95x the unshifted weight gradient's time on the batched cases it takes
# (benchmarks/NOTES.md, fortieth session). `choose_wgmma(..., weight_shift=False)` plans the unshifted one.
WGMMA_SHIFT_WEIGHT_BY_DEFAULT = True


@dataclass(frozen=True, slots=True)
class WgmmaTile:
    n: int  # dst channels of a block: wgmma's N
    cells: int  # dst cells of a block, 64 a warpgroup
    stages: int  # slices in shared memory, stages - 1 of them in flight
    split: int = 1  # the weight gradient: parts of its reduction, one a block (the stage's SPLIT)
    min_blocks: int = 1  # blocks an SM its registers must allow (the stage's WG_MIN_BLOCKS)
    k: int = WG_BK  # a slice's share of the reduction (the stage's WG_K): 16-bit stages up to an N of 64 take 2 WG_BK
    channels_last: bool = False  # 16-bit: the source (U) read as the stage's `_wgsource` lays it out (WG_CHANNELS_LAST)
    shift: bool = False  # channels-last conv-shaped stages: a slice's rows serve the last axis's offsets (WG_SHIFT)

    @property
    def threads(self) -> int:
        return 2 * self.cells


WgmmaChooser = Callable[..., "WgmmaTile | None"]  # (GemmShape, Hardware) -> the tile, or None: the GEMM runs


def no_wgmma(shape, hardware) -> None:
    """Every stage keeps its GEMM (the tests of the GEMM paths on a GPU that has wgmma)."""
    return None


def wgmma_reaches(hardware, phases: int, m: int, source_c: int) -> bool:
    """Whether the `_wgmma` kernels take a stage of `m` dst and `source_c` source channels (a group's) in `phases`
    stride phases, in a TF32 mode: a GPU with wgmma, no phases (the gather form's phases keep the GEMM), and enough
    channels for wgmma's N and its slices (choose_wgmma; direct_model leaves these stages to it)."""
    return hardware.wgmma and phases == 1 and m >= WGMMA_MIN_DST_C and source_c >= WGMMA_MIN_SOURCE_C


def choose_wgmma(shape, hardware, channels_last_min_uses: int = WGMMA_16BIT_CHANNELS_LAST_MIN_USES,
                 shift: bool = True, weight_shift: bool = WGMMA_SHIFT_WEIGHT_BY_DEFAULT) -> WgmmaTile | None:
    """The `_wgmma` tile of a GEMM stage, or None where the stage keeps its GEMM: not a TF32 mode on float32 or
    16-bit elements (planned on float32 shapes: their own m16n8k16 mode runs as TF32 on wgmma, exact for them; the
    kernels widen them as they stage them), a GPU without wgmma, stride phases (the gather form's phases take the
    GEMM), or few channels. The tests move the channels-last rule (`channels_last_min_uses`), turn WG_SHIFT off
    (`shift`) and the 16-bit weight gradient's alone (`weight_shift`; it needs `shift`)."""
    if not (shape.mma in WGMMA_MAX_N and shape.element_bytes == 4
            and wgmma_reaches(hardware, shape.phases, shape.m, shape.source_c)):
        return None
    n = min(next((n for n in WG_NS if n >= shape.m), WG_NS[-1]), WGMMA_MAX_N[shape.mma])
    stages = WGMMA_STAGES if shape.pipelined else WGMMA_16BIT_STAGES
    k = 2 * WG_BK if not shape.pipelined and n <= WGMMA_16BIT_WIDE_MAX_N else WG_BK
    # 16-bit elements (planned with `pipelined` off): an image's channels-last source is indexed in 32 bits
    staged_fits = wgmma_staged_source_floats(1, shape.groups, shape.source_cells, shape.source_c) * 2 < U32_LIMIT
    if shape.conv:
        uses = shape.k_size * shape.m  # products a source element feeds
        channels_last = not shape.pipelined and staged_fits and uses >= channels_last_min_uses
        # 16-bit elements (planned with `pipelined` off), gathered, hold a slice's loads in registers. Multiplied as
        # themselves (k16), at an N of 128 they take 122-128 a thread uncapped at ranks 1 and 2, two blocks an SM
        # anyway, where the cap of 128 only made ptxas shuffle registers (2-D forward: 251 loop instructions a slice
        # capped, 154 not), and 130-148 at ranks 3-8: capped for two there, none spilled (ptxas, sm_90a: ranks 1-8, both
        # families, 32 and 128 channels). N 256's accumulators alone take 128.
        two = not shape.pipelined and n <= 128 and not (n == 128 and shape.rank <= WGMMA_16BIT_UNCAPPED_MAX_RANK)
        # 3xTF32 up to an N of 64 where tiles span images took 116-154 registers at rank 2 (the forward's 154, 120
        # cut image by image): capped, so that two blocks an SM stay (no spills, ranks 1-8, ptxas sm_90a).
        two = two or shape.mma == 3 and n <= 64 and tiles_span_images(shape, WGMMA_CELLS)
        tile = WgmmaTile(n, WGMMA_CELLS, stages, min_blocks=2 if two else 1, k=k, channels_last=channels_last)
        if (shift and not shape.pipelined and staged_fits
                and uses >= min(channels_last_min_uses, WGMMA_16BIT_SHIFTED_MIN_USES)
                and shape.m <= WGMMA_SHIFT_MAX_M and 0 < shape.shift_rows <= WGMMA_CELLS
                and (shifted := _shifted_tile(shape, n, stages))
                and shape.images * wgmma_positions(shape, shifted) < U32_LIMIT):
            tile = shifted
    else:
        if not (shape.pipelined or staged_fits):
            return None  # 16-bit: the weight gradient reads U channels-last
        if shift and weight_shift and not shape.pipelined and (shifted := _shifted_weight_tile(shape, n, hardware)):
            return shifted
        blocks = shape.groups * _weight_row_blocks(shape, WGMMA_CELLS) * -(-shape.m // n)
        slices = shape.images * -(-shape.reduction // k)
        # Two blocks an SM: twice the warps to hide latency, in 128 registers a thread and three stages' shared memory
        # twice over (ptxas, sm_90a). 3xTF32 up to 64 channels and rank 7 (2-D: 154 uncapped, capped none spilled in
        # the main loop; rank 8 spills). TF32 at an N of 128 at ranks 2 and 3: N8 128->128 took 130 in float32 and
        # 156 in 16 bits, one block an SM for a split planned for two; capped, 0-36 bytes spill there (both
        # families), where ranks 1 and 4-8 spill up to 588 (at an N of 32 the 2-D transpose reloads 136 bytes).
        two = (shape.mma == 3 and n <= 64 and shape.rank <= WGMMA_TWO_BLOCK_MAX_RANK
               or shape.mma == 1 and n == 128 and shape.rank in WGMMA_TF32_TWO_BLOCK_RANKS)
        min_blocks = 2 if two else 1
        per_sm = max(WGMMA_WEIGHT_BLOCKS_PER_SM[shape.mma], min_blocks)
        split = max(1, min(per_sm * hardware.sm_count // blocks, slices // WGMMA_WEIGHT_MIN_SLICES))
        tile = WgmmaTile(n, WGMMA_CELLS, stages, split, min_blocks, k, channels_last=not shape.pipelined)
    return tile if wgmma_block_shared_bytes(shape, tile) <= hardware.shared_optin_per_block else None


def _shifted_tile(shape, n: int, stages: int) -> WgmmaTile | None:
    """A conv-shaped 16-bit stage's shifted tile: N blocks of up to 64, two blocks an SM (an N of 64's accumulators
    take 32 registers a thread), `stages` slices in shared memory or, where they would pass the 97 KB measured right,
    one fewer (B's rows grow with the last axis's offsets: k5 over 64 channels takes 117 KB in four, 88 KB in three);
    None where neither fits. On the H200, conv1d 64->64 k5 channels-last took 1.16x / 0.99x the gather's time
    (forward / input gradient) shifted in three stages, 1.25x / 1.30x unshifted in four (benchmarks/NOTES.md,
    twenty-eighth session): the gather stays by rule there (320 products a source element), and a stage channels-last
    by rule shifts in three."""
    for count in (stages, stages - 1):
        tile = WgmmaTile(min(n, WGMMA_SHIFT_MAX_N), WGMMA_CELLS, count, min_blocks=2, k=WG_BK, channels_last=True,
                         shift=True)
        if wgmma_block_shared_bytes(replace(shape, mma=HALF_MMA_MODE), tile) <= WGMMA_16BIT_MAX_SHARED:
            return tile
    return None


def _shifted_weight_tile(shape, n: int, hardware) -> WgmmaTile | None:
    """The 16-bit weight gradient's shifted tile (WG_SHIFT), or None: a slice is WG_K of D's cells along one line of
    its last axis, read from D itself (16-byte copies: lines of whole 8-cell chunks), against U's cells of the slice
    and the (K - 1) D after them, staged once for the last axis's K offsets, whose sums are K accumulator sets. Both
    warpgroups of a block take the same 64 rows of dW (U channels at the other axes' window offsets) and half of its
    WG_N D channels each. Slices of 32 cells where slices of 64 would hold more zeros (lines of 32), or where four
    stages of 64 would pass WGMMA_16BIT_MAX_SHARED."""
    if not (shape.shift_rows and shape.last_extent % 8 == 0 and n >= WGMMA_SHIFT_WEIGHT_MIN_N
            and shape.last_window * n // 4 <= WGMMA_SHIFT_WEIGHT_MAX_ACCUMULATORS
            and shape.shift_rows <= WGMMA_SHIFT_WEIGHT_MAX_ROWS):
        return None
    wide = -(-shape.last_extent // (2 * WG_BK)) * 2 <= -(-shape.last_extent // WG_BK)
    min_blocks = 2 if shape.last_window * n // 4 <= 64 else 1
    for k in (2 * WG_BK, WG_BK) if wide else (WG_BK,):
        tile = WgmmaTile(n, WGMMA_CELLS, WGMMA_16BIT_STAGES, min_blocks=min_blocks, k=k, channels_last=True,
                         shift=True)
        if wgmma_block_shared_bytes(replace(shape, mma=HALF_MMA_MODE), tile) > WGMMA_16BIT_MAX_SHARED:
            continue
        blocks = shape.groups * _weight_row_blocks(shape, WGMMA_SHIFT_WEIGHT_ROWS, shape.last_window) * -(-shape.m // n)
        slices = shape.images * shape.reduction // shape.last_extent * -(-shape.last_extent // k)
        per_sm_split = WGMMA_SHIFT_WEIGHT_BLOCKS_PER_SM * hardware.sm_count // blocks
        split = max(1, min(per_sm_split, slices // WGMMA_WEIGHT_MIN_SLICES))
        return replace(tile, split=split)
    return None


def wgmma_block_shared_bytes(shape, tile: WgmmaTile) -> int:
    """Dynamic shared memory of a `_wgmma` block of the stage: the contract's formula for its kernel."""
    if not shape.conv:
        shift_rows = shape.shift_rows if tile.shift else None
        return wgmma_weight_shared_bytes(tile.n, tile.cells, tile.stages, shape.mma, tile.k, shift_rows)
    shift_rows, last_offsets = (shape.shift_rows, shape.last_window) if tile.shift else (0, 1)
    return wgmma_shared_bytes(tile.n, tile.cells, tile.stages, shape.mma, tile.k, shift_rows, last_offsets)


def wgmma_positions(shape, tile: WgmmaTile) -> int:
    """An image's tile cells of a conv-shaped `_wgmma` stage: its dst cells, or with WG_SHIFT their rows along the
    last axis padded by the (K - 1) D cells a window spans past a cell (computed, not stored)."""
    if not tile.shift:
        return shape.n
    return shape.n // shape.last_extent * (shape.last_extent + shape.shift_rows)


def _weight_row_blocks(shape, rows: int, last_offsets: int = 1) -> int:
    """Blocks of `rows` over the weight gradient's rows (window offset, U channel), U's channels rounded up to 32; with
    WG_SHIFT the window offsets of the axes but the last (a row's accumulators hold the last axis's `last_offsets`)."""
    return -(-shape.k_size // last_offsets * -(-shape.source_c // 32) * 32 // rows)


def tiles_span_images(shape, cells: int, positions: int | None = None) -> bool:
    """Whether a conv-shaped `_wgmma` kernel with tiles of `cells` cuts them over the batch's cells as one run
    (images x cells), where an image's cells (`positions` where WG_SHIFT pads them) are not whole tiles: the
    kernel's TILES_SPAN_IMAGES."""
    return (shape.n if positions is None else positions) % cells != 0


def wgmma_grid(shape, tile: WgmmaTile) -> int:
    """Blocks of a `_wgmma` launch: (image, group, n block, cell tile), or (group, n block, tile of the batch's cells)
    where tiles span images; the weight gradient's (group, split, row block, n block)."""
    if not shape.conv:
        rows, last_offsets = (WGMMA_SHIFT_WEIGHT_ROWS, shape.last_window) if tile.shift else (tile.cells, 1)
        return shape.groups * tile.split * _weight_row_blocks(shape, rows, last_offsets) * -(-shape.m // tile.n)
    positions = wgmma_positions(shape, tile)
    if tiles_span_images(shape, tile.cells, positions):
        return shape.groups * -(-shape.m // tile.n) * -(-shape.images * positions // tile.cells)
    return shape.images * shape.groups * -(-shape.m // tile.n) * (positions // tile.cells)


def wgmma_pack_threads(shape, tile: WgmmaTile) -> int:
    """Threads of the stage's `_wgpack` launch: an element of the packed weight each; the weight gradient's, a quad
    of D's packed cells each, written to every plane."""
    elements = wgmma_packed_elements(shape, tile)
    return elements if shape.conv else elements // (wgmma_planes(shape.mma) * 4)


def wgmma_packed_elements(shape, tile: WgmmaTile) -> int:
    """Elements of the stage's packed weight (its `_wgpack` output): planes x groups x n blocks x slices x N x the
    slice's k (blocks of WG_BK source channels at one window offset, one or two a slice); the weight gradient's packed
    D: planes x images x groups x D's channels and cells rounded up to N and the slice's k."""
    if not shape.conv:
        cells = -(-shape.reduction // tile.k) * tile.k
        return wgmma_planes(shape.mma) * shape.images * shape.groups * -(-shape.m // tile.n) * tile.n * cells
    blocks = -(-shape.source_c // WG_BK) * shape.k_size  # WG_BK source channels at one window offset each
    slices = -(-blocks // (tile.k // WG_BK))
    return wgmma_planes(shape.mma) * shape.groups * -(-shape.m // tile.n) * slices * tile.n * tile.k


def wgmma_source_threads(shape) -> int:
    """Threads of a 16-bit stage's `_wgsource` launch: a warp per 64 cells and block of WG_BK channels of its source
    (the weight gradient's U), its cells and channels rounded up to them."""
    return shape.images * shape.groups * -(-shape.source_c // WG_BK) * -(-shape.source_cells // 64) * 32


def wgmma_source_floats(shape) -> int:
    """The size in floats of a 16-bit stage's channels-last source (its `_wgsource` output)."""
    return wgmma_staged_source_floats(shape.images, shape.groups, shape.source_cells, shape.source_c)


def wgmma_pack_copies(shape, tile: WgmmaTile) -> bool:
    """Whether the stage's `_wgpack` only copies its input: the 16-bit weight gradient's D where its channels are
    whole N blocks and its cells whole slices, whose P[image][group][D_ROWS][D_COLUMNS] is then D's own layout, or
    where it is shifted (WG_SHIFT: its kernel reads D's rows itself)."""
    return (not shape.conv and shape.mma == HALF_MMA_MODE
            and (tile.shift or shape.m % tile.n == 0 and shape.reduction % tile.k == 0))


def wgmma_packed_floats(shape, tile: WgmmaTile) -> int:
    """The packed operand's size in floats, which its scratch buffer is allocated in (16-bit elements: two a float;
    their counts are multiples of WG_BK)."""
    return wgmma_packed_elements(shape, tile) * wgmma_operand_bytes(shape.mma) // 4
