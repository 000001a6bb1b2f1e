"""convgen.torch's compiled host path (convgen.torch.host_path, runtime/compiled/eager_call.c): an eager call whose
tensor shapes and arguments an earlier call had is replayed in C with the same allocations and launches, argument
for argument, as the Python path makes, and the same backward attached; every other call, and every replay that fails
on the way, is the Python path's. On CPU tensors run through the CUDA runner on the recording stand-in CuPy
(tests/test_host_path.py's: each launch's argument slots recorded); the GPU tests compare the two paths' values."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

import convgen.torch as ct  # noqa: E402
from convgen.torch import devices, functional  # noqa: E402
from convgen.torch import host_path as eager_host_path  # noqa: E402
from test_host_path import recording_tape, stand_in  # noqa: E402, F401  (the fixture)

pytestmark = pytest.mark.skipif(not eager_host_path.COMPILED, reason="convgen._host_path is not built")

# name -> (op, tensor shapes (input, weight, bias; None for none), the op's other arguments)
CALLS = {
    "conv 2-D grouped": (ct.conv, ((2, 4, 6, 5), (6, 2, 3, 2), (6,)), ((1, 2), (1, 0), 1, 2)),
    "conv 3-D no bias": (ct.conv, ((1, 2, 4, 5, 3), (3, 2, 2, 2, 2), None), (1, 1)),
    "conv 1-D circular unpadded": (ct.conv, ((1, 2, 7), (3, 2, 3), (3,)), (1, 0, 1, 1, "circular")),
    "conv_transpose 2-D": (ct.conv_transpose, ((2, 4, 4, 5), (4, 3, 3, 3), (3,)), (2, 1, (1, 0))),
    "max_pool 2-D": (ct.max_pool, ((2, 2, 5, 6),), ((2, 3), (2, 1), (1, 1))),
    "avg_pool 3-D": (ct.avg_pool, ((1, 3, 5, 4, 6),), ((2, 2, 2), (1, 2, 1), (0, 1, 1))),
    "smooth_max_pool 1-D": (ct.smooth_max_pool, ((2, 2, 9),), ((3,), 2.5, (2,), (1,))),
    # Its window offsets are shaped like its input: its gradient is still made in the input's dtype.
    "max_pool 2-D k1": (ct.max_pool, ((1, 2, 3, 4),), (1,)),
}


@pytest.fixture
def recording(request, monkeypatch):
    """convgen.torch on the recording stand-in: yields the list of the Python path's forwards and backwards (the ops
    devices.forward ran, and "<op> backward" for each devices.backward) since the block began; every launch lands in
    RecordingModule.launches."""
    request.getfixturevalue("recording_tape")
    forwards = []
    forward, backward = devices.forward, devices.backward

    def counted(op, geom, tensors, precision="highest"):
        forwards.append(op)
        return forward(op, geom, tensors, precision)

    def counted_backward(op, *args):
        forwards.append(f"{op} backward")
        return backward(op, *args)

    monkeypatch.setattr(devices, "forward", counted)
    monkeypatch.setattr(devices, "backward", counted_backward)
    # A conv without a bias keeps its zeros unless a graph is being captured; torch's CPU build cannot say.
    monkeypatch.setattr(devices.torch.cuda, "is_current_stream_capturing", lambda: False)
    with stand_in.stand_in_adapter(devices):
        yield forwards


def _tensors(shapes, dtype=torch.float32, grad=True):
    generator = torch.Generator().manual_seed(0)
    return tuple(None if shape is None else torch.randn(shape, generator=generator, dtype=dtype).requires_grad_(grad)
                 for shape in shapes)


def _symbolic(launches, known):
    """The launches with every slot inside a known tensor (name -> tensor) as (name, byte offset), and any other value
    of 2**20 or more (a tensor the pass made and dropped, a pass's scratch) by the order it first appears: CPU tensors
    get new addresses every call, and the same value stands for the same thing throughout a call."""
    spans = [(name, t.data_ptr(), t.numel() * t.element_size()) for name, t in known.items()]
    others: dict[int, str] = {}

    def slot(value):
        for name, start, size in spans:
            if start <= value < start + max(size, 1):
                return name, value - start
        return others.setdefault(value, f"other {len(others)}") if value >= 1 << 20 else value

    return [(symbol, grid, block, tuple(slot(v) for v in slots)) for symbol, grid, block, slots in launches]


def _call(op, tensors, args, monkeypatch):
    """One call with the stand-in's scratch addresses counted from the same start: its output and its launches with
    the input, output and saved tensors' addresses symbolic."""
    from test_host_path import RecordingModule

    del RecordingModule.launches[:]
    monkeypatch.setattr(stand_in, "_ADDRESSES", itertools.count(1 << 30, 1 << 8))
    y = op(*tensors, *args)
    known = {f"input {i}": t for i, t in enumerate(tensors) if t is not None}
    known["output"] = y
    if y.grad_fn is not None:
        known.update((f"saved {i}", t) for i, t in enumerate(y.grad_fn.saved_tensors) if t is not None)
    return y, _symbolic(RecordingModule.launches, known)


@pytest.mark.parametrize("name", CALLS)
def test_a_replayed_call_launches_what_the_python_path_launches(recording, monkeypatch, name):
    op, shapes, args = CALLS[name]
    tensors = _tensors(shapes)
    first, python_launches = _call(op, tensors, args, monkeypatch)  # the Python path's, remembered
    second, compiled_launches = _call(op, tensors, args, monkeypatch)
    assert recording == [op.__name__]  # the second call was replayed
    assert python_launches and compiled_launches == python_launches
    assert (second.shape, second.dtype, second.requires_grad) == (first.shape, first.dtype, True)
    assert type(second.grad_fn) is type(first.grad_fn)
    assert [None if t is None else t.shape for t in second.grad_fn.saved_tensors] == \
        [None if t is None else t.shape for t in first.grad_fn.saved_tensors]


@pytest.mark.parametrize(("name", "input_grad"), [
    ("conv 2-D grouped", True), ("conv 2-D grouped", False), ("conv 3-D no bias", True), ("conv_transpose 2-D", True),
    ("conv_transpose 2-D", False), ("max_pool 2-D", True), ("avg_pool 3-D", True), ("smooth_max_pool 1-D", True),
    ("max_pool 2-D k1", True)])
def test_a_replayed_backward_launches_what_the_python_paths_backward_launches(recording, monkeypatch, name,
                                                                              input_grad):
    """A backward is replayed from its second call on (per geometry, precision and the gradients wanted), with the
    Python path's launches and gradients' shapes and dtypes."""
    from test_host_path import RecordingModule

    op, shapes, args = CALLS[name]
    tensors = _tensors(shapes)
    tensors[0].requires_grad_(input_grad)
    wanted = [t for t in tensors if t is not None and t.requires_grad]
    runs = []
    for _ in range(2):
        y, _ = _call(op, tensors, args, monkeypatch)
        del RecordingModule.launches[:]
        monkeypatch.setattr(stand_in, "_ADDRESSES", itertools.count(1 << 30, 1 << 8))
        grads = torch.autograd.grad(y, wanted, torch.ones_like(y))
        known = {f"input {i}": t for i, t in enumerate(tensors) if t is not None}
        known |= {f"grad {i}": g for i, g in enumerate(grads)}
        runs.append((_symbolic(RecordingModule.launches, known), [(g.shape, g.dtype) for g in grads]))
    assert runs[0][0] and runs[1] == runs[0]
    assert recording == [op.__name__, f"{op.__name__} backward"]


def test_a_backward_of_another_upstream_layout_takes_the_python_path(recording):
    x, w, b = _tensors(((2, 4, 6, 5), (6, 2, 3, 2), (6,)))
    for upstream in (torch.ones, lambda shape: torch.ones(shape[::-1]).permute(3, 2, 1, 0), torch.ones):
        y = ct.conv(x, w, b, 1, 1, 1, 2)
        torch.autograd.grad(y, (x, w, b), upstream(y.shape))
    assert recording == ["conv", "conv backward", "conv backward"]  # the second's upstream is not contiguous


def test_without_grad_a_replayed_call_attaches_no_backward(recording, monkeypatch):
    op, shapes, args = CALLS["max_pool 2-D"]
    (x,) = _tensors(shapes)
    op(x, *args)
    with torch.no_grad():
        y = op(x, *args)
    (z,) = _tensors(shapes, grad=False)
    w = op(z, *args)
    assert recording == ["max_pool"] and y.grad_fn is None and w.grad_fn is None and not w.requires_grad


@pytest.mark.parametrize("change", ["list for a tuple", "other shape", "no bias", "other dtype", "not contiguous",
                                    "a tensor subclass"])
def test_a_call_not_exactly_an_entrys_takes_the_python_path(recording, change):
    x, w, b = _tensors(((2, 4, 6, 5), (6, 2, 3, 2), (6,)))
    args = [(1, 2), (1, 0), 1, 2]
    ct.conv(x, w, b, *args)
    if change == "list for a tuple":
        args[0] = [1, 2]
    elif change == "other shape":
        x = torch.randn(2, 4, 6, 6)
    elif change == "no bias":
        b = None
    elif change == "other dtype":
        x, w, b = (t.double() for t in (x, w, b))
    elif change == "not contiguous":
        x = torch.randn(2, 4, 5, 6).transpose(2, 3)
    else:
        x = x.detach().as_subclass(_Subclass)
    ct.conv(x, w, b, *args)
    assert recording == ["conv", "conv"]


@pytest.mark.parametrize(("argument", "value", "error"), [
    ("groups", 2.0, (ValueError, "convgen.torch.conv: groups must be a natural number, got 2.0")),
    ("dilation", True, (TypeError, "convgen.torch.conv: dilation must be an int or a tuple of 2 ints, got True")),
])
def test_an_argument_equal_to_an_entrys_but_of_another_type_gets_the_python_paths_error(recording, argument, value,
                                                                                         error):
    x, w, b = _tensors(((2, 4, 6, 5), (6, 2, 3, 2), (6,)))
    args = {"stride": (1, 2), "padding": (1, 0), "dilation": 1, "groups": 2}
    ct.conv(x, w, b, **args)
    with pytest.raises(error[0]) as raised:
        ct.conv(x, w, b, **{**args, argument: value})
    assert str(raised.value) == error[1] and recording == ["conv"]


def test_keyword_arguments_are_replayed_as_positional_ones(recording):
    x, w, b = _tensors(((2, 4, 6, 5), (6, 2, 3, 2), (6,)))
    ct.conv(x, w, b, (1, 2), (1, 0), 1, 2)
    ct.conv(x, w, b, groups=2, padding=(1, 0), stride=(1, 2))
    ct.conv(x, w, b, (1, 2), (1, 0), 1, 2, "zeros")
    assert recording == ["conv"]


def test_each_dtype_of_the_same_shapes_has_its_own_entry(recording):
    tensors32 = _tensors(((1, 2, 8), (3, 2, 3), (3,)))
    tensors64 = tuple(t.detach().double() for t in tensors32)
    for tensors in (tensors32, tensors64, tensors32, tensors64):
        ct.conv(*tensors, 1, 1)
    assert recording == ["conv", "conv"] and len(eager_host_path.CALLS["conv"]) == 2


class _Subclass(torch.Tensor):
    """A tensor subclass, which the C side does not take."""


def test_autocast_and_the_precision_setting_take_the_python_path(recording):
    x, w, b = _tensors(((1, 2, 8), (2, 2, 3), (2,)))
    ct.conv(x, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ct.conv(x, w, b).dtype == torch.bfloat16
    before = ct.get_float32_precision()
    other = "highest" if functional.conv_precision(torch.float32) != "highest" else "medium"
    ct.set_float32_precision(other)
    try:
        ct.conv(x, w, b)
        ct.conv(x, w, b)
    finally:
        ct.set_float32_precision(before)
    ct.conv(x, w, b)
    # The first call, autocast's, the other precision's (the entry holds the first's); then the first's again, replayed
    assert recording == ["conv"] * 4


def test_a_failed_replay_gives_the_python_paths_error(recording, monkeypatch):
    x, w, b = _tensors(((1, 64, 8, 8), (64, 64, 3, 3), (64,)), dtype=torch.bfloat16)
    ct.conv(x, w, b, 1, 1)
    entry = next(iter(eager_host_path.CALLS["conv"].values()))
    program = entry[eager_host_path.ENTRY_FIELDS.index("program")]
    assert program[2], "the conv's forward takes a scratch base"
    backend = devices._runner(x)._backend(x, functional.conv_precision(torch.bfloat16))

    def allocate(size, stream):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(backend, "_allocate", allocate)
    fields = list(entry)
    fields[eager_host_path.ENTRY_FIELDS.index("program")] = (*program[:3], allocate, *program[4:])
    eager_host_path.CALLS["conv"][next(iter(eager_host_path.CALLS["conv"]))] = tuple(fields)
    with pytest.raises(RuntimeError) as error:
        ct.conv(x, w, b, 1, 1)
    assert str(error.value) == "convgen.torch.conv: out of memory (needs 0.0 GiB)"
    assert recording == ["conv", "conv"]


def test_a_conv_without_bias_is_remembered_only_once_its_zeros_are_kept(recording, monkeypatch):
    """Zeros made while a CUDA graph is captured are not kept (they are filled when the graph replays): a call then
    leaves no entry, and the next one outside the capture does."""
    x, w = _tensors(((1, 2, 8), (3, 2, 3)))
    devices._ZERO_BIASES.clear()
    monkeypatch.setattr(devices.torch.cuda, "is_current_stream_capturing", lambda: True)
    ct.conv(x, w)
    assert not devices._ZERO_BIASES and not eager_host_path.CALLS["conv"]
    monkeypatch.setattr(devices.torch.cuda, "is_current_stream_capturing", lambda: False)
    ct.conv(x, w)
    ct.conv(x, w)
    (zeros,) = devices._ZERO_BIASES.values()
    (entry,) = eager_host_path.CALLS["conv"].values()
    assert entry[eager_host_path.ENTRY_FIELDS.index("fixed")] == (zeros,) and recording == ["conv", "conv"]


def test_the_cache_starts_over_at_its_limit(recording, monkeypatch):
    monkeypatch.setattr(eager_host_path, "ENTRY_LIMIT", 2)
    x = torch.randn(1, 1, 8)
    for kernel in (2, 3, 4):
        ct.max_pool(x, kernel)
    assert sum(map(len, eager_host_path.CALLS.values())) == 1 and (x.shape, x.dtype, -1, 4, None, 0, 1) in \
        eager_host_path.CALLS["max_pool"]
    ct.max_pool(x, 4)
    assert recording == ["max_pool"] * 3


@pytest.mark.cuda
@pytest.mark.parametrize(("name", "dtype"), [*((name, torch.float32) for name in CALLS),
                                             *((name, torch.bfloat16) for name in CALLS if "pool" in name)])
def test_on_cuda_a_replayed_call_gives_the_python_paths_values_and_gradients(monkeypatch, name, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    op, shapes, args = CALLS[name]
    eager_host_path.clear()
    ran = []
    forward, backward = devices.forward, devices.backward
    monkeypatch.setattr(devices, "forward", lambda *given: ran.append("forward") or forward(*given))
    monkeypatch.setattr(devices, "backward", lambda *given: ran.append("backward") or backward(*given))
    tensors = tuple(None if t is None else t.detach().cuda().requires_grad_() for t in _tensors(shapes, dtype))
    runs = []
    for _ in range(2):  # the Python path's, then the replays
        y = op(*tensors, *args)
        upstream = torch.linspace(-1, 1, y.numel(), device="cuda", dtype=dtype).view_as(y)
        runs.append((y.detach(), torch.autograd.grad(y, [t for t in tensors if t is not None], upstream)))
    assert ran == ["forward", "backward"]  # the second call and its backward were replayed
    (y0, grads0), (y1, grads1) = runs
    assert torch.equal(y0, y1) and all(torch.equal(g0, g1) for g0, g1 in zip(grads0, grads1, strict=True))
    assert all(g.dtype == dtype for g in grads1)


@pytest.mark.parametrize("name", ["max_pool 2-D k1", "smooth_max_pool 1-D"])
def test_a_pools_backward_is_replayed_with_its_kept_state_of_another_dtype(recording, name):
    """A bf16 pool keeps its window offsets as integers and its sums in float32: the entry checks each tensor's own
    dtype, and the input's gradient is bf16."""
    op, shapes, args = CALLS[name]
    (x,) = _tensors(shapes, dtype=torch.bfloat16)
    for _ in range(2):
        y = op(x, *args)
        kept_dtypes = {t.dtype for t in y.grad_fn.saved_tensors[1:]}
        (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert kept_dtypes and torch.bfloat16 not in kept_dtypes and grad.dtype == torch.bfloat16
    assert recording == [op.__name__, f"{op.__name__} backward"]
