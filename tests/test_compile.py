"""Layer 2: every generated CUDA source compiles with NVRTC for sm_90 (no GPU needed) at a
representative geometry of its rank, and no forward kernel spills to local memory."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-bindings and nvidia-cuda-nvrtc-cu12 (the test extra)")

from convgen.generated.kernels import KERNELS
from convgen.generator import nvrtc
from convgen.generator.kernels import kernel_base

PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'conv_r2_forward' for 'sm_90'
ptxas info    : Function properties for conv_r2_forward
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'conv_r2_backward_bias' for 'sm_90'
ptxas info    : Function properties for conv_r2_backward_bias
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem
"""


def test_ptxas_log_is_read_per_kernel():
    assert nvrtc.parse_ptxas_log(PTXAS_LOG) == (
        nvrtc.KernelReport("conv_r2_forward", 40, 0, 0, 0),
        nvrtc.KernelReport("conv_r2_backward_bias", 255, 16, 8, 12),
    )


@pytest.mark.parametrize(("family", "rank"), sorted(KERNELS, key=lambda k: (k[0].value, k[1])),
                         ids=lambda v: getattr(v, "value", v))
def test_source_compiles_for_sm90_without_forward_spills(family, rank):
    report = nvrtc.compile_source(family, rank, "sm_90")
    assert report.error is None, report.error
    assert sorted(k.symbol for k in report.kernels) == sorted(KERNELS[(family, rank)].symbols.values())
    forward = [k for k in report.kernels if k.symbol == f"{kernel_base(family, rank)}_forward"]
    assert forward and not forward[0].spills, forward
