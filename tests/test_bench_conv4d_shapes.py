"""benchmarks/conv4d_shapes.py without a GPU: its conv3d loop (the contestant, circular wrap included) computes the
4-D convolution convgen.torch does, the stage column names the kernel each plan runs, and `--list` prints the
shapes. Its times are only taken on a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from convgen.cuda_launch import plan
from convgen.generated.contract import Family
from convgen.geometry import Geometry

torch = pytest.importorskip("torch")
import convgen.torch as adapter  # noqa: E402  (after the skip)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import conv4d_shapes  # noqa: E402


@pytest.mark.parametrize("padding_mode", ["zeros", "circular"])
def test_the_conv3d_loop_is_the_4d_convolution(padding_mode: str) -> None:
    shape = conv4d_shapes.Shape("t", "test", 2, 3, 4, (5, 4, 6, 5), 3, padding_mode, "float64")
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 5, 4, 6, 5, dtype=torch.float64, generator=generator)
    weight = torch.randn(4, 3, 3, 3, 3, 3, dtype=torch.float64, generator=generator)
    bias = torch.randn(4, dtype=torch.float64, generator=generator)
    expected = adapter.conv(x, weight, bias, padding=1, padding_mode=padding_mode)
    torch.testing.assert_close(conv4d_shapes.loop_conv(x, weight, bias, shape), expected, rtol=1e-12, atol=1e-12)


def test_the_stage_column_names_each_plans_kernel() -> None:
    geom = Geometry.build(Family.CONV, 16, 16, (20,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=4)
    defines = plan(geom).defines
    stages = ("forward", "backward_input", "backward_weight")
    assert [conv4d_shapes.stage_kernel(defines, stage) for stage in stages] == [
        "fma 16x256 split 1", "fma 16x256 split 1", "direct V4 blocks 2x202"]
    small = plan(Geometry.build(Family.CONV, 8, 8, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8)).defines
    assert conv4d_shapes.stage_kernel(small, "forward") == "direct V4 CB4"
    wide = plan(Geometry.build(Family.CONV, 32, 32, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8),
                precision="medium").defines
    assert conv4d_shapes.stage_kernel(wide, "forward") == "wgmma N32 split 1"
    tf32 = plan(geom, precision="medium").defines  # 16 channels: the direct kernel's tensor cores
    assert conv4d_shapes.stage_kernel(tf32, "forward") == "direct mma V2 CB8"
    assert conv4d_shapes.stage_kernel(tf32, "backward_weight") == "direct mma V2 blocks 1x264"
    k5 = plan(Geometry.build(Family.CONV, 10, 10, (16,) * 4, (5,) * 4, (1,) * 4, (2,) * 4, batch=2),
              precision="medium").defines
    assert conv4d_shapes.stage_kernel(k5, "forward") == "direct mma V2 CB8 slices 5"


def test_list_prints_every_shape() -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "conv4d_shapes.py"), "--list"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == [s.name for s in conv4d_shapes.SHAPES]
