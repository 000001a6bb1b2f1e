#!/usr/bin/env python3
"""Host cost of the CuPy and torch calls a tiny op's host path is made of (issues 9 and 10): allocations
(`cupy.empty`, the `cupy.ndarray` constructor, a bare `cupy.cuda.alloc`, `torch.empty`), a kernel launch
with its arguments passed as arrays, as a bare allocation's MemoryPointer, as CuPy's CIntptr pointers or
as Python ints, its shared memory and stream by keyword, or straight to the driver (cuLaunchKernel through
CuPy's binding, the argument slots in an `array`), a launch as convgen's backends make it (the tape's on CuPy
arrays, convgen.torch's on tensors), and the device, stream and pointer queries around them. µs per call, the
median of 5 rounds of back-to-back calls. Needs a GPU, CuPy and torch.

    python3 benchmarks/launch_parts.py [--calls N]
"""

from __future__ import annotations

import statistics
import time
from argparse import ArgumentParser
from collections.abc import Callable
from typing import Any

SOURCE = r"""extern "C" __global__ void touch(const float* a, float* b, unsigned* c, unsigned n)
{ if (n == 12345) b[0] = a[0] + c[0]; }"""


def per_call(call: Callable[[], Any], calls: int, synchronize: Callable[[], Any]) -> float:
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        synchronize()
    return statistics.median(rounds)


def rows(cupy: Any, numpy: Any, torch: Any) -> dict[str, Callable[[], Any]]:
    """Name -> the call it times."""
    from array import array

    from convgen.cuda import CupyBackend
    from convgen.torch import devices
    from cupy.cuda.function import CIntptr

    kernel = cupy.RawModule(code=SOURCE).get_function("touch")
    a, b = cupy.zeros((1, 4, 4), cupy.float32), cupy.zeros((1, 2, 2), cupy.float32)
    c, n = cupy.zeros((1, 2, 2), cupy.uint32), numpy.uint32(4)
    pointers = tuple(CIntptr(x.data.ptr) for x in (a, b, c))
    memory, float32 = cupy.cuda.alloc(16), numpy.dtype(numpy.float32)
    tensor = torch.zeros(1, 4, 4, device="cuda")
    device = tensor.device
    function = kernel.kernel.ptr  # the CUfunction of the current device

    def driver_launch() -> None:
        # cuLaunchKernel's kernelParams: a pointer per argument to its value, each value in an 8-byte slot.
        slots = array("Q", (a.data.ptr, b.data.ptr, c.data.ptr, 4))
        first = slots.buffer_info()[0]
        params = array("Q", (first, first + 8, first + 16, first + 24))
        cupy.cuda.driver.launchKernel(function, 1, 1, 1, 32, 1, 1, 0, 0, params.buffer_info()[0], 0)

    tape_backend = CupyBackend()
    torch_backend = devices._TorchCupyBackend("float32", "highest")
    torch_backend.call.stream = torch._C._cuda_getCurrentRawStream(0)
    a_tensor, b_tensor, c_tensor = torch.from_dlpack(a), torch.from_dlpack(b), torch.from_dlpack(c)

    kept = array("Q", (a.data.ptr, b.data.ptr, c.data.ptr, 4))  # the slots: the lambda below holds them
    prepared = array("Q", (kept.buffer_info()[0] + 8 * i for i in range(4)))
    return {
        "cupy.empty((1, 2, 2), float32)": lambda: cupy.empty((1, 2, 2), numpy.float32),
        "cupy.ndarray((1, 2, 2), float32)": lambda: cupy.ndarray((1, 2, 2), numpy.float32),
        "cupy.ndarray((1, 2, 2), dtype object)": lambda: cupy.ndarray((1, 2, 2), float32),
        "cupy.cuda.alloc(16)": lambda: cupy.cuda.alloc(16),
        # An output and its scratch in one allocation: the array made over a block allocated for both.
        "cupy.ndarray((1, 2, 2), float32, memptr=cupy.cuda.alloc(32))": lambda: cupy.ndarray(
            (1, 2, 2), float32, cupy.cuda.alloc(32)),
        "cupy.ndarray((1, 2, 2), float32, memptr made before)": lambda: cupy.ndarray((1, 2, 2), float32, memory),
        "launch, arrays": lambda: kernel((1,), (32,), (a, b, c, n)),
        "launch, arrays, shared memory and stream by keyword": lambda: kernel((1,), (32,), (a, b, c, n),
                                                                               shared_mem=0, stream=None),
        "launch, arrays and a MemoryPointer": lambda: kernel((1,), (32,), (a, b, memory, n)),
        "launch, CIntptr pointers made before": lambda: kernel((1,), (32,), (*pointers, n)),
        "launch, CIntptr pointers made per call": lambda: kernel(
            (1,), (32,), (CIntptr(a.data.ptr), CIntptr(b.data.ptr), CIntptr(c.data.ptr), n)),
        "launch, Python int pointers": lambda: kernel((1,), (32,), (a.data.ptr, b.data.ptr, c.data.ptr, n)),
        "launch, driver.launchKernel, slots in an array": driver_launch,
        "driver.launchKernel alone, slots made before": lambda slots=kept: cupy.cuda.driver.launchKernel(
            function, 1, 1, 1, 32, 1, 1, 0, 0, prepared.buffer_info()[0], 0),
        "convgen tape launch (CupyBackend._call), the arrays' addresses read": lambda: tape_backend._call(
            "touch", function, (1,), (32,), 0, (*map(tape_backend._address, (a, b, c)), 4)),
        "convgen.torch launch (_TorchCupyBackend._call), the tensors' addresses read": lambda: torch_backend._call(
            "touch", function, (1,), (32,), 0, (*map(torch_backend._address, (a_tensor, b_tensor, c_tensor)), 4)),
        "cupy.cuda.get_current_stream().ptr": lambda: cupy.cuda.get_current_stream().ptr,
        "array.data.ptr": lambda: a.data.ptr,
        "cupy.cuda.runtime.getDevice()": cupy.cuda.runtime.getDevice,
        "torch.empty((1, 2, 2), dtype, device)": lambda: torch.empty((1, 2, 2), dtype=torch.float32, device=device),
        "torch.empty_like(tensor)": lambda: torch.empty_like(tensor),
        "tensor.new_empty((1, 2, 2))": lambda: tensor.new_empty((1, 2, 2)),
        "tensor.new_empty((1, 2, 2), dtype=)": lambda: tensor.new_empty((1, 2, 2), dtype=torch.bfloat16),
        "tensor.data_ptr()": tensor.data_ptr,
        "torch._C._cuda_getCurrentRawStream(0)": lambda: torch._C._cuda_getCurrentRawStream(0),
        "torch._C._cuda_getDevice()": torch._C._cuda_getDevice,
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls a round (default 20000)")
    args = parser.parse_args(argv)
    import cupy
    import numpy
    import torch

    for name, call in rows(cupy, numpy, torch).items():
        print(f"{name:56s} {per_call(call, args.calls, cupy.cuda.Device().synchronize):7.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
