"""benchmarks/tile_sweep.py without a GPU (`--list`): a sweep limited to chosen stages, extra tiles from the
command line (their split cut as the plans cut one), and the errors for a stage or tile it cannot take."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "tile_sweep.py"


def sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--list", *args], capture_output=True, text=True, check=False)


def test_listing_one_stage_with_a_tile_from_the_command_line() -> None:
    done = sweep("--cases", "conv2d_64_56_n32", "--stages", "forward", "--top", "0",
                 "--tile", "64,64,8,4,30", "--tile", "8,8,1,1,1")  # the second is no candidate block tile there
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(line.split()[:2] == ["conv2d_64_56_n32", "forward"] for line in lines)
    assert lines[0].split()[2] == "*"  # the planned tile first
    # 30 parts of the forward's 36 slices (4 channel slices x 9 offsets) would leave parts empty: 2 slices a
    # part make 18.
    forced = [line for line in lines if " bm64 " in line and " tm8 tn4 " in line]
    assert len(forced) == 1 and " split18 " in forced[0]
    assert not any(" bm8 " in line for line in lines)


def test_a_tile_from_the_command_line_fitted_to_two_blocks_per_sm() -> None:
    done = sweep("--cases", "conv2d_128_128_n8", "--stages", "backward_weight", "--top", "0",
                 "--tile", "128,128,8,8,28,blocks2")
    assert done.returncode == 0, done.stderr
    planned, *others = done.stdout.splitlines()
    assert " bm128  bn128 " in planned and " fit1 " in planned
    forced = [line for line in others if " split28 " in line]
    assert len(forced) == 1 and " bm128  bn128 " in forced[0] and " fit2 " in forced[0]


def test_an_unknown_stage_and_a_malformed_tile_are_refused() -> None:
    done = sweep("--stages", "forward,backward_bias")
    assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
        "error: --stages: unknown stage 'backward_bias' (stages: forward, backward_input, backward_weight)")
    for tile in ("64,64,8,4", "64,64,8,4,2,blocks", "64,64,8,4,2,blocks2,packed", "64,64,8,4,2,blocks0"):
        done = sweep("--tile", tile)
        assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
            f"error: argument --tile: a tile is BM,BN,TM,TN,SPLIT[,packed][,blocksN], got '{tile}'")
