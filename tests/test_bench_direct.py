"""benchmarks/direct_sweep.py without a GPU (`--list`): the plans' pick first, then the GEMM and the tiles from
the command line, and the errors for a case or tile it cannot take."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "direct_sweep.py"


def sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--list", *args], capture_output=True, text=True, check=False)


def rows(*args: str) -> list[str]:
    """The lines `--list` prints for `args`, which it must take."""
    done = sweep(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_rows_of_a_case_the_plans_run_direct_and_of_one_they_leave_to_the_gemm() -> None:
    """A tile of V,THREADS stages as many channels a step as the plans would; V,THREADS,CB that many."""
    assert rows("--cases", "conv4d_8_16_n8,conv3d_16_16_n16", "--tile", "2,256", "--tile", "4,256,8") == [
        "conv4d_8_16_n8     planned v4 thr256 cb4 box4x4x4x16",
        "conv4d_8_16_n8     gemm",
        "conv4d_8_16_n8     v2 thr256 cb4 box2x4x4x16",
        "conv4d_8_16_n8     v4 thr256 cb8 box4x4x4x16",
        "conv3d_16_16_n16   planned (the GEMM)",
        "conv3d_16_16_n16   gemm",
        "conv3d_16_16_n16   v2 thr256 cb8 box4x8x16",
        "conv3d_16_16_n16   v4 thr256 cb8 box8x8x16",
    ]


def test_rows_of_the_weight_gradient() -> None:
    """The plans' pick (a 4-D window's 16 U channels in two channel blocks) and the GEMM."""
    assert rows("--stage", "backward_weight", "--cases", "conv4d_8_16_n8,conv4d_16_20_n4") == [
        "conv4d_8_16_n8     planned v4 lanes1 thr216 blocks1x528 box2x2x2x16",
        "conv4d_8_16_n8     gemm",
        "conv4d_16_20_n4    planned v4 lanes1 thr216 blocks2x202 box1x2x2x20",
        "conv4d_16_20_n4    gemm",
    ]


def test_rows_of_the_weight_gradient_on_tensor_cores() -> None:
    """In "medium" a 16-channel 4-D window's pick is the tensor-core form, its registers fitted to two blocks an SM
    (bounds2) and as many parts; --mma-tile rows give it other outer offsets a warp, boxes, parts and blocks an SM
    (none past 16 warps), then the FMA form."""
    assert rows("--stage", "backward_weight", "--precision", "medium", "--cases", "conv4d_16_20_n4",
                "--mma-tile", "2,512,132,1", "--mma-tile", "3,256", "--mma-tile", "1,256") == [
        "conv4d_16_20_n4    planned v2 lanes1 thr448 blocks1x264 box2x2x2x20 bounds2",
        "conv4d_16_20_n4    gemm",
        "conv4d_16_20_n4    mma v2 lanes1 thr448 blocks1x264 box2x2x2x20 bounds2",
        "conv4d_16_20_n4    mma v2 lanes1 thr448 blocks1x132 box2x2x4x20",
        "conv4d_16_20_n4    mma v3 lanes1 thr288 blocks1x264 box2x2x2x20 bounds2",
        "conv4d_16_20_n4    v4 lanes1 thr216 blocks2x202 box1x2x2x20",
    ]


def test_rows_of_a_16_bit_weight_gradient_apply_to_its_16_bit_stage() -> None:
    """With --dtype bfloat16 the rows are chosen for the 16-bit stage the plans see (DirectShape.half): at 32 channels
    of a 3^4 window the plans keep the 16-bit wgmma (the GEMM; the float32 pick would be the tile) and the tile is a
    row of its own. CELLS 0 keeps the plans' box with other blocks an SM: rank 7's fitted_box 1x1x1x2x2x5x5, not
    mma_box's 1x2x2x2x2x2x5 for 256 cells."""
    assert rows("--stage", "backward_weight", "--precision", "medium", "--dtype", "bfloat16", "--cases",
                "conv4d_32_16_n8,conv7d_32_6_k2_n2", "--mma-tile", "4,0,64,1", "--mma-tile", "4,256,64,2") == [
        "conv4d_32_16_n8    planned (the GEMM)",
        "conv4d_32_16_n8    gemm",
        "conv4d_32_16_n8    mma v2 lanes1 thr448 blocks4x66 box2x2x4x16 bounds2",
        "conv4d_32_16_n8    mma v4 lanes1 thr224 blocks4x64 box2x2x4x16",
        "conv4d_32_16_n8    mma v4 lanes1 thr224 blocks4x64 box2x2x4x16 bounds2",
        "conv7d_32_6_k2_n2  planned (the GEMM)",
        "conv7d_32_6_k2_n2  gemm",
        "conv7d_32_6_k2_n2  mma v4 lanes1 thr512 blocks4x64 box1x1x1x2x2x5x5 bounds2",
        "conv7d_32_6_k2_n2  mma v4 lanes1 thr512 blocks4x64 box1x1x1x2x2x5x5",
        "conv7d_32_6_k2_n2  mma v4 lanes1 thr512 blocks4x64 box1x2x2x2x2x2x5 bounds2",
        "conv7d_32_6_k2_n2  v4 lanes1 thr256 blocks8x32 box1x1x1x2x2x2x8",
    ]
    float32 = rows("--stage", "backward_weight", "--precision", "medium", "--cases", "conv4d_32_16_n8")
    assert float32[0] == "conv4d_32_16_n8    planned v2 lanes1 thr448 blocks4x66 box2x2x4x16 bounds2"


def test_an_unknown_case_and_a_malformed_tile_are_refused() -> None:
    done = sweep("--cases", "conv2d_64_56_n32")  # 64 dst channels: more than any direct tile holds
    assert done.returncode == 2 and "error: --cases: unknown case 'conv2d_64_56_n32' (cases: conv3d_32_32, conv4d_8_16," \
        in done.stderr
    for tile in ("4", "4,256,0", "4,256,2,1"):
        done = sweep("--tile", tile)
        assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
            f"error: argument --tile: a tile is V,THREADS or V,THREADS,CB (positive integers), got '{tile}'")
    for tile in ("2,0", "2,0,3", "0,256,2,1"):  # CELLS 0 only in the weight form, TILES never
        done = sweep("--mma-tile", tile)
        assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
            "error: argument --mma-tile: an mma tile is TILES,CELLS[,SLICES] or TILES,CELLS,PARTS,MIN_BLOCKS (positive "
            f"integers; the weight form's CELLS 0: the plans' box), got '{tile}'")


def test_mma_box_rows_of_a_conv_shaped_stage() -> None:
    """--mma-box gives mma_tile's pick another box (and slices) on the cases of its rank whose extents hold it and
    whose staging fits a block: on a 12⁵ grid mma_box's 2x2x2x4x12 beside the fitted 1x2x4x4x12 (the first axis's
    offsets in three slices), not in one slice (whose weights and halo stage past a block's shared memory: no row);
    a row equal to the pick is not repeated."""
    assert rows("--precision", "medium", "--cases", "conv5d_16_12_n4,conv4d_16_25_n4", "--mma-box", "2x2x2x4x12",
                "--mma-box", "2x2x2x4x12,1", "--mma-box", "1x2x4x4x12", "--mma-box", "1x4x4x25",
                "--mma-box", "1x1x16x32") == [
        "conv5d_16_12_n4    planned v2 thr384 cb8 box1x2x4x4x12 slices3",
        "conv5d_16_12_n4    gemm",
        "conv5d_16_12_n4    mma v2 thr384 cb8 box1x2x4x4x12 slices3",
        "conv5d_16_12_n4    mma v2 thr384 cb8 box2x2x2x4x12 slices3",
        "conv4d_16_25_n4    planned v2 thr416 cb8 box2x2x4x25",
        "conv4d_16_25_n4    gemm",
        "conv4d_16_25_n4    mma v2 thr416 cb8 box2x2x4x25",
        "conv4d_16_25_n4    mma v2 thr416 cb8 box1x4x4x25",
    ]
    for box in ("2x0x4", "2x4,a", "x4"):
        done = sweep("--mma-box", box)
        assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
            f"error: argument --mma-box: an mma box is AxBx...[,SLICES] (positive integers), got '{box}'")
