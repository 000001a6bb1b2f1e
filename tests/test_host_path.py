"""The per-call host path of an op (issue 9) keeps its meaning: `fits_u32`, the interned geometry, and the CUDA
backend's launches, run here on the benchmark's stand-in CuPy (benchmarks/suite/stand_in.py), which needs no GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import convgen.cpu
import convgen.cuda
import numpy as np
import pytest
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
    """A stand-in compiled module whose functions record each launch as (symbol, grid, block, args)."""

    builds = 0
    launches: list[tuple[str, tuple[int], tuple[int], tuple[object, ...]]] = []

    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        RecordingModule.builds += 1

    def get_function(self, symbol: str):
        return lambda grid, block, args, shared_mem=0: RecordingModule.launches.append((symbol, grid, block, args))


@pytest.fixture
def recording_tape(monkeypatch):
    cupy = stand_in.stand_in_cupy()
    monkeypatch.setattr(cupy, "RawModule", RecordingModule)
    monkeypatch.setattr(RecordingModule, "builds", 0)
    monkeypatch.setattr(RecordingModule, "launches", [])
    monkeypatch.setattr(stand_in, "stand_in_cupy", lambda: cupy)
    return stand_in.stand_in_cuda_tape(convgen)


def test_a_launch_passes_the_arguments_in_contract_order(recording_tape):
    tape, x = recording_tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
    x_array = tape.value(x)
    tape, y = tape.max_pool(x, **POOL).unwrap()
    ((symbol, grid, block, args),) = RecordingModule.launches
    assert symbol == "max_pool_r2_forward"
    assert args[0] is x_array and args[2] is tape.value(y)  # x, images, y, argmax
    assert type(args[1]) is np.uint32 and args[1] == 1
    # The window offsets, scratch that only the backward reads: a bare allocation of one byte an output (a
    # 2x2 window's offsets fit uint8), kept by the node for its backward.
    assert isinstance(args[3], stand_in.StandInMemory) and args[3].size == 4
    assert tape._nodes[y].op.saved is args[3]


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
