#!/usr/bin/env python3
"""Host time of a training step on a batched conv case, convgen.torch against torch's own op: why bench.py's
"call" times can trail the kernels (the GPU waits for the host).

A step is the forward and `torch.autograd.backward` with the upstream gradient, the inputs' gradients cleared
first, as bench.py's fwd+bwd call makes it. Per dtype and library: `issue`, the median host time until a step
returns, each started on an idle GPU; `wall`, until its kernels are done. The libraries take turns step by step,
so the ratio holds on a host whose speed drifts. Then a cProfile of `--calls` convgen steps: where its host time
goes. float32 runs convgen in `--precision` and torch with TF32 as that precision says ("highest": off); torch's
16-bit tensors are channels-last where torch has the format (bench.py's torch_bf16_cl). torch's conv4d is
bench.py's loop of conv3d.

With `--stand-in` (no GPU or CuPy: PyTorch on the CPU), convgen.torch's own host path alone: its forward and step
on CPU tensors of the case, run through its CUDA runner on the stand-in CuPy (benchmarks/suite/stand_in.py), whose
launches do nothing, beside a step of a trivial autograd.Function (autograd's own share), then a cProfile of the
steps.

    python3 benchmarks/step_host.py [--case conv2d_64_56_n32] [--dtypes bfloat16,float32] [--precision medium]
                                    [--calls 100] [--stand-in]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import convgen.torch as adapter
import torch
from suite.cases import BATCHED_CASES, CASES_BY_NAME, Case
from suite.contestants import CHANNELS_LAST_FORMAT, torch_op
from suite.host import profile_summary
from suite.timing import turn_order


def steps(case: Case, dtype: torch.dtype, torch_channels_last: bool = False) -> dict[str, Callable[[], None]]:
    """library -> one training step of the case on CUDA tensors of `dtype`; with `torch_channels_last`, torch's own
    2-D and 3-D tensors are channels-last copies of the same values (bench.py's torch_bf16_cl)."""
    generator = torch.Generator(device="cuda").manual_seed(0)

    def tensor(shape: tuple[int, ...], grad: bool = True) -> torch.Tensor:
        value = torch.randn(shape, device="cuda", generator=generator).to(dtype)
        return value.requires_grad_(grad)

    def channels_last(value: torch.Tensor) -> torch.Tensor:
        if not torch_channels_last or case.rank not in CHANNELS_LAST_FORMAT or value.dim() != case.rank + 2:
            return value
        memory_format = getattr(torch, CHANNELS_LAST_FORMAT[case.rank])
        return value.detach().contiguous(memory_format=memory_format).requires_grad_(value.requires_grad)

    inputs = (tensor(case.input_shape), tensor(case.weight_shape), tensor((case.out_c,)))
    upstream = tensor(case.output_shape, grad=False)
    ops = {"convgen.torch": (lambda x, w, b: adapter.conv(x, w, b, case.strides, case.paddings), inputs, upstream),
           "torch": (torch_op(case), tuple(map(channels_last, inputs)), channels_last(upstream))}

    def step_of(op: Callable[..., torch.Tensor], leaves: tuple[torch.Tensor, ...],
                gradient: torch.Tensor) -> Callable[[], None]:
        def step() -> None:
            for value in leaves:
                value.grad = None
            torch.autograd.backward(op(*leaves), gradient)
        return step

    return {name: step_of(*parts) for name, parts in ops.items()}


def host_times(steps_by_library: dict[str, Callable[[], None]], calls: int) -> dict[str, tuple[float, float]]:
    """library -> median µs of (issue, wall) over `calls` steps, each from an idle GPU; the libraries take turns
    step by step (each round shuffled: suite.timing.turn_order), so that a drift of the host's speed reaches
    them alike."""
    for step in steps_by_library.values():
        for _ in range(20):  # compiles, caches, the allocator's blocks
            step()
    issue: dict[str, list[float]] = {library: [] for library in steps_by_library}
    wall: dict[str, list[float]] = {library: [] for library in steps_by_library}
    for turn in range(calls):
        for library, step in turn_order(list(steps_by_library.items()), turn):
            torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            returned = time.perf_counter()
            torch.cuda.synchronize()
            issue[library].append((returned - start) * 1e6)
            wall[library].append((time.perf_counter() - start) * 1e6)
    return {library: (statistics.median(issue[library]), statistics.median(wall[library]))
            for library in steps_by_library}


class _Trivial(torch.autograd.Function):
    """A step's floor: autograd's node and hand-over around a forward and a backward that only allocate what a conv's
    return (an output, the three gradients)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.shapes = weight, bias
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        weight, bias = ctx.shapes
        return torch.empty_like(grad), torch.empty_like(weight), torch.empty_like(bias)


def stand_in_steps(case: Case, dtype: torch.dtype, calls: int) -> None:
    """The stand-in rows of --stand-in for one dtype: median µs a call on the CPU, then convgen's cProfile."""
    from convgen.torch import devices
    from suite.stand_in import stand_in_adapter

    inputs = tuple(torch.randn(shape).to(dtype).requires_grad_() for shape in
                   (case.input_shape, case.weight_shape, (case.out_c,)))
    upstream = torch.randn(case.output_shape).to(dtype)

    def step_of(op: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            for value in inputs:
                value.grad = None
            torch.autograd.backward(op(*inputs), upstream)
        return step

    def forward() -> None:
        with torch.no_grad():
            adapter.conv(*inputs, case.strides, case.paddings)

    conv_step = step_of(lambda x, w, b: adapter.conv(x, w, b, case.strides, case.paddings))
    calls_by_name = {"convgen.torch forward (no grad)": forward, "convgen.torch step": conv_step,
                     "trivial autograd.Function step": step_of(_Trivial.apply)}
    with stand_in_adapter(devices):
        for name, call in calls_by_name.items():
            for _ in range(20):  # the plan, the caches
                call()
            rounds = []
            for _ in range(max(calls // 10, 5)):
                start = time.perf_counter()
                for _ in range(10):
                    call()
                rounds.append((time.perf_counter() - start) * 1e5)
            print(f"{str(dtype).removeprefix('torch.'):<9} {name:<32} {statistics.median(rounds):8.1f} µs")
        print(f"\n== cProfile of {calls} convgen.torch steps on the stand-ins\n"
              f"{profile_summary(conv_step, calls, lambda: None)['text']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    conv_cases = [case.name for case in BATCHED_CASES if case.is_conv]
    parser.add_argument("--case", choices=conv_cases, default="conv2d_64_56_n32")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated torch dtypes")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="medium",
                        help="convgen's float32 precision (torch: TF32 unless highest)")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--stand-in", action="store_true",
                        help="convgen.torch's host path alone, on CPU tensors and the stand-in CuPy (no GPU)")
    args = parser.parse_args()
    if args.stand_in:
        case = CASES_BY_NAME[args.case]
        adapter.set_float32_precision(args.precision)
        print(f"{case.title}: convgen.torch's host path on the stand-in CuPy, median µs a call")
        for name in args.dtypes.split(","):
            stand_in_steps(case, getattr(torch, name), args.calls)
        return
    if not torch.cuda.is_available():
        raise SystemExit("step_host.py times CUDA steps: no CUDA device")
    case = CASES_BY_NAME[args.case]
    adapter.set_float32_precision(args.precision)
    torch.backends.cudnn.allow_tf32 = args.precision != "highest"
    torch.backends.cudnn.benchmark = True  # cuDNN tuned, as bench.py's torch contestants run it
    print(f"{case.title}: host µs a training step (median of {args.calls}, each from an idle GPU)")
    profiles = {}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        steps_by_library = steps(case, dtype, torch_channels_last=dtype != torch.float32)
        for library, (issue, wall) in host_times(steps_by_library, args.calls).items():
            print(f"{name:<9} {library:<14} issue {issue:8.1f}  wall {wall:8.1f}")
        profiles[name] = profile_summary(steps_by_library["convgen.torch"], args.calls, torch.cuda.synchronize)["text"]
    for name, text in profiles.items():
        print(f"\n== cProfile of {args.calls} convgen.torch steps, {name}\n{text}")


if __name__ == "__main__":
    main()
