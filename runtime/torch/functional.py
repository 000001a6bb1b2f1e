"""The functional API of convgen.torch, with torch.nn.functional's conventions: int-or-tuple arguments
broadcast to the rank, an unbatched input [C, *S] is accepted and its output returned unbatched, a
pool's stride None is its kernel_size.

The rank comes from the weight (weight.dim() - 2), from a tuple kernel_size, or else from the input
taken as batched [N, C, *S]: an int kernel_size cannot tell [C, *S] of rank r + 1 from [N, C, *S] of
rank r, so pools with an int kernel_size read the input as batched (layers know their rank and pass
tuples). Supported dtypes: float32, float64, float16 and bfloat16 (stored in 16 bits, computed in
float32). Under autocast the convolutions cast as torch's do: float32 tensors to the autocast dtype
(float64 stays); the pools run in their input's dtype. The convolutions' precision on float32 tensors is
chosen per call by convgen.torch.precision (torch's TF32 switch for convolutions, or
set_float32_precision).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from convgen.checking import describe, plain
from convgen.cuda_kernels import POOL_KEPT
from convgen.geometry import Family, Geometry
from convgen.torch import devices, host_path, library
from convgen.torch.precision import conv_precision

__all__ = ["avg_pool", "conv", "conv_transpose", "max_pool", "smooth_max_pool"]

Tensor = torch.Tensor


def _integer(value: Any) -> Any:
    """An integer (int or NumPy's, not a bool) as an int, as torch takes them; anything else as given, for
    the validator to reject by name."""
    if type(value) is int or isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return value
    return int(value)


def _per_axis(op: str, argument: str, value: Any, rank: int) -> tuple[Any, ...]:
    """An integer broadcast to `rank` axes, as a list or tuple of one (as torch's ops broadcast it); a list or tuple of
    `rank` entries as a tuple, its integers as ints (an entry that is not one goes to the validator, which names it
    and the rule). Anything else is an error in torch's terms: a TypeError naming the op and the argument."""
    value = _integer(value)
    if type(value) is int:
        return (value,) * rank
    if isinstance(value, (tuple, list)) and len(value) in (1, rank):
        items = tuple(_integer(v) for v in value)
        return items * rank if len(items) == 1 else items
    raise TypeError(f"convgen.torch.{op}: {argument} must be an int or a tuple of {rank} ints, got {describe(value)}")


def explicit_padding(who: str, padding: Any, kernel: tuple[int, ...], stride: tuple[Any, ...],
                     dilation: tuple[Any, ...]) -> Any:
    """The padding per axis that torch's string paddings stand for: 'valid' none, 'same' half of dilation *
    (kernel - 1) on each side, which needs stride 1 and an even span on every axis (torch pads an odd one
    asymmetrically; convgen does not). Any other value as given; an error that `who` (the op or layer) names."""
    if not isinstance(padding, str):
        return padding
    if padding == "valid":
        return (0,) * len(kernel)
    if padding != "same":
        raise ValueError(f"{who}: padding must be 'valid', 'same', an int or a tuple, got {padding!r}")
    if any(s != 1 for s in stride):
        raise ValueError(f"{who}: padding='same' needs stride 1 on every axis, got stride={tuple(stride)}")
    spans = tuple(d * (k - 1) for d, k in zip(dilation, kernel))
    if any(span % 2 for span in spans):
        raise ValueError(f"{who}: padding='same' needs an even dilation*(kernel_size-1) on every axis, got {spans}")
    return tuple(span // 2 for span in spans)


def _autocast(tensors: tuple[Tensor | None, ...]) -> tuple[Tensor | None, ...]:
    """A convolution's tensors (input first) under autocast, cast as torch casts its own convolutions'
    (autocast's lower-precision list): every floating tensor but float64 to the autocast dtype."""
    input = tensors[0]
    device_type = "cuda" if input.is_cuda else input.device.type  # an attribute read before making a device
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in tensors)


# Whether a torch.func transform (vmap, grad, ...) is running, as torch's own autograd.Function asks.
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


# The names of the tensors _checked takes, in the backend's order after the input.
_CONV_TENSORS = ("input", "weight", "bias")
_POOL_TENSORS = ("input",)
# Whether autocast is on for any device type: one C call (per device type, torch.is_autocast_enabled).
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def _checked(op: str, names: tuple[str, ...], tensors: tuple[Tensor | None, ...],
             autocast: bool) -> tuple[Tensor | None, ...]:
    """`tensors` (named by `names`: input first, bias may be None): torch tensors, with `autocast` (the
    convolutions) cast as torch's autocast casts its own convolutions' first, then of float32, float64,
    float16 or bfloat16, all of the input's dtype and on its device; no torch.func transform active (its
    wrapped tensors have no memory that the device code could read). The usual call (plain tensors of one
    supported dtype and device, no autocast, eager) is told apart in a few attribute reads: this runs on
    every call, and the full check costs 4 µs of a tiny call's host time."""
    input = tensors[0]
    if isinstance(input, Tensor) and not (autocast and _any_autocast()) and not torch.compiler.is_compiling() \
            and not _transforms_active() and input.dtype in devices.DTYPE_NAMES and dense(input):
        dtype, device = input.dtype, input.device
        for name, tensor in zip(names[1:], tensors[1:]):
            if not (isinstance(tensor, Tensor) and tensor.dtype is dtype and tensor.device == device
                    and dense(tensor)) and not (tensor is None and name == "bias"):
                break
        else:
            return tensors
    return _checked_in_full(op, names, tensors, autocast)


def dense(tensor: Tensor) -> bool:
    """Whether `tensor` is laid out as strides over one block of memory, as the device code reads it: not sparse, not
    jagged, not nested."""
    return tensor.layout is torch.strided and not tensor.is_nested


def layout_name(tensor: Tensor) -> str:
    """A tensor's layout as the errors name it."""
    return "a nested tensor" if tensor.is_nested else str(tensor.layout)


def _checked_in_full(op: str, names: tuple[str, ...], tensors: tuple[Tensor | None, ...],
                     autocast: bool) -> tuple[Tensor | None, ...]:
    """_checked, every rule in turn: the tensors as the op takes them, or the error of the first rule broken."""
    for name, tensor in zip(names, tensors):
        if not isinstance(tensor, Tensor) and not (tensor is None and name == "bias"):
            raise TypeError(f"convgen.torch.{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor is not None and not dense(tensor):
            raise TypeError(f"convgen.torch.{op}: {name} must be a dense tensor (torch.strided), got "
                            f"{layout_name(tensor)}")
    if not torch.compiler.is_compiling() and _transforms_active():
        raise RuntimeError(f"convgen.torch.{op}: torch.func transforms (vmap, grad, jacrev, ...) are not supported; "
                           f"call the op outside them (autograd and torch.compile are)")
    if autocast:
        tensors = _autocast(tensors)
    input = tensors[0]
    dtype, device = input.dtype, input.device
    for name, tensor in zip(names, tensors):
        if tensor is None:
            continue
        if tensor.dtype not in devices.DTYPE_NAMES:
            raise TypeError(f"convgen.torch.{op}: {name} dtype must be torch.float32, torch.float64, "
                            f"torch.float16 or torch.bfloat16, got {tensor.dtype}")
        if tensor.dtype != dtype:
            raise TypeError(f"convgen.torch.{op}: {name} dtype {tensor.dtype} does not match input dtype {dtype}")
        if tensor is not input and tensor.device != device:
            raise RuntimeError(f"convgen.torch.{op}: {name} is on {tensor.device} but input is on {device}")
    return tensors


def _check_input_dims(op: str, input: Tensor, rank: int, source: str, source_size: int) -> None:
    """The input has rank + 1 or rank + 2 dimensions, the rank taken from `source`: the weight (of
    `source_size` dimensions) or the kernel_size (of `source_size` axes)."""
    if input.dim() not in (rank + 1, rank + 2):
        rank_from = f"a weight of {source_size} dimensions" if source == "weight" else \
            f"a kernel_size of {source_size} axes"
        raise ValueError(f"convgen.torch.{op}: input must have {rank + 1} (unbatched) or {rank + 2} (batched) "
                         f"dimensions for {rank_from}, got {input.dim()}")


def _check_bias(op: str, bias: Tensor | None, geom: Geometry) -> None:
    if bias is not None and tuple(bias.shape) != (geom.out_c,):
        raise ValueError(f"convgen.torch.{op}: bias must have shape ({geom.out_c},), got {tuple(bias.shape)}")


def _conv_rank(op: str, weight: Tensor) -> int:
    if weight.dim() < 3:
        raise ValueError(f"convgen.torch.{op}: weight must have at least 3 dimensions (channels, channels, "
                         f"*kernel), got {weight.dim()}")
    return weight.dim() - 2


# Geometries of earlier convolution calls, keyed by the call as given (_memo_key): a repeated call skips
# broadcasting and validation, a third of its host time. Emptied when full; failed calls are not kept.
_GEOMETRIES: dict[tuple, Geometry] = {}
_GEOMETRIES_SIZE = 4096


def _memo_key(*parts: Any) -> tuple | None:
    """`parts` as a memo key when each is None, an int, a str or a tuple of ints (torch.Size included: an eager
    tensor's holds ints), else None (checking.plain). None under torch.compile, which traces the validation itself
    (shapes may be symbolic there)."""
    if torch.compiler.is_compiling() or not plain(parts, torch.Size):
        return None
    return parts


def _remembered(key: tuple | None, geom: Geometry) -> Geometry:
    if key is not None:
        if len(_GEOMETRIES) >= _GEOMETRIES_SIZE:
            _GEOMETRIES.clear()
        _GEOMETRIES[key] = geom
    return geom


def conv(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
         dilation: Any = 1, groups: int = 1, padding_mode: str = "zeros") -> Tensor:
    """N-D convolution (torch.nn.functional.conv{1,2,3}d at every rank); padding an int, a tuple, 'valid' or 'same'
    (stride 1, an even dilation * (kernel - 1) on every axis); padding_mode 'zeros' or 'circular'."""
    if torch.compiler.is_compiling():
        return _conv(input, weight, bias, stride, padding, dilation, groups, padding_mode)
    return _CONV(input, weight, bias, stride, padding, dilation, groups, padding_mode)


def _conv(input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any, dilation: Any, groups: Any,
          padding_mode: Any) -> Tensor:
    """conv's Python path."""
    op = "conv"
    given = (input, weight, bias, stride, padding, dilation, groups, padding_mode)
    input, weight, bias = _checked(op, _CONV_TENSORS, (input, weight, bias), autocast=True)
    key = _memo_key(op, input.shape, weight.shape, None if bias is None else bias.shape, stride, padding, dilation,
                    groups, padding_mode)
    geom = _GEOMETRIES.get(key) if key is not None else None
    if geom is None:
        geom = _remembered(key, _conv_geometry(op, input, weight, bias, stride, padding, dilation, groups,
                                               padding_mode))
    precision = conv_precision(input.dtype)
    if _eager(input):
        return _run_eager(op, geom, precision, (weight, bias, input), given)
    return library.conv(input, weight, bias, geom.stride, geom.padding, geom.dilation, geom.groups, geom.circular,
                        precision)


def _conv_geometry(op: str, input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any,
                   dilation: Any, groups: Any, padding_mode: Any) -> Geometry:
    rank = _conv_rank(op, weight)
    _check_input_dims(op, input, rank, "weight", weight.dim())
    stride, dilation = _per_axis(op, "stride", stride, rank), _per_axis(op, "dilation", dilation, rank)
    if isinstance(padding, str):  # where a stride or dilation entry is not an int, the validator names it first
        ints = all(type(v) is int for v in (*stride, *dilation))
        padding = explicit_padding(f"convgen.torch.{op}", padding, tuple(weight.shape[2:]), stride, dilation) \
            if ints else (0,) * rank
    padding = _per_axis(op, "padding", padding, rank)
    groups = _integer(groups)
    geom = library.conv_geometry(op, input.shape, weight.shape, stride, padding, dilation, groups, padding_mode)
    _check_bias(op, bias, geom)
    return geom


def conv_transpose(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                   output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """N-D transposed convolution (torch.nn.functional.conv_transpose{1,2,3}d at every rank)."""
    if torch.compiler.is_compiling():
        return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation)
    return _CONV_TRANSPOSE(input, weight, bias, stride, padding, output_padding, groups, dilation)


def _conv_transpose(input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any,
                    output_padding: Any, groups: Any, dilation: Any) -> Tensor:
    """conv_transpose's Python path."""
    op = "conv_transpose"
    given = (input, weight, bias, stride, padding, output_padding, groups, dilation)
    input, weight, bias = _checked(op, _CONV_TENSORS, (input, weight, bias), autocast=True)
    key = _memo_key(op, input.shape, weight.shape, None if bias is None else bias.shape, stride, padding,
                    output_padding, groups, dilation)
    geom = _GEOMETRIES.get(key) if key is not None else None
    if geom is None:
        geom = _remembered(key, _conv_transpose_geometry(op, input, weight, bias, stride, padding, output_padding,
                                                         groups, dilation))
    precision = conv_precision(input.dtype)
    if _eager(input):
        return _run_eager(op, geom, precision, (weight, bias, input), given)
    return library.conv_transpose(input, weight, bias, geom.stride, geom.padding, geom.output_padding, geom.dilation,
                                  geom.groups, precision)


def _conv_transpose_geometry(op: str, input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any,
                             output_padding: Any, groups: Any, dilation: Any) -> Geometry:
    rank = _conv_rank(op, weight)
    _check_input_dims(op, input, rank, "weight", weight.dim())
    stride, padding, output_padding, dilation = (
        _per_axis(op, name, v, rank) for name, v in
        (("stride", stride), ("padding", padding), ("output_padding", output_padding), ("dilation", dilation)))
    groups = _integer(groups)
    geom = library.conv_transpose_geometry(op, input.shape, weight.shape, stride, padding, output_padding, dilation,
                                           groups)
    _check_bias(op, bias, geom)
    return geom


def _pool_geometry(op: str, family: Family, input: Tensor, kernel_size: Any, stride: Any, padding: Any,
                   dilation: Any, beta: Any = None) -> tuple[Tensor, Geometry]:
    """The input after autocast, checked, and the pool's geometry."""
    (input,) = _checked(op, _POOL_TENSORS, (input,), autocast=False)
    kernel_size = _integer(kernel_size)
    if type(kernel_size) is int:
        if input.dim() < 3:
            raise ValueError(f"convgen.torch.{op}: an int kernel_size reads the input as batched [N, C, *S], which "
                             f"needs at least 3 dimensions, got {input.dim()}; pass a tuple kernel_size for an "
                             f"unbatched input")
        rank = input.dim() - 2
    elif isinstance(kernel_size, (tuple, list)):
        rank = len(kernel_size)
        _check_input_dims(op, input, rank, "kernel_size", rank)
    else:
        raise TypeError(f"convgen.torch.{op}: kernel_size must be an int or a tuple of ints, got {kernel_size!r}")
    kernel_size = _per_axis(op, "kernel_size", kernel_size, rank)
    stride = kernel_size if stride is None else _per_axis(op, "stride", stride, rank)
    padding = _per_axis(op, "padding", padding, rank)
    dilation = None if dilation is None else _per_axis(op, "dilation", dilation, rank)
    return input, library.pool_geometry(op, family, input.shape, kernel_size, stride, padding, dilation, beta)


def _eager(input: Tensor) -> bool:
    """Whether the call takes _Eager's path: in eager mode on real tensors (meta tensors, which carry only
    shapes, go through the custom ops and their fakes)."""
    return _EAGER_FUNCTION and not torch.compiler.is_compiling() and not input.is_meta


def _run_eager(op: str, geom: Geometry, precision: str, tensors: tuple[Tensor | None, ...],
               given: tuple[Any, ...]) -> Tensor:
    """An op in eager mode: the device code first, so that its kernels are launched before autograd's
    bookkeeping (which then overlaps them: about 6 µs of a call's host time on the H200's host), then
    _Eager attaches the backward where autograd will want one (nowhere else: an autograd.Function's
    bookkeeping is a third of a tiny op's host cost). `tensors` in the backend's order; `given`, the op's arguments
    as the user gave them, keys the compiled host path's entry (host_path.remember)."""
    computed = devices.forward(op, geom, tensors, precision)
    host_path.remember(op, given, len(tensors), geom, precision, tensors)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return _apply_eager(op, geom, precision, computed, *tensors)
    return computed[0]


def max_pool(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
    """N-D max pooling (torch.nn.functional.max_pool{1,2,3}d at every rank, without ceil_mode or indices)."""
    if torch.compiler.is_compiling():
        return _max_pool(input, kernel_size, stride, padding, dilation)
    return _MAX_POOL(input, kernel_size, stride, padding, dilation)


def _max_pool(input: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any) -> Tensor:
    """max_pool's Python path."""
    given = (input, kernel_size, stride, padding, dilation)
    input, geom = _pool_geometry("max_pool", Family.MAX_POOL, input, kernel_size, stride, padding, dilation)
    if _eager(input):
        return _run_eager("max_pool", geom, "highest", (input,), given)
    return library.max_pool(input, geom.kernel, geom.stride, geom.padding, geom.dilation)[0]


def avg_pool(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    """N-D average pooling, padded zeros counted (torch's count_include_pad=True, ceil_mode=False)."""
    if torch.compiler.is_compiling():
        return _avg_pool(input, kernel_size, stride, padding)
    return _AVG_POOL(input, kernel_size, stride, padding)


def _avg_pool(input: Tensor, kernel_size: Any, stride: Any, padding: Any) -> Tensor:
    """avg_pool's Python path."""
    given = (input, kernel_size, stride, padding)
    input, geom = _pool_geometry("avg_pool", Family.AVG_POOL, input, kernel_size, stride, padding, None)
    if _eager(input):
        return _run_eager("avg_pool", geom, "highest", (input,), given)
    return library.avg_pool(input, geom.kernel, geom.stride, geom.padding)


def smooth_max_pool(input: Tensor, kernel_size: Any, beta: float, stride: Any = None, padding: Any = 0,
                    dilation: Any = 1) -> Tensor:
    """N-D smooth max pooling: log Σ exp(β·x) / β over each window, padded zeros included (SEMANTICS §3)."""
    if torch.compiler.is_compiling():
        return _smooth_max_pool(input, kernel_size, beta, stride, padding, dilation)
    return _SMOOTH_MAX_POOL(input, kernel_size, beta, stride, padding, dilation)


def _smooth_max_pool(input: Tensor, kernel_size: Any, beta: Any, stride: Any, padding: Any, dilation: Any) -> Tensor:
    """smooth_max_pool's Python path."""
    given = (input, kernel_size, beta, stride, padding, dilation)
    # Under torch.compile beta may be symbolic and its float32 rounding (NumPy's) cannot be traced: the window
    # is checked by max pool's rules, which are smooth max's without beta, and the op checks beta when it runs.
    compiling = torch.compiler.is_compiling()
    family, checked_beta = (Family.MAX_POOL, None) if compiling else (Family.SMOOTH_MAX_POOL, beta)
    input, geom = _pool_geometry("smooth_max_pool", family, input, kernel_size, stride, padding, dilation,
                                 checked_beta)
    if _eager(input):
        return _run_eager("smooth_max_pool", geom, "highest", (input,), given)
    return library.smooth_max_pool(input, geom.kernel, beta if compiling else geom.beta, geom.stride, geom.padding,
                                   geom.dilation)[0]


class _Eager(torch.autograd.Function):
    """Eager mode's autograd for the same device code as the custom ops, without the dispatcher's round trip
    through Python (see _EAGER_FUNCTION). `computed` is what devices.forward returned for `tensors` (the
    output, then the state backward needs), the tensors in the backend's order: (weight, bias, input) or
    (input,); `precision` as the custom ops take it (the pools ignore it)."""

    @staticmethod
    def forward(ctx: Any, op: str, geom: Geometry, precision: str, computed: tuple[Tensor, ...],
                *tensors: Tensor | None) -> Tensor:
        output, *saved = computed
        ctx.op, ctx.geom, ctx.precision = op, geom, precision
        ctx.save_for_backward(*tensors, *saved)
        return output

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        # Grad mode is on here only under create_graph=True: there the gradients come out of _NoSecondBackward, so
        # that a backward through them is an error. Elsewhere its no_grad block and checks would cost about 3 µs of
        # autograd's device thread a step (the development machine), for nothing.
        if torch.is_grad_enabled():
            with torch.no_grad():
                grads = _backward(ctx, grad)
            # A max or average pool's input gradient depends on its input nowhere differentiably (through which
            # cells won, or not at all); a conv's gradients depend on its inputs, a smooth max's on its input.
            linear = ctx.op in ("max_pool", "avg_pool")
            return _NoSecondBackward.refusing(ctx.op, grads, (grad,) if linear else (grad, *ctx.saved_tensors))
        return _backward(ctx, grad)


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    """_Eager's backward: the gradients of the inputs it was given, after its four leading non-tensors."""
    geom = ctx.geom
    stored = ctx.saved_tensors
    # Only the gradients autograd will read are computed (a missing bias and a tensor that needs no
    # gradient get None), as torch's convolution_backward does with its output_mask.
    wanted = ctx.needs_input_grad[4:]
    if geom.family.is_conv:
        weight, bias, x = stored
        grads = _CONV_BACKWARD(grad, x, weight, geom, ctx.precision, wanted, ctx.op, bias)
    else:
        grads = _POOL_BACKWARDS[geom.family](grad, *stored, geom, wanted, ctx.op)
    return None, None, None, None, *grads


def _conv_backward(grad: Tensor, x: Tensor, weight: Tensor, geom: Geometry, precision: str, wanted: tuple[bool, ...],
                   op: str, bias: Tensor | None) -> tuple[Tensor | None, ...]:
    """The conv families' backward on the Python path (host_path.backward_call): their gradients (weight, bias,
    input), remembered for the compiled path."""
    grads = devices.backward(op, geom, (weight, bias, x), (), grad, precision, wanted)
    host_path.remember_backward((grad, x, weight), geom, (precision, wanted), precision, wanted)
    return grads


def _pool_backward(grad: Tensor, x: Tensor, *rest: Any) -> tuple[Tensor]:
    """A pool's backward on the Python path (host_path.backward_call), called (grad, x, *kept, geom, wanted, op) with
    what its forward kept: its input's gradient, remembered for the compiled path."""
    *kept, geom, wanted, op = rest
    grads = devices.backward(op, geom, (x,), tuple(kept), grad, "highest", wanted)
    host_path.remember_backward((grad, x, *kept), geom, (wanted,), "highest", wanted)
    return grads


class _NoSecondBackward(torch.autograd.Function):
    """Gradients computed under create_graph=True, passed on unchanged, whose own backward is an error: convgen does
    not differentiate its gradients, and leaving their derivatives out (a gradient penalty's term through the weight)
    would be a wrong result, not a missing one. torch's once_differentiable refuses only where the upstream gradient
    requires grad; these depend on the op's saved inputs too."""

    @staticmethod
    def refusing(op: str, grads: tuple[Tensor | None, ...], sources: tuple[Tensor, ...]) -> tuple[Tensor | None, ...]:
        """`grads` as this function's outputs where any of `sources` (what they depend on; None for a missing bias)
        requires grad."""
        depended = [t for t in sources if t is not None and t.requires_grad]
        if not depended:
            return grads
        made = [g for g in grads if g is not None]
        refused = iter(_NoSecondBackward.apply(op, len(made), *made, *depended))
        return tuple(None if g is None else next(refused) for g in grads)

    @staticmethod
    def forward(ctx: Any, op: str, count: int, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.op = op
        return tuple(t.view_as(t) for t in tensors[:count])

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> None:
        raise RuntimeError(f"convgen.torch.{ctx.op}: a backward through its gradients is not supported: they were "
                           "computed under create_graph=True, but convgen does not differentiate them (a gradient "
                           "penalty through this op needs torch's own ops)")


# Eager calls run the device code and attach the backward with _Eager; torch.compile traces the custom
# ops (which have fakes). Chosen by benchmarks/torch_overhead.py's stub rows (device code replaced by
# allocations, so only host cost is left) for a [1, 4, 8, 8] input and 3x3 kernel, on the 2-core CPU
# development machine: forward 43.5 µs through the custom op against 9.6 µs through _Eager (15.6 µs for
# the whole functional call), forward + backward 127 µs against 54 µs. The custom op's dispatcher round
# trip into Python costs the difference.
_EAGER_FUNCTION = True
# _Eager's apply without autograd.Function.apply's Python wrapper, which binds default arguments for a
# setup_context (_Eager has none) and unwraps functorch's dead wrappers (_checked refuses a running
# transform): torch's C++ apply itself, 2 of a tiny conv step's 6 µs of apply on the development machine.
_apply_eager = super(torch.autograd.Function, _Eager).apply


def _eager_call(op: str, python_call: Any, tensors: int, arguments: int) -> Any:
    """An op's call outside torch.compile: compiled for arguments it has run before (host_path), else `python_call`."""
    return host_path.eager_call(op, python_call, tensors, arguments, tensors == 3, _transforms_active, _any_autocast,
                                conv_precision, _apply_eager)


_CONV = _eager_call("conv", _conv, 3, 8)
_CONV_TRANSPOSE = _eager_call("conv_transpose", _conv_transpose, 3, 8)
_MAX_POOL = _eager_call("max_pool", _max_pool, 1, 5)
_AVG_POOL = _eager_call("avg_pool", _avg_pool, 1, 4)
_SMOOTH_MAX_POOL = _eager_call("smooth_max_pool", _smooth_max_pool, 1, 6)
_CONV_BACKWARD = host_path.backward_call(Family.CONV, _conv_backward, 3, 6, 8)
# A pool's backward by its family: (grad, x, *what its forward kept, geom, wanted, op), keyed by all but the op.
_POOL_BACKWARDS = {family: host_path.backward_call(family, _pool_backward, 2 + kept, 4 + kept, 5 + kept)
                   for family, kept in POOL_KEPT.items()}
