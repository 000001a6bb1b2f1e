"""convgen.torch's CUDA device layer, the parts that need no GPU: kernel arguments as raw pointers, and the
current-stream lookup with and without torch's raw-handle function."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def _recording_adapter(events: list, allocate=None):
    """stand_in_adapter whose backends record each scratch allocation (bytes, stream), give-back and launch in
    `events`, on stream 77; `allocate` replaces the allocator's."""
    with stand_in.stand_in_adapter(devices) as runner:
        make = runner._backend_class

        def backend_class(*kind):
            backend = make(*kind)

            def recorded(size, stream):
                events.append(("alloc", size, stream))
                return 1 << 40 if allocate is None else allocate(size, stream)

            backend._allocate, backend._free = recorded, lambda address: events.append(("free", address))
            backend._launch_kernel = lambda *launch: events.append(("launch",))
            return backend

        runner._backend_class, runner._current_stream = backend_class, lambda index: 77
        yield runner


def test_a_conv_pass_takes_its_scratch_as_one_block_given_back_after_its_last_launch() -> None:
    """A bf16 conv's forward and backward each take their scratch (packed weights, channels-last sources, partial
    sums) as one bare block of the caching allocator, of its layout's size, on the call's stream, and give it back
    once the pass's launches are queued (the allocator reuses it only for work queued after them)."""
    import convgen.torch as ct
    from convgen.geometry import Family, Geometry

    events: list = []
    with _recording_adapter(events) as runner:
        x, w, b = (torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
                   for shape in ((2, 64, 16, 16), (64, 64, 3, 3), (64,)))
        y = ct.conv(x, w, b, padding=1)
        y.backward(torch.ones_like(y))
        compiled = runner._backend(x, ct.precision.conv_precision(torch.bfloat16))._compile(
            Geometry.build(Family.CONV, 64, 64, (16, 16), (3, 3), (1, 1), (1, 1), batch=2))
    forward_size, backward_size = compiled.forward_scratch.size, compiled.backward_scratch[(True, True, True)].size
    assert forward_size and backward_size
    frees = [at for at, event in enumerate(events) if event[0] == "free"]
    passes = events[:frees[0] + 1], events[frees[0] + 1:]
    for (first, *launches, last), size in zip(passes, (forward_size, backward_size), strict=True):
        assert (first, last) == (("alloc", size, 77), ("free", 1 << 40))
        assert len(launches) >= 2 and set(launches) == {("launch",)}


def test_a_conv_pass_without_room_for_its_scratch_says_how_much_it_needs() -> None:
    import convgen.torch as ct

    def allocate(size, stream):
        raise torch.OutOfMemoryError("CUDA out of memory")

    events: list = []
    with _recording_adapter(events, allocate):
        x, w, b = (torch.randn(shape, dtype=torch.bfloat16) for shape in ((2, 64, 16, 16), (64, 64, 3, 3), (64,)))
        with pytest.raises(RuntimeError) as error:
            ct.conv(x, w, b, padding=1)
    assert str(error.value) == "convgen.torch.conv: out of memory (needs 0.0 GiB)"
    assert [event[0] for event in events] == ["alloc"]


def test_outputs_made_like_a_parameter_are_plain_contiguous_tensors_that_need_no_grad(monkeypatch) -> None:
    """A pass's output of an input's shape is torch.empty_like of that input (launch_program): of a Parameter, a plain
    tensor that requires no grad; of a tensor whose only dimension of more than one cell would make it channels-last,
    a contiguous one; an allocation that fails says how much it needed, by the op's error."""
    with stand_in.imports_as(stand_in.stand_in_cupy()):
        backend = devices._TorchCupyBackend("bfloat16", "medium")
    weight = torch.nn.Parameter(torch.zeros(4, 3, 3, 3, dtype=torch.bfloat16))
    made = backend._output_like(weight)
    assert type(made) is torch.Tensor and not made.requires_grad
    assert (made.shape, made.dtype, made.device) == (weight.shape, weight.dtype, weight.device) and made.is_contiguous()
    column = devices._kernel_ready(torch.zeros(2, 8, 1, 1, dtype=torch.bfloat16).to(memory_format=torch.channels_last))
    assert backend._output_like(column).is_contiguous()

    def full(tensor):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "empty_like", full)
    with pytest.raises(devices.OutOfMemory) as error:
        backend._output_like(torch.zeros(1024, 1024))
    assert str(error.value) == "out of memory (needs 0.0 GiB)"
