"""The tile model of the implicit-GEMM stages: the hardware a plan is made for, the candidate tiles of a stage's
GEMM shape (convgen.gemm_shapes), a cost estimate in cycles and the default chooser.

The cost model steers which tile runs, never what is computed. Its fitted constants, each with the H200
sweep it came from, are in convgen.tile_calibration; benchmarks/model_check.py compares the model's picks
with a sweep's measured files without a GPU.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from convgen.gemm_shapes import MMA_K, GemmShape, ceil_div, mma_k
from convgen.generated.contract import COLUMN_POINTER_ROW_STEP, SHARED_BUFFERS, gemm_shared_bytes
from convgen.pipeline_tiles import fma_pipeline_stages, pipeline_block
from convgen.tile_calibration import (
    BASE_REGISTERS,
    FMA_REFERENCE_TILE,
    HALF_ISSUE_WARPS,
    HOST_LAUNCH_CYCLES,
    ILP_CREDIT_WAVES,
    ISSUE_PER_CYCLE,
    KERNEL_CYCLES,
    MMA_FITTED_ACCUMULATORS,
    MMA_ISSUE_SLOTS,
    PACK_ANY_TILE_MACS,
    PACK_MIN_MACS,
    PACK_MIN_MACS_DIRECT,
    ROUND_INSTRUCTIONS,
    SLICE_LATENCY_CYCLES,
    SLICE_OVERHEAD,
    SPLIT_BANDWIDTH_SHARE,
    SPLIT_INSTRUCTIONS,
    SPLIT_KERNEL_CYCLES,
    WEIGHT_DEBIT_EXPONENT,
    WIDE_SLICE_HALF_WARPS,
    WIDE_SLICE_MAX_REGISTERS,
    WIDE_SLICE_MIN_ACCUMULATORS,
    WIDE_SLICE_MIN_RANK,
)


@dataclass(frozen=True, slots=True)
class Hardware:
    """What a plan needs to know of the GPU. cuda.py reads it from the device; H200 stands in for
    `convgen compile` and for plans made without a device."""

    sm_count: int
    shared_per_block: int  # bytes of static shared memory one block may declare
    shared_optin_per_block: int  # bytes of shared memory one block may have when its kernel opts in (dynamic)
    shared_per_sm: int  # bytes of shared memory of one SM
    shared_reserved_per_block: int  # bytes the driver keeps per resident block
    registers_per_sm: int
    registers_per_thread: int  # the most one thread may use
    threads_per_sm: int
    blocks_per_sm: int
    clock_hz: float  # SM clock under sustained load: cycles <-> seconds
    memory_bandwidth: float  # bytes/s a streaming kernel reaches
    wgmma: bool = False  # warpgroup mma (sm_90a: compute capability 9.0), which the `_wgmma` kernels use


# NVIDIA H200 SXM (sm_90). The clock is what it sustained under the sweep's load (the boost clock
# is 1.98 GHz); the bandwidth is the measured stream rate (benchmarks/suite/cases.py), not the
# 4.8 TB/s of the data sheet.
H200 = Hardware(sm_count=132, shared_per_block=48 * 1024, shared_optin_per_block=227 * 1024, shared_per_sm=228 * 1024,
                shared_reserved_per_block=1024,
                registers_per_sm=65536, registers_per_thread=255, threads_per_sm=2048, blocks_per_sm=32,
                clock_hz=1.7e9, memory_bandwidth=4.07e12, wgmma=True)

SPLIT_WORKSPACE_BYTES = 16 << 20  # at most this much scratch for a split reduction's partial sums
MAX_SPLIT = 64  # most blocks one reduction is cut into
SPLIT_BELOW_WAVES = 2  # split only stages of fewer blocks than this many waves of the SMs
BLOCK_THREADS = (64, 128, 256)  # the thread counts a GEMM block may have
MAX_BM, MAX_BN = 128, 256


@dataclass(frozen=True, slots=True)
class GemmTile:
    """Tile of one implicit-GEMM stage: block tile bm x bn, slice depth bk, thread tile tm x tn,
    the number of blocks the reduction's slices are cut into, (conv-shaped stages) whether A is
    read from the weight repacked by the stage's `_pack` kernel, the blocks per SM that the
    kernel's registers are fitted to, and the slices it keeps in shared memory (pipeline_tiles)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    split: int
    packed: bool = False
    min_blocks: int = 1  # blocks per SM the registers are fitted to (the MIN_BLOCKS define)
    stages: int = SHARED_BUFFERS  # slices in shared memory; more than SHARED_BUFFERS: a cp.async pipeline

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)


def mma_tile_fits(bm: int, bn: int, bk: int, tm: int, tn: int, k_step: int = MMA_K) -> bool:
    """Whether a block tile runs on the tensor cores (gemm_tile.cuh, tile_owner): each warp an 8tm x 4tn
    warp tile of whole 16 x 8 mma tiles (tm, tn even), the warp tiles filling the block tile, and
    slices of whole k steps."""
    return tm % 2 == 0 and tn % 2 == 0 and bm % (8 * tm) == 0 and bn % (4 * tn) == 0 and bk % k_step == 0


def _block_tiles(bk: int, conv: bool, staged_bytes: int, mma: int,
                 shared_bytes: int) -> list[tuple[int, int, int, int]]:
    """(bm, bn, tm, tn) of the allowed thread counts whose shared tiles fit in `shared_bytes` (and, for the
    tensor cores, that mma_tile_fits)."""
    out = []
    for tm in (1, 2, 4, 8):
        for tn in (4, 8):
            for rows in (1, 2, 4, 8, 16, 32):
                for cols in (2, 4, 8, 16, 32, 64):
                    threads, bm, bn = rows * cols, tm * rows, tn * cols
                    if threads not in BLOCK_THREADS or bm > MAX_BM or bn > MAX_BN:
                        continue
                    if mma and not mma_tile_fits(bm, bn, bk, tm, tn, mma_k(mma)):
                        continue
                    if gemm_shared_bytes(bm, bn, bk, staged_bytes) > shared_bytes:
                        continue
                    if not conv and threads % bk:  # the weight kernel's B rows per thread
                        continue
                    out.append((bm, bn, tm, tn))
    return out


def whole_parts(chunks: int, split: int) -> int:
    """How many parts a reduction of `chunks` slices is cut into when `split` are asked for: every part the
    same whole number of slices (the last may have fewer), none empty; 1 when there are no slices."""
    if chunks == 0:
        return 1
    return ceil_div(chunks, ceil_div(chunks, max(1, min(split, chunks))))


def _splits(shape: GemmShape, bm: int, bn: int, bk: int, hardware: Hardware) -> list[int]:
    """The splits worth trying for a block tile of slices `bk` deep: none unless the stage has few blocks;
    no split with an empty part; partial sums within SPLIT_WORKSPACE_BYTES."""
    splits, chunks = {1}, shape.chunks_at(bk)
    if chunks > 1 and shape.grid(bm, bn, 1) < SPLIT_BELOW_WAVES * hardware.sm_count:
        for split in range(2, min(chunks, MAX_SPLIT) + 1):
            splits.add(whole_parts(chunks, split))
    partial_bytes = shape.outputs * shape.count * shape.element_bytes
    return sorted(s for s in splits if s == 1 or s * partial_bytes <= SPLIT_WORKSPACE_BYTES)


def fitted_blocks(shape: GemmShape, bm: int, bn: int, tm: int, tn: int) -> int:
    """The blocks per SM a tile's registers are fitted to: two for conv-shaped tensor-core stages of at
    most MMA_FITTED_ACCUMULATORS accumulators a thread, else one (no __launch_bounds__)."""
    if not shape.mma or not shape.conv or (2 if shape.mma == 3 else 1) * tm * tn > MMA_FITTED_ACCUMULATORS:
        return 1
    # 3xTF32's fragments (big and small) leave no room for B-heavy staging: bm < bn spilled at 128.
    return 2 if shape.mma != 3 or bm >= bn else 1


def tile_candidates(shape: GemmShape, hardware: Hardware) -> list[GemmTile]:
    """Every candidate block tile of `shape`, at each of its slice depths where they pay, with every allowed
    split."""
    # Past the 48 KB of static shared memory, the wide slices alone were timed (128x128 at 32 channels: 69 KB).
    shared = {bk: hardware.shared_per_block if bk == shape.bk else hardware.shared_optin_per_block
              for bk in shape.slice_depths}
    return [GemmTile(bm, bn, bk, tm, tn, split, min_blocks=fitted_blocks(shape, bm, bn, tm, tn))
            for bk in shape.slice_depths
            for bm, bn, tm, tn in _block_tiles(bk, shape.conv, shape.staged_bytes, shape.mma, shared[bk])
            if bk == shape.bk or wide_slices_pay(shape, bm, bn, tm, tn, hardware)
            for split in _splits(shape, bm, bn, bk, hardware)]


def wide_slices_pay(shape: GemmShape, bm: int, bn: int, tm: int, tn: int, hardware: Hardware) -> bool:
    """Whether a block tile may take the stage's wide slices (GemmShape.slice_depths): where they were measured
    to pay, t8x8 thread tiles of conv-shaped stages of rank 2 and up with at least ILP_CREDIT_WAVES waves of
    blocks (WIDE_SLICE_*)."""
    return (shape.rank >= WIDE_SLICE_MIN_RANK and tm * tn >= WIDE_SLICE_MIN_ACCUMULATORS
            and shape.grid(bm, bn, 1) >= ILP_CREDIT_WAVES * hardware.sm_count)


def gemm_cost(shape: GemmShape, tile: GemmTile, hardware: Hardware) -> float:
    """Rough cycles of the busiest SM: issued warp instructions over the schedulers' rate, derated
    when few warps share an SM, plus the second pass of a split. Steers choices only."""
    bm, bn, tm, tn, split = tile.bm, tile.bn, tile.tm, tile.tn, tile.split
    bk, chunks, rank = tile.bk, shape.chunks_at(tile.bk), shape.rank
    threads = tile.threads
    per_split = ceil_div(chunks, split) if chunks else 0
    blocks = shape.grid(bm, bn, split) if shape.m and shape.n else 0
    if blocks == 0:
        return 0.0
    a_loads = ceil_div(bm * bk, threads)
    words = shape.words
    if shape.mma:
        # Per warp and slice: the mma.sync instructions (3xTF32 three per tile), the scalar fragment
        # reads (4 A words per 16 rows, 2 B words per 8 columns, per k step) and 3xTF32's splits of them
        # (TF32 rounds its staged values instead: below, with the staging).
        steps, copies = bk // mma_k(shape.mma), 2 if shape.mma == 3 else 1
        fragments = steps * (2 * tm + tn)
        fma = steps * (tm // 2) * (tn // 2) * (3 if shape.mma == 3 else 1) * MMA_ISSUE_SLOTS
        if shape.mma == 3:
            fma += fragments * SPLIT_INSTRUCTIONS
        lds = fragments
        # Accumulators (3xTF32: and the slice's sum) and the TF32 fragments of every k step of the slice
        # (the unrolled steps' reads are hoisted: at 128x128 t8x8 3xTF32 NVRTC used 255 registers).
        tile_registers = copies * (tm * tn + fragments)
    else:
        fma = bk * tm * tn * words
        lds = bk * ((tm // 4 if tm >= 4 else tm) + (tn // 4)) * words
        tile_registers = words * (tm * tn + tm + tn)
    if shape.conv:
        cols = max(bn // threads, 1)
        b_rows = ceil_div(bk, max(threads // bn, 1))
        b_loads = cols * b_rows
        index = 3 * rank + cols * (6 * rank + 4) + b_loads * 4
        if shape.phases > 1:
            index += 4 * rank  # the phase's slice cursor and window offset
        hoisted = cols * (rank + 1)  # window starts of the thread's columns
    else:
        b_loads = ceil_div(bn, threads // bk)
        index = 4 * rank + b_loads * (4 * rank + 4)
        hoisted = b_loads * (rank + 2)  # channel and window offset of the thread's columns
    if shape.mma == 1:
        fma += ROUND_INSTRUCTIONS * (a_loads + b_loads)
    per_slice = fma + lds + 5 * a_loads + index + 2 * b_loads + SLICE_OVERHEAD
    # Accumulators, fragments and staged values hold elements (`words` registers each); a staged
    # value takes one register more (its index or predicate), except an FMA conv stage's B rows read from
    # one pointer per column (contract COLUMN_POINTER_ROW_STEP; the tensor-core tiles' fit was measured
    # with the extra one).
    b_extra = 0 if shape.conv and not shape.mma and threads // bn <= COLUMN_POINTER_ROW_STEP else b_loads
    registers = tile_registers + (words + 1) * a_loads + words * b_loads + b_extra + hoisted + BASE_REGISTERS
    if registers > hardware.registers_per_thread or (bk > shape.bk and registers > WIDE_SLICE_MAX_REGISTERS):
        return math.inf
    shared = gemm_shared_bytes(bm, bn, bk, shape.staged_bytes) + hardware.shared_reserved_per_block
    resident = max(1, min(hardware.threads_per_sm // threads, hardware.registers_per_sm // (threads * registers),
                          hardware.blocks_per_sm, hardware.shared_per_sm // shared))
    busiest = ceil_div(blocks, hardware.sm_count)
    # In conv-shaped FMA stages of many waves, warps also hide latency with their thread tile's independent
    # multiply-adds: a warp of t8x8 keeps the pipe as busy as two of t4x8, one of t4x4 half as busy
    # (ILP_CREDIT_WAVES).
    ilp_credit = shape.conv and not shape.mma and shape.grid(bm, bn, 1) >= ILP_CREDIT_WAVES * hardware.sm_count
    ilp = FMA_REFERENCE_TILE / (tm * tn)
    if ilp_credit:
        half_warps = HALF_ISSUE_WARPS * ilp
    elif not shape.conv and not shape.mma:  # the weight gradient (WEIGHT_DEBIT_EXPONENT)
        half_warps = HALF_ISSUE_WARPS * (ilp if ilp <= 1 else ilp**WEIGHT_DEBIT_EXPONENT)
    else:
        half_warps = HALF_ISSUE_WARPS
    if bk > shape.bk:  # wide slices (wide_slices_pay)
        half_warps *= WIDE_SLICE_HALF_WARPS
    # The busiest SM runs its blocks in rounds of `resident`. The weight gradient's last, partial round has fewer
    # warps to hide latency with (conv2d N32 64->64 56², 64x64 t4x4 at 2 blocks an SM: split 44, 396 blocks in two
    # rounds, 326 µs; split 29, 261 blocks in one, 304); the conv-shaped stages were calibrated on the first
    # round's warps.
    first = min(busiest, resident)  # blocks of the first round
    rounds, tail = divmod(busiest, resident) if not shape.conv else (busiest / first, 0)
    issue = sum(count * _round_issue(blocks_in_round * threads / 32, half_warps, per_slice * per_split)
                for count, blocks_in_round in ((rounds, first), (1, tail)) if count and blocks_in_round)
    latency = ceil_div(busiest, resident) * per_split * SLICE_LATENCY_CYCLES
    cost = max(issue, latency) + KERNEL_CYCLES
    if split > 1:
        moved = shape.element_bytes * shape.outputs * shape.count * (split + 1)  # partial buffer written, read
        seconds = moved / (hardware.memory_bandwidth * SPLIT_BANDWIDTH_SHARE)
        cost += SPLIT_KERNEL_CYCLES + seconds * hardware.clock_hz
    return cost


def _round_issue(warps: float, half_warps: float, per_warp: int) -> float:
    """Cycles of one round of `warps` resident warps each issuing `per_warp` instructions, issue derated by
    how well they hide latency (half the rate at `half_warps`)."""
    return warps * per_warp / (ISSUE_PER_CYCLE * warps / (warps + half_warps))


def packs_weight(shape: GemmShape, tile: GemmTile) -> bool:
    """Whether a stage with `tile` reads its weight repacked (a launch and a weight-sized buffer more):
    see PACK_MIN_MACS."""
    if not shape.conv:
        return False
    macs = shape.outputs * shape.groups * shape.m * shape.n * shape.source_c * shape.k_size
    if macs >= PACK_ANY_TILE_MACS and not shape.mma:
        return True
    if tile.bm < tile.bn:
        return False
    if shape.weight_src_major:
        return macs >= PACK_MIN_MACS
    return macs >= PACK_MIN_MACS_DIRECT and a_quads(shape, tile)


def a_quads(shape: GemmShape, tile: GemmTile) -> bool:
    """Whether a conv-shaped stage reading a repacked weight loads A in 16-byte quads of rows: the
    template's A_VECTOR (rows a multiple of 4, every thread as many quads)."""
    return shape.m % 4 == 0 and tile.bm % 4 == 0 and tile.bm * tile.bk % (4 * tile.threads) == 0


def choose_tile(shape: GemmShape, hardware: Hardware) -> GemmTile:
    """The default chooser: the cheapest candidate by gemm_cost; ties go to fewer splits, then the
    larger block tile, then (FMA) the squarer thread tile, then the smaller one; no split for a stage
    too short to hide a second launch (HOST_LAUNCH_CYCLES); A repacked where packs_weight says so. A stage
    that the cp.async pipeline takes gets its tile (pipeline_block; A repacked, split only where its blocks
    would not fill the SMs once); an fp32 FMA stage keeps its pick, in the pipeline where fma_pipeline_stages
    says so."""
    pipelined = pipeline_block(shape)
    if pipelined is not None:
        bm, bn, bk, tm, tn, stages = pipelined
        splits = _splits(shape, bm, bn, bk, hardware)
        split = next((s for s in splits if shape.grid(bm, bn, s) >= hardware.sm_count), splits[-1])
        return GemmTile(bm, bn, bk, tm, tn, split, packed=True, stages=stages)
    candidates = tile_candidates(shape, hardware)
    # FMA ties go to the squarer thread tile, which reads fewer shared bytes per multiply-add (t2x4: 6
    # words for 8; t1x8: 9, and 30% slower on the 3-channel k7 backward_input).
    squareness = lambda t: 0 if shape.mma else t.tm + t.tn  # noqa: E731
    rank = lambda t: (gemm_cost(shape, t, hardware), t.split, -t.bm * t.bn, squareness(t), t.tm, t.tn, t.bk)  # noqa: E731
    best = min(candidates, key=rank)
    if best.split > 1:
        whole = min((t for t in candidates if t.split == 1), key=rank)
        if gemm_cost(shape, whole, hardware) <= KERNEL_CYCLES + HOST_LAUNCH_CYCLES:
            best = whole
    stages = fma_pipeline_stages(shape, best, hardware) or best.stages
    return dataclasses.replace(best, packed=packs_weight(shape, best), stages=stages)
