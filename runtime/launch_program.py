"""A pass's launches as a program (a conv's forward and backward, a pool's forward and backward): traced once per
geometry and choice of gradients by running the backend's own pass on symbolic addresses, then replayed per call with
the call's addresses filled in.

A pass decides, per call, the same things every time for one geometry: which layouts to launch, where in its scratch
each buffer lies, which kernels go in a launch group, which outputs and scratch to make and when. The trace records
what those decisions produce: each output or scratch allocation (its shape, in order) and each launch (its function,
grid, block, shared memory and arguments), an argument being a constant or an address plus a constant offset.
Replaying it makes the same allocations and launches in the same order, without the dictionaries and calls that made
them: a third of the backend's Python for a bf16 conv step (25.6 → 17.3 µs on the development machine's stand-in
CuPy). The CUDA tape's compiled host path (convgen.host_path) replays a forward's program in C."""

from __future__ import annotations

import copy
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Symbol:
    """An address while tracing: the `index`th of the pass's addresses (its inputs, then its scratch, then its
    outputs in the order they are made) plus `offset` bytes."""

    index: int
    offset: int = 0

    def __add__(self, offset: int) -> Symbol:
        if type(offset) is not int:
            return NotImplemented
        return Symbol(self.index, self.offset + offset)

    __radd__ = __add__


@dataclass(frozen=True, slots=True)
class TracedOutput:
    """An output array while tracing: the address it will have."""

    symbol: Symbol


@dataclass(frozen=True, slots=True)
class Allocation:
    """Make an output of `shape` and `dtype` (None: the backend's), whose address the later launches take; where
    `like` is an input's index, as that input is made (its shape and the backend's dtype)."""

    shape: tuple[int, ...]
    dtype: str | None
    like: int | None = None


@dataclass(frozen=True, slots=True)
class Scratch:
    """Make device memory for `shape` elements of `dtype` (None: the backend's) that no launch's caller sees unless
    the program returns it (a max pool's window offsets, kept for its backward)."""

    shape: tuple[int, ...]
    dtype: str | None


@dataclass(frozen=True, slots=True)
class Launch:
    """One launch: its arguments are `constants`, with the address of index `i` added to slot `s` for each (s, i) of
    `holes`."""

    stage: str
    function: int
    grid: tuple[int]
    block: tuple[int]
    shared_bytes: int
    constants: array
    holes: tuple[tuple[int, int], ...]


# What a pass returns, by the order its outputs and scratch were made: an index, None for none, or a tuple of them.
Returned = int | None | tuple["Returned", ...]


@dataclass(frozen=True, slots=True)
class Program:
    """A pass's steps, and which of the outputs and scratch it made it returns."""

    steps: tuple[Allocation | Scratch | Launch, ...]
    returns: tuple[Returned, ...]


def _launch_of(stage: str, function: int, grid: tuple[int], block: tuple[int], shared_bytes: int,
               args: Any) -> Launch:
    constants, holes = [], []
    for slot, value in enumerate(args):
        if type(value) is Symbol:
            holes.append((slot, value.index))
            value = value.offset
        constants.append(value)
    return Launch(stage, function, grid, block, shared_bytes, array("Q", constants), tuple(holes))


def trace(backend: Any, input_shapes: tuple[tuple[int, ...], ...], run: Callable[..., Any]) -> Program:
    """The program of `run(tracer, *addresses)`: a method of `backend`'s class making one pass from the addresses of
    its inputs (arrays of `input_shapes`, of the backend's dtype but for a pool's kept state), returning its outputs
    (None where it makes none, a tuple where it returns several) and any scratch it keeps, run on a copy of `backend`
    whose outputs, scratch and launches are recorded instead of made. An output of the shape and dtype of an input
    that the pass reads is made like the first such input (a gradient like its tensor): torch's empty_like skips the
    parsing of a shape, dtype and device, 1.3 of torch.empty's 3.0 µs on the H200's host. An input no launch reads
    may stand in with another shape (a circular conv's backward passes the unpadded input where only the weight
    gradient would read the padded one), so no output is made like it."""
    inputs = len(input_shapes)
    steps: list[Allocation | Scratch | Launch] = []
    made: list[TracedOutput] = []  # outputs and scratch, in the order made
    base = Symbol(inputs)
    tracer = copy.copy(backend)

    def made_by(step: Allocation | Scratch) -> TracedOutput:
        steps.append(step)
        made.append(TracedOutput(Symbol(inputs + 1 + len(made))))
        return made[-1]

    def output(shape: tuple[int, ...], dtype: str | None = None) -> TracedOutput:
        return made_by(Allocation(tuple(shape), dtype))

    def scratch(shape: tuple[int, ...], dtype: str | None = None) -> TracedOutput:
        return made_by(Scratch(tuple(shape), dtype))

    def returned(value: Any) -> Returned:
        if type(value) is tuple:
            return tuple(returned(entry) for entry in value)
        return None if value is None else made.index(value)

    def launch(stage: str, function: int, grid: tuple[int], block: tuple[int], shared_bytes: int, args: Any) -> None:
        steps.append(_launch_of(stage, function, grid, block, shared_bytes, args))

    tracer._output, tracer._scratch, tracer._call = output, scratch, launch
    tracer._scratch_base = lambda layout: (None, base if layout.size else 0)
    tracer._address_of = {**backend._address_of, TracedOutput: lambda traced: traced.symbol}
    value = run(tracer, *(Symbol(index) for index in range(inputs)))
    results = value if type(value) is tuple else (value,)
    read = {index for step in steps if type(step) is Launch for _, index in step.holes if index < inputs}
    sources = {input_shapes[index]: index for index in sorted(read, reverse=True)}  # the first read one of a shape
    steps = [Allocation(step.shape, None, sources.get(step.shape)) if type(step) is Allocation and step.dtype is None
             else step for step in steps]
    return Program(tuple(steps), tuple(returned(result) for result in results))


def replay(backend: Any, program: Program, layout: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """A conv pass's `program` on the call's `inputs` (arrays), with the pass's scratch laid out by `layout`: its
    outputs as it returns them. (A pool's programs, one launch each, are replayed only in C.)"""
    address = backend._address
    values = [address(array) for array in inputs]
    scratch, base = backend._scratch_base(layout)  # held until the launches are queued
    values.append(base)
    made = []
    for step in program.steps:
        if type(step) is Allocation:
            like = step.like
            output = backend._output(step.shape, step.dtype) if like is None else backend._output_like(inputs[like])
            made.append(output)
            values.append(address(output))
            continue
        args = array("Q", step.constants)
        for slot, index in step.holes:
            args[slot] += values[index]
        backend._call(step.stage, step.function, step.grid, step.block, step.shared_bytes, args)
    return tuple(None if index is None else made[index] for index in program.returns)
