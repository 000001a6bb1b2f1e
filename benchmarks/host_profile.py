#!/usr/bin/env python3
"""Where the host time of one CUDA-tape call goes (issue 9's host path).

Times back-to-back calls of tiny ops, where the GPU work is negligible so the host path dominates:
convgen's `max_pool` (N-D) and `max_pool2d` on a 4×4 input against `torch.nn.functional.max_pool2d`
on the same input and host, next to the floor CuPy itself sets (an empty kernel launch, one
`cupy.empty`) and a tiny conv2d and its backward; then cProfiles convgen's two max pools, and times
them on stand-ins (the split: tape and validators alone; with the CUDA backend's Python path on a CuPy
that does nothing). Prints µs per call and the profiles, and writes them to JSON. `bench.py --host`
runs the same after its cases and puts the numbers under "host" in bench.json. `--split` times and
profiles only the stand-ins, and needs no GPU, CuPy or PyTorch. The CUDA tape runs on its compiled host path where
the extension is built; `CONVGEN_HOST_PATH=python` times its Python path instead (convgen.host_path).

    python benchmarks/host_profile.py [--calls N] [--json PATH] [--split]
"""

from __future__ import annotations

import json
import os
import sys
from argparse import ArgumentParser
from pathlib import Path

from suite.contestants import load_libraries
from suite.host import HOST_CALLS, format_host, format_split, measure_host, measure_split
from suite.report import BENCH_DIR, finite_json


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=HOST_CALLS, help="back-to-back calls per round and op")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the numbers (default: $OUT/host_profile.json if OUT is set, "
                             "else benchmarks/results/host_profile.json)")
    parser.add_argument("--split", action="store_true",
                        help="only the max pools on stand-ins (stub backend; stand-in CuPy), with cProfiles: "
                             "convgen's own Python, measurable without a GPU")
    args = parser.parse_args(argv)
    out = os.environ.get("OUT")
    json_path = args.json or (Path(out) if out else BENCH_DIR / "results") / "host_profile.json"
    if args.split:
        import convgen.cpu
        import convgen.cuda

        host = measure_split(convgen, args.calls, profile=True)
        print()
        print("\n".join(["Host path on stand-ins, µs per call:", *format_split(host)]))
    else:
        libs = load_libraries("host_profile.py")
        host = measure_host(libs.cupy, libs.torch, libs.convgen, args.calls)
        print()
        print("\n".join(format_host(host)))
    for name, profile in host["profiles"].items():
        print(f"\n== cProfile of {args.calls} calls: {name}\n{profile['text']}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(finite_json({"host": host}), indent=1) + "\n")
    print(f"JSON: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
