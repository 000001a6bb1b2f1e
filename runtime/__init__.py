"""convgen: a differentiable convolution and pooling tape over generated, rank-specialised CUDA.

`convgen.cpu.Tape()` runs on NumPy, `convgen.cuda.Tape()` on the GPU through CuPy; both expose the
same thirteen ops. Importing convgen needs only NumPy; CuPy is imported when a CUDA tape is made.
"""

from __future__ import annotations

import importlib
from typing import Any

from convgen.result import Result, TapeError

__all__ = ["Result", "TapeError", "cpu", "cuda"]
__version__ = "0.1.0"

_SUBMODULES = ("cpu", "cuda")


def __getattr__(name: str) -> Any:
    """`convgen.cpu` and `convgen.cuda` load on first use, so `import convgen` stays light."""
    if name in _SUBMODULES:
        return importlib.import_module(f"convgen.{name}")
    raise AttributeError(f"module 'convgen' has no attribute {name!r}")
