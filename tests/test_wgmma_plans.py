"""The plans of the `_wgmma` kernels (convgen.wgmma_tiles): which GEMM stages take them, their tiles, the packed
weight's (and D's) size, the weight gradient's split, the shared memory and the architecture their sources compile
for. No GPU."""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import replace
from types import SimpleNamespace

import pytest
from convgen.cuda_launch import H200, arch_option, nvrtc_options, opted_in_shared, plan
from convgen.generated.contract import WG_BK, wgmma_shared_bytes, wgmma_weight_shared_bytes
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import choose_wgmma

BATCHED_128 = Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8)
CONV_SHAPED = ("forward", "backward_input")


def wgmma_fields(made, prefix):
    return tuple(made.defines[f"{prefix}_{field}"] for field in ("WGMMA", "WG_N", "WG_CELLS", "WG_STAGES",
                                                                   "WG_MIN_BLOCKS", "WG_K"))


@pytest.mark.parametrize(("precision", "mma", "planes"), [("medium", 1, 1), ("high", 3, 2)])
def test_tf32_conv_shaped_stages_take_wgmma_on_the_h200(precision, mma, planes):
    made = plan(BATCHED_128, precision=precision)
    shared = wgmma_shared_bytes(128, 128, 3, mma, 32)
    for stage, prefix in zip(CONV_SHAPED, ("FWD", "BWI"), strict=True):
        assert wgmma_fields(made, prefix) == (1, 128, 128, 3, 1, 32)
        launch = made.launches[stage]
        # 8 images x 1 channel block x 128 cell tiles; 256 threads; every slice's 128 weight rows and 32 x 136 cells.
        assert (launch.kernel, launch.grid, launch.block, launch.shared_bytes) == (f"{stage}_wgmma", 1024, 256, shared)
        assert made.launches[f"{stage}_pack"].kernel == f"{stage}_wgpack"
        assert made.launches[f"{stage}_reduce"].grid == 0 and made.splits[stage] == 1
        assert made.packed_elements[stage] == planes * 36 * 128 * WG_BK  # 4 channel blocks x 9 offsets: 36 slices
        assert opted_in_shared(made, H200)[f"{stage}_wgmma"] == shared
    assert shared == 3 * (planes * 128 * 128 + 17408) + 1024 <= H200.shared_optin_per_block
    # The weight gradient: 9 window offsets of 128 U channels, parts of the 8 x 512 slices of 32 cells for one
    # block an SM in 3xTF32 (14: 126 of the H200's 132), two in TF32 (29, their registers capped for two); D packed
    # with its 128 channels and 16384 cells.
    split, min_blocks = {1: (29, 2), 3: (14, 1)}[mma]
    weight_shared = wgmma_weight_shared_bytes(128, 128, 3, mma, 32)
    launch = made.launches["backward_weight"]
    assert (launch.kernel, launch.grid, launch.block, launch.shared_bytes) == ("backward_weight_wgmma", 9 * split,
                                                                                256, weight_shared)
    assert wgmma_fields(made, "BWW") == (1, 128, 128, 3, min_blocks, 32)
    assert made.defines["BWW_SPLIT"] == made.splits["backward_weight"] == split
    assert made.launches["backward_weight_pack"].kernel == "backward_weight_wgpack"
    # A thread per quad of D's packed cells, written to every plane: 8 x 128 x 16384 / 4 threads, 256 a block.
    assert made.launches["backward_weight_pack"].grid == 8 * 128 * 16384 // 4 // 256
    assert made.launches["backward_weight_reduce"].grid > 0
    assert made.packed_elements["backward_weight"] == planes * 8 * 128 * 128 * 128
    assert weight_shared == 3 * (planes * 128 * 128 + 128 * 36 * 4) + 1024 <= H200.shared_optin_per_block
    assert made.arch == "sm_90a" and arch_option(made) == ("-arch=sm_90a",)
    assert not any(option.startswith("-arch") for option in nvrtc_options(made))


def test_wgmma_n_follows_the_dst_channels_of_a_group():
    """The narrowest N of 32, 64, 128, 256 that holds a group's dst channels; 3xTF32 at most 128 (two sets of
    accumulators), in blocks of N."""
    def forward(out_c, precision="medium", groups=1):
        geom = Geometry.build(Family.CONV, 64, out_c, (32, 32), (3, 3), (1, 1), (1, 1), batch=4, groups=groups)
        made = plan(geom, precision=precision)
        return made.defines["FWD_WG_N"], made.launches["forward"].grid

    assert forward(32) == (32, 4 * 8)
    assert forward(40) == (64, 4 * 8)
    assert forward(200) == (256, 4 * 8)
    assert forward(200, "high") == (128, 4 * 2 * 8)
    assert forward(64, groups=2) == (32, 4 * 2 * 8)


def test_conv_shaped_wgmma_tiles_span_images_only_where_images_are_not_whole_tiles():
    """Tiles of 128 cells: where an image's cells are not whole tiles, they run over images x cells, so an image's
    last tile takes the next image's first cells; groups and channel blocks multiply the tiles. Whole tiles are cut
    image by image."""
    def grid(in_c, out_c, spatial, batch, precision="medium", groups=1):
        geom = Geometry.build(Family.CONV, in_c, out_c, spatial, (3, 3), (1, 1), (1, 1), batch=batch, groups=groups)
        launches = plan(geom, precision=precision).launches
        return launches["forward"].grid, launches["backward_input"].grid

    # 32 images of 56 x 56 = 3136 cells: 100352 cells, 784 tiles (25 an image, 800, were they cut image by image).
    assert grid(64, 64, (56, 56), 32) == grid(64, 64, (56, 56), 32, "high") == (784, 784)
    # 3 images of 16 x 12: 576 cells, 5 tiles (the last half full); 2 groups of 32 channels, or N 128 and 256.
    assert grid(64, 64, (16, 12), 3) == (5, 5)
    assert grid(64, 64, (16, 12), 3, groups=2) == (2 * 5, 2 * 5)
    assert grid(64, 256, (16, 12), 3, "high") == (2 * 5, 5)
    # 8 images of 128 x 128: 128 whole tiles each.
    assert grid(128, 128, (128, 128), 8) == (8 * 128, 8 * 128)
    assert grid(64, 64, (16, 8), 3, groups=2) == (3 * 2, 3 * 2)


def test_the_weight_gradient_splits_its_cells_across_the_sms():
    """Rows of 32 U channels (rounded up) at each window offset, 128 a block; N over D's channels; parts enough for
    two blocks an SM in TF32 and in 3xTF32 up to 64 channels (whose blocks ask ptxas for two an SM), one in 3xTF32
    beyond, each at least 8 slices of 32 cells; D's channels and cells rounded up in the packed D."""
    def weight(in_c, out_c, spatial, batch, precision="medium", groups=1):
        geom = Geometry.build(Family.CONV, in_c, out_c, spatial, (3,) * len(spatial), (1,) * len(spatial),
                              (1,) * len(spatial), batch=batch, groups=groups)
        made = plan(geom, precision=precision)
        return (made.launches["backward_weight"].kernel, made.defines["BWW_WG_N"], made.splits["backward_weight"],
                made.launches["backward_weight"].grid, made.packed_elements.get("backward_weight"))

    # 64 U channels: 576 rows, 5 blocks of 128; 52 parts of the 32 x 98 slices, in both modes.
    assert weight(64, 64, (56, 56), 32) == ("backward_weight_wgmma", 64, 52, 5 * 52, 32 * 64 * 98 * 32)
    assert weight(64, 64, (56, 56), 32, "high")[2:4] == (52, 5 * 52)
    high = plan(Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32), precision="high")
    assert (high.defines["BWW_WG_MIN_BLOCKS"], high.defines["FWD_WG_MIN_BLOCKS"]) == (2, 2)  # tiles span images
    whole = plan(Geometry.build(Family.CONV, 64, 64, (64, 64), (3, 3), (1, 1), (1, 1), batch=4), precision="high")
    assert whole.defines["FWD_WG_MIN_BLOCKS"] == 1
    # 16 U channels take 32 rows each (9 x 32: 3 blocks); 40 D channels an N of 64; parts from the batch's bucket
    # (4 images of 10 x 10: 16 slices, 2 parts), the packed D from its 3 images.
    assert weight(16, 40, (10, 10), 3) == ("backward_weight_wgmma", 64, 2, 3 * 2, 3 * 64 * 128)
    # 3xTF32: N at most 128, two blocks of D's 200 channels, by 5 row blocks: 13 parts.
    assert weight(64, 200, (32, 32), 8, "high") == ("backward_weight_wgmma", 128, 13, 5 * 2 * 13, 2 * 8 * 256 * 1024)
    # Two groups of 32 U channels (three row blocks each) and 32 D channels: 44 parts would fill the SMs twice,
    # but the 8 x 32 slices make 32 parts of 8.
    assert weight(64, 64, (32, 32), 8, groups=2)[1:4] == (32, 32, 2 * 3 * 32)
    # Fewer than 16 U or 32 D channels a group: the GEMM (or the direct kernel).
    assert weight(8, 64, (32, 32), 8)[0] != "backward_weight_wgmma"
    assert weight(64, 16, (32, 32), 8)[0] != "backward_weight_wgmma"


def test_the_gemm_keeps_the_stages_wgmma_does_not_take():
    """FMAs ("highest"), float64 elements, stride phases, fewer than 32 dst or 16 source channels a group, a GPU
    without wgmma. 16-bit elements take it as float32 ones do."""
    def kernels(geom, dtype="float32", precision="medium", hardware=H200):
        launches = plan(geom, hardware, dtype=dtype, precision=precision).launches
        return launches["forward"].kernel, launches["backward_input"].kernel

    gemm = ("", "")
    assert kernels(BATCHED_128, precision="highest") == gemm
    assert kernels(BATCHED_128, "bfloat16") == kernels(BATCHED_128, "float16") == kernels(BATCHED_128)
    assert kernels(BATCHED_128) == ("forward_wgmma", "backward_input_wgmma")
    assert kernels(BATCHED_128, "float64", "highest") == gemm
    assert kernels(BATCHED_128, hardware=replace(H200, wgmma=False)) == gemm
    assert plan(BATCHED_128, replace(H200, wgmma=False), precision="high").arch == ""
    strided = Geometry.build(Family.CONV, 64, 64, (32, 32), (3, 3), (2, 2), (1, 1), batch=4)
    assert kernels(strided) == ("forward_wgmma", "")  # the forward's direct form at any stride; phases keep the GEMM
    assert kernels(Geometry.build(Family.CONV, 64, 16, (32, 32), (3, 3), (1, 1), (1, 1))) == ("", "backward_input_wgmma")
    assert kernels(Geometry.build(Family.CONV, 8, 64, (32, 32), (3, 3), (1, 1), (1, 1))) == gemm
    conv4d = Geometry.build(Family.CONV, 8, 8, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8)
    assert kernels(conv4d) == ("forward_direct", "backward_input_direct")  # 8 channels: the direct kernels


def test_a_wgmma_launch_passes_its_kernels_arguments():
    """The `_wgmma` kernel takes the packed weight beside the weight: its launch's arguments follow its own
    parameters, not the stage's GEMM's."""
    from convgen.cuda_kernels import Compiled

    made = plan(BATCHED_128, precision="medium")
    # CuPy's RawKernels, of which the launches keep the device function's handle
    compiled = Compiled(BATCHED_128, made, defaultdict(lambda: SimpleNamespace(kernel=SimpleNamespace(ptr=0))), 4, 4)
    values = {"x": "x", "grad": "g", "weight": "w", "bias": "b", "packed_weight": "p", "images": 8, "y": "y",
              "grad_x": "dx"}
    assert compiled.launches["forward"][4](values) == ("x", "w", "b", "p", 8, "y")
    assert compiled.launches["backward_input"][4](values) == ("g", "w", "p", 8, "dx")
    assert compiled.launches["forward_pack"][4](values) == ("w", "p")
    values["packed_d"], values["grad_weight"] = "pd", "dw"
    assert compiled.launches["backward_weight"][4](values) == ("g", "x", "pd", 8, "dw")
    assert compiled.launches["backward_weight_pack"][4](values) == ("g", 8, "pd")


def test_16_bit_conv_shaped_stages_ask_for_two_blocks_an_sm_up_to_an_n_of_128():
    """Their staging registers would take more than 128 a thread (one block an SM); capped at 128 for two, but for
    an N of 128 at ranks 1 and 2, which fit two uncapped. float32's stages and 16-bit N of 256 (128 accumulators a
    thread) keep one. The TF32 weight gradient at an N of 128 asks for two at ranks 2 and 3 in every dtype (its
    split planned for two), one at the ranks where capping spills."""
    def min_blocks(channels, spatial, dtype, shift=False):
        ones = (1,) * len(spatial)
        geom = Geometry.build(Family.CONV, channels, channels, spatial, (3,) * len(spatial), ones, ones, batch=8)
        made = plan(geom, dtype=dtype, precision="medium", wgmma_chooser=functools.partial(choose_wgmma, shift=shift))
        return tuple(made.defines[f"{prefix}_WG_MIN_BLOCKS"] for prefix in ("FWD", "BWI", "BWW"))

    assert min_blocks(128, (128, 128), "bfloat16") == min_blocks(128, (128, 128), "float16") == (1, 1, 2)
    # Shifted: N blocks of 64; the weight gradient's accumulators, 3 x 32 a thread, leave room for one block an SM.
    assert min_blocks(128, (128, 128), "bfloat16", shift=True) == (2, 2, 1)
    assert min_blocks(128, (8, 8, 8), "bfloat16") == (2, 2, 2)
    assert min_blocks(64, (32, 32), "bfloat16") == (2, 2, 1)
    assert min_blocks(128, (128, 128), "float32") == (1, 1, 2)
    assert min_blocks(128, (8, 8, 8), "float32") == (1, 1, 2)
    assert min_blocks(128, (8, 8, 8, 8), "float32") == (1, 1, 1)
    assert min_blocks(256, (16, 16), "bfloat16") == (1, 1, 1)


def test_16_bit_conv_shaped_stages_up_to_an_n_of_64_take_two_blocks_of_k_a_slice():
    """Unshifted (WG_SHIFT off): slices of 64 (two blocks of 32 source channels, each at its own window offset; rows
    of 128 bytes) where four stages of them fit two blocks an SM; at an N of 128 and float32, 32. The 16-bit weight
    gradient likewise: slices of 64 of D's cells up to an N of 64, else 32. The packed weight holds whole slices (its
    size in floats: two 16-bit elements a float): an odd count of blocks ends on a slice of zeros past the last one."""
    def stage_fields(in_c, out_c, spatial, dtype="bfloat16", prefix="FWD", stride=None):
        ones = (1,) * len(spatial)
        geom = Geometry.build(Family.CONV, in_c, out_c, spatial, (3,) * len(spatial), stride or ones, ones, batch=8)
        made = plan(geom, dtype=dtype, precision="medium", wgmma_chooser=functools.partial(choose_wgmma, shift=False))
        stage = {"FWD": "forward", "BWI": "backward_input"}.get(prefix, "backward_weight")
        return wgmma_fields(made, prefix), made.launches[stage].shared_bytes, made.packed_elements.get(stage)

    # 64 -> 48 (gathered: 9 x 48 products a source element): 2 blocks x 9 offsets = 9 slices of 64 rows of 64; four
    # stages of 64 x 128 B and 128 x 128 B.
    assert stage_fields(64, 48, (56, 56)) == ((1, 64, 128, 4, 2, 64), 4 * (8192 + 16384) + 1024, 9 * 64 * 64 // 2)
    assert stage_fields(48, 64, (56, 56), "float16", "BWI")[0] == (1, 64, 128, 4, 2, 64)
    # 32 -> 32 in 3-D, stride 2 along the last axis (no WG_SHIFT): 27 blocks, 14 slices (the last one's second block
    # zeros) of 32 rows of 64.
    assert stage_fields(32, 32, (8, 8, 8), stride=(1, 1, 2)) == (
        (1, 32, 128, 4, 2, 64), 4 * (4096 + 16384) + 1024, 14 * 32 * 64 // 2)
    # An N of 128: 36 slices of 32 (rows of 64 bytes).
    assert stage_fields(128, 128, (32, 32)) == ((1, 128, 128, 4, 1, 32), 4 * (8192 + 8192) + 1024, 36 * 128 * 32 // 2)
    assert stage_fields(64, 64, (56, 56), "float32")[0][5] == stage_fields(128, 128, (32, 32), prefix="BWW")[0][5] == 32
    assert stage_fields(64, 64, (56, 56), prefix="BWW")[0][5] == 64


# Per stage, the source's channels of a group rounded up to blocks of 32 and its cells: x (48 -> 64 channels, 90
# cells) and the upstream gradient (72 -> 96 channels; the conv's 42 cells, the transpose's 154).
_CONV_SOURCES = {"forward": (64, 90), "backward_input": (96, 42), "backward_weight": (64, 90)}
_TRANSPOSE_SOURCES = {"forward": (64, 90), "backward_input": (96, 154), "backward_weight": (96, 154)}


@pytest.mark.parametrize(("family", "sources"), [(Family.CONV, _CONV_SOURCES),
                                                 (Family.CONV_TRANSPOSE, _TRANSPOSE_SOURCES)])
def test_16_bit_wgmma_stages_read_their_source_channels_last(family, sources):
    """Each 16-bit `_wgmma` stage's `_wgsource` launch and scratch (a 5x3 window: 15 x 72 and 15 x 48 products a source
    element in the conv-shaped stages): its source's cells (the weight gradient's U) of every image and group, a
    group's channels rounded up to whole blocks of 32, in floats of two elements; a warp per 64 cells and 32 channels.
    float32 reads its operands as they are."""
    geom = Geometry.build(family, 96, 144, (10, 9), (5, 3), (1, 1), (0, 0), groups=2, batch=3)
    made = plan(geom, dtype="bfloat16", precision="medium")
    assert [made.launches[stage].kernel for stage in sources] == [f"{stage}_wgmma" for stage in sources]
    assert made.source_elements == {stage: 3 * 2 * cells * channels // 2 for stage, (channels, cells) in sources.items()}
    for stage, (channels, cells) in sources.items():
        assert made.launches[f"{stage}_wgsource"].grid == -(-3 * 2 * channels // 32 * -(-cells // 64) * 32 // 256)
    assert [made.defines[f"{prefix}_WG_CHANNELS_LAST"] for prefix in ("FWD", "BWI", "BWW")] == [1, 1, 1]
    single = plan(geom, precision="medium")
    assert single.source_elements == {} and not any(name.endswith("_wgsource") for name in single.launches)
    assert [single.defines[f"{prefix}_WG_CHANNELS_LAST"] for prefix in ("FWD", "BWI", "BWW")] == [0, 0, 0]


@pytest.mark.parametrize(("out_c", "channels_last"), [(77, False), (78, True)])
def test_16_bit_conv_stages_read_channels_last_from_700_products_a_source_element(out_c, channels_last):
    """A 3x3 forward over 32 channels, unshifted (stride 2 along the last axis): 9 x 77 = 693 products a source
    element gather from the channel planes (no pass), 9 x 78 = 702 read the source as the stage's `_wgsource` laid it
    out."""
    geom = Geometry.build(Family.CONV, 32, out_c, (12, 12), (3, 3), (1, 2), (1, 1), batch=2)
    made = plan(geom, dtype="float16", precision="medium")
    assert made.launches["forward"].kernel == "forward_wgmma"
    assert made.defines["FWD_WG_CHANNELS_LAST"] == int(channels_last)
    assert ("forward" in made.source_elements) == ("forward_wgsource" in made.launches) == channels_last


def test_16_bit_channels_last_stages_stage_a_slice_once_for_the_last_axis_s_offsets():
    """conv3d 32 -> 32 (864 products a source element: channels-last), stride 1 along the last axis: slices of one
    block of 32 (rows of 64 bytes) at the 9 offsets of the other axes, each staging 128 + 2 rows of A and the 3 x 32
    rows of B of the last axis's offsets; an image's tile cells are its rows of 8 cells padded to 10, 640 positions,
    5 tiles. The packed weight is the unshifted one's of slices of 32. 128 dst channels take N blocks of 64 (B's rows
    of an N of 128 would take four stages past 97 KB). Not shifted: 256 dst channels, stride 2 along the last axis,
    one offset along it, or 130 rows past a tile (a second pass of copies holds 128). Past 97 KB of shared memory in
    four stages (a k5 window over 64 channels: 117 KB), three. Shifted stages read their source channels-last from
    576 products a source element, not 700."""
    def shifted(in_c, out_c, spatial, kernel, stride=None, dilation=None):
        geom = Geometry.build(Family.CONV, in_c, out_c, spatial, kernel, stride or (1,) * len(spatial),
                              (1,) * len(spatial), dilation=dilation, batch=8)
        return plan(geom, dtype="bfloat16", precision="medium")

    made = shifted(32, 32, (8, 8, 8), (3, 3, 3))
    for prefix, stage in (("FWD", "forward"), ("BWI", "backward_input")):
        assert wgmma_fields(made, prefix) == (1, 32, 128, 4, 2, 32)
        assert (made.defines[f"{prefix}_WG_CHANNELS_LAST"], made.defines[f"{prefix}_WG_SHIFT"]) == (1, 1)
        assert made.launches[stage].shared_bytes == 4 * (3 * 32 * 64 + 9 * 1024) + 1024
        assert made.packed_elements[stage] == 27 * 32 * 32 // 2
        assert made.launches[stage].grid == 8 * 5
    assert shifted(32, 32, (8, 8, 8), (3, 3, 3), stride=(1, 1, 2)).defines["FWD_WG_SHIFT"] == 0
    wide = shifted(32, 128, (8, 8, 8), (3, 3, 3))  # 128 channels: shifted in two N blocks of 64
    assert (wide.defines["FWD_WG_SHIFT"], wide.defines["FWD_WG_N"], wide.launches["forward"].grid) == (1, 64, 8 * 5 * 2)
    assert shifted(32, 256, (8, 8, 8), (3, 3, 3)).defines["FWD_WG_SHIFT"] == 0
    assert shifted(32, 32, (8, 8, 8), (3, 3, 1)).defines["FWD_WG_SHIFT"] == 0
    # 27 x 32 products a source element: channels-last either side of the dilation of the last axis.
    assert shifted(32, 32, (8, 8, 200), (3, 3, 3), dilation=(1, 1, 64)).defines["FWD_WG_SHIFT"] == 1  # 128 rows
    assert shifted(32, 32, (8, 8, 200), (3, 3, 3), dilation=(1, 1, 65)).defines["FWD_WG_SHIFT"] == 0  # 130 rows
    # 15 x 64 products: channels-last; B's 5 x 64 rows of 64 bytes a slice take 117 KB in four stages: three.
    wide = shifted(64, 64, (8, 40), (3, 5))
    assert [wide.defines[f"FWD_WG_{field}"] for field in ("CHANNELS_LAST", "SHIFT", "STAGES")] == [1, 1, 3]
    assert wide.launches["forward"].shared_bytes == 3 * (5 * 64 * 64 + 9 * 1024) + 1024
    # The batch's positions are counted in 32 bits: one cell an image padded by 128 positions, 2^23 images shift,
    # 2^25 (4.3e9 positions) do not.
    for images, expected in ((1 << 23, 1), (1 << 25, 0)):
        lone = Geometry.build(Family.CONV, 32, 32, (1, 1, 1), (3, 3, 3), (1, 1, 1), (64, 64, 64),
                              dilation=(64, 64, 64), batch=images)
        assert plan(lone, dtype="bfloat16", precision="medium").defines["FWD_WG_SHIFT"] == expected
    # Shifted, channels-last from 576 products a source element (9 x 64), not 567 (9 x 63).
    for out_c, expected in ((64, (1, 1)), (63, (0, 0))):
        made = shifted(64, out_c, (16, 16), (3, 3))
        assert (made.defines["FWD_WG_CHANNELS_LAST"], made.defines["FWD_WG_SHIFT"]) == expected


def test_the_16_bit_weight_gradient_reads_d_itself_where_its_pack_would_copy_it():
    """Unshifted, the 16-bit D pack writes P[image][group][D_ROWS][D_COLUMNS]: D's own layout where a group's channels
    are whole N blocks and its cells whole slices (of 64 cells up to an N of 64, else 32), so the plan names the
    stage, its pack launches nothing and has no packed size, and the `_wgmma` reads D in its place. TF32 rounds D as
    it packs it: never a copy. Shifted, D is always read in place (zeros past its lines and channels as it loads)."""
    def copied(out_c, spatial, dtype="bfloat16", groups=1, weight_shift=False):
        geom = Geometry.build(Family.CONV, 64, out_c, spatial, (3, 3), (1, 1), (1, 1), batch=4, groups=groups)
        chooser = functools.partial(choose_wgmma, weight_shift=weight_shift)
        made = plan(geom, dtype=dtype, precision="medium", wgmma_chooser=chooser)
        pack = made.launches["backward_weight_pack"]
        assert pack.kernel == "backward_weight_wgpack" and made.launches["backward_weight"].grid > 0
        in_place = "backward_weight" in made.copied_packs
        assert (pack.grid == 0, "backward_weight" not in made.packed_elements) == (in_place, in_place)
        return made.copied_packs

    assert copied(64, (56, 56)) == copied(64, (56, 56), "float16") == frozenset({"backward_weight"})  # 3136 cells
    assert copied(128, (16, 8)) == copied(64, (16, 8), groups=2) == frozenset({"backward_weight"})
    assert copied(40, (16, 8)) == frozenset()  # 40 channels: an N block of 64, zeros past them
    assert copied(40, (16, 8), weight_shift=True) == frozenset({"backward_weight"})
    assert copied(64, (10, 9)) == frozenset()  # 90 cells: slices to 128, zeros past them
    assert copied(64, (12, 8)) == frozenset() and copied(128, (12, 8)) == frozenset({"backward_weight"})  # 96 cells
    assert copied(64, (56, 56), "float32") == frozenset()


def test_16_bit_wgmma_stages_need_an_image_s_channels_last_source_to_fit_32_bits():
    """A 16-bit `_wgmma` stage indexes an image's channels-last source in 32 bits: 16 channels rounded up to 32 over
    2**27 cells are 2**32 elements (x itself holds 2**31), so that the forward (a 3x3x3 window over 32 dst channels,
    864 products a source element) gathers from the channel planes instead, and the weight gradient keeps its GEMM;
    one plane fewer fits."""
    def stages(depth: int) -> tuple[int, str]:
        geom = Geometry.build(Family.CONV, 16, 32, (depth, 512, 512), (3, 3, 3), (1, 1, 1), (1, 1, 1))
        made = plan(geom, dtype="bfloat16", precision="medium")
        return made.defines["FWD_WG_CHANNELS_LAST"], made.launches["backward_weight"].kernel
    assert stages(511) == (1, "backward_weight_wgmma")
    assert stages(512)[0] == 0 and stages(512)[1] != "backward_weight_wgmma"


@pytest.mark.parametrize("out_c", [32, 64, 128, 256])
def test_16_bit_wgmma_blocks_stay_within_the_shared_memory_measured_right(out_c):
    """Every 16-bit `_wgmma` stage of every N takes at most 97 KB of shared memory a block. On the H200 the 16-bit
    loop (A and B through descriptors) gave other bits past about 113 KB a block (6 and 8 slices, benchmarks/NOTES.md,
    twenty-seventh session) and the same bits at 103 KB: a plan past that needs the cause found first."""
    geom = Geometry.build(Family.CONV, 64, out_c, (16, 16), (3, 3), (1, 1), (1, 1), batch=2)
    made = plan(geom, dtype="bfloat16", precision="medium")
    for stage in ("forward", "backward_input", "backward_weight"):
        assert made.launches[stage].kernel == f"{stage}_wgmma"
        assert made.launches[stage].shared_bytes <= 97 * 1024, (stage, made.launches[stage].shared_bytes)
