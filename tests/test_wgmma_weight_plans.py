"""The 16-bit weight gradient's shifted plans (WG_SHIFT, convgen.wgmma_tiles._shifted_weight_tile), on the H200's
hardware: on by default, off with the chooser's `weight_shift`; where the rule takes them, their slices, blocks,
split and shared memory, and that D is read in place (no `_wgpack` launch). The kernels themselves
run in tests/test_emulated_weight_shift.py and under `pytest -m cuda` (tests/test_cuda_weight_shift.py)."""

from __future__ import annotations

import functools

import pytest
from convgen.cuda_launch import plan
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import choose_wgmma

SMS = 132  # the H200's, which `plan` plans for by default


def weight_plan(in_c, out_c, spatial, batch, dtype="bfloat16", kernel=3, stride=1, shift=True):
    """The plan of a conv whose last axis has `stride`, with the weight gradient shifted where the rule allows."""
    rank = len(spatial)
    geom = Geometry.build(Family.CONV, in_c, out_c, spatial, (kernel,) * rank, (1,) * (rank - 1) + (stride,),
                          (kernel // 2,) * rank, batch=batch)
    return plan(geom, dtype=dtype, precision="medium", wgmma_chooser=functools.partial(choose_wgmma, shift=shift))


def fields(made):
    names = ("WG_SHIFT", "WG_N", "WG_K", "WG_STAGES", "WG_MIN_BLOCKS")
    return tuple(made.defines[f"BWW_{name}"] for name in names) + (made.defines["BWW_SPLIT"],)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_n32_64_to_64_shifts_its_weight_gradient_in_slices_of_64(dtype):
    """N32 64->64 56²: three row blocks of 64 (the first axis's three offsets of 64 U channels), one N block of 64,
    32 of 48 accumulators a thread (ptxas asked for two blocks an SM); lines of 56 cells in one slice of 64 each:
    32 x 56 slices, split for one block an SM (44 parts ran faster than 88 on an H100). Four stages of B's 64 rows of 128 bytes and U's 64 + 2 cells (72: whole swizzle
    groups) of 128 bytes. D is read in place: the pack launches nothing."""
    made = weight_plan(64, 64, (56, 56), 32, dtype)
    split = min(SMS // 3, 32 * 56 // 8)
    assert fields(made) == (1, 64, 64, 4, 2, split)
    launch = made.launches["backward_weight"]
    assert (launch.kernel, launch.grid, launch.block) == ("backward_weight_wgmma", 3 * split, 256)
    assert launch.shared_bytes == 4 * (64 * 128 + 72 * 128) + 1024
    assert made.launches["backward_weight_pack"].grid == 0 and "backward_weight" in made.copied_packs
    assert "backward_weight" not in made.packed_elements


def test_n8_128_to_128_shifts_in_slices_of_32_one_block_an_sm():
    """N8 128->128 128²: an N of 128 (96 accumulators a thread: one block an SM); slices of 64 would take
    4 x (16 KB + 9 KB) + 1 KB, past the 97 KB measured right, so 32 (B's rows of 64 bytes, U's 40 cells); six row
    blocks (two channel blocks at three offsets)."""
    made = weight_plan(128, 128, (128, 128), 8)
    assert fields(made) == (1, 128, 32, 4, 1, SMS // 6)
    assert made.launches["backward_weight"].grid == 6 * (SMS // 6)
    assert made.launches["backward_weight"].shared_bytes == 4 * (128 * 64 + 40 * 128) + 1024


def test_a_k5_line_shifts_with_five_accumulator_sets():
    """conv1d N32 64->64 k5: 5 x 16 accumulators a thread (one block an SM), U's 64 + 4 cells a slice."""
    made = weight_plan(64, 64, (4096,), 32, kernel=5)
    assert fields(made)[:5] == (1, 64, 64, 4, 1)
    assert made.launches["backward_weight"].shared_bytes == 4 * (64 * 128 + 72 * 128) + 1024


def test_lines_of_32_take_slices_of_32():
    """conv3d 32->64: lines of 32 cells fill slices of 32 (64 would be half zeros)."""
    made = weight_plan(32, 64, (16, 16, 32), 2)
    assert fields(made)[:3] == (1, 64, 32)


@pytest.mark.parametrize(("args", "why"), [
    ((64, 64, (56, 56), 32, "float32"), "float32 is rounded to TF32 as D is packed"),
    ((64, 64, (12, 12), 8), "lines of 12 cells: not whole 16-byte copies"),
    ((64, 64, (56, 56), 8, "bfloat16", 3, 2), "stride 2 along the last axis"),
    ((64, 32, (56, 56), 8), "32 D channels: an N of 32, 16 a warpgroup"),
    ((64, 256, (16, 16), 8), "an N of 256: 192 accumulators a thread"),
    ((64, 128, (32, 32), 8, "bfloat16", 7), "k7 at an N of 128: 224 accumulators a thread"),
    ((64, 64, (56, 56), 32, "bfloat16", 3, 1, False), "the chooser's shift off"),
])
def test_the_weight_gradient_stays_unshifted_where_the_shift_does_not_apply(args, why):
    made = weight_plan(*args)
    assert made.defines["BWW_WG_SHIFT"] == 0, why


def test_the_weight_gradient_is_shifted_by_default_and_unshifted_on_request():
    geom = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    made = plan(geom, dtype="bfloat16", precision="medium")
    assert made.defines["BWW_WG_SHIFT"] == 1 and made.defines["FWD_WG_SHIFT"] == 1
    unshifted = plan(geom, dtype="bfloat16", precision="medium",
                     wgmma_chooser=functools.partial(choose_wgmma, weight_shift=False))
    assert unshifted.defines["BWW_WG_SHIFT"] == 0 and unshifted.defines["FWD_WG_SHIFT"] == 1
