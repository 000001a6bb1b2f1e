#!/usr/bin/env python3
"""A training step with autograd's backward on its CUDA device thread and on the calling thread: what the
hand-over costs convgen.torch's step next to the CUDA tape's, and torch's own.

`torch.autograd.backward` and `torch.autograd.grad` run the backward of CUDA tensors on autograd's worker thread
for the device; `torch.autograd.set_multithreading_enabled(False)`, torch's own thread-local switch, runs it on the
calling thread. Per case, five forward+backward calls (bench.py's: `torch.autograd.grad` of the inputs with the
upstream gradient; the tape's forward and backward): the tape, convgen.torch and torch strict fp32, the last two
also on the calling thread. torch's is bench.py's contestant, cuDNN tuned as bench.py runs it (the s37 runs in
measured/ had it untuned). They take turns sample by sample, each round shuffled, so that a drift of the host's
speed reaches them alike (bench.py's method: GPU idle and L2 flushed before each, CUDA events around the
Python call), float32 in "highest". Prints each one's median call, its 10th and 90th percentiles, its median host
time (until the call returns) and its median over the tape's.

    python3 benchmarks/step_threads.py [--cases conv2d_64_56_n32,conv1d_64_4096_n32,conv4d_8_16_n8]
                                       [--samples 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from suite.cases import BATCHED_CASES, CASES_BY_NAME
from suite.contestants import (
    TORCH_STRICT,
    AdapterContestant,
    ConvgenContestant,
    TorchContestant,
    load_libraries,
    make_device_inputs,
    on_calling_thread,
)
from suite.timing import TorchDevice, turn_order

WARM_UP_CALLS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    conv_cases = [case.name for case in BATCHED_CASES if case.is_conv]
    parser.add_argument("--cases", default="conv2d_64_56_n32,conv1d_64_4096_n32,conv4d_8_16_n8",
                        help=f"comma-separated, of {', '.join(conv_cases)}")
    parser.add_argument("--samples", type=int, default=200, help="timed calls of each contestant")
    args = parser.parse_args()
    libs = load_libraries("step_threads.py")
    torch, cupy = libs.torch, libs.cupy
    if libs.adapter is None:
        raise SystemExit(f"step_threads.py: {libs.adapter_skipped}")
    libs.adapter.set_float32_precision("highest")

    device = TorchDevice(torch)

    def sample(call: Callable[[], Any]) -> tuple[float, float]:
        """µs of one call by bench.py's timer (CUDA events), and µs until it returned."""
        libs.flush_l2()
        device.synchronize()
        timer = device.start_timer()
        began = time.perf_counter()
        result = call()
        returned = time.perf_counter()
        return device.stop_timer(timer, result) * 1e3, (returned - began) * 1e6

    for name in args.cases.split(","):
        case = CASES_BY_NAME[name]
        inputs = make_device_inputs(case, cupy)
        adapter = AdapterContestant(case, inputs, torch, libs.adapter).call_for("fwd_bwd")
        strict = TorchContestant(case, inputs, torch, TORCH_STRICT)
        calls = {"tape": ConvgenContestant(case, inputs, libs.convgen, cupy, "highest").call_for("fwd_bwd"),
                 "convgen.torch": adapter,
                 "convgen.torch, calling thread": on_calling_thread(torch, adapter),
                 "torch strict": strict.call_for("fwd_bwd"),
                 "torch strict, calling thread": on_calling_thread(torch, strict.call_for("fwd_bwd"))}
        with strict.active():  # TF32 off for torch's convolutions
            for call in calls.values():
                for _ in range(WARM_UP_CALLS):
                    call()
            torch.cuda.synchronize()
            times: dict[str, list[float]] = {label: [] for label in calls}
            hosts: dict[str, list[float]] = {label: [] for label in calls}
            for turn in range(args.samples):
                for label, call in turn_order(list(calls.items()), turn):
                    call_us, host_us = sample(call)
                    times[label].append(call_us)
                    hosts[label].append(host_us)
        tape = statistics.median(times["tape"])
        print(f"{case.title}: forward+backward call, µs, medians of {args.samples} samples taken in turn", flush=True)
        for label, values in times.items():
            deciles = statistics.quantiles(values, n=10)
            median = statistics.median(values)
            print(f"  {label:<30} call {median:7.1f} (p10 {deciles[0]:7.1f}, p90 {deciles[-1]:7.1f})  "
                  f"host {statistics.median(hosts[label]):6.1f}  over the tape {median / tape:.3f}", flush=True)


if __name__ == "__main__":
    main()
