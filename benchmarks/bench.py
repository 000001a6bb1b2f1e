#!/usr/bin/env python3
"""Time convgen's CUDA tape and its PyTorch adapter convgen.torch against PyTorch/cuDNN (and JAX for the
4-D conv) on the cases of DESIGN.md "Figures to beat" (one image) and issue 9's batched cases: float32,
channels first.

Every case is first checked against a float64 PyTorch reference, then timed forward and
forward+backward in two ways: (a) the call as a user makes it (CUDA events around the Python call,
GPU idle and L2 flushed before it, median of many, a case's contestants taking turns sample by sample) and (b)
the kernels alone (CUDA-graph replay, or N back-to-back calls / N where a graph cannot be captured, which the
output says). PyTorch runs
with TF32 off (strict fp32) and on, and for the batched cases in bf16 channels-last too; on the batched
cases convgen's tape also runs in its tensor-core precisions "high" (3xTF32) and "medium" (TF32), issue 11,
with their errors, targets and share of the TF32 tensor-core peak. Also
measured: peak device memory of the op, and, in child processes, the first-call compile time (fresh
CuPy kernel cache) and the warm-disk-cache load time; with --host, the host overhead of tiny ops.
The adapter runs on torch tensors of the same inputs, with the adapter/tape time ratio per case, and on the
batched cases on bfloat16 copies (beside PyTorch's bf16 channels-last) and float16 copies too; it is skipped,
with a note, where convgen.torch does not import. Prints markdown tables last (with issue 9's targets and issue 10's
adapter target under the batched one, then issue 11's precision table and targets) and writes everything
to JSON. The parts live in suite/.

    python benchmarks/bench.py [--quick] [--json PATH] [--cases NAME,... | --batched | --unbatched] [--host]
                               [--precisions highest,high,medium] [--list]
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

from suite.cases import BATCHED_CASES, CASES, CASES_BY_NAME, UNBATCHED_CASES, case_table
from suite.children import compile_child, jax_child, measure_compile_times
from suite.contestants import load_libraries
from suite.host import HOST_CALLS, measure_host
from suite.measure import release_memory, run_case
from suite.precision import TAPE_PRECISIONS, parse_precisions
from suite.report import CaseReport, default_json_path, environment, print_summary, write_json
from suite.timing import FULL, QUICK, one_line


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time convgen's CUDA tape and convgen.torch against PyTorch/cuDNN (and JAX for conv4d) on the "
                    "cases of DESIGN.md 'Figures to beat' (one image) and issue 9's batched cases. Needs an NVIDIA "
                    "GPU, CuPy, PyTorch with CUDA and convgen.",
        epilog="cases: " + ", ".join(f"{case.name} ({case.title})" for case in CASES))
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (under 2 minutes on an H200)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the results (default: $OUT/bench.json if OUT is set, "
                             "else benchmarks/results/latest.json)")
    selection = parser.add_mutually_exclusive_group()
    selection.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    selection.add_argument("--batched", action="store_true",
                           help=f"only the {len(BATCHED_CASES)} batched cases (issue 9; with the targets check)")
    selection.add_argument("--unbatched", action="store_true",
                           help=f"only the {len(UNBATCHED_CASES)} one-image cases (DESIGN.md 'Figures to beat')")
    parser.add_argument("--precisions", default=",".join(TAPE_PRECISIONS),
                        help="comma-separated precisions of convgen's tape to run on the batched cases (issue 11; "
                             f"default: {','.join(TAPE_PRECISIONS)}): 'highest' (fp32 FMA) is the contestant "
                             "convgen, 'high' (3xTF32) convgen_high, 'medium' (TF32) convgen_medium; the one-image "
                             "cases run 'highest' only")
    parser.add_argument("--host", action="store_true",
                        help=f"after the cases, the host overhead of tiny ops ({HOST_CALLS} back-to-back max pools "
                             "on a 4×4 input, convgen against torch, and cProfile), also in the JSON")
    parser.add_argument("--no-compile-time", action="store_true",
                        help="skip the two child processes that measure first-call compile and cache-load time")
    parser.add_argument("--list", action="store_true",
                        help="print the case table (shapes, floors, graph copies from each Geometry) and exit; "
                             "needs no GPU")
    parser.add_argument("--child", choices=("compile", "jax-forward", "jax-backward"), help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cases:
        names = [n.strip() for n in args.cases.split(",") if n.strip()]
    else:
        dropped = {True: args.unbatched, False: args.batched}  # by is_batched
        names = [case.name for case in CASES if not dropped[case.is_batched]]
    unknown = [n for n in names if n not in CASES_BY_NAME]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES_BY_NAME)}")
    args.case_names = names
    try:
        args.precisions = parse_precisions(args.precisions)
    except ValueError as error:
        parser.error(str(error))
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
    libs = load_libraries("bench.py")
    meta = environment(libs, settings, argv) | {"precisions": list(args.precisions)}
    json_path = args.json or default_json_path()
    cases = [CASES_BY_NAME[name] for name in args.case_names]
    print(f"convgen benchmark on {meta['gpu']}: {len(cases)} case(s), {'quick' if args.quick else 'full'} settings, "
          f"tape precisions {', '.join(args.precisions)} (batched cases; one image: highest)", flush=True)
    if libs.adapter_skipped:
        print(f"  adapter skipped: {libs.adapter_skipped}", flush=True)

    compile_runs = measure_compile_times(cases, cache_dir, settings) if cache_dir else {}
    reports = []
    for index, case in enumerate(cases, 1):
        print(f"[{index}/{len(cases)}] {case.name}: {case.title} (floor {case.floor_us:.3g} µs)", flush=True)
        try:
            report = run_case(case, libs, settings, args.precisions)
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
    host = None
    if args.host:
        print(f"host overhead of tiny ops ({HOST_CALLS} back-to-back calls each) ...", flush=True)
        try:
            host = measure_host(libs.cupy, libs.torch, libs.convgen)
        except Exception as error:
            host = {"error": one_line(error)}
            traceback.print_exc()
        write_json(json_path, meta, reports, compile_runs, host)
    if cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print_summary(meta, reports, compile_runs, host)
    print(f"\nJSON: {json_path}  (total {time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
