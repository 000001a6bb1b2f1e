"""A CuPy that runs convgen's generated CUDA on the CPU, for testing kernel changes without a GPU.

Arrays are NumPy arrays. `RawModule` compiles the generated source with the host C++ compiler against
a prelude (tests/emulated_cuda.h) that gives the kernels what they use of CUDA (threadIdx, blockIdx, __shared__, __syncthreads,
__syncthreads_or, warp shuffles, __ldg, float4, double2, bit casts) and a trampoline per kernel; a launch runs the
blocks one after another, each block's threads as OS threads meeting at real barriers. That is enough
for the GEMM kernels of the conv families, FMAs and tensor cores (the prelude's mma_tf32 and mma_16bit stand
in for mma.cuh's inline PTX, from the PTX ISA's fragment layouts), and the circular pad and fold kernels, at small
sizes (every thread is a thread); a vector access off its alignment stops the process (the alignment
sanitizer), as it would fault on a GPU. Hopper's warpgroup mma (the `_wgmma` kernels: wgmma_tf32 with A from
registers, wgmma_16bit with A from shared memory, B from shared memory through its descriptor, in the 128- or
64-byte swizzle) runs there too, at once.
Other inline PTX is not emulated: a source that needs it fails to compile, with the compiler's message.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np

# What the kernels use of CUDA, on the host (tests/emulated_cuda.h), put before every source compiled here.
PRELUDE = (Path(__file__).resolve().parent / "emulated_cuda.h").read_text()

# A kernel's name and parameters; the word before the name, where there is one, is its launch-bounds macro.
_KERNEL = re.compile(r'extern "C" __global__ void (?:\w+ )?(\w+)\(([^)]*)\)')
_C_SCALARS = {np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.int32): ctypes.c_int32,
              np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


class EmulatedError(RuntimeError):
    """A source the host compiler rejects, or an argument the launch cannot pass."""


class EmulatedArray(np.ndarray):
    """A NumPy array standing for a device array: `.data.device_id` as CuPy has it, `.get()` to the host."""

    @property
    def data(self) -> Any:  # CuPy's MemoryPointer, as the backend reads it
        return types.SimpleNamespace(device_id=0, ptr=self.ctypes.data)

    def get(self) -> np.ndarray:
        return np.array(self)


_DEFAULT_STREAM = types.SimpleNamespace(ptr=0)


class EmulatedMemory:
    """A bare allocation (`cupy.cuda.alloc`: CuPy's MemoryPointer), passed to a launch as the pointer it holds."""

    ALIGNMENT = 256  # as CuPy's pool aligns its blocks: vector accesses (float4, double2) stay aligned

    def __init__(self, size: int) -> None:
        raw = np.empty(size + self.ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % self.ALIGNMENT
        self.buffer = raw[start:start + size]
        self.ptr = raw.ctypes.data + start

    def memset_async(self, value: int, size: int) -> None:
        self.buffer[:size] = value


def _device(array: Any) -> EmulatedArray:
    return np.ascontiguousarray(array).view(EmulatedArray)


def _trampolines(code: str) -> str:
    """extern "C" emulated_<kernel>(grid, threads, shared bytes, args): each of `args` points to its argument's
    value, as cuLaunchKernel's kernelParams do, read by the kernel's parameter type."""
    out = []
    for name, params in _KERNEL.findall(code):
        args = []
        for index, param in enumerate(p.strip() for p in params.split(",") if p.strip()):
            declared = param.replace("__restrict__", "").split()
            c_type = " ".join(declared[:-1])
            args.append(f"*({c_type}*)args[{index}]")
        out.append(f'extern "C" void emulated_{name}(unsigned grid, unsigned threads, unsigned shared, void** args)\n'
                   f"{{ emulated_launch(grid, threads, shared, [&] {{ {name}({', '.join(args)}); }}); }}")
    return "\n".join(out)


class EmulatedModule:
    """CuPy's RawModule: the source compiled for the host, once per (source, options)."""

    _built: dict[str, ctypes.CDLL] = {}

    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        compiler = shutil.which("g++")
        if compiler is None:
            raise EmulatedError("the CUDA emulation needs g++")
        defines = [o for o in options if o.startswith("-D")]
        key = hashlib.sha256("\n".join([code, *defines]).encode()).hexdigest()
        library = EmulatedModule._built.get(key)
        if library is None:
            work = Path(tempfile.mkdtemp(prefix="convgen-emulated-"))
            source = work / "kernels.cpp"
            source.write_text(PRELUDE + "\n" + code + "\n" + _trampolines(code) + "\n")
            # The alignment sanitizer stops at a vector access (float4, double2) off its alignment, which
            # x86 would let through and a GPU would fault on. Without -fno-gnu-unique the static shared arrays
            # of an inline function (gemm.cuh's staged_slices) would be one object across every module loaded,
            # as a float32 and a float64 build name them alike: each GPU module has its own.
            built = subprocess.run([compiler, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w",
                                    "-fno-gnu-unique",
                                    "-fsanitize=alignment", "-fno-sanitize-recover=alignment", *defines,
                                    str(source), "-o", str(work / "kernels.so")], capture_output=True, text=True)
            try:
                if built.returncode != 0:
                    raise EmulatedError(f"host compile failed:\n{built.stderr[-4000:]}")
                library = EmulatedModule._built[key] = ctypes.CDLL(str(work / "kernels.so"))
            finally:
                shutil.rmtree(work)  # a loaded library stays mapped
        self._library = library

    def get_function(self, name: str) -> EmulatedFunction:
        entry = getattr(self._library, f"emulated_{name}")
        entry.argtypes = (ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p))
        entry.restype = None
        return EmulatedFunction(name, entry)


class EmulatedFunction:
    """A kernel of an EmulatedModule, as CuPy's RawKernel and its device Function (`kernel`): `ptr` is what the
    driver's launchKernel takes (an index into the launched functions), and a call launches it as a RawKernel's
    does, from its arguments."""

    entries: list[Any] = []  # ptr -> the kernel's trampoline

    def __init__(self, name: str, entry: Any) -> None:
        self.name, self._entry = name, entry
        self.ptr = len(EmulatedFunction.entries)
        EmulatedFunction.entries.append(entry)

    @property
    def kernel(self) -> EmulatedFunction:  # a RawKernel's function on the current device: itself
        return self

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], shared_mem: int = 0,
                 stream: Any = None) -> None:
        held = []  # each argument's value, to which the trampoline's args point, as the driver's kernelParams do
        for arg in args:
            if isinstance(arg, EmulatedMemory):
                held.append(ctypes.c_void_p(arg.ptr))
            elif isinstance(arg, np.ndarray) and arg.ndim > 0:
                if not arg.flags.c_contiguous:
                    raise EmulatedError(f"{self.name}: a non-contiguous array argument")
                held.append(ctypes.c_void_p(arg.ctypes.data))
            else:
                value = np.asarray(arg)
                scalar = _C_SCALARS.get(value.dtype)
                if scalar is None:
                    raise EmulatedError(f"{self.name}: cannot pass a {value.dtype} scalar")
                held.append(scalar(value.item()))
        pointers = [ctypes.addressof(value) for value in held]
        self._entry(int(np.prod(grid)), int(np.prod(block)), shared_mem, (ctypes.c_void_p * len(pointers))(*pointers))


def launch_kernel(function: int, grid_x: int, grid_y: int, grid_z: int, block_x: int, block_y: int, block_z: int,
                  shared_bytes: int, stream: int, parameters: int, extra: int) -> None:
    """The driver's cuLaunchKernel as CuPy binds it: `parameters` the address of an array of pointers to the
    arguments' values, which the trampoline reads by the kernel's parameter types."""
    EmulatedFunction.entries[function](grid_x * grid_y * grid_z, block_x * block_y * block_z, shared_bytes,
                                       ctypes.cast(parameters, ctypes.POINTER(ctypes.c_void_p)))


def emulated_cupy() -> types.ModuleType:
    """A `cupy` module with what convgen.cuda.CupyBackend and the CUDA tests use, on NumPy and g++: one
    device (0) of compute capability 9.0 reporting no attributes (the plans assume an H200)."""
    errors = {name: type(name, (RuntimeError,), {}) for name in
              ("CompileException", "CUDADriverError", "CUDARuntimeError", "OutOfMemoryError")}
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0,
                                         CUDARuntimeError=errors["CUDARuntimeError"])
    cuda.compiler = types.SimpleNamespace(CompileException=EmulatedError)
    cuda.driver = types.SimpleNamespace(CUDADriverError=errors["CUDADriverError"], launchKernel=launch_kernel)
    cuda.memory = types.SimpleNamespace(OutOfMemoryError=errors["OutOfMemoryError"])
    cuda.Device = lambda device=0: types.SimpleNamespace(id=device, attributes={}, compute_capability="90")
    cuda.get_current_stream = lambda: _DEFAULT_STREAM
    cuda.alloc = EmulatedMemory
    cupy = types.ModuleType("cupy")
    cupy.cuda, cupy.ndarray, cupy.RawModule = cuda, EmulatedArray, EmulatedModule
    cupy.float32, cupy.float64 = np.float32, np.float64
    cupy.empty = lambda shape, dtype=np.float32: np.empty(shape, dtype).view(EmulatedArray)
    cupy.zeros = lambda shape, dtype=np.float32: np.zeros(shape, dtype).view(EmulatedArray)
    cupy.asarray = lambda value, dtype=None: _device(np.asarray(value, dtype))
    cupy.ascontiguousarray = lambda value, dtype=None: _device(np.asarray(value, dtype))
    cupy.asnumpy = lambda array: np.array(array)
    cupy.array_equal = lambda a, b, equal_nan=False: np.array_equal(a, b, equal_nan=equal_nan)
    return cupy
