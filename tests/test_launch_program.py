"""A conv pass's launch program (convgen.launch_program): traced once from the backend's own pass, it replays the same
allocations and launches, argument for argument, for every conv family, dtype, precision and choice of gradients, on
the benchmark's stand-in CuPy (no GPU)."""

from __future__ import annotations

import itertools
from array import array

import convgen.cuda
import numpy as np
import pytest
from convgen.cuda import STORAGE_DTYPES
from convgen.generated.contract import STAGES
from convgen.geometry import Family, Geometry
from convgen.launch_program import Allocation, Launch, Symbol
from test_host_path import RecordingModule, recording_tape, stand_in  # noqa: F401  (the fixture)

GEOMETRIES = {
    "conv N32 64->64 56^2": Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32),
    "conv 3-D grouped dilated": Geometry.build(Family.CONV, 8, 12, (6, 7, 5), (3, 2, 3), (2, 1, 1), (1, 0, 2),
                                               batch=3, dilation=(1, 2, 1), groups=4),
    "conv 1-D one image": Geometry.build(Family.CONV, 3, 5, (40,), (5,), (1,), (2,)),
    "conv_transpose N8 32->16 strided": Geometry.build(Family.CONV_TRANSPOSE, 32, 16, (20, 20), (4, 4), (2, 2),
                                                       (1, 1), batch=8, output_padding=(1, 0)),
}
KINDS = [("float32", "highest"), ("float32", "high"), ("float32", "medium"), ("float64", "highest"),
         ("bfloat16", "medium"), ("float16", "highest")]
WANTED = [flags for flags in itertools.product((True, False), repeat=3) if any(flags)]


def _fresh_addresses(monkeypatch) -> None:
    """The stand-ins' addresses from the same start: two runs that allocate in the same order get the same ones."""
    monkeypatch.setattr(stand_in, "_ADDRESSES", itertools.count(1 << 20, 1 << 8))


def _address(value) -> int | None:
    return None if value is None else value.data.ptr


@pytest.mark.usefixtures("recording_tape")
@pytest.mark.parametrize(("dtype", "precision"), KINDS, ids=[f"{d}-{p}" for d, p in KINDS])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_a_replayed_pass_makes_the_traced_passs_allocations_and_launches(monkeypatch, name, dtype, precision):
    with stand_in.imports_as(stand_in.stand_in_cupy()):  # the recording CuPy (the fixture's)
        backend = convgen.cuda.CupyBackend(dtype, precision)
    geom = GEOMETRIES[name]
    weight, bias, x = (stand_in.StandInArray(shape, STORAGE_DTYPES[dtype]) for shape in geom.parent_shapes)
    grad = stand_in.StandInArray(geom.output_shape, STORAGE_DTYPES[dtype])
    compiled = backend._compile(geom)
    address = backend._address
    runs = {"forward": (lambda: (backend.forward(geom, (weight, bias, x))[0],),
                        lambda: (backend._conv_forward(compiled, address(x), address(weight), address(bias)),))}
    for wanted in WANTED:
        runs[wanted] = (lambda w=wanted: backend.backward(geom, (weight, bias, x), None, grad, w),
                        lambda w=wanted: backend._conv_backward(compiled, w, address(x), address(weight),
                                                                address(grad)))
    for key, (replayed, direct) in runs.items():
        recorded = []
        for run in (direct, replayed, replayed):  # the first replay traces the program, the second only replays it
            _fresh_addresses(monkeypatch)
            RecordingModule.launches.clear()
            outputs = tuple(_address(output) for output in run())
            recorded.append((outputs, list(RecordingModule.launches)))
        assert recorded[0][1], key
        assert recorded[1] == recorded[0] and recorded[2] == recorded[0], key
        if key != "forward":
            assert [flag for flag in key] == [output is not None for output in recorded[0][0]]


def test_a_traced_launch_holds_its_constants_and_where_the_addresses_go():
    """Addresses while tracing are symbols (an address's index plus a byte offset); a launch keeps its constants
    and, per slot that holds an address, the index of the address to add."""
    base = Symbol(3)
    assert base + 256 == 256 + base == Symbol(3, 256) and (base + 256) + 512 == Symbol(3, 768)
    with pytest.raises(TypeError):
        base + Symbol(1)
    with stand_in.imports_as(stand_in.stand_in_cupy()):
        backend = convgen.cuda.CupyBackend("float32", "highest")
    geom = Geometry.build(Family.CONV, 3, 5, (40,), (5,), (1,), (2,))
    compiled = backend._compile(geom)
    backend.forward(geom, tuple(stand_in.StandInArray(shape, np.float32) for shape in geom.parent_shapes))
    program = compiled.programs["forward"]
    allocation, forward = program.steps
    assert allocation == Allocation(geom.output_shape, None) and program.returns == (0,)
    assert type(forward) is Launch and forward.stage == "forward"  # FMA kernels, no layouts: one launch
    roles = {"x": 0, "weight": 1, "bias": 2, "y": 4}  # the inputs, the scratch (3), then the outputs
    params = [p.role for p in STAGES[Family.CONV][forward.stage]]
    for slot, index in forward.holes:
        assert roles[params[slot]] == index and forward.constants[slot] == 0
    assert forward.constants[params.index("images")] == 1 and type(forward.constants) is array


def test_an_output_of_an_inputs_shape_is_made_like_that_input():
    """A replayed pass makes an output of an input's shape (and the backend's dtype) with the backend's _output_like
    of that input: 64->64 at stride 1 keeps its input's shape, and the backward's input and weight gradients are
    their tensors' shapes; the bias gradient is made by its shape."""
    with stand_in.imports_as(stand_in.stand_in_cupy()):
        backend = convgen.cuda.CupyBackend("bfloat16", "medium")
    geom = GEOMETRIES["conv N32 64->64 56^2"]
    weight, bias, x = (stand_in.StandInArray(shape, STORAGE_DTYPES["bfloat16"]) for shape in geom.parent_shapes)
    grad = stand_in.StandInArray(geom.output_shape, STORAGE_DTYPES["bfloat16"])
    made_like = []
    backend._output_like = lambda array: made_like.append(array) or stand_in.StandInArray(array.shape, array.dtype)
    backend.forward(geom, (weight, bias, x))
    backend.backward(geom, (weight, bias, x), None, grad)
    assert made_like == [x, x, weight]
    compiled = backend._compile(geom)
    allocations = {(step.shape, step.like) for key in ("forward", ("backward", True, True, True))
                   for step in compiled.programs[key].steps if type(step) is Allocation}
    assert allocations == {(x.shape, 0), (weight.shape, 1), ((64,), None)}


def test_no_output_is_made_like_an_input_the_pass_does_not_read():
    """Only the weight gradient reads x: a backward without it makes the input gradient by its shape, not like x,
    which a circular conv's backward passes unpadded in the padded input's place. There the padded input's gradient
    that the fold reads has the padded shape, whichever gradients are asked for."""
    with stand_in.imports_as(stand_in.stand_in_cupy()):
        backend = convgen.cuda.CupyBackend("float32", "highest")
    geom = GEOMETRIES["conv 1-D one image"]
    weight, bias, x = (stand_in.StandInArray(shape, np.float32) for shape in geom.parent_shapes)
    grad = stand_in.StandInArray(geom.output_shape, np.float32)
    compiled = backend._compile(geom)
    for wanted, like in (((False, False, True), None), ((True, False, True), 0)):
        backend.backward(geom, (weight, bias, x), None, grad, wanted)
        (allocation,) = [step for step in compiled.programs[("backward", *wanted)].steps
                         if type(step) is Allocation and step.shape == x.shape]
        assert allocation.like == like, wanted
    circular = Geometry.build(Family.CONV, 3, 5, (12, 10), (3, 3), (1, 1), (1, 2), batch=2, circular=True)
    weight, bias, x = (stand_in.StandInArray(shape, np.float32) for shape in circular.parent_shapes)
    grad = stand_in.StandInArray(circular.output_shape, np.float32)
    padded = backend._wrapping(circular).plan.padded
    folded = []  # the shape of each gradient the fold reads
    wrap_stage = backend._wrap_stage

    def recording_wrap_stage(wrapping, stage, geom, source, shape):
        if stage == "fold":
            folded.append(source.shape)
        return wrap_stage(wrapping, stage, geom, source, shape)

    backend._wrap_stage = recording_wrap_stage
    for wanted in WANTED:
        if wanted[2]:
            (grad_x,) = backend.backward(circular, (weight, bias, x), None, grad, wanted)[2:]
            assert folded[-1] == padded.input_shape and grad_x.shape == x.shape, wanted
