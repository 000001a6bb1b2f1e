"""Table cells shared by the report's tables: times in ms, `call / kernels` pairs and time ratios, read from a
CaseReport (suite.report)."""

from __future__ import annotations

from typing import Any


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def fmt_pair(call: float | None, kernels: float | None, mark: str = "") -> str:
    return f"{fmt_ms(call)} / {fmt_ms(kernels)}{mark}"


def fmt_ratio(numerator: float | None, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}" if numerator and denominator else "—"


def timing_cell(report: Any, label: str, mode: str) -> str:
    """`call / kernels` ms, † where the kernels could not be timed by graph replay."""
    kernels = report.timings.get(label, {}).get(mode, {}).get("kernels", {})
    mark = "†" if kernels.get("method", "").startswith("back-to-back") else ""
    return fmt_pair(report.median(label, mode, "call"), report.median(label, mode, "kernels"), mark)


def ratio_cell(report: Any, mode: str, label: str = "convgen") -> str:
    """PyTorch strict over `label`, call / kernels: above 1 means `label` is faster."""
    return " / ".join(fmt_ratio(report.median("torch_strict", mode, kind), report.median(label, mode, kind))
                      for kind in ("call", "kernels"))
