"""How convgen.torch's convolutions multiply float32 tensors (docs/torch.md, Precision).

The precisions are the tape's (convgen.backend.PRECISIONS): "highest" (float32 FMAs), "high" (3xTF32,
float32 accuracy on the tensor cores) and "medium" (TF32). By default convgen follows the switch PyTorch
users already set for torch's own CUDA convolutions: TF32 ("medium") where cuDNN would use TF32, else
"highest". `set_float32_precision` overrides it. float64 tensors always run "highest"; float16 and
bfloat16 tensors "medium", as cuDNN runs them on its tensor cores (their values are exact in TF32, and
the products are summed in float32).

The precision is chosen per call, from the tensors' dtype alone: it travels as an argument of the custom
ops (so torch.compile records it) down to the device layer. The CPU backend computes every precision as
"highest", so on CPU tensors it does not change the result.
"""

from __future__ import annotations

import torch
from convgen.backend import PRECISIONS
from convgen.checking import describe
from convgen.torch.devices import HALF_DTYPES

__all__ = ["check_precision", "conv_precision", "get_float32_precision", "set_float32_precision",
           "torch_conv_uses_tf32"]

# convgen's own setting for float32 convolutions; None follows torch (torch_conv_uses_tf32).
_float32_precision: str | None = None


def set_float32_precision(precision: str | None) -> None:
    """How convgen's float32 convolutions multiply from now on: "highest" (FMAs), "high" (3xTF32),
    "medium" (TF32), or None to follow torch's switch for its own CUDA convolutions (the default)."""
    global _float32_precision
    if precision is not None and not _known(precision):
        raise ValueError(f"convgen.torch.set_float32_precision: precision must be {_choices(PRECISIONS + (None,))}, "
                         f"got {describe(precision)}")
    _float32_precision = precision


def check_precision(op: str, precision: object) -> None:
    """ValueError naming convgen.torch.`op` unless `precision` is one of PRECISIONS (a custom op's argument)."""
    if not _known(precision):
        raise ValueError(f"convgen.torch.{op}: precision must be {_choices(PRECISIONS)}, got {describe(precision)}")


def _known(precision: object) -> bool:
    return isinstance(precision, str) and precision in PRECISIONS


def _choices(values: tuple[object, ...]) -> str:
    """'a', 'b' or 'c', as messages list the values an argument takes."""
    return ", ".join(repr(v) for v in values[:-1]) + f" or {values[-1]!r}"


def get_float32_precision() -> str | None:
    """convgen's own setting (set_float32_precision): a precision, or None when it follows torch."""
    return _float32_precision


def torch_conv_uses_tf32() -> bool:
    """Whether torch would run its own float32 CUDA convolutions (cuDNN) in TF32.

    torch 2.9 and newer keep per-operation switches, each "ieee", "tf32" or "none" (take the parent's):
    torch.backends.cudnn.conv.fp32_precision, then torch.backends.cudnn.fp32_precision, then
    torch.backends.fp32_precision, resolved here as torch resolves them; the legacy
    torch.backends.cudnn.allow_tf32 sets the first. They are read with the C getter behind those
    attributes, which every float32 convolution call asks (0.2 µs against 3 µs through the attributes on
    the development machine). Older torch has only allow_tf32.
    """
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    if getter is None:
        return bool(torch.backends.cudnn.allow_tf32)
    for backend, operation in _TF32_SWITCHES:
        setting = getter(backend, operation)
        if setting != "none":
            return setting == "tf32"
    return False


# The switches of torch_conv_uses_tf32 as the C getter names them (backend, operation), most specific first:
# torch.backends.cudnn.conv, torch.backends.cudnn, torch.backends.
_TF32_SWITCHES = (("cuda", "conv"), ("cuda", "all"), ("generic", "all"))


@torch.compiler.assume_constant_result
def _torch_precision() -> str:
    """torch's switch as a precision. Under torch.compile it is read once, when the graph is traced
    (torch's flags are C++ state that dynamo cannot trace or guard)."""
    return "medium" if torch_conv_uses_tf32() else "highest"


def conv_precision(dtype: torch.dtype) -> str:
    """The precision of a convolution on tensors of `dtype`: float64 "highest"; float16 and bfloat16
    "medium"; float32 convgen's setting, or torch's switch when there is none."""
    if dtype in HALF_DTYPES:
        return "medium"
    if dtype != torch.float32:
        return "highest"
    return _float32_precision if _float32_precision is not None else _torch_precision()
