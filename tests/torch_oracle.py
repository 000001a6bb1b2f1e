"""torch.nn.functional as an outside oracle for ranks 1..3: the output and the input gradients of
one op (batched as the geometry says, or with a batch axis of 1 added and removed), with SEMANTICS
§8's dilation, groups, circular padding and output padding, on the CPU in float64 or on the GPU in
float32."""

from __future__ import annotations

import numpy as np
from convgen.geometry import Family, Geometry

FAMILIES = (Family.CONV, Family.CONV_TRANSPOSE, Family.MAX_POOL, Family.AVG_POOL)


def accepts(geom: Geometry) -> bool:
    """Torch refuses an empty input axis even where padding gives an output, an empty output, avg_pool3d
    an unpadded input smaller than the kernel, a pool padding past half the undilated kernel or a
    dilated max pool window of padding only; its avg_pool has no dilation."""
    if 0 in geom.in_spatial or 0 in geom.out_spatial:  # torch rejects windows that do not fit
        return False
    if geom.family is Family.MAX_POOL:  # torch's backward writes out of bounds for a window of padding only
        return all(p <= k // 2 for p, k in zip(geom.padding, geom.kernel)) and all(
            any(0 <= o * s + kappa * d - p < n for kappa in range(k)) for n, m, k, s, p, d in
            zip(geom.in_spatial, geom.out_spatial, geom.kernel, geom.stride, geom.padding, geom.dilation)
            for o in range(m))
    if geom.family is Family.AVG_POOL:
        undilated = all(d == 1 for d in geom.dilation)
        half_kernel_padding = all(p <= k // 2 for p, k in zip(geom.padding, geom.kernel))
        return undilated and half_kernel_padding and (
            geom.rank != 3 or all(n >= k for n, k in zip(geom.in_spatial, geom.kernel)))
    return True


def _forward(functional, geom: Geometry, leaves):
    """The op on a batched input."""
    rank, stride, padding, dilation = geom.rank, geom.stride, geom.padding, geom.dilation
    if geom.family is Family.CONV:
        weight, bias, x = leaves
        if geom.circular:  # torch's conv pads with zeros only: wrap first, then no padding
            x = functional.pad(x, [p for p in reversed(padding) for _ in range(2)], mode="circular")
            padding = (0,) * rank
        return getattr(functional, f"conv{rank}d")(x, weight, bias, stride, padding, dilation, geom.groups)
    if geom.family is Family.CONV_TRANSPOSE:
        weight, bias, x = leaves
        return getattr(functional, f"conv_transpose{rank}d")(x, weight, bias, stride, padding, geom.output_padding,
                                                             geom.groups, dilation)
    (x,) = leaves
    if geom.family is Family.MAX_POOL:
        return getattr(functional, f"max_pool{rank}d")(x, geom.kernel, stride, padding, dilation)
    return getattr(functional, f"avg_pool{rank}d")(x, geom.kernel, stride, padding, count_include_pad=True)


def run(torch, geom: Geometry, inputs, grad, device: str = "cpu") -> tuple[np.ndarray, list[np.ndarray]]:
    """Forward and backward of `geom` through torch; float64 on the CPU, float32 on a GPU."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    leaves = [torch.tensor(np.asarray(a), dtype=dtype, device=device, requires_grad=True) for a in inputs]
    batched = geom.batch is not None
    out = _forward(torch.nn.functional, geom, [*leaves[:-1], leaves[-1] if batched else leaves[-1][None]])
    out = out if batched else out[0]
    out.backward(torch.tensor(np.asarray(grad), dtype=dtype, device=device))
    return out.detach().cpu().numpy(), [leaf.grad.cpu().numpy() for leaf in leaves]
