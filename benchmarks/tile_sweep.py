#!/usr/bin/env python3
"""Time the implicit-GEMM stages of the conv benchmark cases under several tile choices: the
planned one (runtime/cuda_launch.py) and the next cheapest by the plan's cost model, each stage
compiled on its own with the other stages left as planned. Kernels alone: CUDA events around
back-to-back launches (stage + its split reduce), median of rounds. Every candidate's output is
checked against the planned one's (relative error). Feeds the cost model's calibration.

    python benchmarks/tile_sweep.py [--top N] [--cases NAME,...] [--stages STAGE,...]
                                    [--tile BM,BN,TM,TN,SPLIT[,packed][,blocksN]]... [--precision P] [--dtype D]
                                    [--json PATH] [--rounds N] [--depths] [--list]

`--stages` sweeps only the named GEMM stages; each `--tile` adds a candidate to every swept stage whose
candidate block tiles include it (packed: A read repacked, conv-shaped stages only; blocksN: its registers fitted to
N blocks per SM instead of the plan's rule); `--depths` times every candidate at the stage's other slice depths too.
`--list` prints the candidates and the model's time of each, without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
from convgen.cuda_launch import (
    GEMM_STAGES,
    H200,
    PRECISION_MMA_MODES,
    GemmShape,
    GemmTile,
    Hardware,
    Plan,
    choose_tile,
    gemm_cost,
    gemm_shapes,
    nvrtc_options,
    opted_in_shared,
    plan,
    tile_candidates,
)
from convgen.generated.contract import KERNELS, STAGES
from convgen.geometry import Family, Geometry
from convgen.tile_model import fitted_blocks, whole_parts
from suite.cases import CASES, SWEEP_CASES, UNBATCHED_CASES, Case

CLASSIC = [(128, 128, 8, 8), (64, 128, 8, 8), (64, 64, 4, 4), (32, 128, 4, 8)]  # (bm, bn, tm, tn)
LAUNCHES_PER_ROUND = 20
MISMATCH_REL_ERR = 1e-5  # a candidate computes the same sums as the planned tile, in another order


def block_shape(tile: GemmTile) -> tuple[int, int, int, int]:
    return (tile.bm, tile.bn, tile.tm, tile.tn)


# A tile given on the command line: (bm, bn, tm, tn, split, packed, blocks per SM or None for the plan's).
ForcedTile = tuple[int, int, int, int, int, bool, int | None]
TILE_FORM = "BM,BN,TM,TN,SPLIT[,packed][,blocksN]"
_TILE = re.compile(r"(\d+),(\d+),(\d+),(\d+),(\d+)(,packed)?(?:,blocks([1-9]\d*))?")


def parse_tile(text: str) -> ForcedTile:
    """`BM,BN,TM,TN,SPLIT`, then optionally `packed` and `blocksN` (the registers fitted to N blocks per SM, the
    MIN_BLOCKS define), in that order (argparse's type for --tile)."""
    match = _TILE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"a tile is {TILE_FORM}, got {text!r}")
    bm, bn, tm, tn, split = (int(match.group(i)) for i in range(1, 6))
    return bm, bn, tm, tn, split, match.group(6) is not None, int(match.group(7)) if match.group(7) else None


def candidates(shape: GemmShape, top: int, hardware: Hardware = H200,
               forced: tuple[ForcedTile, ...] = (), depths: bool = False) -> list[GemmTile]:
    """The planned tile first, then the `top` cheapest others by the cost model (one per block
    shape, each with its best split and slice depth), the CLASSIC shapes, the planned block shape unsplit,
    for conv-shaped stages the planned tile with A packed the other way, and the `forced` tiles that are
    among the stage's candidate block tiles; with `depths`, each of those at every other slice depth of the
    stage too (the same number of parts)."""
    planned = choose_tile(shape, hardware)
    best: dict[tuple[int, int, int, int], tuple[float, GemmTile]] = {}
    for tile in tile_candidates(shape, hardware):
        cost = gemm_cost(shape, tile, hardware)
        key = block_shape(tile)
        if key not in best or cost < best[key][0]:
            best[key] = (cost, tile)
    ranked = [dataclasses.replace(tile, packed=planned.packed)  # the others packed as the plan packs
              for _, tile in sorted(best.values(), key=lambda cost_tile: cost_tile[0])]
    ranked = [tile for tile in ranked if tile != planned]
    chosen = [planned, *ranked[:top]]
    for key in CLASSIC:  # the usual SGEMM shapes, whatever the model thinks of them
        classic = dataclasses.replace(best[key][1], packed=planned.packed) if key in best else None
        if classic is not None and classic not in chosen:
            chosen.append(classic)
    unsplit = dataclasses.replace(planned, split=1)
    if unsplit not in chosen:
        chosen.append(unsplit)
    if shape.conv:  # A read repacked or as given, whichever the plan did not choose
        chosen.append(dataclasses.replace(planned, packed=not planned.packed))
    if planned.min_blocks > 1:  # and without the launch bounds that fit it to two blocks per SM
        chosen.append(dataclasses.replace(planned, min_blocks=1))
    for bm, bn, tm, tn, split, packed, blocks in forced:
        if (bm, bn, tm, tn) in best:
            # The planned block shape keeps the plan's slice depth and pipeline; another takes its best candidate's.
            like = planned if block_shape(planned) == (bm, bn, tm, tn) else best[(bm, bn, tm, tn)][1]
            tile = dataclasses.replace(like, split=whole_parts(shape.chunks_at(like.bk), split),
                                       packed=packed and shape.conv,
                                       min_blocks=blocks or fitted_blocks(shape, bm, bn, tm, tn))
            if tile not in chosen:
                chosen.append(tile)
    if depths:
        deeper = [dataclasses.replace(tile, bk=bk, split=whole_parts(shape.chunks_at(bk), tile.split))
                  for tile in chosen for bk in shape.slice_depths if bk != tile.bk]
        chosen += [tile for tile in dict.fromkeys(deeper) if tile not in chosen and tile_fits(tile, shape, hardware)]
    return chosen


def tile_fits(tile: GemmTile, shape: GemmShape, hardware: Hardware) -> bool:
    """Whether `tile` is one of the stage's candidates but for its split (another slice depth may not fit
    its shared memory)."""
    return any(dataclasses.replace(t, split=tile.split, packed=tile.packed) == tile
               for t in tile_candidates(shape, hardware))


def plan_with_tile(geom: Geometry, stage_shape: GemmShape, tile: GemmTile, precision: str,
                   dtype: str = "float32") -> Plan:
    """The plan of `geom` with `tile` for the stage of shape `stage_shape` and the default choice
    elsewhere (a stage of the same shape gets `tile` too; only the swept stage is launched)."""

    def chooser(shape: GemmShape, hardware: Hardware) -> GemmTile:
        return tile if shape == stage_shape else choose_tile(shape, hardware)

    return plan(geom, choose_tile=chooser, dtype=dtype, precision=precision)


def model_us(shape: GemmShape, tile: GemmTile, hardware: Hardware = H200) -> float:
    return gemm_cost(shape, tile, hardware) / hardware.clock_hz * 1e6


def stage_launcher(module: Any, family: Family, symbols: dict[str, str], candidate_plan: Plan, stage: str,
                   values: dict[str, Any], cupy: Any) -> Callable[[], None]:
    """One run of `stage` as the CUDA tape makes it, its arguments taken from `values` by the roles of
    the contract's parameters: the weight repacked first when the plan packs it, then the GEMM kernel
    into its output, or, when the plan splits the reduction, into a partial buffer [split, *output.shape]
    that the reduce kernel adds up."""
    launches = []  # (function, launch, arguments), in order
    opted_in = opted_in_shared(candidate_plan, H200)

    def add(stage_name: str, these: dict[str, Any]) -> None:
        launch = candidate_plan.launches[stage_name]
        arguments = tuple(these[p.role] for p in STAGES[family][stage_name])
        function = module.get_function(symbols[stage_name])
        if stage_name in opted_in:
            function.max_dynamic_shared_size_bytes = opted_in[stage_name]
        launches.append((function, launch, arguments))

    pack = candidate_plan.launches.get(f"{stage}_pack")
    if pack is not None and pack.grid:
        packed = cupy.empty_like(values["weight"])
        add(f"{stage}_pack", {**values, "packed_weight": packed})
        values = {**values, "weight": packed}
    (output,) = (p.role for p in STAGES[family][stage] if not p.const)
    if candidate_plan.splits[stage] == 1:
        add(stage, values)
    else:
        partial = cupy.empty((candidate_plan.splits[stage], *values[output].shape), values[output].dtype)
        add(stage, {**values, output: partial})
        add(f"{stage}_reduce", {**values, "partial": partial})

    def run() -> None:
        for function, launch, arguments in launches:
            function((launch.grid,), (launch.block,), arguments, shared_mem=launch.shared_bytes)

    return run


def median_us(launch: Callable[[], None], rounds: int, cupy: Any) -> float:
    """Median over `rounds` of LAUNCHES_PER_ROUND back-to-back launches between CUDA events, per launch."""
    samples = []
    for _ in range(rounds):
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        begin.record()
        for _ in range(LAUNCHES_PER_ROUND):
            launch()
        end.record()
        end.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(begin, end) / LAUNCHES_PER_ROUND * 1e3)
    return statistics.median(samples)


def stage_values(case: Case, cupy: Any, dtype: str = "float32") -> dict[str, Any]:
    """Random inputs of every GEMM stage of `case` in `dtype` and an output buffer per stage, by contract role."""
    rng = cupy.random.RandomState(1)
    geom = case.geometry
    weight_shape, bias_shape, input_shape = geom.parent_shapes
    return {
        "x": rng.standard_normal(input_shape, dtype=dtype),
        "weight": rng.standard_normal(weight_shape, dtype=dtype),
        "bias": rng.standard_normal(bias_shape, dtype=dtype),
        "grad": rng.standard_normal(geom.output_shape, dtype=dtype),
        "images": numpy.uint32(geom.images),
        "y": cupy.empty(geom.output_shape, dtype),
        "grad_x": cupy.empty(input_shape, dtype),
        "grad_weight": cupy.empty(weight_shape, dtype),
    }


def stage_shapes(geom: Geometry, precision: str, dtype: str = "float32") -> dict[str, GemmShape]:
    return gemm_shapes(geom, numpy.dtype(dtype).itemsize, PRECISION_MMA_MODES[precision])


def swept_shapes(geom: Geometry, precision: str, stages: frozenset[str],
                 dtype: str = "float32") -> dict[str, GemmShape]:
    """The GEMM stages of `geom` to sweep: those named in `stages`, or all when it is empty."""
    return {stage: shape for stage, shape in stage_shapes(geom, precision, dtype).items()
            if not stages or stage in stages}


def sweep_case(case: Case, top: int, rounds: int, precision: str, cupy: Any, stages: frozenset[str] = frozenset(),
               forced: tuple[ForcedTile, ...] = (), dtype: str = "float32",
               depths: bool = False) -> list[dict[str, Any]]:
    """Every candidate tile of every GEMM stage of `case` (of `stages` when given), timed and checked against
    the planned one."""
    geom = case.geometry
    entry = KERNELS[(geom.family, geom.rank)]
    source = (importlib.resources.files("convgen.generated") / "cuda" / entry.source).read_text()
    values = stage_values(case, cupy, dtype)
    rows = []
    for stage, shape in swept_shapes(geom, precision, stages, dtype).items():
        (output,) = (p.role for p in STAGES[geom.family][stage] if not p.const)
        out = values[output]
        reference = None
        for index, tile in enumerate(candidates(shape, top, forced=forced, depths=depths)):
            candidate_plan = plan_with_tile(geom, shape, tile, precision, dtype)
            module = cupy.RawModule(code=source, options=nvrtc_options(candidate_plan))
            launch = stage_launcher(module, geom.family, entry.symbols, candidate_plan, stage, values, cupy)
            launch()
            cupy.cuda.Device().synchronize()
            if reference is None:
                reference, error = out.copy(), 0.0
            else:
                error = float(cupy.linalg.norm(out - reference) / cupy.linalg.norm(reference))
            row = tile_row(case, stage, tile, candidate_plan, planned=index == 0)
            row |= {"precision": precision, "dtype": dtype}
            row |= {"us": round(median_us(launch, rounds, cupy), 2), "model_us": round(model_us(shape, tile), 2),
                    "rel_err_vs_planned": error}
            rows.append(row)
            print(row_line(row) + f" {row['us']:9.2f} us  model {row['model_us']:8.2f} us  err {error:.1e}"
                  + ("" if error < MISMATCH_REL_ERR else "  MISMATCH"), flush=True)
    return rows


def tile_row(case: Case, stage: str, tile: GemmTile, candidate_plan: Plan, planned: bool) -> dict[str, Any]:
    """The JSON row of one candidate, before it is timed; threads and blocks as the plan launches them."""
    launch = candidate_plan.launches[stage]
    return {"case": case.name, "stage": stage, "planned": planned, "bm": tile.bm, "bn": tile.bn, "bk": tile.bk,
            "tm": tile.tm, "tn": tile.tn, "split": tile.split, "packed": tile.packed, "min_blocks": tile.min_blocks,
            "stages": tile.stages, "threads": launch.block, "blocks": launch.grid}


def row_line(row: dict[str, Any]) -> str:
    return (f"{row['case']:16s} {row['stage']:16s} {'*' if row['planned'] else ' '} bm{row['bm']:<4d} "
            f"bn{row['bn']:<4d} bk{row['bk']:<3d} tm{row['tm']} tn{row['tn']} split{row['split']:<3d} "
            f"{'packed ' if row['packed'] else 'as-is  '}st{row['stages']} fit{row['min_blocks']} "
            f"thr{row['threads']:<4d} blocks{row['blocks']:<6d}")


def list_candidates(case: Case, top: int, precision: str, stages: frozenset[str] = frozenset(),
                    forced: tuple[ForcedTile, ...] = (), dtype: str = "float32", depths: bool = False) -> None:
    """The candidates of every stage (of `stages` when given) with the model's time, as the sweep would time
    them (no GPU)."""
    for stage, shape in swept_shapes(case.geometry, precision, stages, dtype).items():
        for index, tile in enumerate(candidates(shape, top, forced=forced, depths=depths)):
            row = tile_row(case, stage, tile, plan_with_tile(case.geometry, shape, tile, precision, dtype),
                           planned=index == 0)
            print(row_line(row) + f"  model {model_us(shape, tile):8.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=3, help="cheapest other block shapes to time per stage")
    parser.add_argument("--cases", default="",
                        help="conv case names, comma-separated, batched and calibration (suite.cases.SWEEP_CASES) "
                             "ones too (default: the one-image ones)")
    parser.add_argument("--json", default="", help="where to write the rows (e.g. benchmarks/results/tiles.json)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precision", choices=tuple(PRECISION_MMA_MODES), default="highest",
                        help="how the GEMMs multiply (convgen.backend.PRECISIONS)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="the element type (the tape's dtype; float64 multiplies in \"highest\" only)")
    parser.add_argument("--stages", default="", help="GEMM stages to sweep, comma-separated (default: all)")
    parser.add_argument("--tile", type=parse_tile, action="append", default=[],
                        help=f"{TILE_FORM}: one more candidate for every swept stage (repeatable)")
    parser.add_argument("--depths", action="store_true",
                        help="time each candidate at every slice depth of its stage too (GemmShape.slice_depths)")
    parser.add_argument("--list", action="store_true", help="print the candidates and model times only (no GPU)")
    args = parser.parse_args()
    stages = frozenset(filter(None, args.stages.split(",")))
    unknown = sorted(stages - set(GEMM_STAGES))
    if unknown:
        parser.error(f"--stages: unknown stage {unknown[0]!r} (stages: {', '.join(GEMM_STAGES)})")
    forced = tuple(args.tile)
    wanted = set(filter(None, args.cases.split(",")))
    default = {case.name for case in UNBATCHED_CASES}
    cases = [case for case in CASES + SWEEP_CASES
             if case.is_conv and (case.name in wanted if wanted else case.name in default)]
    if args.list:
        for case in cases:
            list_candidates(case, args.top, args.precision, stages, forced, args.dtype, args.depths)
        return
    import cupy

    start = time.perf_counter()
    rows = [row for case in cases
            for row in sweep_case(case, args.top, args.rounds, args.precision, cupy, stages, forced, args.dtype,
                                  args.depths)]
    print(f"sweep took {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
