"""The CUDA backend: CuPy arrays in, the generated sources of `convgen.generated` compiled with NVRTC
for one geometry at a time (the -D defines and launch plan of `convgen.cuda_launch`), one kernel
launch per stage out; and `Tape`, the CUDA tape that runs on it.

CuPy is imported when the backend is constructed, so `import convgen.cuda` works without it.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import numpy as np
from convgen.backend import BackendError
from convgen.cuda_launch import NVRTC_OPTIONS, Plan, plan
from convgen.generated.kernels import KERNELS
from convgen.geometry import Family, Geometry

# Poison for outputs in the test mode: NaN, and for the argmax offsets a value no window has.
_POISON = {np.dtype(np.float32): np.float32("nan"), np.dtype(np.uint8): np.uint8(0xFF),
           np.dtype(np.uint16): np.uint16(0xFFFF), np.dtype(np.uint32): np.uint32(0xFFFFFFFF)}


def _geometry_key(geom: Geometry) -> tuple:
    """What a compiled module depends on: everything but β (a kernel argument)."""
    return (geom.family, geom.in_c, geom.out_c, geom.in_spatial, geom.kernel, geom.stride, geom.padding)


class _Compiled:
    """One geometry's kernels, ready to launch: stage -> (function, grid, block), stages with
    nothing to write left out, and the plan they came from."""

    def __init__(self, plan: Plan, functions: dict[str, Any]) -> None:
        self.plan = plan
        self.launches = {stage: (functions[stage], (launch.grid,), (launch.block,), launch.shared_bytes)
                         for stage, launch in plan.launches.items() if launch.grid}


class CupyBackend:
    """Runs every op with the generated CUDA kernels on the current CuPy device; deterministic
    (no atomics), float32 throughout."""

    name = "cuda"
    buffer_label = "CUDA"
    # Test hook: fill every output with NaN before its kernel runs, so an element a kernel forgets
    # to write shows up. Set it on a subclass (tests/test_cuda.py does).
    poison_outputs = False

    def __init__(self) -> None:
        try:
            import cupy
            import cupy.cuda.compiler
        except ImportError as error:
            raise BackendError(f"the CUDA tape needs CuPy ({error})") from error
        self._xp = cupy
        self._errors: tuple[type[BaseException], ...] = (
            cupy.cuda.compiler.CompileException, cupy.cuda.driver.CUDADriverError,
            cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.memory.OutOfMemoryError)
        self._compiled: dict[tuple, _Compiled] = {}

    # Arrays.

    def store(self, value: Any) -> Any:
        """Device float32 C-contiguous arrays are taken as they are; everything else is copied."""
        cupy = self._xp
        if not isinstance(value, (cupy.ndarray, np.ndarray)) and hasattr(value, "__dlpack__"):
            try:
                value = cupy.from_dlpack(value)
            except (BufferError, RuntimeError, TypeError, ValueError):
                value = np.asarray(value)  # host memory: copied below
        if isinstance(value, cupy.ndarray):
            if value.dtype == cupy.float32 and value.flags.c_contiguous:
                return value
            return cupy.ascontiguousarray(value, dtype=cupy.float32)
        return cupy.asarray(np.ascontiguousarray(value, dtype=np.float32))

    def zeros(self, shape: tuple[int, ...]) -> Any:
        return self._xp.zeros(shape, self._xp.float32)

    def device_of(self, array: Any) -> str:
        if isinstance(array, self._xp.ndarray):
            return f"cuda:{array.data.device_id}"
        if isinstance(array, np.ndarray):
            return "cpu"
        kind, index = array.__dlpack_device__()
        return f"dlpack device {int(kind)}:{index}"

    @property
    def device(self) -> str:
        return f"cuda:{self._xp.cuda.runtime.getDevice()}"

    def _output(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        array = self._xp.empty(shape, dtype)
        if self.poison_outputs:
            array.fill(_POISON[np.dtype(dtype)])
        return array

    # Compiling and launching.

    def _compile(self, geom: Geometry) -> _Compiled:
        """The kernels of `geom`, compiled once per geometry and device (CuPy also caches the
        binary on disk, keyed by source and options, across processes)."""
        key = (*_geometry_key(geom), self._xp.cuda.runtime.getDevice())
        compiled = self._compiled.get(key)
        if compiled is None:
            entry = KERNELS[(geom.family, geom.rank)]
            geometry_plan = plan(geom)
            source = (importlib.resources.files("convgen.generated") / "cuda" / entry.source).read_text()
            try:
                module = self._xp.RawModule(code=source, options=NVRTC_OPTIONS + geometry_plan.defines)
                functions = {stage: module.get_function(symbol) for stage, symbol in entry.symbols.items()}
            except self._errors as error:
                raise BackendError(f"compiling {entry.source} failed: {error}") from error
            compiled = self._compiled[key] = _Compiled(geometry_plan, functions)
        return compiled

    def _launch(self, compiled: _Compiled, stage: str, *args: Any) -> None:
        launch = compiled.launches.get(stage)
        if launch is None:
            return  # nothing to write
        function, grid, block, shared_bytes = launch
        try:
            function(grid, block, args, shared_mem=shared_bytes)
        except self._errors as error:
            raise BackendError(f"{stage} kernel failed: {error}") from error

    def _gemm(self, compiled: _Compiled, stage: str, out: Any, *args: Any) -> None:
        """An implicit-GEMM stage into `out`; when the plan splits its reduction, into a partial
        buffer [split, *out.shape] that the stage's reduce kernel adds up in a fixed order."""
        split = compiled.plan.splits[stage]
        if split == 1:
            self._launch(compiled, stage, *args, out)
            return
        partial = self._output((split, *out.shape))
        self._launch(compiled, stage, *args, partial)
        self._launch(compiled, f"{stage}_reduce", partial, out)

    # The ops.

    # The tape hands over arrays that `store` or a kernel made: float32 and C-contiguous.

    def forward(self, geom: Geometry, inputs: tuple[Any, ...]) -> tuple[Any, Any]:
        compiled = self._compile(geom)
        y = self._output(geom.output_shape)
        family = geom.family
        if family.is_conv:
            weight, bias, x = inputs
            self._gemm(compiled, "forward", y, x, weight, bias)
            return y, None
        (x,) = inputs
        if family is Family.MAX_POOL:
            argmax = self._output(geom.output_shape, compiled.plan.argmax_dtype)  # window offset of each max
            self._launch(compiled, "forward", x, y, argmax)
            return y, argmax
        if family is Family.AVG_POOL:
            self._launch(compiled, "forward", x, y)
            return y, None
        pivots, sums = self._output(geom.output_shape), self._output(geom.output_shape)
        self._launch(compiled, "forward", x, np.float32(geom.beta), y, pivots, sums)
        return y, (pivots, sums)

    def backward(self, geom: Geometry, inputs: tuple[Any, ...], saved: Any, grad: Any) -> tuple[Any, ...]:
        compiled = self._compile(geom)
        family = geom.family
        if family.is_conv:
            weight, bias, x = inputs
            d_x, d_weight, d_bias = self._output(x.shape), self._output(weight.shape), self._output(bias.shape)
            self._gemm(compiled, "backward_input", d_x, grad, weight)
            # The weight gradient reduces over the cells of D against U: g and x for conv, x and g
            # for the transpose (whose roles of input and output are swapped).
            d_values, u_values = (grad, x) if family is Family.CONV else (x, grad)
            self._gemm(compiled, "backward_weight", d_weight, d_values, u_values)
            self._launch(compiled, "backward_bias", grad, d_bias)
            return d_weight, d_bias, d_x
        (x,) = inputs
        d_x = self._output(x.shape)
        if family is Family.MAX_POOL:
            self._launch(compiled, "backward_input", grad, saved, d_x)
        elif family is Family.AVG_POOL:
            self._launch(compiled, "backward_input", grad, d_x)
        else:
            pivots, sums = saved
            self._launch(compiled, "backward_input", x, grad, pivots, sums, np.float32(geom.beta), d_x)
        return (d_x,)


from convgen.tape import Tape as _BaseTape  # noqa: E402  (the tape imports geometry, not this module)


class Tape(_BaseTape):
    """The CUDA tape: CuPy float32 arrays on the current device, computed by generated kernels."""

    backend_class = CupyBackend
