"""Issue 11's table: per batched case, convgen's tape in each precision that ran and convgen.torch on bfloat16
and float16 tensors next to cuDNN strict fp32, TF32 and bf16 channels-last: times, torch strict over each, the
rel err against float64 and, for the contestants on tensor cores, the share of the H200's dense tensor-core peak
their kernels reached."""

from __future__ import annotations

from typing import Any

from suite.cells import ratio_cell, timing_cell
from suite.contestants import ADAPTER_BF16, ADAPTER_FP16, TORCH_BF16_CHANNELS_LAST
from suite.precision import (
    H200_16BIT_DENSE_FLOPS,
    H200_TF32_DENSE_FLOPS,
    TAPE_LABELS,
    TF32_MMA_PER_MULTIPLY_ADD,
    peak_fractions,
)

# convgen.torch's 16-bit rows together, above cuDNN bf16's (the baseline of the bf16 speed target; fp16 has none)
PRECISION_TABLE_LABELS = (*TAPE_LABELS, "torch_strict", "torch_tf32", ADAPTER_BF16, ADAPTER_FP16,
                          TORCH_BF16_CHANNELS_LAST.label)
PRECISION_TABLE_HEADER = ["case", "contestant", "fwd", "fwd+bwd", "torch/this fwd", "torch/this fwd+bwd",
                          "rel err (worst output)", "TC peak fwd / fwd+bwd"]


def error_cell(report: Any, label: str) -> str:
    """The contestant's largest rel err against float64 over the case's outputs, and which output it is."""
    errors = report.check.get(label)
    if not errors:
        return "—"
    worst = max(errors, key=errors.get)
    return f"{errors[worst]:.1e} {worst}"


def peak_cell(fractions: dict[str, float | None] | None) -> str:
    """Share of the dense tensor-core peak, fwd / fwd+bwd; — for a contestant without tensor-core count."""
    if fractions is None:
        return "—"
    return " / ".join("—" if fraction is None else f"{fraction:.1%}" for fraction in fractions.values())


def precision_rows(report: Any) -> list[list[str]]:
    """One row per contestant of PRECISION_TABLE_LABELS that was measured on the case (PRECISION_TABLE_HEADER)."""
    fractions = peak_fractions(report)
    return [[report.case.title, label, timing_cell(report, label, "fwd"), timing_cell(report, label, "fwd_bwd"),
             ratio_cell(report, "fwd", label), ratio_cell(report, "fwd_bwd", label), error_cell(report, label),
             peak_cell(fractions.get(label))]
            for label in PRECISION_TABLE_LABELS if label in report.timings or label in report.check]


def precision_note() -> str:
    """What the table's columns mean, printed under it."""
    products = ", ".join(f"{count} in {precision}" for precision, count in TF32_MMA_PER_MULTIPLY_ADD.items())
    return ("convgen = the tape in 'highest' (fp32 FMA), convgen_high = 'high' (3xTF32), convgen_medium = "
            f"'medium' (TF32); {ADAPTER_BF16} / {ADAPTER_FP16} = convgen.torch on bfloat16 / float16 tensors "
            "(NCHW, products summed in float32); torch/this = torch strict time over the row's, call / kernels. "
            f"TC peak = the kernels' mma rate (TF32 products per multiply-add: {products}; one bf16 or fp16 product "
            "for convgen.torch's 16-bit rows; multiply-adds of the case's GEMM, 3× for fwd+bwd; 2 flops each) over "
            f"the H200's dense tensor-core peak: TF32 {H200_TF32_DENSE_FLOPS / 1e12:g}, bf16/fp16 "
            f"{H200_16BIT_DENSE_FLOPS / 1e12:g} TFLOP/s (datasheet: 989 and 1,979 TFLOPS with sparsity; the H100 "
            "SXM's are the same).")
