#!/usr/bin/env python3
"""Time the implicit-GEMM stages of the conv benchmark cases under several tile choices: the
planned one (runtime/cuda_launch.py) and the next cheapest by the plan's cost model, each stage
compiled on its own with the other stages' defines left as planned. Kernels alone: CUDA events
around back-to-back launches (stage + its split reduce), median of rounds. Every candidate's output
is checked against the planned one's (relative error). Feeds the cost model's calibration.

    python benchmarks/tile_sweep.py [--top N] [--cases NAME,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench
from convgen import cuda_launch
from convgen.cuda_launch import GEMM_STAGES, NVRTC_OPTIONS, GemmTile, gemm_shapes, gemm_tile, plan
from convgen.generated.kernels import KERNELS
from convgen.geometry import Family, Geometry

CLASSIC = [(128, 128, 8, 8), (64, 128, 8, 8), (64, 64, 4, 4), (32, 128, 4, 8)]


def candidates(shape, top: int) -> list[GemmTile]:
    """The planned tile first, then the `top` cheapest others by the cost model (one per block
    shape, each with its best split), the CLASSIC shapes, and the planned block shape unsplit."""
    planned = gemm_tile(shape)
    best: dict[tuple, tuple[float, GemmTile]] = {}
    for bm, bn, tm, tn in cuda_launch._tile_candidates(shape.bk, shape.conv):
        splits = {1}
        for split in range(2, min(shape.chunks, 64) + 1):
            splits.add(-(-shape.chunks // -(-shape.chunks // split)))
        for split in splits:
            cost = cuda_launch._gemm_cost(shape, bm, bn, tm, tn, split)
            key = (bm, bn, tm, tn)
            if key not in best or cost < best[key][0]:
                best[key] = (cost, GemmTile(bm, bn, shape.bk, tm, tn, split))
    ranked = [tile for _, tile in sorted(best.values(), key=lambda ct: ct[0]) if tile != planned]
    out = [planned, *ranked[:top]]
    for key in CLASSIC:  # the usual SGEMM shapes, whatever the model thinks of them
        if key in best and best[key][1] not in out:
            out.append(best[key][1])
    unsplit = dataclasses.replace(planned, split=1)
    if unsplit not in out:
        out.append(unsplit)
    return out


def stage_defines(defines: tuple[str, ...], prefix: str, tile: GemmTile) -> list[str]:
    values = {"BM": tile.bm, "BN": tile.bn, "BK": tile.bk, "TM": tile.tm, "TN": tile.tn, "SPLIT": tile.split}
    out = []
    for d in defines:
        name = d[2:].split("=")[0]
        if name.startswith(prefix + "_"):
            out.append(f"-D{name}={values[name[len(prefix) + 1:]]}")
        else:
            out.append(d)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--cases", default="")
    parser.add_argument("--json", default="")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import cupy

    wanted = set(filter(None, args.cases.split(",")))
    rows = []
    start = time.perf_counter()
    for case in bench.CASES:
        if not case.is_conv or (wanted and case.name not in wanted):
            continue
        geom = Geometry.build(Family.CONV, case.in_c, case.out_c, case.spatial, case.kernel, case.strides,
                              case.paddings)
        base = plan(geom)
        entry = KERNELS[(Family.CONV, case.rank)]
        source = (Path(cuda_launch.__file__).resolve().parent.parent / "generated" / "cuda" / entry.source).read_text()
        rng = cupy.random.RandomState(1)
        x = rng.standard_normal(case.input_shape, dtype=cupy.float32)
        w = rng.standard_normal(case.weight_shape, dtype=cupy.float32)
        b = rng.standard_normal((case.out_c,), dtype=cupy.float32)
        g = rng.standard_normal(case.output_shape, dtype=cupy.float32)
        stage_io = {
            "forward": ((x, w, b), case.output_shape),
            "backward_input": ((g, w), case.input_shape),
            "backward_weight": ((g, x), case.weight_shape),
        }
        for stage, shape in gemm_shapes(geom).items():
            prefix = GEMM_STAGES[stage]
            inputs, out_shape = stage_io[stage]
            reference = None
            for rank_in_list, tile in enumerate(candidates(shape, args.top)):
                module = cupy.RawModule(code=source, options=NVRTC_OPTIONS + tuple(stage_defines(base.defines, prefix, tile)))
                kernel = module.get_function(entry.symbols[stage])
                reduce = module.get_function(entry.symbols[f"{stage}_reduce"])
                blocks = shape.grid(tile.bm, tile.bn, tile.split)
                count = shape.m * shape.n
                out = cupy.empty(out_shape, cupy.float32)
                partial = cupy.empty((tile.split, *out_shape), cupy.float32) if tile.split > 1 else None
                reduce_grid = -(-(count // 4 if count % 4 == 0 else count) // cuda_launch.BLOCK)

                def launch():
                    if partial is None:
                        kernel((blocks,), (tile.threads,), (*inputs, out))
                    else:
                        kernel((blocks,), (tile.threads,), (*inputs, partial))
                        reduce((reduce_grid,), (cuda_launch.BLOCK,), (partial, out))

                launch()
                cupy.cuda.Device().synchronize()
                if reference is None:
                    reference = out.copy()
                    error = 0.0
                else:
                    error = float(cupy.linalg.norm(out - reference) / cupy.linalg.norm(reference))
                n = 20
                samples = []
                for _ in range(args.rounds):
                    begin, end = cupy.cuda.Event(), cupy.cuda.Event()
                    begin.record()
                    for _ in range(n):
                        launch()
                    end.record()
                    end.synchronize()
                    samples.append(cupy.cuda.get_elapsed_time(begin, end) / n * 1e3)
                us = statistics.median(samples)
                model = cuda_launch._gemm_cost(shape, tile.bm, tile.bn, tile.tm, tile.tn, tile.split) / cuda_launch.CLOCK_HZ * 1e6
                row = {"case": case.name, "stage": stage, "planned": rank_in_list == 0, "bm": tile.bm, "bn": tile.bn,
                       "bk": tile.bk, "tm": tile.tm, "tn": tile.tn, "split": tile.split, "threads": tile.threads,
                       "blocks": blocks, "us": round(us, 2), "model_us": round(model, 2), "rel_err_vs_planned": error}
                rows.append(row)
                print(f"{case.name:16s} {stage:16s} {'*' if row['planned'] else ' '} bm{tile.bm:<4d} bn{tile.bn:<4d} "
                      f"bk{tile.bk:<3d} tm{tile.tm} tn{tile.tn} split{tile.split:<3d} thr{tile.threads:<4d} "
                      f"blocks{blocks:<6d} {us:9.2f} us  model {model:8.2f} us  err {error:.1e}"
                      f"{'  MISMATCH' if not error < 1e-5 else ''}", flush=True)
    print(f"sweep took {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
