#!/usr/bin/env python3
"""Where a convgen.torch call's host time goes, stage by stage: timestamps from the call's start at each stage of a
forward and of a training step (the device layer's entry and return, each kernel launch, each output and scratch
allocation, autograd's node, the backward's start and end), with the thread each ran on (autograd runs a CUDA
backward on its device thread). Beside them, torch's own channels-last step and a trivial `autograd.Function`
step, for autograd's hand-over alone. Medians over `--calls` calls, each started from an idle CPU (a 0.5 ms sleep
after the GPU is synchronized) and back to back; the wrappers that take the timestamps add about a µs a stage.

With `--stand-in` (no GPU or CuPy), convgen.torch's rows on CPU tensors through its CUDA runner on the stand-in
CuPy (benchmarks/suite/stand_in.py), whose launches do nothing; autograd then runs the backward on the calling
thread.

    python3 benchmarks/step_stages.py [--case conv2d_64_56_n32] [--dtypes bfloat16,float32] [--calls 80]
                                      [--stand-in]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import convgen.torch as adapter
import torch
from convgen.cuda import CupyBackend
from convgen.torch import devices, functional
from suite.cases import BATCHED_CASES, CASES_BY_NAME, Case
from suite.contestants import CHANNELS_LAST_FORMAT, torch_op
from suite.host import python_host_path
from suite.trivial import trivial_function

_marks: list[tuple[str, int, int]] = []  # (stage, perf_counter_ns, thread) of the call being timed


def mark(stage: str) -> None:
    _marks.append((stage, time.perf_counter_ns(), threading.get_ident()))


def _wrapped(original: Callable[..., Any], stage: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(stage + ">")
        result = original(*args, **kwargs)
        mark(stage + "<")
        return result
    return wrapper


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """convgen.torch with a timestamp at each stage; as it was after the block."""
    eager_backward = functional._Eager.backward

    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        mark("our backward>")
        result = eager_backward(ctx, grad)
        mark("our backward<")
        return result

    def launch(self: Any, stage: str, *args: Any) -> None:
        mark(f"launch {stage}")
        return saved["call"](self, stage, *args)

    saved = {"forward": devices.forward, "backward": devices.backward, "apply": functional._apply_eager,
             "call": CupyBackend._call, "output": devices._TorchCupyBackend._output,
             "output_like": devices._TorchCupyBackend._output_like, "scratch": devices._TorchCupyBackend._scratch_base}
    devices.forward = _wrapped(saved["forward"], "devices.forward")
    devices.backward = _wrapped(saved["backward"], "devices.backward")
    functional._apply_eager = _wrapped(saved["apply"], "autograd node")
    functional._Eager.backward = staticmethod(backward)
    CupyBackend._call = launch
    devices._TorchCupyBackend._output = _wrapped(saved["output"], "output")
    devices._TorchCupyBackend._output_like = _wrapped(saved["output_like"], "output")
    devices._TorchCupyBackend._scratch_base = _wrapped(saved["scratch"], "scratch")
    try:
        yield
    finally:
        devices.forward, devices.backward, functional._apply_eager = saved["forward"], saved["backward"], saved["apply"]
        functional._Eager.backward = staticmethod(eager_backward)
        CupyBackend._call = saved["call"]
        devices._TorchCupyBackend._output, devices._TorchCupyBackend._scratch_base = saved["output"], saved["scratch"]
        devices._TorchCupyBackend._output_like = saved["output_like"]


def stages(call: Callable[[], Any], calls: int, idle: bool,
           synchronize: Callable[[], Any]) -> list[tuple[str, float, str]]:
    """(stage, median µs from the call's start, "main" or "worker") of each stage the call marks."""
    for _ in range(10):
        call()
        synchronize()
    runs = []
    main = threading.get_ident()
    for _ in range(calls):
        synchronize()
        if idle:
            time.sleep(0.0005)
        _marks.clear()
        mark("start")
        call()
        mark("end")
        runs.append(list(_marks))
    same = [run for run in runs if [m[0] for m in run] == [m[0] for m in runs[0]]]
    return [(stage, statistics.median((run[i][1] - run[0][1]) / 1e3 for run in same),
             "main" if thread == main else "worker") for i, (stage, _, thread) in enumerate(runs[0])]


# autograd's share of a step: a node whose forward and backward only return their input.
_Trivial = trivial_function(lambda: mark("trivial backward"))


def step_of(op: Callable[..., torch.Tensor], leaves: tuple[torch.Tensor, ...],
            upstream: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        for leaf in leaves:
            leaf.grad = None
        y = op(*leaves)
        mark("op returned")
        torch.autograd.backward(y, upstream)
        mark("backward returned")
    return step


def calls_of(case: Case, dtype: torch.dtype, device: str) -> dict[str, Callable[[], Any]]:
    """Name -> a call of the case on `device` tensors of `dtype`: convgen.torch's forward and step, and on CUDA
    torch's own channels-last step and the trivial step."""
    leaves = tuple(torch.randn(shape, device=device).to(dtype).requires_grad_()
                   for shape in (case.input_shape, case.weight_shape, (case.out_c,)))
    upstream = torch.randn(case.output_shape, device=device).to(dtype)

    def convgen_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return adapter.conv(x, weight, bias, case.strides, case.paddings)

    calls = {"convgen.torch forward": lambda: convgen_op(*leaves),
             "convgen.torch step": step_of(convgen_op, leaves, upstream)}
    if device == "cuda":
        memory_format = getattr(torch, CHANNELS_LAST_FORMAT.get(case.rank, "contiguous_format"))
        torch_leaves = tuple(leaf.detach().contiguous(memory_format=memory_format if leaf.dim() > 2 else
                                                      torch.contiguous_format).requires_grad_() for leaf in leaves)
        calls["torch channels-last step"] = step_of(torch_op(case), torch_leaves,
                                                    upstream.contiguous(memory_format=memory_format))
        small = torch.randn(8, device=device, requires_grad=True)
        calls["trivial autograd.Function step"] = step_of(_Trivial.apply, (small,), torch.ones_like(small))
    return calls


def report(case: Case, dtypes: list[str], calls: int, device: str, synchronize: Callable[[], Any]) -> None:
    for name in dtypes:
        for label, call in calls_of(case, getattr(torch, name), device).items():
            for idle in (True, False):
                print(f"== {label}, {name} ({'from an idle CPU' if idle else 'back to back'}): µs from the start")
                for stage, at, thread in stages(call, calls, idle, synchronize):
                    print(f"  {stage:<30} {at:8.1f}  {thread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[c.name for c in BATCHED_CASES if c.is_conv], default="conv2d_64_56_n32")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated torch dtypes")
    parser.add_argument("--calls", type=int, default=80)
    parser.add_argument("--stand-in", action="store_true",
                        help="convgen.torch's rows on CPU tensors and the stand-in CuPy (no GPU)")
    args = parser.parse_args()
    case = CASES_BY_NAME[args.case]
    print(f"{case.title}: where a call's host time goes")
    with python_host_path(), instrumented():  # the stages are the Python path's
        if args.stand_in:
            from suite.stand_in import stand_in_adapter

            with stand_in_adapter(devices):
                report(case, args.dtypes.split(","), args.calls, "cpu", lambda: None)
            return
        if not torch.cuda.is_available():
            raise SystemExit("step_stages.py times CUDA calls: no CUDA device (--stand-in runs without one)")
        report(case, args.dtypes.split(","), args.calls, "cuda", torch.cuda.synchronize)


if __name__ == "__main__":
    main()
