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

__all__ = ["MAX_RANK", "U32_LIMIT", "Family", "Geometry", "axis_extent", "dilated", "fits_u32", "window"]

U32_LIMIT = 1 << 32


def window(n: int, k: int, s: int, p: int) -> int:
    """Number of windows of size k, stride s, along an axis of n cells padded by p on each side."""
    if k == 0 or s == 0 or n + 2 * p < k:
        return 0
    return (n + 2 * p - k) // s + 1


def dilated(k: int, d: int) -> int:
    """The extent a kernel of k cells covers with dilation d: d·(k − 1) + 1 (0 for k = 0)."""
    return d * (k - 1) + 1 if k else 0


def axis_extent(family: Family, n: int, k: int, s: int, p: int, d: int = 1, output_padding: int = 0) -> int:
    """Output extent along one axis (SEMANTICS §2, with §8's dilation and output padding); invalid
    geometry gives 0."""
    span = dilated(k, d)
    if family is Family.CONV:
        return window(n, span, s, p)
    if family is Family.CONV_TRANSPOSE:
        if n == 0 or k == 0 or s == 0:
            return 0
        extent = max((n - 1) * s + span - 2 * p, 0)
        return extent + output_padding if extent else 0
    if n == 0 or k == 0 or p > span // 2:
        return 0
    return window(n, span, s, p)


def fits_u32(shape: tuple[int, ...]) -> bool:
    """Every dimension and the element count of a shape of natural numbers are below 2**32."""
    numel = math.prod(shape)
    # A nonzero count bounds every dimension: look at them only when one is 0 (on every op call, this
    # costs a third of checking each dimension).
    return numel < U32_LIMIT and (numel != 0 or max(shape) < U32_LIMIT)


@dataclass(frozen=True, slots=True)
class Geometry:
    """Everything a backend needs to run one op; built only by the generated validators.

    The §8 fields keep the seed's meaning at their defaults: `batch` None is one image without a
    batch axis, `dilation` all 1, `groups` 1, `circular` False (zero padding), `output_padding` all 0.
    """

    family: Family
    in_c: int
    out_c: int
    in_spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    out_spatial: tuple[int, ...]
    beta: float | None = None  # smooth max only, already rounded to float32
    batch: int | None = None  # None: no batch axis; n: input [n, C, *S], output [n, C', *S']
    dilation: tuple[int, ...] = ()  # one entry per axis, each >= 1
    groups: int = 1  # conv families: channels split into this many independent blocks
    circular: bool = False  # conv: padding reads x[pos mod in] instead of 0
    output_padding: tuple[int, ...] = ()  # conv transpose: added to each output extent
    # Derived once per geometry, so the per-call path of the tape only reads them.
    output_shape: tuple[int, ...] = field(init=False, compare=False)
    output_numel: int = field(init=False, compare=False)
    output_fits_u32: bool = field(init=False, compare=False)
    parent_shapes: tuple[tuple[int, ...], ...] = field(init=False, compare=False)
    parent_numels: tuple[int, ...] = field(init=False, compare=False)  # elements of each parent shape

    def __post_init__(self) -> None:
        images = () if self.batch is None else (self.batch,)
        output_shape = (*images, self.out_c, *self.out_spatial)
        object.__setattr__(self, "output_shape", output_shape)
        object.__setattr__(self, "output_numel", math.prod(output_shape))
        object.__setattr__(self, "output_fits_u32", fits_u32(self.out_spatial) and fits_u32(output_shape))
        input_shape = (*images, self.in_c, *self.in_spatial)
        parents = (self.kernel_shape, (self.out_c,), input_shape) if self.family.is_conv else (input_shape,)
        object.__setattr__(self, "parent_shapes", parents)
        object.__setattr__(self, "parent_numels", tuple(math.prod(shape) for shape in parents))

    @classmethod
    def build(cls, family: Family, in_c: int, out_c: int, in_spatial: tuple[int, ...],
              kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
              beta: float | None = None, *, batch: int | None = None, dilation: tuple[int, ...] | None = None,
              groups: int = 1, circular: bool = False,
              output_padding: tuple[int, ...] | None = None) -> Geometry:
        """The geometry with its output extents; the same arguments give the same (cached) object.
        `dilation` and `output_padding` default to all 1 and all 0."""
        return interned(family, in_c, out_c, tuple(in_spatial), tuple(kernel), tuple(stride), tuple(padding), beta,
                        batch, None if dilation is None else tuple(dilation), groups, circular,
                        None if output_padding is None else tuple(output_padding))

    @property
    def rank(self) -> int:
        return len(self.in_spatial)

    @property
    def images(self) -> int:
        """Images in one call: the batch, or 1 without a batch axis."""
        return 1 if self.batch is None else self.batch

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.parent_shapes[-1]

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        """conv: [out_c, in_c / groups, *K]; conv transpose: [in_c, out_c / groups, *K] (SEMANTICS §1, §8)."""
        if self.family is Family.CONV_TRANSPOSE:
            return (self.in_c, self.out_c // self.groups, *self.kernel)
        return (self.out_c, self.in_c // self.groups, *self.kernel)

    @property
    def bias_shape(self) -> tuple[int, ...]:
        return (self.out_c,)


# The generated validators call `interned` directly: a call per op, and every argument positional so the
# C-level cache hashes one flat key (a Python wrapper or keywords cost about as much as the lookup).
@functools.lru_cache(maxsize=4096)
def interned(family: Family, in_c: int, out_c: int, in_spatial: tuple[int, ...], kernel: tuple[int, ...],
             stride: tuple[int, ...], padding: tuple[int, ...], beta: float | None, batch: int | None,
             dilation: tuple[int, ...] | None, groups: int, circular: bool,
             output_padding: tuple[int, ...] | None) -> Geometry:
    """`Geometry.build` with every argument positional, the sequences tuples already; the same arguments
    give the same object while it stays cached."""
    rank = len(in_spatial)
    dilation = (1,) * rank if dilation is None else dilation
    output_padding = (0,) * rank if output_padding is None else output_padding
    out = tuple(axis_extent(family, *axis)
                for axis in zip(in_spatial, kernel, stride, padding, dilation, output_padding))
    return Geometry(family, in_c, out_c, in_spatial, kernel, stride, padding, out, beta, batch, dilation, groups,
                    circular, output_padding)
