"""convgen.torch: N-D convolution and pooling (ranks 1..8) as PyTorch ops and layers.

The functional ops (`conv`, `conv_transpose`, `max_pool`, `avg_pool`, `smooth_max_pool`) follow
torch.nn.functional's conventions; `convgen.torch.nn` has the layers. They are torch.library custom ops
in the `convgen` namespace (convgen.torch.library), with autograd and fakes for torch.compile. CPU
tensors run on the NumPy backend, CUDA tensors on the generated kernels (CuPy, imported only then).
Needs torch: `pip install 'convgen[torch]'`.
"""

from __future__ import annotations

import importlib
from typing import Any

from convgen.torch import functional, library
from convgen.torch.functional import avg_pool, conv, conv_transpose, max_pool, smooth_max_pool

__all__ = ["avg_pool", "conv", "conv_transpose", "functional", "library", "max_pool", "nn", "smooth_max_pool"]


def __getattr__(name: str) -> Any:
    """`convgen.torch.nn` loads on first use (its 40 layer classes are made at import)."""
    if name == "nn":
        return importlib.import_module("convgen.torch.nn")
    raise AttributeError(f"module 'convgen.torch' has no attribute {name!r}")
