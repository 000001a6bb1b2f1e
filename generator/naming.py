"""Kernel naming: the one place that turns (family, rank, stage) into the CUDA source's file name,
its `extern "C"` symbols and the test ids. Nothing parses these names back.
"""

from __future__ import annotations

from convgen.generator.contract import MAX_RANK, RANKS, Family
from convgen.generator.stages import CIRCULAR_STAGES, CIRCULAR_STEM, FAMILY_STAGES

# Which template renders each family: the conv families share one, fed by their stages' rows; the
# pooling families another, told apart by `mode`.
FAMILY_TEMPLATES: dict[Family, str] = {
    Family.CONV: "cuda/conv.cu.j2",
    Family.CONV_TRANSPOSE: "cuda/conv.cu.j2",
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
    return _base(family.value, rank)


def _base(stem: str, rank: int) -> str:
    if rank not in RANKS:
        raise ValueError(f"rank {rank} outside 1..{MAX_RANK}")
    return f"{stem}_r{rank}"


def source_name(family: Family, rank: int) -> str:
    return f"{kernel_base(family, rank)}.cu"


def symbols(family: Family, rank: int) -> dict[str, str]:
    """Stage -> symbol for one source, in stage order."""
    return {stage.name: f"{kernel_base(family, rank)}_{stage.name}" for stage in FAMILY_STAGES[family]}


def circular_source_name(rank: int) -> str:
    """`circular_r4.cu`: the pad and fold kernels of circular padding at one rank."""
    return f"{_base(CIRCULAR_STEM, rank)}.cu"


def circular_symbols(rank: int) -> dict[str, str]:
    """Stage -> symbol of the circular-padding source of `rank`, in stage order."""
    return {stage.name: f"{_base(CIRCULAR_STEM, rank)}_{stage.name}" for stage in CIRCULAR_STAGES}
