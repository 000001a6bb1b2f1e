"""convgen.torch's compiled host path: an eager op call on CUDA tensors whose arguments an earlier call had is replayed
in C.

For the same tensor shapes, dtype, device and arguments, an eager call checks, plans, allocates and launches the same
things every time, and in Python that costs more host time than the CUDA tape's call (whose own compiled path is
convgen.host_path): on a batched conv, tens of µs before its first kernel reaches the GPU. After a call on CUDA
tensors succeeds on the Python path, `remember` keeps an entry for its arguments: the tensors' shapes, the first one's
dtype and device index and the other arguments as given (the key), the precision it ran in, the forward's launch
program (convgen.launch_program) with torch's allocators, and how to attach the backward (functional.py's _Eager).
Each functional op in eager mode is then `convgen._host_path.EagerCall` (runtime/compiled/eager_call.c): a call whose
key is an entry's, exactly, on tensors the program reads as they are (that dtype and device, strided, contiguous,
aligned), outside torch.func transforms and autocast, with torch's precision setting and current device as they
were, is replayed there; every other call, and any replay that fails on the way, is the Python path's. Each family's
backward is replayed the same way (`backward_call`, `remember_backward`). Without the extension
(CONVGEN_HOST_PATH=python, or not built) the ops are the Python path alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from convgen import host_path as compiled_paths
from convgen.checking import plain
from convgen.cuda_kernels import KernelLaunches
from convgen.generated.contract import ARRAY_ALIGNMENT
from convgen.geometry import Family, Geometry
from convgen.launch_program import Allocation, Scratch
from convgen.torch import devices

# An entry's fields, in the order of runtime/compiled/eager_call.c's enum.
ENTRY_FIELDS = ("key", "dtypes", "device", "current", "current_device", "stream", "precision", "fixed", "reads",
                "program", "apply_head", "order")
COMPILED = compiled_paths.COMPILED
if COMPILED and compiled_paths._host_path.EAGER_ENTRY_FIELDS != len(ENTRY_FIELDS):
    raise ImportError("convgen._host_path was built from another version of convgen; reinstall convgen")

# What CALLS holds for a key whose forward is not replayed: EagerCall takes only a tuple for an entry.
NOT_REPLAYED = False
# op -> key -> entry; each op's dict is the one its EagerCall reads, emptied (never replaced) at ENTRY_LIMIT.
CALLS: dict[str, dict[tuple[Any, ...], Any]] = {}
ENTRY_LIMIT = 4096
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
# Where the functional ops' tensors go in the backend's order (functional._run_eager's), by how many the op takes.
_BACKEND_ORDER = {3: (1, 2, 0), 1: (0,)}


def eager_call(op: str, python_call: Callable[..., torch.Tensor], tensors: int, arguments: int, conv: bool,
               transforms_active: Callable[[], bool], autocast_active: Callable[[], bool],
               precision_of: Callable[[torch.dtype], str], apply: Callable[..., torch.Tensor]) -> Any:
    """The eager call of `op`, which takes `arguments` positional arguments, its `tensors` tensors first:
    EagerCall over `python_call` (which remembers what it accepts), or `python_call` itself without the extension. A
    `conv` family's calls depend on autocast and torch's precision setting, a pool's on neither."""
    if not COMPILED:
        return python_call
    return compiled_paths._host_path.EagerCall(
        python_call, CALLS.setdefault(op, {}), tensors, arguments, arguments, _TENSOR_TYPES, torch.strided,
        ARRAY_ALIGNMENT, transforms_active, autocast_active if conv else None, precision_of if conv else None,
        torch.is_grad_enabled, apply)


def backward_name(family: Family) -> str:
    """CALLS's name for the backward of `family`'s ops (the conv families share one)."""
    return "conv backward" if family.is_conv else f"{family.value} backward"


def backward_call(family: Family, python_call: Callable[..., tuple[torch.Tensor | None, ...]], tensors: int,
                  keyed: int, arguments: int) -> Any:
    """The backward of `family`'s ops, called with `arguments` positional arguments: its `tensors` tensors (the
    upstream gradient first), the geometry and the rest (what the backward reads, the first `keyed` arguments
    together, keys it), and returning the gradients in the backend's order (None where not wanted): EagerCall over
    `python_call` (which remembers what it ran), or `python_call` itself without the extension."""
    if not COMPILED:
        return python_call
    return compiled_paths._host_path.EagerCall(
        python_call, CALLS.setdefault(backward_name(family), {}), tensors, arguments, keyed, _TENSOR_TYPES,
        torch.strided, ARRAY_ALIGNMENT, None, None, None, torch.is_grad_enabled, None)


def remember(op: str, given: tuple[Any, ...], tensors: int, geom: Geometry, precision: str,
             ran: tuple[torch.Tensor | None, ...]) -> None:
    """Keep the entry of an eager call that succeeded: `given` its arguments as the user gave them (tensors first),
    `ran` the tensors the device code ran on, in the backend's order. Nothing is kept where the call ran on other
    tensors than it was given (autocast's casts), on the CPU, or with arguments that would not key it exactly
    (checking.plain)."""
    if not COMPILED:
        return
    user = given[:tensors]
    if any(ran[position] is not user[index] for position, index in enumerate(_BACKEND_ORDER[tensors])):
        return
    x = user[0]
    runner = devices._runner(x)
    if not isinstance(runner, devices._CudaRunner) or not plain(given[tensors:], floats=True):
        return
    key = (*(None if t is None else t.shape for t in user), x.dtype, x.get_device(), *given[tensors:])
    calls = CALLS.setdefault(op, {})
    known = calls.get(key)
    if known is not None:  # arguments equal to an entry's but of other types (2 and 2.0) stay on the Python path
        return
    if runner._current_device() != x.device.index or (
            tensors == 3 and user[2] is None and (geom.out_c, x.dtype, x.device) not in devices._ZERO_BIASES):
        return  # for now: ran under another current device, or its zeros were made during a graph capture, not kept
    entry = _entry(op, runner, key, user, geom, precision)
    if sum(map(len, CALLS.values())) >= ENTRY_LIMIT:
        clear()
    calls[key] = NOT_REPLAYED if entry is None else entry


def remember_backward(tensors: tuple[torch.Tensor, ...], geom: Geometry, keyed: tuple[Any, ...], precision: str,
                      wanted: tuple[bool, ...]) -> None:
    """Keep the entry of a backward that succeeded on the Python path, keyed as backward_call keys it: `tensors` the
    call's (the upstream gradient, the op's input, then a conv's weight or what a pool's forward kept), `keyed` its
    keyed arguments after the geometry. The geometry is keyed as the object it is (the C side compares it by
    identity): one equal to an entry's but another object (made again after the functional ops' geometry memo started
    over) replaces that entry."""
    grad = tensors[0]
    if not COMPILED or not isinstance(runner := devices._runner(grad), devices._CudaRunner):
        return
    key = (*(t.shape for t in tensors), grad.dtype, grad.get_device(), geom, *keyed)
    calls = CALLS.setdefault(backward_name(geom.family), {})
    known = calls.get(key)
    if known is NOT_REPLAYED or (known is not None and known[0][len(tensors) + 2] is geom):
        return  # a call the entry does not take (an upstream gradient not contiguous): no entry to make again
    if runner._current_device() != grad.device.index or not geom.output_numel or (geom.circular and any(geom.padding)):
        return
    backend = runner._backend(grad, precision)
    if _launches_its_own_way(backend):
        return
    compiled = backend._compile(geom)
    # The call takes (grad, x, ...); a conv's pass reads (x, weight, grad), a pool's (x, grad, *kept). It returns the
    # gradients and attaches none.
    if compiled.is_conv:
        program = backend._program(compiled, ("backward", *wanted), "conv_backward", wanted)
        base_size, reads = compiled.backward_scratch[wanted].size, (1, 2, 0)
    else:
        program = backend._program(compiled, "backward", "pool_backward")
        base_size, reads = 0, (1, 0, *range(2, len(tensors)))
    entry = _program_entry(runner, backend, key, tensors, precision, program, base_size, reads, (), (None, ()))
    if sum(map(len, CALLS.values())) >= ENTRY_LIMIT:
        clear()
    calls[key] = NOT_REPLAYED if entry is None else entry


def _launches_its_own_way(backend: Any) -> bool:
    """Whether `backend` makes its buffers or launches otherwise than _TorchCupyBackend (a test's or benchmark's
    subclass): the entries make and launch as that class does."""
    kind = type(backend)
    return kind._call is not KernelLaunches._call or any(
        getattr(kind, name) is not getattr(devices._TorchCupyBackend, name)
        for name in ("_output", "_output_like", "_scratch", "_scratch_base"))


def _entry(op: str, runner: Any, key: tuple[Any, ...], user: tuple[torch.Tensor | None, ...], geom: Geometry,
           precision: str) -> tuple[Any, ...] | None:
    """The entry of `geom`'s forward on `runner`'s backend, in the order of ENTRY_FIELDS; None where the forward is
    not one program (nothing to compute; a circular conv's wrap first), the backend makes or launches its own way, or
    the program is past what the C side holds."""
    x = user[0]
    backend = runner._backend(x, precision)
    if not geom.output_numel or (geom.circular and any(geom.padding)) or _launches_its_own_way(backend):
        return None
    fixed = (devices._ZERO_BIASES[(geom.out_c, x.dtype, x.device)],) if len(user) == 3 and user[2] is None else ()
    # The pass reads the op's tensors in its own order (a conv's (x, weight, bias)); a missing bias is the first fixed
    # tensor, the one after the op's.
    reads = tuple(len(user) if tensor is None else index for index, tensor in enumerate(user))
    compiled = backend._compile(geom)
    if compiled.is_conv:
        program = backend._program(compiled, "forward", "conv_forward")
        base_size = compiled.forward_scratch.size
    else:
        program = backend._program(compiled, "forward", "pool_forward")
        base_size = 0
    return _program_entry(runner, backend, key, user, precision, program, base_size, reads, fixed,
                          ((op, geom, precision), _BACKEND_ORDER[len(user)]))


def _program_entry(runner: Any, backend: Any, key: tuple[Any, ...], tensors: tuple[torch.Tensor | None, ...],
                   precision: str, program: Any, base_size: int, reads: tuple[int, ...],
                   fixed: tuple[torch.Tensor, ...], attach: tuple[Any, Any]) -> tuple[Any, ...] | None:
    """An entry in the order of ENTRY_FIELDS for `program` run by `backend` on the call's `tensors` (each later call's
    of the same dtype, None where it has none; all on the first one's device), or None where the program is past
    what the C side holds: `attach` the apply head and backend order of a forward's backward, (None, ()) for a
    backward's own entry."""
    tensor = tensors[0]
    dtypes = tuple(None if t is None else t.dtype for t in tensors)
    placement = {"device": tensor.device}
    fields = compiled_paths.program_fields(program, len(reads), lambda step: _step(backend, step, placement),
                                           (base_size, backend._allocate, backend._free), torch.Tensor.data_ptr,
                                           backend._launch_kernel)
    if fields is None:
        return None
    return (key, dtypes, tensor.get_device(), tensor.device.index, runner._current_device,
            runner._current_stream, precision, fixed, reads, fields, *attach)


def _step(backend: Any, step: Allocation | Scratch, placement: dict[str, Any]) -> tuple[Any, ...]:
    """An output or scratch step as the C side makes it, as _TorchCupyBackend's _output, _output_like and _scratch
    make them: like an input (torch.empty_like), or torch.empty of its shape and dtype on the call's device."""
    if type(step) is Allocation and step.like is not None:
        return compiled_paths.STEP_OUTPUT_LIKE, torch.empty_like, step.like
    dtype = devices._TORCH_DTYPES[backend.dtype if step.dtype is None else step.dtype]
    kind = compiled_paths.STEP_SCRATCH if type(step) is Scratch else compiled_paths.STEP_OUTPUT
    return kind, torch.empty, (step.shape,), {"dtype": dtype, **placement}


def clear() -> None:
    """Forget every entry (each op's dict stays the one its EagerCall reads)."""
    for by_key in CALLS.values():
        by_key.clear()

