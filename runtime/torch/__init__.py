"""convgen.torch: N-D convolution and pooling (ranks 1..8) as PyTorch ops and layers.

The functional ops (`conv`, `conv_transpose`, `max_pool`, `avg_pool`, `smooth_max_pool`) follow
torch.nn.functional's conventions; `convgen.torch.nn` has the layers. They are torch.library custom ops
in the `convgen` namespace (convgen.torch.library), with autograd and fakes for torch.compile. CPU
tensors run on the NumPy backend, CUDA tensors on the generated kernels (CuPy, imported only then).
On float32 tensors the convolutions follow torch's TF32 switch for its own convolutions
(`torch.backends.cudnn.allow_tf32`, or `torch.backends.cudnn.conv.fp32_precision`) unless
`set_float32_precision` says otherwise (docs/torch.md, Precision). Needs torch: `pip install 'convgen[torch]'`.
"""

from __future__ import annotations

import importlib
from typing import Any

from convgen.torch import functional, library, precision
from convgen.torch.functional import avg_pool, conv, conv_transpose, max_pool, smooth_max_pool
from convgen.torch.precision import get_float32_precision, set_float32_precision

__all__ = ["avg_pool", "conv", "conv_transpose", "functional", "get_float32_precision", "library", "max_pool", "nn",
           "precision", "set_float32_precision", "smooth_max_pool"]


def __getattr__(name: str) -> Any:
    """`convgen.torch.nn` loads on first use (its 40 layer classes are made at import)."""
    if name == "nn":
        return importlib.import_module("convgen.torch.nn")
    raise AttributeError(f"module 'convgen.torch' has no attribute {name!r}")
