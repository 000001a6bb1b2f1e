"""Emit, CUDA side: the kernel contract -> the CUDA sources of generated/cuda/ and
generated/contract.py, the contract as the runtime reads it.

Everything the templates print is worked out here, from generator/contract.py and stages.py: each
kernel's parameters, the defines a source checks, the GEMM layout of each conv stage. The Jinja-free CUDA
helpers (templates/cuda/*.cuh) are inlined, so every generated source is one self-contained
NVRTC input.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

import jinja2
from convgen.generator.contract import (
    ARRAY_ALIGNMENT,
    AXIS_DEFINES,
    BIAS_PREFIX,
    BIAS_STAGE,
    COLUMN_POINTER_ROW_STEP,
    COMMON_DEFINES,
    CONV_DEFINES,
    DIRECT_BOX_FIELD,
    DIRECT_FIELDS,
    DIRECT_SWITCHES,
    DIRECT_WEIGHT_FIELDS,
    ELEMENT_TYPES,
    GEMM_STAGES,
    HALF_MMA_MODE,
    MAX_RANK,
    PACKED_FIELD,
    PRECISION_MMA_MODES,
    RANKS,
    SHARED_BUFFERS,
    SHARED_ROW_PAD,
    SPLIT_SUM_QUAD_COUNT,
    STAGE_MMA_FIELD,
    STATIC_SHARED_BYTES,
    TILE_FIELDS,
    WG_BK,
    WG_CELL_PAD,
    WG_NS,
    WG_ROW_PAD,
    WGMMA_FIELDS,
    Family,
)
from convgen.generator.naming import (
    FAMILY_TEMPLATES,
    POOL_MODES,
    circular_source_name,
    circular_symbols,
    source_name,
    symbols,
)
from convgen.generator.stages import (
    CIRCULAR_AXIS_DEFINES,
    CIRCULAR_COMMON_DEFINES,
    CIRCULAR_STAGES,
    FAMILY_STAGES,
    GROUP_PART_PREFIX,
    ConvRow,
    Stage,
    WeightRow,
    direct_defines,
    packed_define,
    pool_defines,
    tile_defines,
    wgmma_defines,
)

LINE_WIDTH = 120  # of the generated CUDA
HELPERS = ("common", "mma", "gemm_tile", "gemm", "direct")  # templates/cuda/<name>.cuh

FAMILY_TITLES: dict[Family, str] = {
    Family.CONV: "Convolution",
    Family.CONV_TRANSPOSE: "Transposed convolution (the adjoint of conv)",
}


def format_each(items: Iterable[object], pattern: str) -> list[str]:
    """Jinja filter: `pattern.format(item)` for every item."""
    return [pattern.format(item) for item in items]


def wrap_terms(terms: Iterable[str], separator: str, continuation: str = " \\", indent: str = "    ",
               start: int = 4) -> str:
    """Jinja filter: the terms joined by `separator` (e.g. " &&"), broken after a separator into
    lines of at most LINE_WIDTH characters; the first line starts at column `start`, the others
    with `indent`, and every line but the last ends with `continuation` (a preprocessor `\\`)."""
    lines: list[str] = []
    line, column = "", start
    for term in terms:
        piece = f"{separator} {term}" if line else term
        if line and column + len(piece) + len(separator) + len(continuation) > LINE_WIDTH:
            lines.append(line + separator + continuation)
            line, column = term, len(indent) + len(term)
            continue
        line += piece
        column += len(piece)
    lines.append(line)
    return f"\n{indent}".join(lines)


def environment(base: jinja2.Environment) -> jinja2.Environment:
    """The shared environment with the printing filters of the CUDA templates."""
    env = base.overlay()
    env.filters.update(format_each=format_each, wrap_terms=wrap_terms)
    return env


def source_defines(family: Family, rank: int) -> tuple[str, ...]:
    """Every -D define a source of `family` and `rank` checks for, in the launcher's order."""
    axes = tuple(f"{name}{axis}" for axis in range(rank) for name in AXIS_DEFINES)
    if family.is_conv:
        extra = (*CONV_DEFINES, *(name for gemm in GEMM_STAGES
                                  for name in (*tile_defines(gemm), packed_define(family, gemm),
                                               *direct_defines(family, gemm, rank),
                                               *wgmma_defines(family, gemm)) if name))
    else:
        extra = pool_defines(family)
    return (*COMMON_DEFINES, *axes, *extra)


def circular_defines(rank: int) -> tuple[str, ...]:
    """Every -D define the circular-padding source of `rank` checks for, in the launcher's order."""
    return (*CIRCULAR_COMMON_DEFINES, *(f"{name}{axis}" for axis in range(rank) for name in CIRCULAR_AXIS_DEFINES))


def _kind(stage: Stage) -> str:
    if stage.members:
        return "group"
    if stage.name.endswith("_pack"):
        return "pack"
    if stage.name.endswith(("_wgmma", "_wgpack", "_wgsource")):
        kind = stage.name.rsplit("_", 1)[1]
        return f"weight_{kind}" if isinstance(stage.layout, WeightRow) else kind
    if stage.name.endswith("_direct"):
        return "weight_direct" if isinstance(stage.layout, WeightRow) else "direct"
    if isinstance(stage.layout, ConvRow):
        return "conv"
    if isinstance(stage.layout, WeightRow):
        return "weight"
    return "reduce" if stage.name.endswith("_reduce") else "bias"


def _reduce_count(family: Family, stage: str) -> str:
    """The element count of a split stage's output (a GEMM stage's, or the bias gradient's), as a CUDA
    expression."""
    if stage == BIAS_STAGE:
        return "OUT_C"
    layout = next(s.layout for s in FAMILY_STAGES[family] if s.name == stage)
    if isinstance(layout, ConvRow):
        return f"{layout.dst_c} * {layout.dst}_SIZE"
    assert isinstance(layout, WeightRow)
    return f"{layout.d_c} * ({layout.u_c} / GROUPS) * K_SIZE"  # dW: [d_c, u_c / groups, *K]


def _group_parts(family: Family, rank: int, group: Stage) -> list[dict[str, object]]:
    """A launch group's members as its kernel calls them: the member's `_blocks` function, the group's parameters
    that are its arguments, and the one holding its block count (contract._group names them)."""
    kernel_symbols = symbols(family, rank)
    parts = []
    for i, member in enumerate(group.members):
        prefix = f"{GROUP_PART_PREFIX}{i}_"
        args = [p.name for p in group.params if p.name.startswith(prefix) and p.name != f"{prefix}blocks"]
        parts.append({"symbol": kernel_symbols[member], "args": args, "blocks": f"{prefix}blocks"})
    return parts


def _kernel_view(family: Family, rank: int, stage: Stage) -> dict[str, object]:
    """What the CUDA templates print for one kernel."""
    gemm = stage.gemm
    split = stage.name.removesuffix("_reduce") if stage.name.endswith("_reduce") else None
    return {
        "symbol": symbols(family, rank)[stage.name],
        "params": [p.declaration for p in stage.params],
        "names": [p.name for p in stage.params],
        "parts": _group_parts(family, rank, stage),
        "summary": textwrap.wrap(stage.summary, LINE_WIDTH - 3, break_on_hyphens=False),
        "kind": _kind(stage),
        "layout": stage.layout,
        "prefix": GEMM_STAGES[gemm] if gemm else BIAS_PREFIX if split == BIAS_STAGE else "",
        "packed_define": (packed_define(family, gemm) if gemm else None) or "",
        "count": _reduce_count(family, split) if split else "",
        "per_image": any(p.role == "images" for p in stage.params),
    }


def _helpers(env: jinja2.Environment) -> dict[str, str]:
    """The text of each templates/cuda/*.cuh, to inline."""
    loader = env.loader
    assert loader is not None
    return {name: loader.get_source(env, f"cuda/{name}.cuh")[0].rstrip() for name in HELPERS}


def render_cuda(env: jinja2.Environment, family: Family, rank: int, header: str) -> str:
    """One CUDA source: every stage of `family`, with the `rank` spatial axes unrolled."""
    env = environment(env)
    kernels = [_kernel_view(family, rank, stage) for stage in FAMILY_STAGES[family]]
    return env.get_template(FAMILY_TEMPLATES[family]).render(
        header=header,
        title=FAMILY_TITLES.get(family, ""),
        mode=POOL_MODES.get(family, ""),
        rank=rank,
        axes=list(range(rank)),
        defines=source_defines(family, rank),
        helpers=_helpers(env),
        shared_row_pad=SHARED_ROW_PAD,
        shared_buffers=SHARED_BUFFERS,
        static_shared_bytes=STATIC_SHARED_BYTES,
        column_pointer_row_step=COLUMN_POINTER_ROW_STEP,
        split_sum_quad_count=SPLIT_SUM_QUAD_COUNT,
        wg_ns=WG_NS,
        wg_bk=WG_BK,
        wg_cell_pad=WG_CELL_PAD,
        wg_row_pad=WG_ROW_PAD,
        kernels=kernels,
        stages={stage.name: view for stage, view in zip(FAMILY_STAGES[family], kernels)},
    )


def render_circular(env: jinja2.Environment, rank: int, header: str) -> str:
    """The circular-padding source of `rank`: its pad and fold kernels (contract.CIRCULAR_STAGES)."""
    env = environment(env)
    symbol = circular_symbols(rank)
    stages = {stage.name: {"symbol": symbol[stage.name], "params": [p.declaration for p in stage.params],
                           "summary": textwrap.wrap(stage.summary, LINE_WIDTH - 3, break_on_hyphens=False)}
              for stage in CIRCULAR_STAGES}
    return env.get_template("cuda/circular.cu.j2").render(
        header=header, rank=rank, axes=list(range(rank)), defines=circular_defines(rank), helpers=_helpers(env),
        stages=stages)


def contract_source(env: jinja2.Environment, families: Iterable[Family], header: str) -> str:
    """generated/contract.py: the vocabulary the runtime launches by."""
    used = sorted(families, key=lambda f: f.value)
    return environment(env).get_template("python/contract.py.j2").render(
        header=header,
        families=list(Family),
        max_rank=MAX_RANK,
        gemm_stages=GEMM_STAGES,
        precision_mma_modes=PRECISION_MMA_MODES,
        half_mma_mode=HALF_MMA_MODE,
        element_types=ELEMENT_TYPES,
        tile_fields=TILE_FIELDS,
        direct_fields=DIRECT_FIELDS,
        direct_switches=DIRECT_SWITCHES,
        direct_weight_fields=DIRECT_WEIGHT_FIELDS,
        wgmma_fields=WGMMA_FIELDS,
        wg_ns=WG_NS,
        wg_bk=WG_BK,
        wg_cell_pad=WG_CELL_PAD,
        wg_row_pad=WG_ROW_PAD,
        array_alignment=ARRAY_ALIGNMENT,
        split_sum_quad_count=SPLIT_SUM_QUAD_COUNT,
        direct_box_field=repr(DIRECT_BOX_FIELD),
        bias_stage=BIAS_STAGE,
        bias_prefix=BIAS_PREFIX,
        packed_field=repr(PACKED_FIELD),
        stage_mma_field=repr(STAGE_MMA_FIELD),
        shared_row_pad=SHARED_ROW_PAD,
        shared_buffers=SHARED_BUFFERS,
        static_shared_bytes=STATIC_SHARED_BYTES,
        column_pointer_row_step=COLUMN_POINTER_ROW_STEP,
        stages={family: FAMILY_STAGES[family] for family in used},
        kernels=[{"family": f, "rank": r, "source": source_name(f, r), "symbols": symbols(f, r),
                  "defines": source_defines(f, r)} for f in used for r in RANKS],
        circular_stages=CIRCULAR_STAGES,
        circular_kernels=[{"rank": r, "source": circular_source_name(r), "symbols": circular_symbols(r),
                           "defines": circular_defines(r)} for r in RANKS if Family.CONV in used],
    )


def cuda_sources(env: jinja2.Environment, families: set[Family], header: str) -> dict[str, str]:
    """`cuda/<family>_r<rank>.cu` for every family in use and every rank, `cuda/circular_r<rank>.cu`
    when conv is in use, and `contract.py`;
    `header` is the generated files' first line (emit.header_line)."""
    files = {
        f"cuda/{source_name(family, rank)}": render_cuda(env, family, rank, header)
        for family in sorted(families, key=lambda f: f.value)
        for rank in RANKS
    }
    if Family.CONV in families:
        files.update({f"cuda/{circular_source_name(rank)}": render_circular(env, rank, header) for rank in RANKS})
    files["contract.py"] = contract_source(env, families, header)
    return files
