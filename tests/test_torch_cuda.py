"""convgen.torch on CUDA tensors: the functional ops against torch's CUDA ops in strict float32 (TF32
off) and in float64, gradcheck at rank 4, opcheck, a non-default current stream, a second device,
CUDA graph capture of forward and backward, outputs from torch's caching allocator (not CuPy's pool),
non-contiguous inputs and autocast. Skipped without a GPU, CuPy or torch."""

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


def test_noncontiguous_input() -> None:
    for case in functional_tests.CASES[:8]:
        functional_tests.check(case, torch.float32, device="cuda", noncontiguous=True)


def test_gradcheck_rank_4() -> None:
    for name, function, leaves in library_tests.gradcheck_cases(4):
        on_gpu = tuple(leaf.detach().cuda().requires_grad_() for leaf in leaves)
        assert torch.autograd.gradcheck(function, on_gpu, fast_mode=True), name


@pytest.mark.parametrize("sample", library_tests.forward_samples("cuda") + library_tests.backward_samples("cuda"),
                         ids=library_tests._id)
def test_opcheck(sample) -> None:
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


def test_autocast_runs_in_float32() -> None:
    x = torch.randn(2, 3, 8, 8, device="cuda")
    w = torch.randn(4, 3, 3, 3, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half = torch.nn.functional.linear(x, torch.eye(8, device="cuda"))  # bfloat16 under autocast
        out = ct.conv(half, w, padding=1)
        pooled = ct.avg_pool(half, (2, 2))
    assert half.dtype == torch.bfloat16 and out.dtype == torch.float32 and pooled.dtype == torch.float32
    torch.testing.assert_close(out, F.conv2d(half.float(), w, padding=1), rtol=1e-4, atol=1e-4)
