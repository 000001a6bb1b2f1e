"""The targets for the batched cases, checked on times measured in the same run. Issue 9's, against cuDNN
strict fp32: every case at least as fast as cuDNN (torch/convgen ≥ 1) and the geometric mean of
convgen/cuDNN time at most 0.8. Issue 10's: the adapter convgen.torch within 5% of the tape on every case
(adapter/tape time ≤ 1.05). Issue 11's, for the tape's tensor-core precisions: accuracy ("high" within 2× the
fp32 FMA error, "medium" within 1e-3) and speed ("high" twice cuDNN strict's on the two large conv2d cases,
"medium" no slower than cuDNN TF32, every precision ahead of cuDNN strict on conv3d and conv4d) and for
convgen.torch on bfloat16 tensors (rel err within 1e-2, time within 1.2× cuDNN bf16 channels-last's) and
float16 tensors (rel err within 1e-2; no speed target: no cuDNN fp16 contestant). Reporting only: the run
never fails on them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from suite.contestants import ADAPTER, ADAPTER_BF16, ADAPTER_FP16, TORCH_BF16_CHANNELS_LAST
from suite.precision import TAPE_LABELS, convgen_label

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


# Issue 11's targets for the tensor-core precisions of the tape, checked per batched case (reporting only too).
HIGH, MEDIUM = convgen_label("high"), convgen_label("medium")
CONV_OUTPUTS = ("y", "grad_x", "grad_weight", "grad_bias")  # what a batched (conv) case checks
HALF_MAX_REL_ERR = 1e-2  # issue 11's 16-bit bound: values round by up to 2^-8 ≈ 4e-3 in bf16, 2^-11 ≈ 5e-4 in fp16
BF16_MAX_TIME_RATIO = 1.2  # convgen_torch_bf16 time / torch_bf16_cl time, every case


@dataclass(frozen=True)
class AccuracyRule:
    """Every output of `label`'s rel err within `limit` on every batched case; with `relative_to`, within
    `limit` times that contestant's error on the same case and output."""

    key: str
    label: str
    limit: float
    relative_to: str | None = None

    @property
    def text(self) -> str:
        bound = f"{self.limit:g} × {self.relative_to}'s (fp32 FMA), same case and output" if self.relative_to \
            else f"{self.limit:g}"
        return f"{self.label} rel err ≤ {bound}"


@dataclass(frozen=True)
class SpeedRule:
    """`baseline` time / each of `labels`' times at least `min_speedup`, per measure, on `cases` (None: every
    batched case of the run; a named case the run lacks counts as missing)."""

    key: str
    labels: tuple[str, ...]
    baseline: str
    min_speedup: float
    cases: tuple[str, ...] | None = None
    note: str = ""

    @property
    def text(self) -> str:
        where = ", ".join(self.cases) if self.cases else "every batched case"
        return f"{self.baseline}/{', '.join(self.labels)} ≥ {self.min_speedup:.3g} on {where}{self.note}"


ACCURACY_RULES = (AccuracyRule("accuracy_high", HIGH, 2.0, relative_to="convgen"),
                  AccuracyRule("accuracy_medium", MEDIUM, 1e-3),
                  AccuracyRule("accuracy_bf16", ADAPTER_BF16, HALF_MAX_REL_ERR),
                  AccuracyRule("accuracy_fp16", ADAPTER_FP16, HALF_MAX_REL_ERR))
SPEED_RULES = (
    SpeedRule("speed_high", (HIGH,), BASELINE, 2.0, ("conv2d_128_128_n8", "conv2d_64_56_n32")),
    SpeedRule("speed_medium", (MEDIUM,), "torch_tf32", 1.0),
    SpeedRule("speed_conv3d_conv4d", TAPE_LABELS, BASELINE, 1.0, ("conv3d_32_32_n8", "conv4d_8_16_n8"),
              " (conv4d's torch: the conv3d loop)"),
    SpeedRule("speed_bf16", (ADAPTER_BF16,), TORCH_BF16_CHANNELS_LAST.label, 1 / BF16_MAX_TIME_RATIO,
              note=f" (its time ≤ {BF16_MAX_TIME_RATIO:g} × cuDNN's)"),
)


class Checked(Timed, Protocol):
    """What the accuracy rules read too: rel err by contestant and output (suite.report.CaseReport.check)."""

    check: dict[str, dict[str, float]]


def check_accuracy(rule: AccuracyRule, reports: dict[str, Checked]) -> dict[str, Any]:
    """Each case's outputs against the rule's bound; an output without its error (or the error it is bounded
    by) is missing, and the rule is then not met."""
    cases: dict[str, dict[str, Any]] = {}
    missing = []
    for name, report in reports.items():
        errors = report.check.get(rule.label, {})
        # what `limit` multiplies: the other contestant's error, output by output, or 1 for an absolute bound
        scales = report.check.get(rule.relative_to, {}) if rule.relative_to else dict.fromkeys(CONV_OUTPUTS, 1.0)
        for output in CONV_OUTPUTS:
            error, scale = errors.get(output), scales.get(output)
            if error is None or scale is None:
                missing.append(f"{name} {output}")
                continue
            bound = rule.limit * scale
            cases.setdefault(name, {})[output] = {"rel_err": error, "bound": bound, "ok": error <= bound}
    met = bool(reports) and not missing and all(entry["ok"] for by_output in cases.values()
                                                for entry in by_output.values())
    return {"rule": rule.text, "cases": cases, "missing": missing, "met": met}


def check_speed(rule: SpeedRule, reports: dict[str, Timed]) -> dict[str, Any]:
    """Per measure, each case's baseline/contestant time ratio for every contestant of the rule."""
    names = rule.cases if rule.cases is not None else tuple(reports)
    present = {name: reports[name] for name in names if name in reports}
    measures = {}
    for mode, kind in MEASURES:
        cases: dict[str, dict[str, Any]] = {}
        missing = []
        for label in rule.labels:
            medians, lacking = paired_medians(present, label, rule.baseline, mode, kind)
            missing += [f"{name} {label}" for name in names if name not in present or name in lacking]
            for name, (ms, baseline_ms) in medians.items():
                cases.setdefault(name, {})[label] = {"ms": ms, f"{rule.baseline}_ms": baseline_ms,
                                                     "speedup": baseline_ms / ms,
                                                     "ok": baseline_ms / ms >= rule.min_speedup}
        ok = all(entry["ok"] for by_label in cases.values() for entry in by_label.values())
        measures[f"{mode} {kind}"] = {"cases": cases, "missing": missing, "met": bool(names) and not missing and ok}
    return {"rule": rule.text, "min_speedup": rule.min_speedup, "baseline": rule.baseline, "measures": measures,
            "met": all(measure["met"] for measure in measures.values())}


def check_precisions(reports: dict[str, Checked]) -> dict[str, Any] | None:
    """Issue 11's rules for the batched cases' reports, by key; None without any case."""
    if not reports:
        return None
    targets = {rule.key: check_accuracy(rule, reports) for rule in ACCURACY_RULES}
    return targets | {rule.key: check_speed(rule, reports) for rule in SPEED_RULES}


def failures(entries: dict[str, dict[str, Any]], missing: list[str],
             describe: Callable[[str, str, dict[str, Any]], str]) -> str:
    """`yes`, or `no (...)` listing each failed entry as `describe` writes it, then the missing ones."""
    failed = [describe(name, key, entry) for name, by_key in entries.items() for key, entry in by_key.items()
              if not entry["ok"]]
    if missing:
        failed.append(f"missing {', '.join(missing)}")
    return "yes" if not failed else f"no ({'; '.join(failed)})"


def format_precision_targets(targets: dict[str, Any]) -> list[str]:
    """One line per rule: the verdict, with the failing cases (ratio or error against its bound) and the missing."""
    lines = ["Tensor-core targets (issue 11; batched cases; reporting only):"]
    for rule in ACCURACY_RULES:
        entry = targets[rule.key]
        verdict = failures(entry["cases"], entry["missing"],
                           lambda name, output, e: f"{name} {output} {e['rel_err']:.1e} > {e['bound']:.1e}")
        lines.append(f"- {rule.key.replace('_', ' ')} — {entry['rule']}: {verdict}.")
    for rule in SPEED_RULES:
        entry = targets[rule.key]
        verdicts = [f"{measure_name} " + failures(measure["cases"], measure["missing"],
                                                  lambda name, label, e: f"{name} {label} {e['speedup']:.2f}")
                    for measure_name, measure in entry["measures"].items()]
        lines.append(f"- {rule.key.replace('_', ' ')} — {entry['rule']}: {', '.join(verdicts)}. "
                     f"Met: {'yes' if entry['met'] else 'no'}.")
    return lines
