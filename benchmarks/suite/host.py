"""Per-call host overhead of tiny ops on the CUDA tape (issue 9's host path): back-to-back calls whose GPU
work is negligible, so the host path dominates, beside `torch.nn.functional.max_pool2d` on the same input
and the floor CuPy itself sets; then cProfile of convgen's tiny max pools (where the time goes). The
split (`measure_split`, no GPU needed) times the same max pools on stand-ins (suite/stand_in.py): the tape
and validators alone, and with the CUDA backend's Python path on a CuPy that does nothing."""

from __future__ import annotations

import cProfile
import io
import os
import platform
import pstats
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

HOST_CALLS = 5000  # back-to-back calls per round
HOST_ROUNDS = 3  # rounds per op; the median is reported
# Calls before the timed rounds. With 50, the first op timed (the N-D max pool) read 26.6 and 24.4 µs in its first two
# rounds and 16.4 in its third on the H200's host, the ops after it steady from their first round
# (benchmarks/measured/2026-12-01-h200-f531df5-host.txt): a start-up transient, not the op's cost.
WARMUP_CALLS = 2000
PROFILE_TOP = 15  # functions per cProfile summary, by own time
POOL_INPUT = (1, 4, 4)  # [C, H, W]: one channel of 4×4, pooled k2 s2
INPUT_SEED = 20260601


@dataclass(frozen=True)
class HostOp:
    """One tiny op, called back to back; `profiled` ops (convgen's max pools) also get a cProfile summary
    and their ratio to the `baseline` op (PyTorch's max pool on a leaf that requires grad, as the tape
    records for its backward)."""

    name: str
    call: Callable[[], Any]
    profiled: bool = False
    baseline: bool = False


def tiny_ops(cupy: Any, torch: Any, convgen: Any) -> list[HostOp]:
    """The 4×4 max pools on convgen's tape (N-D and 2-D) and in PyTorch, CuPy's floor, and tiny convs."""
    rng = cupy.random.RandomState(INPUT_SEED)
    pool_input = rng.standard_normal(POOL_INPUT, dtype=cupy.float32)
    tape = convgen.cuda.Tape()
    tape, x = tape.leaf(pool_input)
    tape, w = tape.leaf(rng.standard_normal((4, 4, 3, 3), dtype=cupy.float32))
    tape, b = tape.leaf(rng.standard_normal(4, dtype=cupy.float32))
    tape, image = tape.leaf(rng.standard_normal((4, 8, 8), dtype=cupy.float32))
    channels, height, width = POOL_INPUT
    torch_input = torch.from_dlpack(pool_input).clone()
    torch_leaf = torch_input.clone().requires_grad_(True)
    empty = cupy.RawKernel('extern "C" __global__ void nothing(float* y) {}', "nothing")
    scratch = cupy.empty(1, cupy.float32)
    conv2d = lambda: tape.conv2d(w, b, image, in_c=4, out_c=4, k_h=3, k_w=3, stride=1, padding=1,  # noqa: E731
                                 in_h=8, in_w=8).unwrap()
    conv_tape, conv_out = conv2d()
    conv_seed = cupy.ones(conv_tape.shape(conv_out), cupy.float32)
    pool = f"C{channels} {height}×{width} k2 s2"
    return max_pools(tape, x, "", profiled=True) + [
        HostOp(f"torch F.max_pool2d {pool}, requires_grad", lambda: torch.nn.functional.max_pool2d(torch_leaf, 2, 2),
               baseline=True),
        HostOp(f"torch F.max_pool2d {pool}, no grad", lambda: torch.nn.functional.max_pool2d(torch_input, 2, 2)),
        HostOp("cupy empty kernel launch", lambda: empty((1,), (32,), (scratch,))),
        HostOp("cupy.empty(64 floats)", lambda: cupy.empty(64, cupy.float32)),
        HostOp("convgen conv2d 4→4 8×8 k3 p1", conv2d),
        HostOp("convgen backward of conv2d 4→4 8×8", lambda: conv_tape.backward(conv_out, conv_seed).unwrap()),
    ]


def max_pools(tape: Any, x: int, label: str, profiled: bool = False) -> list[HostOp]:
    """convgen's two tiny max pools of node `x` (shaped POOL_INPUT) on `tape`."""
    channels, height, width = POOL_INPUT
    pool = f"C{channels} {height}×{width} k2 s2"
    return [
        HostOp(f"convgen max_pool (N-D) {pool}{label}",
               lambda: tape.max_pool(x, c=channels, in_spatial=(height, width), kernel=(2, 2), stride=(2, 2),
                                     padding=(0, 0)).unwrap(), profiled=profiled),
        HostOp(f"convgen max_pool2d {pool}{label}",
               lambda: tape.max_pool2d(x, k_h=2, k_w=2, in_h=height, in_w=width, in_c=channels,
                                       stride=2).unwrap(), profiled=profiled),
    ]


def split_ops(convgen: Any) -> list[HostOp]:
    """The max pools on a stub CPU backend (tape + validators) and on the CUDA backend over a stand-in
    CuPy (tape + validators + the CUDA backend's Python path): what convgen's own Python costs."""
    import numpy as np

    from suite.stand_in import StandInArray, stand_in_cuda_tape, stub_cpu_tape

    stub_tape, stub_x = stub_cpu_tape(convgen).leaf(np.zeros(POOL_INPUT, np.float32))
    cuda_tape, cuda_x = stand_in_cuda_tape(convgen).leaf(StandInArray(POOL_INPUT, np.float32))
    return (max_pools(stub_tape, stub_x, ", tape + validators (stub backend)")
            + max_pools(cuda_tape, cuda_x, ", + CUDA backend (stand-in CuPy)"))


def measure_split(convgen: Any, calls: int = HOST_CALLS, profile: bool = False) -> dict[str, Any]:
    """µs per call of `split_ops` (no GPU needed), and their cProfiles with `profile`."""
    ops = split_ops(convgen)
    result: dict[str, Any] = {"host_path": convgen.cuda.HOST_PATH, "ops": {}, "profiles": {}}
    for op in ops:
        result["ops"][op.name] = per_call_us(op.call, calls, lambda: None)
        print(f"    {op.name:<72} {result['ops'][op.name]['us_per_call']:8.2f} µs per call", flush=True)
    if profile:
        result["profiles"] = {op.name: profile_summary(op.call, calls, lambda: None) for op in ops}
    return result


def per_call_us(call: Callable[[], Any], calls: int, synchronize: Callable[[], None]) -> dict[str, Any]:
    """µs per call over `calls` back-to-back calls and a device synchronize, median of HOST_ROUNDS rounds."""
    for _ in range(WARMUP_CALLS):
        call()
    synchronize()
    rounds = []
    for _ in range(HOST_ROUNDS):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        synchronize()
        rounds.append((time.perf_counter() - started) / calls * 1e6)
    return {"us_per_call": statistics.median(rounds), "rounds_us": rounds, "calls_per_round": calls}


def profile_summary(call: Callable[[], Any], calls: int, synchronize: Callable[[], None]) -> dict[str, Any]:
    """cProfile of `calls` calls: the PROFILE_TOP functions by own time, in µs per op call, and the text."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    synchronize()
    stats = pstats.Stats(profile, stream=io.StringIO()).sort_stats("tottime")
    top = []
    for function in stats.fcn_list[:PROFILE_TOP]:
        _, primitive_calls, own_s, cumulative_s, _ = stats.stats[function]
        top.append({"function": short_function(function), "calls_per_op": primitive_calls / calls,
                    "own_us_per_op": own_s / calls * 1e6, "cumulative_us_per_op": cumulative_s / calls * 1e6})
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(PROFILE_TOP)
    return {"total_us_per_op": stats.total_tt / calls * 1e6, "top": top, "text": text.getvalue()}


def short_function(function: tuple[str, int, str]) -> str:
    """file:line(name), the file relative to the package or the standard library it is in."""
    path, line, name = function
    for marker in ("site-packages/", "runtime/", "generated/", "benchmarks/", "lib/python"):
        if marker in path:
            path = path[path.index(marker):]
            break
    return f"{path}:{line}({name})"


def measure_host(cupy: Any, torch: Any, convgen: Any, calls: int = HOST_CALLS) -> dict[str, Any]:
    """Every tiny op's µs per call, the ratios of convgen's max pools to PyTorch's, and the profiles."""
    synchronize = cupy.cuda.runtime.deviceSynchronize
    ops = tiny_ops(cupy, torch, convgen)
    result: dict[str, Any] = {"calls": calls, "rounds": HOST_ROUNDS, "cpu": platform.processor() or platform.machine(),
                              "cpu_count": os.cpu_count(), "python": platform.python_version(),
                              "host_path": convgen.cuda.HOST_PATH, "ops": {}, "profiles": {}}
    for op in ops:
        result["ops"][op.name] = per_call_us(op.call, calls, synchronize)
        print(f"    {op.name:<48} {result['ops'][op.name]['us_per_call']:8.2f} µs per call", flush=True)
    baseline = next(op.name for op in ops if op.baseline)
    result["baseline"] = baseline
    result["over_baseline"] = {op.name: result["ops"][op.name]["us_per_call"] / result["ops"][baseline]["us_per_call"]
                               for op in ops if op.profiled}
    for op in ops:
        if op.profiled:
            result["profiles"][op.name] = profile_summary(op.call, calls, synchronize)
    print("    where convgen's own Python goes (stand-ins, no GPU work):", flush=True)
    result["split"] = measure_split(convgen, calls)
    return result


def format_host(host: dict[str, Any]) -> list[str]:
    """The µs per call of each op and, per profiled op, its top functions by own time."""
    if "error" in host:
        return [f"Host overhead: not measured ({host['error']})"]
    lines = [f"Host overhead per call ({host['calls']} back-to-back calls, median of {host['rounds']} rounds, "
             f"{host['cpu']}, {host['cpu_count']} CPUs, the CUDA tape's host path {host.get('host_path', 'python')}):",
             ""]
    lines += [f"- {name}: {entry['us_per_call']:.2f} µs" for name, entry in host["ops"].items()]
    lines += [f"- {name} / {host['baseline']}: {ratio:.2f}×" for name, ratio in host["over_baseline"].items()]
    if "split" in host:
        lines += ["", "The same max pools on stand-ins (convgen's own Python, no CuPy work):", ""]
        lines += format_split(host["split"])
    for name, profile in host["profiles"].items():
        lines += ["", f"cProfile of {name} ({profile['total_us_per_op']:.1f} µs per call under the profiler), "
                      "top functions by own time, µs per call:"]
        lines += [f"  {entry['own_us_per_op']:7.2f} own {entry['cumulative_us_per_op']:7.2f} cum "
                  f"{entry['calls_per_op']:5.2f}× {entry['function']}" for entry in profile["top"]]
    return lines


def format_split(split: dict[str, Any]) -> list[str]:
    """One line per stand-in op: its µs per call (the CUDA backend's on the tape's host path)."""
    path = split.get("host_path", "python")
    return [f"- {name}: {entry['us_per_call']:.2f} µs" + (f" ({path} host path)" if "CUDA backend" in name else "")
            for name, entry in split["ops"].items()]


@contextmanager
def python_host_path() -> Iterator[None]:
    """Inside the block every op call of the CUDA tape and of convgen.torch takes the Python path: no entries are kept
    for the compiled one (convgen.host_path, convgen.torch.host_path). For the scripts that mark or swap the Python
    path's methods (the launches, the allocations, the passes), which a call replayed in C would not run."""
    import convgen.host_path as tape_paths
    from convgen.torch import host_path as torch_paths

    saved = tape_paths.remember, torch_paths.remember, torch_paths.remember_backward
    tape_paths.remember = torch_paths.remember = torch_paths.remember_backward = lambda *args: None
    tape_paths.CALLS.clear()
    torch_paths.clear()
    try:
        yield
    finally:
        tape_paths.remember, torch_paths.remember, torch_paths.remember_backward = saved
