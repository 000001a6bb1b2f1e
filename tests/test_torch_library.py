"""The torch.library custom ops of convgen.torch: torch.library.opcheck over every forward and backward
op (schema, autograd registration, fakes against the real kernels, AOT dispatch), gradcheck in float64
at ranks 1..4 for the five functional ops, and torch.compile(fullgraph=True) of a small rank-4 network
matching eager forward and backward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import convgen.torch as ct  # noqa: E402
from convgen.torch import library  # noqa: E402

OPS = torch.ops.convgen


def _tensor(*shape, dtype=torch.float64, device="cpu", requires_grad=False, seed=0):
    generator = torch.Generator().manual_seed(seed + len(shape))
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device) \
        .requires_grad_(requires_grad)


def forward_samples(device: str = "cpu", dtype=torch.float64) -> list:
    """(op, args) of every forward op: ranks 1, 2 and 4, batched and unbatched, with groups, dilation,
    circular padding and output padding; the conv families in each precision."""
    t = lambda *shape, grad=True: _tensor(*shape, dtype=dtype, device=device, requires_grad=grad)  # noqa: E731
    return [
        (OPS.conv, (t(2, 4, 7), t(6, 2, 3), t(6), [2], [1], [2], 2, False, "highest")),
        (OPS.conv, (t(3, 5, 4), t(2, 3, 2, 2), None, [1, 1], [2, 1], [1, 1], 1, True, "high")),
        (OPS.conv, (t(1, 2, 3, 3, 3, 3), t(2, 2, 2, 2, 2, 2), t(2), [1, 1, 1, 1], [1, 0, 1, 0], [1] * 4, 1, False,
                    "medium")),
        (OPS.conv_transpose, (t(2, 4, 5), t(4, 3, 3), t(6), [2], [1], [1], [1], 2, "medium")),
        (OPS.conv_transpose, (t(1, 2, 2, 2, 2, 2), t(2, 3, 2, 2, 2, 2), None, [2, 1, 1, 1], [0] * 4, [1, 0, 0, 0],
                              [1] * 4, 1, "high")),
        (OPS.max_pool, (t(2, 3, 9), [3], [2], [1], [1])),
        (OPS.max_pool, (t(2, 3, 3, 3, 4), [2, 2, 2, 2], [1, 1, 1, 2], [1, 0, 0, 1], [1, 1, 1, 1])),
        (OPS.avg_pool, (t(3, 6, 5), [2, 3], [1, 2], [1, 1])),
        (OPS.avg_pool, (t(1, 2, 3, 3, 3, 4), [2, 2, 2, 2], [1, 1, 1, 2], [0, 1, 0, 1])),
        (OPS.smooth_max_pool, (t(2, 3, 9), [3], 2.0, [2], [1], [2])),
        (OPS.smooth_max_pool, (t(1, 2, 3, 3, 3, 4), [2, 2, 2, 2], -1.5, [1, 1, 1, 2], [0, 1, 0, 0], [1, 1, 1, 1])),
    ]


# The conv backward ops' output_masks (input, weight, bias), taken in turn: every gradient, and some left out.
OUTPUT_MASKS = ([True, True, True], [False, True, True], [True, False, False], [False, False, True],
                [True, True, False])


def backward_samples(device: str = "cpu", dtype=torch.float64) -> list:
    """(op, args) of every backward op, from the forward samples and their real outputs."""
    samples = []
    masks = iter(OUTPUT_MASKS)
    for op, args in forward_samples(device, dtype):
        plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        with torch.no_grad():
            outputs = op(*plain)
        y, *state = outputs if isinstance(outputs, tuple) else (outputs,)
        grad = _tensor(*y.shape, dtype=dtype, device=device, seed=3)
        name = op._qualified_op_name.split("::")[1]
        if name in ("conv", "conv_transpose"):
            samples.append((getattr(OPS, f"{name}_backward"), (grad, plain[0], plain[1], *plain[3:], next(masks))))
        else:
            parameters = plain[1:]
            samples.append((getattr(OPS, f"{name}_backward"), (grad, plain[0], *state, *parameters)))
    return samples


def _id(sample) -> str:
    op, args = sample
    shapes = "x".join(str(a.dim()) for a in args if isinstance(a, torch.Tensor))
    return f"{op._qualified_op_name}-{shapes}"


@pytest.mark.parametrize("sample", forward_samples() + backward_samples(), ids=_id)
def test_opcheck(sample) -> None:
    op, args = sample
    torch.library.opcheck(op, args)


HALF_SAMPLES = [sample for dtype in (torch.float16, torch.bfloat16)
                for sample in forward_samples(dtype=dtype) + backward_samples(dtype=dtype)]


@pytest.mark.parametrize("sample", HALF_SAMPLES, ids=lambda s: f"{_id(s)}-{s[1][0].dtype}")
def test_opcheck_16_bit(sample) -> None:
    """The fakes give 16-bit tensors the dtypes the real ops do (outputs in the input's, saved state as
    each device keeps it)."""
    op, args = sample
    torch.library.opcheck(op, args)


def test_every_op_is_checked() -> None:
    checked = {op._qualified_op_name for op, _ in forward_samples() + backward_samples()}
    assert checked == {op._qualname for op in library.FORWARD_OPS + library.BACKWARD_OPS}


def test_saved_state_dtypes_on_cpu() -> None:
    x = _tensor(1, 2, 5, 5)
    assert OPS.max_pool(x, [2, 2], [1, 1], [0, 0], [1, 1])[1].dtype == torch.int64
    assert [s.dtype for s in OPS.smooth_max_pool(x.float(), [2, 2], 1.0, [1, 1], [0, 0], [1, 1])[1:]] == \
        [torch.float64, torch.float64]


def gradcheck_cases(rank: int) -> list:
    """(name, function of leaves, leaves) of the five functional ops at `rank`, small enough for gradcheck."""
    spatial = (5, 4, 3, 3)[:rank]
    small = (3, 3, 2, 2)[:rank]
    x = _tensor(2, 2, *spatial, requires_grad=True)
    w = _tensor(4, 1, *(2,) * rank, requires_grad=True)
    b = _tensor(4, requires_grad=True)
    xt = _tensor(1, 2, *small, requires_grad=True)
    wt = _tensor(2, 2, *(2,) * rank, requires_grad=True)
    # Distinct values keep max pool's choices away from ties under gradcheck's perturbations.
    xm = (torch.randperm(2 * 2 * torch.Size(spatial).numel(), generator=torch.Generator().manual_seed(rank))
          .reshape(2, 2, *spatial).double() / 7).requires_grad_()
    return [
        ("conv", lambda x, w, b: ct.conv(x, w, b, stride=(2, 1, 1, 1)[:rank], padding=1, dilation=(1, 2, 1, 1)[:rank],
                                         groups=2), (x, w, b)),
        ("conv circular", lambda x, w: ct.conv(x, w, padding=1, groups=2, padding_mode="circular"), (x, w)),
        ("conv_transpose", lambda x, w, b: ct.conv_transpose(x, w, b, stride=2, padding=(1, 0, 0, 0)[:rank],
                                                             output_padding=1), (xt, wt, b[:2].detach()
                                                                                 .requires_grad_())),
        ("max_pool", lambda x: ct.max_pool(x, (2,) * rank, stride=1, padding=1), (xm,)),
        ("avg_pool", lambda x: ct.avg_pool(x, (2,) * rank, stride=(1, 2, 1, 2)[:rank], padding=1), (x,)),
        ("smooth_max_pool", lambda x: ct.smooth_max_pool(x, (2,) * rank, beta=1.5, stride=1, dilation=(2, 1, 1, 1)[:rank]),
         (x,)),
    ]


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_gradcheck(rank: int) -> None:
    for name, function, leaves in gradcheck_cases(rank):
        assert torch.autograd.gradcheck(function, leaves, fast_mode=rank == 4), f"{name} at rank {rank}"


def _network(x, w1, b1, w2):
    y = ct.conv(x, w1, b1, padding=1)
    y = ct.max_pool(torch.relu(y), (2, 2, 2, 2), stride=1)
    return ct.conv(y, w2, padding_mode="circular", padding=1).sum(dim=1)


def test_compile_fullgraph_matches_eager() -> None:
    torch._dynamo.reset()
    leaves = (_tensor(2, 2, 4, 4, 3, 3, requires_grad=True), _tensor(3, 2, 2, 2, 2, 2, requires_grad=True),
              _tensor(3, requires_grad=True), _tensor(2, 3, 3, 3, 3, 3, requires_grad=True))
    compiled = torch.compile(_network, fullgraph=True, backend="aot_eager")
    got, expected = compiled(*leaves), _network(*leaves)
    torch.testing.assert_close(got, expected)
    weights = _tensor(*expected.shape, seed=5)
    for g, e in zip(torch.autograd.grad((got * weights).sum(), leaves),
                    torch.autograd.grad((expected * weights).sum(), leaves)):
        torch.testing.assert_close(g, e)


def test_compile_inductor_forward_and_backward() -> None:
    torch._dynamo.reset()
    x, w = _tensor(1, 2, 3, 3, 3, 3, requires_grad=True), _tensor(2, 2, 2, 2, 2, 2, requires_grad=True)

    def step(x, w):
        return ct.avg_pool(ct.conv(x, w, padding=1), (2, 2, 2, 2)).square().sum()

    got = torch.autograd.grad(torch.compile(step, fullgraph=True)(x, w), (x, w))
    expected = torch.autograd.grad(step(x, w), (x, w))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_compile_dynamic_smooth_max_pool_matches_eager_over_batch_sizes() -> None:
    """Smooth max's beta is rounded to float32 by NumPy, which dynamo cannot trace: under compile the window is
    checked without it (a symbolic beta under dynamic=True included), and the op checks beta when it runs."""
    torch._dynamo.reset()

    def pool(x, beta):
        return ct.smooth_max_pool(ct.smooth_max_pool(x, (2, 2, 2, 2), beta=beta, stride=1), 2, beta=-1.5)

    compiled = torch.compile(pool, fullgraph=True, dynamic=True, backend="aot_eager")
    for batch, beta in ((1, 2.0), (3, 0.5), (2, 2.0)):
        x = _tensor(batch, 2, 4, 3, 3, 4, requires_grad=True, seed=batch)
        got, expected = compiled(x, beta), pool(x, beta)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(expected.sum(), x)[0])
    with pytest.raises(ValueError, match="^convgen.torch.smooth_max_pool: beta must be finite and nonzero$"):
        compiled(_tensor(2, 2, 4, 3, 3, 4), 0.0)


NEEDS = [(False, True, True), (True, False, False), (True, True, True)]  # input, weight, bias require grad
NEEDS_IDS = ["frozen-input", "frozen-weight-and-bias", "all"]


def check_only_wanted_gradients(monkeypatch, compiled: bool, needs: tuple[bool, bool, bool], device: str = "cpu",
                                padding_mode: str = "zeros") -> None:
    """needs: which of (input, weight, bias) require grad. devices.backward is asked for exactly those
    (its order: weight, bias, input), eagerly or under torch.compile, and they match torch's."""
    from convgen.torch import devices

    asked = []
    backward = devices.backward

    def recorded(op, geom, tensors, saved, grad, precision="highest", wanted=None):
        asked.append(tuple(wanted))
        return backward(op, geom, tensors, saved, grad, precision, wanted)

    monkeypatch.setattr(devices, "backward", recorded)
    torch._dynamo.reset()
    shapes = ((2, 4, 6, 5), (6, 2, 3, 3), (6,))
    leaves = [_tensor(*shape, device=device, requires_grad=need, seed=i)
              for i, (shape, need) in enumerate(zip(shapes, needs))]
    references = [leaf.detach().clone().requires_grad_(leaf.requires_grad) for leaf in leaves]

    def step(x, w, b):
        return ct.conv(x, w, b, padding=1, groups=2, padding_mode=padding_mode).square().sum()

    def reference_step(x, w, b):
        if padding_mode == "circular":
            x = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="circular")
        return torch.nn.functional.conv2d(x, w, b, padding=0 if padding_mode == "circular" else 1,
                                          groups=2).square().sum()

    (torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step)(*leaves).backward()
    reference_step(*references).backward()
    assert asked == [(needs[1], needs[2], needs[0])]
    for leaf, reference in zip(leaves, references):
        if reference.requires_grad:
            torch.testing.assert_close(leaf.grad, reference.grad)
        else:
            assert leaf.grad is None


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("needs", NEEDS, ids=NEEDS_IDS)
def test_backward_computes_only_the_gradients_autograd_reads(monkeypatch, compiled, needs) -> None:
    check_only_wanted_gradients(monkeypatch, compiled, needs)
