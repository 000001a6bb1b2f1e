"""NVRTC check: every generated CUDA source compiled for a real architecture at a representative
geometry of its rank, without a GPU, with each kernel's registers, stack frame and spills read
off ptxas. Backs `convgen compile` and the compile tests.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from convgen.cuda_launch import NVRTC_OPTIONS, defines, representative_geometry
from convgen.generated.kernels import KERNELS
from convgen.geometry import Family

GENERATED_CUDA = Path(__file__).resolve().parent.parent / "generated" / "cuda"

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


@dataclass(frozen=True, slots=True)
class KernelReport:
    symbol: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


@dataclass(frozen=True, slots=True)
class SourceReport:
    family: Family
    rank: int
    source: str
    error: str | None  # the NVRTC log when compilation failed
    kernels: tuple[KernelReport, ...]
    seconds: float


def parse_ptxas_log(log: str) -> tuple[KernelReport, ...]:
    """The per-kernel resource lines that `--ptxas-options=-v` writes into the NVRTC log."""
    reports, symbol, frame = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            symbol, frame = m.group(1), (0, 0, 0)
        elif m := _FRAME.search(line):
            frame = tuple(int(g) for g in m.groups())
        elif (m := _REGISTERS.search(line)) and symbol is not None:
            reports.append(KernelReport(symbol, int(m.group(1)), *frame))
            symbol = None
    return tuple(reports)


def _nvrtc_log(nvrtc, program) -> str:
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(program, log)
    return log.decode(errors="replace").rstrip("\x00 \n")


def compile_source(family: Family, rank: int, arch: str) -> SourceReport:
    """Compile one generated source to a cubin for `arch` (e.g. `sm_90`)."""
    from cuda.bindings import nvrtc  # an optional dependency (`pip install convgen[test]`)

    kernels = KERNELS[(family, rank)]
    code = (GENERATED_CUDA / kernels.source).read_bytes()
    options = [f"--gpu-architecture={arch}", "--ptxas-options=-v", *NVRTC_OPTIONS,
               *defines(representative_geometry(family, rank))]
    start = time.perf_counter()
    _, program = nvrtc.nvrtcCreateProgram(code, kernels.source.encode(), 0, [], [])
    try:
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        log = _nvrtc_log(nvrtc, program)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    seconds = time.perf_counter() - start
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return SourceReport(family, rank, kernels.source, log or str(result), (), seconds)
    return SourceReport(family, rank, kernels.source, None, parse_ptxas_log(log), seconds)


def compile_all(arch: str) -> list[SourceReport]:
    return [compile_source(family, rank, arch) for family, rank in sorted(KERNELS, key=lambda k: (k[0].value, k[1]))]
