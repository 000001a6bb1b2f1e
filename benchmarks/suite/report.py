"""The report: one case's results (`CaseReport`), the run's environment, the markdown table printed
last and the JSON file (rewritten after every case)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite.cases import REFERENCE_DATE, Case
from suite.cells import fmt_pair, ratio_cell, timing_cell
from suite.contestants import ADAPTER, MODES, Libraries
from suite.host import format_host
from suite.precision import peak_fractions
from suite.precision_table import PRECISION_TABLE_HEADER, precision_note, precision_rows
from suite.targets import (
    ADAPTER_MAX_TIME_RATIO,
    MEASURES,
    check_adapter,
    check_precisions,
    check_targets,
    format_adapter_target,
    format_precision_targets,
    format_targets,
)
from suite.timing import L2_FLUSH_BYTES, Settings, one_line

BENCH_DIR = Path(__file__).resolve().parent.parent
MISMATCH_REL_ERR = 1e-4  # float32 lands far under this; TF32 lands near 3e-4


@dataclass
class CaseReport:
    case: Case
    check: dict[str, dict[str, float]] = field(default_factory=dict)
    timings: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # label -> mode -> kind
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)
    compile: dict[str, Any] = field(default_factory=dict)
    jax: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def error(self, where: str, error: BaseException) -> None:
        self.errors.append(f"{where}: {one_line(error)}")
        print(f"    ! {where}: {one_line(error)}", flush=True)

    def worst_error(self, label: str) -> float | None:
        errors = self.check.get(label)
        return max(errors.values()) if errors else None

    def median(self, label: str, mode: str, kind: str) -> float | None:
        return self.timings.get(label, {}).get(mode, {}).get(kind, {}).get("median_ms")

    def adapter_over_tape(self) -> dict[str, dict[str, float | None]]:
        """convgen.torch time / tape time, by mode and kind (None where either is missing)."""
        ratios: dict[str, dict[str, float | None]] = {}
        for mode, kind in MEASURES:
            adapter, tape = self.median(ADAPTER, mode, kind), self.median("convgen", mode, kind)
            ratios.setdefault(mode, {})[kind] = adapter / tape if adapter and tape else None
        return ratios

    def to_json(self) -> dict[str, Any]:
        case = self.case
        return {
            "name": case.name, "title": case.title, "op": case.op, "batch": case.batch,
            "cudnn_reference_ms": dataclasses.asdict(case.reference) if case.reference else None,
            "input_shape": case.input_shape,
            "output_shape": case.output_shape, "kernel": case.kernel, "stride": case.strides,
            "padding": case.paddings, "beta": case.beta if case.op == "smooth_max_pool" else None,
            "floor_us": case.floor_us, "io_bytes": case.io_bytes,
            "check_rel_err": self.check, "check_threshold": MISMATCH_REL_ERR,
            "check_ok": self.check_ok(), "timings": self.timings, "bandwidth_gb_s": self.bandwidth(),
            f"{ADAPTER}_over_convgen": self.adapter_over_tape(), "tensor_core_peak_fraction": peak_fractions(self),
            "memory": self.memory, "compile": self.compile, "jax": self.jax or None,
            "torch_flags": self.flags, "errors": self.errors, "seconds": self.seconds,
        }

    def check_ok(self) -> bool | None:
        worst = self.worst_error("convgen")
        return None if worst is None else worst <= MISMATCH_REL_ERR

    def bandwidth(self) -> dict[str, float] | None:
        """Forward GB/s of the pool cases, bytes = input + output once."""
        if self.case.is_conv:
            return None
        result = {}
        for label in self.timings:
            for kind in ("call", "kernels"):
                ms = self.median(label, "fwd", kind)
                if ms:
                    result[f"{label}_{kind}"] = self.case.io_bytes / (ms * 1e-3) / 1e9
        return result


def environment(libs: Libraries, settings: Settings, argv: list[str]) -> dict[str, Any]:
    cupy, torch = libs.cupy, libs.torch
    props = cupy.cuda.runtime.getDeviceProperties(0)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    try:
        from importlib.metadata import version

        convgen_version = version("convgen")
    except Exception:
        convgen_version = getattr(libs.convgen, "__version__", "unknown")
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR, capture_output=True,
                             text=True, check=False).stdout.strip() or None
    except OSError:
        git = None
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": gpu, "gpu_torch": torch.cuda.get_device_name(0),
        "compute_capability": f"{props['major']}.{props['minor']}",
        "driver": cupy.cuda.runtime.driverGetVersion(), "cuda_runtime_cupy": cupy.cuda.runtime.runtimeGetVersion(),
        "python": platform.python_version(), "numpy": __import__("numpy").__version__,
        "cupy": cupy.__version__, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "convgen": convgen_version,
        f"{ADAPTER}_skipped": libs.adapter_skipped,
        "git": git,
        "argv": argv, "settings": settings.__dict__, "l2_flush_bytes": L2_FLUSH_BYTES,
    }


def adapter_ratio_cell(report: CaseReport, mode: str) -> str:
    """convgen.torch over the tape, call / kernels, ✗ above issue 10's ADAPTER_MAX_TIME_RATIO."""
    ratios = report.adapter_over_tape()[mode]
    return " / ".join("—" if ratios[kind] is None else
                      f"{ratios[kind]:.2f}" + (" ✗" if ratios[kind] > ADAPTER_MAX_TIME_RATIO else "")
                      for kind in ("call", "kernels"))


def check_cell(report: CaseReport, label: str = "convgen") -> str:
    worst = report.worst_error(label)
    return "—" if worst is None else f"{worst:.0e}" + (" ok" if worst <= MISMATCH_REL_ERR else " **MISMATCH**")


def peak_cell(report: CaseReport) -> str:
    return " / ".join(f"{report.memory[label]['fwd_bwd']['peak_bytes'] / 2**20:.0f}"
                      if "fwd_bwd" in report.memory.get(label, {}) else "—" for label in ("convgen", "torch_strict"))


def compile_cell(report: CaseReport) -> str:
    cells = []
    for run in ("cold", "warm"):
        entry = report.compile.get(run, {})
        steps = [entry.get(k) for k in ("first_forward_s", "first_backward_s")]
        cells.append(f"{sum(steps):.2f}" if all(s is not None for s in steps) else "—")
    return " / ".join(cells)


def table_row(report: CaseReport) -> list[str]:
    """A row of the unbatched table (TABLE_HEADER)."""
    case = report.case
    bandwidth = report.bandwidth()
    gb_s = "—" if not bandwidth else " / ".join(
        f"{bandwidth[key]:.0f}" if key in bandwidth else "—" for key in ("convgen_kernels", "torch_strict_kernels"))
    tf32 = (timing_cell(report, "torch_tf32", "fwd"), timing_cell(report, "torch_tf32", "fwd_bwd")) \
        if case.is_conv else ("= strict", "= strict")
    return [case.title + (" ⚠" if report.errors else ""), check_cell(report), check_cell(report, ADAPTER),
            f"{case.floor_us:.3g}", *(timing_cell(report, label, mode) for label in ("convgen", ADAPTER, "torch_strict")
                                      for mode in MODES), *tf32,
            ratio_cell(report, "fwd"), ratio_cell(report, "fwd_bwd"), adapter_ratio_cell(report, "fwd"),
            adapter_ratio_cell(report, "fwd_bwd"), gb_s, peak_cell(report), compile_cell(report)]


def batched_row(report: CaseReport) -> list[str]:
    """A row of the batched table (BATCHED_TABLE_HEADER): the unbatched columns without GB/s, plus
    bf16 channels-last and cuDNN's reference times."""
    case, reference = report.case, report.case.reference
    timings = [timing_cell(report, label, mode) for label in BATCHED_LABELS for mode in MODES]
    return [case.title + (" ⚠" if report.errors else ""), check_cell(report), check_cell(report, ADAPTER),
            f"{case.floor_us:.3g}", *timings, ratio_cell(report, "fwd"), ratio_cell(report, "fwd_bwd"),
            adapter_ratio_cell(report, "fwd"), adapter_ratio_cell(report, "fwd_bwd"),
            f"{reference.fwd_ms:g} / {reference.fwd_bwd_ms:g}" if reference else "—", peak_cell(report),
            compile_cell(report)]


TABLE_HEADER = ["case", "convgen rel err", "adapter rel err", "floor fwd µs", "convgen fwd", "convgen fwd+bwd",
                "adapter fwd", "adapter fwd+bwd", "torch fwd", "torch fwd+bwd", "torch tf32 fwd",
                "torch tf32 fwd+bwd", "torch/convgen fwd", "torch/convgen fwd+bwd", "adapter/tape fwd",
                "adapter/tape fwd+bwd", "fwd GB/s convgen / torch", "peak MiB fwd+bwd convgen / torch",
                "1st call s cold / warm"]
BATCHED_LABELS = ("convgen", ADAPTER, "torch_strict", "torch_tf32", "torch_bf16_cl")
BATCHED_TABLE_HEADER = ["case", "convgen rel err", "adapter rel err", "floor fwd µs", "convgen fwd",
                        "convgen fwd+bwd", "adapter fwd", "adapter fwd+bwd", "torch fwd", "torch fwd+bwd",
                        "torch tf32 fwd", "torch tf32 fwd+bwd", "torch bf16 CL fwd", "torch bf16 CL fwd+bwd",
                        "torch/convgen fwd", "torch/convgen fwd+bwd", "adapter/tape fwd", "adapter/tape fwd+bwd",
                        f"cuDNN ref {REFERENCE_DATE} fwd / fwd+bwd", "peak MiB fwd+bwd convgen / torch",
                        "1st call s cold / warm"]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def print_summary(meta: dict[str, Any], reports: list[CaseReport], compile_runs: dict[str, Any],
                  host: dict[str, Any] | None = None) -> None:
    print()
    print(f"## convgen vs PyTorch — {meta['gpu']} (sm {meta['compute_capability']}), {meta['date_utc']}")
    print(f"convgen {meta['convgen']} (git {meta['git']}), torch {meta['torch']} (CUDA {meta['torch_cuda']}, "
          f"cuDNN {meta['cudnn']}), cupy {meta['cupy']}, driver {meta['driver']}, python {meta['python']}")
    unbatched = [report for report in reports if not report.case.is_batched]
    batched = [report for report in reports if report.case.is_batched]
    if unbatched:
        print("\n### One image (DESIGN.md 'Figures to beat')\n")
        print_table(TABLE_HEADER, [table_row(report) for report in unbatched])
    if batched:
        print("\n### Batched (issue 9), as PyTorch users train\n")
        print_table(BATCHED_TABLE_HEADER, [batched_row(report) for report in batched])
        print()
        by_case = batched_by_name(batched)
        print("\n".join(format_targets(check_targets(by_case))))
        print()
        print(format_adapter_target(check_adapter(by_case)))
        print("\n### Tensor-core precisions (issue 11)\n")
        print_table(PRECISION_TABLE_HEADER, [row for report in batched for row in precision_rows(report)])
        print()
        print(precision_note())
        print()
        print("\n".join(format_precision_targets(check_precisions(by_case))))
    print()
    print("Times in ms, `call / kernels`: call = CUDA events around the Python call (GPU idle, L2 flushed), "
          "median, a case's contestants taking turns sample by sample (each round shuffled); "
          "kernels = CUDA-graph replay per call, median; † = no graph (back-to-back calls / N, "
          "host-bound if the host is slower than the GPU). torch = strict fp32 (TF32 off); "
          "torch/convgen > 1 means convgen is faster. "
          f"rel err vs float64 PyTorch, mismatch above {MISMATCH_REL_ERR:g}. "
          "1st call = first forward + first backward in a fresh process (cold: empty CuPy kernel cache; "
          "warm: cache on disk). Batched: torch bf16 CL = bfloat16 inputs and weights in channels-last "
          "(channels_last_3d for conv3d; conv1d and conv4d have no such format and stay contiguous), autocast "
          f"off; cuDNN ref = cuDNN strict fp32 fwd / fwd+bwd measured on the H200 on {REFERENCE_DATE}. "
          "adapter = convgen.torch (issue 10) on torch tensors of the same inputs, fwd+bwd = "
          "torch.autograd.grad of the inputs, as for torch; adapter/tape = its time over the tape's, "
          f"✗ above {ADAPTER_MAX_TIME_RATIO:g}.")
    if meta.get(f"{ADAPTER}_skipped"):
        print(f"- adapter not run: {meta[f'{ADAPTER}_skipped']}")
    for report in reports:
        for label in report.timings:
            for mode in MODES:
                method = report.timings.get(label, {}).get(mode, {}).get("kernels", {}).get("method", "")
                if method.startswith("back-to-back"):
                    print(f"- {report.case.name} {label} {mode} kernels: {method}")
        if report.case.rank == 4:
            jax = "JAX: one-image case only." if report.case.is_batched else jax_summary(report.jax)
            print(f"- {report.case.name}: torch = conv3d loop (one conv3d per offset of the first kernel axis, "
                  f"batched over the images and the first output axis). {jax}")
        for error in report.errors:
            print(f"- {report.case.name} error: {error}")
    for run, outcome in compile_runs.items():
        if outcome:
            print(f"- compile child ({run}): {outcome.get('status')}, import {fmt_s(outcome.get('import_s'))}, "
                  f"context {fmt_s(outcome.get('context_s'))}, {outcome.get('cache_files')} cache files"
                  + (f"; {outcome['stderr_tail']}" if outcome.get("stderr_tail") else ""))
    if host:
        print()
        print("\n".join(format_host(host)))


def batched_by_name(reports: list[CaseReport]) -> dict[str, CaseReport]:
    """The batched cases' reports by case name: what the targets of issues 9, 10 and 11 are checked on."""
    return {report.case.name: report for report in reports if report.case.is_batched}


def jax_summary(jax_report: dict[str, Any]) -> str:
    if not jax_report:
        return "JAX: not run."
    parts = []
    forward = jax_report.get("forward", {})
    for precision in ("highest", "default"):
        entry = forward.get(precision)
        if entry:
            err = forward.get("check_rel_err", {}).get(f"{precision}:y")
            times = fmt_pair(entry["call"]["median_ms"], entry["kernels"]["median_ms"])
            parts.append(f"JAX fwd ({precision}) {times} ms" + (f", rel err {err:.0e}" if err is not None else ""))
    if not parts:
        parts.append(f"JAX fwd: {forward.get('status')} {forward.get('stderr_tail', '')}".strip())
    backward = jax_report.get("backward", {})
    if backward.get("ok"):
        entry = backward.get("highest", {})
        times = fmt_pair(entry.get("call", {}).get("median_ms"), entry.get("kernels", {}).get("median_ms"))
        parts.append(f"JAX fwd+bwd (highest) {times} ms")
    else:
        parts.append(f"JAX backward: {backward.get('status')}"
                     + (f" — {backward['stderr_tail'][-240:]}" if backward.get("stderr_tail") else ""))
    return "; ".join(parts) + "."


def fmt_s(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.2f} s"


def default_json_path() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "bench.json" if out else BENCH_DIR / "results" / "latest.json"


def write_json(path: Path, meta: dict[str, Any], reports: list[CaseReport], compile_runs: dict[str, Any],
               host: dict[str, Any] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    batched = batched_by_name(reports)
    document = {"meta": meta, "compile_children": compile_runs, "cases": [r.to_json() for r in reports],
                "targets": check_targets(batched), "adapter_target": check_adapter(batched),
                "precision_targets": check_precisions(batched), "host": host}
    path.write_text(json.dumps(finite_json(document), indent=1, default=str) + "\n")


def finite_json(value: Any) -> Any:
    """inf and NaN as the strings "inf" and "nan", so that the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value
