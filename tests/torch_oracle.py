"""torch.nn.functional as an outside oracle for ranks 1..3: the output and the input gradients of
one op (with a batch axis of 1), on the CPU in float64 or on the GPU in float32."""

from __future__ import annotations

import numpy as np
from convgen.geometry import Family, Geometry

FAMILIES = (Family.CONV, Family.CONV_TRANSPOSE, Family.MAX_POOL, Family.AVG_POOL)


def accepts(geom: Geometry) -> bool:
    """Torch refuses an empty input axis even where padding gives an output, and avg_pool3d an
    unpadded input smaller than the kernel."""
    if 0 in geom.in_spatial:
        return False
    return geom.family is not Family.AVG_POOL or geom.rank != 3 or all(
        n >= k for n, k in zip(geom.in_spatial, geom.kernel))


def run(torch, geom: Geometry, inputs, grad, device: str = "cpu") -> tuple[np.ndarray, list[np.ndarray]]:
    """Forward and backward of `geom` through torch; float64 on the CPU, float32 on a GPU."""
    functional = torch.nn.functional
    dtype = torch.float64 if device == "cpu" else torch.float32
    leaves = [torch.tensor(np.asarray(a), dtype=dtype, device=device, requires_grad=True) for a in inputs]
    rank, geometry = geom.rank, dict(stride=geom.stride, padding=geom.padding)
    if geom.family.is_conv:
        weight, bias, x = leaves
        op = getattr(functional, f"conv{rank}d" if geom.family is Family.CONV else f"conv_transpose{rank}d")
        out = op(x[None], weight, bias, **geometry)
    elif geom.family is Family.MAX_POOL:
        out = getattr(functional, f"max_pool{rank}d")(leaves[0][None], geom.kernel, **geometry)
    else:
        out = getattr(functional, f"avg_pool{rank}d")(leaves[0][None], geom.kernel, count_include_pad=True,
                                                      **geometry)
    out[0].backward(torch.tensor(np.asarray(grad), dtype=dtype, device=device))
    return out[0].detach().cpu().numpy(), [leaf.grad.cpu().numpy() for leaf in leaves]
