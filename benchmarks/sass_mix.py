#!/usr/bin/env python3
"""The static instruction mix of one geometry's kernels: how many SASS instructions each kernel's
main loop issues per multiply-add instruction (FFMA, DFMA, HMMA; HGMMA, Hopper's wgmma). No GPU needed.

The GEMM kernels are issue-bound where the loop's other instructions (address arithmetic, loads,
conversions, checks) crowd out the multiply-adds, so this ratio is a measure that can be taken on any
machine with the CUDA toolkit, before a kernel change is timed on a GPU (benchmarks/tile_sweep.py).
It takes `convgen source`'s arguments, compiles the exact NVRTC input with nvcc for `--arch`, and
disassembles it with cuobjdump and the nvdisasm it runs (not in every toolkit install: `pip download
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` gives them as wheels); what it leaves out is the compile check's
geometry (its stride is not 1 on every axis: pass --stride). A kernel's main loop is the backward branch's body
holding the most multiply-adds, one with tensor-core instructions first. "early loads" counts, of the loop's
global loads (LDG, and cp.async's LDGSTS), those ptxas issued before its first multiply-add: the next slice's loads
are meant to be in flight while the slice multiplies, and a change that leaves the instructions fewer but moves
those loads after the multiply-adds ran slower where few warps share an SM (the FMA weight gradient: docs/DESIGN.md).

    python3 benchmarks/sass_mix.py conv 2 --in-c 128 --out-c 128 --in 128 --kernel 3 --stride 1 --padding 1 \
        --batch 8 [--precision medium] [--arch sm_90a]

The `_wgmma` kernels have a body only in sm_90a builds (`--arch sm_90a`); their loop's HGMMA each multiply a
64-row tile of the warpgroup, so their ratio reads against the HMMA's of mma.sync loops only loosely. For them it
also counts the instructions that write a register an issued HGMMA still reads its A fragment from, before the
WARPGROUP.DEPBAR that waits for it: the PTX ISA leaves that undefined, and neither ptxas's warnings nor the CPU
emulator (which multiplies at once) show it. It must be 0.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MULTIPLY_ADDS = ("FFMA", "DFMA", "HMMA", "HGMMA")
GLOBAL_LOADS = ("LDG", "LDGSTS")  # into registers, or (cp.async) straight into shared memory
TENSOR_CORE = ("HMMA", "HGMMA")
_FUNCTION = re.compile(r"^\s*Function : (\w+)")
_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")
_REGISTERS = re.compile(r"Function properties for (\w+)\n.*\n.*Used (\d+) registers")
_WRITTEN = re.compile(r"^\s*R(\d+)\b")  # a destination register: the first operand (stores start with an address)
# HGMMA's D, A (registers), B descriptor, ... (its opcode as read runs to the shape's first x: "HGMMA.64")
_A_FRAGMENT = re.compile(r"\bR\d+,\s*R(\d+),")
_DEPBAR = re.compile(r"gsb0,\s*0x([0-9a-f]+)")


@dataclass(frozen=True)
class LoopMix:
    """One kernel's main loop: its instructions, the multiply-adds among them, the counts by opcode, and of its
    global loads those issued before its first multiply-add (in flight while it multiplies; ptxas decides)."""

    kernel: str
    instructions: int
    multiply_adds: int
    opcodes: dict[str, int]
    early_loads: int

    @property
    def global_loads(self) -> int:
        return sum(self.opcodes.get(op, 0) for op in GLOBAL_LOADS)

    @property
    def per_multiply_add(self) -> float:
        return self.instructions / self.multiply_adds if self.multiply_adds else float("inf")


def functions(sass: str) -> dict[str, list[tuple[int, str, str]]]:
    """cuobjdump -sass text -> kernel name -> [(address, opcode, operands)] in address order."""
    kernels: dict[str, list[tuple[int, str, str]]] = {}
    current: list[tuple[int, str, str]] | None = None
    for line in sass.splitlines():
        if match := _FUNCTION.match(line):
            current = kernels.setdefault(match.group(1), [])
        elif current is not None and (match := _INSTRUCTION.match(line)):
            current.append((int(match.group(1), 16), match.group(2), match.group(3)))
    return kernels


def main_loop(kernel: str, instructions: list[tuple[int, str, str]]) -> LoopMix | None:
    """The body of the backward branch (a BRA to an earlier address) with the most multiply-adds, a loop
    with tensor-core instructions (HMMA, HGMMA) before any without (a kernel's FMA fallback may issue more FFMAs
    than its mma loop issues HMMAs); None for a kernel without loops."""
    best: tuple[tuple[bool, int], LoopMix] | None = None
    for address, opcode, operands in instructions:
        target = _BRANCH_TARGET.search(operands) if opcode == "BRA" else None
        if target is None or int(target.group(1), 16) >= address:
            continue
        start = int(target.group(1), 16)
        body = [op.split(".")[0] for at, op, _ in instructions if start <= at <= address]
        heavy = sum(op in MULTIPLY_ADDS for op in body)
        rank = (any(op in TENSOR_CORE for op in body), heavy)
        if best is None or rank > best[0]:
            first = next((i for i, op in enumerate(body) if op in MULTIPLY_ADDS), len(body))
            early = sum(op in GLOBAL_LOADS for op in body[:first])
            best = (rank, LoopMix(kernel, len(body), heavy, dict(collections.Counter(body).most_common()), early))
    return best[1] if best else None


def _written_registers(opcode: str, operands: str) -> range:
    """The registers an instruction writes, as far as this check needs: its first operand's, two for 64-bit and
    wide results, four for 128-bit loads; none for stores and others whose first operand is not a register."""
    match = _WRITTEN.match(operands)
    if match is None or opcode.startswith(("ST", "RED", "BAR", "BRA", "HGMMA", "WARPGROUP")):
        return range(0)
    width = 4 if ".128" in opcode else 2 if ".64" in opcode or ".WIDE" in opcode else 1
    return range(int(match.group(1)), int(match.group(1)) + width)


def in_flight_writes(instructions: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The instructions that write one of the four A-fragment registers of an HGMMA after it issues and before a
    WARPGROUP.DEPBAR lets at most as many committed groups run as came after its own (an HGMMA with gsb0 closes a
    group). In address order, as straight-line code: a wait reached only through a back edge is not followed."""
    groups: list[set[int]] = []  # the registers of each committed group still running, oldest first
    open_group: set[int] = set()
    found = []
    for address, opcode, operands in instructions:
        if opcode.startswith("HGMMA"):
            if match := _A_FRAGMENT.search(operands):
                open_group |= set(range(int(match.group(1)), int(match.group(1)) + 4))
            if "gsb0" in operands:
                groups.append(open_group)
                open_group = set()
        elif opcode.startswith("WARPGROUP.DEPBAR"):
            match = _DEPBAR.search(operands)
            keep = int(match.group(1), 16) if match else 0
            groups = groups[len(groups) - keep:] if keep else []
        elif any(r in g for g in (*groups, open_group) for r in _written_registers(opcode, operands)):
            found.append((address, opcode, operands))
    return found


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        sys.exit(f"sass_mix.py: {name} is not on the PATH (the CUDA toolkit's; cuobjdump and the nvdisasm it runs "
                 f"also come as the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels)")
    return path


def main(argv: list[str]) -> int:
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__.strip() + "\n\nThe arguments, but for --arch ARCH (default sm_90), are convgen source's:\n")
        return subprocess.run([tool("convgen"), "source", "--help"]).returncode
    arch = "sm_90"
    if "--arch" in argv:
        at = argv.index("--arch")
        arch, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    nvcc, cuobjdump, convgen = tool("nvcc"), tool("cuobjdump"), tool("convgen")
    tool("nvdisasm")  # cuobjdump -sass runs it
    source = subprocess.run([convgen, "source", *argv], capture_output=True, text=True)
    if source.returncode != 0:
        sys.exit(source.stderr.strip() or source.stdout.strip())
    with tempfile.TemporaryDirectory() as work:
        cu, cubin = Path(work) / "kernels.cu", Path(work) / "kernels.cubin"
        cu.write_text(source.stdout)
        built = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-std=c++17", "-Xptxas", "-v", str(cu), "-o",
                                str(cubin)], capture_output=True, text=True)
        if built.returncode != 0:
            sys.exit(built.stderr)
        dumped = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
        if dumped.returncode != 0:
            sys.exit(f"sass_mix.py: cuobjdump failed: {dumped.stderr.strip() or dumped.stdout.strip()}")
        sass = dumped.stdout
    registers = dict(_REGISTERS.findall(built.stderr))
    print(f"{'kernel':<36}{'registers':>10}{'loop':>7}{'madds':>7}{'per madd':>10}{'early loads':>13}  "
          "top opcodes of the loop")
    kernels = functions(sass)
    for kernel, instructions in sorted(kernels.items()):
        loop = main_loop(kernel, instructions)
        if loop is None or not loop.multiply_adds:
            continue
        top = ", ".join(f"{op} {n}" for op, n in list(loop.opcodes.items())[:8])
        early = f"{loop.early_loads}/{loop.global_loads}"
        print(f"{kernel:<36}{registers.get(kernel, '?'):>10}{loop.instructions:>7}{loop.multiply_adds:>7}"
              f"{loop.per_multiply_add:>10.2f}{early:>13}  {top}")
    for kernel, instructions in sorted(kernels.items()):
        if any(opcode.startswith("HGMMA") for _, opcode, _ in instructions):
            writes = in_flight_writes(instructions)
            first = f" (first at 0x{writes[0][0]:04x}: {writes[0][1]}{writes[0][2]})" if writes else ""
            print(f"{kernel}: {len(writes)} writes of an issued wgmma's A registers before its wait{first}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
