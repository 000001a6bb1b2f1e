"""Where the host time of one CUDA-tape call goes.

Times many calls of tiny ops (the GPU work is negligible, so the host path dominates) next to the
floor CuPy itself sets (an empty kernel launch, one `cupy.empty`), then profiles the same loop with
cProfile. Run on a GPU machine: `python benchmarks/host_profile.py [--calls N]`.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np


def per_call_us(fn, calls: int) -> float:
    import cupy

    for _ in range(20):
        fn()
    cupy.cuda.runtime.deviceSynchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    cupy.cuda.runtime.deviceSynchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()

    import convgen
    import cupy

    rng = np.random.default_rng(0)
    t = convgen.cuda.Tape()
    t, w = t.leaf(rng.standard_normal((4, 4, 3, 3), dtype=np.float32))
    t, b = t.leaf(rng.standard_normal(4, dtype=np.float32))
    t, x = t.leaf(rng.standard_normal((4, 8, 8), dtype=np.float32))
    t, w4 = t.leaf(rng.standard_normal((2, 2, 3, 3, 3, 3), dtype=np.float32))
    t, b4 = t.leaf(rng.standard_normal(2, dtype=np.float32))
    t, x4 = t.leaf(rng.standard_normal((2, 4, 4, 4, 4), dtype=np.float32))

    empty = cupy.RawKernel('extern "C" __global__ void nothing(float* y) {}', "nothing")
    y = cupy.empty(1, cupy.float32)
    cases = {
        "cupy: empty kernel launch": lambda: empty((1,), (32,), (y,)),
        "cupy: cupy.empty(64 floats)": lambda: cupy.empty(64, cupy.float32),
        "conv2d 4->4 8x8 k3 p1": lambda: t.conv2d(w, b, x, in_c=4, out_c=4, k_h=3, k_w=3, stride=1, padding=1,
                                                  in_h=8, in_w=8),
        "conv 2->2 4^4 k3 p1": lambda: t.conv(w4, b4, x4, in_c=2, out_c=2, kernel=(3,) * 4, stride=(1,) * 4,
                                              padding=(1,) * 4, in_spatial=(4,) * 4),
        "max_pool2d_pad C4 8x8 k3 p1": lambda: t.max_pool2d_pad(x, k_h=3, k_w=3, in_h=8, in_w=8, in_c=4, stride=1,
                                                                padding=1),
    }
    t2, y2 = cases["conv2d 4->4 8x8 k3 p1"]().unwrap()
    seed = cupy.ones(t2.shape(y2), cupy.float32)
    cases["backward of conv2d"] = lambda: t2.backward(y2, seed)

    for name, fn in cases.items():
        print(f"{name:<32} {per_call_us(fn, args.calls):8.1f} us per call")

    for name in ("conv2d 4->4 8x8 k3 p1", "backward of conv2d"):
        profile = cProfile.Profile()
        fn = cases[name]
        profile.enable()
        for _ in range(args.calls):
            fn()
        profile.disable()
        cupy.cuda.runtime.deviceSynchronize()
        print(f"\n== cProfile of {args.calls} calls: {name}")
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
