"""Host overhead per call of a tiny convolution ([1, 4, 8, 8] input, 3x3 kernel) through convgen.torch:

- custom op: the torch.library op `convgen::conv` (what torch.compile traces),
- autograd.Function: the device code, then the eager wrapper attaching its backward (functional.py's `_Eager`),
- functional: `convgen.torch.conv` as users call it (validation included, whichever path it takes),
- torch: `torch.nn.functional.conv2d`, the yardstick (the issue allows 1.5x of it),
- and a 2x2 max pool of the same input, `convgen.torch.max_pool` against `torch.nn.functional.max_pool2d`,

forward only (under no_grad, where the functional path goes straight to the device code) and forward +
backward, on the CPU and (when present) on CUDA. The `stub` rows replace the device code with one that
only allocates its outputs, leaving the host cost of each path alone (on the CPU the NumPy compute of
even a tiny conv hides it; on CUDA what is left is torch's autograd bookkeeping and the allocations); they
run every call on the Python path (the compiled one would replay the real device code).
Median µs per call over `--calls` back-to-back calls, repeated `--repeats` times. `--json` prints the
rows as JSON. `--profile` also prints, per device, a cProfile of the functional path (forward, then
forward + backward): where a call's host time goes.

    python3 benchmarks/torch_overhead.py [--calls 3000] [--repeats 5] [--json] [--profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from convgen.torch import devices, functional, library
from suite.host import profile_summary, python_host_path


def _per_call_us(run: Callable[[], object], calls: int, repeats: int, sync: Callable[[], None]) -> float:
    for _ in range(min(calls, 200)):  # warm-up: compiles, caches
        run()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _paths(device: str) -> dict[str, Callable[..., torch.Tensor]]:
    stride, padding, dilation = (1, 1), (1, 1), (1, 1)

    def custom_op(x, w, b):
        return library.conv(x, w, b, stride, padding, dilation, 1, False, "highest")

    def autograd_function(x, w, b):
        geom = library.conv_geometry("conv", x.shape, w.shape, stride, padding, dilation, 1, "zeros")
        computed = devices.forward("conv", geom, (w, b, x), "highest")
        return functional._Eager.apply("conv", geom, "highest", computed, w, b, x)

    def torch_conv2d(x, w, b):
        return F.conv2d(x, w, b, stride, padding, dilation)

    return {"custom op": custom_op, "autograd.Function": autograd_function,
            "functional": lambda x, w, b: functional.conv(x, w, b, 1, 1), "torch F.conv2d": torch_conv2d,
            "functional max_pool": lambda x, w, b: functional.max_pool(x, 2),
            "torch F.max_pool2d": lambda x, w, b: F.max_pool2d(x, 2)}


class _StubDevices:
    """devices.forward/backward replaced by allocations of the right shapes, and every call on the Python path,
    while the context is open."""

    def __enter__(self) -> None:
        self.python_path = python_host_path()
        self.python_path.__enter__()
        self.saved = devices.forward, devices.backward
        devices.forward = lambda op, geom, tensors, precision="highest": (tensors[-1].new_empty(geom.output_shape),)
        devices.backward = lambda op, geom, tensors, saved, grad, precision="highest", wanted=None: tuple(
            grad.new_empty(shape) if wants else None  # a missing bias gets its gradient, as the kernels give one
            for shape, wants in zip(geom.parent_shapes, wanted or (True,) * len(tensors)))

    def __exit__(self, *exc: object) -> None:
        devices.forward, devices.backward = self.saved
        self.python_path.__exit__(*exc)


def _tiny_conv(device: str) -> tuple[Callable[[], None], tuple[torch.Tensor, ...]]:
    """The device's synchronize and the tiny conv's (x, w, b, upstream gradient), inputs requiring grad."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.randn(1, 4, 8, 8, device=device, requires_grad=True)
    w = torch.randn(4, 4, 3, 3, device=device, requires_grad=True)
    b = torch.randn(4, device=device, requires_grad=True)
    return sync, (x, w, b, torch.ones(1, 4, 8, 8, device=device))


def measure(device: str, calls: int, repeats: int, stub: bool = False) -> list[dict]:
    sync, (x, w, b, grad) = _tiny_conv(device)
    upstream = {grad.shape: grad, (1, 4, 4, 4): torch.ones(1, 4, 4, 4, device=device)}  # the conv's, the pool's

    def step(path: Callable[..., torch.Tensor]) -> None:
        y = path(x, w, b)
        torch.autograd.backward(y, upstream[y.shape])

    rows = []
    for name, path in _paths(device).items():
        with torch.no_grad():
            forward = _per_call_us(lambda path=path: path(x, w, b), calls, repeats, sync)
        both = _per_call_us(lambda path=path: step(path), calls // 2, repeats, sync)
        rows.append({"device": device + (" stub" if stub else ""), "path": name, "forward_us": round(forward, 2),
                     "forward_backward_us": round(both, 2)})
    return rows


def profiles(device: str, calls: int) -> dict[str, str]:
    """cProfile text of `calls` functional calls on `device`: forward (no grad), and forward + backward."""
    sync, (x, w, b, grad) = _tiny_conv(device)
    conv = functional.conv

    def forward() -> None:
        with torch.no_grad():
            conv(x, w, b, 1, 1)

    def forward_backward() -> None:
        torch.autograd.backward(conv(x, w, b, 1, 1), grad)

    texts = {}
    for name, call in (("forward", forward), ("forward + backward", forward_backward)):
        _per_call_us(call, min(calls, 200), 1, sync)  # warm-up
        texts[f"{device} functional {name}"] = profile_summary(call, calls, sync)["text"]
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", action="store_true", help="also cProfile the functional path per device")
    args = parser.parse_args()
    devices_present = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = [row for device in devices_present for row in measure(device, args.calls, args.repeats)]
    with _StubDevices():
        rows += [row for device in devices_present for row in measure(device, args.calls, args.repeats, stub=True)]
    texts = {name: text for device in devices_present for name, text in profiles(device, args.calls).items()} \
        if args.profile else {}
    if args.json:
        print(json.dumps({"rows": rows, "profiles": texts} if args.profile else rows, indent=1))
        return
    print(f"{'device':<10}{'path':<22}{'forward µs':>12}{'fwd+bwd µs':>12}")
    for row in rows:
        print(f"{row['device']:<10}{row['path']:<22}{row['forward_us']:>12.1f}{row['forward_backward_us']:>12.1f}")
    for name, text in texts.items():
        print(f"\n== cProfile of {args.calls} calls: {name}\n{text}")


if __name__ == "__main__":
    main()
