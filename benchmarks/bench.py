#!/usr/bin/env python3
"""Time convgen's CUDA tape against PyTorch/cuDNN (and JAX for the 4-D conv) on the cases of
DESIGN.md "Figures to beat": one image, float32, channels first.

Every case is first checked against a float64 PyTorch reference, then timed forward and
forward+backward in two ways: (a) the call as a user makes it (CUDA events around the Python call,
GPU idle and L2 flushed before it, median of many) and (b) the kernels alone (CUDA-graph replay,
or N back-to-back calls / N where a graph cannot be captured, which the output says). PyTorch runs
with TF32 off (strict fp32) and on. Also measured: peak device memory of the op, and, in child
processes, the first-call compile time (fresh CuPy kernel cache) and the warm-disk-cache load time.
Prints a markdown table last and writes everything to JSON. The parts live in suite/.

    python benchmarks/bench.py [--quick] [--json PATH] [--cases NAME,...] [--list]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from suite.cases import CASES, CASES_BY_NAME, case_table
from suite.children import compile_child, jax_child, measure_compile_times
from suite.contestants import Libraries
from suite.measure import release_memory, run_case
from suite.report import CaseReport, default_json_path, environment, print_summary, write_json
from suite.timing import FULL, L2_FLUSH_BYTES, QUICK, one_line


def load_libraries() -> Libraries:
    """CuPy, PyTorch (CUDA) and convgen, or exit with a message saying what is missing."""
    try:
        import cupy
    except ImportError as error:
        sys.exit(f"bench.py: CuPy is not importable ({error}). This benchmark needs an NVIDIA GPU "
                 "with CuPy (cupy-cuda12x or cupy-cuda13x), PyTorch with CUDA, and convgen installed.")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as error:
        sys.exit(f"bench.py: no usable CUDA GPU ({one_line(error)}). Run it on a machine with an NVIDIA GPU.")
    try:
        import torch
    except ImportError as error:
        sys.exit(f"bench.py: PyTorch is not importable ({error}); it is the reference and the baseline.")
    if not torch.cuda.is_available():
        sys.exit("bench.py: this PyTorch has no CUDA (torch.cuda.is_available() is False).")
    try:
        import convgen
        import convgen.cuda
    except ImportError as error:
        sys.exit(f"bench.py: convgen is not importable ({error}); install it: "
                 "python3 -m pip install --no-deps --no-build-isolation -e .")
    flush_buffer = cupy.empty(L2_FLUSH_BYTES // 4, cupy.float32)
    return Libraries(cupy=cupy, torch=torch, convgen=convgen, flush_l2=lambda: flush_buffer.fill(0))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time convgen's CUDA tape against PyTorch/cuDNN (and JAX for conv4d) on the cases of "
                    "DESIGN.md 'Figures to beat'. Needs an NVIDIA GPU, CuPy, PyTorch with CUDA and convgen.",
        epilog="cases: " + ", ".join(f"{case.name} ({case.title})" for case in CASES))
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (under 2 minutes on an H200)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the results (default: $OUT/bench.json if OUT is set, "
                             "else benchmarks/results/latest.json)")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    parser.add_argument("--no-compile-time", action="store_true",
                        help="skip the two child processes that measure first-call compile and cache-load time")
    parser.add_argument("--list", action="store_true",
                        help="print the case table (shapes, floors, graph copies from each Geometry) and exit; "
                             "needs no GPU")
    parser.add_argument("--child", choices=("compile", "jax-forward", "jax-backward"), help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()] if args.cases else [c.name for c in CASES]
    unknown = [n for n in names if n not in CASES_BY_NAME]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES_BY_NAME)}")
    args.case_names = names
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.list:
        print(case_table([CASES_BY_NAME[name] for name in args.case_names]))
        return 0
    if args.child == "compile":
        compile_child(args.case_names)
        return 0
    if args.child in ("jax-forward", "jax-backward"):
        jax_child(args.child.removeprefix("jax-"), args.work_dir, args.quick)
        return 0

    began = time.perf_counter()
    settings = QUICK if args.quick else FULL
    cache_dir = None
    if not args.no_compile_time:  # this process then loads the kernels the cold child compiled
        cache_dir = tempfile.mkdtemp(prefix="convgen-bench-kernel-cache-")
        os.environ["CUPY_CACHE_DIR"] = cache_dir
    libs = load_libraries()
    meta = environment(libs, settings, argv)
    json_path = args.json or default_json_path()
    cases = [CASES_BY_NAME[name] for name in args.case_names]
    print(f"convgen benchmark on {meta['gpu']}: {len(cases)} case(s), {'quick' if args.quick else 'full'} settings",
          flush=True)

    compile_runs = measure_compile_times(cases, cache_dir, settings) if cache_dir else {}
    reports = []
    for index, case in enumerate(cases, 1):
        print(f"[{index}/{len(cases)}] {case.name}: {case.title} (floor {case.floor_us:.3g} µs)", flush=True)
        try:
            report = run_case(case, libs, settings)
        except Exception as error:
            report = CaseReport(case)
            report.error("case", error)
            traceback.print_exc()
        release_memory(libs)
        for run, outcome in compile_runs.items():
            report.compile[run] = outcome.get("cases", {}).get(case.name, {"error": outcome.get("status")})
        reports.append(report)
        print(f"    ({report.seconds:.1f} s)", flush=True)
        meta["elapsed_s"] = time.perf_counter() - began
        write_json(json_path, meta, reports, compile_runs)
    if cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print_summary(meta, reports, compile_runs)
    print(f"\nJSON: {json_path}  (total {time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
