#!/usr/bin/env python3
"""Run one benchmark case's forward and backward on the CUDA backend a few times and nothing else: the
program to put under a profiler, for example

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \\
        -k conv_r2_forward --launch-skip 1 --launch-count 1 python3 benchmarks/profile_case.py conv2d_128_128_n8

(`-k` takes the exact kernel name: a regex would also match the stage's `_pack` kernel, launched first.)

    python benchmarks/profile_case.py CASE [--repeat N] [--forward-only] [--precision P] [--dtype D]
"""

from __future__ import annotations

import argparse

from convgen.cuda import CupyBackend
from suite.cases import CASES_BY_NAME
from suite.contestants import random_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=sorted(CASES_BY_NAME))
    parser.add_argument("--repeat", type=int, default=3, help="forward (+ backward) runs")
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="highest",
                        help="how the conv GEMMs multiply (CupyBackend's precision)")
    parser.add_argument("--dtype", choices=("float32", "float64", "float16", "bfloat16"), default="float32",
                        help="the arrays' element type (16-bit: the values of float32 normals, bfloat16 truncated)")
    args = parser.parse_args()
    import cupy

    geom = CASES_BY_NAME[args.case].geometry
    backend = CupyBackend(args.dtype, precision=args.precision)
    inputs, grad = random_inputs(cupy, geom, args.dtype, seed=1)
    for _ in range(args.repeat):
        _, saved = backend.forward(geom, inputs)
        if not args.forward_only:
            backend.backward(geom, inputs, saved, grad)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
