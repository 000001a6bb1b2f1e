#!/usr/bin/env python3
"""What the host path's launch groups and one scratch allocation a pass save, in one process: a conv's forward and
training step through convgen.torch, timed as bench.py's user calls (GPU idle, L2 flushed, CUDA events around the
Python call), rounds alternating between the backend as it is and the same backend with one of them undone: each
queued member of a group launched as its own kernel (as before the groups), an allocation a scratch buffer (as
before one a pass: the pass's one allocation and one more for each of its other buffers, of their sizes, held as
long; the kernels read the pass's), the pass's scratch made as a tensor (as before the caching allocator's bare
blocks), or no launch programs (each call runs the pass's Python as the trace does, deciding its layouts, groups and
outputs again, as before runtime/launch_program.py). Whole processes differ by 30-50% in speed on the H200's hosts
(benchmarks/NOTES.md), so only modes in one process show a few µs. Also checks that every mode gives the same bits.
With `--stand-in` (no GPU, CuPy or PyTorch), the backend's own Python path of a forward and a backward on the stand-in
CuPy (benchmarks/suite/stand_in.py), whose launches and allocations do nothing: what the modes differ by there is
Python alone, before the driver's few µs a launch and the allocator's a buffer.

    python3 benchmarks/host_path_ab.py [--cases conv2d_64_56_n32,conv2d_128_128_n8] [--dtypes bfloat16]
                                       [--rounds 200] [--stand-in]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import convgen.cuda
from convgen.cuda import STORAGE_DTYPES, CupyBackend
from suite import stand_in
from suite.cases import CASES_BY_NAME, Case
from suite.host import python_host_path
from suite.timing import L2_FLUSH_BYTES

_METHODS = ("_launch_group", "_scratch_base")
_AS_IS: dict[type, dict[str, Callable[..., Any]]] = {}  # backend class -> its methods as they are


def one_launch_a_kernel(self: CupyBackend, compiled: Any, group: str, queued: dict[str, tuple[Any, ...]]) -> None:
    """_launch_group as the launches were before the groups: each queued member alone."""
    for kernel, (function, grid, block, shared_bytes, args) in queued.items():
        self._call(kernel, function, grid, block, shared_bytes, args)


def buffer_sizes(layout: Any) -> list[int]:
    """Bytes of each buffer of a pass's scratch layout, in address order."""
    starts = sorted({offset for buffers in layout.stages.values()
                     for offset in (buffers.pack, buffers.source, buffers.partial) if offset is not None})
    return [end - start for start, end in zip(starts, [*starts[1:], layout.size])]


_OTHER_BUFFERS: dict[int, tuple[Any, list[int]]] = {}  # id(layout) -> (layout, its buffers' sizes but the first)


def an_allocation_a_buffer(self: CupyBackend, layout: Any) -> tuple[Any, int]:
    """_scratch_base with the allocator's calls of before one allocation a pass: the pass's own, whose addresses the
    kernels take, and one more for each other buffer of the layout, of its size, held as long (the sizes worked out
    once, so that only the allocations differ)."""
    scratch, base = _AS_IS[type(self)]["_scratch_base"](self, layout)
    known = _OTHER_BUFFERS.get(id(layout))
    if known is None:
        known = _OTHER_BUFFERS[id(layout)] = (layout, buffer_sizes(layout)[1:])
    return (scratch, [self._scratch((size,), "uint8") for size in known[1]]), base


def _pass_itself(backend: Any, input_shapes: tuple[Any, ...], run: Callable[..., Any]) -> Callable[..., Any]:
    """launch_program.trace for "no launch programs": the pass itself stands in for its program."""
    return run


def _pass_run(backend: Any, run: Callable[..., Any], layout: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """launch_program.replay for "no launch programs": the pass run as it is traced, deciding everything per call."""
    returned = run(backend, *(backend._address(array) for array in inputs))
    return returned if isinstance(returned, tuple) else (returned,)


MODES: dict[str, dict[str, Callable[..., Any]]] = {
    "as is": {},
    "one launch a kernel": {"_launch_group": one_launch_a_kernel},
    "an allocation a buffer": {"_scratch_base": an_allocation_a_buffer},
    "scratch as a tensor": {"_scratch_base": CupyBackend._scratch_base},  # the tape's: `_scratch`, a torch tensor
    "no launch programs": {"trace": _pass_itself, "replay": _pass_run},  # convgen.cuda's, not the class's
}
STAND_IN_MODES = ("as is", "one launch a kernel", "an allocation a buffer", "no launch programs")  # no tensors there
_MODULE_FUNCTIONS = {name: getattr(convgen.cuda, name) for name in ("trace", "replay")}


_PROGRAMS: dict[tuple[int, str], dict[Any, Any]] = {}  # (id of a Compiled, mode) -> its passes' programs in that mode


def use(mode: str, backend_class: type, backends: Any) -> None:
    """`backend_class`'s methods and convgen.cuda's launch-program functions as `mode` has them (as they are where the
    mode changes nothing), and each conv geometry of `backends` with the programs traced in that mode (the first
    call of a pass in a mode traces it)."""
    as_is = _AS_IS.setdefault(backend_class, {name: getattr(backend_class, name) for name in _METHODS})
    for name, value in {**as_is, **_MODULE_FUNCTIONS, **MODES[mode]}.items():
        setattr(convgen.cuda if name in _MODULE_FUNCTIONS else backend_class, name, value)
    for backend in backends:
        for compiled in backend._compiled.values():
            if compiled.is_conv:
                compiled.programs = _PROGRAMS.setdefault((id(compiled), mode), {})


def calls(case: Case, dtype: Any) -> tuple[dict[str, Callable[[], Any]], Callable[[], list[Any]]]:
    """The case's forward and training step on CUDA tensors of `dtype`, and what they leave to compare."""
    import convgen.torch as adapter
    import torch

    generator = torch.Generator(device="cuda").manual_seed(0)
    x, weight, bias = (torch.randn(shape, device="cuda", generator=generator).to(dtype).requires_grad_()
                       for shape in (case.input_shape, case.weight_shape, (case.out_c,)))
    upstream = torch.randn(case.output_shape, device="cuda", generator=generator).to(dtype)
    outputs: list[torch.Tensor] = []

    def forward() -> Any:
        return adapter.conv(x, weight, bias, case.strides, case.paddings)

    def step() -> None:
        for leaf in (x, weight, bias):
            leaf.grad = None
        y = forward()
        torch.autograd.backward(y, upstream)
        outputs[:] = [y.detach(), x.grad, weight.grad, bias.grad]

    def results() -> list[Any]:
        step()
        return [t.clone() for t in outputs]

    return {"forward": forward, "forward+backward": step}, results


def timed_ms(call: Callable[[], Any], flush: Any) -> float:
    import torch

    flush.zero_()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def stand_in_step_us(backend: CupyBackend, case: Case, dtype: str, rounds: int) -> dict[str, float]:
    """Mode -> median µs of `backend`'s Python a forward and a backward of the case on stand-in arrays."""
    geom = case.geometry
    inputs = tuple(stand_in.StandInArray(shape, STORAGE_DTYPES[dtype]) for shape in geom.parent_shapes)
    grad = stand_in.StandInArray(geom.output_shape, STORAGE_DTYPES[dtype])
    samples: dict[str, list[float]] = {mode: [] for mode in STAND_IN_MODES}
    for _ in range(rounds):
        for mode in STAND_IN_MODES:
            use(mode, CupyBackend, (backend,))
            start = time.perf_counter()
            for _ in range(100):
                backend.forward(geom, inputs)
                backend.backward(geom, inputs, None, grad)
            samples[mode].append((time.perf_counter() - start) * 1e4)
    use("as is", CupyBackend, (backend,))
    return {mode: statistics.median(values) for mode, values in samples.items()}


def stand_in_ab(cases: list[Case], dtypes: list[str], precision: str, rounds: int) -> None:
    print(f"host path A/B on the stand-in CuPy, µs of Python a forward + backward (median of {rounds} rounds of "
          f"100; float32 in {precision})")
    for case in cases:
        for dtype in dtypes:
            with stand_in.imports_as(stand_in.stand_in_cupy()):
                backend = CupyBackend(dtype, precision if dtype == "float32" else "medium")
            medians = stand_in_step_us(backend, case, dtype, rounds)
            print(f"{case.title} {dtype:<9} " + "  ".join(f"{mode}: {us:.2f}" for mode, us in medians.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="conv2d_64_56_n32,conv2d_128_128_n8")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="medium",
                        help="convgen's float32 precision")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--stand-in", action="store_true", help="the backend's Python alone, on the stand-in CuPy")
    args = parser.parse_args()
    cases = [CASES_BY_NAME[name] for name in args.cases.split(",")]
    if args.stand_in:
        stand_in_ab(cases, args.dtypes.split(","), args.precision, args.rounds)
        return
    import convgen.torch as adapter
    import torch
    from convgen.torch import devices

    backend_class, backends = devices._TorchCupyBackend, devices._cuda_runner()._backends.values()

    adapter.set_float32_precision(args.precision)
    flush = torch.empty(L2_FLUSH_BYTES // 4, device="cuda")
    with python_host_path():  # each mode swaps the Python path's methods
        gpu_ab(cases, args.dtypes.split(","), args.precision, args.rounds, flush, backend_class, backends)


def gpu_ab(cases: list[Case], dtypes: list[str], precision: str, rounds: int, flush: Any, backend_class: type,
           backends: Any) -> None:
    """The A/B on CUDA tensors through convgen.torch, printed a line per case, dtype and call."""
    import torch

    print(f"host path A/B, ms (median of {rounds} rounds, modes alternating; float32 in {precision})")
    for case in cases:
        for dtype in (getattr(torch, name) for name in dtypes):
            ops, results = calls(case, dtype)
            same = []
            for mode in MODES:
                use(mode, backend_class, backends)
                for _ in range(20):  # compiles, caches, the allocator's blocks
                    results()
                same.append(results())
            bits = all(torch.equal(a, b) for other in same[1:] for a, b in zip(same[0], other, strict=True))
            for name, op in ops.items():
                samples: dict[str, list[float]] = {mode: [] for mode in MODES}
                for _ in range(rounds):
                    for mode in MODES:
                        use(mode, backend_class, backends)
                        samples[mode].append(timed_ms(op, flush))
                medians = {mode: statistics.median(values) for mode, values in samples.items()}
                print(f"{case.title} {str(dtype).removeprefix('torch.'):<9} {name:<17} "
                      + "  ".join(f"{mode}: {ms:.4f}" for mode, ms in medians.items()) + f"  same bits: {bits}")
    use("as is", backend_class, backends)


if __name__ == "__main__":
    main()
