"""The contestants: convgen's CUDA tape, PyTorch/cuDNN (strict fp32, TF32, and the float64 reference)
with the conv3d-made 4-D convolution, each a forward and a forward+backward call on one case's inputs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from suite.cases import Case
from suite.timing import CupyDevice, TorchDevice

INPUT_SEED = 20260601


def make_device_inputs(case: Case, cupy: Any) -> dict[str, Any]:
    """Random normal float32 CuPy arrays (never zeros): x, the upstream gradient, weight, bias."""
    rng = cupy.random.RandomState(INPUT_SEED)
    shapes = {"x": case.input_shape, "seed": case.output_shape}
    if case.is_conv:
        shapes |= {"weight": case.weight_shape, "bias": (case.out_c,)}
    return {name: rng.standard_normal(shape, dtype=cupy.float32) for name, shape in shapes.items()}


def conv4d_by_conv3d(x: Any, weight: Any, bias: Any, stride: tuple[int, ...], padding: tuple[int, ...]) -> Any:
    """A real 4-D convolution (cross-correlation, as torch's convNd) made of conv3d calls.

    x [N, C, D0, D1, D2, D3], weight [O, C, k0, k1, k2, k3]. Output position o0 along the first
    axis sees input cells o0*s0 + κ0 - p0: for each κ0 one conv3d with weight[:, :, κ0] over the
    slab of those cells, batched over o0 (the first axis is padded explicitly), and the k0 partial
    results summed. Autograd differentiates it like any torch code.
    """
    import torch.nn.functional as F

    k0, s0, p0 = weight.shape[2], stride[0], padding[0]
    padded = F.pad(x, (0, 0, 0, 0, 0, 0, p0, p0))
    n, c_in, d0 = padded.shape[:3]
    out0 = (d0 - k0) // s0 + 1
    total = None
    for kappa in range(k0):
        slab = padded[:, :, kappa : kappa + s0 * (out0 - 1) + 1 : s0]
        batch = slab.permute(0, 2, 1, 3, 4, 5).reshape(n * out0, c_in, *padded.shape[3:])
        part = F.conv3d(batch, weight[:, :, kappa], None, stride[1:], padding[1:])
        total = part if total is None else total + part
    out = total.reshape(n, out0, *total.shape[1:]).permute(0, 2, 1, 3, 4, 5).contiguous()
    return out + bias.view(1, -1, 1, 1, 1, 1)


def smooth_max_pool2d_by_unfold(x: Any, beta: float, k: int, stride: int, padding: int) -> Any:
    """(1/β)·log Σ exp(β·v) over each k×k window, padded cells taking part as zeros (SEMANTICS §3)."""
    import torch
    import torch.nn.functional as F

    n, c, h, w = x.shape
    out_h, out_w = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
    windows = F.unfold(x, k, padding=padding, stride=stride).view(n, c, k * k, out_h * out_w)
    return (torch.logsumexp(beta * windows, dim=2) / beta).view(n, c, out_h, out_w)


def torch_op(case: Case) -> Callable[..., Any]:
    """The PyTorch computation of the case, taking (x, weight, bias) or (x,) with a batch axis."""
    import torch.nn.functional as F

    if case.is_conv:
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d, 4: conv4d_by_conv3d}[case.rank]
        return lambda x, weight, bias: conv(x, weight, bias, case.strides, case.paddings)
    if case.op == "max_pool":
        return lambda x: F.max_pool2d(x, case.k, case.stride, case.padding)
    return lambda x: smooth_max_pool2d_by_unfold(x, case.beta, case.k, case.stride, case.padding)


def convgen_op(case: Case, tape: Any, ids: dict[str, int]) -> Callable[[], Any]:
    """The convgen call a user writes for the case; returns a Result."""
    if case.is_conv and case.rank == 2:
        (in_h, in_w) = case.spatial
        return lambda: tape.conv2d(ids["weight"], ids["bias"], ids["x"], in_c=case.in_c, out_c=case.out_c,
                                   k_h=case.k, k_w=case.k, stride=case.stride, padding=case.padding,
                                   in_h=in_h, in_w=in_w)
    if case.is_conv:
        return lambda: tape.conv(ids["weight"], ids["bias"], ids["x"], in_c=case.in_c, out_c=case.out_c,
                                 kernel=case.kernel, stride=case.strides, padding=case.paddings,
                                 in_spatial=case.spatial)
    (in_h, in_w) = case.spatial
    if case.op == "max_pool":
        return lambda: tape.max_pool2d_pad(ids["x"], k_h=case.k, k_w=case.k, in_h=in_h, in_w=in_w,
                                           in_c=case.in_c, stride=case.stride, padding=case.padding)
    return lambda: tape.smooth_max_pool2d_pad(ids["x"], case.beta, k_h=case.k, k_w=case.k, in_h=in_h,
                                              in_w=in_w, in_c=case.in_c, stride=case.stride,
                                              padding=case.padding)


@dataclass
class Libraries:
    """The loaded CuPy, PyTorch and convgen modules, and the L2 flush written before every user-call sample."""

    cupy: Any
    torch: Any
    convgen: Any
    flush_l2: Callable[[], None]


MODES = ("fwd", "fwd_bwd")


class Contestant:
    """A library's forward and forward+backward calls on one case; `arrays_of` names their outputs."""

    label: str
    device: CupyDevice | TorchDevice  # both also measure peak memory

    def forward(self) -> Any: ...

    def forward_backward(self) -> Any: ...

    def arrays_of(self, result: Any, mode: str) -> dict[str, Any]: ...

    def active(self) -> Any:
        return contextlib.nullcontext({})

    def call_for(self, mode: str) -> Callable[[], Any]:
        return self.forward if mode == "fwd" else self.forward_backward


class ConvgenContestant(Contestant):
    """convgen's CUDA tape, leaves recorded once; every call records on that (unchanged) tape."""

    label = "convgen"

    def __init__(self, case: Case, inputs: dict[str, Any], convgen: Any, cupy: Any):
        tape = convgen.cuda.Tape()
        self.ids: dict[str, int] = {}
        for name in ("weight", "bias", "x") if case.is_conv else ("x",):
            tape, self.ids[name] = tape.leaf(inputs[name])
        self.tape, self.seed = tape, inputs["seed"]
        self.op = convgen_op(case, tape, self.ids)
        self.device = CupyDevice(cupy)

    def forward(self) -> Any:
        return self.op().unwrap()

    def backward(self, forward_result: Any) -> Any:
        tape, out = forward_result
        return tape.backward(out, self.seed).unwrap()

    def forward_backward(self) -> Any:
        return self.backward(self.forward())

    def arrays_of(self, result: Any, mode: str) -> dict[str, Any]:
        if mode == "fwd":
            tape, out = result
            return {"y": tape.value(out)}
        return {f"grad_{name}": result[node] for name, node in self.ids.items()}


class TorchContestant(Contestant):
    """PyTorch on the same data, with a batch axis of 1; strict fp32, TF32 or (reference) float64."""

    def __init__(self, case: Case, inputs: dict[str, Any], torch: Any, *, tf32: bool = False,
                 dtype: Any = None):
        self.torch, self.tf32 = torch, tf32
        self.label = "torch_tf32" if tf32 else "torch_strict"
        dtype = dtype or torch.float32
        names = ("x", "weight", "bias") if case.is_conv else ("x",)

        def tensor(name: str) -> Any:
            value = torch.from_dlpack(inputs[name])
            value = value.unsqueeze(0) if name in ("x", "seed") else value
            return value.to(dtype).clone()

        self.names = names
        self.inputs = [tensor(name).requires_grad_(True) for name in names]
        self.seed = tensor("seed")
        self.op = torch_op(case)
        self.device = TorchDevice(torch)

    @contextlib.contextmanager
    def active(self) -> Any:
        """TF32 on or off for cuDNN convolutions and cuBLAS matmuls (legacy flags, as asked)."""
        import warnings

        backends = self.torch.backends
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            saved = (backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32)
            backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = self.tf32
            flags = {"cudnn.allow_tf32": backends.cudnn.allow_tf32,
                     "cuda.matmul.allow_tf32": backends.cuda.matmul.allow_tf32,
                     "cudnn.benchmark": backends.cudnn.benchmark}
            conv_precision = getattr(getattr(backends.cudnn, "conv", None), "fp32_precision", None)
            if conv_precision is not None:
                flags["cudnn.conv.fp32_precision"] = conv_precision
        try:
            yield flags
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32 = saved

    def forward(self) -> Any:
        return self.op(*self.inputs)

    def forward_backward(self) -> Any:
        return self.torch.autograd.grad(self.op(*self.inputs), self.inputs, self.seed)

    def arrays_of(self, result: Any, mode: str) -> dict[str, Any]:
        if mode == "fwd":
            return {"y": result[0]}
        return {f"grad_{name}": grad[0] if name == "x" else grad for name, grad in zip(self.names, result, strict=True)}
