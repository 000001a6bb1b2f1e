"""Launch plans for the generated CUDA: a validated `Geometry` -> the -D defines that specialise a
source at load time, the NVRTC options, and each stage's grid, block and scratch buffer.

Pure Python without CuPy: `convgen compile` uses it to compile every source with no GPU present.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from convgen.geometry import Family, Geometry

BLOCK = 256  # threads per block of the pool, reduce and bias kernels (the sources get it as -DBLOCK)
SM_COUNT = 132  # H200; steers how work is split, never what is computed
SPLIT_WORKSPACE_BYTES = 16 << 20  # at most this much scratch for a split reduction's partial sums
CLOCK_HZ = 1.7e9  # for the cost model below: cycles <-> seconds
SHARED_LIMIT = 48 * 1024  # static shared memory of one block
WEIGHT_BK = 16  # reduction slice of the weight gradient (cells of D)
MAX_BK = 16  # largest source-channel slice of the convolution-shaped stages

# C++17 for constexpr helpers; no fast math, so expf/logf keep full float32 accuracy. CuPy adds
# -arch for the device it compiles on.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)

# The implicit-GEMM stages of the conv families and the prefix of their tile defines.
GEMM_STAGES: dict[str, str] = {"forward": "FWD", "backward_input": "BWI", "backward_weight": "BWW"}


@dataclass(frozen=True, slots=True)
class Launch:
    grid: int  # blocks along x; 0 when the stage has nothing to write
    block: int = BLOCK
    shared_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything geometry-dependent about running one op, computed once per geometry."""

    defines: tuple[str, ...]
    launches: dict[str, Launch]  # stage -> launch
    # GEMM stage -> number of reduction splits; > 1: the stage writes a [split, *output] partial
    # buffer and its `<stage>_reduce` kernel adds it up.
    splits: dict[str, int]
    argmax_dtype: str = "uint32"  # max pool: the saved window offsets (uint8 when K <= 255)


@dataclass(frozen=True, slots=True)
class GemmTile:
    """Tile of one implicit-GEMM stage: block tile bm x bn, slice depth bk, thread tile tm x tn,
    and the number of blocks the reduction's slices are cut into."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    split: int

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)


@dataclass(frozen=True, slots=True)
class GemmShape:
    """C[m, n] = sum over the reduction; `conv` stages reduce over (source channel, window offset)
    in slices of bk channels, weight stages over the cells of D in slices of WEIGHT_BK."""

    m: int
    n: int
    conv: bool
    source_c: int  # conv stages: source channels
    k_size: int  # conv stages: window cells
    reduction: int  # weight stages: cells of D
    rank: int
    # Gather-form conv stages with a stride > 1 (conv backward_input, transpose forward) run one
    # GEMM per stride phase: `phases` of them, each over `phase_n` cells (the destination cells
    # rho + S*u of one residue rho per axis, a box of ceil(extent / S) per axis) and k_size window
    # offsets (the mean over the phases, K_SIZE / phases rounded up: each offset serves one phase
    # per axis). phase_n = 0: one phase over all n cells.
    phases: int = 1
    phase_n: int = 0

    @property
    def bk(self) -> int:
        if not self.conv:
            return WEIGHT_BK
        return -(-self.source_c // -(-self.source_c // MAX_BK)) if self.source_c else 1

    @property
    def columns(self) -> int:
        """GEMM columns of one phase."""
        return self.phase_n if self.phases > 1 else self.n

    def grid(self, bm: int, bn: int, split: int) -> int:
        """Blocks of a launch with this tile: (phase, split, row tile, column tile)."""
        return -(-self.m // bm) * -(-self.columns // bn) * split * self.phases

    @property
    def chunks(self) -> int:
        if self.conv:
            return -(-self.source_c // self.bk) * self.k_size
        return -(-self.reduction // WEIGHT_BK)


def _tile_candidates(bk: int, conv: bool) -> list[tuple[int, int, int, int]]:
    """(bm, bn, tm, tn) of 64..256 threads whose shared tiles fit."""
    out = []
    for tm in (1, 2, 4, 8):
        for tn in (4, 8):
            for rows in (1, 2, 4, 8, 16, 32):
                for cols in (2, 4, 8, 16, 32, 64):
                    threads, bm, bn = rows * cols, tm * rows, tn * cols
                    if threads not in (64, 128, 256) or bm > 128 or bn > 256:
                        continue
                    if 2 * bk * (bm + bn + 8) * 4 > SHARED_LIMIT:
                        continue
                    if not conv and threads % bk:
                        continue
                    out.append((bm, bn, tm, tn))
    return out


def _gemm_cost(shape: GemmShape, bm: int, bn: int, tm: int, tn: int, split: int) -> float:
    """Rough cycles of the busiest SM: issued warp instructions over the schedulers' rate, derated
    when few warps share an SM, plus the second pass of a split. Steers choices only."""
    bk, chunks, rank = shape.bk, shape.chunks, shape.rank
    threads = (bm // tm) * (bn // tn)
    per_split = -(-chunks // split) if chunks else 0
    blocks = shape.grid(bm, bn, split) if shape.m and shape.n else 0
    if blocks == 0:
        return 0.0
    a_loads = -(-bm * bk // threads)
    fma = bk * tm * tn
    lds = bk * ((tm // 4 if tm >= 4 else tm) + (tn // 4))
    if shape.conv:
        cols = max(bn // threads, 1)
        b_rows = -(-bk // max(threads // bn, 1))
        b_loads = cols * b_rows
        index = 3 * rank + cols * (6 * rank + 4) + b_loads * 4
        if shape.phases > 1:
            index += 4 * rank  # the phase's slice cursor and window offset
        hoisted = cols * (rank + 1)  # window starts of the thread's columns
    else:
        b_loads = -(-bn // (threads // bk))
        index = 4 * rank + b_loads * (4 * rank + 4)
        hoisted = b_loads * (rank + 2)  # channel and window offset of the thread's columns
    per_slice = fma + lds + 5 * a_loads + index + 2 * b_loads + 20
    registers = tm * tn + 2 * (a_loads + b_loads) + hoisted + 40 + (tm + tn)
    if registers > 255:
        return math.inf
    resident = max(1, min(2048 // threads, 65536 // (threads * registers), 32,
                          (228 * 1024) // (2 * bk * (bm + bn + 8) * 4 + 1024)))
    busiest = -(-blocks // SM_COUNT)
    warps = min(busiest, resident) * threads / 32
    utilisation = warps / (warps + 6)
    issue = busiest * (threads / 32) * per_slice * per_split / (4 * utilisation)
    # Each slice waits on its global loads and a barrier at least once: ~1000 cycles a round trip
    # on the H200 sweep (benchmarks/tile_sweep.py: 20 slices of 1-D 64->64 4096 took 19.7 us, 5
    # slices split 4 ways 12.9 us), which is why deep unsplit reductions of few blocks lose.
    latency = -(-busiest // resident) * per_split * 1000
    # Launch, ramp-up and tail of one kernel (~6 us back to back on the sweep); the same for every
    # tile, so it moves the estimates, not the choice.
    cost = max(issue, latency) + 10000
    if split > 1:
        moved = 4 * shape.m * shape.n * (split + 1)
        cost += 2000 + moved / 3.0e12 * CLOCK_HZ  # the second kernel, its launch and its buffer
    return cost


@functools.lru_cache(maxsize=4096)
def gemm_tile(shape: GemmShape) -> GemmTile:
    """The cheapest tile and split of `shape` by `_gemm_cost`."""
    best = None
    for bm, bn, tm, tn in _tile_candidates(shape.bk, shape.conv):
        blocks = shape.grid(bm, bn, 1)
        splits = {1}
        if shape.chunks > 1 and blocks < 2 * SM_COUNT:
            for split in range(2, min(shape.chunks, 64) + 1):
                per_split = -(-shape.chunks // split)
                splits.add(-(-shape.chunks // per_split))  # no empty split
        # The partial sums of a split live in device memory: keep them far below an im2col buffer.
        splits = {s for s in splits if s == 1 or s * shape.m * shape.n * 4 <= SPLIT_WORKSPACE_BYTES}
        for split in sorted(splits):
            cost = _gemm_cost(shape, bm, bn, tm, tn, split)
            key = (cost, split, -bm * bn, tm, tn)
            if best is None or key < best[0]:
                best = (key, GemmTile(bm, bn, shape.bk, tm, tn, split))
    assert best is not None
    return best[1]


def gemm_shapes(geom: Geometry) -> dict[str, GemmShape]:
    """The three implicit GEMMs of a conv-family geometry, per stage."""
    in_size, out_size = math.prod(geom.in_spatial), math.prod(geom.out_spatial)
    k_size, rank = math.prod(geom.kernel), len(geom.kernel)
    in_c, out_c = geom.in_c, geom.out_c
    # The weight gradient reduces over the cells of D (g for conv, x for the transpose) against U.
    d_c, u_c, d_size = (out_c, in_c, out_size) if geom.family is Family.CONV else (in_c, out_c, in_size)
    direct_forward = GemmShape(out_c, out_size, True, in_c, k_size, 0, rank)
    direct_backward = GemmShape(in_c, in_size, True, out_c, k_size, 0, rank)
    if geom.family is Family.CONV:
        forward, backward_input = direct_forward, _gather_shape(in_c, geom.in_spatial, out_c, geom)
    else:
        forward, backward_input = _gather_shape(out_c, geom.out_spatial, in_c, geom), direct_backward
    return {
        "forward": forward,
        "backward_input": backward_input,
        "backward_weight": GemmShape(d_c, u_c * k_size, False, 0, 0, d_size, rank),
    }


def _gather_shape(dst_c: int, dst_spatial: tuple[int, ...], src_c: int, geom: Geometry) -> GemmShape:
    """A gather-form stage (destination cell d collects from source (d + P - k) / S where
    divisible), decomposed by stride phase as the template does (gemm_conv_kernel, form gather)."""
    k_size, rank = math.prod(geom.kernel), len(geom.kernel)
    phases = math.prod(geom.stride)
    dst_size = math.prod(dst_spatial)
    if phases == 1:
        return GemmShape(dst_c, dst_size, True, src_c, k_size, 0, rank)
    phase_n = math.prod(-(-d // s) for d, s in zip(dst_spatial, geom.stride))
    return GemmShape(dst_c, dst_size, True, src_c, -(-k_size // phases), 0, rank, phases, phase_n)


def _blocks(threads: int) -> int:
    return -(-threads // BLOCK)


def defines(geom: Geometry) -> tuple[str, ...]:
    """The -D options that specialise a source to `geom` (β is a kernel argument, not a define)."""
    return plan(geom).defines


@functools.lru_cache(maxsize=1024)
def _plan(family: Family, in_c: int, out_c: int, in_spatial: tuple[int, ...], kernel: tuple[int, ...],
          stride: tuple[int, ...], padding: tuple[int, ...]) -> Plan:
    geom = Geometry.build(family, in_c, out_c, in_spatial, kernel, stride, padding)
    values: dict[str, int] = {"IN_C": in_c, "OUT_C": out_c, "BLOCK": BLOCK}
    for axis, axis_values in enumerate(zip(in_spatial, kernel, stride, padding, geom.out_spatial)):
        values.update(zip((f"IN{axis}", f"K{axis}", f"S{axis}", f"P{axis}", f"OUT{axis}"), axis_values))
    if not family.is_conv:
        return _pool_plan(geom, values)

    launches: dict[str, Launch] = {}
    splits: dict[str, int] = {}
    for stage, shape in gemm_shapes(geom).items():
        tile = gemm_tile(shape)
        prefix = GEMM_STAGES[stage]
        values.update({f"{prefix}_BM": tile.bm, f"{prefix}_BN": tile.bn, f"{prefix}_BK": tile.bk,
                       f"{prefix}_TM": tile.tm, f"{prefix}_TN": tile.tn, f"{prefix}_SPLIT": tile.split})
        count = shape.m * shape.n
        launches[stage] = Launch(shape.grid(tile.bm, tile.bn, tile.split) if count else 0, tile.threads)
        vector = 4 if count % 4 == 0 else 1
        launches[f"{stage}_reduce"] = Launch(_blocks(count // vector) if count and tile.split > 1 else 0)
        splits[stage] = tile.split
    launches["backward_bias"] = Launch(out_c)
    return Plan(tuple(f"-D{k}={v}" for k, v in values.items()), launches, splits)


def argmax_dtype(k_size: int) -> str:
    """The narrowest unsigned type that holds every window offset and one spare value (the poison)."""
    return "uint8" if k_size <= 0xFF else "uint16" if k_size <= 0xFFFF else "uint32"


def pool_cells_per_thread(kernel_last: int, stride_last: int) -> int:
    """Consecutive cells along the last axis that one pool thread owns (POOL_V): 4 while the input
    segment they share stays small, so each loaded value serves several windows."""
    for v in (4, 2):
        if (v - 1) * stride_last + kernel_last <= 40:
            return v
    return 1


def _pool_plan(geom: Geometry, values: dict[str, int]) -> Plan:
    k_size = math.prod(geom.kernel)
    dtype = argmax_dtype(k_size)
    v = pool_cells_per_thread(geom.kernel[-1], geom.stride[-1])
    values["POOL_V"] = v
    if geom.family is Family.MAX_POOL:
        values["ARGMAX_BYTES"] = {"uint8": 1, "uint16": 2, "uint32": 4}[dtype]

    def threads(c: int, spatial: tuple[int, ...]) -> int:
        return c * math.prod(spatial[:-1]) * -(-spatial[-1] // v)

    launches = {"forward": Launch(_blocks(threads(geom.out_c, geom.out_spatial))),
                "backward_input": Launch(_blocks(threads(geom.in_c, geom.in_spatial)))}
    return Plan(tuple(f"-D{k}={v}" for k, v in values.items()), launches, {}, dtype)


def plan(geom: Geometry) -> Plan:
    """The launch plan of `geom`, cached per geometry (β plays no part)."""
    return _plan(geom.family, geom.in_c, geom.out_c, geom.in_spatial, geom.kernel, geom.stride, geom.padding)


def representative_geometry(family: Family, rank: int) -> Geometry:
    """A small geometry that exercises every code path of a source: kernel 3 on every axis,
    stride 2 and padding 1 on the even axes, extents 5..7, channels 3 -> 4 (pools: 3)."""
    in_spatial = tuple(5 + axis % 3 for axis in range(rank))
    stride = tuple(2 if axis % 2 == 0 else 1 for axis in range(rank))
    padding = tuple(1 if axis % 2 == 0 else 0 for axis in range(rank))
    out_c = 4 if family.is_conv else 3
    beta = 1.0 if family is Family.SMOOTH_MAX_POOL else None
    return Geometry.build(family, 3, out_c, in_spatial, (3,) * rank, stride, padding, beta)
