#!/usr/bin/env python3
"""A/B of kernel sources or wgmma tile rules in one process: each conv stage of the batched cases timed on the
current tree and on another's, in interleaved rounds, and whether the two give the same bits. The other tree is
a folder of `generated/cuda/*.cu` (the same plans and contract), or a `wgmma_tiles.py` whose `choose_wgmma` plans
the base side's wgmma stages (the current sources), or both, for example an earlier commit's:

    git archive COMMIT generated/cuda | tar -x -C /tmp/base
    git show COMMIT:runtime/wgmma_tiles.py > /tmp/base_tiles.py
    python benchmarks/kernel_ab.py [--base /tmp/base/generated/cuda] [--base-tiles /tmp/base_tiles.py]
        [--cases conv2d_128_128_n8,conv1d_64_4096_n32] [--precisions high,medium] [--dtypes float32,bfloat16]
        [--rounds 3] [--json PATH] [--base-unshifted-weight]

With --base-unshifted-weight (in place of --base-tiles) the base side plans its 16-bit weight gradients unshifted
(`choose_wgmma(..., weight_shift=False)`), this tree's side as it plans by default (shifted where the rule allows).

16-bit dtypes run the precisions they take ("highest", "medium"), on the same random values rounded. A tree
whose kernel contract differs (packed sizes, shared memory, stages) runs in processes of its own: tree_ab.py.

Per stage (forward, input gradient, weight gradient, each call with its packs and reduces) the median over
rounds of each round's time, µs a call: tile_sweep.py's median of back-to-back calls between CUDA events. The
base's kernels must take the contract's parameters (generated/contract.py): a source whose kernel lacks a
symbol fails to load, one whose parameters moved runs wrong, which the bits column shows.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convgen.backend import HALF_DTYPES
from convgen.cuda import CupyBackend
from convgen.geometry import Geometry
from convgen.wgmma_tiles import WgmmaTile, choose_wgmma
from suite.cases import BATCHED_CASES, CASES_BY_NAME
from suite.contestants import random_inputs
from tile_sweep import median_us

STAGES = ("forward", "backward_input", "backward_weight")
# backward's `wanted` (weight, bias, input gradient) per backward stage
WANTED = {"backward_input": (False, False, True), "backward_weight": (True, False, False)}
SAMPLES_PER_ROUND = 5  # of tile_sweep.median_us, each LAUNCHES_PER_ROUND calls


def backend_class(sources: Path | None, wgmma_chooser: Callable[..., Any] | None = None) -> type[CupyBackend]:
    """CupyBackend, or one that compiles its CUDA from the same-named files in `sources` and plans its wgmma
    stages with `wgmma_chooser` (each where given; the other as CupyBackend's)."""
    overrides: dict[str, Any] = {}
    if sources is not None:
        def _functions(self, source_name: str, symbols: dict[str, str], options: tuple[str, ...],
                       device: int) -> dict[str, Any]:
            key = (source_name, options, device)
            if key not in self._modules:
                module = self._xp.RawModule(code=(sources / source_name).read_text(), options=options)
                self._modules[key] = {stage: module.get_function(symbol) for stage, symbol in symbols.items()}
            return self._modules[key]
        overrides["_functions"] = _functions
    if wgmma_chooser is not None:
        overrides["wgmma_chooser"] = staticmethod(wgmma_chooser)
    return type("OtherTreeBackend", (CupyBackend,), overrides) if overrides else CupyBackend


def tiles_chooser(path: Path) -> Callable[..., Any]:
    """The `choose_wgmma` of another tree's wgmma_tiles.py, its tiles as this tree's WgmmaTile (fields it lacks
    at their defaults)."""
    spec = importlib.util.spec_from_file_location("kernel_ab_base_tiles", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    names = [field.name for field in dataclasses.fields(WgmmaTile)]

    def choose(shape: Any, hardware: Any) -> WgmmaTile | None:
        tile = module.choose_wgmma(shape, hardware)
        return None if tile is None else WgmmaTile(**{n: getattr(tile, n) for n in names if hasattr(tile, n)})
    return choose


def base_chooser(tiles: Path | None, unshifted_weight: bool) -> Callable[..., Any] | None:
    """The base side's wgmma chooser: another tree's, this tree's with the 16-bit weight gradient unshifted, or
    None (this tree's)."""
    if tiles is not None:
        return tiles_chooser(tiles)
    return functools.partial(choose_wgmma, weight_shift=False) if unshifted_weight else None


def stage_calls(backend: CupyBackend, geom: Geometry, inputs: tuple[Any, ...],
                grad: Any) -> dict[str, Callable[[], tuple[Any, ...]]]:
    """Stage -> a call that runs it (with its packs and reduces) and returns what it computed."""
    calls = {"forward": lambda: (backend.forward(geom, inputs)[0],)}
    for stage, wanted in WANTED.items():
        calls[stage] = lambda wanted=wanted: tuple(
            a for a in backend.backward(geom, inputs, None, grad, wanted) if a is not None)
    return calls


def same_bits(cupy: Any, a: dict[str, Callable], b: dict[str, Callable]) -> dict[str, bool]:
    """Stage -> whether both calls compute the same bits (NaNs where the other has them)."""
    return {stage: all(bool(cupy.array_equal(x, y, equal_nan=True)) for x, y in zip(a[stage](), b[stage]()))
            for stage in a}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, default=None, help="a folder of generated .cu sources: the A side's")
    tiles = parser.add_mutually_exclusive_group()
    tiles.add_argument("--base-tiles", type=Path, default=None, help="a wgmma_tiles.py: the A side's wgmma tiles")
    tiles.add_argument("--base-unshifted-weight", action="store_true",
                       help="the A side plans its 16-bit weight gradients unshifted (WG_SHIFT off on them)")
    parser.add_argument("--cases", default=",".join(c.name for c in BATCHED_CASES if c.in_c >= 32),
                        help="comma-separated case names (default: the batched cases of 32 channels or more)")
    parser.add_argument("--precisions", default="high,medium", help="comma-separated: highest, high, medium")
    parser.add_argument("--dtypes", default="float32", help="comma-separated: float32, float16, bfloat16")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per stage")
    parser.add_argument("--json", type=Path, default=None, help="where to write the numbers")
    args = parser.parse_args(argv)
    if args.base is None and args.base_tiles is None and not args.base_unshifted_weight:
        parser.error("give --base, --base-tiles, --base-unshifted-weight or a mix: "
                     "the sides differ in sources or tiles")
    if args.base is not None and not args.base.is_dir():
        parser.error(f"--base {args.base}: not a folder")
    if args.base_tiles is not None and not args.base_tiles.is_file():
        parser.error(f"--base-tiles {args.base_tiles}: not a file")
    unknown_dtypes = [d for d in args.dtypes.split(",") if d != "float32" and d not in HALF_DTYPES]
    if unknown_dtypes:
        parser.error(f"--dtypes: unknown {', '.join(unknown_dtypes)} (known: float32, {', '.join(HALF_DTYPES)})")
    unknown = [name for name in args.cases.split(",") if name not in CASES_BY_NAME]
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(sorted(CASES_BY_NAME))})")
    import cupy

    base_class = backend_class(args.base, base_chooser(args.base_tiles, args.base_unshifted_weight))
    results: dict[str, Any] = {"base": str(args.base), "base_tiles": str(args.base_tiles),
                               "base_unshifted_weight": args.base_unshifted_weight, "cases": {}}
    runs = [(name, dtype, precision) for name in args.cases.split(",") for dtype in args.dtypes.split(",")
            for precision in args.precisions.split(",") if dtype == "float32" or precision != "high"]
    for name, dtype, precision in runs:
        geom = CASES_BY_NAME[name].geometry
        inputs, grad = random_inputs(cupy, geom, dtype, seed=7)
        sides = {side: stage_calls(cls(dtype, precision), geom, inputs, grad)
                 for side, cls in (("base", base_class), ("new", CupyBackend))}
        bits = same_bits(cupy, sides["base"], sides["new"])  # also compiles and warms both
        rounds: dict[str, dict[str, list[float]]] = {side: {s: [] for s in STAGES} for side in sides}
        for _ in range(args.rounds):
            for stage in STAGES:
                for side, calls in sides.items():
                    rounds[side][stage].append(median_us(calls[stage], SAMPLES_PER_ROUND, cupy))
        row = {side: {s: statistics.median(ts) for s, ts in by_stage.items()} for side, by_stage in rounds.items()}
        results["cases"][f"{name} {dtype} {precision}"] = {"us": row, "rounds_us": rounds, "same_bits": bits}
        for stage in STAGES:
            base, new = row["base"][stage], row["new"][stage]
            print(f"{name:22} {dtype:8} {precision:8} {stage:16} base {base:8.1f}  new {new:8.1f}  new/base "
                  f"{new / base:6.3f}  same bits {'yes' if bits[stage] else 'NO'}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
