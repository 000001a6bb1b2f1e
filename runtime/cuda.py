"""The CUDA backend: CuPy arrays in, the generated sources of `convgen.generated` compiled with NVRTC
for one geometry at a time (the -D defines and launch plan of `convgen.cuda_launch`), the stages'
kernels launched (convgen.cuda_kernels: arguments by role from the generated contract, launch groups)
and arrays out; and `Tape`, the CUDA tape that runs on it.

CuPy is imported when the backend is constructed, so `import convgen.cuda` works without it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from convgen.backend import BackendError, OutOfMemory, host_numbers, real_numbers
from convgen.circular import circular_plan, fits_padded
from convgen.cuda_kernels import Compiled, KernelLaunches, Wrapping
from convgen.cuda_launch import (
    CUDA_SOURCES,
    H200,
    Hardware,
    TileChooser,
    arch_option,
    choose_tile,
    nvrtc_options,
    opted_in_shared,
    plan,
    scalar_dtype,
)
from convgen.direct_model import DirectChooser, choose_direct
from convgen.generated.contract import (
    ARRAY_ALIGNMENT,
    CIRCULAR_KERNELS,
    KERNELS,
)
from convgen.geometry import Geometry
from convgen.host_path import COMPILED, tape_apply
from convgen.launch_program import Program, replay, trace
from convgen.wgmma_tiles import WgmmaChooser, choose_wgmma

# How the CUDA tape's op calls run on the host: "compiled" (convgen._host_path replays a call it has seen) or
# "python" (the extension did not build; convgen.host_path).
HOST_PATH = "compiled" if COMPILED else "python"
CUPY_EXTRA = "pip install 'convgen[cuda13]' (or 'convgen[cuda12]' for a CUDA 12 driver)"
# The H200 sustained 1.7 GHz of its 1.98 GHz boost clock under the tile sweep's load; other
# devices are taken to sustain the same share of the boost clock they report.
SUSTAINED_CLOCK_SHARE = H200.clock_hz / 1.98e9
# The H200's peak memory bandwidth by its specification: a 3.201 GHz memory clock, two transfers a cycle, a
# 6144-bit bus (4.92 TB/s). It streamed H200.memory_bandwidth of that; other devices are taken to stream the same
# share of the peak their attributes give (an H100 SXM reported 2.619 GHz and 5120 bits: 3.35 TB/s).
H200_MEMORY_PEAK = 2 * 3.201e9 * 6144 / 8
# mma.sync with TF32 operands (precision "high" and "medium") needs sm_80 or newer (CuPy gives a
# device's capability as digits, "90").
TENSOR_CORE_CAPABILITY = 80
WGMMA_CAPABILITY = "90"  # the `_wgmma` kernels' sm_90a; later architectures lack its wgmma

# How CuPy holds each element type: bfloat16, which NumPy and CuPy lack, as its bit patterns (the kernels
# read and write the bits; convgen.torch hands them torch's bfloat16 tensors).
STORAGE_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16,
                  "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32}
_ITEMSIZES = {name: np.dtype(storage).itemsize for name, storage in STORAGE_DTYPES.items()}  # bytes, looked up per call
# Poison for outputs in the test mode: NaN (0xFFFF is a bfloat16 NaN), and for the argmax offsets a value
# no window has.
_POISON = {"float32": np.float32("nan"), "float64": np.float64("nan"), "float16": np.float16("nan"),
           "bfloat16": np.uint16(0xFFFF), "uint8": np.uint8(0xFF), "uint16": np.uint16(0xFFFF),
           "uint32": np.uint32(0xFFFFFFFF)}


def device_hardware(attributes: dict[str, int], compute_capability: str = "") -> Hardware:
    """The hardware record of a device from CuPy's `Device.attributes` and `compute_capability` ("90"); what a
    device does not report (the register cap, the driver's per-block reserve, the memory clock and bus) is the
    H200's."""
    return Hardware(
        sm_count=attributes.get("MultiProcessorCount", H200.sm_count),
        shared_per_block=attributes.get("MaxSharedMemoryPerBlock", H200.shared_per_block),
        shared_optin_per_block=attributes.get("MaxSharedMemoryPerBlockOptin", H200.shared_optin_per_block),
        shared_per_sm=attributes.get("MaxSharedMemoryPerMultiprocessor", H200.shared_per_sm),
        shared_reserved_per_block=H200.shared_reserved_per_block,
        registers_per_sm=attributes.get("MaxRegistersPerMultiprocessor", H200.registers_per_sm),
        registers_per_thread=H200.registers_per_thread,
        threads_per_sm=attributes.get("MaxThreadsPerMultiProcessor", H200.threads_per_sm),
        blocks_per_sm=attributes.get("MaxBlocksPerMultiprocessor", H200.blocks_per_sm),
        clock_hz=attributes["ClockRate"] * 1e3 * SUSTAINED_CLOCK_SHARE if "ClockRate" in attributes else H200.clock_hz,
        memory_bandwidth=_memory_bandwidth(attributes),
        wgmma=compute_capability == WGMMA_CAPABILITY,
    )


def _memory_bandwidth(attributes: dict[str, int]) -> float:
    """Bytes/s a streaming kernel reaches: the H200's, scaled by the device's memory peak from CuPy's
    `Device.attributes` (the clock in kHz, double data rate, the bus in bits) over the H200's; the H200's where
    the device reports no memory clock or bus."""
    clock_khz, bus_bits = attributes.get("MemoryClockRate", 0), attributes.get("GlobalMemoryBusWidth", 0)
    if clock_khz <= 0 or bus_bits <= 0:
        return H200.memory_bandwidth
    return H200.memory_bandwidth * (2 * clock_khz * 1e3 * bus_bits / 8 / H200_MEMORY_PEAK)


def unsupported(geom: Geometry, dtype: str) -> str | None:
    """What of SEMANTICS §8 the CUDA kernels do not compute yet, as the refusal's text; None when
    they compute all of `geom` in `dtype`. Refused, never computed wrong. Both dtypes are computed
    (kernels compiled per element type); only a wrapped input past 32-bit indexing is left."""
    if geom.circular and not fits_padded(geom):
        return "circular padding whose wrapped input reaches 2^32 elements is not supported on the CUDA tape yet"
    return None


# How many geometries the identity-keyed front of the compile cache holds before it starts over (the
# size of Geometry.build's cache, which interns them).
IDENTITY_CACHE_SIZE = 4096


class CupyBackend(KernelLaunches):
    """Runs every op with the generated CUDA kernels on the current CuPy device; deterministic
    (no atomics), with arrays of `dtype` (float32 or float64 for a tape; convgen.torch also runs float16
    and bfloat16, computed in float32: `scalar_dtype`), kernels compiled per dtype."""

    name = "cuda"
    buffer_label = "CUDA"
    # Test hook: fill every output with NaN before its kernel runs, so an element a kernel forgets
    # to write shows up. Set it on a subclass (tests/test_cuda.py does).
    poison_outputs = False
    # How plans pick each GEMM stage's tile; tests/test_cuda.py forces tiles through it.
    tile_chooser: TileChooser = staticmethod(choose_tile)
    # Which direct-form stages run the small-channel direct kernel; the GEMM tests turn it off.
    direct_chooser: DirectChooser = staticmethod(choose_direct)
    # Which GEMM stages in the TF32 modes run their `_wgmma` kernel (on a GPU with wgmma); the tests of the
    # GEMMs' cp.async pipeline turn it off.
    wgmma_chooser: WgmmaChooser = staticmethod(choose_wgmma)

    def __init__(self, dtype: str = "float32", precision: str = "highest") -> None:
        self.dtype = dtype
        self.scalar_dtype = scalar_dtype(dtype)  # of split stages' partial buffers and smooth max's saved state
        self.precision = precision  # the plans' MMA_MODE (cuda_launch.plan)
        self._storage_dtype = np.dtype(STORAGE_DTYPES[dtype])
        try:
            import cupy
            import cupy.cuda.compiler
        except ImportError as error:
            raise BackendError(f"the CUDA tape needs CuPy ({error}); install it with: {CUPY_EXTRA}") from None
        try:
            devices = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as error:
            raise BackendError(f"the CUDA tape found no GPU ({error})") from None
        if devices == 0:
            raise BackendError("the CUDA tape found no GPU (CUDA reports 0 devices)")
        self._xp = cupy
        self._current_device = cupy.cuda.runtime.getDevice  # looked up once: every call asks for it
        self._bind_driver(cupy)
        self._errors: tuple[type[BaseException], ...] = (
            cupy.cuda.compiler.CompileException, cupy.cuda.driver.CUDADriverError,
            cupy.cuda.runtime.CUDARuntimeError)
        self._compiled: dict[tuple[Geometry, int], Compiled] = {}
        # (id(geom), device) -> (geom, its Compiled): the per-call lookup, without hashing the geometry's
        # fields. It holds `geom` itself, so the id keying an entry is never reused while the entry lives.
        self._compiled_by_identity: dict[tuple[int, int], tuple[Geometry, Compiled]] = {}
        self._wrappings: dict[tuple[Geometry, int], Wrapping] = {}
        self._modules: dict[tuple, dict[str, Any]] = {}  # (source, NVRTC options, device) -> functions
        self._hardware: dict[int, Hardware] = {}

    # Arrays.

    def store(self, value: Any) -> Any:
        """Device C-contiguous arrays of the tape's dtype that start on the kernels' ARRAY_ALIGNMENT are taken as
        they are; everything else is copied (a view into another array may start anywhere)."""
        cupy = self._xp
        if not isinstance(value, (cupy.ndarray, np.ndarray)) and hasattr(value, "__dlpack__"):
            try:
                value = cupy.from_dlpack(value)
            except (BufferError, RuntimeError, TypeError, ValueError):
                value = np.asarray(value)  # host memory: copied below
        if isinstance(value, cupy.ndarray):
            if value.dtype == STORAGE_DTYPES[self.dtype] and value.flags.c_contiguous:
                return value if value.data.ptr % ARRAY_ALIGNMENT == 0 else value.copy()
            return cupy.ascontiguousarray(real_numbers(value), dtype=STORAGE_DTYPES[self.dtype])
        return cupy.asarray(host_numbers(value, STORAGE_DTYPES[self.dtype], copy=False))

    def zeros(self, shape: tuple[int, ...]) -> Any:
        return self._xp.zeros(shape, STORAGE_DTYPES[self.dtype])

    def device_of(self, array: Any) -> str:
        if isinstance(array, self._xp.ndarray):
            return f"cuda:{array.data.device_id}"
        if isinstance(array, np.ndarray):
            return "cpu"
        kind, index = array.__dlpack_device__()
        return f"dlpack device {int(kind)}:{index}"

    @property
    def device(self) -> str:
        return f"cuda:{self._current_device()}"

    def is_native(self, array: Any) -> bool:
        return (isinstance(array, self._xp.ndarray) and array.dtype == self._storage_dtype
                and array.data.device_id == self._current_device())

    def _output(self, shape: tuple[int, ...], dtype: str | None = None) -> Any:
        """A new array of `shape` and `dtype` (a name: the backend's dtype when None). The ndarray constructor,
        not cupy.empty, which wraps it: 0.3 µs less on the H200's host (benchmarks/launch_parts.py)."""
        name = self.dtype if dtype is None else dtype
        try:
            array = self._xp.ndarray(shape, STORAGE_DTYPES[name])
        except self._xp.cuda.memory.OutOfMemoryError:
            raise OutOfMemory(math.prod(shape) * np.dtype(STORAGE_DTYPES[name]).itemsize) from None
        if self.poison_outputs:
            array.fill(_POISON[name])
        return array

    def _output_like(self, array: Any) -> Any:
        """A new array of `array`'s shape in the backend's dtype (launch_program's outputs made like an input)."""
        return self._output(array.shape)

    def _scratch(self, shape: tuple[int, ...], dtype: str | None = None) -> Any:
        """Device memory for `shape` elements of `dtype` that no caller sees (max pool's window offsets, smooth
        max's state, a packed weight, a split stage's partial sums): a bare allocation from CuPy's pool, which
        a launch takes as the pointer it holds, 0.6 µs on the H200's host against 2.0 for an array
        (benchmarks/launch_parts.py). The test mode poisons it with all-ones bytes: a NaN in every float type,
        like `_output`'s NaNs, and for the window offsets the largest value, which no window has."""
        size = math.prod(shape) * _ITEMSIZES[self.dtype if dtype is None else dtype]
        try:
            memory = self._xp.cuda.alloc(size)
        except self._xp.cuda.memory.OutOfMemoryError:
            raise OutOfMemory(size) from None
        if self.poison_outputs:
            memory.memset_async(0xFF, size)
        return memory

    # Compiling and launching.

    def _compile(self, geom: Geometry) -> Compiled:
        """The kernels of `geom`, compiled once per geometry and device (CuPy also caches the
        binary on disk, keyed by source and options, across processes)."""
        device = self._current_device()
        known = self._compiled_by_identity.get((id(geom), device))
        if known is not None:
            return known[1]
        if len(self._compiled_by_identity) >= IDENTITY_CACHE_SIZE:
            self._compiled_by_identity.clear()
        compiled = self._compiled.get((geom, device))
        if compiled is None:
            compiled = self._compiled[(geom, device)] = self._compiled_anew(geom, device)
        self._compiled_by_identity[(id(geom), device)] = (geom, compiled)
        return compiled

    def _compiled_anew(self, geom: Geometry, device: int) -> Compiled:
        """`geom`'s plan and kernels for `device`, or the BackendError saying why not."""
        refusal = unsupported(geom, self.dtype)
        if refusal is not None:
            raise BackendError(refusal)
        hardware = self._hardware.get(device)
        if hardware is None:
            cuda_device = self._xp.cuda.Device(device)
            hardware = self._hardware[device] = device_hardware(cuda_device.attributes, cuda_device.compute_capability)
        if self.precision != "highest":
            capability = int(self._xp.cuda.Device(device).compute_capability)
            if capability < TENSOR_CORE_CAPABILITY:
                raise BackendError(f"precision {self.precision!r} needs TF32 tensor cores (compute capability "
                                   f"{TENSOR_CORE_CAPABILITY} or newer); this device's is {capability}")
        geometry_plan = plan(geom, hardware, self.tile_chooser, self.dtype, self.precision, self.direct_chooser,
                             self.wgmma_chooser)
        entry = KERNELS[(geom.family, geom.rank)]
        options = nvrtc_options(geometry_plan) + arch_option(geometry_plan)
        functions = self._functions(entry.source, entry.symbols, options, device)
        try:
            for kernel, shared_bytes in opted_in_shared(geometry_plan, hardware).items():
                functions[kernel].max_dynamic_shared_size_bytes = shared_bytes
        except self._errors as error:
            raise BackendError(f"{entry.source}: {error}") from error
        return Compiled(geom, geometry_plan, functions, _ITEMSIZES[self.dtype], _ITEMSIZES[self.scalar_dtype])

    def _functions(self, source_name: str, symbols: dict[str, str], options: tuple[str, ...],
                   device: int) -> dict[str, Any]:
        """Stage -> function of one generated source compiled with `options`, once per device."""
        functions = self._modules.get((source_name, options, device))
        if functions is None:
            source = (CUDA_SOURCES / source_name).read_text()
            try:
                module = self._xp.RawModule(code=source, options=options)
                functions = {stage: module.get_function(symbol) for stage, symbol in symbols.items()}
            except self._errors as error:
                raise BackendError(f"compiling {source_name} failed: {error}") from error
            self._modules[(source_name, options, device)] = functions
        return functions

    def _wrapping(self, geom: Geometry) -> Wrapping:
        """The pad and fold kernels of a circular conv, compiled once per geometry and device."""
        device = self._current_device()
        wrapping = self._wrappings.get((geom, device))
        if wrapping is None:
            refusal = unsupported(geom, self.dtype)
            if refusal is not None:
                raise BackendError(refusal)
            circular = circular_plan(geom, self.dtype)
            entry = CIRCULAR_KERNELS[geom.rank]
            functions = self._functions(entry.source, entry.symbols, circular.options, device)
            wrapping = self._wrappings[(geom, device)] = Wrapping(circular, functions)
        return wrapping

    def _stream_pointer(self) -> int:
        """The raw handle of the stream every kernel launches on: CuPy's current stream. A subclass may give
        another (convgen.torch gives torch's current stream); `_output` and `_scratch` are the only places
        buffers come from, so a subclass can take them from another allocator too."""
        return self._xp.cuda.get_current_stream().ptr

    # The ops.

    # The tape hands over arrays that `store` or a kernel made: the tape's dtype and C-contiguous.

    # Circular padding (SEMANTICS §8) with a nonzero padding runs the ordinary conv on the wrapped
    # input xp, made per call (forward and backward each pad once; the tape keeps no copy).

    def forward(self, geom: Geometry, inputs: tuple[Any, ...]) -> tuple[Any, Any]:
        if geom.circular and any(geom.padding):
            weight, bias, x = inputs
            wrapping = self._wrapping(geom)
            padded = wrapping.plan.padded
            return self.forward(padded, (weight, bias, self._wrap_stage(wrapping, "pad", geom, x, padded.input_shape)))
        compiled = self._compile(geom)
        if compiled.is_conv:
            weight, bias, x = inputs
            (y,) = replay(self, self._program(compiled, "forward", "conv_forward"), compiled.forward_scratch,
                          (x, weight, bias))
            return y, None
        (x,) = inputs  # run directly: for one launch replay costs more Python than it saves (the host path replays it)
        return self._pool_forward(compiled, self._address(x))

    def _program(self, compiled: Compiled, key: Any, pass_name: str, *leading: Any) -> Program:
        """The launch program of `compiled`'s pass `key` (launch_program), traced at its first call by running the
        backend's method `_{pass_name}` on `compiled`, `leading` and the addresses of the pass's inputs."""
        program = compiled.programs.get(key)
        if program is None:
            method = f"_{pass_name}"
            program = compiled.programs[key] = trace(
                self, compiled.pass_inputs[pass_name],
                lambda tracer, *addresses: getattr(tracer, method)(compiled, *leading, *addresses))
        return program

    def backward(self, geom: Geometry, inputs: tuple[Any, ...], saved: Any, grad: Any,
                 wanted: tuple[bool, ...] | None = None) -> tuple[Any, ...]:
        if geom.circular and any(geom.padding):  # the gradients on xp; xp's folded back onto x
            weight, bias, x = inputs
            wrapping = self._wrapping(geom)
            padded = wrapping.plan.padded
            # Only the weight gradient reads the input: without it x stands in for xp, unread (the stages take
            # their shapes from the geometry).
            wants_weight = wanted is None or wanted[0]
            x_padded = self._wrap_stage(wrapping, "pad", geom, x, padded.input_shape) if wants_weight else x
            grad_weight, grad_bias, grad_padded = self.backward(padded, (weight, bias, x_padded), saved, grad, wanted)
            del x_padded  # scratch: free before the fold allocates dx
            grad_x = None if grad_padded is None else self._wrap_stage(wrapping, "fold", geom, grad_padded, x.shape)
            return grad_weight, grad_bias, grad_x
        compiled = self._compile(geom)
        if compiled.is_conv:
            weight, _, x = inputs  # the bias is not read: its gradient has the geometry's out_c
            wanted = (True, True, True) if wanted is None else tuple(wanted)
            program = self._program(compiled, ("backward", *wanted), "conv_backward", wanted)
            return replay(self, program, compiled.backward_scratch[wanted], (x, weight, grad))
        (x,) = inputs
        kept = () if saved is None else saved if type(saved) is tuple else (saved,)
        address = self._address
        return (self._pool_backward(compiled, address(x), address(grad), *(address(array) for array in kept)),)


from convgen.tape import Node, OpRecord  # noqa: E402
from convgen.tape import Tape as _BaseTape  # noqa: E402  (the tape imports geometry, not this module)


class Tape(_BaseTape):
    """The CUDA tape: CuPy arrays (float32, or float64 with Tape(dtype="float64")) on the current
    device, computed by generated kernels."""

    backend_class = CupyBackend
    _apply = tape_apply(_BaseTape._apply, Node, OpRecord)
