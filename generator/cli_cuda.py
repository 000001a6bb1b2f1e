"""The CUDA commands of `convgen` (application layer, so it may use the runtime): `compile`, NVRTC
over every generated source, and `source`, the exact NVRTC input of one op and geometry as a
standalone .cu file.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import click
from convgen.backend import precision_refusal
from convgen.cuda_launch import CUDA_SOURCES, ELEMENT_DEFINES, NVRTC_OPTIONS, plan, representative_geometry
from convgen.generated.contract import KERNELS
from convgen.geometry import Family, Geometry


def _usage_error(message: str) -> None:
    click.echo(f"convgen compile: {message}", err=True)
    sys.exit(2)


def compile_sources(arch: str, dtype: str, precisions: tuple[str, ...] = ("highest",)) -> None:
    """`convgen compile`: every source in the element type `dtype` (`all`: in each), and the conv
    sources again in each tensor-core precision of `precisions` that the element type takes, one line
    per kernel as it is compiled, then the total."""
    from convgen import nvrtc_check

    try:
        nvrtc_check.check_architecture(arch)
    except (nvrtc_check.NvrtcMissing, nvrtc_check.BadArchitecture) as error:
        _usage_error(str(error))
    dtypes = tuple(ELEMENT_DEFINES) if dtype == "all" else (dtype,)
    compiles = failed = spilled = 0
    start = time.perf_counter()
    for report in nvrtc_check.compile_every_source(arch, dtypes, precisions):
        compiles += 1
        mode = report.dtype if report.precision == "highest" else f"{report.dtype}/{report.precision}"
        if report.error is not None:
            failed += 1
            click.echo(f"FAIL {report.source} ({mode})\n{report.error}")
            continue
        for kernel in report.kernels:
            spilled += kernel.spills
            mark = ("  SPILLS" if kernel.spills else "") + ("  WGMMA SERIALIZED" if kernel.serialized_wgmma else "")
            click.echo(f"{kernel.symbol:<44} {mode:<14} {kernel.registers:>3} regs  {kernel.stack_bytes:>5} B "
                       f"stack  {kernel.spill_store_bytes:>4}/{kernel.spill_load_bytes:<4} B spill st/ld{mark}")
        sys.stdout.flush()
    seconds = time.perf_counter() - start
    click.echo(f"{compiles - failed}/{compiles} sources compiled ({', '.join(dtypes)}; {', '.join(precisions)}) "
               f"for {arch} in {seconds:.1f} s; "
               f"{failed} failed; {spilled} kernels spill")
    if failed:
        sys.exit(1)


def _axes(option: str, text: str | None, rank: int, default: tuple[int, ...]) -> tuple[int, ...]:
    """`5x6` -> (5, 6); one number stands for every axis."""
    if text is None:
        return default
    try:
        values = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not N or NxNx... (integers)", param_hint=option) from None
    if len(values) == 1:
        values *= rank
    if len(values) != rank or min(values) < 0:
        raise click.BadParameter(f"{text!r} needs {rank} non-negative extents (rank {rank})", param_hint=option)
    return values


def source_text(geom: Geometry, dtype: str = "float32", precision: str = "highest") -> str:
    """The generated source of `geom` with the plan's defines for `dtype` and `precision` prepended,
    and how to compile it."""
    entry = KERNELS[(geom.family, geom.rank)]
    geometry_plan = plan(geom, dtype=dtype, precision=precision)
    defines = geometry_plan.defines
    stem = entry.source.removesuffix(".cu")
    # A plan with `_wgmma` kernels compiles for sm_90a (nvcc's -gencode form: its -arch=sm_90a also runs sm_90).
    target = "-gencode=arch=compute_90a,code=sm_90a" if geometry_plan.arch else "-arch=sm_90"
    lines = [
        f"// {entry.source} specialised by `convgen source` for {geom.family.value} ({dtype}): in_c {geom.in_c}, "
        f"out_c {geom.out_c}, batch {geom.batch}, groups {geom.groups},",
        f"// input {geom.in_spatial}, kernel {geom.kernel}, stride {geom.stride}, padding {geom.padding}, "
        f"dilation {geom.dilation}.",
        f"// NVRTC options: {' '.join(NVRTC_OPTIONS)} plus the defines below; compile outside Python with",
        f"// nvcc {' '.join(NVRTC_OPTIONS)} {target} -cubin -o {stem}.cubin {stem}_specialised.cu",
        *(f"#define {name} {value}" for name, value in defines.items()),
        "",
    ]
    return "\n".join(lines) + (CUDA_SOURCES / entry.source).read_text(encoding="utf-8")


@dataclass(frozen=True)
class SourceAxes:
    """The per-axis options of `convgen source` as given (None: the compile check's geometry's)."""

    spatial: str | None
    kernel: str | None
    stride: str | None
    padding: str | None
    dilation: str | None


def print_source(family: str, rank: int, in_c: int | None, out_c: int | None, axes: SourceAxes, groups: int,
                 batch: int | None, dtype: str, precision: str = "highest") -> None:
    """`convgen source`: the NVRTC input of one geometry (defaults: the compile check's)."""
    default = representative_geometry(Family(family), rank)
    in_c = default.in_c if in_c is None else in_c
    out_c = in_c if not default.family.is_conv else default.out_c if out_c is None else out_c
    if groups > 1 and (not default.family.is_conv or in_c % groups or out_c % groups):
        raise click.UsageError(f"convgen source: groups={groups} needs a conv family whose in_c ({in_c}) and "
                               f"out_c ({out_c}) it divides")
    geom = Geometry.build(default.family, in_c, out_c, _axes("--in", axes.spatial, rank, default.in_spatial),
                          _axes("--kernel", axes.kernel, rank, default.kernel),
                          _axes("--stride", axes.stride, rank, default.stride),
                          _axes("--padding", axes.padding, rank, default.padding), default.beta, batch=batch,
                          dilation=_axes("--dilation", axes.dilation, rank, default.dilation), groups=groups)
    if min(geom.out_spatial) <= 0 or min(geom.kernel) <= 0 or min(geom.stride) <= 0 or min(geom.dilation) <= 0:
        raise click.UsageError(f"convgen source: geometry gives output extents {geom.out_spatial}; "
                               "kernel, stride and dilation must be positive and the output non-empty")
    refusal = precision_refusal(dtype, precision)
    if refusal is not None:
        raise click.UsageError(f"convgen source: {refusal}")
    click.echo(source_text(geom, dtype, precision), nl=False)
