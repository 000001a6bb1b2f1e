"""The kernel contract's kernels: each family's stages (its kernels, in launch order of a forward then a backward
pass), their parameters in order and what each computes, the conv families' launch groups, the circular padding's pad
and fold, and the defines each kind of stage takes. `convgen build` prints them, with generator/contract.py's
vocabulary, into the CUDA sources and generated/contract.py. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from convgen.generator.contract import (
    BIAS_STAGE,
    DIRECT_BOX_FIELD,
    DIRECT_FIELDS,
    DIRECT_WEIGHT_FIELDS,
    GEMM_STAGES,
    PACKED_FIELD,
    STAGE_MMA_FIELD,
    TILE_FIELDS,
    WEIGHT_STAGE,
    WGMMA_FIELDS,
    Family,
)


def tile_defines(stage: str) -> tuple[str, ...]:
    """`FWD_BM`, ..., `FWD_MMA`: the tile defines of one GEMM stage."""
    return tuple(f"{GEMM_STAGES[stage]}_{field}" for field in (*TILE_FIELDS, STAGE_MMA_FIELD))


def packed_define(family: Family, stage: str) -> str | None:
    """`BWI_PACKED`, ...: the define of a GEMM stage of `family` that has a `_pack` kernel, else None."""
    has_pack = any(s.name == f"{stage}_pack" for s in FAMILY_STAGES[family])
    return f"{GEMM_STAGES[stage]}_{PACKED_FIELD}" if has_pack else None


def direct_defines(family: Family, stage: str, rank: int) -> tuple[str, ...]:
    """`FWD_DIRECT`, ..., `FWD_DIRECT_BOX0`, ...: the defines of a GEMM stage of `family` that has a `_direct`
    kernel, else none."""
    if not any(s.name == f"{stage}_direct" for s in FAMILY_STAGES[family]):
        return ()
    prefix = GEMM_STAGES[stage]
    fields = DIRECT_WEIGHT_FIELDS if stage == WEIGHT_STAGE else DIRECT_FIELDS
    return (*(f"{prefix}_{field}" for field in fields), *(f"{prefix}_{DIRECT_BOX_FIELD}{a}" for a in range(rank)))


def wgmma_defines(family: Family, stage: str) -> tuple[str, ...]:
    """`FWD_WGMMA`, ...: the defines of a GEMM stage of `family` that has a `_wgmma` kernel, else none."""
    if not any(s.name == f"{stage}_wgmma" for s in FAMILY_STAGES[family]):
        return ()
    return tuple(f"{GEMM_STAGES[stage]}_{field}" for field in WGMMA_FIELDS)


def pool_defines(family: Family) -> tuple[str, ...]:
    """The defines a pooling source takes beyond the common and axis ones."""
    return ("POOL_V", "ARGMAX_BYTES") if family is Family.MAX_POOL else ("POOL_V",)


@dataclass(frozen=True, slots=True)
class Param:
    """One kernel parameter. `role` names the value the runtime passes (`x`, `grad`, `partial`...);
    outputs are the non-const pointers. `dtype` is the CUDA type: `real` is the element type the
    source is compiled for (ELEMENT_BYTES), `scalar` the type it computes in (float for 16-bit elements)."""

    name: str
    role: str
    dtype: str = "real"
    const: bool = True
    pointer: bool = True

    @property
    def declaration(self) -> str:
        qualifier = "const " if self.const else ""
        pointer = "* __restrict__" if self.pointer else ""
        return f"{qualifier}{self.dtype}{pointer} {self.name}"


def _in(name: str, role: str, dtype: str = "real") -> Param:
    return Param(name, role, dtype)


def _out(name: str, role: str, dtype: str = "real") -> Param:
    return Param(name, role, dtype, const=False)


# β stays float in every element type: the tape rounds it to float32 (SEMANTICS), and the kernels
# widen it exactly where they compute in double.
BETA = Param("beta", "beta", "float", pointer=False)
# The batch (SEMANTICS §8) is a kernel argument, not a define: a new batch size compiles nothing.
IMAGES = Param("images", "images", "unsigned", pointer=False)


@dataclass(frozen=True, slots=True)
class ConvRow:
    """How one convolution-shaped GEMM stage reads its operands (templates/cuda/conv.cu.j2):
    destination cells (IN/OUT extents) and channels, source likewise, the form (`direct`: source
    j = d*S + k - P; `gather`: d = j*S + k - P), the weight layout (`dst_major` W[dst, src, k],
    `src_major` W[src, dst, k]) and whether the bias seeds the accumulators."""

    form: str
    dst: str
    dst_c: str
    src: str
    src_c: str
    weight_layout: str
    with_bias: bool


@dataclass(frozen=True, slots=True)
class WeightRow:
    """The weight-gradient GEMM: dW over the cells of D (extents `d`) against U (extents `u`)."""

    d: str
    d_c: str
    u: str
    u_c: str


@dataclass(frozen=True, slots=True)
class Stage:
    """One kernel of a family's source: its stage name, parameters in order, the formula it
    computes (printed above it), and for the conv families its GEMM layout."""

    name: str
    params: tuple[Param, ...]
    summary: str
    layout: ConvRow | WeightRow | None = None
    members: tuple[str, ...] = ()  # a launch group's kernels (_group), in the order its grid runs them

    @property
    def gemm(self) -> str | None:
        """The GEMM stage this kernel belongs to (itself, or the one it reduces), if any."""
        base = self.name
        for suffix in ("_reduce", "_pack", "_direct", "_wgmma", "_wgpack", "_wgsource"):
            base = base.removesuffix(suffix)
        return base if base in GEMM_STAGES else None


def _reduce(stage: str, output: str, per_image: bool) -> Stage:
    """The second pass of a split stage; `per_image`: its output has the batch axis."""
    images = (IMAGES,) if per_image else ()
    return Stage(f"{stage}_reduce", (_in("partial", "partial", "scalar"), *images, _out("dest", output)),
                 "Second pass of a split reduction: dest = partial[0] + partial[1] + ..., in that order.")


def _pack(stage: str, layout: ConvRow) -> Stage:
    """The weight of a conv-shaped stage repacked for coalesced A loads (launched when its PACKED is 1)."""
    return Stage(f"{stage}_pack", (_in("weight", "weight"), _out("packed", "packed_weight")),
                 "P[g, k, src, dst] = the weight's element that A(dst, (src, k)) of the stage reads: dst channel "
                 "fastest, so a slice of A (one k, a block of src channels) is contiguous rows.", layout)


def _direct(stage: Stage) -> Stage:
    """The small-channel direct kernel of a conv stage (conv-shaped, or the weight gradient): its parameters and
    output (the weight gradient's, or its partial buffer, which the stage's reduce kernel adds up), another kernel."""
    if isinstance(stage.layout, WeightRow):
        summary = ("The same sums as the weight-gradient GEMM, as a stencil: a block stages a box of D and U's halo "
                   "for all channels per work item, a thread per (U channel, outer window offsets) slides over the "
                   "box; launched instead of the GEMM where the plan's DIRECT is 1.")
    else:
        summary = ("The same sums as the stage's GEMM, as a stencil (per stride phase in the gather form): a block "
                   "stages a box's source halo and weights for a few channels at a time; launched instead of the GEMM "
                   "where the plan's DIRECT is 1.")
    return Stage(f"{stage.name}_direct", stage.params, summary, stage.layout)


def _wgpack(stage: str, layout: ConvRow) -> Stage:
    """The weight of a conv-shaped stage packed for its `_wgmma` kernel (launched when its WGMMA is 1)."""
    return Stage(f"{stage}_wgpack", (_in("weight", "weight"), _out("packed", "packed_weight", "float")),
                 "P[plane, g, n block, slice, dst, src % 32] = the weight's element that A(dst, (src, k)) of the "
                 "stage reads, rounded to TF32 (plane 0) and, in 3xTF32, the rest rounded (plane 1); zero past the "
                 "channels: a slice of one n block is WG_N rows of 128 bytes.", layout)


def _wgsource(stage: Stage) -> Stage:
    """The source a 16-bit `_wgmma` kernel reads, laid out channels-last for it (launched before it there; the kernel
    then reads this copy in the source's place): a conv-shaped stage's source, or the weight gradient's U."""
    source = stage.params[1] if isinstance(stage.layout, WeightRow) else stage.params[0]
    return Stage(f"{stage.name}_wgsource", (_in("source_values", source.role), IMAGES,
                                            _out("staged", "staged_source", "float")),
                 f"S[n, g, cell, c] = {source.role}'s element (image n, channel c of group g), channels rounded up to "
                 "whole blocks of 32 with zeros: a block of one cell's channels is 64 contiguous bytes, which the "
                 "16-bit `_wgmma` copies 16 bytes at a time.", stage.layout)


def _wgmma(stage: Stage) -> Stage:
    """The Hopper tensor-core kernel of a conv-shaped stage: the stage's parameters and its packed weight."""
    return _with_packed(stage, "packed_weight",
                        "The same sums as the stage's GEMM in the TF32 modes, with warpgroup mma (sm_90a): the dst "
                        "cells are wgmma's M (fragments rounded in registers), the packed weight its N x K operand in "
                        "shared memory; a block whose sums end non-finite computes them again with FMAs on the weight "
                        "as given.")


def _with_packed(stage: Stage, role: str, summary: str) -> Stage:
    """A `_wgmma` kernel: the stage's parameters, then the packed operand (`role`) before the images and output."""
    params = tuple(p for p in stage.params if p.role != "images")
    images = next(p for p in stage.params if p.role == "images")
    return Stage(f"{stage.name}_wgmma", (*params[:-1], _in("packed", role, "float"), images, params[-1]), summary,
                 stage.layout)


def _weight_wgpack(stage: Stage) -> Stage:
    """D of the weight gradient packed for its `_wgmma` kernel (launched when its WGMMA is 1)."""
    d_values = stage.params[0]
    return Stage(f"{stage.name}_wgpack", (d_values, IMAGES, _out("packed", "packed_d", "float")),
                 "P[plane, n, g, d, cell] = D's element (image n, channel d of group g), rounded to TF32 (plane 0) "
                 "and, in 3xTF32, the rest rounded (plane 1); zero past the channels (to whole blocks of WG_N) and "
                 "past the cells (to whole slices of WG_BK): a slice of one block is WG_N rows of 128 bytes.",
                 stage.layout)


def _weight_wgmma(stage: Stage) -> Stage:
    """The Hopper tensor-core kernel of the weight gradient: the stage's parameters and its packed D."""
    return _with_packed(stage, "packed_d",
                        "The same sums as the weight-gradient GEMM in the TF32 modes, with warpgroup mma (sm_90a): "
                        "the rows (window offset, U channel) of dW are wgmma's M (U's values rounded in registers), "
                        "the packed D its N x K operand in shared memory, the cells of every image split across "
                        "blocks whose parts the reduce kernel adds; a block whose sums end non-finite computes them "
                        "again with FMAs on D and U as given.")


# The prefix of a launch group's parameters of member i (`part0_weight`, ..., `part0_blocks`).
GROUP_PART_PREFIX = "part"


def _group(name: str, stages: tuple[Stage, ...], members: tuple[str, ...], summary: str) -> Stage:
    """A launch group: one kernel whose grid runs the blocks of each of `members` (kernels of 256-thread blocks and no
    dynamic shared memory, of one pass, none reading what another writes) one member after another, so that the host
    launches them once. Its parameters: each member's as part<i>_<name> (role kept), then each one's block count."""
    by_name = {stage.name: stage for stage in stages}
    params = tuple(Param(f"{GROUP_PART_PREFIX}{i}_{p.name}", p.role, p.dtype, p.const, p.pointer)
                   for i, member in enumerate(members) for p in by_name[member].params)
    blocks = tuple(Param(f"{GROUP_PART_PREFIX}{i}_blocks", f"{GROUP_PART_PREFIX}{i}_blocks", "unsigned", pointer=False)
                   for i in range(len(members)))
    return Stage(name, (*params, *blocks), summary, members=members)


def _conv_groups(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """A conv family's launch groups: what each pass reads laid out (and the bias gradient's parts) before its GEMMs,
    and the weight and bias gradients' reduces after them. A bf16 training step launched 11 kernels one at a time,
    each several µs of the host's (benchmarks/NOTES.md)."""
    return (
        _group("forward_prep", stages, ("forward_pack", "forward_wgpack", "forward_wgsource"),
               "The forward's operand layouts in one launch: the packed weight and the channels-last source."),
        _group("backward_prep", stages,
               ("backward_input_pack", "backward_input_wgpack", "backward_input_wgsource", "backward_weight_wgpack",
                "backward_weight_wgsource", BIAS_STAGE),
               "The backward's operand layouts and the bias gradient (or its parts) in one launch."),
        _group("backward_reduces", stages, ("backward_weight_reduce", f"{BIAS_STAGE}_reduce"),
               "The weight and bias gradients' split sums added up in one launch."),
    )


_BIAS_GRAD = Stage(BIAS_STAGE, (_in("grad", "grad"), IMAGES, _out("bias_grad", "grad_bias")),
                   "dB[oc] = sum of g[n, oc, :] over the images n, then the output cells: a block per channel "
                   "and part (a run of the cells), whose sums backward_bias_reduce adds up when there are parts.")
_BIAS_REDUCE = _reduce(BIAS_STAGE, "grad_bias", False)

def _conv_family(forward: Stage, backward_input: Stage, weight: Stage) -> tuple[Stage, ...]:
    """A conv family's kernels from its three GEMM stages: per conv-shaped stage its weight pack, the GEMM, its direct
    kernel, the wgmma kernel's weight pack and channels-last source, the wgmma kernel and the split reduce; the weight
    gradient's GEMM, direct kernel, packed D, source, wgmma kernel and reduce; the bias gradient and its reduce."""
    conv_shaped = tuple(kernel for stage in (forward, backward_input) for kernel in (
        _pack(stage.name, stage.layout), stage, _direct(stage), _wgpack(stage.name, stage.layout), _wgsource(stage),
        _wgmma(stage), _reduce(stage.name, stage.params[-1].role, True)))
    return (*conv_shaped, weight, _direct(weight), _weight_wgpack(weight), _wgsource(weight), _weight_wgmma(weight),
            _reduce(weight.name, weight.params[-1].role, False), _BIAS_GRAD, _BIAS_REDUCE)


_FORWARD_PARAMS = (_in("source", "x"), _in("weight", "weight"), _in("bias", "bias"), IMAGES, _out("dest", "y"))
_BACKWARD_INPUT_PARAMS = (_in("source", "grad"), _in("weight", "weight"), IMAGES, _out("dest", "grad_x"))
_CONV_STAGES = _conv_family(
    Stage("forward", _FORWARD_PARAMS,
          "y = conv(x): y[oc, o] = b[oc] + sum over (ic, k) of W[oc, ic, k] * x[ic, o*S + k - P].",
          ConvRow("direct", "OUT", "OUT_C", "IN", "IN_C", "dst_major", True)),
    Stage("backward_input", _BACKWARD_INPUT_PARAMS,
          "dx = conv^T(g): dx[ic, i] = sum over (oc, k) with i = o*S + k - P of W[oc, ic, k] * g[oc, o].",
          ConvRow("gather", "IN", "IN_C", "OUT", "OUT_C", "src_major", False)),
    Stage("backward_weight", (_in("d_values", "grad"), _in("u_values", "x"), IMAGES, _out("dest", "grad_weight")),
          "dW[oc, ic, k] = sum over the images n, then the cells o, of g[n, oc, o] * x[n, ic, o*S + k - P].",
          WeightRow("OUT", "OUT_C", "IN", "IN_C")))
_CONV_TRANSPOSE_STAGES = _conv_family(
    Stage("forward", _FORWARD_PARAMS,
          "y[oc, q] = b[oc] + sum over (ic, i, k) with q = i*S + k - P of x[ic, i] * W[ic, oc, k]: "
          "each output cell gathers from the input cells whose scatter reaches it.",
          ConvRow("gather", "OUT", "OUT_C", "IN", "IN_C", "src_major", True)),
    Stage("backward_input", _BACKWARD_INPUT_PARAMS,
          "dx[ic, i] = sum_oc sum_k W[ic, oc, k] * g[oc, i*S + k - P]: an ordinary convolution of g.",
          ConvRow("direct", "IN", "IN_C", "OUT", "OUT_C", "dst_major", False)),
    Stage("backward_weight", (_in("d_values", "x"), _in("u_values", "grad"), IMAGES, _out("dest", "grad_weight")),
          "dW[ic, oc, k] = sum over the images n, then the cells i, of x[n, ic, i] * g[n, oc, i*S + k - P].",
          WeightRow("IN", "IN_C", "OUT", "OUT_C")))


def _pool_stages(forward: tuple[Param, ...], forward_summary: str, backward: tuple[Param, ...],
                 backward_summary: str) -> tuple[Stage, ...]:
    return (Stage("forward", forward, forward_summary), Stage("backward_input", backward, backward_summary))


# Every family's kernels in launch order of a forward then a backward pass, the conv families' launch groups last.
# Each implicit-GEMM stage may be split over blocks along its reduction; its `*_reduce` kernel then adds the partial
# results in a fixed order (launched only when the plan splits).
FAMILY_STAGES: dict[Family, tuple[Stage, ...]] = {
    Family.CONV: (*_CONV_STAGES, *_conv_groups(_CONV_STAGES)),
    Family.CONV_TRANSPOSE: (*_CONV_TRANSPOSE_STAGES, *_conv_groups(_CONV_TRANSPOSE_STAGES)),
    Family.MAX_POOL: _pool_stages(
        (_in("x", "x"), IMAGES, _out("y", "y"), _out("argmax", "argmax", "argmax_t")),
        "y = the first in-bounds cell of the window, replaced only by a strictly greater one (a NaN "
        "first cell stays; padded cells are skipped); argmax = its flat window offset, for the backward pass.",
        (_in("grad", "grad"), _in("argmax", "argmax", "argmax_t"), IMAGES, _out("grad_x", "grad_x")),
        "dx[c, i] = sum of g[c, o] over the windows o that cover i and chose i in the forward pass."),
    Family.AVG_POOL: _pool_stages(
        (_in("x", "x"), IMAGES, _out("y", "y")),
        "y = (sum of the in-bounds cells) / K: padded cells count as zeros (count-include-pad).",
        (_in("grad", "grad"), IMAGES, _out("grad_x", "grad_x")),
        "dx[c, i] = (sum of g[c, o] over the windows o that cover i) / K."),
    Family.SMOOTH_MAX_POOL: _pool_stages(
        (_in("x", "x"), BETA, IMAGES, _out("y", "y"), _out("pivots", "pivots", "scalar"),
         _out("sums", "sums", "scalar")),
        "y = pivot + log(Z) / beta with Z = sum over all K cells (padded ones are 0) of exp(beta * (v - pivot)); "
        "pivot = window max (beta > 0) or min (beta < 0), taken in input space so that beta * v is never "
        "formed. Saves pivot and Z for the backward pass.",
        (_in("x", "x"), _in("grad", "grad"), _in("pivots", "pivots", "scalar"), _in("sums", "sums", "scalar"), BETA,
         IMAGES, _out("grad_x", "grad_x")),
        "dx[c, i] = sum over the windows o that cover i of g[c, o] * exp(beta * (x[c, i] - pivot)) / Z."),
}


def stage(family: Family, name: str) -> Stage:
    """The stage `name` of `family`; an unknown name is an error naming the known ones."""
    for candidate in FAMILY_STAGES[family]:
        if candidate.name == name:
            return candidate
    known = ", ".join(s.name for s in FAMILY_STAGES[family])
    raise ValueError(f"{family.value} has no stage {name!r} (stages: {known})")


# Circular padding (SEMANTICS §8, conv only) on the CUDA tape is explicit: `pad` writes the wrapped
# input xp (extents IN + 2P), the conv family's ordinary kernels run on xp with padding 0, and `fold`
# adds the gradient of xp back onto the cells each padded cell copied. One auxiliary source per rank
# (templates/cuda/circular.cu.j2); IN_C is the channel count of one image, IN/P per axis the input
# extent and the padding (P <= IN, so a cell wraps at most once each way).
CIRCULAR_STEM = "circular"
CIRCULAR_COMMON_DEFINES = ("IN_C", "BLOCK", "ELEMENT_BYTES", "ELEMENT_BF16")
CIRCULAR_AXIS_DEFINES = ("IN", "P")
CIRCULAR_STAGES = (
    Stage("pad", (_in("x", "x"), IMAGES, _out("padded", "padded")),
          "xp[n, c, q] = x[n, c, (q - P) mod IN] per axis, q < IN + 2P: the circularly padded input."),
    Stage("fold", (_in("grad_padded", "grad_padded"), IMAGES, _out("grad_x", "grad_x")),
          "dx[n, c, i] = sum of dxp[n, c, q] over the padded cells q that copied i (per axis q = i + P - IN, "
          "i + P, i + P + IN inside [0, IN + 2P)), in ascending q: the adjoint of pad, a gather without atomics."),
)
