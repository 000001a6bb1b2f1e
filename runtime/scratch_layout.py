"""Where a conv pass's scratch lies: the packed weights, channels-last sources and split partial sums its implicit-GEMM
stages write and read, laid out once per geometry in one allocation a pass. A call then allocates its scratch once
instead of once a buffer (torch's caching allocator took 3-6 µs a tensor on the H200's host, and a bf16 training step
had seven scratch buffers). Also the roles of the buffers a stage's kernels read and write, from the contract.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from convgen.cuda_launch import Plan
from convgen.generated.contract import BIAS_STAGE, STAGES
from convgen.geometry import Family, Geometry

# Where each buffer of the scratch starts: as cudaMalloc's allocations do, so that every access width stays aligned.
SCRATCH_ALIGNMENT = 256
# Bytes of a packed or channels-last operand's unit: the plans count them in floats (Plan.packed_elements,
# Plan.source_elements), whatever the elements are.
_FLOAT_BYTES = 4

# Family -> stage -> the role of the stage's output (its first non-const parameter; a GEMM stage's only one).
OUTPUT_ROLES: dict[Family, dict[str, str]] = {
    family: {stage: next(p.role for p in params if not p.const) for stage, params in stages.items()}
    for family, stages in STAGES.items()}
# Family -> stage -> the role of the input its `<stage>_wgpack` packs (the weight, or the weight gradient's D), which
# the stage reads in the packed operand's place where the pack would only copy it (Plan.copied_packs).
PACKED_ROLES: dict[Family, dict[str, str]] = {
    family: {stage.removesuffix("_wgpack"): params[0].role for stage, params in stages.items()
             if stage.endswith("_wgpack")}
    for family, stages in STAGES.items()}
# Family -> stage -> the role of the input a `<stage>_wgsource` kernel lays out (the stage's source, the weight
# gradient's U), which the stage then reads from its output instead.
RESTAGED_ROLES: dict[Family, dict[str, str]] = {
    family: {stage.removesuffix("_wgsource"): params[0].role for stage, params in stages.items()
             if stage.endswith("_wgsource")}
    for family, stages in STAGES.items()}

# The backward's implicit-GEMM stages in the order a pass runs them (a channels-last source is laid out by the first
# that reads it), and the parent (Geometry.parent_shapes: weight, bias, input) whose gradient each writes.
BACKWARD_STAGES = ("backward_input", "backward_weight", BIAS_STAGE)
_GRADIENT_OF = {"backward_weight": 0, BIAS_STAGE: 1, "backward_input": 2}


def output_shape(geom: Geometry, stage: str) -> tuple[int, ...]:
    """The shape of what a conv family's `stage` writes: the output, or the gradient of one of its parents."""
    return geom.output_shape if stage == "forward" else geom.parent_shapes[_GRADIENT_OF[stage]]


@dataclasses.dataclass(frozen=True)
class StageScratch:
    """Byte offsets into its pass's scratch of what one stage writes there, None for what it has not."""

    pack: int | None = None  # its packed weight (the `_pack` or `_wgpack` kernel's output)
    source: int | None = None  # its source laid out channels-last (a 16-bit `_wgmma` stage's `_wgsource` output)
    lays_out_source: bool = False  # it launches that `_wgsource`; else an earlier stage of the pass did
    partial: int | None = None  # its split reduction's partial sums, which its `_reduce` kernel adds up


@dataclasses.dataclass(frozen=True)
class ScratchLayout:
    """One pass's scratch: its size in bytes (0: nothing to allocate) and each of its stages' buffers."""

    size: int
    stages: dict[str, StageScratch]


def scratch_layout(geom: Geometry, plan: Plan, stages: tuple[str, ...], element_bytes: int,
                   scalar_bytes: int) -> ScratchLayout:
    """The scratch of a pass running `stages` in order on `geom` as `plan` has it: a packed weight where a stage packs
    it (the weight's elements, or a `_wgpack`'s packed floats), a channels-last source per role (stages reading the
    same role's copy share it: the transpose's input and weight gradients both read the upstream gradient so), and
    partial sums of the scalar type where a stage splits its reduction."""
    size = 0
    laid_out: dict[str, int] = {}  # role -> offset of its channels-last copy

    def take(nbytes: int) -> int:
        nonlocal size
        start = size
        size += -(-nbytes // SCRATCH_ALIGNMENT) * SCRATCH_ALIGNMENT
        return start

    buffers = {}
    for stage in stages:
        pack = source = partial = None
        lays_out_source = False
        pack_launch = plan.launches.get(f"{stage}_pack")
        if stage not in plan.copied_packs and pack_launch is not None and pack_launch.grid:
            packed = plan.packed_elements.get(stage)
            pack = take(geom.parent_numels[0] * element_bytes if packed is None else packed * _FLOAT_BYTES)
        source_elements = plan.source_elements.get(stage)
        if source_elements is not None:
            role = RESTAGED_ROLES[geom.family][stage]
            source = laid_out.get(role)
            if source is None:
                source = laid_out[role] = take(source_elements * _FLOAT_BYTES)
                lays_out_source = True
        split = plan.splits[stage]
        if split > 1:
            partial = take(split * math.prod(output_shape(geom, stage)) * scalar_bytes)
        buffers[stage] = StageScratch(pack, source, lays_out_source, partial)
    return ScratchLayout(size, buffers)


def backward_layouts(geom: Geometry, plan: Plan, element_bytes: int,
                     scalar_bytes: int) -> dict[tuple[bool, bool, bool], ScratchLayout]:
    """The backward's scratch for each choice of gradients (the `wanted` flags: weight, bias, input)."""
    layouts = {}
    for wants_weight, wants_bias, wants_x in itertools.product((True, False), repeat=3):
        wanted = {"backward_weight": wants_weight, BIAS_STAGE: wants_bias, "backward_input": wants_x}
        stages = tuple(stage for stage in BACKWARD_STAGES if wanted[stage])
        layouts[(wants_weight, wants_bias, wants_x)] = scratch_layout(geom, plan, stages, element_bytes, scalar_bytes)
    return layouts
