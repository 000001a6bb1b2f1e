"""Issue 11's tensor-core precisions in the benchmark: which precisions of convgen's tape a case runs (a batched
case those `--precisions` names, a one-image case the default only), each one's contestant label, convgen.torch's
16-bit contestants, and the share of the H200's dense tensor-core peak that each of them reaches."""

from __future__ import annotations

from typing import Any

from convgen.generated.contract import PRECISION_MMA_MODES

from suite.cases import Case

TAPE_PRECISIONS = tuple(PRECISION_MMA_MODES)  # what Tape(precision=...) takes: "highest", "high", "medium"
DEFAULT_PRECISION = "highest"  # fp32 FMAs, the tape's default: the contestant "convgen" of issues 9 and 10

# NVIDIA H200 SXM datasheet: "TF32 Tensor Core 989 TFLOPS" and "BF16 Tensor Core 1,979 TFLOPS" (FP16 the same),
# with sparsity; dense is half of it (a multiply-add counted as two flops). The H100 SXM's figures are the same.
H200_TF32_DENSE_FLOPS = 494.7e12
H200_16BIT_DENSE_FLOPS = 989.5e12
# TF32 mma products per multiply-add: "high" is 3xTF32 (big·big, big·small, small·big; docs/DESIGN.md, the
# tensor-core slice), "medium" one TF32 product; "highest" takes no tensor core.
TF32_MMA_PER_MULTIPLY_ADD = {"high": 3, "medium": 1}
ADAPTER_BF16 = "convgen_torch_bf16"  # convgen.torch on bfloat16 tensors, beside torch_bf16_cl
ADAPTER_FP16 = "convgen_torch_fp16"  # convgen.torch on float16 tensors (no cuDNN fp16 contestant)
# GEMMs per timed mode: the forward, and for forward+backward also the input and the weight gradient, each
# as many multiply-adds as the forward.
GEMMS_PER_MODE = {"fwd": 1, "fwd_bwd": 3}


def convgen_label(precision: str) -> str:
    """The tape contestant's label: "convgen" at the default precision (as before issue 11), else
    convgen_{precision}."""
    return "convgen" if precision == DEFAULT_PRECISION else f"convgen_{precision}"


TAPE_LABELS = tuple(convgen_label(precision) for precision in TAPE_PRECISIONS)


def parse_precisions(text: str) -> tuple[str, ...]:
    """`--precisions`: comma-separated names, returned in the tape's order; ValueError naming any unknown one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TAPE_PRECISIONS]
    if unknown or not names:
        what = f"unknown precision(s) {', '.join(unknown)}" if unknown else "no precision given"
        raise ValueError(f"{what}; known: {', '.join(TAPE_PRECISIONS)}")
    return tuple(precision for precision in TAPE_PRECISIONS if precision in names)


def case_precisions(case: Case, selected: tuple[str, ...]) -> tuple[str, ...]:
    """The tape precisions a case runs: the selected ones for a batched case; a one-image case stays as it
    was measured before issue 11, at the default."""
    return selected if case.is_batched else (DEFAULT_PRECISION,)


# Contestant -> (its tensor-core products per multiply-add, the dense peak they run at): the tape's TF32 precisions
# and convgen.torch's 16-bit tensors (one bf16 or fp16 product each).
TENSOR_CORE_RATES = {**{convgen_label(precision): (products, H200_TF32_DENSE_FLOPS)
                        for precision, products in TF32_MMA_PER_MULTIPLY_ADD.items()},
                     ADAPTER_BF16: (1, H200_16BIT_DENSE_FLOPS), ADAPTER_FP16: (1, H200_16BIT_DENSE_FLOPS)}


def tensor_core_peak_fraction(case: Case, label: str, mode: str, kernels_ms: float | None) -> float | None:
    """The tensor-core rate contestant `label` reached (mma products × 2 flops over its kernels time) as a share of
    its dense peak (TENSOR_CORE_RATES); None for a contestant without tensor cores or without a time."""
    rate = TENSOR_CORE_RATES.get(label)
    if rate is None or not kernels_ms:
        return None
    products, peak = rate
    flops = 2 * products * GEMMS_PER_MODE[mode] * case.multiply_adds
    return flops / (kernels_ms * 1e-3) / peak


def peak_fractions(report: Any) -> dict[str, dict[str, float | None]]:
    """Per tensor-core contestant of a CaseReport, per mode: its share of its tensor-core peak (kernels time)."""
    return {label: {mode: tensor_core_peak_fraction(report.case, label, mode, report.median(label, mode, "kernels"))
                    for mode in GEMMS_PER_MODE} for label in TENSOR_CORE_RATES}
