"""convgen.torch on CUDA tensors: the functional ops against torch's CUDA ops in strict float32 (TF32
off) and in float64, gradcheck at rank 4, opcheck, a non-default current stream, a second device,
CUDA graph capture of forward and backward, outputs from torch's caching allocator (not CuPy's pool),
non-contiguous inputs, float16 and bfloat16 tensors, autocast, and the precision of float32 convolutions
under torch's TF32 switches and convgen's setting (issue 11's bounds against float64). Skipped without a
GPU, CuPy or torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)

import convgen.torch as ct  # noqa: E402
import test_torch_functional as functional_tests  # noqa: E402
import test_torch_library as library_tests  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from precision_bounds import HALF_BOUND, TF32_BOUND, high_bound  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def strict_float32():
    """torch's CUDA convolutions in true float32, as the kernels compute."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", functional_tests.CASES, ids=str)
def test_against_torch_cuda(case, dtype) -> None:
    functional_tests.check(case, dtype, device="cuda")


@pytest.mark.parametrize("dtype", functional_tests.HALF_DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", functional_tests.CASES, ids=str)
def test_16_bit_against_torch_in_float64_on_cuda(case, dtype) -> None:
    functional_tests.check_half(case, dtype, device="cuda")


def test_noncontiguous_input() -> None:
    for case in functional_tests.CASES[:8]:
        functional_tests.check(case, torch.float32, device="cuda", noncontiguous=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_tensors_that_start_off_the_kernels_alignment(dtype) -> None:
    """Views one element into their buffers (contiguous, but off the kernels' 16-byte accesses) as the input, the
    weight and the upstream gradient of a conv whose stages take those accesses (the bias gradient's quads; in bf16
    the weight gradient reading D in place): the same bits as from aligned copies, and no CUDA error."""
    def offset(t: torch.Tensor) -> torch.Tensor:
        view = torch.empty(t.numel() + 1, dtype=dtype, device="cuda")[1:].view(t.shape)
        view.copy_(t)
        assert view.data_ptr() % 16 != 0
        return view

    generator = torch.Generator(device="cuda").manual_seed(5)
    x, w, b, seed = (torch.randn(shape, device="cuda", generator=generator).to(dtype)
                     for shape in ((4, 32, 16, 8), (32, 32, 3, 3), (32,), (4, 32, 16, 8)))
    runs = []
    for make in (torch.Tensor.clone, offset):
        leaves = [make(t).detach().requires_grad_(True) for t in (x, w, b)]
        y = ct.conv(*leaves, padding=1)
        y.backward(make(seed))
        runs.append([y.detach(), *(t.grad for t in leaves)])
    torch.cuda.synchronize()
    for aligned, off in zip(*runs, strict=True):
        assert torch.equal(aligned, off)


@pytest.mark.parametrize("padding_mode", ["zeros", "circular"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("needs", library_tests.NEEDS, ids=library_tests.NEEDS_IDS)
def test_backward_computes_only_the_gradients_autograd_reads(monkeypatch, compiled, needs, padding_mode) -> None:
    """Circular padding included: without the weight gradient the CUDA backend pads no input."""
    library_tests.check_only_wanted_gradients(monkeypatch, compiled, needs, "cuda", padding_mode)


def test_gradcheck_rank_4() -> None:
    for name, function, leaves in library_tests.gradcheck_cases(4):
        on_gpu = tuple(leaf.detach().cuda().requires_grad_() for leaf in leaves)
        assert torch.autograd.gradcheck(function, on_gpu, fast_mode=True), name


@pytest.mark.parametrize("sample", library_tests.forward_samples("cuda") + library_tests.backward_samples("cuda"),
                         ids=library_tests._id)
def test_opcheck(sample) -> None:
    op, args = sample
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("sample", [sample for dtype in functional_tests.HALF_DTYPES
                                    for sample in library_tests.forward_samples("cuda", dtype)
                                    + library_tests.backward_samples("cuda", dtype)],
                         ids=lambda s: f"{library_tests._id(s)}-{s[1][0].dtype}")
def test_opcheck_16_bit(sample) -> None:
    """On CUDA smooth max keeps its pivots and sums of 16-bit inputs in float32: the fakes must say so."""
    op, args = sample
    torch.library.opcheck(op, args)


def test_saved_state_dtypes_on_cuda() -> None:
    x = torch.randn(1, 2, 5, 5, device="cuda")
    assert torch.ops.convgen.max_pool(x, [2, 2], [1, 1], [0, 0], [1, 1])[1].dtype == torch.uint8
    assert [s.dtype for s in torch.ops.convgen.smooth_max_pool(x, [2, 2], 1.0, [1, 1], [0, 0], [1, 1])[1:]] == \
        [torch.float32, torch.float32]


def test_runs_on_the_current_stream() -> None:
    """Queued behind a long sleep on a side stream, the op still reads the input written there: it ran
    on that stream, not on the default one."""
    x = torch.randn(2, 4, 16, 16, device="cuda")
    w = torch.randn(8, 4, 3, 3, device="cuda")
    expected = F.conv2d(x, w, padding=1)
    ct.conv(x, w, padding=1)  # compiled first: NVRTC inside the timed region would outlast the sleep
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        delayed = x * 1.0
        got = ct.conv(delayed, w, padding=1)
        assert not side.query()  # the conv is queued behind the sleep on `side`
    side.synchronize()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one GPU")
def test_second_device() -> None:
    case = functional_tests.CASES[1]
    functional_tests.check(case, torch.float32, device="cuda:1")
    x = torch.randn(2, 3, 6, 6, device="cuda:1")
    assert ct.max_pool(x, (2, 2)).device == torch.device("cuda:1")
    assert torch.cuda.current_device() == 0


def _step(x, w, b):
    y = ct.conv(x, w, b, padding=1, padding_mode="circular")
    return ct.max_pool(torch.relu(y), (2, 2, 2, 2), stride=1).square().sum()


def test_graph_capture_forward_and_backward() -> None:
    x = torch.randn(2, 2, 5, 5, 4, 4, device="cuda")
    w = torch.randn(3, 2, 3, 3, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(3, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles every kernel the capture will launch
        for _ in range(2):
            w.grad = b.grad = None
            _step(x, w, b).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    w.grad = b.grad = None
    with torch.cuda.graph(graph):
        loss = _step(x, w, b)
        loss.backward()
    fresh = torch.randn_like(x)
    x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    w_ref, b_ref = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    expected = _step(fresh, w_ref, b_ref)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(b.grad, b_ref.grad, rtol=1e-4, atol=1e-3)


def _bf16_step(x, w, b, upstream):
    for leaf in (x, w, b):
        leaf.grad = None
    y = ct.conv(x, w, b, padding=1)
    y.backward(upstream)
    return y


def test_a_16_bit_conv_steps_scratch_is_given_back_and_replays_in_a_graph() -> None:
    """A bf16 step's passes take their scratch (packed weights, channels-last sources, partial sums) as bare blocks
    of torch's caching allocator: after a step only its outputs stay allocated, and under graph capture the blocks
    come from the graph's pool, the replay giving the eager step's bits."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    x, w, b = (torch.randn(shape, device="cuda", generator=generator).to(torch.bfloat16).requires_grad_()
               for shape in ((4, 64, 28, 28), (64, 64, 3, 3), (64,)))
    upstream = torch.randn(4, 64, 28, 28, device="cuda", generator=generator).to(torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles every kernel the capture will launch
        for _ in range(2):
            _bf16_step(x, w, b, upstream)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    x.grad = w.grad = b.grad = None
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = _bf16_step(x, w, b, upstream)
    torch.cuda.synchronize()
    kept = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in (y, x.grad, w.grad, b.grad))
    assert torch.cuda.memory_allocated() - before == kept
    assert torch.cuda.max_memory_allocated() - before > kept  # the scratch was there during the step
    # Detached: a clone of y would keep its graph, whose leaves' AccumulateGrad nodes hold the default stream that
    # this eager step ran on, and the captured backward would then sync with that stream.
    eager = [t.detach().clone() for t in (y, x.grad, w.grad, b.grad)]
    del y
    x.grad = w.grad = b.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = _bf16_step(x, w, b, upstream)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, e) for a, e in zip((y, x.grad, w.grad, b.grad), eager, strict=True))


def test_outputs_come_from_torch_memory() -> None:
    x = torch.randn(4, 8, 32, 32, device="cuda")
    w = torch.randn(16, 8, 3, 3, device="cuda")
    ct.conv(x, w, padding=1)  # compile outside the measurement
    torch.cuda.synchronize()
    pool = cupy.get_default_memory_pool()
    pool_before, torch_before = pool.total_bytes(), torch.cuda.memory_allocated()
    y = ct.conv(x, w, padding=1)
    grown = torch.cuda.memory_allocated() - torch_before
    assert grown >= y.numel() * y.element_size()
    assert pool.total_bytes() == pool_before


@pytest.mark.parametrize("dtype", functional_tests.HALF_DTYPES, ids=["float16", "bfloat16"])
def test_autocast_runs_the_convolutions_in_16_bits_as_torch_does(dtype) -> None:
    """The dtypes torch's own ops give under autocast, forward and backward, and issue 11's bound
    against float64 on the values autocast rounded."""
    x = torch.randn(2, 3, 8, 8, device="cuda", requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=dtype):
        out, expected = ct.conv(x, w, padding=1), F.conv2d(x, w, padding=1)
        pooled, expected_pooled = ct.avg_pool(out, (2, 2)), F.avg_pool2d(expected, 2)
    assert (out.dtype, pooled.dtype) == (expected.dtype, expected_pooled.dtype) == (dtype, dtype)
    grads = torch.autograd.grad(pooled.float().sum(), (x, w))
    assert [g.dtype for g in grads] == [torch.float32, torch.float32]  # autocast's casts are differentiable
    rounded = [t.detach().to(dtype).double() for t in (x, w)]
    error = functional_tests._relative_error(out, F.conv2d(*rounded, padding=1))
    assert error <= HALF_BOUND, error


# Issue 11's bounds against float64: tests/precision_bounds.py.
FMA_BOUND = 1e-5  # a float32 FMA conv over 288-term reductions is far inside this; TF32 is not


def _conv_step(x, w, b):
    """y and (dx, dw, db) of a conv2d with a fixed upstream gradient of float32 values."""
    y = ct.conv(x, w, b, padding=1)
    seed = torch.linspace(-1, 1, y.numel(), device=y.device, dtype=torch.float32).reshape(y.shape).to(y.dtype)
    return (y.detach(), *torch.autograd.grad(y, (x, w, b), seed))


def _leaves(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """x, w and b of float32 values (the float64 reference sees exactly the float32 run's inputs)."""
    generator = torch.Generator(device="cuda").manual_seed(11)
    return tuple(torch.randn(shape, generator=generator, device="cuda").to(dtype).requires_grad_()
                 for shape in ((4, 32, 24, 24), (48, 32, 3, 3), (48,)))


def _float32_conv(allow_tf32: bool, setting: str | None) -> tuple[torch.Tensor, ...]:
    """The step in float32, with torch's legacy switch and convgen's setting as given."""
    torch.backends.cudnn.allow_tf32 = allow_tf32
    ct.set_float32_precision(setting)
    try:
        return _conv_step(*_leaves(torch.float32))
    finally:
        ct.set_float32_precision(None)


def _relative_errors(got: tuple[torch.Tensor, ...]) -> list[float]:
    """‖got − ref‖ / ‖ref‖ of y, dx, dw and db against the float64 run on the same values."""
    reference = _conv_step(*_leaves(torch.float64))
    return [float((g.double() - r).norm() / r.norm()) for g, r in zip(got, reference, strict=True)]


def test_torch_tf32_switch_runs_tf32_within_its_bound() -> None:
    """torch's default (allow_tf32 True) gives TF32, within 1e-3 of float64 and visibly less exact than FMAs."""
    tf32 = _relative_errors(_float32_conv(True, None))
    fma = _relative_errors(_float32_conv(False, None))
    assert max(tf32) <= TF32_BOUND, tf32
    assert tf32[0] > 10 * fma[0], (tf32, fma)  # the tensor cores ran


def test_convgen_highest_is_fma_accurate_under_torch_tf32() -> None:
    highest = _float32_conv(True, "highest")
    for got, strict in zip(highest, _float32_conv(False, None), strict=True):
        assert torch.equal(got, strict)  # the FMA path, as with TF32 off
    errors = _relative_errors(highest)
    assert max(errors) <= FMA_BOUND, errors


def test_convgen_high_is_within_twice_the_fma_error() -> None:
    high = _relative_errors(_float32_conv(True, "high"))
    fma = _relative_errors(_float32_conv(True, "highest"))
    for name, h, f in zip(("y", "dx", "dw", "db"), high, fma, strict=True):
        assert h <= high_bound(f), f"{name}: 3xTF32 {h:.3g} > 2 x FMA's {f:.3g}"


@pytest.mark.skipif(not hasattr(torch.backends.cudnn, "conv"), reason="torch before 2.9: allow_tf32 only")
def test_torch_per_operation_switch() -> None:
    """torch.backends.cudnn.conv.fp32_precision: 'ieee' runs the FMA path, 'tf32' the TF32 one."""
    strict = _float32_conv(False, None)
    medium = _float32_conv(True, "medium")
    saved = torch.backends.cudnn.conv.fp32_precision
    try:
        for setting, expected in (("ieee", strict), ("tf32", medium)):
            torch.backends.cudnn.conv.fp32_precision = setting
            got = _conv_step(*_leaves(torch.float32))
            assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True)), setting
    finally:
        torch.backends.cudnn.conv.fp32_precision = saved


def test_a_missing_bias_reads_zeros_made_once_and_never_kept_from_a_capture() -> None:
    """A conv without bias reads a zero bias (the kernels always add one), made once per channels, dtype and
    device. One made while a CUDA graph is captured is filled only when the graph replays, so none is kept from
    a capture: the eager calls after it still add zeros."""
    from convgen.torch import devices, host_path

    x, w = torch.randn(2, 3, 6, 6, device="cuda"), torch.randn(4, 3, 3, 3, device="cuda")
    expected = F.conv2d(x, w, None, 1, 1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles the kernels the capture will launch
        ct.conv(x, w, None, 1, 1)
    torch.cuda.current_stream().wait_stream(side)
    devices._ZERO_BIASES.clear()
    host_path.clear()  # else the capture replays the warm-up's entry, which holds the zeros it read
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ct.conv(x, w, None, 1, 1)
    assert not devices._ZERO_BIASES and not any(host_path.CALLS.values())  # nothing kept from the capture
    graph.replay()
    first, second = ct.conv(x, w, None, 1, 1), ct.conv(x, w, None, 1, 1)
    (bias,) = devices._ZERO_BIASES.values()
    assert bias.shape == (4,) and bias.dtype == torch.float32 and not bias.any()
    (entry,) = host_path.CALLS["conv"].values()  # the first eager call's, replayed by the second
    assert entry[host_path.ENTRY_FIELDS.index("fixed")] == (bias,)
    for y in (captured, first, second):
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
