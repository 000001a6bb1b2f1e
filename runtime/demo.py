"""A two-layer 4-D network (conv, max pool, conv, average pool) run forward and backward on the
tape: on the CPU, and on the GPU when one is present. `convgen demo` or `python -m convgen.demo`.
"""

from __future__ import annotations

import sys
import time

import convgen
import numpy as np


def gpu_present() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "run on the CPU only"
        return False


def run(tape: convgen.cpu.Tape, label: str) -> None:
    rng = np.random.default_rng(0)
    spatial = (8, 8, 8, 8)
    t = tape
    t, x = t.leaf(rng.standard_normal((2, *spatial), dtype=np.float32), name="x")
    t, w1 = t.leaf(rng.standard_normal((4, 2, 3, 3, 3, 3), dtype=np.float32) * 0.1, name="w1")
    t, b1 = t.leaf(np.full(4, 0.1, np.float32), name="b1")
    t, w2 = t.leaf(rng.standard_normal((3, 4, 3, 3, 3, 3), dtype=np.float32) * 0.1, name="w2")
    t, b2 = t.leaf(np.full(3, -0.1, np.float32), name="b2")

    start = time.perf_counter()
    ones = (1, 1, 1, 1)
    t, h = t.conv(w1, b1, x, in_c=2, out_c=4, kernel=(3, 3, 3, 3), stride=ones, padding=ones,
                  in_spatial=spatial).unwrap()
    t, p = t.max_pool(h, c=4, in_spatial=spatial, kernel=(2, 2, 2, 2), stride=(2, 2, 2, 2),
                      padding=(0, 0, 0, 0)).unwrap()
    t, h2 = t.conv(w2, b2, p, in_c=4, out_c=3, kernel=(3, 3, 3, 3), stride=ones, padding=ones,
                   in_spatial=t.shape(p)[1:]).unwrap()
    t, y = t.avg_pool(h2, c=3, in_spatial=t.shape(h2)[1:], kernel=(2, 2, 2, 2), stride=(2, 2, 2, 2),
                      padding=(0, 0, 0, 0)).unwrap()
    grads = t.backward(y, np.ones(t.shape(y), np.float32)).unwrap()
    seconds = time.perf_counter() - start

    compiles = " (the first call compiles the kernels)" if label == "cuda" else ""
    print(f"[{label}] forward + backward in {seconds * 1e3:.1f} ms{compiles}")
    for node in (x, h, p, h2, y):
        print(f"  {t.name(node):<10} {str(t.shape(node)):<22}")
    for node in (w1, b1, w2, b2, x):
        print(f"  |d {t.name(node)}| = {float(np.linalg.norm(_host(grads[node]))):.6f}")


def _host(array: object) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


def main(device: str = "all") -> int:
    if device in ("cpu", "all"):
        run(convgen.cpu.Tape(), "cpu")
    if device == "cuda" or (device == "all" and gpu_present()):
        run(convgen.cuda.Tape(), "cuda")
    elif device == "all":
        print("[cuda] skipped: no CUDA device (or no CuPy) on this machine")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "all"))
