"""Stand-ins that split the host path of a tiny op (issue 9) into the part convgen's Python costs and the
part CuPy costs, on any machine, GPU or not: a stub CPU backend whose forward returns a preallocated
output (the tape and the generated validators alone), and a stand-in CuPy whose allocations and kernel
launches do next to nothing, under the real CUDA backend (the tape, the validators and the CUDA
backend's Python path). Both only time the host path; neither computes anything."""

from __future__ import annotations

import itertools
import math
import sys
import types
from contextlib import contextmanager
from typing import Any

import numpy as np

_C_CONTIGUOUS = types.SimpleNamespace(c_contiguous=True)
_ADDRESSES = itertools.count(1 << 20, 1 << 8)  # device addresses of the stand-ins, on every alignment


class StandInArray:
    """What the CUDA backend and the tape read of a CuPy array: shape, size, dtype, flags, the device."""

    __slots__ = ("shape", "size", "dtype", "data")
    flags = _C_CONTIGUOUS

    def __init__(self, shape: Any, dtype: Any) -> None:
        self.shape = (shape,) if type(shape) is int else tuple(shape)
        self.size = math.prod(self.shape)
        self.dtype = np.dtype(dtype)
        self.data = types.SimpleNamespace(device_id=0, ptr=next(_ADDRESSES))  # CuPy's MemoryPointer

    def reshape(self, *shape: Any) -> StandInArray:
        shape = shape[0] if len(shape) == 1 else shape
        if shape in (-1, (-1,)):  # flat, as a leaf given a `shape` keeps its buffer
            shape = (self.size,)
        view = StandInArray(shape, self.dtype)
        view.data = self.data  # the same memory
        return view

    def fill(self, value: Any) -> None:
        pass


class StandInMemory:
    """What the CUDA backend keeps of a bare allocation (`cupy.cuda.alloc`, a MemoryPointer): its size in
    bytes, its address, and a fill that does nothing."""

    __slots__ = ("size", "ptr")

    def __init__(self, size: int) -> None:
        self.size = size
        self.ptr = next(_ADDRESSES)

    def memset_async(self, value: int, size: int) -> None:
        pass


class _StandInModule:
    """A compiled module whose every function is the one the stand-in driver launches (nothing)."""

    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        pass

    def get_function(self, symbol: str) -> Any:
        return _NO_FUNCTION


# CuPy's RawKernel, its `kernel` the Function on the current device, whose handle the driver's launch takes.
_NO_FUNCTION = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0))
_DEFAULT_STREAM = types.SimpleNamespace(ptr=0)


def stand_in_cupy() -> types.ModuleType:
    """A `cupy` module with what `convgen.cuda.CupyBackend` uses on its per-call path, all no-ops: one
    device (0) reporting no attributes (the plans assume an H200) and the H200's compute capability (which
    the tensor-core precisions need), `ndarray`, `cuda.alloc`, `RawModule`, the current stream and the driver's
    launch."""
    errors = {name: type(name, (RuntimeError,), {}) for name in
              ("CompileException", "CUDADriverError", "CUDARuntimeError", "OutOfMemoryError")}
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0,
                                    CUDARuntimeError=errors["CUDARuntimeError"])
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime = runtime
    cuda.compiler = types.SimpleNamespace(CompileException=errors["CompileException"])
    cuda.driver = types.SimpleNamespace(CUDADriverError=errors["CUDADriverError"], launchKernel=lambda *args: None)
    cuda.get_current_stream = lambda: _DEFAULT_STREAM
    cuda.memory = types.SimpleNamespace(OutOfMemoryError=errors["OutOfMemoryError"])
    cuda.Device = lambda device=0: types.SimpleNamespace(id=device, attributes={}, compute_capability="90")
    cuda.alloc = StandInMemory
    cupy = types.ModuleType("cupy")
    cupy.cuda, cupy.ndarray, cupy.RawModule, cupy.float32 = cuda, StandInArray, _StandInModule, np.float32
    cupy.empty = StandInArray
    return cupy


@contextmanager
def imports_as(cupy: types.ModuleType) -> Any:
    """`import cupy` (and `cupy.cuda.compiler`) gives `cupy` inside the block; sys.modules as it was after."""
    names = ("cupy", "cupy.cuda", "cupy.cuda.compiler")
    before = {name: sys.modules.get(name) for name in names}
    sys.modules.update(zip(names, (cupy, cupy.cuda, cupy.cuda.compiler)))
    try:
        yield
    finally:
        for name, module in before.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def stand_in_cuda_tape(convgen: Any, precision: str = "highest") -> Any:
    """An empty CUDA tape in `precision` whose backend runs on `stand_in_cupy()` (a tape class of its own,
    so the backend the tape caches per class is not the real one)."""
    cupy = stand_in_cupy()
    tape_class = type("StandInCudaTape", (convgen.cuda.Tape,), {})
    with imports_as(cupy):
        return tape_class(precision=precision)


def stub_cpu_tape(convgen: Any) -> Any:
    """An empty CPU tape whose forward returns a preallocated zero output per geometry: the tape and the
    generated validators without any compute."""
    outputs: dict[tuple[int, ...], np.ndarray] = {}  # by output shape: a cheaper key than the geometry

    class StubBackend(convgen.cpu.NumpyBackend):
        def forward(self, geom: Any, inputs: tuple[Any, ...]) -> tuple[Any, Any]:
            output = outputs.get(geom.output_shape)
            if output is None:
                output = outputs[geom.output_shape] = np.zeros(geom.output_shape, self.dtype)
            return output, None

    return type("StubCpuTape", (convgen.cpu.Tape,), {"backend_class": StubBackend})()


@contextmanager
def stand_in_adapter(devices: Any) -> Any:
    """Inside the block, convgen.torch (its `devices` module given) runs every tensor, CPU ones included, through its
    CUDA runner on `stand_in_cupy()`: the functional call's checks, autograd's node and the CUDA backend's Python
    path on real CPU tensors (outputs and the pools' state from torch's CPU allocator, a conv pass's scratch a stand-in
    address), the launches doing nothing. Stream 0, and the H200's compute capability for the precision."""
    cupy = stand_in_cupy()

    def backend_class(*kind: Any) -> Any:
        with imports_as(cupy):
            backend = devices._TorchCupyBackend(*kind)
        # A pass's scratch: a stand-in address, for torch's CUDA caching allocator has no CPU memory to give.
        backend._allocate, backend._free = lambda size, stream: next(_ADDRESSES), lambda address: None
        return backend

    runner = devices._CudaRunner()
    runner._backend_class = backend_class
    runner._current_stream = lambda index: 0
    runner._current_device = lambda: None  # a CPU tensor's device index: no device switch
    from convgen.torch import host_path

    before = devices._runner, devices.torch.cuda.get_device_capability
    devices._runner = lambda tensor: runner
    devices.torch.cuda.get_device_capability = lambda device=None: (9, 0)
    host_path.clear()  # the compiled host path's entries are the stand-in's inside the block, and only there
    try:
        yield runner
    finally:
        devices._runner, devices.torch.cuda.get_device_capability = before
        host_path.clear()
