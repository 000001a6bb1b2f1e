"""Launch plans for the generated CUDA: a validated `Geometry` -> the -D defines that specialise a
source at load time, the NVRTC options, and each stage's grid, block and scratch buffer.

Pure Python without CuPy: `convgen compile` uses it to compile every source with no GPU present.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from convgen.geometry import Family, Geometry

BLOCK = 256  # threads per block of every kernel (the sources get it as -DBLOCK)
SM_COUNT = 132  # H200; steers how work is split, never what is computed
# Enough threads to keep every SM busy at one image: below it, tiles shrink to add threads.
TARGET_THREADS = SM_COUNT * BLOCK
TARGET_WEIGHT_BLOCKS = 4 * SM_COUNT
MIN_CELLS_PER_THREAD = 8  # a weight-gradient slice is never thinner than this per thread

# C++17 for constexpr helpers; no fast math, so expf/logf keep full float32 accuracy. CuPy adds
# -arch for the device it compiles on.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)


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
    weight_split: int  # slices of the weight gradient (conv families); > 1 needs a partial buffer


def _blocks(threads: int) -> int:
    return -(-threads // BLOCK)


def _channel_tile(channels: int, cells: int) -> int:
    """Output channels per thread: the largest of 8, 4, 2, 1 that divides `channels` and still
    leaves TARGET_THREADS threads (more channels per thread reuse each input load more)."""
    for tile in (8, 4, 2):
        if channels % tile == 0 and cells * channels // tile >= TARGET_THREADS:
            return tile
    return 1


def _weight_tiles(geom: Geometry) -> tuple[int, int, int, int]:
    """(u-channel tile, last-axis offset tile, split, blocks per split) of the weight gradient:
    the reduction runs over the cells of D (g for conv, x for conv transpose) against U."""
    d_c, u_c, d_size = _weight_roles(geom)
    u_tile = next(t for t in (4, 2, 1) if u_c % t == 0)
    k_last = geom.kernel[-1]
    k_tile = min(k_last, 4)
    blocks = d_c * (u_c // u_tile) * (math.prod(geom.kernel) // k_last) * -(-k_last // k_tile)
    split = min(-(-TARGET_WEIGHT_BLOCKS // max(blocks, 1)), d_size // (BLOCK * MIN_CELLS_PER_THREAD))
    return u_tile, k_tile, max(split, 1), blocks


def _weight_roles(geom: Geometry) -> tuple[int, int, int]:
    """(D channels, U channels, D cells per channel)."""
    if geom.family is Family.CONV:
        return geom.out_c, geom.in_c, math.prod(geom.out_spatial)
    return geom.in_c, geom.out_c, math.prod(geom.in_spatial)


def defines(geom: Geometry) -> tuple[str, ...]:
    """The -D options that specialise a source to `geom` (β is a kernel argument, not a define)."""
    return plan(geom).defines


@functools.lru_cache(maxsize=1024)
def _plan(family: Family, in_c: int, out_c: int, in_spatial: tuple[int, ...], kernel: tuple[int, ...],
          stride: tuple[int, ...], padding: tuple[int, ...]) -> Plan:
    geom = Geometry.build(family, in_c, out_c, in_spatial, kernel, stride, padding)
    in_size, out_size = math.prod(geom.in_spatial), math.prod(geom.out_spatial)
    values: dict[str, int] = {"IN_C": in_c, "OUT_C": out_c, "BLOCK": BLOCK}
    for axis, axis_values in enumerate(zip(in_spatial, kernel, stride, padding, geom.out_spatial)):
        values.update(zip((f"IN{axis}", f"K{axis}", f"S{axis}", f"P{axis}", f"OUT{axis}"), axis_values))
    if not family.is_conv:
        launches = {"forward": Launch(_blocks(out_c * out_size)), "backward_input": Launch(_blocks(in_c * in_size))}
        return Plan(tuple(f"-D{k}={v}" for k, v in values.items()), launches, 1)

    forward_tile = _channel_tile(out_c, out_size)
    backward_tile = _channel_tile(in_c, in_size)
    u_tile, k_tile, split, weight_blocks = _weight_tiles(geom)
    values.update(TILE_FORWARD=forward_tile, TILE_BACKWARD_INPUT=backward_tile,
                  WEIGHT_U_TILE=u_tile, WEIGHT_K_TILE=k_tile, WEIGHT_SPLIT=split)
    weight_count = in_c * out_c * math.prod(kernel)
    launches = {
        "forward": Launch(out_c // forward_tile * _blocks(out_size)),
        "backward_input": Launch(in_c // backward_tile * _blocks(in_size)),
        "backward_weight": Launch(weight_blocks * split if weight_count else 0),
        "backward_weight_reduce": Launch(_blocks(weight_count) if split > 1 else 0),
        "backward_bias": Launch(out_c),
    }
    return Plan(tuple(f"-D{k}={v}" for k, v in values.items()), launches, split)


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
