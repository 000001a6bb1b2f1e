#!/usr/bin/env python3
"""Run one benchmark case's forward and backward on the CUDA backend a few times and nothing else: the
program to put under a profiler, for example

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \\
        -k conv_r2_forward --launch-skip 1 --launch-count 1 python3 benchmarks/profile_case.py conv2d_128_128_n8

(`-k` takes the exact kernel name: a regex would also match the stage's `_pack` kernel, launched first.)

    python benchmarks/profile_case.py CASE [--repeat N] [--forward-only] [--precision P]
"""

from __future__ import annotations

import argparse

from convgen.cuda import CupyBackend
from suite.cases import CASES_BY_NAME


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=sorted(CASES_BY_NAME))
    parser.add_argument("--repeat", type=int, default=3, help="forward (+ backward) runs")
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="highest",
                        help="how the conv GEMMs multiply (CupyBackend's precision)")
    args = parser.parse_args()
    import cupy

    geom = CASES_BY_NAME[args.case].geometry
    backend = CupyBackend(precision=args.precision)
    rng = cupy.random.RandomState(1)
    inputs = tuple(rng.standard_normal(shape, dtype=cupy.float32) for shape in geom.parent_shapes)
    grad = rng.standard_normal(geom.output_shape, dtype=cupy.float32)
    for _ in range(args.repeat):
        _, saved = backend.forward(geom, inputs)
        if not args.forward_only:
            backend.backward(geom, inputs, saved, grad)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
