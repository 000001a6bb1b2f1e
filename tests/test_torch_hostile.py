"""convgen.torch's functional ops on arguments drawn valid, off by a little or hostile, and on odd tensors (other
dtypes, layouts, devices and dimensions, views): each call returns a tensor of the input's dtype or raises TypeError,
ValueError or RuntimeError with a message that names the op ("convgen.torch.<op>: ..."), never another exception from
deeper down."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_validation import vectors

torch = pytest.importorskip("torch")

import convgen.torch as ct  # noqa: E402

_STRIDE, _DILATION = st.one_of(st.integers(1, 2), st.tuples(st.integers(1, 2), st.integers(1, 2))), st.integers(1, 2)
_PADDING = st.one_of(st.integers(0, 1), st.tuples(st.integers(0, 1), st.integers(0, 1)))
_KERNEL = st.one_of(st.integers(1, 3), st.tuples(st.integers(1, 3), st.integers(1, 3)))
# op -> its arguments after the tensors: the values the inputs below take (a pool's tuple kernel_size reads an input
# of 3 dimensions as one image, an int one as a batch: either may be refused), each also drawn as anything.
_ARGUMENTS = {
    "conv": {"stride": _STRIDE, "padding": _PADDING, "dilation": _DILATION, "groups": st.sampled_from([1, 2]),
             "padding_mode": st.sampled_from(["zeros", "circular"])},
    "conv_transpose": {"stride": _STRIDE, "padding": _PADDING, "output_padding": st.integers(0, 1),
                       "groups": st.sampled_from([1, 2]), "dilation": _DILATION},
    "max_pool": {"kernel_size": _KERNEL, "stride": st.one_of(st.none(), _STRIDE), "padding": _PADDING,
                 "dilation": _DILATION},
    "avg_pool": {"kernel_size": _KERNEL, "stride": st.one_of(st.none(), _STRIDE), "padding": _PADDING},
    "smooth_max_pool": {"kernel_size": _KERNEL, "beta": st.one_of(st.floats(-4, 4), st.floats()),
                        "stride": st.one_of(st.none(), _STRIDE), "padding": _PADDING, "dilation": _DILATION},
}


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(sorted(_ARGUMENTS)), data=st.data(), batched=st.booleans())
def test_no_argument_escapes_as_another_exception(op, data, batched):
    x = torch.arange(2 * 2 * 5 * 5, dtype=torch.float32).reshape(2, 2, 5, 5) / 9
    x = x if batched else x[0]
    tensors = (x, torch.full((2, 2, 2, 2), 0.25), torch.zeros(2)) if op.startswith("conv") else (x,)
    valid = data.draw(st.booleans(), label="valid")
    arguments = {name: data.draw(strategy if valid else st.one_of(strategy, vectors, st.just("reflect")), label=name)
                 for name, strategy in _ARGUMENTS[op].items()}
    try:
        output = getattr(ct, op)(*tensors, **arguments)
    except (TypeError, ValueError, RuntimeError) as error:
        assert str(error).startswith(f"convgen.torch.{op}: "), repr(error)
        return
    assert isinstance(output, torch.Tensor) and output.dtype == torch.float32


def _odd_tensors() -> dict:
    """Tensors an op may be handed, by name: other dtypes, layouts, devices and dimensions, views, empty ones."""
    x = torch.arange(2 * 2 * 5 * 5, dtype=torch.float32).reshape(2, 2, 5, 5) / 9
    return {"float32": x, "float64": x.double(), "bfloat16": x.bfloat16(), "int": x.int(), "bool": x > 1,
            "complex": x.to(torch.complex64), "sparse": x.to_sparse(), "meta": x.to("meta"), "0-dim": x[0, 0, 0, 0],
            "1-dim": x[0, 0, 0], "unbatched": x[0], "6-dim": x[None, None], "empty batch": x[:0],
            "no cells": x[:, :, :0], "expanded": x[:, :1].expand(2, 2, 5, 5), "transposed": x.transpose(2, 3),
            "channels-last": x.to(memory_format=torch.channels_last), "offset view": torch.arange(101.0)[1:].view(1, 4, 5, 5),
            "requires grad": x.clone().requires_grad_(), "nan": torch.full_like(x, float("nan")), "not a tensor": [[1.0]]}


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(sorted(_ARGUMENTS)), data=st.data())
def test_no_tensor_escapes_as_another_exception(op, data):
    """Odd tensors as the input, the weight and the bias, with valid arguments: a tensor of the input's dtype, or an
    error naming the op."""
    odd = _odd_tensors()
    names = st.sampled_from(sorted(odd))
    x = odd[data.draw(st.one_of(st.just("float32"), names), label="input")]
    if op.startswith("conv"):
        weight = torch.full((2, 2, 2, 2), 0.25).to(x.dtype if isinstance(x, torch.Tensor) and x.is_floating_point()
                                                      else torch.float32)
        bias = None
        if data.draw(st.booleans(), label="odd weight"):
            weight = odd[data.draw(names, label="weight")]
        if data.draw(st.booleans(), label="bias"):
            bias = odd[data.draw(names, label="bias")]
        tensors = (x, weight, bias)
    else:
        tensors = (x,)
    arguments = {name: data.draw(strategy, label=name) for name, strategy in _ARGUMENTS[op].items()}
    try:
        output = getattr(ct, op)(*tensors, **arguments)
    except (TypeError, ValueError, RuntimeError) as error:
        assert str(error).startswith(f"convgen.torch.{op}: "), repr(error)
        return
    assert isinstance(output, torch.Tensor) and output.dtype == x.dtype
