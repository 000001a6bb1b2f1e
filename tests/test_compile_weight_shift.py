"""The shifted 16-bit weight gradient (WG_SHIFT on BWW, planned with `choose_wgmma(..., weight_shift=True)`)
compiled for sm_90a with NVRTC at every rank of both conv families: no spills, and no wgmma that ptxas
serializes (its K accumulator sets stay in flight across a slice's products). Needs the NVRTC wheel (the
`test` extra), as tests/test_compile.py."""

from __future__ import annotations

import pytest
from convgen import nvrtc_check
from convgen.cuda_launch import plan
from convgen.geometry import Family, Geometry
from weight_shift_support import weight_shift_chooser

RANKS = range(1, 9)


def shifted_geometry(family: Family, rank: int) -> Geometry:
    """64 channels each way (an N of 64: three accumulator sets of 16 a thread), lines of 8 cells, stride 1."""
    spatial = (3,) * (rank - 1) + (8,) if rank <= 3 else (2,) * (rank - 1) + (8,)
    return Geometry.build(family, 64, 64, spatial, (3,) * rank, (1,) * rank, (1,) * rank, batch=2)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", (Family.CONV, Family.CONV_TRANSPOSE), ids=lambda f: f.value)
def test_the_shifted_weight_gradient_compiles_for_sm90a_without_spills(family: Family, rank: int) -> None:
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC is not installed (the test extra)")
    geom = shifted_geometry(family, rank)
    assert plan(geom, dtype="bfloat16", precision="medium", wgmma_chooser=weight_shift_chooser).defines[
        "BWW_WG_SHIFT"] == 1
    report = nvrtc_check.compile_plan(geom, "sm_90", "bfloat16", "medium", wgmma_chooser=weight_shift_chooser)
    assert report.error is None, report.error
    weight = [k for k in report.kernels if k.symbol.endswith("_backward_weight_wgmma")]
    assert len(weight) == 1 and weight[0].registers > 8, report.kernels
    assert not weight[0].spills and not weight[0].serialized_wgmma, weight[0]
