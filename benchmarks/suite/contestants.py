"""The contestants: convgen's CUDA tape (in each precision of issue 11), its PyTorch adapter `convgen.torch`
(issue 10; on bfloat16 and float16 tensors too for the batched convolutions), PyTorch/cuDNN (strict fp32, TF32, bf16
channels-last for the batched cases, and the float64 reference) with the conv3d-made 4-D convolution, each a
forward and a forward+backward call on one case's inputs."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from suite.cases import Case
from suite.precision import ADAPTER_BF16, ADAPTER_FP16, DEFAULT_PRECISION, convgen_label
from suite.timing import L2_FLUSH_BYTES, CupyDevice, TorchDevice, one_line

INPUT_SEED = 20260601


def make_device_inputs(case: Case, cupy: Any) -> dict[str, Any]:
    """Random normal float32 CuPy arrays (never zeros): x, the upstream gradient, weight, bias."""
    rng = cupy.random.RandomState(INPUT_SEED)
    shapes = {"x": case.input_shape, "seed": case.output_shape}
    if case.is_conv:
        shapes |= {"weight": case.weight_shape, "bias": (case.out_c,)}
    return {name: rng.standard_normal(shape, dtype=cupy.float32) for name, shape in shapes.items()}


def random_inputs(cupy: Any, geom: Any, dtype: str, seed: int) -> tuple[tuple[Any, ...], Any]:
    """Normal values for a geometry's inputs (the backend's order) and its upstream gradient, as CuPy arrays of
    `dtype`: the float32 normals converted, bfloat16 as each one's upper half (CuPy holds it as its bits, uint16)."""
    rng = cupy.random.RandomState(seed)

    def normal(shape: tuple[int, ...]) -> Any:
        values = rng.standard_normal(shape, dtype=cupy.float32)
        return (values.view(cupy.uint32) >> 16).astype(cupy.uint16) if dtype == "bfloat16" else values.astype(dtype)
    return tuple(normal(shape) for shape in geom.parent_shapes), normal(geom.output_shape)


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
    """The convgen call a user writes for the case; returns a Result. A batch goes through the N-D
    `conv` (the 2-D calls have no batch axis)."""
    if case.is_batched:
        return lambda: tape.conv(ids["weight"], ids["bias"], ids["x"], in_c=case.in_c, out_c=case.out_c,
                                 kernel=case.kernel, stride=case.strides, padding=case.paddings,
                                 in_spatial=case.spatial, batch=case.batch)
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
    """The loaded CuPy, PyTorch and convgen modules, the L2 flush written before every user-call sample, and
    `convgen.torch` (None where it does not import: the adapter is then skipped, `adapter_skipped` says why)."""

    cupy: Any
    torch: Any
    convgen: Any
    flush_l2: Callable[[], None]
    adapter: Any = None
    adapter_skipped: str | None = None


def load_libraries(program: str) -> Libraries:
    """CuPy, PyTorch (CUDA) and convgen, or exit with a message, from `program`, saying what is missing."""
    try:
        import cupy
    except ImportError as error:
        sys.exit(f"{program}: CuPy is not importable ({error}). This benchmark needs an NVIDIA GPU "
                 "with CuPy (cupy-cuda12x or cupy-cuda13x), PyTorch with CUDA, and convgen installed.")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as error:
        sys.exit(f"{program}: no usable CUDA GPU ({one_line(error)}). Run it on a machine with an NVIDIA GPU.")
    try:
        import torch
    except ImportError as error:
        sys.exit(f"{program}: PyTorch is not importable ({error}); it is the reference and the baseline.")
    if not torch.cuda.is_available():
        sys.exit(f"{program}: this PyTorch has no CUDA (torch.cuda.is_available() is False).")
    try:
        import convgen
        import convgen.cuda
    except ImportError as error:
        sys.exit(f"{program}: convgen is not importable ({error}); install it: "
                 "python3 -m pip install --no-deps --no-build-isolation -e .")
    flush_buffer = cupy.empty(L2_FLUSH_BYTES // 4, cupy.float32)
    adapter, adapter_skipped = load_adapter()
    return Libraries(cupy=cupy, torch=torch, convgen=convgen, flush_l2=lambda: flush_buffer.fill(0),
                     adapter=adapter, adapter_skipped=adapter_skipped)


def load_adapter() -> tuple[Any, str | None]:
    """`convgen.torch` and None, or None and why it is skipped (the tape and PyTorch still run)."""
    try:
        import convgen.torch
    except Exception as error:  # an ImportError, or whatever a torch version it does not support raises
        return None, f"convgen.torch is not importable ({one_line(error)})"
    return convgen.torch, None


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
    """convgen's CUDA tape in `precision` (issue 11), labelled as `convgen_label` says; leaves recorded once,
    every call records on that (unchanged) tape."""

    def __init__(self, case: Case, inputs: dict[str, Any], convgen: Any, cupy: Any,
                 precision: str = DEFAULT_PRECISION):
        self.label = convgen_label(precision)
        tape = convgen.cuda.Tape(precision=precision)
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


@dataclass(frozen=True)
class TorchVariant:
    """How PyTorch runs a case: its label in the report, dtype, TF32 switch and memory format."""

    label: str
    dtype: str  # a torch dtype's name
    tf32: bool = False
    channels_last: bool = False  # NHWC / NDHWC where PyTorch has the format (2-D and 3-D convolutions)


TORCH_STRICT = TorchVariant("torch_strict", "float32")
TORCH_TF32 = TorchVariant("torch_tf32", "float32", tf32=True)
TORCH_BF16_CHANNELS_LAST = TorchVariant("torch_bf16_cl", "bfloat16", channels_last=True)  # autocast off
TORCH_REFERENCE = TorchVariant("torch_float64", "float64")
CHANNELS_LAST_FORMAT = {2: "channels_last", 3: "channels_last_3d"}  # by spatial rank; others stay contiguous


class TorchContestant(Contestant):
    """PyTorch on the same data, as `variant` says; an unbatched case gets a batch axis of 1."""

    def __init__(self, case: Case, inputs: dict[str, Any], torch: Any, variant: TorchVariant = TORCH_STRICT):
        self.torch, self.tf32, self.label = torch, variant.tf32, variant.label
        self.unbatched = not case.is_batched
        dtype = getattr(torch, variant.dtype)
        format_name = CHANNELS_LAST_FORMAT.get(case.rank) if variant.channels_last else None
        memory_format = getattr(torch, format_name or "contiguous_format")
        names = ("x", "weight", "bias") if case.is_conv else ("x",)

        def tensor(name: str) -> Any:
            value = torch.from_dlpack(inputs[name])
            value = value.unsqueeze(0) if self.unbatched and name in ("x", "seed") else value
            value = value.to(dtype).clone()
            return value.contiguous(memory_format=memory_format) if value.dim() == case.rank + 2 else value

        self.names = names
        self.memory_format = str(memory_format).removeprefix("torch.")
        self.inputs = [tensor(name).requires_grad_(True) for name in names]
        self.seed = tensor("seed")
        self.op = torch_op(case)
        self.device = TorchDevice(torch)

    @contextlib.contextmanager
    def active(self) -> Any:
        """TF32 on or off for cuDNN convolutions and cuBLAS matmuls (legacy flags, as asked), and cuDNN's autotuner
        on (`cudnn.benchmark`: each shape's fastest algorithm, tried at its first call, as a tuned training loop
        runs). Off, the conv4d loop's training step took 24.7 ms on an H100 host, against 4.1 tuned on another; the
        issue's reference figure (4.114 on the H200) matches the tuned one. The flags, dtype and memory format go to
        the report."""
        import warnings

        backends = self.torch.backends
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            saved = (backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32, backends.cudnn.benchmark)
            backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = self.tf32
            backends.cudnn.benchmark = True
            flags = {"cudnn.allow_tf32": backends.cudnn.allow_tf32,
                     "cuda.matmul.allow_tf32": backends.cuda.matmul.allow_tf32,
                     "cudnn.benchmark": backends.cudnn.benchmark,
                     "dtype": str(self.inputs[0].dtype).removeprefix("torch."),
                     "memory_format": self.memory_format,
                     "autocast": self.torch.is_autocast_enabled()}  # CUDA autocast, in every torch version
            conv_precision = getattr(getattr(backends.cudnn, "conv", None), "fp32_precision", None)
            if conv_precision is not None:
                flags["cudnn.conv.fp32_precision"] = conv_precision
        try:
            yield flags
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32, backends.cudnn.benchmark = saved

    def forward(self) -> Any:
        return self.op(*self.inputs)

    def forward_backward(self) -> Any:
        return self.torch.autograd.grad(self.op(*self.inputs), self.inputs, self.seed)

    def arrays_of(self, result: Any, mode: str) -> dict[str, Any]:
        """The outputs without the batch axis of 1 that an unbatched case was given."""

        def unbatch(name: str, value: Any) -> Any:
            return value[0] if self.unbatched and name in ("y", "x") else value

        if mode == "fwd":
            return {"y": unbatch("y", result)}
        return {f"grad_{name}": unbatch(name, grad) for name, grad in zip(self.names, result, strict=True)}


ADAPTER = "convgen_torch"  # convgen.torch's label in the report and the JSON
ADAPTER_LABELS = {"float32": ADAPTER, "bfloat16": ADAPTER_BF16, "float16": ADAPTER_FP16}  # by its tensors' dtype


def on_calling_thread(torch: Any, call: Callable[[], Any]) -> Callable[[], Any]:
    """`call` with autograd's backward on the calling thread (torch's thread-local switch, multithreaded backward off),
    not on its CUDA device thread."""

    def run() -> Any:
        with torch.autograd.set_multithreading_enabled(False):
            return call()
    return run


def adapter_op(case: Case, adapter: Any) -> Callable[..., Any]:
    """The `convgen.torch` call of the case, taking (x, weight, bias) or (x,) as the case has them: an
    unbatched input stays [C, *S], which the adapter accepts as torch.nn.functional does."""
    if case.is_conv:
        return lambda x, weight, bias: adapter.conv(x, weight, bias, case.strides, case.paddings)
    if case.op == "max_pool":
        return lambda x: adapter.max_pool(x, case.kernel, case.strides, case.paddings)
    return lambda x: adapter.smooth_max_pool(x, case.kernel, case.beta, case.strides, case.paddings)


class AdapterContestant(Contestant):
    """convgen.torch (issue 10) on torch copies of the same float32 inputs in `dtype` (a torch dtype's name, a
    key of ADAPTER_LABELS), every input requiring grad; 16-bit copies stay contiguous (NCHW: convgen has no
    channels-last). Forward+backward is the call torch's contestant makes, `torch.autograd.grad` of the inputs
    with the upstream gradient: the gradients are returned, as the tape returns them, and the last call's are
    freed when the timing drops them, outside the timed call, as the tape's and torch's are. With NumPy inputs
    it runs on the CPU backend."""

    def __init__(self, case: Case, inputs: dict[str, Any], torch: Any, adapter: Any, dtype: str = "float32"):
        self.torch, self.adapter, self.label = torch, adapter, ADAPTER_LABELS[dtype]
        self.dtype_name, self.dtype = dtype, getattr(torch, dtype)

        def tensor(name: str) -> Any:
            return torch.from_dlpack(inputs[name]).to(self.dtype, memory_format=torch.contiguous_format, copy=True)

        self.names = ("x", "weight", "bias") if case.is_conv else ("x",)
        self.inputs = [tensor(name).requires_grad_(True) for name in self.names]
        self.seed = tensor("seed")
        self.op = adapter_op(case, adapter)
        self.device = TorchDevice(torch)

    @contextlib.contextmanager
    def active(self) -> Any:
        """float32: convgen.torch in the tape's precision ("highest"), whatever torch's TF32 switch says. 16-bit
        tensors have no such setting (convgen.torch picks their precision from the dtype: tensor cores, exact
        for 16-bit values), so only what it picks is reported."""
        if self.dtype_name != "float32":
            precision = self.adapter.precision.conv_precision(self.dtype)
            yield {"dtype": self.dtype_name, "convgen.torch precision": f"{precision} ({self.dtype_name} tensors)"}
            return
        saved = self.adapter.get_float32_precision()
        self.adapter.set_float32_precision("highest")
        try:
            yield {"convgen.torch float32 precision": "highest"}
        finally:
            self.adapter.set_float32_precision(saved)

    def forward(self) -> Any:
        return self.op(*self.inputs)

    def forward_backward(self) -> Any:
        return self.torch.autograd.grad(self.op(*self.inputs), self.inputs, self.seed)

    def arrays_of(self, result: Any, mode: str) -> dict[str, Any]:
        if mode == "fwd":
            return {"y": result}
        return {f"grad_{name}": grad for name, grad in zip(self.names, result, strict=True)}
