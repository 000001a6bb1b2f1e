"""The benchmark's convgen.torch contestant (issue 10; in float32, and in bfloat16 and float16 as issue 11's
16-bit contestants) without a GPU: on NumPy inputs it runs on the adapter's CPU backend (16-bit: float32
arithmetic rounded to the dtype), is checked against the float64 PyTorch reference and timed through the suite's own code on a host clock
(no CUDA graph, so the back-to-back fallback); the report's adapter columns, the adapter target and the JSON are
exercised with made-up times, and old JSONs still print through readme_table.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))
import convgen.torch  # noqa: E402
from convgen.geometry import Family  # noqa: E402
from suite import report as report_module  # noqa: E402
from suite.cases import BATCHED_CASES, UNBATCHED_CASES, Case  # noqa: E402
from suite.contestants import (  # noqa: E402
    ADAPTER,
    ADAPTER_BF16,
    ADAPTER_FP16,
    TORCH_REFERENCE,
    AdapterContestant,
    Libraries,
    TorchContestant,
    load_adapter,
)
from suite.measure import check_and_time_kernels, eager_outputs, measure_contestant, time_calls  # noqa: E402
from suite.report import MISMATCH_REL_ERR, CaseReport  # noqa: E402
from suite.targets import HALF_MAX_REL_ERR, check_adapter, format_adapter_target  # noqa: E402
from suite.timing import QUICK, Captured, TorchDevice, relative_error  # noqa: E402

SMALL_CASES = (
    Case.square("conv2d_n2", "conv2d N2 3→4 6² k3 p1", Family.CONV, 3, 4, (6, 6), 3, 1, 1, batch=2),
    Case.square("conv1d_s2", "conv1d 2→3 9 k3 s2 p1", Family.CONV, 2, 3, (9,), 3, 2, 1),
    Case.square("conv4d", "conv4d 2→2 4⁴ k3 p1", Family.CONV, 2, 2, (4, 4, 4, 4), 3, 1, 1),
    Case.square("maxpool2d", "max pool 2d C3 6² k3 s1 p1", Family.MAX_POOL, 3, 3, (6, 6), 3, 1, 1),
    Case.square("smoothmax2d", "smooth max 2d C3 6² k3 s2 p1", Family.SMOOTH_MAX_POOL, 3, 3, (6, 6), 3, 2, 1,
                beta=1.0),
)


def host_inputs(case: Case) -> dict[str, np.ndarray]:
    """What suite.contestants.make_device_inputs makes, as NumPy arrays (torch.from_dlpack takes either)."""
    rng = np.random.default_rng(7)
    shapes = {"x": case.input_shape, "seed": case.output_shape}
    if case.is_conv:
        shapes |= {"weight": case.weight_shape, "bias": (case.out_c,)}
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}


def reference_outputs(case: Case, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    reference = TorchContestant(case, inputs, torch, TORCH_REFERENCE)
    by_mode = eager_outputs(reference, "float64 reference", CaseReport(case))
    return {name: array for outputs in by_mode.values() for name, array in outputs.items()}


@pytest.mark.parametrize("case", SMALL_CASES, ids=[case.name for case in SMALL_CASES])
def test_the_adapter_matches_the_float64_reference(case):
    inputs = host_inputs(case)
    expected = reference_outputs(case, inputs)
    report = CaseReport(case)
    actual = eager_outputs(AdapterContestant(case, inputs, torch, convgen.torch), ADAPTER, report)
    assert report.errors == []
    outputs = {name: array for by_name in actual.values() for name, array in by_name.items()}
    assert outputs.keys() == expected.keys()
    assert {"y", "grad_x"} <= outputs.keys() and ("grad_weight" in outputs) is case.is_conv
    for name, array in outputs.items():
        assert array.dtype == np.float32 and array.shape == expected[name].shape, name
        assert relative_error(array, expected[name]) <= MISMATCH_REL_ERR, name


CONV_CASES = tuple(case for case in SMALL_CASES if case.is_conv)
# dtype, label, the NumPy dtype its outputs come back in (NumPy has no bfloat16: widened to float32)
HALF_ADAPTERS = [("bfloat16", ADAPTER_BF16, np.float32), ("float16", ADAPTER_FP16, np.float16)]


@pytest.mark.parametrize(("dtype", "label", "numpy_dtype"), HALF_ADAPTERS, ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CONV_CASES, ids=[case.name for case in CONV_CASES])
def test_the_16_bit_adapter_is_within_issue_11s_bound(case, dtype, label, numpy_dtype):
    """16-bit copies of the inputs, contiguous; its outputs are off the float64 reference by the dtype's
    rounding: within 1e-2, and the worst over fp32's bound."""
    inputs = host_inputs(case)
    expected = reference_outputs(case, inputs)
    contestant = AdapterContestant(case, inputs, torch, convgen.torch, dtype)
    assert contestant.label == label
    assert all(tensor.dtype == getattr(torch, dtype) and tensor.is_contiguous()
               for tensor in (*contestant.inputs, contestant.seed))
    report = CaseReport(case)
    actual = eager_outputs(contestant, label, report)
    assert report.errors == []
    outputs = {name: array for by_name in actual.values() for name, array in by_name.items()}
    assert outputs.keys() == expected.keys() == {"y", "grad_x", "grad_weight", "grad_bias"}
    errors = {name: relative_error(array, expected[name]) for name, array in outputs.items()}
    assert all(array.dtype == numpy_dtype and array.shape == expected[name].shape for name, array in outputs.items())
    assert max(errors.values()) > MISMATCH_REL_ERR and all(error <= HALF_MAX_REL_ERR for error in errors.values())


def test_forward_backward_returns_each_calls_own_gradients_as_torchs_contestant_does():
    """A second call gives the same gradients, not twice them, and leaves nothing in the inputs' `.grad` to be
    freed inside a later timed call; torch's contestant makes the same call."""
    case = SMALL_CASES[0]
    contestant = AdapterContestant(case, host_inputs(case), torch, convgen.torch)
    first = [grad.clone() for grad in contestant.forward_backward()]
    second = contestant.forward_backward()
    for before, after in zip(first, second, strict=True):
        torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert all(tensor.grad is None for tensor in contestant.inputs)
    theirs = TorchContestant(case, host_inputs(case), torch)
    theirs.forward_backward()
    assert all(tensor.grad is None for tensor in theirs.inputs)


def test_torchs_contestant_runs_cudnn_tuned_and_gives_the_switches_back():
    """cuDNN's autotuner on while torch's contestant runs (its fastest algorithm per shape, the baseline the targets
    name), TF32 as its variant says, each switch as it was afterwards, and the report saying so."""
    backends = torch.backends
    saved = (backends.cudnn.benchmark, backends.cudnn.allow_tf32)
    backends.cudnn.benchmark, backends.cudnn.allow_tf32 = False, True
    try:
        contestant = TorchContestant(SMALL_CASES[0], host_inputs(SMALL_CASES[0]), torch)
        with contestant.active() as flags:
            assert backends.cudnn.benchmark is True and backends.cudnn.allow_tf32 is False
        assert flags["cudnn.benchmark"] is True and flags["cudnn.allow_tf32"] is False
        assert backends.cudnn.benchmark is False and backends.cudnn.allow_tf32 is True
    finally:
        backends.cudnn.benchmark, backends.cudnn.allow_tf32 = saved


def test_the_adapter_runs_in_the_tapes_precision_whatever_torch_says():
    """Under torch's default TF32 switch convgen.torch would pick TF32; the contestant pins "highest"
    while it runs, reports it, and gives the setting back."""
    contestant = AdapterContestant(SMALL_CASES[0], host_inputs(SMALL_CASES[0]), torch, convgen.torch)
    convgen.torch.set_float32_precision("medium")
    try:
        with contestant.active() as flags:
            assert convgen.torch.precision.conv_precision(torch.float32) == "highest"
        assert flags == {"convgen.torch float32 precision": "highest"}
        assert convgen.torch.get_float32_precision() == "medium"
    finally:
        convgen.torch.set_float32_precision(None)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_16_bit_adapter_pins_no_precision_and_reports_the_one_convgen_torch_picks(dtype):
    """16-bit tensors always run "medium" (tensor cores, exact for their values): the float32 setting is left
    alone, and the flags say the dtype and that precision."""
    contestant = AdapterContestant(SMALL_CASES[0], host_inputs(SMALL_CASES[0]), torch, convgen.torch, dtype)
    convgen.torch.set_float32_precision("high")
    try:
        with contestant.active() as flags:
            assert convgen.torch.get_float32_precision() == "high"
        assert flags == {"dtype": dtype, "convgen.torch precision": f"medium ({dtype} tensors)"}
    finally:
        convgen.torch.set_float32_precision(None)


class HostClockDevice:
    """suite.timing's device protocol for CPU tensors: the host clock, and no CUDA graph to capture."""

    library = "torch-cpu"

    def synchronize(self) -> None:
        pass  # CPU calls are done when they return

    def wait(self, result):
        pass

    def start_timer(self):
        return time.perf_counter()

    def stop_timer(self, timer, last_result) -> float:
        return 1e3 * (time.perf_counter() - timer)

    def to_numpy(self, array):
        return TorchDevice(torch).to_numpy(array)  # the suite's own conversion, bfloat16 widened to float32

    def poison(self, array) -> None:
        array.detach().fill_(float("nan"))

    def capture(self, call, copies) -> Captured:
        raise NotImplementedError("no CUDA graph on the CPU")

    def peak_memory(self, call) -> dict[str, int]:
        raise NotImplementedError("no device memory on the CPU")


@pytest.mark.parametrize(("dtype", "label", "bound", "flags"), [
    ("float32", ADAPTER, MISMATCH_REL_ERR, {"convgen.torch float32 precision": "highest"}),
    ("bfloat16", ADAPTER_BF16, HALF_MAX_REL_ERR,
     {"dtype": "bfloat16", "convgen.torch precision": "medium (bfloat16 tensors)"}),
    ("float16", ADAPTER_FP16, HALF_MAX_REL_ERR,
     {"dtype": "float16", "convgen.torch precision": "medium (float16 tensors)"}),
])
def test_measure_contestant_checks_and_times_the_adapter(capsys, dtype, label, bound, flags):
    case = SMALL_CASES[0]
    inputs = host_inputs(case)
    expected = reference_outputs(case, inputs)
    contestant = AdapterContestant(case, inputs, torch, convgen.torch, dtype)
    contestant.device = HostClockDevice()
    libs = Libraries(cupy=None, torch=torch, convgen=None, flush_l2=lambda: None, adapter=convgen.torch)
    report = CaseReport(case)
    measure_contestant(contestant, case, expected, QUICK, libs, report)
    assert set(report.check[label]) == {"y", "grad_x", "grad_weight", "grad_bias"}
    assert report.worst_error(label) <= bound and report.flags[label] == flags
    for mode in ("fwd", "fwd_bwd"):
        timings = report.timings[label][mode]
        assert timings["call"]["median_ms"] > 0 and timings["kernels"]["median_ms"] > 0
        assert timings["kernels"]["method"] == ("back-to-back calls / N (no graph: NotImplementedError: no CUDA "
                                                "graph on the CPU)")
    assert report.errors == [f"{label} {mode} memory: NotImplementedError: no device memory on the CPU"
                             for mode in ("fwd", "fwd_bwd")]
    assert f"    {label} err " in capsys.readouterr().out
    assert "†" in report_module.timing_cell(report, label, "fwd")


def test_a_cases_contestants_take_their_calls_in_turn():
    """run_case's order: each contestant checked and its kernels timed, then the user calls of all of them timed
    in turn; every contestant and mode gets its call timing, marked as taken in turn."""
    case = SMALL_CASES[0]
    inputs = host_inputs(case)
    expected = reference_outputs(case, inputs)
    libs = Libraries(cupy=None, torch=torch, convgen=None, flush_l2=lambda: None, adapter=convgen.torch)
    report = CaseReport(case)
    contestants = [AdapterContestant(case, inputs, torch, convgen.torch, dtype) for dtype in ("float32", "bfloat16")]
    for contestant in contestants:
        contestant.device = HostClockDevice()
        check_and_time_kernels(contestant, case, expected, QUICK, report)
        assert all("call" not in report.timings[contestant.label][mode] for mode in ("fwd", "fwd_bwd"))
    time_calls(contestants, QUICK, libs, report)
    for label in (ADAPTER, ADAPTER_BF16):
        for mode in ("fwd", "fwd_bwd"):
            call = report.timings[label][mode]["call"]
            assert call["median_ms"] > 0 and call["samples"] >= QUICK.min_reps
            assert call["method"].endswith("; the calls of a case taking turns)")


def test_a_missing_adapter_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "convgen.torch", None)
    assert load_adapter() == (None, "convgen.torch is not importable (ModuleNotFoundError: import of "
                                    "convgen.torch halted; None in sys.modules)")


def timed_report(case: Case, times: dict[str, tuple[float, float, float, float]]) -> CaseReport:
    """A report whose contestants took `times` ms: (fwd call, fwd kernels, fwd_bwd call, fwd_bwd kernels)."""
    report = CaseReport(case)
    for label, values in times.items():
        for (mode, kind), ms in zip([(m, k) for m in ("fwd", "fwd_bwd") for k in ("call", "kernels")], values,
                                    strict=True):
            report.timings.setdefault(label, {}).setdefault(mode, {})[kind] = {"median_ms": ms, "method": "made up"}
    return report


TAPE = (1.0, 0.8, 3.0, 2.0)
WITHIN = (1.04, 0.8, 3.1, 2.1)  # every ratio at most 1.05
OVER = (1.04, 0.8, 3.3, 2.0)  # fwd_bwd call 1.1


def test_rows_have_the_adapter_columns_and_ratios():
    batched = timed_report(BATCHED_CASES[0], {"convgen": TAPE, ADAPTER: OVER, "torch_strict": (2.0, 1.6, 6.0, 4.0)})
    row = report_module.batched_row(batched)
    assert len(row) == len(report_module.BATCHED_TABLE_HEADER)
    cells = dict(zip(report_module.BATCHED_TABLE_HEADER, row, strict=True))
    assert cells["adapter fwd"] == "1.04 / 0.8" and cells["adapter fwd+bwd"] == "3.3 / 2"
    assert cells["adapter/tape fwd"] == f"{1.04 / 1.0:.2f} / {0.8 / 0.8:.2f}"
    assert cells["adapter/tape fwd+bwd"] == f"{3.3 / 3.0:.2f} ✗ / {2.0 / 2.0:.2f}"
    assert cells["torch/convgen fwd"] == "2.00 / 2.00" and cells["adapter rel err"] == "—"

    unbatched = timed_report(UNBATCHED_CASES[0], {"convgen": TAPE})
    row = report_module.table_row(unbatched)
    assert len(row) == len(report_module.TABLE_HEADER)
    cells = dict(zip(report_module.TABLE_HEADER, row, strict=True))
    assert cells["adapter fwd"] == "— / —" and cells["adapter/tape fwd+bwd"] == "— / —"
    assert cells["convgen fwd"] == "1 / 0.8"
    assert unbatched.to_json()[f"{ADAPTER}_over_convgen"] == {"fwd": {"call": None, "kernels": None},
                                                               "fwd_bwd": {"call": None, "kernels": None}}


def test_the_adapter_target_needs_every_batched_case_within_five_percent():
    first, second = BATCHED_CASES[:2]
    within = {case.name: timed_report(case, {"convgen": TAPE, ADAPTER: WITHIN}) for case in (first, second)}
    assert check_adapter(within)["met"] is True
    assert format_adapter_target(check_adapter(within)).endswith("Every batched case within it: yes.")

    mixed = {first.name: timed_report(first, {"convgen": TAPE, ADAPTER: WITHIN}),
             second.name: timed_report(second, {"convgen": TAPE, ADAPTER: OVER})}
    target = check_adapter(mixed)
    assert target["met"] is False
    assert [name for name, measure in target["measures"].items() if not measure["met"]] == ["fwd_bwd call"]
    assert target["measures"]["fwd_bwd call"]["cases"][second.name][f"{ADAPTER}_over_convgen"] == 3.3 / 3.0
    line = format_adapter_target(target)
    assert f"fwd_bwd call no ({second.name} {3.3 / 3.0:.2f})" in line and "fwd call yes" in line

    untimed = {first.name: timed_report(first, {"convgen": TAPE})}
    assert f"fwd call no (missing {first.name})" in format_adapter_target(check_adapter(untimed))
    assert check_adapter({}) is None


META = {"gpu": "test GPU", "compute_capability": "9.0", "date_utc": "today", "convgen": "0", "git": "abc",
        "torch": torch.__version__, "torch_cuda": None, "cudnn": None, "cupy": "-", "driver": 0, "python": "3",
        f"{ADAPTER}_skipped": "convgen.torch is not importable (ImportError: test)"}


def test_summary_and_json_carry_the_adapter(tmp_path, capsys):
    reports = [timed_report(BATCHED_CASES[0], {"convgen": TAPE, ADAPTER: OVER, "torch_strict": TAPE}),
               timed_report(UNBATCHED_CASES[0], {"convgen": TAPE, "torch_strict": TAPE})]
    report_module.print_summary(META, reports, {})
    out = capsys.readouterr().out
    assert "| adapter fwd | adapter fwd+bwd |" in out
    assert "Adapter target (issue 10; batched cases;" in out and "Every batched case within it: no." in out
    assert "- adapter not run: convgen.torch is not importable (ImportError: test)" in out

    path = tmp_path / "bench.json"
    report_module.write_json(path, META, reports, {})
    document = json.loads(path.read_text())
    assert document["adapter_target"]["met"] is False
    assert document["cases"][0][f"{ADAPTER}_over_convgen"]["fwd_bwd"]["call"] == 3.3 / 3.0
    printed = run_script("readme_table.py", str(path))
    assert BATCHED_CASES[0].title in printed and UNBATCHED_CASES[0].title in printed


def run_script(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH_DIR / name), *args], capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.parametrize("name", ["2026-11-30-h200-e305a1c-batched.json", "2026-11-30-h200-e305a1c-unbatched.json"])
def test_readme_table_prints_a_json_from_before_the_adapter(name):
    path = BENCH_DIR / "measured" / name
    cases = json.loads(path.read_text())["cases"]
    printed = run_script("readme_table.py", str(path))
    assert all(f"| {case['title']} |" in printed for case in cases)


def test_list_needs_no_gpu():
    printed = run_script("bench.py", "--list", "--batched")
    assert all(f"| {case.name} |" in printed for case in BATCHED_CASES)


def test_readme_table_prints_the_tensor_core_modes_of_a_batched_run():
    """A batched run with the precisions also prints their table: per case the kernels fwd / fwd+bwd of each
    mode and of cuDNN's, and the worst output's error per mode, as the JSON holds them; a run from before the
    bf16 contestant has — in its column and error, and one from before the fp16 contestant — in its error."""
    path = BENCH_DIR / "measured" / "2026-11-30-h200-75c30c5-bench-batched.json"
    case = json.loads(path.read_text())["cases"][1]
    printed = run_script("readme_table.py", str(path))
    (row,) = [line for line in printed.splitlines()
              if line.startswith(f"| {case['title']} |") and line.count("|") == 10]
    high = case["timings"]["convgen_high"]
    assert f"{high['fwd']['kernels']['median_ms']:.3g} / {high['fwd_bwd']['kernels']['median_ms']:.3g}" in row
    worst = max(case["check_rel_err"]["convgen_medium"].values())
    assert row.endswith(f"/ {worst:.1e} / — / — |".replace("e-0", "e-")) and " | — | " in row
    assert "| case | \"highest\" (fp32 FMA) | \"high\" (3xTF32) | \"medium\" (TF32) | cuDNN strict fp32 |" in printed
    assert ("| cuDNN TF32 | convgen.torch bf16 | cuDNN bf16 channels-last "
            "| error highest / high / medium / bf16 / fp16 |") in printed
    unbatched = run_script("readme_table.py", str(BENCH_DIR / "measured" / "2026-11-30-h200-e305a1c-unbatched.json"))
    assert "Tensor-core modes" not in unbatched


def test_readme_table_prints_a_run_from_before_the_fp16_contestant():
    """A run with bf16 but no fp16: bf16's worst error, then — for fp16's."""
    path = BENCH_DIR / "measured" / "2026-12-01-h200-59cda4f-quick-bench.json"
    cases = json.loads(path.read_text())["cases"]
    printed = run_script("readme_table.py", str(path)).splitlines()
    for case in cases:
        worst = max(case["check_rel_err"]["convgen_torch_bf16"].values())
        (row,) = [line for line in printed if line.startswith(f"| {case['title']} |") and line.count("|") == 10]
        assert row.endswith(f"/ {worst:.1e} / — |".replace("e-0", "e-"))
