"""convgen.torch's choice of precision for its convolutions (convgen.torch.precision), without a GPU:
the chooser under each of torch's TF32 switches for convolutions (the per-operation fp32_precision
settings of torch 2.9+, the legacy allow_tf32, and a torch that has only the latter) and under convgen's
own setting; the error texts; the precision reaching the device layer (devices.forward/backward
stubbed) through the eager path, the custom ops and torch.compile; the CUDA runner's backend per
(dtype, precision) and its fallback to "highest"; and the CPU backend's results, which no precision
changes. The GPU's side is in test_torch_cuda.py."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

import convgen.torch as ct  # noqa: E402
from convgen.torch import devices, functional  # noqa: E402
from convgen.torch.precision import conv_precision, torch_conv_uses_tf32  # noqa: E402

OPS = torch.ops.convgen
_BACKENDS = torch.backends
_CUDNN = torch.backends.cudnn
# torch's new-API switches, parents before children (setting a parent sets its children).
_LEVELS = ((_BACKENDS, "generic"), (_CUDNN, "cudnn"), (_CUDNN.conv, "conv"), (_CUDNN.rnn, "rnn"))


@pytest.fixture(autouse=True)
def torch_switches():
    """torch's TF32 switches and convgen's setting, restored after each test: the legacy flag first
    (it sets conv and rnn), then the per-operation settings from the root down."""
    legacy = _CUDNN.allow_tf32
    saved = [level.fp32_precision for level, _ in _LEVELS]
    yield
    ct.set_float32_precision(None)
    _CUDNN.allow_tf32 = legacy
    for (level, _), value in zip(_LEVELS, saved):
        level.fp32_precision = value
    torch._dynamo.reset()  # compiled functions read torch's switch when traced


def _set(**levels: str) -> None:
    """Set torch's per-operation switches by name (generic, cudnn, conv, rnn), root first."""
    for level, name in _LEVELS:
        if name in levels:
            level.fp32_precision = levels[name]


def test_torch_default_is_tf32_for_convolutions() -> None:
    assert _CUDNN.allow_tf32 is True  # torch's own default, which convgen follows
    assert torch_conv_uses_tf32() is True
    assert conv_precision(torch.float32) == "medium"


@pytest.mark.parametrize("allow", [True, False])
def test_legacy_allow_tf32(allow: bool) -> None:
    _CUDNN.allow_tf32 = allow
    assert torch_conv_uses_tf32() is allow
    assert conv_precision(torch.float32) == ("medium" if allow else "highest")


@pytest.mark.parametrize(("generic", "cudnn", "conv", "tf32"), [
    ("none", "none", "ieee", False),
    ("none", "none", "tf32", True),
    ("ieee", "ieee", "tf32", True),  # the conv switch wins
    ("none", "tf32", "none", True),  # "none" takes the parent's
    ("tf32", "ieee", "none", False),
    ("tf32", "none", "none", True),  # from the root
    ("ieee", "none", "none", False),
    ("none", "none", "none", False),  # nothing says TF32
])
def test_per_operation_switches(generic: str, cudnn: str, conv: str, tf32: bool) -> None:
    """Each level set, root first (setting a level may set the levels below it)."""
    _set(generic=generic, cudnn=cudnn, conv=conv)
    assert torch_conv_uses_tf32() is tf32
    assert conv_precision(torch.float32) == ("medium" if tf32 else "highest")


@pytest.mark.parametrize("allow", [True, False])
def test_a_torch_with_only_allow_tf32(monkeypatch, allow: bool) -> None:
    """Before torch 2.9 cuDNN has no per-operation switches (nor their C getter)."""
    monkeypatch.delattr(torch._C, "_get_fp32_precision_getter")
    monkeypatch.setattr(torch.backends, "cudnn", types.SimpleNamespace(allow_tf32=allow))
    assert torch_conv_uses_tf32() is allow


@pytest.mark.parametrize("precision", ["highest", "high", "medium"])
@pytest.mark.parametrize("allow", [True, False])
def test_convgen_setting_overrides_torch(precision: str, allow: bool) -> None:
    _CUDNN.allow_tf32 = allow
    ct.set_float32_precision(precision)
    assert ct.get_float32_precision() == precision
    assert conv_precision(torch.float32) == precision
    ct.set_float32_precision(None)
    assert ct.get_float32_precision() is None
    assert conv_precision(torch.float32) == ("medium" if allow else "highest")


@pytest.mark.parametrize("precision", [None, "high", "medium"])
def test_float64_is_always_highest(precision: str | None) -> None:
    ct.set_float32_precision(precision)
    assert conv_precision(torch.float64) == "highest"


@pytest.mark.parametrize(("value", "shown"), [("fast", "'fast'"), ("HIGH", "'HIGH'"), (3, "3"), ("", "''")])
def test_set_float32_precision_rejects_other_values(value: object, shown: str) -> None:
    ct.set_float32_precision("high")
    message = ("convgen.torch.set_float32_precision: precision must be 'highest', 'high', 'medium' or None, "
               f"got {shown}")
    with pytest.raises(ValueError) as caught:
        ct.set_float32_precision(value)
    assert str(caught.value) == message
    assert ct.get_float32_precision() == "high"  # unchanged


def test_the_custom_ops_reject_other_precisions() -> None:
    x, w = torch.randn(1, 2, 5), torch.randn(3, 2, 2)
    with pytest.raises(ValueError) as caught:
        OPS.conv(x, w, None, [1], [0], [1], 1, False, "tf32")
    assert str(caught.value) == "convgen.torch.conv: precision must be 'highest', 'high' or 'medium', got 'tf32'"
    with pytest.raises(ValueError) as caught:
        OPS.conv_transpose_backward(torch.randn(1, 2, 6), torch.randn(1, 3, 5), torch.randn(3, 2, 2), [1], [0], [0],
                                    [1], 1, "ieee", [True, True, True])
    assert str(caught.value) == \
        "convgen.torch.conv_transpose: precision must be 'highest', 'high' or 'medium', got 'ieee'"


class _Recorder:
    """devices.forward/backward wrapped: the (op, direction, precision) of every call, then the real work."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, str, str]] = []
        forward, backward = devices.forward, devices.backward

        def recorded_forward(op, geom, tensors, precision="highest"):
            self.calls.append((op, "forward", precision))
            return forward(op, geom, tensors, precision)

        def recorded_backward(op, geom, tensors, saved, grad, precision="highest", wanted=None):
            self.calls.append((op, "backward", precision))
            return backward(op, geom, tensors, saved, grad, precision, wanted)

        monkeypatch.setattr(devices, "forward", recorded_forward)
        monkeypatch.setattr(devices, "backward", recorded_backward)


def _step(x, w, wt):
    y = ct.conv(x, w, padding=1)
    y = ct.max_pool(y, 2)
    return ct.conv_transpose(y, wt, stride=2).sum()


def _leaves(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(shape, generator=generator, dtype=dtype).requires_grad_()
                 for shape in ((2, 3, 6, 6), (4, 3, 3, 3), (4, 2, 2, 2)))


def _expected_calls(precision: str) -> list[tuple[str, str, str]]:
    return [("conv", "forward", precision), ("max_pool", "forward", "highest"),
            ("conv_transpose", "forward", precision), ("conv_transpose", "backward", precision),
            ("max_pool", "backward", "highest"), ("conv", "backward", precision)]


@pytest.mark.parametrize("path", ["eager", "custom ops", "compiled"])
@pytest.mark.parametrize(("allow", "setting", "precision"), [
    (True, None, "medium"), (False, None, "highest"), (True, "high", "high"), (True, "highest", "highest"),
    (False, "medium", "medium")])
def test_the_precision_reaches_the_device_layer(monkeypatch, path: str, allow: bool, setting: str | None,
                                                precision: str) -> None:
    """Forward and backward of both conv families get the chosen precision, the pools 'highest'."""
    _CUDNN.allow_tf32 = allow
    ct.set_float32_precision(setting)
    recorder = _Recorder(monkeypatch)
    if path == "custom ops":
        monkeypatch.setattr(functional, "_EAGER_FUNCTION", False)
    step = torch.compile(_step, fullgraph=True, backend="aot_eager") if path == "compiled" else _step
    step(*_leaves()).backward()
    assert recorder.calls == _expected_calls(precision)


def test_float64_reaches_the_device_layer_as_highest(monkeypatch) -> None:
    ct.set_float32_precision("medium")
    recorder = _Recorder(monkeypatch)
    _step(*_leaves(torch.float64)).backward()
    assert recorder.calls == _expected_calls("highest")


def test_compiled_functions_follow_convgen_setting_and_read_torch_switch_when_traced(monkeypatch) -> None:
    """convgen's setting is guarded (a change recompiles); torch's switch is read when the graph is traced."""
    recorder = _Recorder(monkeypatch)
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    compiled = torch.compile(lambda x, w: ct.conv(x, w), fullgraph=True, backend="aot_eager")
    compiled(x, w)
    ct.set_float32_precision("high")
    compiled(x, w)
    ct.set_float32_precision(None)
    _CUDNN.allow_tf32 = False
    compiled(x, w)  # the graph traced under allow_tf32=True
    torch._dynamo.reset()
    compiled(x, w)
    assert [precision for _, _, precision in recorder.calls] == ["medium", "high", "medium", "highest"]


def test_the_cpu_backend_computes_every_precision_alike() -> None:
    x, w, b = _leaves()[0].detach(), _leaves()[1].detach(), torch.randn(4)
    results = [OPS.conv(x, w, b, [1, 1], [1, 1], [1, 1], 1, False, p) for p in ("highest", "high", "medium")]
    assert all(torch.equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize(("dtype", "precision", "capability", "runs"), [
    ("float32", "medium", (9, 0), "medium"),
    ("float32", "high", (8, 0), "high"),
    ("float32", "highest", (9, 0), "highest"),
    ("float32", "medium", (7, 5), "highest"),  # no TF32 tensor cores: torch's own TF32 switch does nothing there
    ("float32", "high", (7, 0), "highest"),
    ("float64", "medium", (9, 0), "highest"),
])
def test_device_precision(dtype: str, precision: str, capability: tuple[int, int], runs: str) -> None:
    assert devices.device_precision(dtype, precision, capability) == runs


def test_the_cuda_runner_keeps_one_backend_per_dtype_and_precision(monkeypatch) -> None:
    """_CudaRunner._backend with a stand-in backend class and device capability (no GPU needed)."""
    made: list[tuple[str, str]] = []

    class Backend:
        def __init__(self, dtype: str, precision: str) -> None:
            made.append((dtype, precision))

    capabilities = {0: (9, 0), 1: (7, 5)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capabilities[device.index])
    runner = object.__new__(devices._CudaRunner)
    runner._backends, runner._by_call, runner._backend_class = {}, {}, Backend

    def tensor(dtype, index=0):
        return types.SimpleNamespace(dtype=dtype, device=torch.device("cuda", index), get_device=lambda: index)

    medium = runner._backend(tensor(torch.float32), "medium")
    assert runner._backend(tensor(torch.float32), "medium") is medium
    high = runner._backend(tensor(torch.float32), "high")
    highest = runner._backend(tensor(torch.float32), "highest")
    assert len({id(medium), id(high), id(highest)}) == 3
    assert runner._backend(tensor(torch.float32, 1), "medium") is highest  # an old device runs "highest"
    wide = runner._backend(tensor(torch.float64), "medium")
    assert made == [("float32", "medium"), ("float32", "high"), ("float32", "highest"), ("float64", "highest")]
    assert wide is runner._backend(tensor(torch.float64), "highest")
