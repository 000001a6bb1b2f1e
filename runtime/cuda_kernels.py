"""A geometry's compiled kernels and how the CUDA backend launches them: `Compiled` and `Wrapping` resolve once per
geometry what each launch needs (the driver's function handles, grids, argument tuples by role, launch groups), and
`KernelLaunches` is the backend's launching half: each argument in an 8-byte slot, the launch through the driver,
launch groups, an implicit-GEMM stage's operand layouts and output, and a conv pass as its launch program traces it.

CuPy comes from the backend (`_bind_driver`), so this module imports without it.
"""

from __future__ import annotations

import operator
import threading
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from convgen.backend import BackendError
from convgen.circular import CircularPlan
from convgen.cuda_launch import BLOCK, Plan
from convgen.generated.contract import BIAS_STAGE, CIRCULAR_STAGES, LAUNCH_GROUPS, STAGES, Param
from convgen.geometry import Family, Geometry
from convgen.scratch_layout import (
    BACKWARD_STAGES,
    OUTPUT_ROLES,
    PACKED_ROLES,
    RESTAGED_ROLES,
    ScratchLayout,
    StageScratch,
    backward_layouts,
    output_shape,
    scratch_layout,
)

# cuLaunchKernel's status where the calling thread has no CUDA context bound (CUDA_ERROR_INVALID_CONTEXT).
_NO_CONTEXT = 201
# The most parameters any generated kernel takes (a launch group's).
MAX_PARAMETERS = max(len(params) for stages in (*STAGES.values(), CIRCULAR_STAGES) for params in stages.values())


class _ParameterSlots(threading.local):
    """Per thread: MAX_PARAMETERS 8-byte slots for a launch's arguments and the array of pointers to them that
    cuLaunchKernel takes, made once. The driver copies the arguments during the call, so the next launch may write
    the slots again; made per launch the pointers took 0.6-1.5 µs of Python (the development machine)."""

    def __init__(self) -> None:
        self.slots = array("Q", bytes(8 * MAX_PARAMETERS))
        first = self.slots.buffer_info()[0]
        self.pointers = array("Q", range(first, first + 8 * MAX_PARAMETERS, 8))
        self.address = self.pointers.buffer_info()[0]


_PARAMETER_SLOTS = _ParameterSlots()


def float_bits(value: float) -> int:
    """The bits of `value` rounded to float32, as a kernel's float parameter reads them from its slot."""
    return int(np.float32(value).view(np.uint32))


# How many arrays a pool's forward keeps for its backward (_pool_forward): a max pool's window offsets, a smooth max
# pool's pivots and sums.
POOL_KEPT = {Family.AVG_POOL: 0, Family.MAX_POOL: 1, Family.SMOOTH_MAX_POOL: 2}


def _array_address(value: Any) -> int:
    return value.data.ptr


def _arguments_of(params: tuple[Param, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """role -> value to a kernel's argument tuple, in the order of its `params`: one C-level call per
    launch instead of a generator over the parameters."""
    pick = operator.itemgetter(*(param.role for param in params))
    return pick if len(params) > 1 else lambda values: (pick(values),)


class Compiled:
    """One geometry's kernels, ready to launch: stage -> (function, grid, block, shared bytes, arguments, kernel),
    stages with nothing to write left out; launch group -> (function, its members each with the zeros it gets
    when the call does not run it, one a parameter); a conv's stage outputs' shapes, each pass's scratch layout
    and the shapes of its inputs; and the plan they came from. What each call needs is resolved here once, a
    function as the driver's handle of it on the device compiled for (CuPy's RawKernel resolves it per call). The
    functions are shared by every geometry with the same defines (the batch is a kernel argument). `element_bytes`
    and `scalar_bytes` are the sizes of the backend's elements and of the type it sums in."""

    def __init__(self, geom: Geometry, plan: Plan, functions: dict[str, Any], element_bytes: int,
                 scalar_bytes: int) -> None:
        self.family = geom.family
        self.is_conv = geom.family.is_conv
        self.images = geom.images
        self.beta_bits = float_bits(geom.beta) if geom.family is Family.SMOOTH_MAX_POOL else 0
        self.plan = plan
        params = STAGES[geom.family]
        self.launches = {stage: (functions[launch.kernel or stage].kernel.ptr, (launch.grid,), (launch.block,),
                                 launch.shared_bytes, _arguments_of(params[launch.kernel or stage]),
                                 launch.kernel or stage)
                         for stage, launch in plan.launches.items() if launch.grid}
        self.groups = {group: (functions[group].kernel.ptr, tuple((member, (0,) * len(params[member]))
                                                                  for member in members))
                       for group, members in LAUNCH_GROUPS[geom.family].items()}
        # "forward" or ("backward", *wanted) -> the pass's launches, traced at its first call (launch_program)
        self.programs: dict[Any, Any] = {}
        if self.is_conv:
            self.output_shapes = {stage: output_shape(geom, stage) for stage in ("forward", *BACKWARD_STAGES)}
            self.forward_scratch = scratch_layout(geom, plan, ("forward",), element_bytes, scalar_bytes)
            # (wants weight, wants bias, wants input) -> the backward's scratch
            self.backward_scratch = backward_layouts(geom, plan, element_bytes, scalar_bytes)
            weight, bias, x = geom.parent_shapes
            self.pass_inputs = {"conv_forward": (x, weight, bias), "conv_backward": (x, weight, geom.output_shape)}
        else:
            self.input_shape, self.output_shape = geom.input_shape, geom.output_shape
            # The backward reads the input, its output's gradient and what the forward kept, each output-shaped. The
            # gradient, which every pool's backward reads, comes first of those: where the input's gradient has its
            # shape it is made like the gradient (launch_program.trace), never like window offsets of another dtype.
            backward_inputs = (geom.input_shape, *(geom.output_shape,) * (1 + POOL_KEPT[geom.family]))
            self.pass_inputs = {"pool_forward": geom.parent_shapes, "pool_backward": backward_inputs}


class Wrapping:
    """A circular conv's pad and fold kernels, ready to launch: stage -> (function, blocks), and
    the plan they came from (convgen.circular)."""

    def __init__(self, plan: CircularPlan, functions: dict[str, Any]) -> None:
        self.plan = plan
        self.launches = {"pad": (functions["pad"].kernel.ptr, plan.pad_blocks),
                         "fold": (functions["fold"].kernel.ptr, plan.fold_blocks)}


class KernelLaunches:
    """The launching half of convgen.cuda's CupyBackend. The backend provides `_xp` (CuPy), `_errors` (the CUDA
    errors a launch may raise), `scalar_dtype`, the buffers (`_output`, `_scratch`) and `_stream_pointer`,
    and calls `_bind_driver` when it is made."""

    def _bind_driver(self, cupy: Any) -> None:
        """The driver's launch and its error, and the address readers of the array types every backend passes."""
        self._launch_kernel = cupy.cuda.driver.launchKernel
        self._driver_error = cupy.cuda.driver.CUDADriverError
        # type -> how to read the address of an array of exactly that type (_address); any other: _other_address.
        self._address_of: dict[type, Callable[[Any], int]] = {cupy.ndarray: _array_address}

    def _address(self, value: Any) -> int:
        """The device address of an array (or tensor, or bare allocation), as a kernel's pointer parameter takes it.
        The ops turn each array into its address once, where it comes in or is made, and launch with ints alone (an
        address, a count, a float's bits): one type lookup an array instead of one an argument of every launch."""
        return (self._address_of.get(type(value)) or self._other_address)(value)

    def _other_address(self, value: Any) -> int:
        """The address of an array whose exact type _address_of does not know (a subclass, a bare allocation)."""
        if isinstance(value, self._xp.ndarray):
            return value.data.ptr
        return value.ptr  # a bare allocation (_scratch)

    def _call(self, stage: str, function: int, grid: tuple[int], block: tuple[int], shared_bytes: int,
              args: Sequence[Any]) -> None:
        """One kernel launch, through CuPy's binding of the driver's cuLaunchKernel: its parameters an array of
        pointers to 8-byte slots, one an argument (ints: an address, or a 32-bit scalar in the low bytes, of which
        the driver reads the parameter's own size). CuPy's own launch converts each argument to an object first:
        0.9-1.8 µs a launch more on four of five H200 hosts, the same on the fifth (benchmarks/launch_parts.py)."""
        parameters = _PARAMETER_SLOTS
        if len(args) > MAX_PARAMETERS:  # would move the slots the pointers point to
            raise ValueError(f"{stage}: {len(args)} kernel arguments, more than any kernel's {MAX_PARAMETERS}")
        # As many as were there: the slots stay where they are. A traced program's launch brings its own array.
        parameters.slots[:len(args)] = args if type(args) is array else array("Q", args)
        launch = (function, grid[0], 1, 1, block[0], 1, 1, shared_bytes, self._stream_pointer(), parameters.address, 0)
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

    def _wrap_stage(self, wrapping: Wrapping, stage: str, geom: Geometry, source: Any,
                    output_shape: tuple[int, ...]) -> Any:
        """`pad` (source x, output xp) or `fold` (source dxp, output dx) of a circular conv, into a new array."""
        output = self._output(output_shape)
        source_role, output_role = (p.role for p in CIRCULAR_STAGES[stage] if p.pointer)
        function, blocks = wrapping.launches[stage]
        if blocks:
            values = {source_role: self._address(source), "images": geom.images, output_role: self._address(output)}
            self._call(stage, function, (blocks,), (BLOCK,), 0, tuple(values[p.role] for p in CIRCULAR_STAGES[stage]))
        return output

    def _launch(self, compiled: Compiled, stage: str, values: dict[str, Any],
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

    def _launch_group(self, compiled: Compiled, group: str, queued: dict[str, tuple[Any, ...]]) -> None:
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
        for member, zeros in members:
            launch = queued.get(member)
            if launch is None:
                args += zeros
                blocks.append(0)
            else:
                args += launch[4]
                blocks.append(launch[1][0])
        if len(queued) != len(blocks) - blocks.count(0):
            raise ValueError(f"{group} does not run {sorted(set(queued) - {member for member, _ in members})}")
        args += blocks
        self._call(group, function, (sum(blocks),), (BLOCK,), 0, args)

    def _scratch_base(self, layout: ScratchLayout) -> tuple[Any, int]:
        """A pass's scratch as one allocation of `layout`'s size (None where it has none) and its address, to which
        the layout's offsets are added: kept by the caller until the pass's last launch is queued."""
        if not layout.size:
            return None, 0
        scratch = self._scratch((layout.size,), "uint8")
        return scratch, self._address(scratch)

    def _operands(self, compiled: Compiled, stage: str, values: dict[str, Any], prep: dict[str, tuple[Any, ...]],
                  buffers: StageScratch, base: int) -> dict[str, Any]:
        """`values` as the implicit-GEMM `stage` reads them, the launches that lay them out added to `prep`, its pass's
        launch group (_launch_group), launched before the stage; `buffers`, where in the pass's scratch (at address
        `base`) they go. A stage the plan packs reads the weight as its `_pack` kernel lays it out (a `_wgmma` stage:
        its `_wgpack`'s output, which it reads beside its inputs); a 16-bit `_wgmma` stage reads its source (the weight
        gradient's U) as a `_wgsource` lays it out, in its place, laid out once a pass per role."""
        family = compiled.family
        if stage in compiled.plan.copied_packs:  # its input is laid out as its `_wgpack` would write it
            values = {**values, OUTPUT_ROLES[family][f"{stage}_wgpack"]: values[PACKED_ROLES[family][stage]]}
        elif buffers.pack is not None:
            packed = base + buffers.pack
            if stage in compiled.plan.packed_elements:  # a `_wgpack`: the packed weight, or D's
                values = {**values, OUTPUT_ROLES[family][f"{stage}_wgpack"]: packed}
                self._launch(compiled, f"{stage}_pack", values, prep)
            else:
                self._launch(compiled, f"{stage}_pack", {"weight": values["weight"], "packed_weight": packed}, prep)
                values = {**values, "weight": packed}
        if buffers.source is not None:  # a 16-bit `_wgmma` stage reads its source channels-last
            copy = base + buffers.source
            if buffers.lays_out_source:
                self._launch(compiled, f"{stage}_wgsource", {**values, "staged_source": copy}, prep)
            values = {**values, RESTAGED_ROLES[family][stage]: copy}
        return values

    def _into_output(self, compiled: Compiled, stage: str, values: dict[str, Any], buffers: StageScratch, base: int,
                     group: dict[str, tuple[Any, ...]] | None = None,
                     reduces: dict[str, tuple[Any, ...]] | None = None, partials_queued: bool = False) -> Any:
        """`stage` into a new output of its shape (the kernel's non-const parameter), returned; when the plan splits
        the stage's reduction, into partial sums [split, *output shape] in the pass's scratch (`buffers.partial` from
        `base`) that the stage's reduce kernel adds up in a fixed order. Launched now, or the stage added to `group`
        and its reduce to `reduces` (launch groups, _launch_group) where given; `partials_queued`: the stage itself was
        queued already (_into_partials), only its reduce is left."""
        role = OUTPUT_ROLES[compiled.family][stage]
        output = self._output(compiled.output_shapes[stage])
        if buffers.partial is None:
            self._launch(compiled, stage, {**values, role: self._address(output)}, group)
            return output
        if not partials_queued:
            self._into_partials(compiled, stage, values, buffers, base, group)
        reduce_values = {**values, role: self._address(output), "partial": base + buffers.partial}
        self._launch(compiled, f"{stage}_reduce", reduce_values, reduces)
        return output

    def _into_partials(self, compiled: Compiled, stage: str, values: dict[str, Any], buffers: StageScratch, base: int,
                       group: dict[str, tuple[Any, ...]] | None) -> None:
        """A split `stage` into its partial sums in the pass's scratch, launched now or added to `group`; its reduce
        (into the output) comes with _into_output."""
        self._launch(compiled, stage, {**values, OUTPUT_ROLES[compiled.family][stage]: base + buffers.partial}, group)

    # A conv pass as traced into its program (convgen.launch_program): from its inputs' addresses, its scratch, the
    # launches of its layouts, GEMMs and reduces, and its outputs.

    def _pool_forward(self, compiled: Compiled, x: Any) -> tuple[Any, Any]:
        """A pool's forward: its output, and what its backward reads (a max pool's window offsets, a smooth max pool's
        pivots and sums; None for an average pool)."""
        y = self._output(compiled.output_shape)
        address = self._address
        values = {"x": x, "y": address(y), "images": compiled.images}
        family = compiled.family
        if family is Family.MAX_POOL:
            saved = self._scratch(compiled.output_shape, compiled.plan.argmax_dtype)  # window offsets
            values["argmax"] = address(saved)
        elif family is Family.SMOOTH_MAX_POOL:
            saved = (self._scratch(compiled.output_shape, self.scalar_dtype),
                     self._scratch(compiled.output_shape, self.scalar_dtype))
            values["pivots"], values["sums"], values["beta"] = address(saved[0]), address(saved[1]), compiled.beta_bits
        else:
            saved = None
        self._launch(compiled, "forward", values)
        return y, saved

    def _pool_backward(self, compiled: Compiled, x: Any, grad: Any, *saved: Any) -> Any:
        """A pool's input gradient from the addresses of its input, its output's gradient and what its forward kept
        (_pool_forward's saved, in order)."""
        grad_x = self._output(compiled.input_shape)
        values = {"x": x, "grad": grad, "images": compiled.images, "grad_x": self._address(grad_x)}
        family = compiled.family
        if family is Family.MAX_POOL:
            (values["argmax"],) = saved
        elif family is Family.SMOOTH_MAX_POOL:
            values["pivots"], values["sums"] = saved
            values["beta"] = compiled.beta_bits
        self._launch(compiled, "backward_input", values)
        return grad_x

    def _conv_forward(self, compiled: Compiled, x: Any, weight: Any, bias: Any) -> Any:
        layout = compiled.forward_scratch
        buffers = layout.stages["forward"]
        # Traced, `base` is a symbol and replay makes and holds the block; run directly (host_path_ab.py's "no launch
        # programs"), the block is held here until the launches are queued.
        scratch, base = self._scratch_base(layout)
        prep: dict[str, tuple[Any, ...]] = {}
        values = {"x": x, "weight": weight, "bias": bias, "images": compiled.images}
        values = self._operands(compiled, "forward", values, prep, buffers, base)
        self._launch_group(compiled, "forward_prep", prep)
        return self._into_output(compiled, "forward", values, buffers, base)

    def _conv_backward(self, compiled: Compiled, wanted: tuple[bool, bool, bool], x: Any, weight: Any,
                       grad: Any) -> tuple[Any, Any, Any]:
        wants_weight, wants_bias, wants_x = wanted
        layout = compiled.backward_scratch[wanted]
        buffers = layout.stages
        scratch, base = self._scratch_base(layout)  # held as in _conv_forward
        values = {"x": x, "weight": weight, "grad": grad, "images": compiled.images}
        # Launch groups: the layouts both GEMMs read and the bias gradient (its parts), then the GEMMs, then the
        # weight and bias gradients' reduces.
        prep: dict[str, tuple[Any, ...]] = {}
        reduces: dict[str, tuple[Any, ...]] = {}
        if wants_x:
            input_values = self._operands(compiled, "backward_input", values, prep, buffers["backward_input"], base)
        if wants_weight:
            weight_values = self._operands(compiled, "backward_weight", values, prep, buffers["backward_weight"], base)
        # A split bias gradient's output is first read by its reduce: made after the prep launches, which the GPU
        # waits for (an allocation is 3-6 µs on the H200's hosts).
        bias_buffers = buffers.get(BIAS_STAGE)  # a layout has the stages the call wants
        split_bias = wants_bias and bias_buffers.partial is not None
        if split_bias:
            self._into_partials(compiled, BIAS_STAGE, values, bias_buffers, base, prep)
        grad_bias = (self._into_output(compiled, BIAS_STAGE, values, bias_buffers, base, prep, reduces)
                     if wants_bias and not split_bias else None)
        self._launch_group(compiled, "backward_prep", prep)
        grad_x = (self._into_output(compiled, "backward_input", input_values, buffers["backward_input"], base)
                  if wants_x else None)
        grad_weight = (self._into_output(compiled, "backward_weight", weight_values, buffers["backward_weight"],
                                         base, reduces=reduces) if wants_weight else None)
        if split_bias:
            grad_bias = self._into_output(compiled, BIAS_STAGE, values, bias_buffers, base, reduces=reduces,
                                          partials_queued=True)
        self._launch_group(compiled, "backward_reduces", reduces)
        return grad_weight, grad_bias, grad_x
