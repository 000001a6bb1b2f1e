"""convgen.torch.nn: the 40 layers against torch.nn at ranks 1..3 (constructor, parameters, extra_repr,
initialisation, forward and backward), shapes at ranks 4..8, the pinned error texts, state_dict and
torch.compile."""

import io

import pytest

torch = pytest.importorskip("torch")

from convgen.generated.ops import OPS  # noqa: E402
from convgen.torch import nn as cnn  # noqa: E402

FAMILIES = ("Conv", "ConvTranspose", "MaxPool", "AvgPool", "SmoothMaxPool")
OP_NAMES = dict(zip(FAMILIES, ("conv", "conv_transpose", "max_pool", "avg_pool", "smooth_max_pool")))


def per_rank(values, rank):
    """The first `rank` of a few distinct per-axis values, so that axes are not all alike."""
    return tuple(values[:rank])


def conv_cases(rank):
    """(args, kwargs) accepted alike by torch.nn.ConvNd and convgen's, covering each argument."""
    return [
        ((4, 6, 3), {}),
        ((4, 6, per_rank((3, 2, 1), rank)), {"stride": per_rank((2, 1, 3), rank), "padding": per_rank((1, 0, 2), rank)}),
        ((4, 6, 3), {"dilation": 2, "padding": 2, "groups": 2, "bias": False}),
        ((2, 4, 3), {"padding": 1, "padding_mode": "circular"}),
        ((2, 4, 3), {"padding": "same", "dilation": 2}),
        ((2, 4, 3), {"padding": "valid"}),
    ]


def conv_transpose_cases(rank):
    return [
        ((4, 6, 3), {}),
        ((4, 6, per_rank((3, 2, 4), rank)), {"stride": 2, "padding": 1, "output_padding": 1}),
        ((4, 6, 3), {"groups": 2, "dilation": 2, "bias": False, "output_padding": per_rank((1, 0, 1), rank),
                     "stride": 1}),
    ]


def pool_cases(family, rank):
    cases = [((2,), {}), ((per_rank((3, 2, 2), rank),), {"stride": 1, "padding": 1})]
    if family == "MaxPool":
        cases.append(((3,), {"stride": 2, "padding": 1, "dilation": 2}))
    return cases


def cases(family, rank):
    if family == "Conv":
        return conv_cases(rank)
    if family == "ConvTranspose":
        return conv_transpose_cases(rank)
    return pool_cases(family, rank)


TORCH_FAMILY_CASES = [(family, rank, args, kwargs) for family in FAMILIES[:4] for rank in (1, 2, 3)
                      for args, kwargs in cases(family, rank)]


def make_pair(family, rank, args, kwargs, dtype=torch.float64):
    """The same layer from torch.nn and from convgen, initialised from the same seed."""
    extra = {"dtype": dtype} if family.startswith("Conv") else {}
    torch.manual_seed(7)
    reference = getattr(torch.nn, f"{family}{rank}d")(*args, **kwargs, **extra)
    torch.manual_seed(7)
    layer = getattr(cnn, f"{family}{rank}d")(*args, **kwargs, **extra)
    return reference, layer


def test_the_forty_layers_are_made_with_their_rank():
    expected = sorted(f"{family}{rank}d" for family in FAMILIES for rank in range(1, 9))
    assert cnn.__all__ == expected
    for name in expected:
        layer_class = getattr(cnn, name)
        assert layer_class.__name__ == name and layer_class.__module__ == "convgen.torch.nn"
        assert layer_class.rank == int(name[-2])
        assert layer_class.op is OPS[OP_NAMES[name[:-2]]]
        assert issubclass(layer_class, torch.nn.Module)


@pytest.mark.parametrize("family, rank, args, kwargs", TORCH_FAMILY_CASES)
def test_layer_matches_torch_parameters_repr_and_init(family, rank, args, kwargs):
    reference, layer = make_pair(family, rank, args, kwargs)
    assert layer.extra_repr() == reference.extra_repr()
    assert repr(layer) == repr(reference)
    expected = dict(reference.named_parameters())
    actual = dict(layer.named_parameters())
    assert list(actual) == list(expected)
    for name, value in expected.items():
        assert actual[name].shape == value.shape
        assert actual[name].dtype == value.dtype
        assert torch.equal(actual[name], value), name


def test_reset_parameters_draws_again_like_torch():
    reference, layer = make_pair("ConvTranspose", 3, (4, 6, 3), {"groups": 2})
    torch.manual_seed(11)
    reference.reset_parameters()
    torch.manual_seed(11)
    layer.reset_parameters()
    assert torch.equal(layer.weight, reference.weight) and torch.equal(layer.bias, reference.bias)


def forward_input(family, rank, layer, batched):
    """A float64 input with a few cells per axis more than the largest kernel needs."""
    channels = getattr(layer, "in_channels", 3)
    shape = ((2,) if batched else ()) + (channels,) + per_rank((7, 6, 5), rank)
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("family, rank, args, kwargs", TORCH_FAMILY_CASES)
def test_forward_and_backward_match_torch(family, rank, args, kwargs, batched):
    reference, layer = make_pair(family, rank, args, kwargs)
    x = forward_input(family, rank, layer, batched)
    x_ref = x.clone().requires_grad_()
    x_ours = x.clone().requires_grad_()
    expected = reference(x_ref)
    actual = layer(x_ours)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(expected.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    expected.backward(upstream)
    actual.backward(upstream)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
    for (name, ours), (_, theirs) in zip(layer.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_conv_transpose_output_size_picks_the_output_padding_as_torch(rank):
    reference, layer = make_pair("ConvTranspose", rank, (2, 3, 3), {"stride": 3, "padding": 1})
    x = torch.randn((2, 2) + per_rank((4, 3, 2), rank), dtype=torch.float64)
    smallest = [(n - 1) * 3 - 2 + 3 for n in per_rank((4, 3, 2), rank)]
    for output_size in ([n + 2 for n in smallest], [2, 3] + smallest):
        expected = reference(x, output_size=output_size)
        torch.testing.assert_close(layer(x, output_size=output_size), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError) as caught:
        layer(x, output_size=[n + 3 for n in smallest])
    assert str(caught.value) == (
        f"ConvTranspose{rank}d: output_size must be between {tuple(smallest)} and {tuple(n + 2 for n in smallest)} "
        f"on the spatial axes for an input of {per_rank((4, 3, 2), rank)}, got {tuple(n + 3 for n in smallest)}")
    with pytest.raises(ValueError) as caught:
        layer(x, output_size=[5] * (rank + 1))
    assert str(caught.value) == f"ConvTranspose{rank}d: output_size must have {rank} or {rank + 2} elements, got {rank + 1}"


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_smooth_max_pool_is_the_log_sum_exp_over_windows_with_padded_zeros(rank):
    beta = 1.5
    layer = getattr(cnn, f"SmoothMaxPool{rank}d")(3, beta, stride=2, padding=1)
    assert layer.extra_repr() == "kernel_size=3, beta=1.5, stride=2, padding=1, dilation=1"
    x = torch.randn((2, 3) + per_rank((7, 6, 5), rank), dtype=torch.float64)
    padded = torch.nn.functional.pad(x, (1, 1) * rank)  # smooth max counts the padded zeros
    windows = padded
    for axis in range(2, 2 + rank):
        windows = windows.unfold(axis, 3, 2)
    expected = torch.logsumexp(beta * windows.flatten(2 + rank), dim=-1) / beta
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)


def expected_extent(n, k, s, p, d=1, transposed=False, output_padding=0):
    """torch.nn's documented output extent of one axis."""
    if transposed:
        return (n - 1) * s - 2 * p + d * (k - 1) + output_padding + 1
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


HIGH_RANK_CASES = [  # (family, args, kwargs, in_c, out_c, extent of one axis from 2 cells)
    ("Conv", (2, 4, 2), {"stride": 2, "padding": 1, "groups": 2}, 2, 4, dict(k=2, s=2, p=1)),
    ("Conv", (1, 1, 2), {"padding": 1, "padding_mode": "circular"}, 1, 1, dict(k=2, s=1, p=1)),
    ("ConvTranspose", (2, 2, 1), {"stride": 2, "output_padding": 1}, 2, 2,
     dict(k=1, s=2, p=0, transposed=True, output_padding=1)),
    ("MaxPool", (2,), {"stride": 1, "dilation": 2, "padding": 1}, 2, 2, dict(k=2, s=1, p=1, d=2)),
    ("AvgPool", (2,), {"padding": 1}, 2, 2, dict(k=2, s=2, p=1)),
    ("SmoothMaxPool", (2, 4.0), {"stride": 1}, 2, 2, dict(k=2, s=1, p=0)),
]


@pytest.mark.parametrize("rank", [4, 5, 6, 7, 8])
@pytest.mark.parametrize("family, args, kwargs, in_c, out_c, extent", HIGH_RANK_CASES,
                         ids=[case[0] + str(i) for i, case in enumerate(HIGH_RANK_CASES)])
def test_high_rank_layers_run_forward_and_backward(rank, family, args, kwargs, in_c, out_c, extent):
    layer = getattr(cnn, f"{family}{rank}d")(*args, **kwargs)
    x = torch.randn((1, in_c) + (2,) * rank, requires_grad=True)
    y = layer(x)
    assert y.shape == (1, out_c) + (expected_extent(2, **extent),) * rank
    assert y.dtype == torch.float32 and torch.isfinite(y).all()
    y.square().sum().backward()
    assert x.grad.shape == x.shape and torch.isfinite(x.grad).all()
    for name, parameter in layer.named_parameters():
        assert parameter.grad.shape == parameter.shape, name
    unbatched = layer(x.detach()[0])
    torch.testing.assert_close(unbatched, y.detach()[0])


@pytest.mark.parametrize("build, x_shape, message", [
    (lambda: cnn.Conv4d(8, 4, 3), (1, 8, 3, 3),
     "Conv4d: input must have 5 or 6 dimensions ([C, *S] or [N, C, *S] with 4 spatial axes), got 4"),
    (lambda: cnn.Conv1d(8, 4, 3), (1, 1, 8, 3, 3),
     "Conv1d: input must have 2 or 3 dimensions ([C, *S] or [N, C, *S] with 1 spatial axis), got 5"),
    (lambda: cnn.Conv4d(8, 4, 3), (2, 3, 5, 5, 5, 5), "Conv4d: input has 3 channels, expected in_channels=8"),
    (lambda: cnn.Conv4d(8, 4, 3), (3, 5, 5, 5, 5), "Conv4d: input has 3 channels, expected in_channels=8"),
    (lambda: cnn.ConvTranspose5d(2, 4, 3), (2, 4, 3, 3, 3, 3, 3),
     "ConvTranspose5d: input has 4 channels, expected in_channels=2"),
    (lambda: cnn.MaxPool4d(2), (2, 3, 4, 4, 4, 4, 4),
     "MaxPool4d: input must have 5 or 6 dimensions ([C, *S] or [N, C, *S] with 4 spatial axes), got 7"),
    (lambda: cnn.SmoothMaxPool8d(2, 1.0), (4, 4),
     "SmoothMaxPool8d: input must have 9 or 10 dimensions ([C, *S] or [N, C, *S] with 8 spatial axes), got 2"),
])
def test_wrong_input_names_the_layer_and_the_values(build, x_shape, message):
    with pytest.raises(ValueError) as caught:
        build()(torch.zeros(x_shape))
    assert str(caught.value) == message


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize(("layer", "make", "message"), [
    (lambda: cnn.Conv2d(2, 2, 3), lambda: torch.zeros(1, 2, 5, 5).to_sparse(),
     "Conv2d: input must be a dense tensor (torch.strided), got torch.sparse_coo"),
    (lambda: cnn.MaxPool2d(2), lambda: torch.nested.nested_tensor([torch.zeros(2, 5, 5), torch.zeros(2, 4, 4)]),
     "MaxPool2d: input must be a dense tensor (torch.strided), got a nested tensor"),
], ids=["sparse", "nested"])
def test_an_input_that_is_not_dense_names_the_layer_and_its_layout(layer, make, message):
    """Before the layer reads the input's shape (which a nested tensor does not have)."""
    with pytest.raises(TypeError) as caught:
        layer()(make())
    assert str(caught.value) == message



@pytest.mark.parametrize("build, error, message", [
    (lambda: cnn.Conv4d(6, 4, 3, groups=4), ValueError,
     "Conv4d: in_channels must be divisible by groups, got in_channels=6, groups=4"),
    (lambda: cnn.Conv4d(4, 6, 3, groups=4), ValueError,
     "Conv4d: out_channels must be divisible by groups, got out_channels=6, groups=4"),
    (lambda: cnn.Conv4d(4, 4, 3, groups=0), ValueError, "Conv4d: groups must be a positive integer, got 0"),
    (lambda: cnn.Conv4d(0, 4, 3), ValueError, "Conv4d: in_channels must be a positive integer, got 0"),
    (lambda: cnn.Conv4d(4, 4, (3, 3)), TypeError,
     "Conv4d: kernel_size must be an int or a tuple of 4 ints, got (3, 3)"),
    (lambda: cnn.Conv4d(4, 4, 3, padding_mode="reflect"), ValueError,
     "Conv4d: padding_mode must be 'zeros' or 'circular', got 'reflect'"),
    (lambda: cnn.Conv4d(4, 4, 3, padding="full"), ValueError,
     "Conv4d: padding must be 'valid', 'same', an int or a tuple, got 'full'"),
    (lambda: cnn.Conv4d(4, 4, 3, stride=2, padding="same"), ValueError,
     "Conv4d: padding='same' needs stride 1 on every axis, got stride=(2, 2, 2, 2)"),
    (lambda: cnn.Conv4d(4, 4, (3, 2, 3, 3), padding="same"), ValueError,
     "Conv4d: padding='same' needs an even dilation*(kernel_size-1) on every axis, got (2, 1, 2, 2)"),
    (lambda: cnn.ConvTranspose4d(4, 4, 3, padding_mode="circular"), ValueError,
     "ConvTranspose4d: padding_mode must be 'zeros', got 'circular'"),
    (lambda: cnn.ConvTranspose4d(4, 4, 3, padding="same"), TypeError,
     "ConvTranspose4d: padding must be an int or a tuple of 4 ints, got 'same'"),
    (lambda: cnn.MaxPool4d(2, ceil_mode=True), ValueError, "MaxPool4d: ceil_mode=True is not supported, only False"),
    (lambda: cnn.MaxPool6d(2, return_indices=True), ValueError,
     "MaxPool6d: return_indices=True is not supported, only False"),
    (lambda: cnn.AvgPool4d(2, count_include_pad=False), ValueError,
     "AvgPool4d: count_include_pad=False is not supported, only True"),
    (lambda: cnn.AvgPool4d(2, divisor_override=3), ValueError,
     "AvgPool4d: divisor_override=3 is not supported, only None"),
    (lambda: cnn.AvgPool5d(2, stride=(1, 2)), TypeError,
     "AvgPool5d: stride must be an int or a tuple of 5 ints, got (1, 2)"),
    (lambda: cnn.SmoothMaxPool4d(2.5, 1.0), TypeError,
     "SmoothMaxPool4d: kernel_size must be an int or a tuple of 4 ints, got 2.5"),
    (lambda: cnn.Conv2d(3, 4, -1), ValueError, "Conv2d: kernel_size must be at least 1 on every axis, got -1"),
    (lambda: cnn.Conv3d(3, 4, 3, stride=(1, 0, 1)), ValueError,
     "Conv3d: stride must be at least 1 on every axis, got (1, 0, 1)"),
    (lambda: cnn.ConvTranspose2d(3, 4, 3, padding=(1, -1)), ValueError,
     "ConvTranspose2d: padding must be at least 0 on every axis, got (1, -1)"),
    (lambda: cnn.Conv2d(3, 4, 3, dilation=0), ValueError, "Conv2d: dilation must be at least 1 on every axis, got 0"),
    (lambda: cnn.MaxPool2d(2, stride=0), ValueError, "MaxPool2d: stride must be at least 1 on every axis, got 0"),
    (lambda: cnn.Conv2d(3, 4, True), TypeError, "Conv2d: kernel_size must be an int or a tuple of 2 ints, got True"),
])
def test_wrong_arguments_name_the_layer_and_the_values(build, error, message):
    with pytest.raises(error) as caught:
        build()
    assert str(caught.value) == message


@pytest.mark.parametrize(("build", "error", "expected"), [
    (lambda: cnn.Conv4d(2**40, 2, 3), RuntimeError,
     "Conv4d: cannot make a weight of shape (2, 1099511627776, 3, 3, 3, 3): "),
    (lambda: cnn.ConvTranspose2d(2, 4, 2**31), RuntimeError,
     "ConvTranspose2d: cannot make a weight of shape (2, 4, 2147483648, 2147483648): "),
    (lambda: cnn.Conv1d(2**70, 2, 3), TypeError, "Conv1d: cannot make a weight of shape (2, 1180591620717411303424, 3): "),
    (lambda: cnn.Conv2d(2, 2, 3, dtype="float32"), TypeError, "Conv2d: cannot make a weight of shape (2, 2, 3, 3): "),
    (lambda: cnn.Conv2d(2, 2, 3, dtype=torch.int32), RuntimeError,
     "Conv2d: cannot make a weight of shape (2, 2, 3, 3): "),
], ids=["out of memory", "too many elements", "past int64", "dtype a string", "integer dtype"])
def test_a_weight_torch_cannot_make_names_the_layer_and_the_shape(build, error, expected):
    """A weight past the memory or past what a tensor can hold, or of a dtype or device torch refuses: torch's error,
    after the layer's name and the weight's shape (torch's own text varies by allocator and device, so only what
    comes before it is pinned)."""
    with pytest.raises(error) as caught:
        build()
    assert str(caught.value).startswith(expected) and len(str(caught.value)) > len(expected)



@pytest.mark.parametrize("call, error, message", [
    (lambda: cnn.Conv2d(3, 4, 3)([[1.0]]), TypeError, "Conv2d: input must be a torch.Tensor, got list"),
    (lambda: cnn.MaxPool3d(2)(None), TypeError, "MaxPool3d: input must be a torch.Tensor, got NoneType"),
    (lambda: cnn.ConvTranspose2d(3, 4, 3, stride=2)(torch.zeros(1, 3, 4, 4), output_size=[9.0, 9]), TypeError,
     "ConvTranspose2d: output_size must be a list or tuple of ints, got [9.0, 9]"),
    (lambda: cnn.ConvTranspose2d(3, 4, 3, stride=2)(torch.zeros(1, 3, 4, 4), output_size="99"), TypeError,
     "ConvTranspose2d: output_size must be a list or tuple of ints, got '99'"),
    (lambda: cnn.Conv2d(3, 4, 3).half()(torch.zeros(1, 3, 5, 5)), TypeError,
     "convgen.torch.conv: weight dtype torch.float16 does not match input dtype torch.float32"),
    (lambda: cnn.MaxPool2d(2)(torch.zeros(1, 3, 4, 4, dtype=torch.int32)), TypeError,
     "convgen.torch.max_pool: input dtype must be torch.float32, torch.float64, torch.float16 or torch.bfloat16, "
     "got torch.int32"),
])
def test_wrong_calls_name_the_layer_and_the_values(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert str(caught.value) == message


def test_numpy_integer_arguments_build_the_layer_torch_builds():
    np = pytest.importorskip("numpy")
    torch.manual_seed(3)
    ours = cnn.ConvTranspose2d(np.int64(4), np.int64(6), np.int64(3), stride=(np.int64(2), 1), groups=np.int64(2))
    theirs = torch.nn.ConvTranspose2d(4, 6, 3, stride=(2, 1), groups=2)
    theirs.load_state_dict(ours.state_dict())
    assert repr(ours) == repr(theirs)
    x = torch.randn(2, 4, 5, 4)
    torch.testing.assert_close(ours(x, output_size=[np.int64(12), 6]), theirs(x, output_size=[12, 6]))


def test_state_dict_and_whole_module_round_trip():
    torch.manual_seed(1)
    model = torch.nn.Sequential(cnn.Conv4d(2, 3, 3, padding=1), cnn.MaxPool4d(2), cnn.ConvTranspose4d(3, 2, 2, stride=2))
    torch.manual_seed(2)
    fresh = torch.nn.Sequential(cnn.Conv4d(2, 3, 3, padding=1), cnn.MaxPool4d(2), cnn.ConvTranspose4d(3, 2, 2, stride=2))
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert not torch.equal(fresh[0].weight, model[0].weight)
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(1, 2, 4, 4, 4, 4)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save(model, buffer)  # pickles the generated classes by their module and name
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded[0]) is cnn.Conv4d
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


class SmallNet4d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_in = cnn.Conv4d(2, 3, 3, padding=1)
        self.pool = cnn.MaxPool4d(2)
        self.conv_out = cnn.Conv4d(3, 2, 2, padding_mode="circular", padding=1)

    def forward(self, x):
        return self.conv_out(self.pool(torch.relu(self.conv_in(x))))


def test_torch_compile_fullgraph_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    model = SmallNet4d()
    x = torch.randn(2, 2, 4, 4, 4, 4)
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for run in (model, compiled):
        model.zero_grad()
        x_run = x.clone().requires_grad_()
        y = run(x_run)
        (y * torch.arange(y.numel()).reshape(y.shape).cos()).sum().backward()
        results.append((y.detach(), x_run.grad, [p.grad.clone() for p in model.parameters()]))
    (eager_y, eager_dx, eager_grads), (compiled_y, compiled_dx, compiled_grads) = results
    assert eager_y.shape == (2, 2) + (expected_extent(2, k=2, s=1, p=1),) * 4
    torch.testing.assert_close(compiled_y, eager_y)
    torch.testing.assert_close(compiled_dx, eager_dx)
    for compiled_grad, eager_grad in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(compiled_grad, eager_grad)


def test_torch_compile_fullgraph_under_autocast_matches_eager():
    """Under CPU autocast the compiled graph casts the convolutions to bfloat16 as eager does: the same
    bfloat16 output and the same float32 parameter gradients."""
    torch.manual_seed(0)
    model = SmallNet4d()
    x = torch.randn(2, 2, 4, 4, 4, 4)
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for run in (model, compiled):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = run(x)
        y.float().sum().backward()
        results.append((y.detach(), [p.grad.clone() for p in model.parameters()]))
    (eager_y, eager_grads), (compiled_y, compiled_grads) = results
    assert eager_y.dtype == compiled_y.dtype == torch.bfloat16
    assert all(g.dtype == torch.float32 for g in compiled_grads)
    torch.testing.assert_close(compiled_y, eager_y, rtol=0, atol=0)
    for compiled_grad, eager_grad in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=0, atol=0)
