"""Circular padding (SEMANTICS §8, conv) on the CUDA tape, planned without CuPy: the conv runs on an
explicitly wrapped copy of its input. `pad` writes xp (extents in + 2p per axis), the ordinary conv
kernels run on xp with padding 0 (`CircularPlan.padded`, a geometry whose plan and module are the
ordinary ones), and `fold` adds the gradient of xp back onto the cells the copies came from.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from convgen.cuda_launch import BLOCK, ELEMENT_DEFINES, NVRTC_OPTIONS, ceil_div
from convgen.generated.contract import CIRCULAR_KERNELS
from convgen.geometry import Family, Geometry, fits_u32


def padded_geometry(geom: Geometry) -> Geometry:
    """The conv of `geom` on its wrapped input: extents in + 2p, padding 0, everything else kept
    (batch, dilation, groups); its output is that of `geom`."""
    padded = tuple(n + 2 * p for n, p in zip(geom.in_spatial, geom.padding))
    return Geometry.build(geom.family, geom.in_c, geom.out_c, padded, geom.kernel, geom.stride, (0,) * geom.rank,
                          batch=geom.batch, dilation=geom.dilation, groups=geom.groups)


def fits_padded(geom: Geometry) -> bool:
    """The wrapped input stays within the 32-bit indexing that the kernels assume of an input."""
    return fits_u32(padded_geometry(geom).input_shape)


@dataclass(frozen=True, slots=True)
class CircularPlan:
    """How one circular conv runs: the geometry of the ordinary conv on the wrapped input, the
    defines of the pad/fold source and each kernel's blocks (0: nothing to write)."""

    padded: Geometry
    defines: dict[str, int]  # name -> value, in the contract's order
    pad_blocks: int
    fold_blocks: int

    @property
    def options(self) -> tuple[str, ...]:
        """The NVRTC options of the pad/fold source: the fixed ones and the defines."""
        return NVRTC_OPTIONS + tuple(f"-D{name}={value}" for name, value in self.defines.items())


@functools.lru_cache(maxsize=256)
def circular_plan(geom: Geometry, dtype: str = "float32") -> CircularPlan:
    """The plan of a circular conv `geom` (every p <= in, as the validators check) on elements of
    `dtype` (the tape's)."""
    assert geom.family is Family.CONV and geom.circular, geom
    padded = padded_geometry(geom)
    assert padded.out_spatial == geom.out_spatial, (padded, geom)
    defines: dict[str, int] = {"IN_C": geom.in_c, "BLOCK": BLOCK, **ELEMENT_DEFINES[dtype]}
    for axis, (n, p) in enumerate(zip(geom.in_spatial, geom.padding)):
        assert p <= n, geom
        defines.update({f"IN{axis}": n, f"P{axis}": p})
    assert tuple(defines) == CIRCULAR_KERNELS[geom.rank].defines, (tuple(defines), geom)
    channels = geom.images * geom.in_c
    return CircularPlan(padded, defines, ceil_div(channels * math.prod(padded.in_spatial), BLOCK),
                        ceil_div(channels * math.prod(geom.in_spatial), BLOCK))


def representative_circular_geometry(rank: int) -> Geometry:
    """A small circular conv that exercises every path of the pad/fold source: padding of the whole
    extent (three copies per cell) on the first axis, none on the last of rank ≥ 2, one cell between."""
    in_spatial = tuple(4 + axis % 3 for axis in range(rank))
    padding = tuple(n if axis == 0 else 0 if axis == rank - 1 else 1 for axis, n in enumerate(in_spatial))
    return Geometry.build(Family.CONV, 3, 4, in_spatial, (3,) * rank, (1,) * rank, padding, batch=2, circular=True)
