"""convgen.torch's CUDA device layer, the parts that need no GPU: kernel arguments as raw pointers, and the
current-stream lookup with and without torch's raw-handle function."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from convgen.cuda_kernels import float_bits  # noqa: E402
from convgen.torch import devices  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from suite import stand_in  # noqa: E402


class _Subclass(torch.Tensor):
    """A tensor subclass, which no exact-type entry of the address table knows."""


def test_kernel_arguments_are_the_tensors_raw_pointers() -> None:
    """TorchCupyBackend gives the kernels each tensor's data_ptr (Parameters and other subclasses too), and launches
    on the calling op's stream."""
    with stand_in.imports_as(stand_in.stand_in_cupy()):
        backend = devices._TorchCupyBackend("float32", "highest")
    weight, x = torch.ones(3), torch.nn.Parameter(torch.zeros(2, 2))
    other = torch.zeros(4).as_subclass(_Subclass)
    assert [backend._address(t) for t in (weight, x, other)] == [weight.data_ptr(), x.data_ptr(), other.data_ptr()]
    assert float_bits(1.5) == 0x3FC00000 and float_bits(0.1) == 0x3DCCCCCD  # float32's bits, rounded to nearest
    backend.call.stream = 1234
    try:
        assert backend._stream_pointer() == 1234
    finally:
        backend.call.stream = 0


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
