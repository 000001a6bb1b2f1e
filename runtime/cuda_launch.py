"""Launch plans for the generated CUDA: a validated `Geometry` -> the -D defines that specialise a
source at load time, the NVRTC options, and each stage's grid and block.

Pure Python without CuPy: `convgen compile` uses it to compile every source with no GPU present.
The define names, stages and shared-memory layout come from the generated contract; the stages' GEMM
shapes from convgen.gemm_shapes and their tiles from convgen.tile_model, whose names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import math
from collections.abc import Callable
from dataclasses import dataclass

from convgen.backend import HALF_DTYPES, PRECISIONS, precision_refusal
from convgen.direct_model import DirectChooser, DirectTile, choose_direct, direct_grid, direct_shared_bytes
from convgen.direct_shapes import MMA_DIRECT_MODE, DirectShape, direct_shapes, weight_shape
from convgen.direct_weight_model import weight_mma_shared_bytes
from convgen.gemm_shapes import HALF_MMA_K, MMA_K, GemmShape, ceil_div, gemm_shapes
from convgen.generated.contract import (
    BIAS_PREFIX,
    BIAS_STAGE,
    DIRECT_BOX_FIELD,
    DIRECT_FIELDS,
    DIRECT_SWITCHES,
    DIRECT_WEIGHT_FIELDS,
    ELEMENT_TYPES,
    GEMM_STAGES,
    HALF_MMA_MODE,
    KERNELS,
    LAUNCH_GROUPS,
    PACKED_FIELD,
    PRECISION_MMA_MODES,
    STAGE_MMA_FIELD,
    STATIC_SHARED_BYTES,
    TILE_FIELDS,
    WGMMA_FIELDS,
    gemm_dynamic_shared_bytes,
    split_sum_vector,
)
from convgen.geometry import Family, Geometry, dilated
from convgen.tile_calibration import PACK_MIN_MACS
from convgen.tile_model import (
    H200,
    SPLIT_WORKSPACE_BYTES,
    GemmTile,
    Hardware,
    choose_tile,
    gemm_cost,
    packs_weight,
    tile_candidates,
)
from convgen.wgmma_tiles import (
    WgmmaChooser,
    WgmmaTile,
    choose_wgmma,
    wgmma_block_shared_bytes,
    wgmma_grid,
    wgmma_pack_copies,
    wgmma_pack_threads,
    wgmma_packed_floats,
    wgmma_source_floats,
    wgmma_source_threads,
)

__all__ = ["BIAS_CELLS_PER_BLOCK", "BLOCK", "CUDA_SOURCES", "ELEMENT_DEFINES", "GEMM_STAGES", "H200", "NVRTC_OPTIONS",
           "PACK_MIN_MACS", "PRECISIONS", "SPLIT_WORKSPACE_BYTES", "GemmShape", "GemmTile", "Hardware", "Launch",
           "Plan", "TileChooser", "argmax_dtype", "batch_bucket", "ceil_div", "choose_tile", "gemm_cost", "gemm_shapes",
           "nvrtc_options", "opted_in_shared", "packs_weight", "plan", "pool_cells_per_thread",
           "representative_geometry", "representative_wgmma_geometry", "scalar_dtype", "tile_candidates"]

BLOCK = 256  # threads per block of the pool, reduce and bias kernels (the sources get it as -DBLOCK)
# The element type -> the defines that pick the kernels' `real` (the contract's ELEMENT_TYPES).
ELEMENT_DEFINES: dict[str, dict[str, int]] = {
    dtype: {"ELEMENT_BYTES": size, "ELEMENT_BF16": bf16} for dtype, (size, bf16) in ELEMENT_TYPES.items()}


def scalar_dtype(dtype: str) -> str:
    """The dtype the kernels of `dtype` elements compute in (`scalar`): float32 for the 16-bit types.
    Shared memory, split stages' partial buffers and smooth max's saved pivots and sums hold it."""
    return "float64" if dtype == "float64" else "float32"

# C++17 for constexpr helpers; no fast math, so expf/logf keep full float32 accuracy. CuPy adds
# -arch for the device it compiles on.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)
# The generated CUDA sources (KERNELS' `source` names), read from the installed package, editable or not.
CUDA_SOURCES = importlib.resources.files("convgen.generated") / "cuda"

TileChooser = Callable[[GemmShape, Hardware], GemmTile]


@dataclass(frozen=True, slots=True)
class Launch:
    grid: int  # blocks along x; 0 when the stage has nothing to write
    block: int = BLOCK
    shared_bytes: int = 0  # dynamic shared memory: GEMM slices past the static limit (gemm_dynamic_shared_bytes)
    kernel: str = ""  # the kernel that runs the stage, when not the stage's own (a GEMM stage's `_direct`)


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything geometry-dependent about running one op, computed once per geometry."""

    defines: dict[str, int]  # name -> value, in the contract's order
    launches: dict[str, Launch]  # stage -> launch
    # GEMM stage or the bias gradient -> number of reduction splits; > 1: the stage writes a
    # [split, *output] partial buffer and its `<stage>_reduce` kernel adds it up.
    splits: dict[str, int]
    argmax_dtype: str = "uint32"  # max pool: the saved window offsets (uint8 when K <= 255)
    # Stage -> floats of its packed weight where not the weight's size (a `_wgpack` kernel's output).
    packed_elements: dict[str, int] = dataclasses.field(default_factory=dict)
    # Stage -> floats of its source (the weight gradient's U) laid out channels-last (a 16-bit stage's `_wgsource`
    # output, read in the source's place).
    source_elements: dict[str, int] = dataclasses.field(default_factory=dict)
    # Stages whose `_wgpack` would only copy its input (wgmma_pack_copies; their pack launches nothing): their `_wgmma`
    # reads the input in its place (every array a kernel gets starts on the contract's ARRAY_ALIGNMENT, as the
    # kernel's 16-byte copies need).
    copied_packs: frozenset[str] = frozenset()
    arch: str = ""  # the architecture the source must compile for ("sm_90a" for `_wgmma` kernels), else any


WGMMA_ARCH = "sm_90a"


def nvrtc_options(geometry_plan: Plan) -> tuple[str, ...]:
    """The fixed NVRTC options and the plan's -D defines (its architecture: `arch_option`)."""
    return NVRTC_OPTIONS + tuple(f"-D{name}={value}" for name, value in geometry_plan.defines.items())


def arch_option(geometry_plan: Plan) -> tuple[str, ...]:
    """The -arch option a plan's source needs on its device, if any (CuPy otherwise picks the device's)."""
    return (f"-arch={geometry_plan.arch}",) if geometry_plan.arch else ()


def _blocks(threads: int) -> int:
    return ceil_div(threads, BLOCK)


def _geometry_defines(geom: Geometry, dtype: str, mma: int, hardware: Hardware) -> dict[str, int]:
    values: dict[str, int] = {"IN_C": geom.in_c, "OUT_C": geom.out_c, "BLOCK": BLOCK, **ELEMENT_DEFINES[dtype]}
    for axis, axis_values in enumerate(zip(geom.in_spatial, geom.kernel, geom.stride, geom.padding,
                                           geom.out_spatial, geom.dilation)):
        values.update(zip((f"IN{axis}", f"K{axis}", f"S{axis}", f"P{axis}", f"OUT{axis}", f"D{axis}"), axis_values))
    if geom.family.is_conv:
        values["GROUPS"] = geom.groups
        values["MMA_MODE"] = mma
        values[f"{BIAS_PREFIX}_SPLIT"] = bias_split(geom, hardware)
    return values


# The fewest cells a block of the bias gradient sums over the images of the batch's bucket before a part
# of the cells is worth a block of its own: sixteen loads a thread.
BIAS_CELLS_PER_BLOCK = 16 * BLOCK


def bias_split(geom: Geometry, hardware: Hardware) -> int:
    """The bias gradient's parts per channel: enough blocks (channels x parts) for two per SM, each summing
    at least BIAS_CELLS_PER_BLOCK cells of the batch's bucket and at least a quad of each image. From the
    bucket, not the batch, so that a new batch size compiles nothing; 64 channels of a one-block-per-channel
    kernel left half an H200 idle, and one image stays in one part (no reduce launch on the host's clock)."""
    cells = math.prod(geom.out_spatial)
    blocks = batch_bucket(geom.images) * cells // BIAS_CELLS_PER_BLOCK
    return max(1, min(ceil_div(2 * hardware.sm_count, max(geom.out_c, 1)), blocks, cells // 4))


def batch_bucket(images: int) -> int:
    """The batch a plan's tiles are chosen for: the next power of two, so that batch sizes share
    few sets of defines (the batch itself is a kernel argument: a new one compiles nothing)."""
    return 1 << max(images - 1, 0).bit_length()


def _direct_defines(prefix: str, fields: tuple[str, ...], values: tuple[int, ...] | None,
                    box: tuple[int, ...] | None, rank: int) -> dict[str, int]:
    """A stage's direct-kernel defines: `fields` set to `values` and the box, or when `values` is None (the GEMM
    runs) the switches <PREFIX>_DIRECT and _DIRECT_MMA 0 and the sizes 1."""
    values = values or tuple(0 if field in DIRECT_SWITCHES else 1 for field in fields)
    return {**{f"{prefix}_{field}": value for field, value in zip(fields, values, strict=True)},
            **{f"{prefix}_{DIRECT_BOX_FIELD}{axis}": extent for axis, extent in enumerate(box or (1,) * rank)}}


def _direct_stage(stage: str, shape: DirectShape, tile: DirectTile, launches: dict[str, Launch],
                  splits: dict[str, int]) -> None:
    """Launches of a stage that runs its `_direct` kernel: no pack, no split, no reduce. A staging past the static
    limit is the launch's dynamic shared memory, as the kernel takes it."""
    staged = direct_shared_bytes(tile, shape)
    launches[stage] = Launch(direct_grid(tile, shape), tile.threads, staged if staged > STATIC_SHARED_BYTES else 0,
                             kernel=f"{stage}_direct")
    launches[f"{stage}_pack"] = launches[f"{stage}_reduce"] = Launch(0)
    splits[stage] = 1


@functools.lru_cache(maxsize=1024)
def _plan(geom: Geometry, hardware: Hardware, chooser: TileChooser, dtype: str, mma: int,
          direct_chooser: DirectChooser, wgmma_chooser: WgmmaChooser) -> Plan:
    values = _geometry_defines(geom, dtype, mma, hardware)
    staged_bytes = 8 if scalar_dtype(dtype) == "float64" else 4  # what shared memory and split buffers hold
    if not geom.family.is_conv:
        return _pool_plan(geom, values)
    launches: dict[str, Launch] = {}
    splits: dict[str, int] = {}
    packed_elements: dict[str, int] = {}
    source_elements: dict[str, int] = {}
    copied_packs: set[str] = set()
    bucketed = geom if geom.batch is None else dataclasses.replace(geom, batch=batch_bucket(geom.batch))
    # The 16-bit mma takes the TF32 mma's tiles (valid for it: its slices are whole k steps of 16, see
    # _tensor_core_mode): the tile model's costs for it are not fitted yet, and on the H200 its own picks
    # lost to these (conv1d N32 64->64 bf16: 0.113 against 0.0955 ms forward; benchmarks/NOTES.md).
    tile_mma = TF32_MMA_MODE if mma == HALF_MMA_MODE else mma
    # The stages' shapes per mode: the geometry's (and its tiles'), and FMAs' for the stages that take them.
    shapes = {mode: gemm_shapes(geom, staged_bytes, mode) for mode in {mma, 0}}
    tile_shapes = {mode: gemm_shapes(bucketed, staged_bytes, mode) for mode in {tile_mma, 0}}
    # The direct kernels' tiles are chosen for the bucket too (their V and box are defines), launched for the batch.
    # The direct kernels' tensor-core form multiplies in TF32, which holds 16-bit elements exactly: it serves "medium"
    # on float32 and every 16-bit mode, not 3xTF32.
    direct_mma = MMA_DIRECT_MODE if mma in (TF32_MMA_MODE, HALF_MMA_MODE) else 0
    stencils = direct_shapes(geom, staged_bytes, direct_mma)
    tile_stencils = direct_shapes(bucketed, staged_bytes, direct_mma)
    for stage, geometry_shape in shapes[mma].items():
        mode = stage_mma(geometry_shape, mma)
        shape = shapes[mode][stage]
        tile_shape = tile_shapes[tile_mma if mode else 0][stage]
        if dtype in HALF_DTYPES:  # 16-bit elements stage through registers (the cp.async pipeline takes float32)
            tile_shape = dataclasses.replace(tile_shape, pipelined=False)
        tile = chooser(tile_shape, hardware)
        prefix = GEMM_STAGES[stage]
        values.update({f"{prefix}_{field}": getattr(tile, field.lower()) for field in TILE_FIELDS})
        values[f"{prefix}_{STAGE_MMA_FIELD}"] = mode
        count = shape.count  # of one output (the kernel's COUNT)
        launches[stage] = Launch(shape.grid(tile.bm, tile.bn, tile.split) if count else 0, tile.threads,
                                 gemm_dynamic_shared_bytes(tile.bm, tile.bn, tile.bk, shape.staged_bytes,
                                                           tile.stages))
        if shape.conv:  # the stages with a `_pack` kernel (contract: packed_define)
            values[f"{prefix}_{PACKED_FIELD}"] = int(tile.packed)
            launches[f"{stage}_pack"] = Launch(_blocks(geom.parent_numels[0]) if count and tile.packed else 0)
        launches[f"{stage}_reduce"] = _reduce_launch(count, shape.outputs, tile.split)
        splits[stage] = tile.split
        if stage in stencils:  # a conv-shaped stage: its `_direct` kernel where the chooser gives a tile
            direct = direct_chooser(tile_stencils[stage], hardware)
            direct_values = direct and (1, direct.v, direct.mb, direct.cb, direct.mma, direct.slices)
            values.update(_direct_defines(prefix, DIRECT_FIELDS, direct_values, direct and direct.box, geom.rank))
            wgmma = None if direct else wgmma_chooser(tile_shape, hardware)
            values.update(_wgmma_defines(prefix, wgmma))
            if direct and count:
                _direct_stage(stage, stencils[stage], direct, launches, splits)
            elif wgmma and count:
                _wgmma_stage(stage, _wgmma_operands(shape, dtype), wgmma, launches, splits, packed_elements,
                             source_elements, copied_packs)
        else:  # the weight gradient: its `_direct` or `_wgmma` kernel likewise, their parts summed by its reduce kernel
            weight = direct_chooser(weight_shape(bucketed, staged_bytes, direct_mma, dtype in HALF_DTYPES), hardware)
            values.update(_direct_defines(prefix, DIRECT_WEIGHT_FIELDS,
                                          weight and (1, weight.v, weight.lanes, weight.channel_blocks, weight.mma,
                                                     weight.min_blocks),
                                          weight and weight.box, geom.rank))
            wgmma = None if weight else wgmma_chooser(tile_shape, hardware)
            values.update(_wgmma_defines(prefix, wgmma))
            if weight or wgmma:  # their parts are the stage's split
                values[f"{prefix}_SPLIT"] = weight.parts if weight else wgmma.split
            if weight and count:
                staged = weight_mma_shared_bytes(weight, weight_shape(geom, staged_bytes)) if weight.mma else 0
                launches[stage] = Launch(geom.groups * weight.blocks, weight.threads, staged, kernel=f"{stage}_direct")
                launches[f"{stage}_reduce"] = _reduce_launch(count, shape.outputs, weight.parts)
                splits[stage] = weight.parts
            elif wgmma and count:
                _wgmma_stage(stage, _wgmma_operands(shape, dtype), wgmma, launches, splits, packed_elements,
                             source_elements, copied_packs)
    parts = splits[BIAS_STAGE] = values[f"{BIAS_PREFIX}_SPLIT"]
    launches[BIAS_STAGE] = Launch(geom.out_c * parts)
    launches[f"{BIAS_STAGE}_reduce"] = _reduce_launch(geom.out_c, 1, parts)
    arch = WGMMA_ARCH if any(launch.kernel.endswith("_wgmma") for launch in launches.values() if launch.grid) else ""
    return _checked(geom, Plan(values, launches, splits, packed_elements=packed_elements,
                               source_elements=source_elements, copied_packs=frozenset(copied_packs), arch=arch))


def _wgmma_defines(prefix: str, tile: WgmmaTile | None) -> dict[str, int]:
    """A conv-shaped stage's `_wgmma` defines: WGMMA 1 and the tile, or 0 (and placeholders) where the GEMM runs."""
    values = ((1, tile.n, tile.cells, tile.stages, tile.min_blocks, tile.k, int(tile.channels_last), int(tile.shift))
              if tile else (0, 1, 1, 1, 1, 1, 0, 0))
    return {f"{prefix}_{field}": value for field, value in zip(WGMMA_FIELDS, values, strict=True)}


def _wgmma_operands(shape: GemmShape, dtype: str) -> GemmShape:
    """The shape a `_wgmma` stage sizes its launch and packed operand by: 16-bit elements multiply as themselves
    there (HALF_MMA_MODE) whichever mode their geometry's GEMMs took, their products being exact either way."""
    return dataclasses.replace(shape, mma=HALF_MMA_MODE) if dtype in HALF_DTYPES else shape


def _wgmma_stage(stage: str, shape: GemmShape, tile: WgmmaTile, launches: dict[str, Launch], splits: dict[str, int],
                 packed_elements: dict[str, int], source_elements: dict[str, int], copied_packs: set[str]) -> None:
    """Launches of a stage that runs its `_wgmma` kernel after its `_wgpack` (16-bit elements: and its `_wgsource`):
    of `shape`, the real batch's (the packed D of the weight gradient has every image); conv-shaped
    stages split nothing. Where the `_wgpack` would only copy its input (copied_packs) it has nothing to do: the
    runtime passes the input in the packed operand's place."""
    launches[stage] = Launch(wgmma_grid(shape, tile), tile.threads, wgmma_block_shared_bytes(shape, tile),
                             kernel=f"{stage}_wgmma")
    if wgmma_pack_copies(shape, tile):
        copied_packs.add(stage)
        launches[f"{stage}_pack"] = Launch(0, kernel=f"{stage}_wgpack")
    else:
        packed_elements[stage] = wgmma_packed_floats(shape, tile)
        launches[f"{stage}_pack"] = Launch(_blocks(wgmma_pack_threads(shape, tile)), kernel=f"{stage}_wgpack")
    if tile.channels_last:
        source_elements[stage] = wgmma_source_floats(shape)
        launches[f"{stage}_wgsource"] = Launch(_blocks(wgmma_source_threads(shape)))
    launches[f"{stage}_reduce"] = _reduce_launch(shape.count, shape.outputs, tile.split)
    splits[stage] = tile.split


def opted_in_shared(geometry_plan: Plan, hardware: Hardware) -> dict[str, int]:
    """Kernel (a stage's own, or the one its launch names) -> the dynamic shared memory it must be allowed
    before it launches: those past the `hardware.shared_per_block` that every kernel may take unasked."""
    return {launch.kernel or stage: launch.shared_bytes for stage, launch in geometry_plan.launches.items()
            if launch.grid and launch.shared_bytes > hardware.shared_per_block}


def _reduce_launch(count: int, outputs: int, split: int) -> Launch:
    """The second pass of a stage split `split` ways over `outputs` outputs of `count` elements: a thread
    per split_sum_vector elements (the contract's rule, split_sum's); none when nothing is split."""
    return Launch(_blocks(outputs * count // split_sum_vector(count)) if count and split > 1 else 0)


def _checked(geom: Geometry, geometry_plan: Plan) -> Plan:
    """The plan, after checking that it sets exactly the defines its source checks for, and that each launch of a
    launch group's member takes BLOCK threads and no dynamic shared memory, as the group's launch does."""
    expected = KERNELS[(geom.family, geom.rank)].defines
    assert tuple(geometry_plan.defines) == expected, (tuple(geometry_plan.defines), expected)
    grouped = {member for members in LAUNCH_GROUPS[geom.family].values() for member in members}
    odd = {stage: launch for stage, launch in geometry_plan.launches.items()
           if launch.grid and (launch.kernel or stage) in grouped and (launch.block, launch.shared_bytes) != (BLOCK, 0)}
    assert not odd, odd
    return geometry_plan


def argmax_dtype(k_size: int) -> str:
    """The narrowest unsigned type that holds every window offset and one spare value (the poison)."""
    return "uint8" if k_size <= 0xFF else "uint16" if k_size <= 0xFFFF else "uint32"


def pool_cells_per_thread(span_last: int, stride_last: int) -> int:
    """Consecutive cells along the last axis that one pool thread owns (POOL_V): 4 while the input
    segment they share stays small, so each loaded value serves several windows. `span_last`: the
    input cells one window spans along the last axis (the kernel extent, dilated)."""
    for v in (4, 2):
        if (v - 1) * stride_last + span_last <= 40:
            return v
    return 1


def _pool_plan(geom: Geometry, values: dict[str, int]) -> Plan:
    k_size = math.prod(geom.kernel)
    dtype = argmax_dtype(k_size)
    v = pool_cells_per_thread(dilated(geom.kernel[-1], geom.dilation[-1]), geom.stride[-1])
    values["POOL_V"] = v
    if geom.family is Family.MAX_POOL:
        values["ARGMAX_BYTES"] = {"uint8": 1, "uint16": 2, "uint32": 4}[dtype]

    def threads(c: int, spatial: tuple[int, ...]) -> int:  # the channels of every image
        return geom.images * c * math.prod(spatial[:-1]) * ceil_div(spatial[-1], v)

    launches = {"forward": Launch(_blocks(threads(geom.out_c, geom.out_spatial))),
                "backward_input": Launch(_blocks(threads(geom.in_c, geom.in_spatial)))}
    return _checked(geom, Plan(values, launches, {}, dtype))


def plan(geom: Geometry, hardware: Hardware = H200, choose_tile: TileChooser = choose_tile,
         dtype: str = "float32", precision: str = "highest", direct_chooser: DirectChooser = choose_direct,
         wgmma_chooser: WgmmaChooser = choose_wgmma) -> Plan:
    """The launch plan of `geom` on `hardware` for elements of `dtype` (the tape's) multiplied in
    `precision` (PRECISIONS), each GEMM stage's tile picked by `choose_tile` among the tiles of that
    precision, and a direct-form stage run by its small-channel direct kernel where `direct_chooser` gives
    it a tile, else (a conv-shaped stage) by its `_wgmma` kernel where `wgmma_chooser` gives it a tile; cached per
    (geometry but β, hardware, choosers, dtype, precision). The defines depend
    on the batch only through batch_bucket; the grids on the batch itself."""
    refusal = precision_refusal(dtype, precision)
    if refusal is not None:
        raise ValueError(f"plan: {refusal}")
    if geom.beta is not None:
        geom = dataclasses.replace(geom, beta=None)
    return _plan(geom, hardware, choose_tile, dtype, _tensor_core_mode(geom, dtype, precision), direct_chooser,
                 wgmma_chooser)


TF32_MMA_MODE = PRECISION_MMA_MODES["medium"]


def stage_mma(shape: GemmShape, mma: int) -> int:
    """The MMA_MODE a GEMM stage of the geometry's mode `mma` multiplies in: FMAs (0) for a conv-shaped stage of fewer
    source channels a group than a TF32 k step, whose tensor-core slices would be mostly zeros (conv2d N32 3->64 224²
    k7 s2 forward on the H200: FMAs 297 µs, TF32 335, 3xTF32 713; the FMAs are at least as accurate), else `mma`."""
    return 0 if mma and shape.conv and shape.source_c < MMA_K else mma


def _tensor_core_mode(geom: Geometry, dtype: str, precision: str) -> int:
    """The MMA_MODE of `geom`'s conv GEMMs: `precision`'s; for 16-bit elements on the tensor cores their
    own m16n8k16 (HALF_MMA_MODE) where every stage's slices are whole k steps of 16 as the TF32 tiles
    cut them, else the TF32 mma on their widened values (exact too). A conv of few channels would stage
    mostly zeros in k steps of 16: on the H200 conv4d 8->8 bf16 took 1.02 against 0.533 ms forward."""
    mma = PRECISION_MMA_MODES[precision]
    if not mma or dtype not in HALF_DTYPES or not geom.family.is_conv:
        return mma
    whole = all(shape.bk % HALF_MMA_K == 0 for shape in gemm_shapes(geom, 4, TF32_MMA_MODE).values()
                if stage_mma(shape, TF32_MMA_MODE))  # the stages on FMAs have no k steps
    return HALF_MMA_MODE if whole else mma


def representative_wgmma_geometry(family: Family, rank: int) -> Geometry:
    """representative_geometry with 32 channels each way and stride 1: the three GEMM stages of a conv family on
    their `_wgmma` kernels in the TF32 modes on the H200 where no direct kernel takes them (convgen compile's pass for
    sm_90 plans it without them: at rank 4 the tensor-core weight tile takes the weight gradient in "medium")."""
    geom = representative_geometry(family, rank)
    return Geometry.build(family, 32, 32, geom.in_spatial, geom.kernel, (1,) * rank, geom.padding)


def representative_geometry(family: Family, rank: int) -> Geometry:
    """A small geometry that exercises every code path of a source: kernel 3 on every axis,
    stride 2 and padding 1 on the even axes, extents 5..7, channels 3 -> 4 (pools: 3)."""
    in_spatial = tuple(5 + axis % 3 for axis in range(rank))
    stride = tuple(2 if axis % 2 == 0 else 1 for axis in range(rank))
    padding = tuple(1 if axis % 2 == 0 else 0 for axis in range(rank))
    out_c = 4 if family.is_conv else 3
    beta = 1.0 if family is Family.SMOOTH_MAX_POOL else None
    return Geometry.build(family, 3, out_c, in_spatial, (3,) * rank, stride, padding, beta)
