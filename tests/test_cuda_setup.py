"""The CUDA tape fails at `Tape()` with one message when it cannot run: no CuPy (naming the extra
to install) or no GPU. Runs without CuPy: both cases are simulated."""

from __future__ import annotations

import sys
import types

import pytest
from convgen.backend import BackendError


@pytest.fixture
def cuda_tape(monkeypatch):
    """convgen.cuda's Tape with no backend made yet (the tape caches one per class)."""
    import convgen.cuda
    from convgen.tape import Tape

    monkeypatch.setattr(Tape, "_backends", {})
    return convgen.cuda.Tape


def test_without_cupy_the_tape_names_the_extra(cuda_tape, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(BackendError) as error:
        cuda_tape()
    assert str(error.value) == ("the CUDA tape needs CuPy (import of cupy halted; None in sys.modules); install it "
                                "with: pip install 'convgen[cuda13]' (or 'convgen[cuda12]' for a CUDA 12 driver)")


def test_without_a_gpu_the_tape_says_so(cuda_tape, monkeypatch):
    class CUDARuntimeError(RuntimeError):
        pass

    def no_device() -> int:
        raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    runtime = types.SimpleNamespace(getDeviceCount=no_device, CUDARuntimeError=CUDARuntimeError)
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime, cuda.compiler = runtime, types.ModuleType("cupy.cuda.compiler")
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.compiler", cuda.compiler)):
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(BackendError) as error:
        cuda_tape()
    assert str(error.value) == "the CUDA tape found no GPU (cudaErrorNoDevice: no CUDA-capable device is detected)"


def test_a_circular_conv_whose_wrapped_input_reaches_32_bits_is_refused():
    """The pad kernel and the conv kernels on the wrapped input index it with 32 bits: in + 2p past
    2^32 - 1 cells is refused before anything runs (the input itself fits)."""
    import convgen.cuda
    from convgen.geometry import Family, Geometry

    refused = Geometry.build(Family.CONV, 1, 1, (2**31,), (1,), (1,), (2**30,), circular=True)
    assert convgen.cuda.unsupported(refused, "float32") == (
        "circular padding whose wrapped input reaches 2^32 elements is not supported on the CUDA tape yet")
    largest = Geometry.build(Family.CONV, 1, 1, (2**31 - 1,), (1,), (1,), (2**30 - 1,), circular=True)
    assert convgen.cuda.unsupported(largest, "float32") is None
