"""convgen.torch's functional ops against torch.nn.functional at ranks 1..3, float32 and float64, with
batch, groups, dilation, stride, zero and circular padding, output padding and unbatched inputs: the
outputs and the gradients of (output · r).sum() for a random r. Smooth max has no torch op: its oracle
is logsumexp over windows built with F.pad and unfold. float16 and bfloat16 against torch's float64 on
the same values, within issue 11's bound; autocast; the adapter's error texts.

`check`, `check_half` and CASES serve tests/test_torch_cuda.py too, on CUDA tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from precision_bounds import HALF_BOUND

torch = pytest.importorskip("torch")

import convgen.torch as ct  # noqa: E402
import torch.nn.functional as F  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One functional call: `op`, the input shape and the op's keyword arguments (a conv's weight shape
    under 'weight', its bias under 'bias')."""

    op: str
    input: tuple[int, ...]
    kwargs: tuple[tuple[str, object], ...]

    @property
    def options(self) -> dict:
        return dict(self.kwargs)

    def __str__(self) -> str:
        return f"{self.op}{list(self.input)}{self.options}"


def _conv_cases(rank: int) -> list[Case]:
    spatial = (7, 6, 5)[:rank]
    return [
        Case("conv", (2, 4, *spatial), (("weight", (6, 4, *(3,) * rank)), ("bias", True), ("padding", 1))),
        Case("conv", (3, 4, *spatial), (("weight", (6, 2, *(2,) * rank)), ("bias", True), ("stride", 2),
                                        ("padding", 2), ("dilation", 2), ("groups", 2))),
        Case("conv", (2, 3, *spatial), (("weight", (2, 3, *(3,) * rank)), ("bias", False),
                                        ("padding", (1, 2, 3)[:rank]), ("padding_mode", "circular"))),
        Case("conv", (4, *spatial), (("weight", (2, 4, *(2,) * rank)), ("bias", True), ("stride", (2, 1, 1)[:rank]),
                                     ("dilation", (1, 2, 1)[:rank]))),
        Case("conv_transpose", (2, 4, *(4, 3, 3)[:rank]),
             (("weight", (4, 3, *(3,) * rank)), ("bias", True), ("stride", 2), ("padding", 1),
              ("output_padding", 1))),
        Case("conv_transpose", (2, 4, *(4, 3, 3)[:rank]),
             (("weight", (4, 2, *(2,) * rank)), ("bias", False), ("stride", (1, 2, 3)[:rank]), ("dilation", 2),
              ("groups", 2), ("output_padding", (0, 1, 1)[:rank]))),
        Case("conv_transpose", (3, *(4, 3, 3)[:rank]), (("weight", (3, 2, *(3,) * rank)), ("bias", True),
                                                        ("padding", 1))),
    ]


def _pool_cases(rank: int) -> list[Case]:
    spatial = (8, 7, 6)[:rank]
    kernel = (3, 2, 3)[:rank]
    return [
        Case("max_pool", (2, 3, *spatial), (("kernel_size", kernel), ("stride", 2), ("padding", 1))),
        Case("max_pool", (3, *spatial), (("kernel_size", (2,) * rank), ("stride", 1), ("dilation", 2),
                                         ("padding", 1))),
        Case("avg_pool", (2, 3, *spatial), (("kernel_size", kernel), ("padding", 1))),
        Case("avg_pool", (3, *spatial), (("kernel_size", (2,) * rank), ("stride", 1))),
        Case("smooth_max_pool", (2, 3, *spatial), (("kernel_size", kernel), ("beta", 2.0), ("stride", 2),
                                                   ("padding", 1))),
        Case("smooth_max_pool", (3, *spatial), (("kernel_size", (2,) * rank), ("beta", -1.5), ("stride", 1),
                                                ("dilation", 2))),
    ]


CASES = [case for rank in (1, 2, 3) for case in _conv_cases(rank) + _pool_cases(rank)]


def _per_axis(value, rank: int) -> tuple[int, ...]:
    return (value,) * rank if isinstance(value, int) else tuple(value)


def _smooth_max_reference(x, kernel_size, beta, stride=None, padding=0, dilation=1):
    """log Σ exp(β·v) / β over each window, padded zeros included, from torch ops (batched x)."""
    rank = len(kernel_size)
    stride = kernel_size if stride is None else _per_axis(stride, rank)
    padding, dilation = _per_axis(padding, rank), _per_axis(dilation, rank)
    x = F.pad(x, [p for p in reversed(padding) for _ in range(2)])
    for axis, (k, s, d) in enumerate(zip(kernel_size, stride, dilation)):
        span = d * (k - 1) + 1
        x = x.unfold(2 + axis, span, s)[..., ::d]
    return torch.logsumexp(beta * x.flatten(-rank), -1) / beta


def reference(case: Case, tensors: list):
    """torch's answer to `case` on `tensors` (input first, then weight and bias for convs)."""
    options = {k: v for k, v in case.options.items() if k not in ("weight", "bias")}
    x, *params = tensors
    if case.op in ("conv", "conv_transpose"):
        weight, bias = params[0], params[1] if len(params) > 1 else None
        rank = weight.dim() - 2
        if options.pop("padding_mode", "zeros") == "circular":
            padding = _per_axis(options.pop("padding"), rank)
            x = F.pad(x, [p for p in reversed(padding) for _ in range(2)], mode="circular")
        return getattr(F, f"{case.op}{rank}d")(x, weight, bias, **options)
    kernel = options["kernel_size"]
    unbatched = x.dim() == len(kernel) + 1
    x = x[None] if unbatched else x
    if case.op == "smooth_max_pool":
        out = _smooth_max_reference(x, **options)
    elif case.op == "avg_pool":
        out = getattr(F, f"avg_pool{len(kernel)}d")(x, **options)
    else:
        out = getattr(F, f"max_pool{len(kernel)}d")(x, **options)
    return out[0] if unbatched else out


def make_tensors(case: Case, dtype, device: str) -> list:
    """The input, and for convs the weight and (when the case has one) the bias, as leaves."""
    generator = torch.Generator().manual_seed(len(str(case)))
    shapes = [case.input]
    if "weight" in case.options:
        weight = case.options["weight"]
        out_channels = weight[0] if case.op == "conv" else weight[1] * case.options.get("groups", 1)
        shapes += [weight] + ([(out_channels,)] if case.options["bias"] else [])
    return [torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)
            .requires_grad_() for shape in shapes]


def call(case: Case, tensors: list):
    options = {k: v for k, v in case.options.items() if k not in ("weight", "bias")}
    x, *params = tensors
    if "weight" in case.options:
        return getattr(ct, case.op)(x, params[0], params[1] if len(params) > 1 else None, **options)
    return getattr(ct, case.op)(x, **options)


TOLERANCES = {torch.float32: {"rtol": 1e-4, "atol": 1e-4}, torch.float64: {"rtol": 1e-10, "atol": 1e-10}}


def check(case: Case, dtype, device: str = "cpu", noncontiguous: bool = False) -> None:
    """Output and gradients of convgen's op against torch's on `device` in `dtype`."""
    tensors = make_tensors(case, dtype, device)
    inputs = [t.transpose(0, -1).contiguous().transpose(0, -1) if noncontiguous else t for t in tensors]
    got = call(case, inputs)
    expected = reference(case, tensors)
    assert got.dtype == dtype and got.device == expected.device, case
    torch.testing.assert_close(got, expected, **TOLERANCES[dtype], msg=lambda m: f"{case}: output: {m}")
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    weights = weights.to(dtype=dtype, device=device)
    got_grads = torch.autograd.grad((got * weights).sum(), tensors)
    expected_grads = torch.autograd.grad((expected * weights).sum(), tensors)
    for index, (g, e) in enumerate(zip(got_grads, expected_grads)):
        torch.testing.assert_close(g, e, **TOLERANCES[dtype], msg=lambda m, i=index: f"{case}: grad {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_against_torch(case: Case, dtype) -> None:
    check(case, dtype)


HALF_DTYPES = [torch.float16, torch.bfloat16]


def _relative_error(got, expected) -> float:
    """‖got − expected‖ / ‖expected‖ in float64 (0 when both are zero)."""
    scale = torch.linalg.vector_norm(expected).item()
    error = torch.linalg.vector_norm(got.double() - expected).item()
    return error / scale if scale else error


def check_half(case: Case, dtype, device: str = "cpu") -> None:
    """A 16-bit call: output and gradients in `dtype`, each within HALF_BOUND (norm-relative) of torch's
    float64 answer on the same 16-bit values."""
    tensors = make_tensors(case, dtype, device)
    wide = [t.detach().double().requires_grad_() for t in tensors]
    got = call(case, tensors)
    expected = reference(case, wide)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    weights = weights.to(dtype=dtype, device=device)
    got_grads = torch.autograd.grad((got * weights).sum(), tensors)
    expected_grads = torch.autograd.grad((expected * weights.double()).sum(), wide)
    names = ("output", *(f"grad {i}" for i in range(len(tensors))))
    for name, g, e in zip(names, (got, *got_grads), (expected, *expected_grads), strict=True):
        assert g.dtype == dtype and g.device == e.device, f"{case}: {name}: {g.dtype} on {g.device}"
        error = _relative_error(g, e)
        assert error <= HALF_BOUND, f"{case}: {name}: relative error {error:.3g}"


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_16_bit_against_torch_in_float64(case: Case, dtype) -> None:
    check_half(case, dtype)


def test_noncontiguous_input() -> None:
    check(_conv_cases(2)[1], torch.float64, noncontiguous=True)
    check(_pool_cases(2)[0], torch.float64, noncontiguous=True)


def test_int_kernel_size_reads_the_input_as_batched() -> None:
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    torch.testing.assert_close(ct.max_pool(x, 2), F.max_pool2d(x, 2))
    torch.testing.assert_close(ct.avg_pool(x, 3, stride=1, padding=1), F.avg_pool2d(x, 3, 1, 1))


def test_autocast_casts_the_convolutions_as_torch_casts_its_own() -> None:
    """Under autocast a convolution's float32 tensors run in the autocast dtype and give it, float64 ones
    stay; pools run in their input's dtype: torch's own ops give the same dtypes."""
    x, weight, bias = torch.randn(2, 3, 6, 5), torch.randn(4, 3, 3, 3), torch.randn(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = ct.conv(x, weight, bias, padding=1), F.conv2d(x, weight, bias, padding=1)
        pooled, expected_pooled = ct.max_pool(x, (2, 2)), F.max_pool2d(x, 2)
        wide = ct.conv(x.double(), weight.double(), padding=1)
        expected_wide = F.conv2d(x.double(), weight.double(), padding=1)
    assert (out.dtype, pooled.dtype, wide.dtype) == (expected.dtype, expected_pooled.dtype, expected_wide.dtype)
    assert (out.dtype, pooled.dtype, wide.dtype) == (torch.bfloat16, torch.float32, torch.float64)
    rounded = [t.bfloat16().double() for t in (x, weight, bias)]
    assert _relative_error(out, F.conv2d(*rounded, padding=1)) <= HALF_BOUND


def test_empty_batch_gives_empty_output_and_zero_gradients() -> None:
    x = torch.randn(0, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    out = ct.conv(x, weight)
    assert out.shape == (0, 2, 3, 3)
    out.sum().backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))


def test_numpy_integers_are_taken_as_torch_takes_them() -> None:
    x = torch.randn(2, 4, 7, 6, dtype=torch.float64)
    weight = torch.randn(4, 3, 3, 2, dtype=torch.float64)
    # groups reads the output channels off a transposed weight: a NumPy groups once read 3 of them, not 6.
    torch.testing.assert_close(ct.conv_transpose(x, weight, groups=np.int64(2), stride=np.int64(2)),
                               F.conv_transpose2d(x, weight, groups=2, stride=2))
    torch.testing.assert_close(ct.conv(x, weight.transpose(0, 1).reshape(6, 2, 3, 2), groups=np.int32(2),
                                       stride=np.int64(2), padding=[np.int64(1), 0]),
                               F.conv2d(x, weight.transpose(0, 1).reshape(6, 2, 3, 2), groups=2, stride=2,
                                        padding=(1, 0)))
    torch.testing.assert_close(ct.max_pool(x, np.int64(2)), F.max_pool2d(x, 2))


def test_meta_tensors_give_shapes_as_torch_ops_do() -> None:
    x = torch.empty(2, 3, 9, 8, device="meta", requires_grad=True)
    weight = torch.empty(4, 3, 3, 3, device="meta", requires_grad=True)
    hidden = ct.conv_transpose(ct.conv(x, weight, stride=2), weight, stride=2, output_padding=1)
    y = ct.smooth_max_pool(ct.avg_pool(ct.max_pool(hidden, 2, stride=1), 2), (2, 2), beta=2.0)
    expected = F.avg_pool2d(F.max_pool2d(hidden, 2, stride=1), 2)
    assert y.is_meta and y.shape == F.max_pool2d(expected, 2).shape
    y.sum().backward()
    assert x.grad.shape == x.shape and weight.grad.shape == weight.shape


X = torch.zeros(2, 4, 6, 6)
W = torch.zeros(6, 4, 3, 3)

ERRORS = [
    (lambda: ct.conv(X, W, stride=0), ValueError, "convgen.torch.conv: stride must be > 0"),
    (lambda: ct.conv(X, W, padding=(1, 2, 3)), TypeError,
     "convgen.torch.conv: padding must be an int or a tuple of 2 ints, got (1, 2, 3)"),
    (lambda: ct.conv(X, W, stride=2.0), TypeError,
     "convgen.torch.conv: stride must be an int or a tuple of 2 ints, got 2.0"),
    (lambda: ct.conv(X, W, padding="full"), ValueError,
     "convgen.torch.conv: padding must be 'valid', 'same', an int or a tuple, got 'full'"),
    (lambda: ct.conv(X, W, padding="same", stride=(1, 2)), ValueError,
     "convgen.torch.conv: padding='same' needs stride 1 on every axis, got stride=(1, 2)"),
    (lambda: ct.conv(X, W[..., :2], padding="same"), ValueError,
     "convgen.torch.conv: padding='same' needs an even dilation*(kernel_size-1) on every axis, got (2, 1)"),
    (lambda: ct.conv_transpose(X, W.transpose(0, 1), padding="same"), TypeError,
     "convgen.torch.conv_transpose: padding must be an int or a tuple of 2 ints, got 'same'"),
    (lambda: ct.conv_transpose(X, W.transpose(0, 1), output_padding=[1, 1, 1]), TypeError,
     "convgen.torch.conv_transpose: output_padding must be an int or a tuple of 2 ints, got [1, 1, 1]"),
    (lambda: ct.conv(X, W, groups=3), ValueError,
     "convgen.torch.conv: in_c and out_c must be divisible by groups, got in_c=4, out_c=6, groups=3"),
    (lambda: ct.conv(X, W, padding=7, padding_mode="circular"), ValueError,
     "convgen.torch.conv: circular padding must not exceed the input extent, got padding[0]=7, in_spatial[0]=6"),
    (lambda: ct.conv(X, W, padding_mode="reflect"), ValueError,
     "convgen.torch.conv: padding_mode must be 'zeros' or 'circular', got 'reflect'"),
    (lambda: ct.conv(X, W[:, :2]), ValueError,
     "convgen.torch.conv: weight shape (6, 2, 3, 3) does not fit an input of 4 channels with groups=1: "
     "expected (6, 4, 3, 3) ([out_channels, in_channels / groups, *kernel])"),
    (lambda: ct.conv(X, W[0, 0]), ValueError,
     "convgen.torch.conv: weight must have at least 3 dimensions (channels, channels, *kernel), got 2"),
    (lambda: ct.conv(X[0, 0], W), ValueError,
     "convgen.torch.conv: input must have 3 (unbatched) or 4 (batched) dimensions for a weight of 4 dimensions, got 2"),
    (lambda: ct.conv(X, W.double()), TypeError,
     "convgen.torch.conv: weight dtype torch.float64 does not match input dtype torch.float32"),
    (lambda: ct.conv(X.half(), W), TypeError,
     "convgen.torch.conv: weight dtype torch.float32 does not match input dtype torch.float16"),
    (lambda: ct.conv(X.long(), W), TypeError,
     "convgen.torch.conv: input dtype must be torch.float32, torch.float64, torch.float16 or torch.bfloat16, "
     "got torch.int64"),
    (lambda: ct.conv([[1.0]], W), TypeError, "convgen.torch.conv: input must be a torch.Tensor, got list"),
    (lambda: ct.conv_transpose(None, W), TypeError,
     "convgen.torch.conv_transpose: input must be a torch.Tensor, got NoneType"),
    (lambda: ct.max_pool(X.numpy(), 2), TypeError, "convgen.torch.max_pool: input must be a torch.Tensor, got ndarray"),
    (lambda: ct.smooth_max_pool(X, 2, beta=1.0, stride=(1, 1, 1)), TypeError,
     "convgen.torch.smooth_max_pool: stride must be an int or a tuple of 2 ints, got (1, 1, 1)"),
    (lambda: ct.conv(X, W, torch.zeros(5)), ValueError, "convgen.torch.conv: bias must have shape (6,), got (5,)"),
    (lambda: ct.conv(X, W, torch.zeros(6, device="meta")), RuntimeError,
     "convgen.torch.conv: bias is on meta but input is on cpu"),
    (lambda: ct.conv(X, [[1.0]]), TypeError, "convgen.torch.conv: weight must be a torch.Tensor, got list"),
    (lambda: ct.conv(X, None), TypeError, "convgen.torch.conv: weight must be a torch.Tensor, got NoneType"),
    (lambda: ct.conv_transpose(X, None, torch.zeros(6)), TypeError,
     "convgen.torch.conv_transpose: weight must be a torch.Tensor, got NoneType"),
    (lambda: ct.conv(X.to_sparse(), W), TypeError,
     "convgen.torch.conv: input must be a dense tensor (torch.strided), got torch.sparse_coo"),
    (lambda: ct.conv(X, W.to_sparse_csr(dense_dim=2)), TypeError,
     "convgen.torch.conv: weight must be a dense tensor (torch.strided), got torch.sparse_csr"),
    (lambda: ct.conv(X, W, torch.zeros(6).to_sparse()), TypeError,
     "convgen.torch.conv: bias must be a dense tensor (torch.strided), got torch.sparse_coo"),
    (lambda: ct.max_pool(torch.nested.nested_tensor([X[0], X[0, :, :5]], layout=torch.jagged), 2), TypeError,
     "convgen.torch.max_pool: input must be a dense tensor (torch.strided), got a nested tensor"),
    (lambda: ct.conv_transpose(X, W, output_padding=1), ValueError,
     "convgen.torch.conv_transpose: output_padding[0] must be smaller than stride[0] or dilation[0], "
     "got output_padding[0]=1, stride[0]=1, dilation[0]=1"),
    (lambda: ct.conv_transpose(X, W), ValueError,
     "convgen.torch.conv_transpose: weight shape (6, 4, 3, 3) does not fit an input of 4 channels with groups=1: "
     "expected (4, 4, 3, 3) ([in_channels, out_channels / groups, *kernel])"),
    (lambda: ct.max_pool(X, (2, 2), dilation=0), ValueError, "convgen.torch.max_pool: dilation[0] must be nonzero"),
    (lambda: ct.max_pool(X, (2, 2, 2, 2)), ValueError,
     "convgen.torch.max_pool: input must have 5 (unbatched) or 6 (batched) dimensions for a kernel_size of 4 axes, "
     "got 4"),
    (lambda: ct.max_pool(X[0, 0], 2), ValueError,
     "convgen.torch.max_pool: an int kernel_size reads the input as batched [N, C, *S], which needs at least 3 "
     "dimensions, got 2; pass a tuple kernel_size for an unbatched input"),
    (lambda: ct.avg_pool(X, 2.5), TypeError,
     "convgen.torch.avg_pool: kernel_size must be an int or a tuple of ints, got 2.5"),
    (lambda: ct.avg_pool(X, (2, 2), stride=(1.5, 1)), ValueError,
     "convgen.torch.avg_pool: stride[0] must be a natural number, got 1.5"),
    (lambda: ct.smooth_max_pool(X, 2, beta=0.0), ValueError,
     "convgen.torch.smooth_max_pool: beta must be finite and nonzero"),
    (lambda: ct.conv(torch.zeros(1, 1, 2**32, 1, device="meta"), torch.zeros(1, 1, 1, 1, device="meta")), ValueError,
     "convgen.torch.conv: dimension does not fit in UInt32"),
    (lambda: ct.conv(torch.zeros(2**32, 1, device="meta"), torch.zeros(1, 2**32, 1, device="meta")), ValueError,
     "convgen.torch.conv: tensor too large (numel does not fit in UInt32) (torch: conv: in_c=4294967296 does not fit "
     "in UInt32)"),
]


@pytest.mark.parametrize(("call_op", "error", "text"), ERRORS, ids=[text for _, _, text in ERRORS])
def test_error_texts(call_op, error, text) -> None:
    with pytest.raises(error) as raised:
        call_op()
    assert str(raised.value) == text


@pytest.mark.parametrize("requires_grad", [True, False])
def test_an_op_records_a_backward_only_where_autograd_needs_one(requires_grad: bool) -> None:
    """Eager calls go through the autograd.Function when some input requires grad and grad mode is on;
    otherwise straight to the device code, with the same values and no graph."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 6, 6, generator=generator, requires_grad=requires_grad)
    weight = torch.randn(4, 3, 3, 3, generator=generator)
    recorded = ct.conv(x, weight, None, padding=1)
    with torch.no_grad():
        unrecorded = ct.conv(x, weight, None, padding=1)
    assert (recorded.grad_fn is not None) == requires_grad
    assert unrecorded.grad_fn is None and not unrecorded.requires_grad
    assert torch.equal(recorded.detach(), unrecorded)
    assert ct.max_pool(x, 2).requires_grad == requires_grad


@pytest.mark.parametrize("op", ["conv", "conv_transpose"])
def test_a_remembered_geometry_does_not_answer_for_a_float_or_bool_argument(op: str) -> None:
    """Repeated convolution calls reuse their validated geometry (functional._memo_key, and the validator's answer),
    but 1.0 and True, which hash like 1, are still rejected by name after a call with 1 was remembered."""
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    call = getattr(ct, op)
    expected = call(x, w, None, stride=1, groups=1)
    assert torch.equal(call(x, w, None, stride=1, groups=1), expected)
    with pytest.raises(TypeError, match=rf"^convgen\.torch\.{op}: stride must be an int or a tuple of 2 ints, "
                                        r"got 1\.0$"):
        call(x, w, None, stride=1.0)
    with pytest.raises(ValueError, match=rf"^convgen\.torch\.{op}: stride\[0\] must be a natural number, got 1\.0$"):
        call(x, w, None, stride=(1.0, 1))
    for groups in (True, 1.0):  # 1.0 passed after a call with groups=1 when floats keyed the validator's cache
        with pytest.raises(ValueError, match=rf"^convgen\.torch\.{op}: groups must be a natural number, "
                                             rf"got {groups}$"):
            call(x, w, None, stride=1, groups=groups)


@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_torch_func_transforms_are_refused_by_name(transform: str) -> None:
    """Under torch.func's transforms the tensors are wrappers without memory: refused before any device code."""
    x, w = torch.randn(3, 1, 2, 6, 6), torch.randn(4, 2, 3, 3)
    conv = lambda xi: ct.conv(xi, w, None, padding=1)  # noqa: E731
    expected = (r"^convgen\.torch\.conv: torch\.func transforms \(vmap, grad, jacrev, \.\.\.\) are not supported; "
                r"call the op outside them \(autograd and torch\.compile are\)$")
    with pytest.raises(RuntimeError, match=expected):
        if transform == "vmap":
            torch.func.vmap(conv)(x)
        else:
            torch.func.grad(lambda xi: conv(xi).sum())(x[0])
    with pytest.raises(RuntimeError, match=r"^convgen\.torch\.max_pool: torch\.func transforms"):
        torch.func.vmap(lambda xi: ct.max_pool(xi, 2))(x)


@pytest.mark.parametrize("op", ["conv", "max_pool", "smooth_max_pool"])
@pytest.mark.parametrize("loss", ["square", "sum"])
def test_gradients_taken_with_create_graph_are_not_differentiated_again(op: str, loss: str) -> None:
    """The backward's kernels are not themselves differentiable: under create_graph=True a backward through the
    gradients is an error naming the op, not a silent zero, where they depend on the upstream gradient (a squared
    output's) or on the op's inputs alone (a sum's: a conv's input gradient through its weight, a smooth max's
    through its input). A max pool's input gradient under a sum depends on nothing that requires grad (its derivative
    through the input is zero): it comes out as a constant. The first gradient is the one a plain backward gives."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(3, 2, 3, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    forward = {"conv": lambda: ct.conv(x, weight, None), "max_pool": lambda: ct.max_pool(x, 2),
               "smooth_max_pool": lambda: ct.smooth_max_pool(x, 2, 1.5)}[op]
    reduce = (lambda y: (y**2).sum()) if loss == "square" else (lambda y: y.sum())
    (plain,) = torch.autograd.grad(reduce(forward()), x)
    (first,) = torch.autograd.grad(reduce(forward()), x, create_graph=True)
    assert torch.equal(first.detach(), plain)
    if op == "max_pool" and loss == "sum":
        assert not first.requires_grad
        return
    with pytest.raises(RuntimeError, match=rf"^convgen\.torch\.{op}: a backward through its gradients is not "
                                           r"supported: they were computed under create_graph=True, but convgen does "
                                           r"not differentiate them \(a gradient penalty through this op needs "
                                           r"torch's own ops\)$"):
        first.square().sum().backward()


def test_a_one_entry_tuple_is_broadcast_to_every_axis_as_torch_does() -> None:
    """torch's convolutions and pools take `stride=(2,)` on a 2-D input as (2, 2); so does convgen.torch."""
    generator = torch.Generator().manual_seed(3)
    x, w = torch.randn(1, 2, 7, 7, generator=generator), torch.randn(3, 2, 3, 3, generator=generator)
    torch.testing.assert_close(ct.conv(x, w, stride=(2,), padding=[1], dilation=(1,)),
                               F.conv2d(x, w, stride=(2,), padding=[1], dilation=(1,)))
    torch.testing.assert_close(ct.max_pool(x, 3, stride=[2]), F.max_pool2d(x, 3, stride=[2]))


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_string_paddings_are_torchs(padding: str) -> None:
    """conv takes torch's 'same' and 'valid', with dilation too, at ranks 2 and 3 as F.conv2d and F.conv3d do."""
    generator = torch.Generator().manual_seed(8)
    x, w = torch.randn(2, 3, 9, 8, generator=generator), torch.randn(4, 3, 3, 5, generator=generator)
    torch.testing.assert_close(ct.conv(x, w, padding=padding, dilation=(2, 1)),
                               F.conv2d(x, w, padding=padding, dilation=(2, 1)))
    x, w = torch.randn(1, 2, 5, 6, 7, generator=generator), torch.randn(3, 2, 3, 1, 5, generator=generator)
    torch.testing.assert_close(ct.conv(x, w, padding=padding), F.conv3d(x, w, padding=padding))
