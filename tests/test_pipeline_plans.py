"""The plans of the cp.async pipeline (convgen.pipeline_tiles): which conv-shaped stages it takes, their tiles, and
the shared memory its stages take, on a GPU without wgmma (whose `_wgmma` kernels take the TF32 conv-shaped stages
otherwise: test_wgmma_plans.py). No GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
from convgen.cuda_launch import H200, GemmTile, choose_tile, gemm_shapes, opted_in_shared, plan
from convgen.generated.contract import gemm_dynamic_shared_bytes, gemm_slice_bytes
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import no_wgmma

BATCHED_128 = Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8)


@pytest.mark.parametrize(("precision", "tile"), [
    ("medium", GemmTile(128, 128, 32, 8, 16, 1, packed=True, stages=3)),  # 64x64 warp tiles, 101 KB
    ("high", GemmTile(128, 64, 32, 8, 8, 1, packed=True, stages=4)),  # 64x32: 3xTF32 has twice the fragments
])
def test_tf32_conv_stages_take_the_pipeline(precision, tile):
    made = plan(BATCHED_128, precision=precision, wgmma_chooser=no_wgmma)
    for prefix in ("FWD", "BWI"):
        defines = {field: made.defines[f"{prefix}_{field}"] for field in ("BM", "BN", "BK", "TM", "TN", "STAGES")}
        assert defines == {"BM": tile.bm, "BN": tile.bn, "BK": tile.bk, "TM": tile.tm, "TN": tile.tn,
                           "STAGES": tile.stages}
        assert made.defines[f"{prefix}_PACKED"] == 1 and made.defines[f"{prefix}_MIN_BLOCKS"] == 1
    assert made.defines["BWW_STAGES"] == 2  # the weight gradient stages through registers
    slices = gemm_slice_bytes(tile.bm, tile.bn, tile.bk, 4, tile.stages)
    assert made.launches["forward"].shared_bytes == slices and slices <= H200.shared_optin_per_block // 2
    assert opted_in_shared(made, H200)["forward"] == slices


def test_the_register_loop_keeps_the_stages_the_pipeline_does_not_take():
    """In the TF32 modes: 16-bit elements, stride phases, fewer than 32 rows or 16 source channels; float64 (FMAs
    only). The FMAs: below."""
    def stages(geom, dtype="float32", precision="medium"):
        defines = plan(geom, dtype=dtype, precision=precision, wgmma_chooser=no_wgmma).defines
        return defines["FWD_STAGES"], defines["BWI_STAGES"]

    assert stages(BATCHED_128, "bfloat16") == (2, 2)
    assert stages(BATCHED_128, "bfloat16", "highest") == (2, 2)
    assert stages(BATCHED_128, "float64", "highest") == (2, 2)
    strided = Geometry.build(Family.CONV, 64, 64, (32, 32), (3, 3), (2, 2), (1, 1), batch=4)
    assert stages(strided) == (4, 2)  # the forward's direct form at any stride; the input gradient in phases
    assert stages(Geometry.build(Family.CONV, 64, 16, (32, 32), (3, 3), (1, 1), (1, 1))) == (2, 4)  # 16 rows
    assert stages(Geometry.build(Family.CONV, 8, 64, (32, 32), (3, 3), (1, 1), (1, 1))) == (2, 2)  # 8 channels


def test_pipeline_tiles_follow_the_rows_and_the_channels():
    """Rows of 33..64 take 64-row blocks and 17..32 take 32; source channels short of a slice of 32 take one
    slice of whole k steps of 8; a stage of fewer blocks than SMs is split."""
    def forward(in_c, out_c, spatial, precision="medium", batch=8):
        rank = len(spatial)
        geom = Geometry.build(Family.CONV, in_c, out_c, spatial, (3,) * rank, (1,) * rank, (1,) * rank, batch=batch)
        tile = choose_tile(gemm_shapes(geom, 4, {"medium": 1, "high": 3}[precision])["forward"], H200)
        return tile.bm, tile.bn, tile.bk, tile.tm, tile.tn, tile.stages, tile.split

    assert forward(64, 40, (64, 64)) == (64, 128, 32, 4, 16, 4, 1)
    assert forward(20, 32, (64, 64), "high") == (32, 64, 24, 4, 4, 4, 1)
    assert forward(256, 256, (14, 14), batch=1)[-1] > 1  # 2 x 2 blocks: the reduction is split


def test_pipeline_slices_are_counted_per_stage():
    assert gemm_slice_bytes(128, 128, 32, 4, 3) == 3 * 32 * 132 * 4 * 2
    assert gemm_dynamic_shared_bytes(32, 64, 16, 4, 3) == 0  # 3 * 16 * (36 + 68) * 4 + 256 bytes: static
    assert gemm_dynamic_shared_bytes(64, 64, 32, 4, 4) == 4 * 32 * 68 * 4 * 2
    assert replace(GemmTile(1, 1, 1, 1, 1, 1), stages=4).stages == 4 and GemmTile(1, 1, 1, 1, 1, 1).stages == 2


def test_fma_stages_of_many_waves_take_the_pipeline_on_their_own_tiles():
    """fp32 FMA: the tile model's pick, three slices in flight, where the stage has four waves of blocks and 16
    source channels (the batched 128->128, 64->64, conv3d and conv1d); one image, 3 source channels (k7) and
    float64 keep the register loop."""
    batched = plan(BATCHED_128, wgmma_chooser=no_wgmma).defines
    assert (batched["FWD_STAGES"], batched["BWI_STAGES"], batched["BWW_STAGES"]) == (3, 3, 2)
    shape = gemm_shapes(BATCHED_128)["forward"]
    assert choose_tile(shape, H200) == replace(choose_tile(replace(shape, pipelined=False), H200), stages=3)
    one_image = Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1))
    k7 = Geometry.build(Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3), batch=32)
    for geom, dtype in ((one_image, "float32"), (k7, "float32"), (BATCHED_128, "float64")):
        assert plan(geom, dtype=dtype, wgmma_chooser=no_wgmma).defines["FWD_STAGES"] == 2, (geom, dtype)
