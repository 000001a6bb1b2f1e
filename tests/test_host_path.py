"""The per-call host path of an op (issue 9) keeps its meaning: `fits_u32`, the interned geometry, and the CUDA
backend's launches, run here on the benchmark's stand-in CuPy (benchmarks/suite/stand_in.py), which needs no GPU."""

from __future__ import annotations

import ctypes
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import convgen.cpu
import convgen.cuda
import convgen.cuda_kernels as cuda_kernels
import numpy as np
import pytest
from convgen.generated.contract import KERNELS, LAUNCH_GROUPS, STAGES
from convgen.geometry import Family, Geometry, fits_u32

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from suite import stand_in

POOL = dict(c=1, in_spatial=(4, 4), kernel=(2, 2), stride=(2, 2), padding=(0, 0))


@pytest.mark.parametrize(("shape", "fits"), [
    ((), True), ((0,), True), ((2**32 - 1,), True), ((2**32,), False), ((0, 2**32 - 1), True), ((0, 2**32), False),
    ((2**16, 2**16 - 1), True), ((2**16, 2**16), False), ((3, 0, 2**40), False),
])
def test_fits_u32_bounds_every_dimension_and_the_count(shape, fits):
    assert fits_u32(shape) is fits


def test_equal_arguments_give_the_same_geometry():
    """The validators intern their geometry (the CUDA backend's compile cache is keyed by identity first);
    defaults given or left out give equal geometries."""
    tape, x = convgen.cpu.Tape().leaf(np.zeros((1, 4, 4), np.float32))
    tape, first = tape.max_pool(x, **POOL).unwrap()
    tape, second = tape.max_pool(x, **POOL, dilation=[1, 1]).unwrap()
    tape, third = tape.max_pool(x, **POOL).unwrap()
    geometries = [tape._nodes[node].op.geom for node in (first, second, third)]
    assert geometries[0] is geometries[2] and geometries[0] == geometries[1]
    assert geometries[1].dilation == (1, 1) and geometries[1].output_padding == (0, 0)


class RecordingModule:
    """A stand-in compiled module whose functions are launched by the stand-in driver below, which records each
    launch as (symbol, grid, block, the argument slots it read through cuLaunchKernel's parameters)."""

    builds = 0
    symbols: list[str] = []  # a function's ptr -> its symbol
    launches: list[tuple[str, int, int, tuple[int, ...]]] = []

    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        RecordingModule.builds += 1

    def get_function(self, symbol: str):
        RecordingModule.symbols.append(symbol)
        return SimpleNamespace(kernel=SimpleNamespace(ptr=len(RecordingModule.symbols) - 1))  # CuPy's RawKernel


# Each generated kernel's symbol -> how many parameters it takes (the contract's list of its stage).
PARAMETER_COUNTS = {symbol: len(STAGES[family][stage]) for (family, _), entry in KERNELS.items()
                    for stage, symbol in entry.symbols.items()}


def record_launch(function, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes, stream, parameters,
                  extra):
    symbol = RecordingModule.symbols[function]
    count = PARAMETER_COUNTS[symbol]
    pointers = ctypes.cast(parameters, ctypes.POINTER(ctypes.c_uint64))
    slots = tuple(ctypes.c_uint64.from_address(pointers[i]).value for i in range(count))
    assert (grid_y, grid_z, block_y, block_z, extra) == (1, 1, 1, 1, 0)
    RecordingModule.launches.append((symbol, grid_x, block_x, slots))


@pytest.fixture
def recording_tape(monkeypatch):
    cupy = stand_in.stand_in_cupy()
    monkeypatch.setattr(cupy, "RawModule", RecordingModule)
    monkeypatch.setattr(cupy.cuda.driver, "launchKernel", record_launch)
    monkeypatch.setattr(RecordingModule, "builds", 0)
    monkeypatch.setattr(RecordingModule, "symbols", [])
    monkeypatch.setattr(RecordingModule, "launches", [])
    monkeypatch.setattr(stand_in, "stand_in_cupy", lambda: cupy)
    return stand_in.stand_in_cuda_tape(convgen)


def test_a_launch_passes_the_arguments_in_contract_order(recording_tape):
    """Each argument reaches the driver in an 8-byte slot, in the contract's order: an array's address, the
    image count as its value."""
    tape, x = recording_tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
    x_array = tape.value(x)
    tape, y = tape.max_pool(x, **POOL).unwrap()
    ((symbol, grid, block, slots),) = RecordingModule.launches
    assert symbol == "max_pool_r2_forward"
    assert [p.role for p in STAGES[Family.MAX_POOL]["forward"]] == ["x", "images", "y", "argmax"]
    argmax = tape._nodes[y].op.saved
    assert slots == (x_array.data.ptr, 1, tape.value(y).data.ptr, argmax.ptr)
    assert len(set(slots)) == 4  # the stand-ins' addresses tell them apart
    # The window offsets, scratch that only the backward reads: a bare allocation of one byte an output (a
    # 2x2 window's offsets fit uint8), kept by the node for its backward.
    assert isinstance(argmax, stand_in.StandInMemory) and argmax.size == 4


def test_equal_geometries_compile_once_and_unknown_stages_are_named(recording_tape):
    tape, x = recording_tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
    for _ in range(3):
        tape.max_pool(x, **POOL).unwrap()
    tape.max_pool2d(x, k_h=2, k_w=2, in_h=4, in_w=4, in_c=1, stride=2).unwrap()  # the same geometry
    assert RecordingModule.builds == 1 and len(RecordingModule.launches) == 4
    backend = tape._backend
    compiled = backend._compile(Geometry.build(Family.MAX_POOL, 1, 1, (4, 4), (2, 2), (2, 2), (0, 0)))
    with pytest.raises(ValueError) as error:
        backend._launch(compiled, "backward_weight", {})
    assert str(error.value) == "max_pool has no stage 'backward_weight' (stages: forward, backward_input)"


def test_a_conv_step_launches_its_layouts_and_reduces_in_groups(recording_tape):
    """A conv's backward lays out what both GEMMs read and sums the bias gradient's parts in one launch group, runs
    the GEMMs, then adds up the weight and bias gradients' parts in another; a group's slots are its members' own,
    in member order, zeros for a member it does not run, then each member's blocks. A group of one member (the
    forward's packed weight) launches that member's own kernel."""
    backend = stand_in.stand_in_cuda_tape(convgen, "medium")._backend  # recording; TF32 on the H200: `_wgmma`
    geom = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    weight, bias, x = (stand_in.StandInArray(shape, np.float32) for shape in geom.parent_shapes)
    y, _ = backend.forward(geom, (weight, bias, x))
    grad = stand_in.StandInArray(geom.output_shape, np.float32)
    grad_weight, grad_bias, grad_x = backend.backward(geom, (weight, bias, x), None, grad)
    symbols = [symbol.removeprefix("conv_r2_") for symbol, *_ in RecordingModule.launches]
    assert symbols == ["forward_wgpack", "forward_wgmma", "backward_prep", "backward_input_wgmma",
                       "backward_weight_wgmma", "backward_reduces"]
    compiled = backend._compile(geom)
    plan = compiled.plan
    _, _, block, prep = RecordingModule.launches[2]
    input_roles = [p.role for p in STAGES[Family.CONV]["backward_input_wgmma"]]
    packed_input = RecordingModule.launches[3][3][input_roles.index("packed_weight")]
    weight_roles = [p.role for p in STAGES[Family.CONV]["backward_weight_wgmma"]]
    packed_d = RecordingModule.launches[4][3][weight_roles.index("packed_d")]
    assert plan.splits["backward_bias"] > 1
    launches = plan.launches
    expected_members = (
        (0, 0),  # backward_input_pack: not run (the `_wgmma` kernel reads its own pack)
        (weight.data.ptr, packed_input),  # backward_input_wgpack
        (0, 0, 0),  # backward_input_wgsource: 16-bit elements only
        (grad.data.ptr, 32, packed_d),  # backward_weight_wgpack: D rounded to TF32
        (0, 0, 0),  # backward_weight_wgsource
    )
    member_slots = [slot for member in expected_members for slot in member]
    assert prep[:len(member_slots)] == tuple(member_slots)
    bias_partial = prep[len(member_slots) + 2]
    assert prep[len(member_slots):len(member_slots) + 2] == (grad.data.ptr, 32)
    blocks = (0, launches["backward_input_pack"].grid, 0, launches["backward_weight_pack"].grid, 0,
              launches["backward_bias"].grid)
    assert prep[len(member_slots) + 3:] == blocks and block == 256
    assert RecordingModule.launches[2][1] == sum(blocks)
    _, reduce_grid, _, reduces = RecordingModule.launches[5]
    weight_partial = RecordingModule.launches[4][3][-1]
    assert reduces == (weight_partial, grad_weight.data.ptr, bias_partial, grad_bias.data.ptr,
                       launches["backward_weight_reduce"].grid, launches["backward_bias_reduce"].grid)
    assert reduce_grid == launches["backward_weight_reduce"].grid + launches["backward_bias_reduce"].grid
    assert grad_x.data.ptr == RecordingModule.launches[3][3][-1] and y.data.ptr == RecordingModule.launches[1][3][-1]


def test_a_bf16_training_step_makes_six_launches(recording_tape):
    """bf16 N32 64->64 on the H200's plans: the forward's layouts (packed weight, channels-last source) as one launch
    and its `_wgmma`; the backward's layouts and bias parts, its two `_wgmma` kernels and their reduces as one."""
    with stand_in.imports_as(stand_in.stand_in_cupy()):  # the recording CuPy (the fixture's)
        backend = convgen.cuda.CupyBackend("bfloat16", "medium")
    geom = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    inputs = tuple(stand_in.StandInArray(shape, np.uint16) for shape in geom.parent_shapes)
    backend.forward(geom, inputs)
    backend.backward(geom, inputs, None, stand_in.StandInArray(geom.output_shape, np.uint16))
    assert [symbol.removeprefix("conv_r2_") for symbol, *_ in RecordingModule.launches] == [
        "forward_prep", "forward_wgmma", "backward_prep", "backward_input_wgmma", "backward_weight_wgmma",
        "backward_reduces"]
    members = dict(zip(LAUNCH_GROUPS[Family.CONV]["backward_prep"], RecordingModule.launches[2][3][-6:]))
    assert [member for member, blocks in members.items() if blocks] == [
        "backward_input_wgpack", "backward_input_wgsource", "backward_weight_wgsource", "backward_bias"]


def group_slots(group: str, slots: tuple[int, ...], family: Family = Family.CONV) -> dict[str, dict[str, int]]:
    """A launch group's slots as member -> role -> slot, for the members it ran (those with blocks)."""
    members = LAUNCH_GROUPS[family][group]
    by_member, at = {}, 0
    for member, blocks in zip(members, slots[-len(members):], strict=True):
        roles = [p.role for p in STAGES[family][member]]
        if blocks:
            by_member[member] = dict(zip(roles, slots[at:at + len(roles)], strict=True))
        at += len(roles)
    return by_member


def test_a_pass_takes_its_scratch_from_one_allocation(recording_tape, monkeypatch):
    """A bf16 step's packed weights, channels-last sources and partial sums come from one allocation a pass: the
    forward's two buffers and the backward's five, each on a 256-byte boundary of its pass's allocation and as large
    as its plan needs, no two overlapping."""
    cupy = stand_in.stand_in_cupy()
    allocations = []

    def allocate(size):
        memory = stand_in.StandInMemory(size)
        allocations.append(memory)
        return memory

    monkeypatch.setattr(cupy.cuda, "alloc", allocate)
    with stand_in.imports_as(cupy):
        backend = convgen.cuda.CupyBackend("bfloat16", "medium")
    geom = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    plan = backend._compile(geom).plan
    inputs = tuple(stand_in.StandInArray(shape, np.uint16) for shape in geom.parent_shapes)
    backend.forward(geom, inputs)
    backend.backward(geom, inputs, None, stand_in.StandInArray(geom.output_shape, np.uint16))
    forward_prep = group_slots("forward_prep", RecordingModule.launches[0][3])
    backward_prep = group_slots("backward_prep", RecordingModule.launches[2][3])
    weight_roles = [p.role for p in STAGES[Family.CONV]["backward_weight_wgmma"]]
    floats = 4  # bytes of the packed and channels-last operands' unit (Plan.packed_elements, Plan.source_elements)
    scalars = 4  # partial sums: float32
    passes = {
        "forward": {  # address -> bytes the plan needs there
            forward_prep["forward_wgpack"]["packed_weight"]: plan.packed_elements["forward"] * floats,
            forward_prep["forward_wgsource"]["staged_source"]: plan.source_elements["forward"] * floats,
        },
        "backward": {
            backward_prep["backward_input_wgpack"]["packed_weight"]: plan.packed_elements["backward_input"] * floats,
            backward_prep["backward_input_wgsource"]["staged_source"]: plan.source_elements["backward_input"] * floats,
            backward_prep["backward_weight_wgsource"]["staged_source"]:
                plan.source_elements["backward_weight"] * floats,
            backward_prep["backward_bias"]["grad_bias"]: plan.splits["backward_bias"] * geom.out_c * scalars,
            RecordingModule.launches[4][3][weight_roles.index("grad_weight")]:
                plan.splits["backward_weight"] * geom.parent_numels[0] * scalars,
        },
    }
    assert len(allocations) == 2
    for allocation, buffers in zip(allocations, passes.values(), strict=True):
        spans = sorted((address - allocation.ptr, address - allocation.ptr + size) for address, size in buffers.items())
        assert all(start % 256 == 0 for start, _ in spans)
        assert spans[0][0] >= 0 and spans[-1][1] <= allocation.size
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))


def test_a_transposes_gradients_lay_out_the_upstream_gradient_once(recording_tape):
    """A 16-bit conv transpose's input and weight gradients both read the upstream gradient channels-last: one
    `_wgsource` pass lays it out, into one buffer of the backward's scratch that both `_wgmma` kernels read."""
    with stand_in.imports_as(stand_in.stand_in_cupy()):
        backend = convgen.cuda.CupyBackend("bfloat16", "medium")
    geom = Geometry.build(Family.CONV_TRANSPOSE, 64, 64, (28, 28), (3, 3), (1, 1), (1, 1), batch=32)
    inputs = tuple(stand_in.StandInArray(shape, np.uint16) for shape in geom.parent_shapes)
    grad = stand_in.StandInArray(geom.output_shape, np.uint16)
    backend.backward(geom, inputs, None, grad)
    symbols = [symbol.removeprefix("conv_transpose_r2_") for symbol, *_ in RecordingModule.launches]
    assert symbols == ["backward_prep", "backward_input_wgmma", "backward_weight_wgmma", "backward_reduces"]
    ran = group_slots("backward_prep", RecordingModule.launches[0][3], Family.CONV_TRANSPOSE)
    assert sorted(ran) == ["backward_bias", "backward_input_wgpack", "backward_input_wgsource",
                           "backward_weight_wgpack"]
    copy = ran["backward_input_wgsource"]["staged_source"]
    assert ran["backward_input_wgsource"]["grad"] == grad.data.ptr
    for index, stage in ((1, "backward_input_wgmma"), (2, "backward_weight_wgmma")):
        roles = [p.role for p in STAGES[Family.CONV_TRANSPOSE][stage]]
        assert RecordingModule.launches[index][3][roles.index("grad")] == copy


def test_each_thread_launches_from_slots_of_its_own(recording_tape):
    """The argument slots and the pointers to them are made once per thread and written again by each launch: a
    launch on another thread reads its own arguments, and one with more arguments than any kernel takes is refused
    before it could move the slots."""
    backend = recording_tape._backend
    compiled = backend._compile(Geometry.build(Family.MAX_POOL, 1, 1, (4, 4), (2, 2), (2, 2), (0, 0)))
    function, grid, block, shared_bytes, _, kernel = compiled.launches["forward"]
    addresses = []

    def launch(first: int) -> None:
        addresses.append(cuda_kernels._PARAMETER_SLOTS.address)
        backend._call(kernel, function, grid, block, shared_bytes, (first, 1, first + 256, first + 512))

    launch(1 << 30)
    thread = threading.Thread(target=launch, args=(1 << 31,))
    thread.start()
    thread.join()
    launch(1 << 32)
    assert [slots for *_, slots in RecordingModule.launches] == [
        (first, 1, first + 256, first + 512) for first in (1 << 30, 1 << 31, 1 << 32)]
    assert addresses[0] == addresses[2] != addresses[1]
    too_many = (0,) * (cuda_kernels.MAX_PARAMETERS + 1)
    with pytest.raises(ValueError) as error:
        backend._call(kernel, function, grid, block, shared_bytes, too_many)
    assert str(error.value) == (f"forward: {cuda_kernels.MAX_PARAMETERS + 1} kernel arguments, more "
                                f"than any kernel's {cuda_kernels.MAX_PARAMETERS}")
    assert len(RecordingModule.launches) == 3


def test_a_split_bias_gradient_is_made_after_the_first_launch_of_its_pass(recording_tape, monkeypatch):
    """The backward's first launch (the layouts and the bias gradient's parts) waits for no allocation it does not
    write: each gradient's output is made after the launches before its first writer, a split bias gradient's (which
    only its reduce writes) after the GEMMs', and the reduce writes it."""
    backend = stand_in.stand_in_cuda_tape(convgen, "medium")._backend  # recording; TF32 on the H200: `_wgmma`
    geom = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    inputs = tuple(stand_in.StandInArray(shape, np.float32) for shape in geom.parent_shapes)
    backend.forward(geom, inputs)
    made = []  # (shape, launches before it)
    output = backend._output

    def recorded_output(shape, dtype=None):
        made.append((tuple(shape), len(RecordingModule.launches)))
        return output(shape, dtype)

    monkeypatch.setattr(backend, "_output", recorded_output)
    assert backend._compile(geom).plan.splits["backward_bias"] > 1
    grad_weight, grad_bias, grad_x = backend.backward(geom, inputs, None,
                                                      stand_in.StandInArray(geom.output_shape, np.float32))
    assert made == [(geom.input_shape, 3), (geom.kernel_shape, 4), ((64,), 5)]
    roles_of_reduces = [p.role for member in LAUNCH_GROUPS[Family.CONV]["backward_reduces"]
                        for p in STAGES[Family.CONV][member]]
    assert RecordingModule.launches[5][3][roles_of_reduces.index("grad_bias")] == grad_bias.data.ptr
