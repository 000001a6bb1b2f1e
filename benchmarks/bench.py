#!/usr/bin/env python3
"""Time convgen's CUDA tape against PyTorch/cuDNN (and JAX for the 4-D conv) on the cases of
DESIGN.md "Figures to beat": one image, float32, channels first.

Every case is first checked against a float64 PyTorch reference, then timed forward and
forward+backward in two ways: (a) the call as a user makes it (CUDA events around the Python call,
GPU idle and L2 flushed before it, median of many) and (b) the kernels alone (CUDA-graph replay,
or N back-to-back calls / N where a graph cannot be captured, which the output says). PyTorch runs
with TF32 off (strict fp32) and on. Also measured: peak device memory of the op, and, in child
processes, the first-call compile time (fresh CuPy kernel cache) and the warm-disk-cache load time.
Prints a markdown table last and writes everything to JSON.

    python benchmarks/bench.py [--quick] [--json PATH] [--cases NAME,...]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
CHILD_RESULT_MARKER = "BENCH_CHILD_RESULT "
MISMATCH_REL_ERR = 1e-4  # float32 lands far under this; TF32 lands near 3e-4
REPLAY_CHECK_REL_ERR = 1e-3  # a graph replay must rewrite its poisoned outputs to (about) the eager values
L2_FLUSH_BYTES = 256 << 20  # written before every user-call sample: several times the H200's L2
GRAPH_COPIES_MAX = 10  # calls per captured graph, to hide the graph-launch gap behind small kernels
GRAPH_MEMORY_BUDGET = 2 << 30  # ... unless the copies' buffers would exceed this
INPUT_SEED = 20260601
FP32_FMA_FLOPS = 50.8e12  # H200 figures used by DESIGN.md for the physical floor
HBM_BYTES_PER_S = 4.07e12


# --------------------------------------------------------------------------------------------
# The cases


@dataclass(frozen=True)
class Case:
    """One benchmark geometry. Kernel, stride and padding are the same on every spatial axis."""

    name: str  # for --cases and the JSON
    title: str  # as DESIGN.md writes it
    op: str  # "conv", "max_pool" or "smooth_max_pool"
    in_c: int
    out_c: int  # equals in_c for the pools
    spatial: tuple[int, ...]
    k: int
    stride: int
    padding: int
    beta: float = 0.0  # smooth max pool only

    @property
    def rank(self) -> int:
        return len(self.spatial)

    @property
    def is_conv(self) -> bool:
        return self.op == "conv"

    @property
    def kernel(self) -> tuple[int, ...]:
        return (self.k,) * self.rank

    @property
    def strides(self) -> tuple[int, ...]:
        return (self.stride,) * self.rank

    @property
    def paddings(self) -> tuple[int, ...]:
        return (self.padding,) * self.rank

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple((n + 2 * self.padding - self.k) // self.stride + 1 for n in self.spatial)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_c, *self.spatial)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.out_c, *self.out_spatial)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        return (self.out_c, self.in_c, *self.kernel)

    @property
    def io_bytes(self) -> int:
        """Input plus output, each once (the bandwidth figure of the pool cases)."""
        return 4 * (math.prod(self.input_shape) + math.prod(self.output_shape))

    @property
    def floor_us(self) -> float:
        """DESIGN.md's physical floor of the forward: fp32 FMA rate or HBM bandwidth, whichever binds."""
        moved = self.io_bytes
        flops = 0
        if self.is_conv:
            moved += 4 * (math.prod(self.weight_shape) + self.out_c)
            flops = 2 * math.prod(self.output_shape) * self.in_c * math.prod(self.kernel)
        return 1e6 * max(flops / FP32_FMA_FLOPS, moved / HBM_BYTES_PER_S)


CASES = (
    Case("conv2d_64_56", "conv2d 64→64 56×56 k3 p1", "conv", 64, 64, (56, 56), 3, 1, 1),
    Case("conv2d_3_224_k7", "conv2d 3→64 224×224 k7 s2 p3", "conv", 3, 64, (224, 224), 7, 2, 3),
    Case("conv2d_256_14", "conv2d 256→256 14×14 k3 p1", "conv", 256, 256, (14, 14), 3, 1, 1),
    Case("conv2d_128_128", "conv2d 128→128 128×128 k3 p1", "conv", 128, 128, (128, 128), 3, 1, 1),
    Case("conv3d_32_32", "conv3d 32→32 32³ k3 p1", "conv", 32, 32, (32, 32, 32), 3, 1, 1),
    Case("conv1d_64_4096", "conv1d 64→64 4096 k5 p2", "conv", 64, 64, (4096,), 5, 1, 2),
    Case("conv4d_8_16", "conv4d 8→8 16⁴ k3 p1", "conv", 8, 8, (16, 16, 16, 16), 3, 1, 1),
    Case("maxpool2d_1024", "max pool 2d C64 1024² k3 s1 p1", "max_pool", 64, 64, (1024, 1024), 3, 1, 1),
    Case("smoothmax2d_1024", "smooth max 2d C64 1024² k3 s1 p1 β=1", "smooth_max_pool", 64, 64,
         (1024, 1024), 3, 1, 1, beta=1.0),
)
CASES_BY_NAME = {case.name: case for case in CASES}


@dataclass(frozen=True)
class Settings:
    """How long to measure. A measurement takes `target_s / estimate` samples, clamped to
    [min_reps, max_reps]; if that would take over `cap_s`, fewer (never under floor_reps)."""

    warmup_calls: int
    min_reps: int
    max_reps: int
    target_s: float
    cap_s: float
    floor_reps: int
    kernel_rounds: int  # kernels alone: median over rounds of back-to-back launches
    round_target_s: float
    compile_child_timeout_s: int
    jax_child_timeout_s: int  # the JAX backward is known to abort; it must not hang the run either

    def reps_for(self, estimate_s: float) -> int:
        reps = min(max(round(self.target_s / max(estimate_s, 1e-7)), self.min_reps), self.max_reps)
        if reps * estimate_s > self.cap_s:
            reps = max(self.floor_reps, int(self.cap_s / max(estimate_s, 1e-7)))
        return reps


FULL = Settings(warmup_calls=5, min_reps=50, max_reps=200, target_s=0.4, cap_s=3.0, floor_reps=10,
                kernel_rounds=10, round_target_s=0.02, compile_child_timeout_s=180, jax_child_timeout_s=90)
QUICK = Settings(warmup_calls=2, min_reps=10, max_reps=30, target_s=0.05, cap_s=0.5, floor_reps=3,
                 kernel_rounds=3, round_target_s=0.01, compile_child_timeout_s=120, jax_child_timeout_s=60)


# --------------------------------------------------------------------------------------------
# Inputs and the reference implementations


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


def relative_error(actual: Any, expected: Any) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64; inf for a shape mismatch or a non-finite value."""
    import numpy as np

    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if actual.size != expected.size:
        return math.inf
    diff = np.linalg.norm(actual.reshape(expected.shape) - expected)
    scale = np.linalg.norm(expected)
    error = float(diff / scale) if scale > 0 else float(diff)
    return error if math.isfinite(error) else math.inf


# --------------------------------------------------------------------------------------------
# Devices: timing, graph capture and memory primitives, one class per library


@dataclass
class Captured:
    """A captured CUDA graph of `len(kept)` calls; `kept` holds their results (the graph's buffers)."""

    replay: Callable[[], None]
    kept: list
    context: Callable[[], Any]  # makes the replay stream current, so that events land on it


class CupyDevice:
    """CuPy's current stream, where convgen's tape launches."""

    library = "cupy"

    def __init__(self, cupy: Any):
        self.cupy = cupy

    def synchronize(self) -> None:
        self.cupy.cuda.Device().synchronize()

    def wait(self, result: Any) -> None:
        self.synchronize()

    def start_timer(self) -> Any:
        start, end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        start.record()
        return start, end

    def stop_timer(self, timer: Any, last_result: Any) -> float:
        start, end = timer
        end.record()
        end.synchronize()
        return self.cupy.cuda.get_elapsed_time(start, end)

    def to_numpy(self, array: Any) -> Any:
        return self.cupy.asnumpy(array)

    def poison(self, array: Any) -> None:
        array.fill(math.nan)

    def capture(self, call: Callable[[], Any], copies: int) -> Captured:
        stream = self.cupy.cuda.Stream(non_blocking=True)
        with stream:
            call()  # once on this stream first: the memory pool keeps free blocks per stream
            stream.synchronize()
            stream.begin_capture()
            try:
                kept = [call() for _ in range(copies)]
            except BaseException:
                with contextlib.suppress(Exception):
                    stream.end_capture()
                raise
            graph = stream.end_capture()
        return Captured(replay=lambda: graph.launch(stream=stream), kept=kept, context=lambda: stream)

    def peak_memory(self, call: Callable[[], Any]) -> dict[str, int]:
        """Peak bytes the call holds in CuPy's pool at once (a memory hook), and the device-wide
        growth of used memory from an emptied pool (cudaMemGetInfo)."""
        cupy = self.cupy

        class PeakHook(cupy.cuda.MemoryHook):
            name = "convgen_bench_peak"

            def __init__(self) -> None:
                self.current = self.peak = 0

            def malloc_postprocess(self, **kw: Any) -> None:
                if kw.get("mem_ptr"):
                    self.current += kw["mem_size"]
                    self.peak = max(self.peak, self.current)

            def free_postprocess(self, **kw: Any) -> None:
                self.current -= kw["mem_size"]

        self.synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        free_before = cupy.cuda.runtime.memGetInfo()[0]
        with PeakHook() as hook:
            result = call()
            self.synchronize()
        free_after = cupy.cuda.runtime.memGetInfo()[0]
        del result
        return {"peak_bytes": hook.peak, "device_growth_bytes": free_before - free_after}


class TorchDevice:
    """PyTorch's current stream."""

    library = "torch"

    def __init__(self, torch: Any):
        self.torch = torch

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def wait(self, result: Any) -> None:
        self.synchronize()

    def start_timer(self) -> Any:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        return start, end

    def stop_timer(self, timer: Any, last_result: Any) -> float:
        start, end = timer
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def to_numpy(self, array: Any) -> Any:
        return array.detach().cpu().numpy()

    def poison(self, array: Any) -> None:
        array.detach().fill_(math.nan)

    def capture(self, call: Callable[[], Any], copies: int) -> Captured:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's docs ask
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kept = [call() for _ in range(copies)]
        return Captured(replay=graph.replay, kept=kept, context=contextlib.nullcontext)

    def peak_memory(self, call: Callable[[], Any]) -> dict[str, int]:
        torch = self.torch
        self.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        free_before = torch.cuda.mem_get_info()[0]
        result = call()
        self.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        free_after = torch.cuda.mem_get_info()[0]
        del result
        return {"peak_bytes": peak, "device_growth_bytes": free_before - free_after}


class JaxDevice:
    """JAX (child processes only): host clock around calls that block until their result is ready."""

    library = "jax"

    def __init__(self, jax: Any):
        self.jax = jax

    def synchronize(self) -> None:
        pass  # every timed call blocks on its own result

    def wait(self, result: Any) -> None:
        self.jax.block_until_ready(result)

    def start_timer(self) -> Any:
        return time.perf_counter()

    def stop_timer(self, timer: Any, last_result: Any) -> float:
        self.wait(last_result)
        return 1e3 * (time.perf_counter() - timer)

    def capture(self, call: Callable[[], Any], copies: int) -> Captured:
        raise NotImplementedError("JAX dispatches asynchronously; no graph capture here")


# --------------------------------------------------------------------------------------------
# The timing harness


def time_user_calls(device: Any, call: Callable[[], Any], settings: Settings,
                    flush_l2: Callable[[], None]) -> dict[str, Any]:
    """The call as a user makes it: GPU idle and L2 flushed, events around the Python call."""
    warm = []
    for _ in range(settings.warmup_calls):
        device.synchronize()
        started = time.perf_counter()
        device.wait(call())
        warm.append(time.perf_counter() - started)
        if sum(warm) > settings.cap_s / 2:
            break
    reps = settings.reps_for(min(warm))
    samples = []
    for _ in range(reps):
        flush_l2()
        device.synchronize()
        timer = device.start_timer()
        result = call()
        samples.append(device.stop_timer(timer, result))
        del result
    return summarize(samples, method="events around the Python call (GPU idle, L2 flushed)")


def verify_replay(device: Any, captured: Captured, arrays_of: Callable[[Any], dict[str, Any]],
                  expected: dict[str, Any]) -> str:
    """Poison the first captured call's outputs, replay, and compare with the eager values: a graph
    that did not capture the work (launches on another stream) leaves the poison there."""
    arrays = arrays_of(captured.kept[0])
    for array in arrays.values():
        device.poison(array)
    poisoned = all(math.isnan(float(device.to_numpy(array.reshape(-1)[:1])[0]))
                   for array in arrays_of(captured.kept[0]).values())
    with captured.context():
        captured.replay()
    device.synchronize()
    for name, array in arrays_of(captured.kept[0]).items():
        error = relative_error(device.to_numpy(array), expected[name])
        if not error <= REPLAY_CHECK_REL_ERR:
            raise RuntimeError(f"graph replay did not recompute {name} (rel err {error:.2g} against the eager call)")
    return "verified" if poisoned else "outputs not writable, replay unverified"


def time_kernels(device: Any, call: Callable[[], Any], settings: Settings, copies: int,
                 arrays_of: Callable[[Any], dict[str, Any]], expected: dict[str, Any]) -> dict[str, Any]:
    """The kernels alone: replays of a CUDA graph holding `copies` calls, or, where capture fails,
    N back-to-back calls / N (then host overhead counts wherever it exceeds the GPU time)."""
    captured = None
    try:
        captured = device.capture(call, copies)
        check = verify_replay(device, captured, arrays_of, expected)
        launch, calls_per_launch, context = captured.replay, copies, captured.context
        method = f"CUDA graph replay, {copies} call(s) per graph, {check}"
    except Exception as error:
        captured = None
        device.synchronize()
        launch, calls_per_launch, context = call, 1, contextlib.nullcontext
        method = f"back-to-back calls / N (no graph: {one_line(error)})"
    with context():
        launch()
        device.synchronize()
        timer = device.start_timer()
        last = launch()
        estimate_s = device.stop_timer(timer, last) / 1e3
        launches = min(max(round(settings.round_target_s / max(estimate_s, 1e-7)), 1), 1000)
        rounds = settings.kernel_rounds if estimate_s * launches * settings.kernel_rounds < settings.cap_s else 3
        samples = []
        for _ in range(rounds):
            device.synchronize()
            timer = device.start_timer()
            for _ in range(launches):
                last = launch()
            samples.append(device.stop_timer(timer, last) / (launches * calls_per_launch))
    del captured
    device.synchronize()
    return summarize(samples, method=method) | {"calls_per_round": launches * calls_per_launch}


def summarize(samples_ms: list[float], method: str) -> dict[str, Any]:
    ordered = sorted(samples_ms)
    return {"median_ms": statistics.median(ordered), "min_ms": ordered[0],
            "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "samples": len(ordered),
            "method": method}


def graph_copies(case: Case) -> int:
    return max(1, min(GRAPH_COPIES_MAX, GRAPH_MEMORY_BUDGET // (4 * case.io_bytes)))


def one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------------------------
# Contestants: one object per library, each with a forward and a forward+backward call


MODES = ("fwd", "fwd_bwd")


class Contestant:
    """A library's forward and forward+backward calls on one case; `arrays_of` names their outputs."""

    label: str
    device: Any

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


# --------------------------------------------------------------------------------------------
# One case


@dataclass
class Libraries:
    cupy: Any
    torch: Any
    convgen: Any
    flush_l2: Callable[[], None]


@dataclass
class CaseReport:
    case: Case
    check: dict[str, dict[str, float]] = field(default_factory=dict)
    timings: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # label -> mode -> kind
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)
    compile: dict[str, Any] = field(default_factory=dict)
    jax: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def error(self, where: str, error: BaseException) -> None:
        self.errors.append(f"{where}: {one_line(error)}")
        print(f"    ! {where}: {one_line(error)}", flush=True)

    def worst_error(self, label: str) -> float | None:
        errors = self.check.get(label)
        return max(errors.values()) if errors else None

    def median(self, label: str, mode: str, kind: str) -> float | None:
        return self.timings.get(label, {}).get(mode, {}).get(kind, {}).get("median_ms")

    def to_json(self) -> dict[str, Any]:
        case = self.case
        return {
            "name": case.name, "title": case.title, "op": case.op, "input_shape": case.input_shape,
            "output_shape": case.output_shape, "kernel": case.kernel, "stride": case.strides,
            "padding": case.paddings, "beta": case.beta if case.op == "smooth_max_pool" else None,
            "floor_us": case.floor_us, "io_bytes": case.io_bytes,
            "check_rel_err": self.check, "check_threshold": MISMATCH_REL_ERR,
            "check_ok": self.check_ok(), "timings": self.timings, "bandwidth_gb_s": self.bandwidth(),
            "memory": self.memory, "compile": self.compile, "jax": self.jax or None,
            "torch_flags": self.flags, "errors": self.errors, "seconds": self.seconds,
        }

    def check_ok(self) -> bool | None:
        worst = self.worst_error("convgen")
        return None if worst is None else worst <= MISMATCH_REL_ERR

    def bandwidth(self) -> dict[str, float] | None:
        """Forward GB/s of the pool cases, bytes = input + output once."""
        if self.case.is_conv:
            return None
        result = {}
        for label in self.timings:
            for kind in ("call", "kernels"):
                ms = self.median(label, "fwd", kind)
                if ms:
                    result[f"{label}_{kind}"] = self.case.io_bytes / (ms * 1e-3) / 1e9
        return result


def run_case(case: Case, libs: Libraries, settings: Settings) -> CaseReport:
    report = CaseReport(case)
    started = time.perf_counter()
    try:
        inputs = make_device_inputs(case, libs.cupy)
        reference_contestant = TorchContestant(case, inputs, libs.torch, dtype=libs.torch.float64)
    except Exception as error:
        report.error("inputs/reference", error)
        return report
    with reference_contestant.active():
        by_mode = eager_outputs(reference_contestant, "float64 reference", report)
    reference = {name: array for outputs in by_mode.values() for name, array in outputs.items()}
    del reference_contestant, by_mode
    builders = [("convgen", partial(ConvgenContestant, case, inputs, libs.convgen, libs.cupy)),
                ("torch_strict", partial(TorchContestant, case, inputs, libs.torch, tf32=False))]
    if case.is_conv:  # TF32 changes nothing for the pools (no cuDNN convolution, no matmul)
        builders.append(("torch_tf32", partial(TorchContestant, case, inputs, libs.torch, tf32=True)))
    for label, build in builders:
        try:
            contestant = build()
        except Exception as error:
            report.error(f"{label} setup", error)
            continue
        measure_contestant(contestant, case, reference, settings, libs, report)
        del contestant
        release_memory(libs)
    if case.rank == 4:
        report.jax = run_jax_children(case, inputs, reference, settings, libs.cupy.asnumpy)
    report.seconds = time.perf_counter() - started
    return report


def eager_outputs(contestant: Contestant, label: str, report: CaseReport) -> dict[str, dict[str, Any]]:
    """One eager call per mode: {mode: {output name: NumPy array}}; a failing mode is reported and left out."""
    outputs = {}
    for mode in MODES:
        try:
            result = contestant.call_for(mode)()
            arrays = contestant.arrays_of(result, mode)
            outputs[mode] = {name: contestant.device.to_numpy(array) for name, array in arrays.items()}
            del result, arrays
        except Exception as error:
            report.error(f"{label} {mode} (first call)", error)
    return outputs


def measure_contestant(contestant: Contestant, case: Case, reference: dict[str, Any], settings: Settings,
                       libs: Libraries, report: CaseReport) -> None:
    label, device = contestant.label, contestant.device
    with contestant.active() as flags:
        if flags:
            report.flags[label] = flags
        eager = eager_outputs(contestant, label, report)
        report.check[label] = {name: relative_error(value, reference[name])
                               for outputs in eager.values() for name, value in outputs.items() if name in reference}
        for mode in eager:
            call = contestant.call_for(mode)
            timings = report.timings.setdefault(label, {}).setdefault(mode, {})
            try:
                timings["call"] = time_user_calls(device, call, settings, libs.flush_l2)
            except Exception as error:
                report.error(f"{label} {mode} call timing", error)
            try:
                timings["kernels"] = time_kernels(device, call, settings, graph_copies(case),
                                                  lambda result, m=mode: contestant.arrays_of(result, m), eager[mode])
            except Exception as error:
                report.error(f"{label} {mode} kernel timing", error)
            try:
                report.memory.setdefault(label, {})[mode] = device.peak_memory(call)
            except Exception as error:
                report.error(f"{label} {mode} memory", error)
    worst = report.worst_error(label)
    verdict = "-" if worst is None else f"{worst:.1e}" + ("" if worst <= MISMATCH_REL_ERR else " MISMATCH")
    times = "  ".join(f"{mode} {fmt_pair(report.median(label, mode, 'call'), report.median(label, mode, 'kernels'))}"
                      for mode in MODES)
    print(f"    {label:<13} err {verdict:<18} {times} ms (call/kernels)", flush=True)


def release_memory(libs: Libraries) -> None:
    gc.collect()
    libs.cupy.cuda.Device().synchronize()
    libs.cupy.get_default_memory_pool().free_all_blocks()
    libs.torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# Child processes: compile times, JAX


def run_child(args: list[str], env_updates: dict[str, str], timeout_s: int) -> dict[str, Any]:
    """Run this script as a child; return its result line, or how it ended."""
    env = {k: v for k, v in os.environ.items() if k != "CUPY_CACHE_IN_MEMORY"} | env_updates
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as expired:
        return {"ok": False, "status": f"timed out after {timeout_s} s", "stderr_tail": tail(expired.stderr)}
    if done.returncode < 0:
        status = f"killed by {signal.Signals(-done.returncode).name} (exit {done.returncode})"
    else:
        status = f"exit {done.returncode}"
    outcome = {"ok": done.returncode == 0, "status": status}
    if done.returncode != 0:
        outcome["stderr_tail"] = tail(done.stderr)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(CHILD_RESULT_MARKER):
            return json.loads(line[len(CHILD_RESULT_MARKER):]) | outcome
    return outcome


def tail(text: Any, lines: int = 6, limit: int = 600) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    kept = " | ".join(line.strip() for line in (text or "").splitlines() if line.strip())
    kept = " | ".join(kept.split(" | ")[-lines:])
    return kept[-limit:]


def emit_child_result(result: dict[str, Any]) -> None:
    print(CHILD_RESULT_MARKER + json.dumps(result), flush=True)


def timed(call: Callable[[], Any], cupy: Any) -> tuple[Any, float]:
    """(result, host seconds until the device is done)."""
    started = time.perf_counter()
    result = call()
    cupy.cuda.Device().synchronize()
    return result, time.perf_counter() - started


def compile_child(case_names: list[str]) -> None:
    """First calls of every case in a fresh process (the kernel cache is the parent's choice)."""
    started = time.perf_counter()
    import convgen
    import cupy

    result: dict[str, Any] = {"import_s": time.perf_counter() - started, "cases": {}}
    started = time.perf_counter()
    cupy.cuda.Device(0).use()
    cupy.empty(1)  # creates the CUDA context, compiles nothing
    result["context_s"] = time.perf_counter() - started
    for name in case_names:
        case = CASES_BY_NAME[name]
        entry: dict[str, Any] = {}
        try:
            inputs = make_device_inputs(case, cupy)
            cupy.cuda.Device().synchronize()
            contestant, entry["tape_s"] = timed(partial(ConvgenContestant, case, inputs, convgen, cupy), cupy)
            forward_result, entry["first_forward_s"] = timed(contestant.forward, cupy)
            _, entry["first_backward_s"] = timed(partial(contestant.backward, forward_result), cupy)
            _, entry["second_forward_backward_s"] = timed(contestant.forward_backward, cupy)
        except Exception as error:
            entry["error"] = one_line(error)
        result["cases"][name] = entry
    cache_dir = os.environ.get("CUPY_CACHE_DIR")
    result["cache_files"] = sum(len(files) for _, _, files in os.walk(cache_dir)) if cache_dir else None
    emit_child_result(result)


def measure_compile_times(cases: list[Case], cache_dir: str, settings: Settings) -> dict[str, Any]:
    """Cold: a child with an empty CuPy kernel cache dir; warm: a second child, same dir."""
    names = ",".join(case.name for case in cases)
    env = {"CUPY_CACHE_DIR": cache_dir}
    runs = {}
    for label in ("cold", "warm"):
        print(f"  compile-time child ({label} kernel cache {cache_dir}) ...", flush=True)
        started = time.perf_counter()
        runs[label] = run_child(["--child", "compile", "--cases", names], env, settings.compile_child_timeout_s)
        runs[label]["wall_s"] = time.perf_counter() - started
        print(f"    {label}: {runs[label]['status']}, {runs[label]['wall_s']:.1f} s", flush=True)
    return runs


def jax_child(mode: str, work_dir: str, quick: bool) -> None:
    """JAX's conv_general_dilated on the conv4d case: forward timings, or the backward attempt."""
    import numpy as np

    settings = QUICK if quick else FULL
    work = Path(work_dir)
    geometry = json.loads((work / "geometry.json").read_text())
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    result: dict[str, Any] = {"jax_version": jax.__version__, "device": str(device), "platform": device.platform}
    emit_child_result(result | {"stage": "started"})  # a later abort still leaves the versions
    arrays = {name: jax.device_put(np.load(work / f"{name}.npy")) for name in ("x", "weight", "bias", "seed")}
    rank = len(geometry["stride"])

    def conv(x: Any, weight: Any, bias: Any, precision: Any) -> Any:
        y = jax.lax.conv_general_dilated(x[None], weight, window_strides=geometry["stride"],
                                         padding=[(p, p) for p in geometry["padding"]], precision=precision)
        return y[0] + bias.reshape((-1,) + (1,) * rank)

    jax_device = JaxDevice(jax)
    flush_buffer = jnp.zeros(L2_FLUSH_BYTES // 4, jnp.float32)
    flush_kernel = jax.jit(lambda a: a + 1.0)

    def flush_l2() -> None:
        flush_kernel(flush_buffer).block_until_ready()

    precisions = {"highest": jax.lax.Precision.HIGHEST, "default": jax.lax.Precision.DEFAULT}
    x, weight, bias, seed = (arrays[n] for n in ("x", "weight", "bias", "seed"))
    for precision_name, precision in precisions.items():
        if mode == "forward":
            call = jax.jit(lambda x, w, b, p=precision: conv(x, w, b, p))
            run = lambda call=call: call(x, weight, bias)  # noqa: E731
            outputs = lambda value: {"y": value}  # noqa: E731
        else:
            def vjp(x: Any, w: Any, b: Any, s: Any, p: Any = precision) -> Any:
                _, pullback = jax.vjp(lambda x, w, b: conv(x, w, b, p), x, w, b)
                return pullback(s)

            call = jax.jit(vjp)
            run = lambda call=call: call(x, weight, bias, seed)  # noqa: E731
            outputs = lambda value: dict(zip(("grad_x", "grad_weight", "grad_bias"), value, strict=True))  # noqa: E731
        print(f"jax {mode} {precision_name}: compiling and running", flush=True)
        started = time.perf_counter()
        value = jax.block_until_ready(run())
        entry = {"first_call_s": time.perf_counter() - started}
        for name, array in outputs(value).items():
            np.save(work / f"{mode}_{precision_name}_{name}.npy", np.asarray(array))
        entry["call"] = time_user_calls(jax_device, run, settings, flush_l2)
        entry["kernels"] = time_kernels(jax_device, run, settings, 1, lambda _: {}, {})
        entry["kernels"]["method"] = "back-to-back calls / N (JAX: host clock, blocking on the last)"
        result[precision_name] = entry
    emit_child_result(result | {"stage": "done"})


def run_jax_children(case: Case, inputs: dict[str, Any], reference: dict[str, Any], settings: Settings,
                     to_numpy: Callable[[Any], Any]) -> dict[str, Any]:
    """JAX forward, then the backward attempt (known to abort the process), each in a child."""
    import numpy as np

    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="convgen-bench-jax-") as work_dir:
        work = Path(work_dir)
        for name, array in inputs.items():
            np.save(work / f"{name}.npy", to_numpy(array))
        (work / "geometry.json").write_text(json.dumps({"stride": case.strides, "padding": case.paddings}))
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_PLATFORMS": "cuda"}
        for mode in ("forward", "backward"):
            args = ["--child", f"jax-{mode}", "--work-dir", work_dir] + (["--quick"] if settings is QUICK else [])
            print(f"    jax {mode} child ...", flush=True)
            outcome = run_child(args, env, settings.jax_child_timeout_s)
            outcome["check_rel_err"] = {}
            for path in sorted(work.glob(f"{mode}_*.npy")):  # {mode}_{precision}_{output}.npy
                _, precision, output = path.stem.split("_", 2)
                outcome["check_rel_err"][f"{precision}:{output}"] = relative_error(np.load(path), reference[output])
            report[mode] = outcome
            print(f"    jax {mode}: {outcome['status']}"
                  + (f" ({outcome['stderr_tail'][-200:]})" if outcome.get("stderr_tail") and not outcome["ok"] else ""),
                  flush=True)
    return report


# --------------------------------------------------------------------------------------------
# Environment, output


def load_libraries() -> Libraries:
    """CuPy, PyTorch (CUDA) and convgen, or exit with a message saying what is missing."""
    try:
        import cupy
    except ImportError as error:
        sys.exit(f"bench.py: CuPy is not importable ({error}). This benchmark needs an NVIDIA GPU "
                 "with CuPy (cupy-cuda12x or cupy-cuda13x), PyTorch with CUDA, and convgen installed.")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as error:
        sys.exit(f"bench.py: no usable CUDA GPU ({one_line(error)}). Run it on a machine with an NVIDIA GPU.")
    try:
        import torch
    except ImportError as error:
        sys.exit(f"bench.py: PyTorch is not importable ({error}); it is the reference and the baseline.")
    if not torch.cuda.is_available():
        sys.exit("bench.py: this PyTorch has no CUDA (torch.cuda.is_available() is False).")
    try:
        import convgen
        import convgen.cuda
    except ImportError as error:
        sys.exit(f"bench.py: convgen is not importable ({error}); install it: "
                 "python3 -m pip install --no-deps --no-build-isolation -e .")
    flush_buffer = cupy.empty(L2_FLUSH_BYTES // 4, cupy.float32)
    return Libraries(cupy=cupy, torch=torch, convgen=convgen, flush_l2=lambda: flush_buffer.fill(0))


def environment(libs: Libraries, settings: Settings, argv: list[str]) -> dict[str, Any]:
    cupy, torch = libs.cupy, libs.torch
    props = cupy.cuda.runtime.getDeviceProperties(0)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    try:
        from importlib.metadata import version

        convgen_version = version("convgen")
    except Exception:
        convgen_version = getattr(libs.convgen, "__version__", "unknown")
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR, capture_output=True,
                             text=True, check=False).stdout.strip() or None
    except OSError:
        git = None
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": gpu, "gpu_torch": torch.cuda.get_device_name(0),
        "compute_capability": f"{props['major']}.{props['minor']}",
        "driver": cupy.cuda.runtime.driverGetVersion(), "cuda_runtime_cupy": cupy.cuda.runtime.runtimeGetVersion(),
        "python": platform.python_version(), "numpy": __import__("numpy").__version__,
        "cupy": cupy.__version__, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "convgen": convgen_version,
        "git": git,
        "argv": argv, "settings": settings.__dict__, "l2_flush_bytes": L2_FLUSH_BYTES,
    }


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def fmt_pair(call: float | None, kernels: float | None, mark: str = "") -> str:
    return f"{fmt_ms(call)} / {fmt_ms(kernels)}{mark}"


def fmt_ratio(numerator: float | None, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}" if numerator and denominator else "—"


def table_row(report: CaseReport) -> list[str]:
    case = report.case

    def cell(label: str, mode: str) -> str:
        kernels = report.timings.get(label, {}).get(mode, {}).get("kernels", {})
        mark = "†" if kernels.get("method", "").startswith("back-to-back") else ""
        return fmt_pair(report.median(label, mode, "call"), report.median(label, mode, "kernels"), mark)

    def ratio(mode: str) -> str:
        return " / ".join(fmt_ratio(report.median("torch_strict", mode, kind), report.median("convgen", mode, kind))
                          for kind in ("call", "kernels"))

    worst = report.worst_error("convgen")
    check = "—" if worst is None else f"{worst:.0e}" + (" ok" if worst <= MISMATCH_REL_ERR else " **MISMATCH**")
    bandwidth = report.bandwidth()
    gb_s = "—" if not bandwidth else " / ".join(
        f"{bandwidth[key]:.0f}" if key in bandwidth else "—" for key in ("convgen_kernels", "torch_strict_kernels"))
    peak = " / ".join(f"{report.memory[label]['fwd_bwd']['peak_bytes'] / 2**20:.0f}"
                      if "fwd_bwd" in report.memory.get(label, {}) else "—" for label in ("convgen", "torch_strict"))
    compile_cells = []
    for run in ("cold", "warm"):
        entry = report.compile.get(run, {})
        steps = [entry.get(k) for k in ("first_forward_s", "first_backward_s")]
        compile_cells.append(f"{sum(steps):.2f}" if all(s is not None for s in steps) else "—")
    tf32 = (cell("torch_tf32", "fwd"), cell("torch_tf32", "fwd_bwd")) if case.is_conv else ("= strict", "= strict")
    return [case.title + (" ⚠" if report.errors else ""), check, f"{case.floor_us:.3g}",
            cell("convgen", "fwd"), cell("convgen", "fwd_bwd"), cell("torch_strict", "fwd"),
            cell("torch_strict", "fwd_bwd"), *tf32, ratio("fwd"), ratio("fwd_bwd"), gb_s, peak,
            " / ".join(compile_cells)]


TABLE_HEADER = ["case", "convgen rel err", "floor fwd µs", "convgen fwd", "convgen fwd+bwd", "torch fwd",
                "torch fwd+bwd", "torch tf32 fwd", "torch tf32 fwd+bwd", "torch/convgen fwd",
                "torch/convgen fwd+bwd", "fwd GB/s convgen / torch", "peak MiB fwd+bwd convgen / torch",
                "1st call s cold / warm"]


def print_summary(meta: dict[str, Any], reports: list[CaseReport], compile_runs: dict[str, Any]) -> None:
    print()
    print(f"## convgen vs PyTorch — {meta['gpu']} (sm {meta['compute_capability']}), {meta['date_utc']}")
    print(f"convgen {meta['convgen']} (git {meta['git']}), torch {meta['torch']} (CUDA {meta['torch_cuda']}, "
          f"cuDNN {meta['cudnn']}), cupy {meta['cupy']}, driver {meta['driver']}, python {meta['python']}")
    print()
    print("| " + " | ".join(TABLE_HEADER) + " |")
    print("|" + "---|" * len(TABLE_HEADER))
    for report in reports:
        print("| " + " | ".join(table_row(report)) + " |")
    print()
    print("Times in ms, `call / kernels`: call = CUDA events around the Python call (GPU idle, L2 flushed), "
          "median; kernels = CUDA-graph replay per call, median; † = no graph (back-to-back calls / N, "
          "host-bound if the host is slower than the GPU). torch = strict fp32 (TF32 off); "
          "torch/convgen > 1 means convgen is faster. "
          f"rel err vs float64 PyTorch, mismatch above {MISMATCH_REL_ERR:g}. "
          "1st call = first forward + first backward in a fresh process (cold: empty CuPy kernel cache; "
          "warm: cache on disk).")
    for report in reports:
        for label in ("convgen", "torch_strict"):
            for mode in MODES:
                method = report.timings.get(label, {}).get(mode, {}).get("kernels", {}).get("method", "")
                if method.startswith("back-to-back"):
                    print(f"- {report.case.name} {label} {mode} kernels: {method}")
        if report.case.rank == 4:
            print(f"- {report.case.name}: torch = conv3d loop (one conv3d per offset of the first kernel axis, "
                  "batched over the first output axis). " + jax_summary(report.jax))
        for error in report.errors:
            print(f"- {report.case.name} error: {error}")
    for run, outcome in compile_runs.items():
        if outcome:
            print(f"- compile child ({run}): {outcome.get('status')}, import {fmt_s(outcome.get('import_s'))}, "
                  f"context {fmt_s(outcome.get('context_s'))}, {outcome.get('cache_files')} cache files"
                  + (f"; {outcome['stderr_tail']}" if outcome.get("stderr_tail") else ""))


def jax_summary(jax_report: dict[str, Any]) -> str:
    if not jax_report:
        return "JAX: not run."
    parts = []
    forward = jax_report.get("forward", {})
    for precision in ("highest", "default"):
        entry = forward.get(precision)
        if entry:
            err = forward.get("check_rel_err", {}).get(f"{precision}:y")
            times = fmt_pair(entry["call"]["median_ms"], entry["kernels"]["median_ms"])
            parts.append(f"JAX fwd ({precision}) {times} ms" + (f", rel err {err:.0e}" if err is not None else ""))
    if not parts:
        parts.append(f"JAX fwd: {forward.get('status')} {forward.get('stderr_tail', '')}".strip())
    backward = jax_report.get("backward", {})
    if backward.get("ok"):
        entry = backward.get("highest", {})
        times = fmt_pair(entry.get("call", {}).get("median_ms"), entry.get("kernels", {}).get("median_ms"))
        parts.append(f"JAX fwd+bwd (highest) {times} ms")
    else:
        parts.append(f"JAX backward: {backward.get('status')}"
                     + (f" — {backward['stderr_tail'][-240:]}" if backward.get("stderr_tail") else ""))
    return "; ".join(parts) + "."


def fmt_s(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.2f} s"


def default_json_path() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "bench.json" if out else BENCH_DIR / "results" / "latest.json"


def write_json(path: Path, meta: dict[str, Any], reports: list[CaseReport], compile_runs: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "compile_children": compile_runs, "cases": [r.to_json() for r in reports]}
    path.write_text(json.dumps(finite_json(document), indent=1, default=str) + "\n")


def finite_json(value: Any) -> Any:
    """inf and NaN as the strings "inf" and "nan", so that the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time convgen's CUDA tape against PyTorch/cuDNN (and JAX for conv4d) on the cases of "
                    "DESIGN.md 'Figures to beat'. Needs an NVIDIA GPU, CuPy, PyTorch with CUDA and convgen.",
        epilog="cases: " + ", ".join(f"{case.name} ({case.title})" for case in CASES))
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (under 2 minutes on an H200)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the results (default: $OUT/bench.json if OUT is set, "
                             "else benchmarks/results/latest.json)")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    parser.add_argument("--no-compile-time", action="store_true",
                        help="skip the two child processes that measure first-call compile and cache-load time")
    parser.add_argument("--child", choices=("compile", "jax-forward", "jax-backward"), help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()] if args.cases else [c.name for c in CASES]
    unknown = [n for n in names if n not in CASES_BY_NAME]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES_BY_NAME)}")
    args.case_names = names
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child == "compile":
        compile_child(args.case_names)
        return 0
    if args.child in ("jax-forward", "jax-backward"):
        jax_child(args.child.removeprefix("jax-"), args.work_dir, args.quick)
        return 0

    began = time.perf_counter()
    settings = QUICK if args.quick else FULL
    cache_dir = None
    if not args.no_compile_time:  # this process then loads the kernels the cold child compiled
        cache_dir = tempfile.mkdtemp(prefix="convgen-bench-kernel-cache-")
        os.environ["CUPY_CACHE_DIR"] = cache_dir
    libs = load_libraries()
    meta = environment(libs, settings, argv)
    json_path = args.json or default_json_path()
    cases = [CASES_BY_NAME[name] for name in args.case_names]
    print(f"convgen benchmark on {meta['gpu']}: {len(cases)} case(s), {'quick' if args.quick else 'full'} settings",
          flush=True)

    compile_runs = measure_compile_times(cases, cache_dir, settings) if cache_dir else {}
    reports = []
    for index, case in enumerate(cases, 1):
        print(f"[{index}/{len(cases)}] {case.name}: {case.title} (floor {case.floor_us:.3g} µs)", flush=True)
        try:
            report = run_case(case, libs, settings)
        except Exception as error:
            report = CaseReport(case)
            report.error("case", error)
            traceback.print_exc()
        release_memory(libs)
        for run, outcome in compile_runs.items():
            report.compile[run] = outcome.get("cases", {}).get(case.name, {"error": outcome.get("status")})
        reports.append(report)
        print(f"    ({report.seconds:.1f} s)", flush=True)
        meta["elapsed_s"] = time.perf_counter() - began
        write_json(json_path, meta, reports, compile_runs)
    if cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print_summary(meta, reports, compile_runs)
    print(f"\nJSON: {json_path}  (total {time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
