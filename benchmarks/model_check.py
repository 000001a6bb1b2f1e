#!/usr/bin/env python3
"""How the tile model's picks compare with the tiles a sweep timed, without a GPU: for each (case, stage) of
the given `tile_sweep.py --json` files, the tile runtime/tile_model.py picks now, its measured time over the
fastest measured tile's (its regret) or "not timed", and over every timed tile the spread of the model's
error (the standard deviation of log(measured / modelled)). For checking a change to the model against the
H200's numbers in benchmarks/measured/ before spending device time on it; a later file's time of a tile
replaces an earlier one's.

    python benchmarks/model_check.py benchmarks/measured/2026-12-01-h200-08b2fc4-weight-*.json
"""

from __future__ import annotations

import json
import math
import statistics
from argparse import ArgumentParser
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from convgen.tile_model import H200, GemmTile, choose_tile, fitted_blocks, gemm_cost
from suite.cases import CASES, SWEEP_CASES
from tile_sweep import stage_shapes

CASES_BY_NAME = {case.name: case for case in CASES + SWEEP_CASES}
# A timed tile: (bm, bn, bk, tm, tn, split, packed).
TileKey = tuple[int, int, int, int, int, int, bool]
# A swept stage: (case, stage, dtype, precision).
StageKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class StageCheck:
    """The model's pick for one swept stage against what was timed."""

    stage: StageKey
    pick: TileKey
    pick_us: float | None  # None: the pick was not timed
    fastest: TileKey
    fastest_us: float

    @property
    def regret(self) -> float | None:
        return None if self.pick_us is None else self.pick_us / self.fastest_us


@dataclass(frozen=True)
class Summary:
    checks: tuple[StageCheck, ...]
    log_error_sd: float  # over every timed tile the model has a cost for

    @property
    def timed(self) -> list[StageCheck]:
        return [check for check in self.checks if check.regret is not None]

    @property
    def mean_regret(self) -> float:
        """The geometric mean of the timed picks' regrets."""
        return math.exp(statistics.fmean(math.log(check.regret) for check in self.timed))

    @property
    def worst_regret(self) -> float:
        return max(check.regret for check in self.timed)


def timed_tiles(paths: Iterable[Path]) -> dict[StageKey, dict[TileKey, float]]:
    """Stage -> tile -> µs, from tile_sweep.py's JSON rows (rows without dtype or precision: float32, highest)."""
    timed: dict[StageKey, dict[TileKey, float]] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text()):
            stage = (row["case"], row["stage"], row.get("dtype", "float32"), row.get("precision", "highest"))
            tile = (row["bm"], row["bn"], row["bk"], row["tm"], row["tn"], row["split"], row["packed"])
            timed.setdefault(stage, {})[tile] = row["us"]
    return timed


def check(timed: dict[StageKey, dict[TileKey, float]]) -> Summary:
    """The model's pick of every timed stage whose case is known, and its error over their timed tiles."""
    checks, log_errors = [], []
    for stage, tiles in sorted(timed.items()):
        case_name, stage_name, dtype, precision = stage
        case = CASES_BY_NAME.get(case_name)
        if case is None:
            continue
        shape = stage_shapes(case.geometry, precision, dtype)[stage_name]
        picked = choose_tile(shape, H200)
        pick = (picked.bm, picked.bn, picked.bk, picked.tm, picked.tn, picked.split, picked.packed)
        fastest = min(tiles, key=tiles.__getitem__)
        checks.append(StageCheck(stage, pick, tiles.get(pick), fastest, tiles[fastest]))
        for (bm, bn, bk, tm, tn, split, packed), us in tiles.items():
            tile = GemmTile(bm, bn, bk, tm, tn, split, packed, fitted_blocks(shape, bm, bn, tm, tn))
            modelled_us = gemm_cost(shape, tile, H200) / H200.clock_hz * 1e6
            if 0 < modelled_us < math.inf:
                log_errors.append(math.log(us / modelled_us))
    return Summary(tuple(checks), statistics.pstdev(log_errors) if log_errors else 0.0)


def describe(tile: TileKey) -> str:
    bm, bn, bk, tm, tn, split, packed = tile
    return f"{bm}x{bn} bk{bk} t{tm}x{tn} split{split}{' packed' if packed else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", type=Path, help="tile_sweep.py --json files")
    args = parser.parse_args(argv)
    summary = check(timed_tiles(args.json))
    for item in summary.checks:
        case, stage, dtype, precision = item.stage
        picked = "not timed" if item.pick_us is None else f"{item.pick_us:9.1f} µs, regret {item.regret:.3f}"
        print(f"{case:26s} {stage:16s} {dtype} {precision:8s} pick {describe(item.pick):32s} {picked}"
              f"  (fastest {describe(item.fastest)} {item.fastest_us:.1f} µs)")
    timed = summary.timed
    print(f"\n{len(timed)} of {len(summary.checks)} picks timed"
          + (f"; regret geomean {summary.mean_regret:.3f}, worst {summary.worst_regret:.3f}" if timed else "")
          + f"; model error spread (sd of log measured/modelled) {summary.log_error_sd:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
