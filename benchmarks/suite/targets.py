"""Issue 9's targets for the batched cases, checked against cuDNN strict fp32 measured in the same run:
every case at least as fast as cuDNN (torch/convgen ≥ 1) and the geometric mean of convgen/cuDNN time
at most 0.8. Reporting only: the run never fails on them."""

from __future__ import annotations

import math
from typing import Any, Protocol

PER_CASE_MIN_SPEEDUP = 1.0  # cuDNN time / convgen time, every case
GEOMEAN_MAX_TIME_RATIO = 0.8  # geometric mean of convgen time / cuDNN time
BASELINE = "torch_strict"
MEASURES = (("fwd", "call"), ("fwd", "kernels"), ("fwd_bwd", "call"), ("fwd_bwd", "kernels"))
RULE = (f"every case {BASELINE}/convgen >= {PER_CASE_MIN_SPEEDUP:g} and "
        f"geomean(convgen/{BASELINE}) <= {GEOMEAN_MAX_TIME_RATIO:g}; reporting only")


class Timed(Protocol):
    """What the check reads of a case's report (suite.report.CaseReport)."""

    def median(self, label: str, mode: str, kind: str) -> float | None: ...


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(value) for value in values) / len(values))


def check_measure(reports: dict[str, Timed], mode: str, kind: str) -> dict[str, Any]:
    """One measure (say fwd_bwd call) over the cases, by name: each case's ratios and whether it meets
    the per-case target, then the geometric mean over the cases that have both times. A case without
    them is listed under `missing` and the measure is not met."""
    cases, time_ratios, missing = {}, [], []
    for name, report in reports.items():
        convgen, baseline = report.median("convgen", mode, kind), report.median(BASELINE, mode, kind)
        if not convgen or not baseline:
            missing.append(name)
            continue
        speedup = baseline / convgen
        time_ratios.append(convgen / baseline)
        cases[name] = {"convgen_ms": convgen, f"{BASELINE}_ms": baseline, f"{BASELINE}_over_convgen": speedup,
                       "ok": speedup >= PER_CASE_MIN_SPEEDUP}
    geomean = geometric_mean(time_ratios) if time_ratios else None
    every_case_ok = not missing and all(case["ok"] for case in cases.values())
    geomean_ok = geomean is not None and not missing and geomean <= GEOMEAN_MAX_TIME_RATIO
    return {"cases": cases, "missing": missing, f"geomean_convgen_over_{BASELINE}": geomean,
            "every_case_ok": every_case_ok, "geomean_ok": geomean_ok, "met": every_case_ok and geomean_ok}


def check_targets(reports: dict[str, Timed]) -> dict[str, Any] | None:
    """The targets per measure (mode and kind) for the batched cases' reports; None without any."""
    if not reports:
        return None
    return {"rule": RULE, "per_case_min_speedup": PER_CASE_MIN_SPEEDUP,
            "geomean_max_time_ratio": GEOMEAN_MAX_TIME_RATIO, "baseline": BASELINE,
            "measures": {f"{mode} {kind}": check_measure(reports, mode, kind) for mode, kind in MEASURES}}


def format_targets(targets: dict[str, Any]) -> list[str]:
    """A markdown table: one row per measure, the case ratios (cuDNN/convgen, ✗ under target), the
    geometric mean of convgen/cuDNN and the verdict."""
    names = list(dict.fromkeys(name for measure in targets["measures"].values()
                               for name in [*measure["cases"], *measure["missing"]]))
    header = ["measure", *names, f"geomean convgen/{BASELINE}", "met"]
    lines = [f"Targets (batched cases; {targets['rule']}). Case cells: {BASELINE} time / convgen time, "
             f"✗ under {PER_CASE_MIN_SPEEDUP:g}.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for measure_name, measure in targets["measures"].items():
        cells = []
        for name in names:
            case = measure["cases"].get(name)
            cells.append("—" if case is None else
                         f"{case[f'{BASELINE}_over_convgen']:.2f}" + ("" if case["ok"] else " ✗"))
        geomean = measure[f"geomean_convgen_over_{BASELINE}"]
        verdict = "yes" if measure["met"] else "no" + (f" (missing {', '.join(measure['missing'])})"
                                                      if measure["missing"] else "")
        lines.append("| " + " | ".join([measure_name, *cells, "—" if geomean is None else f"{geomean:.2f}",
                                         verdict]) + " |")
    return lines
