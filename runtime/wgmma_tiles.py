"""Tiles of the `_wgmma` kernels: the conv-shaped stages in the TF32 modes on Hopper's warpgroup tensor cores
(templates/cuda/_wgmma_conv.cu.j2), by rule from a prototype sweep on the H200 (benchmarks/NOTES.md, thirteenth
session). Pure Python; the shape is a tile_model.GemmShape (m: dst channels of a group, n: dst cells, source_c:
source channels of a group), the hardware a tile_model.Hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from convgen.generated.contract import WG_BK, WG_NS, wgmma_planes, wgmma_shared_bytes

# Two warpgroups a block, 64 dst cells each: on N8 128->128 128² one warpgroup of 128 cells (two m64 tiles a
# warp) ran 3% slower, two of 128 cells each 10% slower.
WGMMA_CELLS = 128
WGMMA_STAGES = 3  # slices in shared memory, two in flight: four ran 32% slower in TF32 on N8 128->128, 3xTF32 the same
# The widest N per mode: 3xTF32 keeps a slice's sums apart from the total, twice the accumulator registers.
WGMMA_MAX_N = {1: 256, 3: 128}
# Below these the GEMM's tiles stay: a block would mostly multiply zeros (wgmma's N and its 32-channel slices).
WGMMA_MIN_DST_C = 32
WGMMA_MIN_SOURCE_C = 16


@dataclass(frozen=True, slots=True)
class WgmmaTile:
    n: int  # dst channels of a block: wgmma's N
    cells: int  # dst cells of a block, 64 a warpgroup
    stages: int  # slices in shared memory, stages - 1 of them in flight

    @property
    def threads(self) -> int:
        return 2 * self.cells


WgmmaChooser = Callable[..., "WgmmaTile | None"]  # (GemmShape, Hardware) -> the tile, or None: the GEMM runs


def no_wgmma(shape, hardware) -> None:
    """Every stage keeps its GEMM (the tests of the GEMM paths on a GPU that has wgmma)."""
    return None


def choose_wgmma(shape, hardware) -> WgmmaTile | None:
    """The `_wgmma` tile of a conv-shaped stage, or None where the stage keeps its GEMM: not a TF32 mode on
    float32 elements (16-bit ones are planned on float32 shapes that may not take copies: GemmShape.pipelined), a
    GPU without wgmma, stride phases (the gather form's phases take the GEMM), or few channels."""
    if not (hardware.wgmma and shape.conv and shape.mma in WGMMA_MAX_N and shape.element_bytes == 4 and shape.pipelined
            and shape.phases == 1 and shape.m >= WGMMA_MIN_DST_C and shape.source_c >= WGMMA_MIN_SOURCE_C):
        return None
    n = next((n for n in WG_NS if n >= shape.m), WG_NS[-1])
    tile = WgmmaTile(min(n, WGMMA_MAX_N[shape.mma]), WGMMA_CELLS, WGMMA_STAGES)
    if wgmma_shared_bytes(tile.n, tile.cells, tile.stages, shape.mma) > hardware.shared_optin_per_block:
        return None
    return tile


def wgmma_grid(shape, tile: WgmmaTile) -> int:
    """Blocks of a `_wgmma` launch: (image, group, n block, cell tile)."""
    return shape.images * shape.groups * -(-shape.m // tile.n) * -(-shape.n // tile.cells)


def wgmma_packed_elements(shape, tile: WgmmaTile) -> int:
    """Floats of the stage's packed weight (its `_wgpack` output): planes x groups x n blocks x slices x N x WG_BK."""
    slices = -(-shape.source_c // WG_BK) * shape.k_size
    return wgmma_planes(shape.mma) * shape.groups * -(-shape.m // tile.n) * slices * tile.n * WG_BK
