"""Validated geometry of one op call: the families, the output extents of SEMANTICS §2, and the
`Geometry` value that the generated validators build and both backends consume.

Family and MAX_RANK are the generated contract's (generated/contract.py), re-exported here for the
runtime and the generated validators.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from convgen.generated.contract import MAX_RANK, Family

__all__ = ["MAX_RANK", "U32_LIMIT", "Family", "Geometry", "axis_extent", "fits_u32", "window"]

U32_LIMIT = 1 << 32


def window(n: int, k: int, s: int, p: int) -> int:
    """Number of windows of size k, stride s, along an axis of n cells padded by p on each side."""
    if k == 0 or s == 0 or n + 2 * p < k:
        return 0
    return (n + 2 * p - k) // s + 1


def axis_extent(family: Family, n: int, k: int, s: int, p: int) -> int:
    """Output extent along one axis (SEMANTICS §2); invalid geometry gives 0."""
    if family is Family.CONV:
        return window(n, k, s, p)
    if family is Family.CONV_TRANSPOSE:
        if n == 0 or k == 0 or s == 0:
            return 0
        return max((n - 1) * s + k - 2 * p, 0)
    if n == 0 or k == 0 or p > k // 2:
        return 0
    return window(n, k, s, p)


def fits_u32(shape: tuple[int, ...]) -> bool:
    """Every dimension and the element count are below 2**32."""
    return all(n < U32_LIMIT for n in shape) and math.prod(shape) < U32_LIMIT


@dataclass(frozen=True, slots=True)
class Geometry:
    """Everything a backend needs to run one op; built only by the generated validators."""

    family: Family
    in_c: int
    out_c: int
    in_spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    out_spatial: tuple[int, ...]
    beta: float | None = None  # smooth max only, already rounded to float32
    # Derived once per geometry, so the per-call path of the tape only reads them.
    output_shape: tuple[int, ...] = field(init=False, compare=False)
    output_numel: int = field(init=False, compare=False)
    output_fits_u32: bool = field(init=False, compare=False)
    parent_shapes: tuple[tuple[int, ...], ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        output_shape = (self.out_c, *self.out_spatial)
        object.__setattr__(self, "output_shape", output_shape)
        object.__setattr__(self, "output_numel", math.prod(output_shape))
        object.__setattr__(self, "output_fits_u32", fits_u32(self.out_spatial) and fits_u32(output_shape))
        input_shape = (self.in_c, *self.in_spatial)
        parents = (self.kernel_shape, (self.out_c,), input_shape) if self.family.is_conv else (input_shape,)
        object.__setattr__(self, "parent_shapes", parents)

    @classmethod
    def build(cls, family: Family, in_c: int, out_c: int, in_spatial: tuple[int, ...],
              kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
              beta: float | None = None) -> Geometry:
        """The geometry with its output extents; the same arguments give the same (cached) object."""
        return _build(cls, family, in_c, out_c, in_spatial, kernel, stride, padding, beta)

    @property
    def rank(self) -> int:
        return len(self.in_spatial)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_c, *self.in_spatial)

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        """conv: [outC, inC, *K]; conv transpose: [inC, outC, *K] (SEMANTICS §1)."""
        if self.family is Family.CONV_TRANSPOSE:
            return (self.in_c, self.out_c, *self.kernel)
        return (self.out_c, self.in_c, *self.kernel)

    @property
    def bias_shape(self) -> tuple[int, ...]:
        return (self.out_c,)


@functools.lru_cache(maxsize=4096)
def _build(cls: type[Geometry], family: Family, in_c: int, out_c: int, in_spatial: tuple[int, ...],
           kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
           beta: float | None) -> Geometry:
    out = tuple(axis_extent(family, *axis) for axis in zip(in_spatial, kernel, stride, padding))
    return cls(family, in_c, out_c, in_spatial, kernel, stride, padding, out, beta)
