#!/usr/bin/env python3
"""Launch groups against one launch a kernel, in one process: a conv's forward and training step through
convgen.torch, timed as bench.py's user calls (GPU idle, L2 flushed, CUDA events around the Python call), rounds
alternating between the backend as it is and the same backend launching each queued member of a group as its own
kernel (the launches before the groups). Whole processes differ by 30-50% in speed on the H200's hosts
(benchmarks/NOTES.md), so only A and B in one process show a few µs. Also checks that both give the same bits.

    python3 benchmarks/launch_groups_ab.py [--cases conv2d_64_56_n32,conv2d_128_128_n8] [--dtypes bfloat16]
                                           [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import convgen.torch as adapter
import torch
from convgen.cuda import CupyBackend
from suite.cases import CASES_BY_NAME, Case
from suite.timing import L2_FLUSH_BYTES

GROUPED = CupyBackend._launch_group


def one_launch_a_kernel(self: CupyBackend, compiled: Any, group: str, queued: dict[str, tuple[Any, ...]]) -> None:
    """_launch_group as the launches were before the groups: each queued member alone."""
    for kernel, (function, grid, block, shared_bytes, args) in queued.items():
        self._call(kernel, function, grid, block, shared_bytes, args)


MODES: dict[str, Callable[..., None]] = {"groups": GROUPED, "one a kernel": one_launch_a_kernel}


def calls(case: Case, dtype: torch.dtype) -> tuple[dict[str, Callable[[], Any]], Callable[[], list[torch.Tensor]]]:
    """The case's forward and training step on CUDA tensors of `dtype`, and what they leave to compare."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    x, weight, bias = (torch.randn(shape, device="cuda", generator=generator).to(dtype).requires_grad_()
                       for shape in (case.input_shape, case.weight_shape, (case.out_c,)))
    upstream = torch.randn(case.output_shape, device="cuda", generator=generator).to(dtype)
    outputs: list[torch.Tensor] = []

    def forward() -> torch.Tensor:
        return adapter.conv(x, weight, bias, case.strides, case.paddings)

    def step() -> None:
        for leaf in (x, weight, bias):
            leaf.grad = None
        y = forward()
        torch.autograd.backward(y, upstream)
        outputs[:] = [y.detach(), x.grad, weight.grad, bias.grad]

    def results() -> list[torch.Tensor]:
        step()
        return [t.clone() for t in outputs]

    return {"forward": forward, "forward+backward": step}, results


def timed_ms(call: Callable[[], Any], flush: torch.Tensor) -> float:
    flush.zero_()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="conv2d_64_56_n32,conv2d_128_128_n8")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="medium",
                        help="convgen's float32 precision")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    adapter.set_float32_precision(args.precision)
    flush = torch.empty(L2_FLUSH_BYTES // 4, device="cuda")
    print(f"launch groups A/B, ms (median of {args.rounds} rounds, modes alternating; float32 in {args.precision})")
    for case in (CASES_BY_NAME[name] for name in args.cases.split(",")):
        for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
            ops, results = calls(case, dtype)
            same = []
            for mode in MODES.values():
                CupyBackend._launch_group = mode
                for _ in range(20):  # compiles, caches, the allocator's blocks
                    results()
                same.append(results())
            bits = all(torch.equal(a, b) for a, b in zip(*same, strict=True))
            for name, op in ops.items():
                samples: dict[str, list[float]] = {mode: [] for mode in MODES}
                for _ in range(args.rounds):
                    for mode, launch_group in MODES.items():
                        CupyBackend._launch_group = launch_group
                        samples[mode].append(timed_ms(op, flush))
                medians = {mode: statistics.median(values) for mode, values in samples.items()}
                print(f"{case.title} {str(dtype).removeprefix('torch.'):<9} {name:<17} "
                      + "  ".join(f"{mode} {ms:.4f}" for mode, ms in medians.items())
                      + f"  ratio {medians['groups'] / medians['one a kernel']:.3f}  same bits: {bits}")
    CupyBackend._launch_group = GROUPED


if __name__ == "__main__":
    main()
