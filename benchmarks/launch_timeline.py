#!/usr/bin/env python3
"""When the GPU reaches each kernel launch of a call: the tape against convgen.torch, forward and training step.

bench.py's "call" starts on an idle GPU, so a call takes the host's time up to each launch the GPU has to wait
for, plus the kernels. This splits it: before every launch an event is recorded on the launch's stream, and each
launch gets two times from the call's start, the host's (when Python reached it) and the GPU's (when the stream
reached the event: the host's time, or the previous kernels' end if they ran longer). Where the GPU time equals
the host time, the GPU waited for the host; the gaps between launches show where. Medians over `--calls` calls,
L2 flushed and the GPU synchronized before each. The events add about the same small cost to every launch of
both contestants.

With `--around-bench`, each case's timelines are taken again after bench.py has run that whole case in this
process (its checks, kernel timings with their CUDA graphs and user calls, quick settings): whether what bench.py
leaves behind makes a contestant's call slower there than alone.

With `--on-calling-thread`, each convgen.torch contestant runs a second time with autograd's backward on the calling
thread (`torch.autograd.set_multithreading_enabled(False)`) instead of its CUDA device thread: what the hand-over to
that thread and back costs the step.

    python3 benchmarks/launch_timeline.py [--cases conv2d_64_56_n32,conv1d_64_4096_n32] [--precision medium]
                                          [--dtypes float32,bfloat16] [--calls 60] [--around-bench]
                                          [--on-calling-thread]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import convgen
import convgen.torch as adapter
import cupy
import torch
from convgen.cuda import CupyBackend
from suite.cases import BATCHED_CASES, CASES_BY_NAME
from suite.contestants import (
    AdapterContestant,
    ConvgenContestant,
    load_libraries,
    make_device_inputs,
    on_calling_thread,
)
from suite.host import python_host_path
from suite.measure import run_case
from suite.timing import QUICK

_marks: list[tuple[str, float, Any]] = []  # (stage, host time, event) of each launch of the call being timed
_streams: dict[int, Any] = {}  # the launches' raw stream handles as CuPy streams, made once


def _marked_call(original: Any) -> Any:
    def call(self: Any, stage: str, *args: Any) -> None:
        pointer = self._stream_pointer()
        on = _streams.get(pointer) or _streams.setdefault(pointer, cupy.cuda.ExternalStream(pointer))
        event = cupy.cuda.Event()
        event.record(on)
        _marks.append((stage, time.perf_counter(), event))
        original(self, stage, *args)
    return call


def timeline(call: Any, calls: int, flush: Any) -> tuple[float, float, list[tuple[str, float, float]]]:
    """Median µs of the call (events), of its host time, and per launch (stage, host, GPU) from its start."""
    for _ in range(10):
        call()
        torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        flush()
        torch.cuda.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        _marks.clear()
        start.record()
        began = time.perf_counter()
        result = call()
        returned = time.perf_counter()
        end.record()
        end.synchronize()
        launches = [(stage, (at - began) * 1e6, cupy.cuda.get_elapsed_time(start, event) * 1e3)
                    for stage, at, event in _marks]
        samples.append((cupy.cuda.get_elapsed_time(start, end) * 1e3, (returned - began) * 1e6, launches))
        del result
    stages = [stage for stage, _, _ in samples[0][2]]
    per_launch = [(stage, statistics.median(s[2][i][1] for s in samples),
                   statistics.median(s[2][i][2] for s in samples)) for i, stage in enumerate(stages)]
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples), per_launch


class OnCallingThread:
    """`contestant`'s calls with autograd's backward on the calling thread, not on its CUDA device thread."""

    def __init__(self, contestant: Any):
        self.contestant = contestant

    def call_for(self, mode: str) -> Any:
        return on_calling_thread(torch, self.contestant.call_for(mode))


def print_timelines(contestants: list[tuple[str, Any]], calls: int, flush: Any) -> None:
    """Each contestant's timeline, forward and training step, with every launch marked while they run (on the Python
    path, whose launches the marks are)."""
    original = CupyBackend._call
    CupyBackend._call = _marked_call(original)
    try:
        with python_host_path():
            for mode in ("fwd", "fwd_bwd"):
                for label, contestant in contestants:
                    call_us, host_us, launches = timeline(contestant.call_for(mode), calls, flush)
                    print(f"  {label:<22} {mode:<8} call {call_us:7.1f}  host returns {host_us:6.1f}")
                    for stage, host, gpu in launches:
                        print(f"      {stage:<32} host {host:7.1f}  GPU reaches it {gpu:7.1f}")
    finally:
        CupyBackend._call = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    conv_cases = [case.name for case in BATCHED_CASES if case.is_conv]
    parser.add_argument("--cases", default="conv2d_64_56_n32", help=f"comma-separated, of {', '.join(conv_cases)}")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="highest",
                        help="the tape's and convgen.torch's float32 precision")
    parser.add_argument("--dtypes", default="float32", help="convgen.torch's tensors: float32, bfloat16, float16")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--around-bench", action="store_true",
                        help="take the timelines again after bench.py's run of the whole case in this process")
    parser.add_argument("--on-calling-thread", action="store_true",
                        help="also time each convgen.torch contestant with autograd's backward on the calling thread")
    args = parser.parse_args()
    libs = load_libraries("launch_timeline.py")
    adapter.set_float32_precision(args.precision)
    for name in args.cases.split(","):
        case = CASES_BY_NAME[name]
        inputs = make_device_inputs(case, cupy)
        contestants = [("tape", ConvgenContestant(case, inputs, convgen, cupy, args.precision))]
        contestants += [(f"convgen.torch {dtype}", AdapterContestant(case, inputs, torch, adapter, dtype))
                        for dtype in args.dtypes.split(",")]
        if args.on_calling_thread:
            contestants += [(f"{label}, backward on the calling thread", OnCallingThread(contestant))
                            for label, contestant in contestants[1:]]
        print(f"{case.title} ({args.precision}): µs from the call's start, medians of {args.calls}")
        print_timelines(contestants, args.calls, libs.flush_l2)
        if args.around_bench:
            print(f"bench.py's run of {name}, quick settings:")
            run_case(case, libs, QUICK)
            print(f"{case.title} ({args.precision}), after bench.py's run of it in this process:")
            print_timelines(contestants, args.calls, libs.flush_l2)


if __name__ == "__main__":
    main()
