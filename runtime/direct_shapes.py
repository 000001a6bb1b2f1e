"""The stencils the small-channel direct kernels see: a conv-family geometry's conv-shaped stages and its weight
gradient, per group (DirectShape), the halo a box of their cells stages and the boxes the tensor-core forms take.
Geometry only: which kernel runs and how its blocks are cut is direct_model's (conv-shaped stages) and
direct_weight_model's (the weight gradient)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from convgen.gemm_shapes import ceil_div
from convgen.geometry import Family, Geometry

MMA_DIRECT_MODE = 1  # DirectShape.mma of a stage whose direct kernel may run on TF32 tensor cores


@dataclass(frozen=True, slots=True, kw_only=True)
class DirectShape:
    """A conv-shaped stage as the direct kernel sees it, per group: a stencil over `cells` per axis (the dst
    cells; in the gather form, the cells u of one of `phases` stride phases, dst cell rho + S*u), each `step`
    source cells after the last, reading at most `taps` window offsets `spacing` apart."""

    cells: tuple[int, ...]
    taps: tuple[int, ...]
    step: tuple[int, ...]
    spacing: tuple[int, ...]
    phases: int
    m: int  # dst channels of a group
    source_c: int  # source channels of a group
    images: int
    groups: int
    staged_bytes: int  # of a value in shared memory: 8 for float64, else 4 (16-bit elements widen)
    # The weight gradient (its own kernel, _direct_weight.cu.j2): `cells` are D's, `m` D's channels, `source_c`
    # U's, and `images` the batch its split is chosen for (the plan's bucket: the split is a define).
    weight: bool = False
    # A stage of float32 elements in the precision "medium": the direct kernel may multiply on TF32 tensor cores
    # (MMA_DIRECT_MODE), else 0 (FMAs).
    mma: int = 0
    # 16-bit elements (bfloat16, float16), which a wgmma that reaches the stage multiplies as themselves, at twice
    # TF32's rate: the weight gradient then leaves the direct kernel's tensor cores to it (direct_model.choose_direct).
    half: bool = False

    @property
    def window(self) -> int:
        """Window offsets a cell reads at most (in the gather form, its phase's)."""
        return math.prod(self.taps)


def direct_shapes(geom: Geometry, staged_bytes: int, mma: int = 0) -> dict[str, DirectShape]:
    """The conv-shaped stages of a conv-family geometry: forward and backward_input, one of them of the direct
    form (conv's forward, the transpose's backward_input), the other of the gather form (dst cell d = j*S + k*D
    - P collects from source cell j), which runs per stride phase: per axis ceil(dst / S) cells u, at most
    ceil(K / SG) taps DG apart (SG = S / gcd(S, D), DG = D / gcd(S, D); _phases.cu.j2). `mma`: DirectShape.mma."""
    in_c, out_c = geom.in_c // geom.groups, geom.out_c // geom.groups
    common = {"images": geom.images, "groups": geom.groups, "staged_bytes": staged_bytes, "mma": mma}
    gcds = [math.gcd(s, d) for s, d in zip(geom.stride, geom.dilation)]

    def direct_form(dst_spatial: tuple[int, ...], m: int, source_c: int) -> DirectShape:
        return DirectShape(cells=dst_spatial, taps=geom.kernel, step=geom.stride, spacing=geom.dilation, phases=1,
                           m=m, source_c=source_c, **common)

    def gather_form(dst_spatial: tuple[int, ...], m: int, source_c: int) -> DirectShape:
        return DirectShape(cells=tuple(ceil_div(e, s) for e, s in zip(dst_spatial, geom.stride)),
                           taps=tuple(ceil_div(k, s // g) for k, s, g in zip(geom.kernel, geom.stride, gcds)),
                           step=(1,) * geom.rank, spacing=tuple(d // g for d, g in zip(geom.dilation, gcds)),
                           phases=math.prod(geom.stride), m=m, source_c=source_c, **common)

    if geom.family is Family.CONV:
        return {"forward": direct_form(geom.out_spatial, out_c, in_c),
                "backward_input": gather_form(geom.in_spatial, in_c, out_c)}
    return {"forward": gather_form(geom.out_spatial, out_c, in_c),
            "backward_input": direct_form(geom.in_spatial, in_c, out_c)}


def halo(box: tuple[int, ...], shape: DirectShape, slices: int = 1) -> int:
    """Source cells a block stages per channel and step: its box's windows, per axis (box - 1) * step + (taps - 1) *
    spacing + 1, of the first axis's taps those of one of `slices` equal slices."""
    taps = (shape.taps[0] // slices, *shape.taps[1:])
    return math.prod((b - 1) * s + (t - 1) * d + 1 for b, s, t, d in zip(box, shape.step, taps, shape.spacing))


def weight_shape(geom: Geometry, staged_bytes: int, mma: int = 0, half: bool = False) -> DirectShape:
    """The weight-gradient stage of a conv-family geometry as the direct weight kernel sees it, per group: dW[m, c,
    k] sums D[m, p] * U[c, p*S + k*D - P] over D's cells p (conv: D the output gradient, U the input; transpose:
    D the input, U the output gradient); `geom.images` should be the plan's bucket of the batch. `mma` and `half`:
    DirectShape's."""
    in_c, out_c = geom.in_c // geom.groups, geom.out_c // geom.groups
    conv = geom.family is Family.CONV
    return DirectShape(cells=geom.out_spatial if conv else geom.in_spatial, taps=geom.kernel, step=geom.stride,
                       spacing=geom.dilation, phases=1, m=out_c if conv else in_c, source_c=in_c if conv else out_c,
                       images=geom.images, groups=geom.groups, staged_bytes=staged_bytes, weight=True, mma=mma,
                       half=half)


def mma_box(dst_spatial: tuple[int, ...], cells: int) -> tuple[int, ...]:
    """A tensor-core direct block's box of at most `cells` cells (more where the last axis alone has more): the last
    axis whole up to `cells` (else `cells` of it), then the other axes doubled in turn from the innermost out while
    the box stays within `cells`, none past its extent rounded up to a power of two."""
    *outer, last = dst_spatial
    box = [1] * len(outer) + [min(last, cells)]
    grown = True
    while grown:
        grown = False
        for a in reversed(range(len(outer))):
            if box[a] < outer[a] and 2 * math.prod(box) <= cells:
                box[a], grown = box[a] * 2, True
    return tuple(box)


def boxes_within(sizes: list[tuple[int, ...]], budget: int) -> Iterator[tuple[int, ...]]:
    """Every box of one of `sizes[a]` (ascending) along each axis a with at most `budget` cells, in lexicographic
    order: a size too large for what the axes before it leave ends that axis's loop."""
    if not sizes:
        yield ()
        return
    for size in sizes[0]:
        if size > budget:
            break
        for rest in boxes_within(sizes[1:], budget // size):
            yield (size, *rest)


def outer_boxes(base: tuple[int, ...], cells: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """The boxes a fitted box is chosen from: at most as many cells as `base` (mma_box's), the same last axis, each
    outer axis a power of two below its extent in `cells` or the whole extent. mma_box doubles axes and fits extents
    that are powers of two; on others its last box along an axis is partly empty."""
    sizes = [(*(1 << i for i in range(extent.bit_length()) if 1 << i < extent), extent) for extent in cells[:-1]]
    return ((*box, base[-1]) for box in boxes_within(sizes, math.prod(base) // base[-1]))
