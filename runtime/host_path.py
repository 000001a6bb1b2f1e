"""The CUDA tape's compiled host path: an op call whose arguments the tape accepted before is replayed in C.

For the same arguments an op call checks, plans, allocates and launches the same things every time, and for a tiny
op that Python costs more than the GPU's work (issue 9 asks for at most 15 µs a call on the H200's host). After a
call succeeds on the Python path, `remember` keeps an entry for its arguments: the inputs' recorded shapes, the
forward's launch program (convgen.launch_program) as plain tuples, and the callables that make its outputs and
launch its kernels. The tape's `_apply` is then `convgen._host_path.TapeApply` (runtime/compiled/): a call whose
arguments are an entry's, exactly, has its input nodes checked as tape.py's `_read` checks them, its program
replayed and its node recorded in C; every other call, and any replay that fails on the way, is the Python path's.
Without the extension (`COMPILED` False: it did not build, or CONVGEN_HOST_PATH=python) the tape's `_apply` is the
Python path alone.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from typing import Any

from convgen.checking import plain, validated
from convgen.cuda_kernels import KernelLaunches
from convgen.geometry import Geometry
from convgen.launch_program import Allocation, Launch, Program, Scratch
from convgen.op import OpInfo
from convgen.result import Result

# CONVGEN_HOST_PATH: "python" runs every call on the Python path (to compare, or to debug); "compiled" requires the
# extension (an ImportError without it); unset, the extension where it was built.
_CHOICE = os.environ.get("CONVGEN_HOST_PATH", "")
if _CHOICE not in ("", "python", "compiled"):
    raise ImportError(f"CONVGEN_HOST_PATH must be 'python' or 'compiled', got {_CHOICE!r}")
try:
    from convgen import _host_path
except ImportError:  # built without a C compiler: pip's optional extension was skipped
    if _CHOICE == "compiled":
        raise ImportError("CONVGEN_HOST_PATH=compiled, but convgen._host_path was not built (it needs a C compiler "
                          "when convgen is installed)") from None
    _host_path = None
if _CHOICE == "python":
    _host_path = None

COMPILED = _host_path is not None
# An entry's fields, in the order of runtime/compiled/tape_apply.c's enum.
ENTRY_FIELDS = ("args", "device", "dims", "numels", "reads", "info", "geom", "shape", "name", "program",
                "current_device", "stream")
# A launch program's fields (program_fields), in the order of runtime/compiled/host_path.h's enum.
PROGRAM_FIELDS = ("steps", "returns", "base_size", "base_alloc", "base_free", "address", "launch")
STEP_OUTPUT, STEP_SCRATCH, STEP_LAUNCH, STEP_OUTPUT_LIKE = range(4)
# Per slot and address the C side holds on its stack; a program past them is not replayed.
MAX_SLOTS, MAX_VALUES = 64, 64
# How many entries the cache holds before it starts over, like the validators' cache.
ENTRY_LIMIT = 4096

# What CALLS holds for arguments whose forward is not replayed (_entry): TapeApply takes only a tuple for an entry, and
# `remember` looks no further.
NOT_REPLAYED = False
# backend -> validator -> arguments -> entry; read by TapeApply, written only here.
CALLS: dict[Any, dict[Callable[..., Any], dict[tuple[Any, ...], tuple[Any, ...]]]] = {}
_entries = 0  # in CALLS

if COMPILED and (_host_path.TAPE_ENTRY_FIELDS, _host_path.PROGRAM_FIELDS, _host_path.MAX_SLOTS,
                 _host_path.MAX_VALUES) != (len(ENTRY_FIELDS), len(PROGRAM_FIELDS), MAX_SLOTS, MAX_VALUES):
    raise ImportError("convgen._host_path was built from another version of convgen; reinstall convgen")


def tape_apply(python_apply: Callable[..., Result], node_type: type, record_type: type) -> Any:
    """The CUDA tape's `_apply`: TapeApply over `python_apply` (tape.py's), remembering each call it accepts; where
    the extension is not built, `python_apply` itself."""
    if _host_path is None:
        return python_apply

    def apply_and_remember(tape: Any, info: OpInfo, ids: tuple[Any, ...], check: Callable[..., Any],
                           args: tuple[Any, ...]) -> Result:
        result = python_apply(tape, info, ids, check, args)
        if result.error is None:
            remember(tape._backend, info, check, args)
        return result

    return _host_path.TapeApply(apply_and_remember, CALLS, node_type, record_type, Result)


def remember(backend: Any, info: OpInfo, check: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Keep the entry of an accepted call on `backend` (NOT_REPLAYED where its forward is not one program: _entry),
    unless its arguments are not plain (checking.plain: their types would not key it exactly)."""
    global _entries
    if not plain(args, floats=True):
        return
    device = backend._current_device()
    known = CALLS.get(backend, {}).get(check, {}).get(args)
    if known is NOT_REPLAYED or (known is not None and known[1] == device):
        return  # arguments equal to an entry's but of other types (2 and 2.0) stay on the Python path
    entry = _entry(backend, info, validated(check, args), args, device)
    if _entries >= ENTRY_LIMIT:
        CALLS.clear()
        _entries = 0
    CALLS.setdefault(backend, {}).setdefault(check, {})[args] = NOT_REPLAYED if entry is None else entry
    _entries += 1


def program_fields(program: Program, inputs: int, step_of: Callable[[Allocation | Scratch], tuple[Any, ...]],
                   base: tuple[int, Any, Any], address: Any, launch: Any) -> tuple[Any, ...] | None:
    """`program` as runtime/compiled/program.c replays it, in the order of PROGRAM_FIELDS (None where it is past
    what the C side holds): each launch with its constants as bytes and its holes flat, each output or scratch as
    `step_of` gives it ((kind, make, args, kwargs) or (STEP_OUTPUT_LIKE, make, input index)); `base` the scratch
    base's (size, alloc, free: None where the allocation is given back when dropped), `address` the reader of what
    the steps make (None: CuPy's `.data.ptr` and `.ptr`), `launch` the driver's launch."""
    made = sum(type(step) is not Launch for step in program.steps)
    if inputs + 1 + made > MAX_VALUES or any(
            type(step) is Launch and len(step.constants) > MAX_SLOTS for step in program.steps):
        return None
    steps = tuple((STEP_LAUNCH, step.function, step.grid[0], step.block[0], step.shared_bytes, step.constants.tobytes(),
                   tuple(itertools.chain.from_iterable(step.holes))) if type(step) is Launch else step_of(step)
                  for step in program.steps)
    return (steps, program.returns, *base, address, launch)


def _entry(backend: Any, info: OpInfo, geom: Geometry, args: tuple[Any, ...], device: int) -> tuple[Any, ...] | None:
    """The entry of `geom`'s forward on `backend`, in the order of ENTRY_FIELDS; None where the forward is not one
    program (nothing to compute; a circular conv's wrap before it), the backend launches its own way, or the program
    is past what the C side holds."""
    from convgen.cuda import CupyBackend  # which imports this module

    if (not geom.output_numel or (geom.circular and any(geom.padding))
            or type(backend)._call is not KernelLaunches._call):
        return None
    compiled = backend._compile(geom)
    if compiled.is_conv:  # the op takes (weight, bias, x), the pass (x, weight, bias)
        program: Program = backend._program(compiled, "forward", "conv_forward")
        base_size, reads = compiled.forward_scratch.size, (2, 0, 1)
    else:
        program = backend._program(compiled, "forward", "pool_forward")
        base_size, reads = 0, (0,)
    kind = type(backend)
    direct = (not backend.poison_outputs and kind._output is CupyBackend._output
              and kind._scratch is CupyBackend._scratch)
    cupy = backend._xp
    scratch = cupy.cuda.alloc if direct else (lambda size: backend._scratch((size,), "uint8"))
    fields = program_fields(program, len(reads), lambda step: _step(backend, step, direct), (base_size, scratch, None),
                            None, backend._launch_kernel)
    if fields is None:
        return None
    stream = (cupy.cuda.get_current_stream if kind._stream_pointer is CupyBackend._stream_pointer
              else backend._stream_pointer)
    numels = tuple(math.prod(shape) for shape in geom.parent_shapes)
    return (args, device, geom.parent_shapes, numels, reads, info, geom, geom.output_shape, info.name, fields,
            backend._current_device, stream)


def _step(backend: Any, step: Allocation | Scratch, direct: bool) -> tuple[Any, ...]:
    """An output or scratch step as the C side reads it: the callable that makes it and its arguments, CuPy's own
    where the backend's method only calls it (`direct`), else that method."""
    from convgen.cuda import _ITEMSIZES, STORAGE_DTYPES  # which imports this module

    dtype = backend.dtype if step.dtype is None else step.dtype
    cupy = backend._xp
    if type(step) is Scratch:
        if direct:
            return STEP_SCRATCH, cupy.cuda.alloc, (math.prod(step.shape) * _ITEMSIZES[dtype],), None
        return STEP_SCRATCH, backend._scratch, (step.shape, dtype), None
    if direct:
        return STEP_OUTPUT, cupy.ndarray, (step.shape, STORAGE_DTYPES[dtype]), None
    return STEP_OUTPUT, backend._output, (step.shape, dtype), None
