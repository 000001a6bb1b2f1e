"""Running one op family's forward or backward on torch tensors, given its validated `Geometry`.

CPU tensors run on convgen.cpu's NumPy backend (zero copy both ways: `.numpy()` and
`torch.from_numpy`). CUDA tensors run on convgen.cuda's CuPy backend, with everything on torch's side:
the kernels launch on `torch.cuda.current_stream()` of the tensor's device, under that device, and
every output and scratch buffer (split partials, the circular pad, the packed weight) comes from torch's
caching allocator, a conv pass's scratch as a bare block (no tensor made). The tensors are never wrapped
as CuPy arrays: the kernels get their raw pointers, which makes no CUDA call (safe under graph capture)
and keeps a tiny op's host cost down. CuPy is imported only when a CUDA tensor comes in.

Tensors in and out are in the backend's order: conv families (weight, bias, input), pools (input,);
`forward` returns (output, *saved) with the saved state backward needs (max pool: the argmax offsets;
smooth max: pivots and sums), `backward` one gradient per input. `precision` (convgen.backend.PRECISIONS,
chosen by convgen.torch.precision) is how the conv families multiply; the pools ignore it, and so does
the NumPy backend, which computes every precision as "highest".

float16 and bfloat16 tensors are stored in 16 bits and computed in float32 (sums included) on both
devices: the CUDA kernels compile for 16-bit elements, the NumPy backend runs in float32 on widened
copies and its results are rounded to the tensors' dtype.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any

import numpy as np
import torch
from convgen.backend import HALF_DTYPES as HALF_DTYPE_NAMES
from convgen.backend import BackendError, OutOfMemory
from convgen.cpu import NumpyBackend
from convgen.cuda import TENSOR_CORE_CAPABILITY, CupyBackend
from convgen.cuda_launch import argmax_dtype, scalar_dtype
from convgen.generated.contract import ARRAY_ALIGNMENT
from convgen.geometry import Family, Geometry
from convgen.scratch_layout import ScratchLayout

DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
               torch.bfloat16: "bfloat16"}
HALF_DTYPES = (torch.float16, torch.bfloat16)
_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                 "bfloat16": torch.bfloat16, "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32}


def saved_dtypes(family: Family, device_type: str, dtype: torch.dtype, kernel_numel: int) -> tuple[torch.dtype, ...]:
    """The dtypes of the saved state `forward` returns after the output, exactly as each backend makes
    it: the NumPy backend keeps max pool's offsets as intp (int64, -1 for a window with no real cell)
    and smooth max's pivots and sums in float64; the CUDA kernels keep the narrowest unsigned type
    that holds every offset (cuda_launch.argmax_dtype) and pivots and sums in the dtype they compute in
    (the input's, float32 for 16-bit inputs)."""
    on_cuda = device_type == "cuda"
    if family is Family.MAX_POOL:
        return (_TORCH_DTYPES[argmax_dtype(kernel_numel)] if on_cuda else torch.int64,)
    if family is Family.SMOOTH_MAX_POOL:
        scalar = _TORCH_DTYPES[scalar_dtype(DTYPE_NAMES[dtype])]
        return (scalar, scalar) if on_cuda else (torch.float64, torch.float64)
    return ()


def forward(op: str, geom: Geometry, tensors: tuple[torch.Tensor, ...],
            precision: str = "highest") -> tuple[torch.Tensor, ...]:
    """(output, *saved) of `geom` on `tensors`; an empty output computes nothing (SEMANTICS §2)."""
    x = tensors[-1]
    if geom.output_numel == 0:
        shape = geom.output_shape
        saved = saved_dtypes(geom.family, x.device.type, x.dtype, math.prod(geom.kernel))
        return tuple(torch.zeros(shape, dtype=dtype, device=x.device) for dtype in (x.dtype, *saved))
    return _runner(x).forward(op, geom, tensors, precision)


def backward(op: str, geom: Geometry, tensors: tuple[torch.Tensor, ...], saved: tuple[torch.Tensor, ...],
             grad: torch.Tensor, precision: str = "highest",
             wanted: tuple[bool, ...] | None = None) -> tuple[torch.Tensor | None, ...]:
    """One gradient per tensor of `tensors`, shaped like it, or None where `wanted` (one flag per tensor,
    None for all) says nobody reads it: not computed; an empty output passes back zeros."""
    wanted = (True,) * len(tensors) if wanted is None else tuple(wanted)
    if geom.output_numel == 0:
        shapes = geom.parent_shapes  # a missing bias still gets its gradient, as the kernels give one
        return tuple(grad.new_zeros(shape) if wants else None for shape, wants in zip(shapes, wanted, strict=True))
    return _runner(grad).backward(op, geom, tensors, saved, grad, precision, wanted)


def _runner(tensor: torch.Tensor) -> Any:
    if tensor.is_cuda:  # an attribute read, where `device` makes an object
        return _cuda_runner()
    if tensor.device.type == "cpu":
        return _CPU
    raise RuntimeError(f"convgen.torch: tensors on {tensor.device} are not supported (cpu and cuda are)")


def _failure(op: str, error: Exception) -> RuntimeError:
    """A backend's failure as the RuntimeError torch users expect, naming the op."""
    return RuntimeError(f"convgen.torch.{op}: {error}")


class _CpuRunner:
    """The NumPy backend on contiguous CPU tensors, one backend per dtype (float32 for the 16-bit ones,
    whose results are rounded back); every precision computes as "highest" there, so the precision is
    not looked at."""

    def __init__(self) -> None:
        self._backends = {name: NumpyBackend(name) for name in ("float32", "float64")}

    def _backend(self, dtype: torch.dtype) -> NumpyBackend:
        return self._backends["float64" if dtype == torch.float64 else "float32"]

    def forward(self, op: str, geom: Geometry, tensors: tuple[torch.Tensor, ...],
                precision: str) -> tuple[torch.Tensor, ...]:
        dtype = tensors[-1].dtype
        backend = self._backend(dtype)
        try:
            output, saved = backend.forward(geom, _host_arrays(geom, tensors))
        except MemoryError as error:
            raise _failure(op, OutOfMemory.of(error, geom.output_numel * tensors[-1].element_size())) from None
        except BackendError as error:
            raise _failure(op, error) from None
        # The state is given back shaped like the output (batch=1 runs unbatched: see _saved_arrays).
        state = () if saved is None else saved if isinstance(saved, tuple) else (saved,)
        output = torch.from_numpy(output.reshape(geom.output_shape)).to(dtype)
        return output, *(torch.from_numpy(a.reshape(geom.output_shape)) for a in state)

    def backward(self, op: str, geom: Geometry, tensors: tuple[torch.Tensor, ...], saved: tuple[torch.Tensor, ...],
                 grad: torch.Tensor, precision: str, wanted: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...]:
        backend = self._backend(grad.dtype)
        state = _saved_arrays(geom, saved)
        try:
            grads = backend.backward(geom, _host_arrays(geom, tensors), state, _numpy(grad), wanted)
        except MemoryError as error:
            raise _failure(op, OutOfMemory.of(error, sum(t.numel() * t.element_size() for t in tensors
                                                         if t is not None))) from None
        except BackendError as error:
            raise _failure(op, error) from None
        return tuple(None if g is None else torch.from_numpy(np.ascontiguousarray(g)).to(grad.dtype) for g in grads)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as the NumPy backend takes them: 16-bit ones widened to float32."""
    tensor = tensor.detach()
    if tensor.dtype in HALF_DTYPES:
        return tensor.to(torch.float32, memory_format=torch.contiguous_format).numpy()
    return tensor.contiguous().numpy()


def _host_arrays(geom: Geometry, tensors: tuple[torch.Tensor, ...]) -> tuple[np.ndarray, ...]:
    """The backend's inputs; a missing bias is zeros (the kernels always add one)."""
    if geom.family.is_conv and tensors[1] is None:
        weight = _numpy(tensors[0])
        return (weight, np.zeros(geom.out_c, weight.dtype), _numpy(tensors[2]))
    return tuple(_numpy(t) for t in tensors)


def _saved_arrays(geom: Geometry, saved: tuple[torch.Tensor, ...]) -> Any:
    """The saved state as the NumPy backend made it: with batch=1 it ran the unbatched op, whose state
    has no batch axis; smooth max keeps a pair, max pool one array, the others None."""
    shape = geom.output_shape[1:] if geom.batch == 1 else geom.output_shape
    arrays = tuple(_numpy(s).reshape(shape) for s in saved)
    return arrays if len(arrays) > 1 else arrays[0] if arrays else None


_CPU = _CpuRunner()


@functools.cache
def _cuda_runner() -> _CudaRunner:
    return _CudaRunner()


class _CudaCall(threading.local):
    """What the launches and allocations of the op running on this thread use: its device and the raw handle of
    torch's current stream there."""

    device: torch.device | None = None
    stream: int = 0


def _current_stream_function() -> Any:
    """device index -> the raw handle of torch's current stream there. torch's own compiled code reads it
    with torch._C._cuda_getCurrentRawStream (no Stream object made: 0.1 µs against 2.8 µs on the H200's
    host); torch.cuda.current_stream is the public fallback."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else lambda index: torch.cuda.current_stream(index).cuda_stream


def _caching_allocator() -> tuple[Any, Any]:
    """(alloc(bytes, raw stream) -> address, delete(address)): torch's caching allocator without a tensor. The
    bindings torch.cuda.caching_allocator_alloc and _delete wrap, called directly (the public alloc switches devices
    in Python); those two are the fallback."""
    alloc = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
    delete = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)
    if alloc is None or delete is None:
        return (lambda size, stream: torch.cuda.caching_allocator_alloc(size, stream=stream),
                torch.cuda.caching_allocator_delete)
    return alloc, delete


class _Block:
    """A pass's scratch as a bare block of torch's caching allocator: making a tensor costs 3-6 µs more on the H200's
    hosts. Given back when the pass drops it, after its last launch is queued: like a tensor's memory, the block is
    reused only by work queued later on the stream it was allocated on (or, under graph capture, in the graph's
    pool)."""

    __slots__ = ("address", "_delete")

    def __init__(self, address: int, delete: Any) -> None:
        self.address, self._delete = address, delete

    def __del__(self) -> None:
        self._delete(self.address)


class _TorchCupyBackend(CupyBackend):
    """convgen.cuda's CuPy backend on torch tensors, never wrapped as CuPy arrays: outputs and scratch from
    torch's caching allocator, kernel arguments as the tensors' raw pointers (passed by value, 8 bytes like
    the pointer), launches on the calling op's stream. CuPy itself is imported when the first backend is
    made (CupyBackend.__init__)."""

    call = _CudaCall()

    def __init__(self, dtype: str, precision: str) -> None:
        super().__init__(dtype, precision)
        self._address_of.update(dict.fromkeys((torch.Tensor, torch.nn.Parameter), torch.Tensor.data_ptr))
        self._allocate, self._free = _caching_allocator()

    def _stream_pointer(self) -> int:
        return self.call.stream

    def _other_address(self, value: Any) -> int:
        if isinstance(value, torch.Tensor):  # a tensor subclass
            return value.data_ptr()
        return super()._other_address(value)

    def _output(self, shape: tuple[int, ...], dtype: str | None = None) -> torch.Tensor:
        torch_dtype = _TORCH_DTYPES[self.dtype if dtype is None else dtype]
        try:
            return torch.empty(shape, dtype=torch_dtype, device=self.call.device)
        except torch.OutOfMemoryError:
            raise OutOfMemory(math.prod(shape) * torch_dtype.itemsize) from None

    def _output_like(self, tensor: torch.Tensor) -> torch.Tensor:
        # The pass's inputs are kernel-ready (contiguous), and so is what empty_like makes of them. A Parameter's is a
        # plain tensor that requires no grad.
        try:
            return torch.empty_like(tensor)
        except torch.OutOfMemoryError:
            raise OutOfMemory(tensor.numel() * tensor.element_size()) from None

    def _scratch(self, shape: tuple[int, ...], dtype: str | None = None) -> torch.Tensor:
        # A tensor: autograd keeps the forward's state (argmax, smooth max's pivots and sums) between the passes.
        return self._output(shape, dtype)

    def _scratch_base(self, layout: ScratchLayout) -> tuple[_Block | None, int]:
        """A conv pass's scratch, which nothing keeps past the pass, as a bare block on the call's stream."""
        size = layout.size
        if not size:
            return None, 0
        try:
            address = self._allocate(size, self.call.stream)
        except torch.OutOfMemoryError:
            raise OutOfMemory(size) from None
        return _Block(address, self._free), address


def device_precision(dtype: str, precision: str, capability: tuple[int, int]) -> str:
    """The precision a CUDA device of compute `capability` (torch's (major, minor)) runs `precision` in
    for `dtype` tensors: as asked, or "highest", which is at least as accurate as any, for float64 (the
    tensor cores take float32 only) and on devices without TF32 tensor cores, where torch's own TF32
    switches do nothing either. 16-bit values are exact in TF32, so "high" is "medium" for them."""
    if dtype == "float64" or capability[0] * 10 + capability[1] < TENSOR_CORE_CAPABILITY:
        return "highest"
    if dtype in HALF_DTYPE_NAMES and precision == "high":
        return "medium"
    return precision


class _CudaRunner:
    """The CuPy backend on CUDA tensors, one backend per (dtype, precision) (each caches its compiled
    kernels per geometry and device)."""

    def __init__(self) -> None:
        self._call = _TorchCupyBackend.call
        self._backend_class = _TorchCupyBackend
        self._backends: dict[tuple[str, str], Any] = {}
        # (device index, torch dtype, precision asked) -> its backend: one lookup per call.
        self._by_call: dict[tuple[int, torch.dtype, str], Any] = {}
        self._current_stream = _current_stream_function()
        # torch.cuda.current_device without its lazy-init check (CUDA tensors exist by the time it runs).
        self._current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)

    def _backend(self, tensor: torch.Tensor, precision: str) -> Any:
        """The backend for `tensor`'s dtype in the precision its device runs `precision` in."""
        key = (tensor.get_device(), tensor.dtype, precision)  # an int: no device object made
        backend = self._by_call.get(key)
        if backend is None:
            capability = torch.cuda.get_device_capability(tensor.device)
            name = DTYPE_NAMES[tensor.dtype]
            kind = (name, device_precision(name, precision, capability))
            backend = self._backends.get(kind)
            if backend is None:
                backend = self._backends[kind] = self._backend_class(*kind)
            self._by_call[key] = backend
        return backend

    def _run(self, op: str, device: torch.device, work: Any) -> Any:
        """`work()` under `device`, with launches on torch's current stream of that device."""
        index = device.index
        call = self._call
        call.device, call.stream = device, self._current_stream(index)
        try:
            if self._current_device() == index:
                return work()
            with torch.cuda.device(index):
                return work()
        except BackendError as error:
            raise _failure(op, error) from None
        finally:
            call.device, call.stream = None, 0

    def forward(self, op: str, geom: Geometry, tensors: tuple[torch.Tensor, ...],
                precision: str) -> tuple[torch.Tensor, ...]:
        x = tensors[-1]
        backend = self._backend(x, precision)

        def work() -> tuple[torch.Tensor, ...]:
            output, saved = backend.forward(geom, _contiguous(geom, tensors))
            return (output,) if saved is None else (output, *saved) if isinstance(saved, tuple) else (output, saved)

        return self._run(op, x.device, work)

    def backward(self, op: str, geom: Geometry, tensors: tuple[torch.Tensor, ...], saved: tuple[torch.Tensor, ...],
                 grad: torch.Tensor, precision: str, wanted: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...]:
        backend = self._backend(grad, precision)

        def work() -> tuple[torch.Tensor | None, ...]:
            state = tuple(_kernel_ready(s) for s in saved)
            state = state if len(state) > 1 else state[0] if state else None
            # The backward reads no bias (its gradient's shape comes from the geometry): a missing one stays None.
            inputs = tuple(None if t is None else _kernel_ready(t) for t in tensors)
            return tuple(backend.backward(geom, inputs, state, _kernel_ready(grad), wanted))

        return self._run(op, grad.device, work)


def _contiguous(geom: Geometry, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The forward kernels' inputs, each as _kernel_ready makes it, and a missing bias as zeros (the kernels always
    add one)."""
    if geom.family.is_conv and tensors[1] is None:
        weight, _, x = tensors
        tensors = (weight, _zero_bias(geom.out_c, x), x)
    return tuple([_kernel_ready(t) for t in tensors])


# The zero biases of convs without one, by (channels, dtype, device): made once, read only by the kernels. Made
# per call they were an allocation and a fill kernel each forward.
_ZERO_BIASES: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _zero_bias(channels: int, like: torch.Tensor) -> torch.Tensor:
    """Zeros of `channels` in `like`'s dtype on its device. One made while a CUDA graph is captured is filled
    only when the graph replays, so it is not kept."""
    key = (channels, like.dtype, like.device)
    bias = _ZERO_BIASES.get(key)
    if bias is None:
        bias = torch.zeros(channels, dtype=like.dtype, device=like.device)
        if not torch.cuda.is_current_stream_capturing():
            _ZERO_BIASES[key] = bias
    return bias


def _kernel_ready(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as a kernel may read it: contiguous and starting on ARRAY_ALIGNMENT (a view into a larger
    tensor may start anywhere; the kernels' widest accesses would fault there), else a copy that is."""
    tensor = tensor.contiguous()
    return tensor if tensor.data_ptr() % ARRAY_ALIGNMENT == 0 else tensor.clone()
