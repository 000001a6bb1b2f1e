"""The kernel contract: the one vocabulary that the CUDA templates, the generated Python and the
runtime's launcher share: here the families, the defines and the constants, in generator/stages.py each
family's kernels and their parameters. The generator owns it; `convgen build` prints it into the CUDA
sources and into generated/contract.py, which is all the runtime reads. Standard library only.
"""

from __future__ import annotations

import enum

MAX_RANK = 8
RANKS = tuple(range(1, MAX_RANK + 1))


class Family(enum.Enum):
    """The kernel families; each has one CUDA source per rank."""

    CONV = "conv"
    CONV_TRANSPOSE = "conv_transpose"
    MAX_POOL = "max_pool"
    AVG_POOL = "avg_pool"
    SMOOTH_MAX_POOL = "smooth_max_pool"

    @property
    def is_conv(self) -> bool:
        """True for the families with a kernel and a bias (parents kernel, bias, input)."""
        return self in (Family.CONV, Family.CONV_TRANSPOSE)


# Defines every source needs, and those of each spatial axis a (IN0, K0, S0, P0, OUT0, D0, ...): D is
# the dilation (SEMANTICS §8), window offset k reads o*S + k*D - P; D = 1 compiles to the undilated code.
# ELEMENT_BYTES and ELEMENT_BF16 pick the element type `real` of the arrays (templates/cuda/common.cuh):
# 4 float, 8 double, 2 float16 (ELEMENT_BF16 0) or bfloat16 (1). The kernels compute in `scalar`: the
# element type itself, or float for the 16-bit ones, whose split buffers and saved sums stay float.
COMMON_DEFINES = ("IN_C", "OUT_C", "BLOCK", "ELEMENT_BYTES", "ELEMENT_BF16")
# Each element type the sources compile in -> its ELEMENT_BYTES and ELEMENT_BF16.
ELEMENT_TYPES: dict[str, tuple[int, int]] = {"float32": (4, 0), "float64": (8, 0), "float16": (2, 0),
                                             "bfloat16": (2, 1)}
AXIS_DEFINES = ("IN", "K", "S", "P", "OUT", "D")
# The conv families' groups (SEMANTICS §8): block-diagonal GEMMs, one per group; 1 compiles to one GEMM.
# MMA_MODE: how the GEMM main loops multiply (docs/DESIGN.md, the tensor-core slice): 0 FMAs in the
# compute type, 1 one TF32 mma.sync per product, 3 three (3xTF32: big*big, big*small, small*big), 2 one
# 16-bit mma.sync (m16n8k16) on float16 or bfloat16 elements staged as they are stored.
# BIAS_SPLIT: the bias gradient's parts per channel (each a run of output cells of every image); above 1,
# backward_bias writes a [BIAS_SPLIT][OUT_C] partial buffer that backward_bias_reduce adds up in order.
BIAS_STAGE, BIAS_PREFIX = "backward_bias", "BIAS"
CONV_DEFINES = ("GROUPS", "MMA_MODE", f"{BIAS_PREFIX}_SPLIT")
# A tape's precision (SEMANTICS §8) -> MMA_MODE. "highest" is the seed's contract: FMAs in the element
# type, the only one a float64 tape takes.
PRECISION_MMA_MODES: dict[str, int] = {"highest": 0, "high": 3, "medium": 1}
# "medium" on float16 and bfloat16 elements: the 16-bit tensor cores, exact products summed in float.
HALF_MMA_MODE = 2
# The implicit-GEMM stages of the conv families, the prefix of their tile defines, and the fields.
GEMM_STAGES: dict[str, str] = {"forward": "FWD", "backward_input": "BWI", "backward_weight": "BWW"}
WEIGHT_STAGE = "backward_weight"
# MIN_BLOCKS: the blocks per SM the kernel's registers are fitted to (__launch_bounds__ where above 1).
# STAGES: the staged slices a block keeps in shared memory; SHARED_BUFFERS staged through registers, more
# a cp.async pipeline of that many (conv-shaped stages in the TF32 modes on float32 elements).
TILE_FIELDS = ("BM", "BN", "BK", "TM", "TN", "SPLIT", "MIN_BLOCKS", "STAGES")
# <PREFIX>_PACKED, a define of the stages that have a `_pack` kernel (every conv-shaped stage): A is read
# from the weight repacked as P[group][k][src channel][dst channel], so a slice's loads are coalesced
# and, with rows in quads, 16 bytes wide (1), or from W itself (0).
PACKED_FIELD = "PACKED"
# The staged GEMM slices in shared memory: STAGES buffers (two, unless a cp.async pipeline) of As[BK][BM + pad]
# and Bs[BK][BN + pad] elements; the pad keeps a warp's column reads off one bank. The formula is printed, with these
# constants, into generated/contract.py (gemm_shared_bytes), which the launcher uses.
SHARED_ROW_PAD = 4
SHARED_BUFFERS = 2
# Past this many bytes of shared memory a block (its slices and valid_rows), the slices are laid out in the launch's
# dynamic shared memory, which a kernel may take beyond 48 KB once it opts in; within it they are static
# arrays, as the kernels were measured with (on the H200 the weight gradient ran 10-30% slower with every
# tile's slices in dynamic shared memory: benchmarks/NOTES.md).
STATIC_SHARED_BYTES = 48 * 1024
# A conv-shaped stage's thread stages BK / ROW_STEP rows of a B column, ROW_STEP apart (ROW_STEP = threads /
# BN). Up to this distance, and on the tensor cores, the rows are read from one pointer per column (the
# kernel's COLUMN_POINTER; one register for all of them, which the tile model counts); farther apart, by
# an index per row (measured: docs/DESIGN.md, the B column pointer).
COLUMN_POINTER_ROW_STEP = 2


# A conv-shaped stage (forward or backward_input) also has a `_direct` kernel: the small-channel direct
# convolution (templates/cuda/_direct_conv.cu.j2), which the plan launches instead of the stage's GEMM
# where <PREFIX>_DIRECT is 1. Its defines: V dst cells a thread owns along the last axis, MB dst channels and
# CB source channels of a block's step, MMA 1 where it multiplies on TF32 tensor cores (then V is the 16-cell tiles
# a warp takes; _direct_mma.cu.j2), SLICES the steps a channel block takes over the first axis's window offsets
# (1: a step stages the whole window; more only on the tensor cores, at rank 2 or more, a divisor of those offsets),
# and per axis a the block's box of dst cells, <PREFIX>_DIRECT_BOX<a>.
DIRECT_FIELDS = ("DIRECT", "DIRECT_V", "DIRECT_MB", "DIRECT_CB", "DIRECT_MMA", "DIRECT_SLICES")
# The switches among the fields: 0 where the GEMM runs (the sizes then 1).
DIRECT_SWITCHES = ("DIRECT", "DIRECT_MMA")
DIRECT_BOX_FIELD = "DIRECT_BOX"
# The weight gradient's `_direct` kernel (templates/cuda/_direct_weight.cu.j2): V cells a thread reads at a time
# along the last axis, LANES threads per (U channel, outer window offsets), CHANNEL_BLOCKS blocks sharing a group's
# U channels (each its own equal share), MMA 1 where it multiplies on TF32 tensor cores (then V is the outer window
# offsets a warp owns; _direct_weight_mma.cu.j2), MIN_BLOCKS the blocks an SM the tensor-core form's registers are
# fitted to (__launch_bounds__ where above 1), and per axis the box of D's cells of a work item; the stage's
# <PREFIX>_SPLIT is then its blocks per group and channel block (partial sums its reduce kernel adds up).
DIRECT_WEIGHT_FIELDS = ("DIRECT", "DIRECT_V", "DIRECT_LANES", "DIRECT_CHANNEL_BLOCKS", "DIRECT_MMA",
                        "DIRECT_MIN_BLOCKS")
# A conv-shaped stage's `_wgmma` kernel (templates/cuda/_wgmma_conv.cu.j2): the TF32 modes on Hopper's
# warpgroup tensor cores (sm_90a), launched instead of the GEMM where <PREFIX>_WGMMA is 1, after its
# `_wgpack` kernel. A block multiplies WG_CELLS dst cells by WG_N dst channels, its slices (WG_K of the reduction:
# blocks of WG_BK source channels at one window offset) WG_STAGES deep in shared memory, WG_MIN_BLOCKS blocks an SM
# asked of ptxas (its registers a thread capped to fit them); with WG_CHANNELS_LAST (16-bit elements) it reads its
# source (the weight gradient's U) as its `_wgsource` kernel laid it out, launched before it; with WG_SHIFT (a
# channels-last conv-shaped stage, stride 1 along the last axis) a slice's staged rows serve every window offset of the
# last axis, its tile cells being positions along rows of the last axis padded by (K - 1) D. WG_NS: the N extents it
# is printed for.
WGMMA_FIELDS = ("WGMMA", "WG_N", "WG_CELLS", "WG_STAGES", "WG_MIN_BLOCKS", "WG_K", "WG_CHANNELS_LAST", "WG_SHIFT")
WG_NS = (32, 64, 128, 256)
WG_BK = 32  # source channels a slice: one swizzled row per dst channel, 128 bytes of TF32 values or 64 of 16-bit
WG_CELL_PAD = 8  # floats after each staged row of dst cells: a fragment's 32 reads hit 32 banks
# The weight gradient's `_wgmma` kernel (templates/cuda/_wgmma_weight.cu.j2) takes the same fields: WG_CELLS are
# then its rows (window offset, U channel) of dW, wgmma's M, and WG_N D's channels; a slice is WG_K cells of D.
WG_ROW_PAD = 4  # floats after each staged row of U's values there: a fragment's 32 reads hit 32 banks
# A split stage's reduce kernel sums four elements a thread where its output (an image's, for the conv-shaped stages)
# is a multiple of four elements and at least this many, else one: 128 blocks of 256 threads, about an H200's SMs.
# A thread per quad of the 36864 of bf16 64->64's dW (52 parts) left 36 blocks to read 7.7 MB, 3.8 us.
SPLIT_SUM_QUAD_COUNT = 4 * 256 * 128
# Bytes: the kernels read and write their arrays in accesses of up to 16 bytes (float4, double2, cp.async), so every
# array they are given starts at a multiple of this.
ARRAY_ALIGNMENT = 16


# <PREFIX>_MMA: how the stage's implicit GEMM multiplies, an MMA_MODE: the geometry's, or FMAs (0) where its tensor
# cores' k steps would mostly multiply zeros (a conv-shaped stage of fewer source channels than a k step).
STAGE_MMA_FIELD = "MMA"
