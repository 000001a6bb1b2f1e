"""The CUDA tape's compiled host path (convgen.host_path, runtime/compiled/tape_apply.c): a call whose arguments the tape
accepted before is replayed in C with the same allocations and launches, argument for argument, as the Python path
makes, and records the same node; every other call, and every replay that fails on the way, gives the Python path's
Result. On the benchmark's stand-in CuPy, which records each launch's argument slots (tests/test_host_path.py), and
on the emulated CuPy (tests/emulated_cupy.py: the kernels compiled with g++), where the outputs and gradients must be
the Python path's bit for bit."""

from __future__ import annotations

import itertools
import shutil
import threading

import convgen
import convgen.cuda
import convgen.host_path as host_path
import numpy as np
import pytest
import reference
from convgen.geometry import Family, Geometry
from convgen.tape import Tape as PythonTape
from emulated_cupy import emulated_cupy
from test_host_path import POOL, RecordingModule, recording_tape, stand_in  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(not host_path.COMPILED, reason="convgen._host_path is not built")

GEOMETRIES = {
    "max_pool 2-D": Geometry.build(Family.MAX_POOL, 2, 2, (5, 6), (2, 3), (2, 1), (1, 1), batch=2),
    "avg_pool 3-D dilated": Geometry.build(Family.AVG_POOL, 3, 3, (5, 4, 6), (2, 2, 2), (1, 2, 1), (0, 1, 1),
                                           dilation=(2, 1, 1)),
    "smooth_max_pool 1-D": Geometry.build(Family.SMOOTH_MAX_POOL, 2, 2, (9,), (3,), (2,), (1,), beta=2.5),
    "conv 2-D grouped": Geometry.build(Family.CONV, 4, 6, (6, 5), (3, 2), (1, 2), (1, 0), batch=2, groups=2),
    "conv_transpose 2-D": Geometry.build(Family.CONV_TRANSPOSE, 4, 3, (4, 5), (3, 3), (2, 1), (1, 1), batch=2,
                                         output_padding=(1, 0)),
    "conv 1-D circular unpadded": Geometry.build(Family.CONV, 2, 3, (7,), (3,), (1,), (0,), circular=True),
}


@pytest.fixture
def stand_in_tape(request):
    """An empty CUDA tape on the recording stand-in CuPy (test_host_path's `recording_tape`)."""
    return request.getfixturevalue("recording_tape")


def _python_path(tape_class: type) -> type:
    """`tape_class` with tape.py's `_apply`: every call on the Python path."""
    return type(f"Python{tape_class.__name__}", (tape_class,), {"_apply": PythonTape._apply})


def _python_tape(tape):
    """An empty tape of `tape`'s kind on the Python path, its backend on the same (recording) stand-in CuPy."""
    with stand_in.imports_as(stand_in.stand_in_cupy()):
        return _python_path(type(tape))(precision=tape.precision)


def _forwards(monkeypatch) -> list[Geometry]:
    """The geometries the CUDA backend's Python forward runs, from now on (a replayed call runs none)."""
    seen: list[Geometry] = []
    forward = convgen.cuda.CupyBackend.forward

    def counted(self, geom, inputs):
        seen.append(geom)
        return forward(self, geom, inputs)

    monkeypatch.setattr(convgen.cuda.CupyBackend, "forward", counted)
    return seen


def _leaves(tape, arrays):
    ids = []
    for array in arrays:
        tape, node = tape.leaf(array)
        ids.append(node)
    return tape, tuple(ids)


@pytest.mark.usefixtures("recording_tape")
@pytest.mark.parametrize("precision", ["highest", "medium"])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_a_replayed_call_launches_what_the_python_path_launches(monkeypatch, name, precision):
    geom = GEOMETRIES[name]
    if precision != "highest" and not geom.family.is_conv:
        pytest.skip("a pool's kernels have no precision")
    compiled_tape = stand_in.stand_in_cuda_tape(convgen, precision)
    python_tape = _python_tape(compiled_tape)
    forwards = _forwards(monkeypatch)
    arrays = [stand_in.StandInArray(shape, np.float32) for shape in geom.parent_shapes]
    runs = {}
    for label, tape in (("python", python_tape), ("compiled", compiled_tape)):
        tape, ids = _leaves(tape, arrays)
        tape, _ = reference.apply_op(tape, geom, ids).unwrap()  # the compiled tape's first call: Python's, remembered
        del RecordingModule.launches[:]
        monkeypatch.setattr(stand_in, "_ADDRESSES", itertools.count(1 << 30, 1 << 8))
        tape, node = reference.apply_op(tape, geom, ids).unwrap()
        record = tape._nodes[node]
        runs[label] = (list(RecordingModule.launches), tape.value(node).data.ptr, record.shape, record.dims,
                       record.name, record.parents, record.op.info, record.op.geom, len(tape))
    assert runs["compiled"] == runs["python"]
    assert runs["python"][0]  # it launched
    assert len(forwards) == 3  # the Python tape's two calls and the compiled tape's first: the second replayed


def test_arguments_not_exactly_an_entrys_take_the_python_path(stand_in_tape, monkeypatch):
    """A bool, a list or a NumPy int where the remembered call had an int is not its entry (1 == True to a dict):
    each gives what the Python path gives, the refusal or the accepted call."""
    python_tape = _python_tape(stand_in_tape)
    forwards = _forwards(monkeypatch)
    tapes = []
    for tape in (stand_in_tape, python_tape):
        tape, x = tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
        tape.max_pool2d(x, k_h=2, k_w=2, in_h=4, in_w=4, in_c=1, stride=2).unwrap()
        tapes.append((tape, x))
    forwards.clear()
    for stride in (True, 2.0, np.int64(2), [2]):
        results = [tape.max_pool2d(x, k_h=2, k_w=2, in_h=4, in_w=4, in_c=1, stride=stride) for tape, x in tapes]
        assert results[0].error == results[1].error
    assert tapes[0][0].max_pool2d(tapes[0][1], k_h=2, k_w=2, in_h=4, in_w=4, in_c=1, stride=True).error == (
        "autograd: cuda: max_pool2d: stride must be a natural number, got True")
    for spatial in ([4, 4], (4, np.int64(4))):
        results = [tape.max_pool(x, **{**POOL, "in_spatial": spatial}) for tape, x in tapes]
        assert results[0].is_ok() and results[1].is_ok()
    assert len(forwards) == 6  # the NumPy int and both spatial forms, on each tape: none replayed


@pytest.mark.parametrize("bad", ["text", -1, 3, 99, True])
def test_a_bad_input_id_gives_the_python_paths_error(stand_in_tape, bad):
    python_tape = _python_tape(stand_in_tape)
    errors = []
    for tape in (stand_in_tape, python_tape):
        tape, x = tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
        tape, _ = tape.max_pool(x, **POOL).unwrap()
        errors.append(tape.max_pool(bad, **POOL).error)
    assert errors[0] == errors[1] and errors[0].startswith("autograd: invalid node id (cuda: max_pool: x_id is")


def test_an_input_of_another_shape_gives_the_python_paths_error(stand_in_tape):
    python_tape = _python_tape(stand_in_tape)
    errors = []
    for tape in (stand_in_tape, python_tape):
        tape, x = tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
        tape, other = tape.leaf(stand_in.StandInArray((1, 4, 5), np.float32))
        tape, flat = tape.leaf(stand_in.StandInArray((15,), np.float32), shape=(1, 4, 4))  # one element short
        tape, _ = tape.max_pool(x, **POOL).unwrap()
        errors.append((tape.max_pool(other, **POOL).error, tape.max_pool(flat, **POOL).error))
    assert errors[0] == errors[1] == (
        "autograd: shape mismatch (cuda: max_pool: x_id 1 has shape (1, 4, 5), expected (1, 4, 4))",
        "autograd: CUDA buffer size mismatch (shape elements=16, native elements=15)")


def test_a_flat_leaf_of_the_recorded_shape_is_read_by_its_address(stand_in_tape, monkeypatch):
    tape, x = stand_in_tape.leaf(stand_in.StandInArray((16,), np.float32), shape=(1, 4, 4))
    tape, _ = tape.max_pool(x, **POOL).unwrap()
    forwards = _forwards(monkeypatch)
    del RecordingModule.launches[:]
    tape, y = tape.max_pool(x, **POOL).unwrap()
    assert not forwards and RecordingModule.launches[0][3][0] == tape._nodes[x].value.data.ptr
    assert tape.shape(y) == (1, 2, 2)


def test_a_call_on_an_older_tape_records_on_its_own_prefix(stand_in_tape):
    tape, x = stand_in_tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
    base, _ = tape.max_pool(x, **POOL).unwrap()  # remembered
    first, a = base.max_pool(x, **POOL).unwrap()  # replayed, on the newest tape
    second, b = base.max_pool(x, **POOL).unwrap()  # replayed on `base`, no longer the newest
    assert (a, b, len(first), len(second)) == (2, 2, 3, 3)
    assert first._nodes is not second._nodes and first.value(a) is not second.value(b)
    assert first._nodes[:2] == second._nodes[:2]


def test_a_failing_allocation_or_launch_gives_the_python_paths_error(stand_in_tape, monkeypatch):
    """The replay fails on the way (the output's allocation, the launch): the Python path computes the call again and
    says what failed."""
    tape, x = stand_in_tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
    backend = tape._backend
    cupy, launch_kernel = backend._xp, backend._launch_kernel
    failing = set()

    class Array(stand_in.StandInArray):
        def __init__(self, *args):
            if "allocation" in failing:
                raise cupy.cuda.memory.OutOfMemoryError("out of memory")
            super().__init__(*args)

    def launch(*args):
        if "launch" in failing:
            error = cupy.cuda.driver.CUDADriverError("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure")
            error.status = 719  # CuPy's driver error carries the driver's status
            raise error
        return launch_kernel(*args)

    monkeypatch.setattr(cupy, "ndarray", Array)  # what the entry calls, made after this
    monkeypatch.setattr(backend, "_launch_kernel", launch)
    tape, _ = tape.max_pool(x, **POOL).unwrap()
    forwards = _forwards(monkeypatch)
    failing.add("allocation")
    assert tape.max_pool(x, **POOL).error == (
        "autograd: cuda: max_pool: out of memory (needs 0.0 GiB)")
    failing.clear()
    failing.add("launch")
    assert tape.max_pool(x, **POOL).error == (
        "autograd: cuda: max_pool: forward kernel failed: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure")
    failing.clear()
    assert tape.max_pool(x, **POOL).is_ok() and len(forwards) == 2  # the failed two on the Python path, then C


def test_a_circular_conv_with_padding_stays_on_the_python_path(monkeypatch):
    """Its forward wraps the input, then convolves: two programs, not replayed; remembered as such, so that its
    calls skip the entry's making."""
    geom = Geometry.build(Family.CONV, 2, 3, (7,), (3,), (1,), (1,), circular=True)
    empty = stand_in.stand_in_cuda_tape(convgen)
    tape, ids = _leaves(empty, [stand_in.StandInArray(shape, np.float32) for shape in geom.parent_shapes])
    forwards = _forwards(monkeypatch)
    for _ in range(2):
        tape, node = reference.apply_op(tape, geom, ids).unwrap()
    assert forwards.count(geom) == 2
    entries = [entry for by_check in host_path.CALLS[tape._backend].values() for entry in by_check.values()]
    assert entries == [host_path.NOT_REPLAYED] and tape.shape(node) == (3, 7)


def test_threads_replaying_at_once_each_record_their_own_calls(stand_in_tape):
    """Calls replayed in C from several threads, each on its own tape, the launches' Python callbacks switching threads
    between them, and one thread clearing the cache as it goes: every tape gets its own nodes, every call launches."""
    tape, x = stand_in_tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
    tape, _ = tape.max_pool(x, **POOL).unwrap()
    results, calls = {}, 200

    def run(index: int) -> None:
        mine = tape
        for call in range(calls):
            if index == 0 and call % 50 == 0:
                host_path.CALLS.clear()
            mine, node = mine.max_pool(x, **POOL).unwrap()
        results[index] = (len(mine), mine.shape(node))

    threads = [threading.Thread(target=run, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == dict.fromkeys(range(4), (2 + calls, (1, 2, 2)))
    assert len(RecordingModule.launches) == 1 + 4 * calls


def test_the_cache_starts_over_at_its_limit(stand_in_tape, monkeypatch):
    monkeypatch.setattr(host_path, "ENTRY_LIMIT", 2)
    monkeypatch.setattr(host_path, "CALLS", host_path.CALLS)
    host_path.CALLS.clear()
    monkeypatch.setattr(host_path, "_entries", 0)
    tape, x = stand_in_tape.leaf(stand_in.StandInArray((1, 4, 4), np.float32))
    for stride in (1, 2, 3, 1):
        tape, _ = tape.max_pool(x, **{**POOL, "stride": (stride, stride)}).unwrap()
    remembered = [args[-4] for by_check in host_path.CALLS.values() for by_args in by_check.values()
                  for args in by_args]
    assert remembered == [(3, 3), (1, 1)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++")
@pytest.mark.parametrize("poison", [False, True], ids=["cupy-allocations", "backend-methods"])
def test_replayed_outputs_and_gradients_are_the_python_paths_bit_for_bit(monkeypatch, poison):
    """On the emulated CuPy (the kernels run, compiled with g++): CuPy's constructors called directly, or the test
    mode's poisoning `_output` and `_scratch`."""
    backend = type("EmulatedBackend", (convgen.cuda.CupyBackend,), {"poison_outputs": poison})
    with stand_in.imports_as(emulated_cupy()):
        compiled_class = type("EmulatedTape", (convgen.cuda.Tape,), {"backend_class": backend})
        tapes = {"compiled": compiled_class(), "python": _python_path(compiled_class)()}
    forwards = _forwards(monkeypatch)
    for name, geom in GEOMETRIES.items():
        rng = reference.case_rng("compiled host path", name)
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        results = {}
        for label, empty in tapes.items():
            tape, ids = reference.record_leaves(empty, inputs)
            tape, _ = reference.apply_op(tape, geom, ids).unwrap()
            forwards.clear()
            tape, out = reference.apply_op(tape, geom, ids).unwrap()
            grads = tape.backward(out, grad).unwrap()
            results[label] = [np.asarray(tape.value(out))] + [np.asarray(grads[i]) for i in ids]
            assert len(forwards) == (label == "python"), (name, label)
        for got, expected in zip(results["compiled"], results["python"]):
            assert got.dtype == expected.dtype and np.array_equal(got, expected), name
