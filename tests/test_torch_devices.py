"""convgen.torch's CUDA device layer, the parts that need no GPU: kernel arguments as raw pointers, and the
current-stream lookup with and without torch's raw-handle function."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from convgen.torch import devices  # noqa: E402


def test_kernel_arguments_are_the_tensors_raw_pointers() -> None:
    """TorchCupyBackend._call hands CuPy each tensor's data_ptr (an int, passed by value like the pointer)
    and every other argument as it is, in order, on the calling op's stream."""
    backend = object.__new__(devices._TorchCupyBackend)
    backend._errors = ()
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
    assert launched == [((5,), (256,), (weight.data_ptr(), images, x.data_ptr()), 0, stream)]
    assert all(type(a) is int for a in launched[0][2][::2])


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
