#!/usr/bin/env python3
"""Where the host time before a convolution's first kernel launch goes: convgen.torch (with and without
autograd) against the CUDA tape, on the batched conv1d N32 64->64 4096 k5 and a tiny conv2d 4->4 8x8;
then the same for the backward of a training step.

The call-time columns of bench.py count the host time up to the first launch (the GPU is idle before
it) and none after; this splits a call into segments by timestamps taken at the entry of
`devices.forward` (convgen.torch only), of `CupyBackend.forward`, of the first launch and at its return,
and at the call's return, and prints the median µs of each segment over 300 calls (GPU synchronized
before each). The backward rows time `torch.autograd.backward` (convgen.torch) or `Tape.backward` after
a forward made outside the timed part, with marks at the entry of the op's `autograd.Function` backward
(autograd's hand-over to its CUDA device thread ends there), of `devices.backward` and of
`CupyBackend.backward`; a trivial `autograd.Function` shows the hand-over's own cost. Needs a GPU, CuPy
and torch.

    python3 benchmarks/launch_delay.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import convgen
import cupy
import torch
from convgen.cuda import CupyBackend
from convgen.torch import devices, functional
from suite.host import python_host_path
from suite.trivial import trivial_function

CALLS = 300
WARMUP_CALLS = 30
SEGMENTS = ("devices", "backend", "launch", "launched")  # each segment ends at this mark
BACKWARD_SEGMENTS = ("function", "devices.backward", "backend.backward", "launch", "launched")
CASES = (((32, 64, 4096), (64, 64, 5), 2), ((1, 4, 8, 8), (4, 4, 3, 3), 1))  # input, weight, padding

_marks: dict[str, float] = {}


def _timestamped(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, marking the first time it is entered in a call (and for the launch, left)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _marks.setdefault(name, time.perf_counter())
        result = method(*args, **kwargs)
        if name == "launch":
            _marks.setdefault("launched", time.perf_counter())
        return result

    return wrapper


# An autograd.Function that does nothing: autograd's own cost of reaching a backward.
_Trivial = trivial_function(lambda: _marks.setdefault("function", time.perf_counter()))


def _install_marks() -> None:
    CupyBackend._call = _timestamped("launch", CupyBackend._call)
    CupyBackend.forward = _timestamped("backend", CupyBackend.forward)
    CupyBackend.backward = _timestamped("backend.backward", CupyBackend.backward)
    devices.forward = _timestamped("devices", devices.forward)
    devices.backward = _timestamped("devices.backward", devices.backward)
    eager = functional._Eager
    eager.backward = staticmethod(_timestamped("function", eager.backward))


def probe(name: str, call: Callable[..., Any], prepare: Callable[[], Any] | None = None,
          segments_of: tuple[str, ...] = SEGMENTS) -> None:
    """Median µs from the call (or the previous mark) to each mark, and from the last mark to the return;
    with `prepare`, its result is the call's argument, made before the GPU is synchronized and untimed."""
    for _ in range(WARMUP_CALLS):
        call(prepare()) if prepare else call()
    torch.cuda.synchronize()
    segments: dict[str, list[float]] = {}
    for _ in range(CALLS):
        argument = prepare() if prepare else None
        torch.cuda.synchronize()
        _marks.clear()
        started = time.perf_counter()
        result = call(argument) if prepare else call()
        returned = time.perf_counter()
        del result, argument
        last = started
        for mark in segments_of:
            if mark in _marks:
                segments.setdefault(mark, []).append((_marks[mark] - last) * 1e6)
                last = _marks[mark]
        segments.setdefault("return", []).append((returned - last) * 1e6)
    print(f"{name:34}" + "  ".join(f"{mark} {statistics.median(v):6.1f}" for mark, v in segments.items()),
          flush=True)


def probe_case(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], padding: int) -> None:
    x = torch.randn(*input_shape, device="cuda", requires_grad=True)
    w = torch.randn(*weight_shape, device="cuda", requires_grad=True)
    b = torch.randn(weight_shape[0], device="cuda", requires_grad=True)
    rank = len(input_shape) - 2
    tape = convgen.cuda.Tape()
    tape, tw = tape.leaf(cupy.from_dlpack(w.detach()))
    tape, tb = tape.leaf(cupy.from_dlpack(b.detach()))
    tape, tx = tape.leaf(cupy.from_dlpack(x.detach()))

    def without_grad() -> torch.Tensor:
        with torch.no_grad():
            return functional.conv(x, w, b, 1, padding)

    label = "x".join(map(str, input_shape))
    probe(f"adapter {label}", lambda: functional.conv(x, w, b, 1, padding))
    probe(f"adapter no_grad {label}", without_grad)
    probe(f"tape {label}", lambda: tape.conv(tw, tb, tx, in_c=input_shape[1], out_c=weight_shape[0],
                                             kernel=weight_shape[2:], stride=(1,) * rank, padding=(padding,) * rank,
                                             in_spatial=input_shape[2:], batch=input_shape[0]))


def probe_backward(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], padding: int) -> None:
    """The backward of a training step's conv, through convgen.torch and through the tape, and the
    hand-over to a trivial autograd.Function's backward."""
    x = torch.randn(*input_shape, device="cuda", requires_grad=True)
    w = torch.randn(*weight_shape, device="cuda", requires_grad=True)
    b = torch.randn(weight_shape[0], device="cuda", requires_grad=True)
    seed = torch.randn_like(functional.conv(x, w, b, 1, padding))
    rank = len(input_shape) - 2
    tape = convgen.cuda.Tape()
    tape, tw = tape.leaf(cupy.from_dlpack(w.detach()))
    tape, tb = tape.leaf(cupy.from_dlpack(b.detach()))
    tape, tx = tape.leaf(cupy.from_dlpack(x.detach()))
    tape_seed = cupy.from_dlpack(seed)

    def tape_forward() -> tuple[Any, int]:
        return tape.conv(tw, tb, tx, in_c=input_shape[1], out_c=weight_shape[0], kernel=weight_shape[2:],
                         stride=(1,) * rank, padding=(padding,) * rank, in_spatial=input_shape[2:],
                         batch=input_shape[0]).unwrap()

    label = "x".join(map(str, input_shape))
    probe(f"adapter backward {label}", lambda y: torch.autograd.backward(y, seed),
          lambda: functional.conv(x, w, b, 1, padding), BACKWARD_SEGMENTS)
    probe(f"tape backward {label}", lambda forward: forward[0].backward(forward[1], tape_seed).unwrap(),
          tape_forward, BACKWARD_SEGMENTS)
    probe(f"trivial backward {label}", lambda y: torch.autograd.backward(y, seed),
          lambda: _Trivial.apply(functional.conv(x, w, b, 1, padding).detach().requires_grad_()),
          BACKWARD_SEGMENTS)


def main() -> None:
    _install_marks()
    convgen.torch.set_float32_precision("highest")
    with python_host_path():  # the segments are the Python path's
        for case in CASES:
            probe_case(*case)
        probe_backward(*CASES[0])


if __name__ == "__main__":
    main()
