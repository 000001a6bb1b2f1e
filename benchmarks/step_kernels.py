#!/usr/bin/env python3
"""Each kernel of a training step on a batched conv case, convgen.torch beside torch's own op: which kernels
a step's GPU time goes to, as torch.profiler (CUPTI) records them. CUPTI sees every kernel of the process, so
convgen's CuPy launches are listed as cuDNN's are.

A step is step_host.py's: the forward and `torch.autograd.backward` with the upstream gradient, x, weight and
bias requiring grad (the kernels of bench.py's fwd+bwd call, which takes `torch.autograd.grad` of them). torch's
2-D and 3-D tensors are channels-last in 16-bit dtypes (bench.py's torch_bf16_cl); float32 runs convgen in
`--precision` and torch with TF32 as that precision says. Per kernel: launches a step and the median µs of one
launch over `--steps` profiled steps.

    python3 benchmarks/step_kernels.py [--cases conv2d_64_56_n32,conv2d_128_128_n8] [--dtypes bfloat16]
                                       [--precision medium] [--steps 20]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import warnings
from collections.abc import Callable

import convgen.torch as adapter
import torch
from step_host import steps
from suite.cases import BATCHED_CASES, CASES_BY_NAME

WARM_STEPS = 10  # compiles, caches, the allocator's blocks


def kernel_times(step: Callable[[], None], steps: int) -> list[tuple[str, float, float]]:
    """(kernel, launches a step, median µs a launch) in the order of their first launch."""
    for _ in range(WARM_STEPS):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    warnings.filterwarnings("ignore", message="Warning: Profiler clears events")  # we read them as the cycle ends
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    durations: dict[str, list[float]] = collections.defaultdict(list)
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            durations[event.name].append(event.device_time)
    return [(name, len(times) / steps, statistics.median(times)) for name, times in durations.items()]


def short(name: str, width: int = 72) -> str:
    """A kernel's name cut to `width` characters (cuDNN's are long C++ signatures)."""
    return name if len(name) <= width else name[: width - 1] + "…"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    conv_cases = [case.name for case in BATCHED_CASES if case.is_conv]
    parser.add_argument("--cases", default="conv2d_64_56_n32", help=f"comma-separated, of {', '.join(conv_cases)}")
    parser.add_argument("--dtypes", default="bfloat16", help="comma-separated torch dtypes")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="medium",
                        help="convgen's float32 precision (torch: TF32 unless highest)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("step_kernels.py profiles CUDA steps: no CUDA device")
    unknown = [name for name in args.cases.split(",") if name not in conv_cases]
    if unknown:
        parser.error(f"not a batched conv case: {', '.join(unknown)}")
    adapter.set_float32_precision(args.precision)
    torch.backends.cudnn.allow_tf32 = args.precision != "highest"
    torch.backends.cudnn.benchmark = True  # cuDNN tuned, as bench.py's torch contestants run it
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"µs a launch, medians of {args.steps} steps")
    for case_name in args.cases.split(","):
        case = CASES_BY_NAME[case_name]
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for library, step in steps(case, dtype, torch_channels_last=dtype != torch.float32).items():
                rows = kernel_times(step, args.steps)
                total = sum(count * time for _, count, time in rows)
                print(f"{case.title} {dtype_name} {library}: {total:.1f} µs of kernels a step")
                for name, count, time in rows:
                    print(f"    {time:8.1f} x{count:<4g} {short(name)}")


if __name__ == "__main__":
    main()
