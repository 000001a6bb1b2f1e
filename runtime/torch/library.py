"""convgen's ops as torch.library custom ops in the `convgen` namespace, one per family at any rank, and
each family's backward as its own op, so `torch.compile(fullgraph=True)` traces forward and backward
without a graph break. Every op has a fake (shapes from SEMANTICS §2, dtypes as the real kernels give
them) and the forward ops an autograd formula that calls the backward op.

The conv families take the precision of their GEMMs as their last argument (convgen.torch.precision:
"highest", "high" or "medium"; float64 and devices without TF32 tensor cores run "highest"), so
torch.compile records the one chosen when it traced. The pools return their saved state as extra
outputs: `max_pool` (y, argmax offsets), `smooth_max_pool` (y, pivots, sums); the functional API returns
y alone. An input of rank+1 dimensions is one image [C, *S] (the geometry's batch None), rank+2 is a
batch [N, C, *S].

Also here: the validated geometry of a call (the generated validators, their messages turned into
ValueErrors naming the function), which functional.py checks with before it runs an op.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from convgen.checking import validated
from convgen.generated import validators
from convgen.geometry import Family, Geometry, axis_extent
from convgen.torch import devices
from convgen.torch.precision import check_precision

Tensor = torch.Tensor
_LABEL = "torch"  # the validators' `{device}` in `autograd: {device}: {op}: ...`


# Geometry.


def _geometry(op: str, check: Callable[..., Geometry | str], args: tuple[Any, ...]) -> Geometry:
    # Under torch.compile dynamo traces the validator itself (shapes are known while tracing).
    checked = check(*args) if torch.compiler.is_compiling() else validated(check, args)
    if type(checked) is str:
        prefix = f"autograd: {_LABEL}: {check.__name__}: "  # smooth max's window is checked by max pool's rules
        text = checked[len(prefix):] if checked.startswith(prefix) else checked.removeprefix("autograd: ")
        raise ValueError(f"convgen.torch.{op}: {text}")
    return checked


def _batch(shape: Sequence[int], rank: int) -> tuple[int | None, int]:
    """(batch, index of the channel axis) of an input [N, C, *S] or [C, *S] of a rank-`rank` op."""
    return (shape[0], 1) if len(shape) == rank + 2 else (None, 0)


def conv_geometry(op: str, input: Sequence[int], weight: Sequence[int], stride: Any, padding: Any, dilation: Any,
                  groups: Any, padding_mode: Any) -> Geometry:
    """A conv's geometry from the shapes of its input and weight; ValueError when invalid or when the
    weight is not [out_c, in_c / groups, *K] for the input's channels."""
    batch, channel = _batch(input, len(weight) - 2)
    args = (_LABEL, input[channel], weight[0], tuple(weight[2:]), stride, padding, tuple(input[channel + 1:]), batch,
            dilation, groups, padding_mode)
    geom = _geometry(op, validators.conv, args)
    _check_weight(op, weight, geom)
    return geom


def conv_transpose_geometry(op: str, input: Sequence[int], weight: Sequence[int], stride: Any, padding: Any,
                            output_padding: Any, dilation: Any, groups: Any) -> Geometry:
    """A transposed conv's geometry; its weight is [in_c, out_c / groups, *K]."""
    batch, channel = _batch(input, len(weight) - 2)
    out_c = weight[1] * groups if type(groups) is int else weight[1]  # a bad groups: the validator says so
    args = (_LABEL, input[channel], out_c, tuple(weight[2:]), stride, padding, tuple(input[channel + 1:]), batch,
            dilation, groups, output_padding)
    geom = _geometry(op, validators.conv_transpose, args)
    _check_weight(op, weight, geom)
    return geom


def _check_weight(op: str, weight: Sequence[int], geom: Geometry) -> None:
    if tuple(weight) != geom.kernel_shape:
        layout = "in_channels, out_channels / groups" if geom.family is Family.CONV_TRANSPOSE else \
            "out_channels, in_channels / groups"
        raise ValueError(f"convgen.torch.{op}: weight shape {tuple(weight)} does not fit an input of {geom.in_c} "
                         f"channels with groups={geom.groups}: expected {geom.kernel_shape} ([{layout}, *kernel])")


def pool_geometry(op: str, family: Family, input: Sequence[int], kernel_size: Any, stride: Any, padding: Any,
                  dilation: Any, beta: Any = None) -> Geometry:
    """A pool's geometry; the input has len(kernel_size) + 1 or + 2 dimensions (checked by the caller)."""
    batch, channel = _batch(input, len(kernel_size))
    args = (_LABEL, input[channel], tuple(input[channel + 1:]), kernel_size, stride, padding, batch, dilation)
    check = {Family.MAX_POOL: validators.max_pool, Family.AVG_POOL: validators.avg_pool,
             Family.SMOOTH_MAX_POOL: validators.smooth_max_pool}[family]
    if family is Family.SMOOTH_MAX_POOL:
        args = (_LABEL, beta, *args[1:])
    return _geometry(op, check, args)


def _pool(family: Family, input: Tensor, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
          dilation: Sequence[int] | None, beta: float | None = None) -> Geometry:
    return pool_geometry(family.value, family, input.shape, tuple(kernel_size), tuple(stride), tuple(padding),
                         None if dilation is None else tuple(dilation), beta)


def _conv(input: Tensor, weight: Tensor, stride, padding, dilation, groups, circular) -> Geometry:
    return conv_geometry("conv", input.shape, weight.shape, tuple(stride), tuple(padding), tuple(dilation), groups,
                         "circular" if circular else "zeros")


def _conv_transpose(input: Tensor, weight: Tensor, stride, padding, output_padding, dilation, groups) -> Geometry:
    return conv_transpose_geometry("conv_transpose", input.shape, weight.shape, tuple(stride), tuple(padding),
                                   tuple(output_padding), tuple(dilation), groups)


def _output_shape(family: Family, input: Tensor, channels: Any, kernel: Sequence[Any], stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], output_padding: Sequence[int] | None = None) -> list:
    """The output shape of SEMANTICS §2 from (possibly symbolic) sizes, for the fakes."""
    rank = len(kernel)
    batch, channel = _batch(input.shape, rank)
    extras = output_padding if output_padding is not None else (0,) * rank
    spatial = [axis_extent(family, n, k, s, p, d, a) for n, k, s, p, d, a in
               zip(input.shape[channel + 1:], kernel, stride, padding, dilation, extras)]
    return [*([] if batch is None else [batch]), channels, *spatial]


# Forward and backward ops.


@torch.library.custom_op("convgen::conv", mutates_args=())
def conv(input: Tensor, weight: Tensor, bias: Tensor | None, stride: Sequence[int], padding: Sequence[int],
         dilation: Sequence[int], groups: int, circular: bool, precision: str) -> Tensor:
    check_precision("conv", precision)
    geom = _conv(input, weight, stride, padding, dilation, groups, circular)
    return devices.forward("conv", geom, (weight, bias, input), precision)[0]


@torch.library.custom_op("convgen::conv_backward", mutates_args=())
def conv_backward(grad: Tensor, input: Tensor, weight: Tensor, stride: Sequence[int], padding: Sequence[int],
                  dilation: Sequence[int], groups: int, circular: bool, precision: str,
                  output_mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """(grad of input, of weight, of bias), torch's convolution_backward order, each computed only where
    `output_mask` (in that order) asks, else an empty tensor."""
    check_precision("conv", precision)
    geom = _conv(input, weight, stride, padding, dilation, groups, circular)
    return _masked(devices.backward("conv", geom, (weight, None, input), (), grad, precision,
                                    _wanted(output_mask)), grad)


def _wanted(output_mask: Sequence[bool]) -> tuple[bool, bool, bool]:
    """An output_mask (input, weight, bias) as devices.backward's flags (weight, bias, input)."""
    wants_input, wants_weight, wants_bias = (bool(flag) for flag in output_mask)
    return wants_weight, wants_bias, wants_input


def _masked(grads: tuple[Tensor | None, ...], grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """devices.backward's (weight, bias, input) gradients in torch's order, an empty tensor for each one
    not computed (a custom op returns tensors, never None)."""
    grad_weight, grad_bias, grad_input = (grad.new_empty(0) if g is None else g for g in grads)
    return grad_input, grad_weight, grad_bias


@torch.library.custom_op("convgen::conv_transpose", mutates_args=())
def conv_transpose(input: Tensor, weight: Tensor, bias: Tensor | None, stride: Sequence[int], padding: Sequence[int],
                   output_padding: Sequence[int], dilation: Sequence[int], groups: int, precision: str) -> Tensor:
    check_precision("conv_transpose", precision)
    geom = _conv_transpose(input, weight, stride, padding, output_padding, dilation, groups)
    return devices.forward("conv_transpose", geom, (weight, bias, input), precision)[0]


@torch.library.custom_op("convgen::conv_transpose_backward", mutates_args=())
def conv_transpose_backward(grad: Tensor, input: Tensor, weight: Tensor, stride: Sequence[int],
                            padding: Sequence[int], output_padding: Sequence[int], dilation: Sequence[int],
                            groups: int, precision: str,
                            output_mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """As conv_backward, for the transposed convolution."""
    check_precision("conv_transpose", precision)
    geom = _conv_transpose(input, weight, stride, padding, output_padding, dilation, groups)
    return _masked(devices.backward("conv_transpose", geom, (weight, None, input), (), grad, precision,
                                    _wanted(output_mask)), grad)


@torch.library.custom_op("convgen::max_pool", mutates_args=())
def max_pool(input: Tensor, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int]) -> tuple[Tensor, Tensor]:
    geom = _pool(Family.MAX_POOL, input, kernel_size, stride, padding, dilation)
    return devices.forward("max_pool", geom, (input,))


@torch.library.custom_op("convgen::max_pool_backward", mutates_args=())
def max_pool_backward(grad: Tensor, input: Tensor, argmax: Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                      padding: Sequence[int], dilation: Sequence[int]) -> Tensor:
    geom = _pool(Family.MAX_POOL, input, kernel_size, stride, padding, dilation)
    return devices.backward("max_pool", geom, (input,), (argmax,), grad)[0]


@torch.library.custom_op("convgen::avg_pool", mutates_args=())
def avg_pool(input: Tensor, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int]) -> Tensor:
    geom = _pool(Family.AVG_POOL, input, kernel_size, stride, padding, None)
    return devices.forward("avg_pool", geom, (input,))[0]


@torch.library.custom_op("convgen::avg_pool_backward", mutates_args=())
def avg_pool_backward(grad: Tensor, input: Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                      padding: Sequence[int]) -> Tensor:
    geom = _pool(Family.AVG_POOL, input, kernel_size, stride, padding, None)
    return devices.backward("avg_pool", geom, (input,), (), grad)[0]


@torch.library.custom_op("convgen::smooth_max_pool", mutates_args=())
def smooth_max_pool(input: Tensor, kernel_size: Sequence[int], beta: float, stride: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    geom = _pool(Family.SMOOTH_MAX_POOL, input, kernel_size, stride, padding, dilation, beta)
    return devices.forward("smooth_max_pool", geom, (input,))


@torch.library.custom_op("convgen::smooth_max_pool_backward", mutates_args=())
def smooth_max_pool_backward(grad: Tensor, input: Tensor, pivots: Tensor, sums: Tensor, kernel_size: Sequence[int],
                             beta: float, stride: Sequence[int], padding: Sequence[int],
                             dilation: Sequence[int]) -> Tensor:
    geom = _pool(Family.SMOOTH_MAX_POOL, input, kernel_size, stride, padding, dilation, beta)
    return devices.backward("smooth_max_pool", geom, (input,), (pivots, sums), grad)[0]


# Fakes: shapes of SEMANTICS §2, contiguous, dtypes as the backend of the input's device makes them.


@conv.register_fake
def _(input, weight, bias, stride, padding, dilation, groups, circular, precision):
    return input.new_empty(_output_shape(Family.CONV, input, weight.shape[0], weight.shape[2:], stride, padding,
                                         dilation))


@conv_transpose.register_fake
def _(input, weight, bias, stride, padding, output_padding, dilation, groups, precision):
    return input.new_empty(_output_shape(Family.CONV_TRANSPOSE, input, weight.shape[1] * groups, weight.shape[2:],
                                         stride, padding, dilation, output_padding))


def _fake_conv_grads(grad, input, weight, *args):
    """Like input, like weight, and the bias's [out_c] (the channels of `grad`), each empty where the
    output_mask (the last argument) leaves it out."""
    out_channels = grad.shape[grad.dim() - weight.dim() + 1]
    shapes = (input.shape, weight.shape, (out_channels,))
    return tuple(grad.new_empty(shape if wants else 0) for shape, wants in zip(shapes, args[-1], strict=True))


conv_backward.register_fake(_fake_conv_grads)
conv_transpose_backward.register_fake(_fake_conv_grads)


@max_pool.register_fake
def _(input, kernel_size, stride, padding, dilation):
    shape = _output_shape(Family.MAX_POOL, input, input.shape[input.dim() - len(kernel_size) - 1], kernel_size,
                          stride, padding, dilation)
    (argmax_dtype,) = devices.saved_dtypes(Family.MAX_POOL, input.device.type, input.dtype, math.prod(kernel_size))
    return input.new_empty(shape), input.new_empty(shape, dtype=argmax_dtype)


@avg_pool.register_fake
def _(input, kernel_size, stride, padding):
    channels = input.shape[input.dim() - len(kernel_size) - 1]
    return input.new_empty(_output_shape(Family.AVG_POOL, input, channels, kernel_size, stride, padding,
                                         (1,) * len(kernel_size)))


@smooth_max_pool.register_fake
def _(input, kernel_size, beta, stride, padding, dilation):
    shape = _output_shape(Family.SMOOTH_MAX_POOL, input, input.shape[input.dim() - len(kernel_size) - 1],
                          kernel_size, stride, padding, dilation)
    dtypes = devices.saved_dtypes(Family.SMOOTH_MAX_POOL, input.device.type, input.dtype, 0)
    return input.new_empty(shape), *(input.new_empty(shape, dtype=dtype) for dtype in dtypes)


def _fake_input_grad(grad, input, *args):
    return input.new_empty(input.shape)


for _backward_op in (max_pool_backward, avg_pool_backward, smooth_max_pool_backward):
    _backward_op.register_fake(_fake_input_grad)


# Autograd: each forward op's backward is its backward op (once differentiable).


def _save_conv(ctx, inputs, output) -> None:
    input, weight, bias, *geometry = inputs
    ctx.save_for_backward(input, weight)
    ctx.geometry = geometry


def _conv_backward_of(backward_op: Any) -> Callable:
    def backward(ctx, grad):
        input, weight = ctx.saved_tensors
        output_mask = list(ctx.needs_input_grad[:3])  # input, weight, bias: what autograd will read
        grads = backward_op(grad, input, weight, *ctx.geometry, output_mask)
        return *(g if wants else None for g, wants in zip(grads, output_mask)), *(None,) * len(ctx.geometry)
    return backward


def _save_pool(ctx, inputs, output) -> None:
    input, *geometry = inputs
    state = output[1:] if isinstance(output, tuple) else ()
    ctx.save_for_backward(input, *state)
    ctx.geometry = geometry


def _pool_backward_of(backward_op: Any) -> Callable:
    def backward(ctx, grad, *state_grads):
        input, *state = ctx.saved_tensors
        return backward_op(grad, input, *state, *ctx.geometry), *(None,) * len(ctx.geometry)
    return backward


conv.register_autograd(_conv_backward_of(conv_backward), setup_context=_save_conv)
conv_transpose.register_autograd(_conv_backward_of(conv_transpose_backward), setup_context=_save_conv)
for _forward_op, _backward_op in ((max_pool, max_pool_backward), (avg_pool, avg_pool_backward),
                                  (smooth_max_pool, smooth_max_pool_backward)):
    _forward_op.register_autograd(_pool_backward_of(_backward_op), setup_context=_save_pool)

FORWARD_OPS = (conv, conv_transpose, max_pool, avg_pool, smooth_max_pool)
BACKWARD_OPS = (conv_backward, conv_transpose_backward, max_pool_backward, avg_pool_backward,
                smooth_max_pool_backward)
