"""The benchmark's tensor-core precisions (issue 11) without a GPU: the tape contestant in each precision on the
suite's stand-in CuPy (the real CUDA tape and backend, kernels compiled and launched as no-ops), the contestants a
case runs (convgen.torch in bf16 and fp16 on the batched convolutions), the precision table, issue 11's targets on
hand-made times and errors (bf16's and fp16's too), the share of the TF32 peak, and bench.py's --precisions option."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from functools import partial

import numpy as np
import pytest
from test_bench_adapter import BENCH_DIR, META, run_script, timed_report  # also puts benchmarks/ on sys.path

torch = pytest.importorskip("torch")
import bench  # noqa: E402
import convgen.cuda  # noqa: E402
import convgen.torch  # noqa: E402
from convgen.geometry import Family  # noqa: E402
from suite import report as report_module  # noqa: E402
from suite import stand_in  # noqa: E402
from suite.cases import BATCHED_CASES, CASES_BY_NAME, UNBATCHED_CASES, Case  # noqa: E402
from suite.contestants import ConvgenContestant, Libraries  # noqa: E402
from suite.measure import contestant_builders  # noqa: E402
from suite.precision import (  # noqa: E402
    H200_16BIT_DENSE_FLOPS,
    H200_TF32_DENSE_FLOPS,
    TAPE_LABELS,
    tensor_core_peak_fraction,
)
from suite.precision_table import PRECISION_TABLE_HEADER, precision_rows  # noqa: E402
from suite.targets import (  # noqa: E402
    ACCURACY_RULES,
    SPEED_RULES,
    check_accuracy,
    check_precisions,
    check_speed,
    format_precision_targets,
)

N8_128 = CASES_BY_NAME["conv2d_128_128_n8"]
N8_128_MULTIPLY_ADDS = 8 * 128 * 128 * 128 * 128 * 9  # output cells (N, C, H, W) × in_c × k²


class RecordingModule:
    """A stand-in compiled module that keeps the NVRTC options it was built with."""

    options: list[tuple[str, ...]] = []

    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        RecordingModule.options.append(options)

    def get_function(self, symbol: str):
        return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0))  # the stand-in driver launches nothing


@pytest.fixture
def stand_in_libs(monkeypatch):
    """Libraries whose convgen.cuda.Tape is the real CUDA tape on the stand-in CuPy."""
    cupy = stand_in.stand_in_cupy()
    monkeypatch.setattr(cupy, "RawModule", RecordingModule)
    monkeypatch.setattr(RecordingModule, "options", [])
    monkeypatch.setattr(stand_in, "stand_in_cupy", lambda: cupy)
    convgen_stand_in = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Tape=partial(stand_in.stand_in_cuda_tape, convgen)))
    return Libraries(cupy=cupy, torch=torch, convgen=convgen_stand_in, flush_l2=lambda: None, adapter=convgen.torch)


def stand_in_inputs(case):
    shapes = {"x": case.input_shape, "seed": case.output_shape, "weight": case.weight_shape, "bias": (case.out_c,)}
    return {name: stand_in.StandInArray(shape, np.float32) for name, shape in shapes.items()}


@pytest.mark.parametrize(("precision", "label", "mma_mode"),
                         [("highest", "convgen", 0), ("high", "convgen_high", 3), ("medium", "convgen_medium", 1)])
def test_each_precision_is_the_tape_contestant_with_that_tape(stand_in_libs, precision, label, mma_mode):
    contestant = ConvgenContestant(N8_128, stand_in_inputs(N8_128), stand_in_libs.convgen, stand_in_libs.cupy,
                                   precision)
    assert contestant.label == label and contestant.tape.precision == precision
    gradients = contestant.arrays_of(contestant.forward_backward(), "fwd_bwd")
    assert set(gradients) == {"grad_x", "grad_weight", "grad_bias"}
    ((defines),) = [[option for option in options if option.startswith("-DMMA_MODE=")]
                    for options in RecordingModule.options]
    assert defines == [f"-DMMA_MODE={mma_mode}"]


def test_a_batched_case_runs_the_selected_precisions_and_one_image_the_default(stand_in_libs):
    def labels(case, precisions):
        return [label for label, _ in contestant_builders(case, stand_in_inputs(case), stand_in_libs, precisions)]

    every = ("highest", "high", "medium")
    assert labels(N8_128, every) == ["convgen", "convgen_high", "convgen_medium", "convgen_torch",
                                     "convgen_torch_bf16", "convgen_torch_fp16", "torch_strict", "torch_tf32",
                                     "torch_bf16_cl"]
    assert labels(N8_128, ("medium",)) == ["convgen_medium", "convgen_torch", "convgen_torch_bf16",
                                           "convgen_torch_fp16", "torch_strict", "torch_tf32", "torch_bf16_cl"]
    one_image = CASES_BY_NAME["conv2d_64_56"]
    assert labels(one_image, ("high", "medium")) == ["convgen", "convgen_torch", "torch_strict", "torch_tf32"]
    batched_pool = Case.square("maxpool2d_n2", "max pool 2d N2 C3 6² k3 s1 p1", Family.MAX_POOL, 3, 3, (6, 6), 3, 1,
                               1, batch=2)  # bf16 channels-last, but no convolution: no convgen bf16 or fp16
    assert labels(batched_pool, ("medium",)) == ["convgen_medium", "convgen_torch", "torch_strict", "torch_bf16_cl"]
    built = [build() for label, build in contestant_builders(N8_128, stand_in_inputs(N8_128), stand_in_libs, every)
             if label in TAPE_LABELS]
    assert [contestant.tape.precision for contestant in built] == list(every)


# Made-up times, ms: (fwd call, fwd kernels, fwd_bwd call, fwd_bwd kernels).
TABLE_TIMES = {"convgen": (1.2, 1.0, 3.6, 3.0), "convgen_high": (0.6, 0.4, 1.9, 1.7),
               "convgen_medium": (0.45, 0.25, 1.2, 0.9), "torch_strict": (1.25, 1.1, 3.5, 3.4),
               "torch_tf32": (0.5, 0.3, 1.4, 1.1), "convgen_torch_bf16": (0.35, 0.22, 1.0, 0.8),
               "convgen_torch_fp16": (0.5, 0.25, 1.1, 0.85), "torch_bf16_cl": (0.3, 0.2, 0.9, 0.7)}
TABLE_ERRORS = {"convgen": {"y": 1.1e-7, "grad_x": 2.0e-7, "grad_weight": 3.3e-7, "grad_bias": 5.0e-8},
                "convgen_high": {"y": 2.1e-7, "grad_x": 3.9e-7, "grad_weight": 6.5e-7, "grad_bias": 5.0e-8},
                "convgen_medium": {"y": 2.4e-4, "grad_x": 3.1e-4, "grad_weight": 4.4e-4, "grad_bias": 5.0e-8},
                "torch_tf32": {"y": 2.6e-4, "grad_x": 5.5e-4, "grad_weight": 4.0e-4, "grad_bias": 1e-8},
                "convgen_torch_bf16": {"y": 2.9e-3, "grad_x": 3.4e-3, "grad_weight": 4.1e-3, "grad_bias": 2.0e-3},
                "convgen_torch_fp16": {"y": 3.6e-4, "grad_x": 4.2e-4, "grad_weight": 5.1e-4, "grad_bias": 2.5e-4}}


def made_up_report(case, times, errors=None):
    report = timed_report(case, times)
    report.check = dict(errors or {})
    return report


def test_the_precision_table_has_a_row_per_contestant_with_times_errors_and_peak_share():
    title = N8_128.title
    rows = precision_rows(made_up_report(N8_128, TABLE_TIMES, TABLE_ERRORS))
    assert all(len(row) == len(PRECISION_TABLE_HEADER) for row in rows)
    assert rows == [
        [title, "convgen", "1.2 / 1", "3.6 / 3", "1.04 / 1.10", "0.97 / 1.13", "3.3e-07 grad_weight", "—"],
        [title, "convgen_high", "0.6 / 0.4", "1.9 / 1.7", "2.08 / 2.75", "1.84 / 2.00", "6.5e-07 grad_weight",
         "58.6% / 41.4%"],
        [title, "convgen_medium", "0.45 / 0.25", "1.2 / 0.9", "2.78 / 4.40", "2.92 / 3.78", "4.4e-04 grad_weight",
         "31.3% / 26.0%"],
        [title, "torch_strict", "1.25 / 1.1", "3.5 / 3.4", "1.00 / 1.00", "1.00 / 1.00", "—", "—"],
        [title, "torch_tf32", "0.5 / 0.3", "1.4 / 1.1", "2.50 / 3.67", "2.50 / 3.09", "5.5e-04 grad_x", "—"],
        [title, "convgen_torch_bf16", "0.35 / 0.22", "1 / 0.8", "3.57 / 5.00", "3.50 / 4.25", "4.1e-03 grad_weight",
         "17.8% / 14.6%"],  # one bf16 product a multiply-add, of 989.5 TFLOP/s
        [title, "convgen_torch_fp16", "0.5 / 0.25", "1.1 / 0.85", "2.50 / 4.40", "3.18 / 4.00", "5.1e-04 grad_weight",
         "15.6% / 13.8%"],
        [title, "torch_bf16_cl", "0.3 / 0.2", "0.9 / 0.7", "4.17 / 5.50", "3.89 / 4.86", "—", "—"],
    ]
    only_high = {label: TABLE_TIMES[label] for label in ("convgen_high", "torch_strict")}
    assert [row[1] for row in precision_rows(made_up_report(N8_128, only_high))] == ["convgen_high", "torch_strict"]


def test_the_tensor_core_peak_share_counts_three_products_in_high_one_in_medium_and_one_16_bit():
    assert H200_TF32_DENSE_FLOPS == 494.7e12 and H200_16BIT_DENSE_FLOPS == 989.5e12
    assert N8_128.multiply_adds == N8_128_MULTIPLY_ADDS
    assert CASES_BY_NAME["conv2d_3_224_k7_n32"].multiply_adds == 32 * 64 * 112 * 112 * 3 * 7 * 7
    assert CASES_BY_NAME["maxpool2d_1024"].multiply_adds == 0
    high_fwd = tensor_core_peak_fraction(N8_128, "convgen_high", "fwd", 0.4)
    assert high_fwd == pytest.approx(3 * 2 * N8_128_MULTIPLY_ADDS / 0.4e-3 / 494.7e12, rel=1e-12)
    assert high_fwd == pytest.approx(0.58603, abs=1e-5)
    medium_fwd_bwd = tensor_core_peak_fraction(N8_128, "convgen_medium", "fwd_bwd", 0.9)
    assert medium_fwd_bwd == pytest.approx(1 * 2 * 3 * N8_128_MULTIPLY_ADDS / 0.9e-3 / 494.7e12, rel=1e-12)
    bf16_fwd_bwd = tensor_core_peak_fraction(N8_128, "convgen_torch_bf16", "fwd_bwd", 0.5)
    assert bf16_fwd_bwd == pytest.approx(1 * 2 * 3 * N8_128_MULTIPLY_ADDS / 0.5e-3 / 989.5e12, rel=1e-12)
    assert bf16_fwd_bwd == pytest.approx(0.23439, abs=1e-5)
    assert tensor_core_peak_fraction(N8_128, "convgen_torch_fp16", "fwd", 0.5) == pytest.approx(bf16_fwd_bwd / 3)
    for no_tensor_cores in ("convgen", "torch_tf32", "torch_bf16_cl", "convgen_torch"):
        assert tensor_core_peak_fraction(N8_128, no_tensor_cores, "fwd", 0.4) is None
    assert tensor_core_peak_fraction(N8_128, "convgen_high", "fwd", None) is None


def reports_of(*reports):
    return {report.case.name: report for report in reports}


ACCURACY_HIGH, ACCURACY_MEDIUM, ACCURACY_BF16, ACCURACY_FP16 = ACCURACY_RULES
SPEED_HIGH, SPEED_MEDIUM, SPEED_CONV3D_CONV4D, SPEED_BF16 = SPEED_RULES
FMA_ERRORS = {"y": 1e-7, "grad_x": 2e-7, "grad_weight": 4e-7, "grad_bias": 1e-7}


def test_high_accuracy_is_within_twice_the_fma_error_of_each_output():
    n32, n8, conv3d = BATCHED_CASES[0], BATCHED_CASES[1], CASES_BY_NAME["conv3d_32_32_n8"]
    within = {"y": 1.9e-7, "grad_x": 4e-7, "grad_weight": 8e-7, "grad_bias": 1e-7}  # grad_x, grad_weight: 2× exactly
    passing = reports_of(made_up_report(n8, {}, {"convgen": FMA_ERRORS, "convgen_high": within}))
    assert check_accuracy(ACCURACY_HIGH, passing)["met"] is True
    over = within | {"grad_weight": 8.4e-7}
    failing = reports_of(made_up_report(n32, {}, {"convgen": FMA_ERRORS, "convgen_high": over}),
                         made_up_report(conv3d, {}, {"convgen": FMA_ERRORS,
                                                     "convgen_high": {"y": 1e-7, "grad_x": 1e-7, "grad_weight": 1e-7}}))
    target = check_accuracy(ACCURACY_HIGH, failing)
    assert target["met"] is False and target["missing"] == ["conv3d_32_32_n8 grad_bias"]
    assert target["cases"]["conv2d_64_56_n32"]["grad_weight"] == {"rel_err": 8.4e-7, "bound": 8e-7, "ok": False}
    assert target["cases"]["conv2d_64_56_n32"]["grad_x"]["ok"] is True
    lines = format_precision_targets(check_precisions(failing))
    assert lines[1] == ("- accuracy high — convgen_high rel err ≤ 2 × convgen's (fp32 FMA), same case and output: "
                        "no (conv2d_64_56_n32 grad_weight 8.4e-07 > 8.0e-07; missing conv3d_32_32_n8 grad_bias).")
    no_fma = reports_of(made_up_report(n8, {}, {"convgen_high": within}))
    assert check_accuracy(ACCURACY_HIGH, no_fma)["missing"] == [f"{n8.name} {output}" for output in FMA_ERRORS]


def test_medium_accuracy_is_within_1e_3():
    n32, n8 = BATCHED_CASES[0], BATCHED_CASES[1]
    within = {"y": 2e-4, "grad_x": 1e-3, "grad_weight": 9.9e-4, "grad_bias": 1e-8}
    assert check_accuracy(ACCURACY_MEDIUM, reports_of(made_up_report(n8, {}, {"convgen_medium": within})))["met"]
    failing = reports_of(made_up_report(n8, {}, {"convgen_medium": within | {"grad_x": 1.2e-3}}),
                         made_up_report(n32, {}, {"convgen_medium": {"y": 2e-4}}))
    lines = format_precision_targets(check_precisions(failing))
    assert lines[2] == ("- accuracy medium — convgen_medium rel err ≤ 0.001: no (conv2d_128_128_n8 grad_x 1.2e-03 > "
                        "1.0e-03; missing conv2d_64_56_n32 grad_x, conv2d_64_56_n32 grad_weight, "
                        "conv2d_64_56_n32 grad_bias).")


def test_high_is_twice_cudnn_strict_on_the_two_large_conv2d_cases():
    n32, n8 = CASES_BY_NAME["conv2d_64_56_n32"], N8_128
    strict, twice = (2.0, 1.6, 6.0, 4.0), (1.0, 0.8, 3.0, 2.0)  # every ratio 2 exactly
    passing = reports_of(made_up_report(n8, {"torch_strict": strict, "convgen_high": twice}),
                         made_up_report(n32, {"torch_strict": strict, "convgen_high": twice}))
    assert check_speed(SPEED_HIGH, passing)["met"] is True
    failing = reports_of(made_up_report(n8, {"torch_strict": strict, "convgen_high": (1.0, 0.8, 3.0, 2.1)}),
                         made_up_report(n32, {"torch_strict": strict}))
    target = check_speed(SPEED_HIGH, failing)
    assert target["met"] is False
    assert target["measures"]["fwd_bwd kernels"]["cases"]["conv2d_128_128_n8"]["convgen_high"] == {
        "ms": 2.1, "torch_strict_ms": 4.0, "speedup": 4.0 / 2.1, "ok": False}
    assert format_precision_targets(check_precisions(failing))[5] == (
        "- speed high — torch_strict/convgen_high ≥ 2 on conv2d_128_128_n8, conv2d_64_56_n32: "
        "fwd call no (missing conv2d_64_56_n32 convgen_high), fwd kernels no (missing conv2d_64_56_n32 convgen_high), "
        "fwd_bwd call no (missing conv2d_64_56_n32 convgen_high), fwd_bwd kernels no (conv2d_128_128_n8 "
        "convgen_high 1.90; missing conv2d_64_56_n32 convgen_high). Met: no.")
    not_in_the_run = check_speed(SPEED_HIGH, reports_of(made_up_report(n8, {"torch_strict": strict,
                                                                           "convgen_high": twice})))
    assert not_in_the_run["met"] is False
    assert not_in_the_run["measures"]["fwd call"]["missing"] == ["conv2d_64_56_n32 convgen_high"]


def test_medium_is_no_slower_than_cudnn_tf32_on_every_batched_case():
    tf32 = (1.0, 0.5, 2.0, 1.0)
    first, second, third = BATCHED_CASES[:3]
    passing = reports_of(made_up_report(first, {"torch_tf32": tf32, "convgen_medium": tf32}),  # ratio 1 is enough
                         made_up_report(second, {"torch_tf32": tf32, "convgen_medium": (0.5, 0.25, 1.0, 0.5)}))
    assert check_speed(SPEED_MEDIUM, passing)["met"] is True
    failing = passing | reports_of(made_up_report(third, {"torch_tf32": (1.0, 0.45, 2.0, 1.0),
                                                          "convgen_medium": tf32}))
    assert format_precision_targets(check_precisions(failing))[6] == (
        "- speed medium — torch_tf32/convgen_medium ≥ 1 on every batched case: fwd call yes, fwd kernels no "
        "(conv2d_3_224_k7_n32 convgen_medium 0.90), fwd_bwd call yes, fwd_bwd kernels yes. Met: no.")
    untimed = passing | reports_of(made_up_report(third, {"torch_tf32": tf32}))
    assert check_speed(SPEED_MEDIUM, untimed)["measures"]["fwd call"] == {
        "cases": check_speed(SPEED_MEDIUM, passing)["measures"]["fwd call"]["cases"],
        "missing": ["conv2d_3_224_k7_n32 convgen_medium"], "met": False}


def test_every_precision_is_ahead_of_cudnn_strict_on_conv3d_and_conv4d():
    conv3d, conv4d = CASES_BY_NAME["conv3d_32_32_n8"], CASES_BY_NAME["conv4d_8_16_n8"]
    strict, ahead = (1.0, 1.0, 4.0, 4.0), (0.9, 0.9, 3.9, 3.9)
    every_mode = {"torch_strict": strict, "convgen": ahead, "convgen_high": ahead, "convgen_medium": ahead}
    passing = reports_of(made_up_report(conv3d, every_mode), made_up_report(conv4d, every_mode))
    assert check_speed(SPEED_CONV3D_CONV4D, passing)["met"] is True
    slower_and_missing = {"torch_strict": strict, "convgen": ahead, "convgen_high": (1.25, 0.9, 3.9, 3.9)}
    failing = reports_of(made_up_report(conv3d, every_mode), made_up_report(conv4d, slower_and_missing))
    assert format_precision_targets(check_precisions(failing))[7] == (
        "- speed conv3d conv4d — torch_strict/convgen, convgen_high, convgen_medium ≥ 1 on conv3d_32_32_n8, "
        "conv4d_8_16_n8 (conv4d's torch: the conv3d loop): fwd call no (conv4d_8_16_n8 convgen_high 0.80; "
        "missing conv4d_8_16_n8 convgen_medium), fwd kernels no (missing conv4d_8_16_n8 convgen_medium), "
        "fwd_bwd call no (missing conv4d_8_16_n8 convgen_medium), fwd_bwd kernels no (missing conv4d_8_16_n8 "
        "convgen_medium). Met: no.")


@pytest.mark.parametrize(("rule", "line"), [(ACCURACY_BF16, 3), (ACCURACY_FP16, 4)], ids=["bf16", "fp16"])
def test_16_bit_accuracy_is_within_1e_2(rule, line):
    n32, n8 = BATCHED_CASES[0], BATCHED_CASES[1]
    within = {"y": 3e-3, "grad_x": 1e-2, "grad_weight": 4e-3, "grad_bias": 2e-3}
    assert check_accuracy(rule, reports_of(made_up_report(n8, {}, {rule.label: within})))["met"]
    not_run = reports_of(made_up_report(n32, {}, {"convgen_medium": within}))  # convgen.torch did not import
    failing = reports_of(made_up_report(n8, {}, {rule.label: within | {"grad_weight": 1.3e-2}})) | not_run
    lines = format_precision_targets(check_precisions(failing))
    assert lines[line] == (f"- {rule.key.replace('_', ' ')} — {rule.label} rel err ≤ 0.01: no (conv2d_128_128_n8 "
                           "grad_weight 1.3e-02 > 1.0e-02; missing conv2d_64_56_n32 y, conv2d_64_56_n32 grad_x, "
                           "conv2d_64_56_n32 grad_weight, conv2d_64_56_n32 grad_bias).")


def test_bf16_is_within_1_2x_of_cudnn_bf16_channels_last_on_every_batched_case():
    cudnn, within = (0.6, 0.5, 1.8, 1.5), (0.7, 0.55, 2.0, 1.7)  # convgen 1.10-1.17× cuDNN's time
    first, second, third = BATCHED_CASES[:3]
    passing = reports_of(made_up_report(first, {"torch_bf16_cl": cudnn, "convgen_torch_bf16": within}),
                         made_up_report(second, {"torch_bf16_cl": cudnn, "convgen_torch_bf16": cudnn}))
    assert check_speed(SPEED_BF16, passing)["met"] is True
    failing = passing | reports_of(made_up_report(third, {"torch_bf16_cl": cudnn,
                                                          "convgen_torch_bf16": (0.7, 0.65, 2.0, 1.7)}))
    target = check_speed(SPEED_BF16, failing)
    assert target["measures"]["fwd kernels"]["cases"][third.name]["convgen_torch_bf16"] == {
        "ms": 0.65, "torch_bf16_cl_ms": 0.5, "speedup": 0.5 / 0.65, "ok": False}
    lines = format_precision_targets(check_precisions(failing))
    assert len(lines) == 9 and lines[0] == "Tensor-core targets (issue 11; batched cases; reporting only):"
    assert lines[8] == (
        "- speed bf16 — torch_bf16_cl/convgen_torch_bf16 ≥ 0.833 on every batched case (its time ≤ 1.2 × cuDNN's): "
        "fwd call yes, fwd kernels no (conv2d_3_224_k7_n32 convgen_torch_bf16 0.77), fwd_bwd call yes, fwd_bwd "
        "kernels yes. Met: no.")
    untimed = passing | reports_of(made_up_report(third, {"torch_bf16_cl": cudnn}))
    assert check_speed(SPEED_BF16, untimed)["measures"]["fwd_bwd call"]["missing"] == [
        "conv2d_3_224_k7_n32 convgen_torch_bf16"]


def test_no_batched_case_gives_no_precision_targets():
    assert check_precisions({}) is None


def test_summary_and_json_carry_the_precisions(tmp_path, capsys):
    reports = [made_up_report(N8_128, TABLE_TIMES, TABLE_ERRORS), made_up_report(UNBATCHED_CASES[0], TABLE_TIMES)]
    report_module.print_summary(META, reports, {})
    out = capsys.readouterr().out
    assert "### Tensor-core precisions (issue 11)" in out
    assert "| " + " | ".join(PRECISION_TABLE_HEADER) + " |" in out
    assert f"| {N8_128.title} | convgen_high | 0.6 / 0.4 | 1.9 / 1.7 |" in out
    assert UNBATCHED_CASES[0].title + " | convgen_high" not in out  # one image: not in issue 11's table
    assert ("over the H200's dense tensor-core peak: TF32 494.7, bf16/fp16 989.5 TFLOP/s (datasheet: 989 and 1,979 "
            "TFLOPS with sparsity; the H100 SXM's are the same).") in out
    assert f"| {N8_128.title} | convgen_torch_bf16 | 0.35 / 0.22 | 1 / 0.8 | 3.57 / 5.00 |" in out
    assert (f"| {N8_128.title} | convgen_torch_fp16 | 0.5 / 0.25 | 1.1 / 0.85 | 2.50 / 4.40 | 3.18 / 4.00 "
            "| 5.1e-04 grad_weight | 15.6% / 13.8% |") in out
    assert ("convgen_torch_bf16 / convgen_torch_fp16 = convgen.torch on bfloat16 / float16 tensors (NCHW, products "
            "summed in float32)") in out
    assert "- accuracy bf16 — convgen_torch_bf16 rel err ≤ 0.01: yes." in out and "- accuracy high — " in out
    assert "- accuracy fp16 — convgen_torch_fp16 rel err ≤ 0.01: yes." in out and "- speed fp16" not in out

    path = tmp_path / "bench.json"
    report_module.write_json(path, META, reports, {})
    document = json.loads(path.read_text())
    targets = document["precision_targets"]
    assert targets["accuracy_high"]["met"] is True and targets["accuracy_medium"]["met"] is True
    assert targets["speed_high"]["met"] is False  # the N32 case is not in this run
    assert targets["speed_medium"]["met"] is True
    assert targets["accuracy_bf16"]["met"] is True and targets["speed_bf16"]["met"] is True
    assert targets["accuracy_fp16"]["met"] is True and "speed_fp16" not in targets  # no cuDNN fp16 to time against
    assert targets["speed_bf16"]["measures"]["fwd kernels"]["cases"][N8_128.name]["convgen_torch_bf16"] == {
        "ms": 0.22, "torch_bf16_cl_ms": 0.2, "speedup": 0.2 / 0.22, "ok": True}
    fractions = document["cases"][0]["tensor_core_peak_fraction"]
    assert fractions["convgen_high"]["fwd"] == pytest.approx(3 * 2 * N8_128_MULTIPLY_ADDS / 0.4e-3 / 494.7e12)
    assert fractions["convgen_medium"]["fwd_bwd"] == pytest.approx(2 * 3 * N8_128_MULTIPLY_ADDS / 0.9e-3 / 494.7e12)
    assert fractions["convgen_torch_bf16"]["fwd"] == pytest.approx(2 * N8_128_MULTIPLY_ADDS / 0.22e-3 / 989.5e12)
    (row,) = [line for line in run_script("readme_table.py", str(path)).splitlines()
              if line.startswith(f"| {N8_128.title} |") and "e-" in line]  # the tensor-core table's row
    assert row == (f"| {N8_128.title} | 1 / 3 | 0.4 / 1.7 | 0.25 / 0.9 | 1.1 / 3.4 | 0.3 / 1.1 | 0.22 / 0.8 "
                   "| 0.2 / 0.7 | 3.3e-7 / 6.5e-7 / 4.4e-4 / 4.1e-3 / 5.1e-4 |")


def test_precisions_default_to_all_three_and_keep_the_tapes_order():
    assert bench.parse_args(["--batched"]).precisions == ("highest", "high", "medium")
    assert bench.parse_args(["--precisions", "medium, high"]).precisions == ("high", "medium")
    assert bench.parse_args(["--precisions", "highest"]).precisions == ("highest",)


@pytest.mark.parametrize(("value", "message"), [
    ("highest,low", "bench.py: error: unknown precision(s) low; known: highest, high, medium"),
    (" , ", "bench.py: error: no precision given; known: highest, high, medium"),
])
def test_an_unknown_precision_is_a_usage_error(value, message):
    done = subprocess.run([sys.executable, str(BENCH_DIR / "bench.py"), "--list", "--precisions", value],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == message


def test_the_readme_documents_the_option():
    readme = (BENCH_DIR / "README.md").read_text()
    assert "--precisions highest,high,medium" in readme and "convgen_high" in readme
