"""Kernel naming: the one place that turns (family, rank, stage) into the CUDA source's file name,
its `extern "C"` symbols and the test ids. Nothing parses these names back.
"""

from __future__ import annotations

from convgen.geometry import MAX_RANK, Family

RANKS = tuple(range(1, MAX_RANK + 1))

# The kernels each family's source defines, in launch order of a forward then a backward pass.
FAMILY_STAGES: dict[Family, tuple[str, ...]] = {
    # Each implicit-GEMM stage may be split over blocks along its reduction; its `*_reduce` kernel
    # then adds the partial results in a fixed order (launched only when the plan splits).
    Family.CONV: ("forward", "forward_reduce", "backward_input", "backward_input_reduce", "backward_weight",
                  "backward_weight_reduce", "backward_bias"),
    Family.CONV_TRANSPOSE: ("forward", "forward_reduce", "backward_input", "backward_input_reduce",
                            "backward_weight", "backward_weight_reduce", "backward_bias"),
    Family.MAX_POOL: ("forward", "backward_input"),
    Family.AVG_POOL: ("forward", "backward_input"),
    Family.SMOOTH_MAX_POOL: ("forward", "backward_input"),
}

# Which template renders each family; the pooling families share one, told apart by `mode`.
FAMILY_TEMPLATES: dict[Family, str] = {
    Family.CONV: "cuda/conv.cu.j2",
    Family.CONV_TRANSPOSE: "cuda/conv_transpose.cu.j2",
    Family.MAX_POOL: "cuda/pool.cu.j2",
    Family.AVG_POOL: "cuda/pool.cu.j2",
    Family.SMOOTH_MAX_POOL: "cuda/pool.cu.j2",
}

POOL_MODES: dict[Family, str] = {
    Family.MAX_POOL: "max",
    Family.AVG_POOL: "avg",
    Family.SMOOTH_MAX_POOL: "smooth_max",
}


def kernel_base(family: Family, rank: int) -> str:
    """`conv_r4`: the stem of the source file and of every symbol in it."""
    if rank not in RANKS:
        raise ValueError(f"rank {rank} outside 1..{MAX_RANK}")
    return f"{family.value}_r{rank}"


def source_name(family: Family, rank: int) -> str:
    return f"{kernel_base(family, rank)}.cu"


def kernel_name(family: Family, rank: int, stage: str) -> str:
    """`conv_r4_backward_weight`: the extern "C" symbol of one kernel."""
    if stage not in FAMILY_STAGES[family]:
        raise ValueError(f"{family.value} has no stage {stage!r}")
    return f"{kernel_base(family, rank)}_{stage}"


def symbols(family: Family, rank: int) -> dict[str, str]:
    """Stage -> symbol for one source, in stage order."""
    return {stage: kernel_name(family, rank, stage) for stage in FAMILY_STAGES[family]}
