"""The CUDA backend: CuPy arrays in, the generated sources of `convgen.generated` compiled with NVRTC
for one geometry at a time (the -D defines and launch plan of `convgen.cuda_launch`), one kernel
launch per stage out; and `Tape`, the CUDA tape that runs on it. Each kernel's arguments are
built from its parameter list in the generated contract, by role.

CuPy is imported when the backend is constructed, so `import convgen.cuda` works without it.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
from convgen.backend import BackendError, OutOfMemory
from convgen.circular import CircularPlan, circular_plan, fits_padded
from convgen.cuda_launch import (
    BLOCK,
    CUDA_SOURCES,
    H200,
    Hardware,
    Plan,
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
    BIAS_STAGE,
    CIRCULAR_KERNELS,
    CIRCULAR_STAGES,
    KERNELS,
    LAUNCH_GROUPS,
    STAGES,
    Param,
)
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import WgmmaChooser, choose_wgmma

CUPY_EXTRA = "pip install 'convgen[cuda13]' (or 'convgen[cuda12]' for a CUDA 12 driver)"
# The H200 sustained 1.7 GHz of its 1.98 GHz boost clock under the tile sweep's load; other
# devices are taken to sustain the same share of the boost clock they report.
SUSTAINED_CLOCK_SHARE = H200.clock_hz / 1.98e9
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
    device does not report (the register cap, the driver's per-block reserve, the bandwidth) is the H200's."""
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
        memory_bandwidth=H200.memory_bandwidth,
        wgmma=compute_capability == WGMMA_CAPABILITY,
    )


def unsupported(geom: Geometry, dtype: str) -> str | None:
    """What of SEMANTICS §8 the CUDA kernels do not compute yet, as the refusal's text; None when
    they compute all of `geom` in `dtype`. Refused, never computed wrong. Both dtypes are computed
    (kernels compiled per element type); only a wrapped input past 32-bit indexing is left."""
    if geom.circular and not fits_padded(geom):
        return "circular padding whose wrapped input reaches 2^32 elements is not supported on the CUDA tape yet"
    return None


# cuLaunchKernel's status where the calling thread has no CUDA context bound (CUDA_ERROR_INVALID_CONTEXT).
_NO_CONTEXT = 201


def _float_bits(value: np.float32) -> int:
    return int(value.view(np.uint32))


def _array_address(value: Any) -> int:
    return value.data.ptr

# How many geometries the identity-keyed front of the compile cache holds before it starts over (the
# size of Geometry.build's cache, which interns them).
IDENTITY_CACHE_SIZE = 4096


def _arguments_of(params: tuple[Param, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """role -> value to a kernel's argument tuple, in the order of its `params`: one C-level call per
    launch instead of a generator over the parameters."""
    pick = operator.itemgetter(*(param.role for param in params))
    return pick if len(params) > 1 else lambda values: (pick(values),)


# Family -> stage -> the role of the stage's output (its first non-const parameter; a GEMM stage's only
# one), which _into_output fills per call: worked out once.
_OUTPUT_ROLES: dict[Family, dict[str, str]] = {
    family: {stage: next(p.role for p in params if not p.const) for stage, params in stages.items()}
    for family, stages in STAGES.items()}
# Family -> stage -> the role of the input its `<stage>_wgpack` packs (the weight, or the weight gradient's D), which
# the stage reads in the packed operand's place where the pack would only copy it (Plan.copied_packs).
_PACKED_ROLES: dict[Family, dict[str, str]] = {
    family: {stage.removesuffix("_wgpack"): params[0].role for stage, params in stages.items()
             if stage.endswith("_wgpack")}
    for family, stages in STAGES.items()}
# Family -> stage -> the role of the input a `<stage>_wgsource` kernel lays out (the stage's source, the weight
# gradient's U), which the stage then reads from its output instead: worked out once.
_RESTAGED_ROLES: dict[Family, dict[str, str]] = {
    family: {stage.removesuffix("_wgsource"): params[0].role for stage, params in stages.items()
             if stage.endswith("_wgsource")}
    for family, stages in STAGES.items()}


class _Compiled:
    """One geometry's kernels, ready to launch: stage -> (function, grid, block, shared bytes, arguments, kernel),
    stages with nothing to write left out; launch group -> (function, its members with the number of parameters
    each takes); and the plan they came from. What each call needs is resolved here once, a function as the
    driver's handle of it on the device compiled for (CuPy's RawKernel resolves it per call). The functions are
    shared by every geometry with the same defines (the batch is a kernel argument)."""

    def __init__(self, geom: Geometry, plan: Plan, functions: dict[str, Any]) -> None:
        self.family = geom.family
        self.is_conv = geom.family.is_conv
        self.images = np.uint32(geom.images)
        self.plan = plan
        params = STAGES[geom.family]
        self.launches = {stage: (functions[launch.kernel or stage].kernel.ptr, (launch.grid,), (launch.block,),
                                 launch.shared_bytes, _arguments_of(params[launch.kernel or stage]),
                                 launch.kernel or stage)
                         for stage, launch in plan.launches.items() if launch.grid}
        self.groups = {group: (functions[group].kernel.ptr, tuple((member, len(params[member])) for member in members))
                       for group, members in LAUNCH_GROUPS[geom.family].items()}


class _Wrapping:
    """A circular conv's pad and fold kernels, ready to launch: stage -> (function, blocks), and
    the plan they came from (convgen.circular)."""

    def __init__(self, plan: CircularPlan, functions: dict[str, Any]) -> None:
        self.plan = plan
        self.launches = {"pad": (functions["pad"].kernel.ptr, plan.pad_blocks),
                         "fold": (functions["fold"].kernel.ptr, plan.fold_blocks)}


class CupyBackend:
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
        self._launch_kernel = cupy.cuda.driver.launchKernel
        self._driver_error = cupy.cuda.driver.CUDADriverError
        # type -> how an argument of exactly that type fills its launch slot (_slots); any other goes through _slot.
        self._slot_of: dict[type, Callable[[Any], int]] = {int: int, np.uint32: int, np.float32: _float_bits,
                                                           cupy.ndarray: _array_address}
        self._errors: tuple[type[BaseException], ...] = (
            cupy.cuda.compiler.CompileException, cupy.cuda.driver.CUDADriverError,
            cupy.cuda.runtime.CUDARuntimeError)
        self._compiled: dict[tuple[Geometry, int], _Compiled] = {}
        # (id(geom), device) -> (geom, its _Compiled): the per-call lookup, without hashing the geometry's
        # fields. It holds `geom` itself, so the id keying an entry is never reused while the entry lives.
        self._compiled_by_identity: dict[tuple[int, int], tuple[Geometry, _Compiled]] = {}
        self._wrappings: dict[tuple[Geometry, int], _Wrapping] = {}
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
            return cupy.ascontiguousarray(value, dtype=STORAGE_DTYPES[self.dtype])
        return cupy.asarray(np.ascontiguousarray(value, dtype=STORAGE_DTYPES[self.dtype]))

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

    def _like(self, array: Any) -> Any:
        """Scratch of `array`'s shape in the backend's dtype (a packed weight)."""
        return self._scratch(array.shape)

    # Compiling and launching.

    def _compile(self, geom: Geometry) -> _Compiled:
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

    def _compiled_anew(self, geom: Geometry, device: int) -> _Compiled:
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
        return _Compiled(geom, geometry_plan, functions)

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

    def _wrapping(self, geom: Geometry) -> _Wrapping:
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
            wrapping = self._wrappings[(geom, device)] = _Wrapping(circular, functions)
        return wrapping

    def _stream_pointer(self) -> int:
        """The raw handle of the stream every kernel launches on: CuPy's current stream. A subclass may give
        another (convgen.torch gives torch's current stream); `_output`, `_scratch` and `_like` are the only places
        buffers come from, so a subclass can take them from another allocator too."""
        return self._xp.cuda.get_current_stream().ptr

    def _slots(self, args: tuple[Any, ...]) -> array:
        """The kernel arguments as 8-byte slots of cuLaunchKernel's parameters: a device array's or bare
        allocation's address, or a 32-bit scalar's bits (images, a float beta) in the low bytes, of which the
        driver reads the parameter's own size (a launch group's block counts and the zeros of a member it does not
        run are ints). Looked up by type: a method call an argument cost 0.7 µs a
        five-argument launch on the development machine."""
        slot_of, slot = self._slot_of, self._slot
        return array("Q", [(slot_of.get(type(value)) or slot)(value) for value in args])

    def _slot(self, value: Any) -> int:
        """The slot of an argument whose exact type _slot_of does not know (a subclass, a bare allocation)."""
        if isinstance(value, self._xp.ndarray):
            return value.data.ptr
        return value.ptr  # a bare allocation (_scratch)

    def _call(self, stage: str, function: int, grid: tuple[int], block: tuple[int], shared_bytes: int,
              args: tuple[Any, ...]) -> None:
        """One kernel launch, through CuPy's binding of the driver's cuLaunchKernel: its parameters an array of
        pointers to 8-byte slots, one an argument. CuPy's own launch converts each argument to an object first:
        0.9-1.8 µs a launch more on four of five H200 hosts, the same on the fifth (benchmarks/launch_parts.py)."""
        slots = self._slots(args)
        first = slots.buffer_info()[0]
        parameters = array("Q", range(first, first + 8 * len(slots), 8))
        launch = (function, grid[0], 1, 1, block[0], 1, 1, shared_bytes, self._stream_pointer(),
                  parameters.buffer_info()[0], 0)
        try:
            try:
                self._launch_kernel(*launch)
            except self._driver_error as error:
                if error.status != _NO_CONTEXT:
                    raise
                # A thread whose CUDA calls so far needed no context (CuPy's pool can hand out a cached block
                # without one) has none bound: a runtime call binds the current device's, as CuPy's launch does.
                self._xp.cuda.runtime.memGetInfo()
                self._launch_kernel(*launch)
        except self._errors as error:
            raise BackendError(f"{stage} kernel failed: {error}") from error

    def _wrap_stage(self, wrapping: _Wrapping, stage: str, geom: Geometry, source: Any,
                    output_shape: tuple[int, ...]) -> Any:
        """`pad` (source x, output xp) or `fold` (source dxp, output dx) of a circular conv, into a new array."""
        output = self._output(output_shape)
        source_role, output_role = (p.role for p in CIRCULAR_STAGES[stage] if p.pointer)
        function, blocks = wrapping.launches[stage]
        if blocks:
            values = {source_role: source, "images": np.uint32(geom.images), output_role: output}
            self._call(stage, function, (blocks,), (BLOCK,), 0, tuple(values[p.role] for p in CIRCULAR_STAGES[stage]))
        return output

    def _launch(self, compiled: _Compiled, stage: str, values: dict[str, Any],
                group: dict[str, tuple[Any, ...]] | None = None) -> None:
        """Run `stage` with its arguments taken from `values` by the roles of its parameters (the
        contract's order), or with `group` (kernel -> its launch) add it there, for _launch_group; a stage with
        nothing to write is skipped, an unknown one is an error."""
        launch = compiled.launches.get(stage)
        if launch is None:
            if stage not in STAGES[compiled.family]:
                known = ", ".join(STAGES[compiled.family])
                raise ValueError(f"{compiled.family.value} has no stage {stage!r} (stages: {known})")
            return  # nothing to write
        function, grid, block, shared_bytes, arguments, kernel = launch
        if group is None:
            self._call(stage, function, grid, block, shared_bytes, arguments(values))
        else:
            group[kernel] = (function, grid, block, shared_bytes, arguments(values))

    def _launch_group(self, compiled: _Compiled, group: str, queued: dict[str, tuple[Any, ...]]) -> None:
        """The launches `queued` for `group` (kernel -> function, grid, block, shared bytes, arguments; every member's
        block is BLOCK threads, with no dynamic shared memory: cuda_launch checks) as one launch of the group's kernel,
        its grid their blocks in member order; one alone is launched as itself."""
        if len(queued) < 2:
            for kernel, (function, grid, block, shared_bytes, args) in queued.items():
                self._call(kernel, function, grid, block, shared_bytes, args)
            return
        function, members = compiled.groups[group]
        args: list[Any] = []
        blocks: list[int] = []
        for member, parameters in members:
            launch = queued.get(member)
            args.extend((0,) * parameters if launch is None else launch[4])
            blocks.append(0 if launch is None else launch[1][0])
        if len(queued) != sum(1 for count in blocks if count):
            raise ValueError(f"{group} does not run {sorted(set(queued) - {member for member, _ in members})}")
        self._call(group, function, (sum(blocks),), (BLOCK,), 0, (*args, *blocks))

    def _operands(self, compiled: _Compiled, stage: str, values: dict[str, Any], prep: dict[str, tuple[Any, ...]],
                  staged: dict[str, Any] | None = None) -> dict[str, Any]:
        """`values` as the implicit-GEMM `stage` reads them, the launches that lay them out added to `prep`, its pass's
        launch group (_launch_group), launched before the stage. A stage the plan packs
        reads the weight as its `_pack` kernel lays it out, in a scratch buffer of the weight's size (a `_wgmma` stage:
        its `_wgpack`'s output, of its plan's packed_elements, which it reads beside its inputs); a 16-bit `_wgmma`
        stage reads its source (the weight gradient's U) as its `_wgsource` lays it out (source_elements), in its place;
        `staged`, role -> such a copy made by an earlier stage of the same pass, which a stage reading that role's
        copy takes instead of laying it out again (the transpose's input and weight gradients both read the upstream
        gradient channels-last, whose layout a role fixes), and to which it adds its own."""
        if stage in compiled.plan.copied_packs:  # its input is laid out as its `_wgpack` would write it
            family = compiled.family
            values = {**values, _OUTPUT_ROLES[family][f"{stage}_wgpack"]: values[_PACKED_ROLES[family][stage]]}
        elif f"{stage}_pack" in compiled.launches:
            elements = compiled.plan.packed_elements.get(stage)  # a `_wgpack`'s, which its `_wgmma` reads beside
            if elements is None:
                packed = self._like(values["weight"])
                self._launch(compiled, f"{stage}_pack", {"weight": values["weight"], "packed_weight": packed}, prep)
                values = {**values, "weight": packed}
            else:
                role = _OUTPUT_ROLES[compiled.family][f"{stage}_wgpack"]  # the packed weight, or D's
                values = {**values, role: self._scratch((elements,), "float32")}
                self._launch(compiled, f"{stage}_pack", values, prep)
        source_elements = compiled.plan.source_elements.get(stage)
        if source_elements is not None:  # a 16-bit `_wgmma` stage reads its source channels-last
            role = _RESTAGED_ROLES[compiled.family][stage]
            copy = None if staged is None else staged.get(role)
            if copy is None:
                copy = self._scratch((source_elements,), "float32")
                self._launch(compiled, f"{stage}_wgsource", {**values, "staged_source": copy}, prep)
                if staged is not None:
                    staged[role] = copy
            values = {**values, role: copy}
        return values

    def _into_output(self, compiled: _Compiled, stage: str, values: dict[str, Any], output_shape: tuple[int, ...],
                     group: dict[str, tuple[Any, ...]] | None = None,
                     reduces: dict[str, tuple[Any, ...]] | None = None) -> Any:
        """`stage` into a new output of `output_shape` (the kernel's non-const parameter), returned; when the
        plan splits the stage's reduction, into a partial buffer [split, *output_shape] that the stage's
        reduce kernel adds up in a fixed order. Launched now, or the stage added to `group` and its reduce to
        `reduces` (launch groups, _launch_group) where given."""
        role = _OUTPUT_ROLES[compiled.family][stage]
        output = self._output(output_shape)
        split = compiled.plan.splits[stage]
        if split == 1:
            self._launch(compiled, stage, {**values, role: output}, group)
            return output
        partial = self._scratch((split, *output_shape), self.scalar_dtype)
        self._launch(compiled, stage, {**values, role: partial}, group)
        self._launch(compiled, f"{stage}_reduce", {**values, role: output, "partial": partial}, reduces)
        return output

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
        images = compiled.images
        family = compiled.family
        if compiled.is_conv:
            weight, bias, x = inputs
            prep: dict[str, tuple[Any, ...]] = {}
            values = self._operands(compiled, "forward", {"x": x, "weight": weight, "bias": bias, "images": images},
                                    prep)
            self._launch_group(compiled, "forward_prep", prep)
            return self._into_output(compiled, "forward", values, geom.output_shape), None
        (x,) = inputs
        y = self._output(geom.output_shape)
        values = {"x": x, "y": y, "images": images}
        if family is Family.MAX_POOL:
            saved = values["argmax"] = self._scratch(geom.output_shape, compiled.plan.argmax_dtype)  # window offsets
        elif family is Family.SMOOTH_MAX_POOL:
            saved = values["pivots"], values["sums"] = (self._scratch(geom.output_shape, self.scalar_dtype),
                                                        self._scratch(geom.output_shape, self.scalar_dtype))
            values["beta"] = np.float32(geom.beta)
        else:
            saved = None
        self._launch(compiled, "forward", values)
        return y, saved

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
        images = compiled.images
        family = compiled.family
        if compiled.is_conv:
            weight, _, x = inputs  # the bias is not read: its gradient has the geometry's out_c
            wants_weight, wants_bias, wants_x = (True, True, True) if wanted is None else wanted
            values = {"x": x, "weight": weight, "grad": grad, "images": images}
            staged: dict[str, Any] = {}  # channels-last copies of the pass's inputs, by role
            # Launch groups: the layouts both GEMMs read and the bias gradient (its parts), then the GEMMs, then the
            # weight and bias gradients' reduces.
            prep: dict[str, tuple[Any, ...]] = {}
            reduces: dict[str, tuple[Any, ...]] = {}
            input_values = self._operands(compiled, "backward_input", values, prep, staged) if wants_x else None
            weight_values = self._operands(compiled, "backward_weight", values, prep, staged) if wants_weight else None
            grad_bias = (self._into_output(compiled, BIAS_STAGE, values, (geom.out_c,), prep, reduces) if wants_bias
                         else None)
            self._launch_group(compiled, "backward_prep", prep)
            grad_x = self._into_output(compiled, "backward_input", input_values, geom.input_shape) if wants_x else None
            grad_weight = (self._into_output(compiled, "backward_weight", weight_values, weight.shape, reduces=reduces)
                           if wants_weight else None)
            self._launch_group(compiled, "backward_reduces", reduces)
            return grad_weight, grad_bias, grad_x
        (x,) = inputs
        values = {"x": x, "grad": grad, "images": images, "grad_x": self._output(x.shape)}
        if family is Family.MAX_POOL:
            values["argmax"] = saved
        elif family is Family.SMOOTH_MAX_POOL:
            values["pivots"], values["sums"] = saved
            values["beta"] = np.float32(geom.beta)
        self._launch(compiled, "backward_input", values)
        return (values["grad_x"],)


from convgen.tape import Tape as _BaseTape  # noqa: E402  (the tape imports geometry, not this module)


class Tape(_BaseTape):
    """The CUDA tape: CuPy arrays (float32, or float64 with Tape(dtype="float64")) on the current
    device, computed by generated kernels."""

    backend_class = CupyBackend
