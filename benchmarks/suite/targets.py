"""The targets for the batched cases, checked on times measured in the same run. Issue 9's, against cuDNN
strict fp32: every case at least as fast as cuDNN (torch/convgen ≥ 1) and the geometric mean of
convgen/cuDNN time at most 0.8. Issue 10's: the adapter convgen.torch within 5% of the tape on every case
(adapter/tape time ≤ 1.05). Reporting only: the run never fails on them."""

from __future__ import annotations

import math
from typing import Any, Protocol

from suite.contestants import ADAPTER

PER_CASE_MIN_SPEEDUP = 1.0  # cuDNN time / convgen time, every case
GEOMEAN_MAX_TIME_RATIO = 0.8  # geometric mean of convgen time / cuDNN time
BASELINE = "torch_strict"
ADAPTER_MAX_TIME_RATIO = 1.05  # convgen_torch time / convgen time, every case
MEASURES = (("fwd", "call"), ("fwd", "kernels"), ("fwd_bwd", "call"), ("fwd_bwd", "kernels"))
RULE = (f"every case {BASELINE}/convgen >= {PER_CASE_MIN_SPEEDUP:g} and "
        f"geomean(convgen/{BASELINE}) <= {GEOMEAN_MAX_TIME_RATIO:g}; reporting only")
ADAPTER_RULE = f"every case {ADAPTER}/convgen <= {ADAPTER_MAX_TIME_RATIO:g}; reporting only"


class Timed(Protocol):
    """What the check reads of a case's report (suite.report.CaseReport)."""

    def median(self, label: str, mode: str, kind: str) -> float | None: ...


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(value) for value in values) / len(values))


def paired_medians(reports: dict[str, Timed], first: str, second: str, mode: str,
                   kind: str) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Each case's medians of two contestants for one measure, by name, and the names lacking either."""
    medians, missing = {}, []
    for name, report in reports.items():
        pair = report.median(first, mode, kind), report.median(second, mode, kind)
        if pair[0] and pair[1]:
            medians[name] = pair
        else:
            missing.append(name)
    return medians, missing


def check_measure(reports: dict[str, Timed], mode: str, kind: str) -> dict[str, Any]:
    """One measure (say fwd_bwd call) over the cases, by name: each case's ratios and whether it meets
    the per-case target, then the geometric mean over the cases that have both times. A case without
    them is listed under `missing` and the measure is not met."""
    cases, time_ratios = {}, []
    medians, missing = paired_medians(reports, "convgen", BASELINE, mode, kind)
    for name, (convgen, baseline) in medians.items():
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


def check_adapter(reports: dict[str, Timed]) -> dict[str, Any] | None:
    """Issue 10's target per measure for the batched cases' reports: each case's adapter/tape time ratio,
    and whether every case is within ADAPTER_MAX_TIME_RATIO (a case without both times fails); None
    without any case."""
    if not reports:
        return None
    measures = {}
    for mode, kind in MEASURES:
        medians, missing = paired_medians(reports, ADAPTER, "convgen", mode, kind)
        cases = {name: {f"{ADAPTER}_ms": adapter, "convgen_ms": tape, f"{ADAPTER}_over_convgen": adapter / tape,
                        "ok": adapter / tape <= ADAPTER_MAX_TIME_RATIO} for name, (adapter, tape) in medians.items()}
        measures[f"{mode} {kind}"] = {"cases": cases, "missing": missing,
                                      "met": not missing and all(case["ok"] for case in cases.values())}
    return {"rule": ADAPTER_RULE, "max_time_ratio": ADAPTER_MAX_TIME_RATIO, "measures": measures,
            "met": all(measure["met"] for measure in measures.values())}


def format_adapter_target(target: dict[str, Any]) -> str:
    """One line: per measure, yes, or no with the cases over the ratio and those not measured."""
    verdicts = []
    for measure_name, measure in target["measures"].items():
        over = [f"{name} {case[f'{ADAPTER}_over_convgen']:.2f}" for name, case in measure["cases"].items()
                if not case["ok"]]
        if measure["missing"]:
            over.append(f"missing {', '.join(measure['missing'])}")
        verdicts.append(f"{measure_name} " + ("yes" if measure["met"] else f"no ({'; '.join(over)})"))
    return (f"Adapter target (issue 10; batched cases; {target['rule']}): {', '.join(verdicts)}. "
            f"Every batched case within it: {'yes' if target['met'] else 'no'}.")
