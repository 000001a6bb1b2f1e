"""convgen.torch's CUDA device layer, the parts that need no GPU: kernel arguments as raw pointers, and the
current-stream lookup with and without torch's raw-handle function."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from convgen.torch import devices  # noqa: E402


class _Pointer:
    """A stand-in for CuPy's CIntptr: the pointer it was made from."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is _Pointer and other.value == self.value


@pytest.mark.parametrize("pointer", [_Pointer, int], ids=["cintptr", "int"])
def test_kernel_arguments_are_the_tensors_raw_pointers(pointer) -> None:
    """TorchCupyBackend._call hands CuPy each tensor's data_ptr (as the backend's pointer type, passed by
    value like the pointer) and every other argument as it is, in order, on the calling op's stream."""
    backend = object.__new__(devices._TorchCupyBackend)
    backend._errors = ()
    backend._pointer = pointer
    launched = []

    def function(grid, block, args, shared_mem=0, stream=None):
        launched.append((grid, block, args, shared_mem, stream))

    weight, x = torch.ones(3), torch.nn.Parameter(torch.zeros(2, 2))  # a Parameter is a tensor too
    images = object()
    stream = devices._Stream(1234)
    backend.call.stream = stream
    try:
        backend._call("forward", function, (5,), (256,), 0, (weight, images, x))
    finally:
        backend.call.stream = None
    assert launched == [((5,), (256,), (pointer(weight.data_ptr()), images, pointer(x.data_ptr())), 0, stream)]
    assert all(type(a) is pointer for a in launched[0][2][::2])


def test_pointers_go_as_cupys_cintptr_where_it_has_one() -> None:
    class CIntptr:
        pass

    with_it = SimpleNamespace(cuda=SimpleNamespace(function=SimpleNamespace(CIntptr=CIntptr)))
    without = SimpleNamespace(cuda=SimpleNamespace(function=SimpleNamespace()))
    assert devices.pointer_type(with_it) is CIntptr
    assert devices.pointer_type(without) is int
    assert devices.pointer_type(SimpleNamespace(cuda=SimpleNamespace())) is int


def test_the_current_stream_falls_back_to_torch_cuda_current_stream(monkeypatch) -> None:
    """Without torch._C._cuda_getCurrentRawStream the handle comes from torch.cuda.current_stream(index)."""
    asked = []

    class Stream:
        cuda_stream = 77

    def current_stream(index):
        asked.append(index)
        return Stream()

    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    assert devices._current_stream_function()(1) == 77 and asked == [1]


def test_the_current_stream_is_torch_raw_handle_where_torch_has_one(monkeypatch) -> None:
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1000 + index, raising=False)
    assert devices._current_stream_function()(2) == 1002


def test_a_tensor_off_the_kernels_alignment_is_copied_before_a_kernel_reads_it() -> None:
    """The kernels read their arrays in accesses of up to ARRAY_ALIGNMENT bytes: a contiguous view one float into its
    buffer comes back as an aligned copy of the same values, an aligned tensor as itself, a non-contiguous one
    contiguous."""
    from convgen.generated.contract import ARRAY_ALIGNMENT

    buffer = torch.arange(33, dtype=torch.float32)
    aligned = buffer[:32].view(4, 8)
    assert aligned.data_ptr() % ARRAY_ALIGNMENT == 0 and devices._kernel_ready(aligned) is aligned
    off = buffer[1:].view(4, 8)
    ready = devices._kernel_ready(off)
    assert off.data_ptr() % ARRAY_ALIGNMENT == 4 and ready.data_ptr() % ARRAY_ALIGNMENT == 0
    assert torch.equal(ready, off) and ready.is_contiguous()
    strided = devices._kernel_ready(aligned.t())
    assert strided.is_contiguous() and torch.equal(strided, aligned.t())
