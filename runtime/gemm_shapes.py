"""The implicit GEMMs of a conv-family geometry, one per stage (forward, input gradient, weight gradient): their
extents, reduction, slice depths, stride phases, images and groups, as the kernels run them. The tile model
(convgen.tile_model) chooses a tile for each; the GEMM computed does not depend on the tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from convgen.generated.contract import HALF_MMA_MODE
from convgen.geometry import Family, Geometry

WEIGHT_BK = 16  # reduction slice of the weight gradient (cells of D)
MAX_BK = 16  # largest source-channel slice of the convolution-shaped stages ...
WIDE_BK = 32  # ... and the wider one an FMA float32 stage may also take (dynamic shared memory past 48 KB)
MMA_K = 8  # reduction depth of one mma.sync.m16n8k8 (the TF32 tensor-core k step)
HALF_MMA_K = 16  # ... of one mma.sync.m16n8k16 (the 16-bit one, MMA_MODE 2)


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up, for non-negative a and positive b."""
    return -(-a // b)


def mma_k(mma: int) -> int:
    """The k step of MMA_MODE `mma`'s mma.sync."""
    return HALF_MMA_K if mma == HALF_MMA_MODE else MMA_K



@dataclass(frozen=True, slots=True, kw_only=True)
class GemmShape:
    """C[m, n] = sum over the reduction; `conv` stages reduce over (source channel, window offset)
    in slices of bk channels, weight stages over the cells of D in slices of WEIGHT_BK."""

    m: int
    n: int
    rank: int
    conv: bool
    source_c: int = 0  # conv stages: source channels; the weight stage: U's channels (convgen.wgmma_tiles)
    source_cells: int = 0  # cells of the source (the weight stage: of U), which the 16-bit `_wgmma` reads channels-last
    k_size: int = 0  # window cells
    reduction: int = 0  # weight stages: cells of D
    # Gather-form conv stages with a stride > 1 (conv backward_input, transpose forward) run one
    # GEMM per stride phase: `phases` of them, each over `phase_n` cells (the destination cells
    # rho + S*u of one residue rho per axis, a box of ceil(extent / S) per axis) and k_size window
    # offsets (the mean over the phases, K_SIZE / phases rounded up: each offset serves one phase
    # per axis). phase_n = 0: one phase over all n cells.
    phases: int = 1
    phase_n: int = 0
    # Along the last axis: the window's offsets, the dst cells (the weight stage: D's), and the source cells (U's) a
    # window spans past a cell's first, (K - 1) D, where consecutive dst cells read consecutive source cells (stride
    # 1), else 0: the rows a 16-bit `_wgmma` tile stages past its cells so that they serve every offset of that axis
    # (WG_SHIFT).
    last_window: int = 1
    last_extent: int = 1
    shift_rows: int = 0
    # Images of a batch (SEMANTICS §8): conv stages run one GEMM per image (more blocks, one output
    # each); the weight stage reduces over the cells of every image (more slices).
    images: int = 1
    # Groups (SEMANTICS §8): `groups` block-diagonal GEMMs of this shape (m, n, source_c per group)
    # side by side in one output: groups times the blocks.
    groups: int = 1
    # Conv stages: the weight is read src-major, W[src][dst][k] (the gather-form stages: conv backward_input,
    # transpose forward), not dst-major W[dst][src][k].
    weight_src_major: bool = False
    # Bytes of one element (the ELEMENT_BYTES define): 8 for a float64 tape, whose staged slices take
    # twice the shared memory and whose values twice the registers.
    element_bytes: int = 4
    # The MMA_MODE define (contract PRECISION_MMA_MODES, HALF_MMA_MODE): 0 FMAs; 1 and 3 TF32 and 3xTF32
    # mma.sync, 2 16-bit mma.sync, whose tiles are made of whole mma tiles and k steps (mma_tile_fits,
    # mma_k).
    mma: int = 0
    # Whether the cp.async pipeline may take the stage (pipeline_tiles): not where 16-bit elements are
    # planned (on float32 shapes).
    pipelined: bool = True

    @property
    def words(self) -> int:
        """32-bit registers (and FP32 issue slots: the H200 runs FP64 at half rate) of one element."""
        return self.element_bytes // 4

    @property
    def bk(self) -> int:
        """The usual slice depth: source channels in even slices of at most MAX_BK, or WEIGHT_BK cells."""
        return self._slice_depth(MAX_BK)

    @property
    def slice_depths(self) -> tuple[int, ...]:
        """The slice depths a tile may take: bk and, for float32 FMA conv stages whose channels come in whole
        slices of WIDE_BK, that depth (half the slices and barriers, twice the shared memory; the tensor-core and
        float64 tiles are not measured with them, and 48 channels in slices of 24 ran 16% slower)."""
        wide = self.conv and not self.mma and self.element_bytes == 4 and self._slice_depth(WIDE_BK) == WIDE_BK
        return tuple(sorted({self.bk, WIDE_BK if wide else self.bk}))

    def _slice_depth(self, most: int) -> int:
        if not self.conv:
            return WEIGHT_BK
        bk = ceil_div(self.source_c, ceil_div(self.source_c, most)) if self.source_c else 1
        # The tensor cores take whole k steps: channels past the source's are staged as zeros.
        return ceil_div(bk, mma_k(self.mma)) * mma_k(self.mma) if self.mma else bk

    @property
    def staged_bytes(self) -> int:
        """Bytes of one staged value in shared memory: the 16-bit mma stages the elements as stored."""
        return 2 if self.mma == HALF_MMA_MODE else self.element_bytes

    @property
    def columns(self) -> int:
        """GEMM columns of one phase."""
        return self.phase_n if self.phases > 1 else self.n

    @property
    def outputs(self) -> int:
        """Outputs of M x N the stage writes: one per image for conv stages, one for the weight stage."""
        return self.images if self.conv else 1

    @property
    def count(self) -> int:
        """Elements of one output: the groups' GEMMs side by side."""
        return self.groups * self.m * self.n

    def grid(self, bm: int, bn: int, split: int) -> int:
        """Blocks of a launch with this tile: (image, group, phase, split, row tile, column tile)."""
        return ceil_div(self.m, bm) * ceil_div(self.columns, bn) * split * self.phases * self.groups * self.outputs

    @property
    def chunks(self) -> int:
        """Slices of the reduction at the usual depth bk."""
        return self.chunks_at(self.bk)

    def chunks_at(self, bk: int) -> int:
        """Slices of the reduction (of every image, for the weight stage) at depth `bk`."""
        if self.conv:
            return ceil_div(self.source_c, bk) * self.k_size
        return ceil_div(self.reduction, bk) * self.images


def gemm_shapes(geom: Geometry, element_bytes: int = 4, mma: int = 0) -> dict[str, GemmShape]:
    """The three implicit GEMMs of a conv-family geometry, per stage; with groups, one group's GEMM;
    elements of `element_bytes`, multiplied as the MMA_MODE `mma` says."""
    in_size, out_size = math.prod(geom.in_spatial), math.prod(geom.out_spatial)
    k_size, rank, images, groups = math.prod(geom.kernel), len(geom.kernel), geom.images, geom.groups
    in_c, out_c = geom.in_c // groups, geom.out_c // groups
    # The weight gradient reduces over the cells of D (g for conv, x for the transpose) against U.
    d_c, u_c, d_size, u_size = ((out_c, in_c, out_size, in_size) if geom.family is Family.CONV
                                else (in_c, out_c, in_size, out_size))
    common = {"rank": rank, "images": images, "groups": groups, "element_bytes": element_bytes, "mma": mma}
    # Along the last axis: the direct forms step the source by the stride, the gather forms' one phase by 1.
    reach = (geom.kernel[-1] - 1) * geom.dilation[-1]
    direct_rows = {"last_window": geom.kernel[-1], "shift_rows": reach if geom.stride[-1] == 1 else 0}
    direct_forward = GemmShape(m=out_c, n=out_size, conv=True, source_c=in_c, source_cells=in_size, k_size=k_size,
                               last_extent=geom.out_spatial[-1], **direct_rows, **common)
    direct_backward = GemmShape(m=in_c, n=in_size, conv=True, source_c=out_c, source_cells=out_size, k_size=k_size,
                                last_extent=geom.in_spatial[-1], **direct_rows, **common)
    gather_rows = {"last_window": geom.kernel[-1], "shift_rows": reach}
    if geom.family is Family.CONV:
        forward = direct_forward
        backward_input = _gather_shape(in_c, geom.in_spatial, out_c, out_size, geom, {**common, **gather_rows})
    else:
        forward = _gather_shape(out_c, geom.out_spatial, in_c, in_size, geom, {**common, **gather_rows})
        backward_input = direct_backward
    return {
        "forward": forward,
        "backward_input": backward_input,
        "backward_weight": GemmShape(m=d_c, n=u_c * k_size, conv=False, source_c=u_c, source_cells=u_size,
                                     k_size=k_size, reduction=d_size, **direct_rows,
                                     last_extent=(geom.out_spatial if geom.family is Family.CONV
                                                  else geom.in_spatial)[-1], **common),
    }


def phase_offsets(k: int, s: int, p: int, d: int) -> tuple[int, ...]:
    """Per residue rho < s of one axis, the window offsets a gather-form stage's phase rho runs
    over (the template's R): the k' < k with k'*d = rho + p (mod s), a progression of step
    s / gcd(s, d) from the least one (none when gcd(s, d) does not divide rho + p)."""
    step = s // math.gcd(s, d)
    counts = []
    for rho in range(s):
        first = next((t for t in range(step) if t * d % s == (rho + p) % s), None)
        counts.append(0 if first is None or first >= k else ceil_div(k - first, step))
    return tuple(counts)


def _gather_shape(dst_c: int, dst_spatial: tuple[int, ...], src_c: int, src_cells: int, geom: Geometry,
                  shared: dict[str, int]) -> GemmShape:
    """A gather-form stage (destination cell q collects from source (q + P - k*D) / S where
    divisible), decomposed by stride phase as the template does (gemm_conv_kernel, form gather);
    `shared`: the fields every stage of the geometry has in common."""
    k_size = math.prod(geom.kernel)
    phases = math.prod(geom.stride)
    common = {**shared, "m": dst_c, "n": math.prod(dst_spatial), "conv": True, "source_c": src_c,
              "source_cells": src_cells, "weight_src_major": True, "last_extent": dst_spatial[-1]}
    if phases == 1:
        return GemmShape(**common, k_size=k_size)
    common["shift_rows"] = 0  # the phases' cells step the source by the stride
    phase_n = math.prod(ceil_div(d, s) for d, s in zip(dst_spatial, geom.stride))
    # The mean offsets per phase; the phases of an axis share its k offsets (k = sum of its R).
    offsets = math.prod(sum(phase_offsets(*axis)) for axis in zip(geom.kernel, geom.stride, geom.padding,
                                                                     geom.dilation))
    return GemmShape(**common, k_size=ceil_div(offsets, phases), phases=phases, phase_n=phase_n)
