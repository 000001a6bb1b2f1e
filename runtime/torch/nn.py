"""The layers of `convgen.torch`: Conv1d..Conv8d, ConvTranspose1d..8d, MaxPool1d..8d, AvgPool1d..8d and
SmoothMaxPool1d..8d, drop-in for torch.nn's layers of ranks 1..3 and the same at ranks 4..8.

One base class per family holds the constructor arguments, parameters, `reset_parameters` and `extra_repr`
of torch.nn's layer of that family; `rank` is a class attribute. The 40 classes are made in a loop from the
op table's rank-generic ops (one per family), so a family added to the spec needs only its base class here.
"""

from __future__ import annotations

import math
import numbers
from typing import ClassVar

import torch
from convgen.generated.ops import OPS
from convgen.geometry import MAX_RANK, Family
from convgen.op import OpInfo
from convgen.torch import functional


def _is_int(value: object) -> bool:
    """An integer as torch takes one: an int or NumPy's, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# The smallest value of each per-axis argument: a window of at least one cell, moved by at least one.
_SMALLEST = {"kernel_size": 1, "stride": 1, "dilation": 1, "padding": 0, "output_padding": 0}


class _Layer(torch.nn.Module):
    """What every layer shares: its rank, its op, and the checks of its arguments and input."""

    rank: ClassVar[int]
    op: ClassVar[OpInfo]  # the op table's entry of the family, whose functional form the layer calls

    @property
    def _name(self) -> str:
        return type(self).__name__

    def _per_axis(self, argument: str, value: object) -> tuple[int, ...]:
        """An int broadcast to every spatial axis, or a tuple with one int per axis, as torch's _ntuple; each at
        least the argument's smallest value (_SMALLEST)."""
        if _is_int(value):
            values = (int(value),) * self.rank
        elif isinstance(value, (tuple, list)) and len(value) == self.rank and all(_is_int(v) for v in value):
            values = tuple(int(v) for v in value)
        else:
            raise TypeError(f"{self._name}: {argument} must be an int or a tuple of {self.rank} ints, got {value!r}")
        smallest = _SMALLEST[argument]
        if min(values) < smallest:
            raise ValueError(f"{self._name}: {argument} must be at least {smallest} on every axis, got {value!r}")
        return values

    def _reject_unsupported(self, argument: str, value: object, supported: object) -> None:
        """torch's options that convgen does not compute are accepted only at the value it computes."""
        if value != supported:
            raise ValueError(f"{self._name}: {argument}={value!r} is not supported, only {supported!r}")

    def _check_input(self, input: torch.Tensor, in_channels: int | None = None) -> None:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"{self._name}: input must be a torch.Tensor, got {type(input).__name__}")
        if not functional.dense(input):
            raise TypeError(f"{self._name}: input must be a dense tensor (torch.strided), got "
                            f"{functional.layout_name(input)}")
        rank = self.rank
        if input.dim() not in (rank + 1, rank + 2):
            axes = "axis" if rank == 1 else "axes"
            raise ValueError(
                f"{self._name}: input must have {rank + 1} or {rank + 2} dimensions "
                f"([C, *S] or [N, C, *S] with {rank} spatial {axes}), got {input.dim()}"
            )
        if in_channels is not None:
            channels = input.shape[input.dim() - rank - 1]
            if channels != in_channels:
                raise ValueError(f"{self._name}: input has {channels} channels, expected in_channels={in_channels}")


class _ConvLayer(_Layer):
    """Conv and ConvTranspose: torch's _ConvNd parameters, initialisation and extra_repr."""

    transposed: ClassVar[bool]

    def _setup(self, in_channels: int, out_channels: int, kernel_size, stride, padding, dilation, output_padding,
               groups: int, bias: bool, padding_mode: str, device, dtype) -> None:
        if not _is_int(groups) or groups <= 0:
            raise ValueError(f"{self._name}: groups must be a positive integer, got {groups!r}")
        groups = int(groups)
        for argument, channels in (("in_channels", in_channels), ("out_channels", out_channels)):
            if not _is_int(channels) or channels <= 0:
                raise ValueError(f"{self._name}: {argument} must be a positive integer, got {channels!r}")
            if channels % groups:
                raise ValueError(
                    f"{self._name}: {argument} must be divisible by groups, got {argument}={channels}, groups={groups}"
                )
        in_channels, out_channels = int(in_channels), int(out_channels)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = self._per_axis("kernel_size", kernel_size)
        self.stride = self._per_axis("stride", stride)
        self.dilation = self._per_axis("dilation", dilation)
        self.padding = padding if isinstance(padding, str) else self._per_axis("padding", padding)
        self.output_padding = self._per_axis("output_padding", output_padding)
        self.groups = groups
        self.padding_mode = padding_mode
        weight_channels = (in_channels, out_channels // groups) if self.transposed else (
            out_channels, in_channels // groups)
        factory = {"device": device, "dtype": dtype}
        shape = (*weight_channels, *self.kernel_size)
        try:
            self.weight = torch.nn.Parameter(torch.empty(shape, **factory))
        except (RuntimeError, TypeError, ValueError) as error:  # out of memory, too many cells, a bad device or dtype
            raise type(error)(f"{self._name}: cannot make a weight of shape {shape}: {error}") from None
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_channels, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn's initialisation, draw for draw: kaiming-uniform weight (a=√5), bias uniform ±1/√fan_in."""
        with torch.no_grad():
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
            if self.bias is not None:
                fan_in, _ = torch.nn.init._calculate_fan_in_and_fan_out(self.weight)
                bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
                torch.nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        parts = [f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"]
        if self.padding != (0,) * len(self.padding):
            parts.append(f"padding={self.padding}")
        if self.dilation != (1,) * self.rank:
            parts.append(f"dilation={self.dilation}")
        if self.output_padding != (0,) * self.rank:
            parts.append(f"output_padding={self.output_padding}")
        if self.groups != 1:
            parts.append(f"groups={self.groups}")
        if self.bias is None:
            parts.append("bias=False")
        if self.padding_mode != "zeros":
            parts.append(f"padding_mode={self.padding_mode}")
        return ", ".join(parts)


class _Conv(_ConvLayer):
    """Convolution over {rank} spatial axes, as torch.nn.Conv3d: weight [out_channels, in_channels/groups, *kernel].

    padding: an int, a tuple, 'valid' (no padding) or 'same' (stride 1, an even dilation*(kernel_size-1) on every
    axis); padding_mode 'zeros' or 'circular' (periodic boundaries).
    """

    transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None) -> None:
        super().__init__()
        if padding_mode not in ("zeros", "circular"):
            raise ValueError(f"{self._name}: padding_mode must be 'zeros' or 'circular', got {padding_mode!r}")
        self._setup(in_channels, out_channels, kernel_size, stride, padding, dilation, 0, groups, bias,
                    padding_mode, device, dtype)
        self._explicit_padding = functional.explicit_padding(self._name, self.padding, self.kernel_size, self.stride,
                                                             self.dilation)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input(input, self.in_channels)
        return functional.conv(input, self.weight, self.bias, self.stride, self._explicit_padding, self.dilation,
                               self.groups, self.padding_mode)


class _ConvTranspose(_ConvLayer):
    """Transposed convolution over {rank} spatial axes, as torch.nn.ConvTranspose3d: weight
    [in_channels, out_channels/groups, *kernel_size]; output_padding < stride or dilation on every axis."""

    transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None) -> None:
        super().__init__()
        if padding_mode != "zeros":
            raise ValueError(f"{self._name}: padding_mode must be 'zeros', got {padding_mode!r}")
        if isinstance(padding, str):
            raise TypeError(f"{self._name}: padding must be an int or a tuple of {self.rank} ints, got {padding!r}")
        self._setup(in_channels, out_channels, kernel_size, stride, padding, dilation, output_padding, groups, bias,
                    padding_mode, device, dtype)

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        self._check_input(input, self.in_channels)
        output_padding = self.output_padding if output_size is None else self._output_padding_for(input, output_size)
        return functional.conv_transpose(input, self.weight, self.bias, self.stride, self.padding, output_padding,
                                         self.groups, self.dilation)

    def _output_padding_for(self, input: torch.Tensor, output_size: list[int]) -> tuple[int, ...]:
        """torch's `output_size`: the output_padding that gives these extents (the spatial ones, or all)."""
        # Sizes may be SymInts: a shape read under torch.compile(dynamic=True).
        if not isinstance(output_size, (tuple, list)) or \
                not all(_is_int(size) or isinstance(size, torch.SymInt) for size in output_size):
            raise TypeError(f"{self._name}: output_size must be a list or tuple of ints, got {output_size!r}")
        sizes = tuple(output_size)[-self.rank:] if len(output_size) == input.dim() else tuple(output_size)
        if len(sizes) != self.rank:
            raise ValueError(f"{self._name}: output_size must have {self.rank} or {input.dim()} elements, "
                             f"got {len(output_size)}")
        spatial = input.shape[input.dim() - self.rank:]
        smallest = tuple((n - 1) * s - 2 * p + d * (k - 1) + 1 for n, s, p, d, k in
                         zip(spatial, self.stride, self.padding, self.dilation, self.kernel_size))
        largest = tuple(low + s - 1 for low, s in zip(smallest, self.stride))
        if any(not low <= size <= high for size, low, high in zip(sizes, smallest, largest)):
            raise ValueError(f"{self._name}: output_size must be between {smallest} and {largest} on the spatial "
                             f"axes for an input of {tuple(spatial)}, got {sizes}")
        return tuple(size - low for size, low in zip(sizes, smallest))


class _Pool(_Layer):
    """The pools keep their arguments as given (torch's MaxPool3d and AvgPool3d do) and pass tuples on."""

    def _window(self) -> dict[str, tuple[int, ...]]:
        return {argument: self._per_axis(argument, getattr(self, argument)) for argument in self._window_arguments}

    _window_arguments: ClassVar[tuple[str, ...]] = ("kernel_size", "stride", "padding", "dilation")


class _MaxPool(_Pool):
    """Max pooling over {rank} spatial axes, as torch.nn.MaxPool3d (floor mode, no indices)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self._reject_unsupported("return_indices", return_indices, False)
        self._reject_unsupported("ceil_mode", ceil_mode, False)
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode
        self._window()

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input(input)
        return functional.max_pool(input, **self._window())


class _AvgPool(_Pool):
    """Average pooling over {rank} spatial axes, as torch.nn.AvgPool3d (floor mode, padding counted)."""

    _window_arguments = ("kernel_size", "stride", "padding")

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> None:
        super().__init__()
        self._reject_unsupported("ceil_mode", ceil_mode, False)
        self._reject_unsupported("count_include_pad", count_include_pad, True)
        self._reject_unsupported("divisor_override", divisor_override, None)
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override
        window = self._window()
        if self.rank == 1:  # torch's AvgPool1d stores tuples where AvgPool2d and AvgPool3d keep the arguments
            self.kernel_size, self.stride, self.padding = window["kernel_size"], window["stride"], window["padding"]

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input(input)
        return functional.avg_pool(input, **self._window())


class _SmoothMaxPool(_Pool):
    """Smooth max (log-sum-exp) pooling over {rank} spatial axes: (1/beta)·log Σ exp(beta·x) over each window,
    padding counted as zeros; beta > 0, towards max pooling as beta grows."""

    def __init__(self, kernel_size, beta: float, stride=None, padding=0, dilation=1) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.beta = beta
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.dilation = dilation
        self._window()

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, beta={self.beta}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input(input)
        return functional.smooth_max_pool(input, beta=self.beta, **self._window())


_BASES: dict[Family, type[_Layer]] = {
    Family.CONV: _Conv,
    Family.CONV_TRANSPOSE: _ConvTranspose,
    Family.MAX_POOL: _MaxPool,
    Family.AVG_POOL: _AvgPool,
    Family.SMOOTH_MAX_POOL: _SmoothMaxPool,
}


def _make_layers() -> dict[str, type[_Layer]]:
    """One class per rank-generic op of the table and rank 1..MAX_RANK: `conv_transpose` -> ConvTranspose4d."""
    layers: dict[str, type[_Layer]] = {}
    for op in OPS.values():
        if op.rank is not None:
            continue
        base = _BASES[op.family]
        stem = "".join(word.capitalize() for word in op.name.split("_"))
        for rank in range(1, MAX_RANK + 1):
            name = f"{stem}{rank}d"
            namespace = {"rank": rank, "op": op, "__module__": __name__, "__qualname__": name,
                         "__doc__": base.__doc__.format(rank=rank)}
            layers[name] = type(name, (base,), namespace)
    return layers


_LAYERS = _make_layers()
globals().update(_LAYERS)
__all__ = sorted(_LAYERS)
