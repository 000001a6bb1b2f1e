"""NVRTC check: every generated CUDA source (the family sources and the circular-padding ones)
compiled for a real architecture at a representative geometry of its rank, in each element type
(float32, float64, float16, bfloat16), without a GPU, with each kernel's registers, stack frame and spills read off
ptxas. Backs `convgen compile` and the compile tests. Needs cuda-bindings and the NVRTC wheel (the
`test` extra); `nvrtc()` says so when they are missing.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from convgen.backend import precision_refusal
from convgen.circular import circular_plan, representative_circular_geometry
from convgen.cuda_launch import (
    CUDA_SOURCES,
    ELEMENT_DEFINES,
    H200,
    WGMMA_ARCH,
    nvrtc_options,
    plan,
    representative_geometry,
    representative_wgmma_geometry,
)
from convgen.direct_model import no_direct
from convgen.generated.contract import CIRCULAR_KERNELS, KERNELS
from convgen.geometry import Family, Geometry

DTYPES = tuple(ELEMENT_DEFINES)  # the element types every source compiles in
NVRTC_EXTRA = "pip install 'convgen[test]'"  # cuda-bindings and nvidia-cuda-nvrtc-cu12


class NvrtcMissing(Exception):
    """cuda-bindings or the NVRTC library is not installed."""


class BadArchitecture(ValueError):
    """NVRTC does not know the architecture asked for."""


def nvrtc() -> Any:
    """The NVRTC bindings module; NvrtcMissing, naming the extra to install, without them."""
    try:
        from cuda.bindings import nvrtc as bindings
    except ImportError as error:
        raise NvrtcMissing(f"NVRTC is not installed ({error}); install it with: {NVRTC_EXTRA}") from None
    return bindings


def supported_architectures() -> tuple[str, ...]:
    """`sm_50`, ...: the real architectures this NVRTC compiles for."""
    bindings = nvrtc()
    _, count = bindings.nvrtcGetNumSupportedArchs()
    _, archs = bindings.nvrtcGetSupportedArchs()
    return tuple(f"sm_{arch}" for arch in archs[:count])


def check_architecture(arch: str) -> None:
    """BadArchitecture naming the supported ones unless NVRTC compiles for `arch`."""
    supported = supported_architectures()
    if arch.removesuffix("a").removesuffix("f") not in supported:  # sm_90a: sm_90 with its own features
        raise BadArchitecture(f"unknown architecture {arch!r}; this NVRTC supports {', '.join(supported)}")

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")
# ptxas waits for each wgmma where it cannot keep a group in flight (C7510-C7515, "Potential Performance Loss"): the
# products of consecutive slices no longer overlap, which no result shows.
_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized .* in the function '(\w+)'")


@dataclass(frozen=True, slots=True)
class KernelReport:
    symbol: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    serialized_wgmma: bool = False  # ptxas waits for each of its wgmma (_SERIALIZED)

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


@dataclass(frozen=True, slots=True)
class SourceReport:
    family: Family
    rank: int
    source: str
    dtype: str  # the element type it was compiled for
    precision: str  # how its GEMMs multiply (cuda_launch.PRECISIONS); "highest" for every non-conv source
    error: str | None  # the NVRTC log when compilation failed
    kernels: tuple[KernelReport, ...]
    seconds: float


def parse_ptxas_log(log: str) -> tuple[KernelReport, ...]:
    """The per-kernel resource lines that `--ptxas-options=-v` writes into the NVRTC log, and its notes of
    serialized wgmma (which may come before the kernel's own lines)."""
    serialized = set(_SERIALIZED.findall(log))
    reports, symbol, frame = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            symbol, frame = m.group(1), (0, 0, 0)
        elif m := _FRAME.search(line):
            frame = tuple(int(g) for g in m.groups())
        elif (m := _REGISTERS.search(line)) and symbol is not None:
            reports.append(KernelReport(symbol, int(m.group(1)), *frame, symbol in serialized))
            symbol = None
    return tuple(reports)


def _nvrtc_log(bindings: Any, program: Any) -> str:
    _, size = bindings.nvrtcGetProgramLogSize(program)
    log = b" " * size
    bindings.nvrtcGetProgramLog(program, log)
    return log.decode(errors="replace").rstrip("\x00 \n")


def compile_source(family: Family, rank: int, arch: str, dtype: str = "float32",
                   precision: str = "highest") -> SourceReport:
    """Compile one generated source to a cubin for `arch` (e.g. `sm_90`) at its representative
    geometry, with elements of `dtype` multiplied in `precision`."""
    return compile_plan(representative_geometry(family, rank), arch, dtype, precision)


def compile_plan(geom: Geometry, arch: str, dtype: str = "float32", precision: str = "highest",
                 chooser: Any = None, wgmma_chooser: Any = None, direct_chooser: Any = None) -> SourceReport:
    """Compile the source of `geom` with the defines of its plan for `dtype` and `precision` (tiles
    from `chooser`, by default the tile model's, `_wgmma` tiles from `wgmma_chooser` and direct ones from
    `direct_chooser`, by default convgen.wgmma_tiles' and convgen.direct_model's) to a cubin for `arch`."""
    chosen = {} if chooser is None else {"choose_tile": chooser}
    if wgmma_chooser is not None:
        chosen["wgmma_chooser"] = wgmma_chooser
    if direct_chooser is not None:
        chosen["direct_chooser"] = direct_chooser
    # The H200's plan on sm_90, whose `_wgmma` kernels compile for sm_90a; elsewhere the GEMMs'.
    hardware = H200 if _has_wgmma(arch) else dataclasses.replace(H200, wgmma=False)
    geometry_plan = plan(geom, hardware, dtype=dtype, precision=precision, **chosen)
    options = nvrtc_options(geometry_plan)
    return _compile(geom, KERNELS[(geom.family, geom.rank)].source, options, geometry_plan.arch or arch, dtype,
                    precision)


def _has_wgmma(arch: str) -> bool:
    """Whether `arch` (sm_90 or sm_90a) is the one whose plans run `_wgmma` kernels."""
    return arch.removesuffix("a") == WGMMA_ARCH.removesuffix("a")


def compile_circular(geom: Geometry, arch: str, dtype: str = "float32") -> SourceReport:
    """Compile the circular-padding source of the circular conv `geom` with its plan's defines."""
    return _compile(geom, CIRCULAR_KERNELS[geom.rank].source, circular_plan(geom, dtype).options, arch, dtype)


def _compile(geom: Geometry, source: str, defines: tuple[str, ...], arch: str, dtype: str,
             precision: str = "highest") -> SourceReport:
    family, rank = geom.family, geom.rank
    nvrtc_module = nvrtc()
    code = (CUDA_SOURCES / source).read_bytes()
    options = [f"--gpu-architecture={arch}", "--ptxas-options=-v", *defines]
    start = time.perf_counter()
    _, program = nvrtc_module.nvrtcCreateProgram(code, source.encode(), 0, [], [])
    try:
        (result,) = nvrtc_module.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        log = _nvrtc_log(nvrtc_module, program)
    finally:
        nvrtc_module.nvrtcDestroyProgram(program)
    seconds = time.perf_counter() - start
    if result != nvrtc_module.nvrtcResult.NVRTC_SUCCESS:
        return SourceReport(family, rank, source, dtype, precision, log or str(result), (), seconds)
    return SourceReport(family, rank, source, dtype, precision, None, parse_ptxas_log(log), seconds)


def sources() -> list[tuple[Family, int]]:
    """Every (family, rank) with a generated source, in a stable order."""
    return sorted(KERNELS, key=lambda k: (k[0].value, k[1]))


def source_names() -> list[str]:
    """Every generated source `compile_every_source` compiles, in its order."""
    return [KERNELS[key].source for key in sources()] + [CIRCULAR_KERNELS[rank].source for rank in CIRCULAR_KERNELS]


def compile_every_source(arch: str, dtypes: tuple[str, ...] = DTYPES,
                         precisions: tuple[str, ...] = ("highest",)) -> Iterator[SourceReport]:
    """Per element type, each family source at its representative geometry, then each
    circular-padding source (the family of its report is conv, the op it serves); then, per other
    precision the element type takes, each conv-family source again (the others do not multiply), and on sm_90
    once more at a geometry whose GEMM stages run their `_wgmma` kernels (compiled for sm_90a)."""
    for dtype in dtypes:
        for family, rank in sources():
            yield compile_source(family, rank, arch, dtype)
        for rank in CIRCULAR_KERNELS:
            yield compile_circular(representative_circular_geometry(rank), arch, dtype)
        for precision in precisions:
            if precision == "highest" or precision_refusal(dtype, precision) is not None:
                continue
            for family, rank in sources():
                if family.is_conv:
                    yield compile_source(family, rank, arch, dtype, precision)
                    if _has_wgmma(arch):  # the `_wgmma` kernels too (as their plans without the direct kernels)
                        yield compile_plan(representative_wgmma_geometry(family, rank), arch, dtype, precision,
                                           direct_chooser=no_direct)
