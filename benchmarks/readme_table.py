#!/usr/bin/env python3
"""Print the README's benchmark table from a JSON that bench.py wrote, so the README's figures are
copied by a program, not by hand; for a batched run with the tensor-core precisions, their table too.

    python benchmarks/readme_table.py benchmarks/measured/2026-11-30-h200-unbatched.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def median(case: dict, contestant: str, run: str, how: str) -> float | None:
    try:
        return case["timings"][contestant][run][how]["median_ms"]
    except (KeyError, TypeError):
        return None


def pair(case: dict, contestant: str, run: str) -> str:
    call, kernels = median(case, contestant, run, "call"), median(case, contestant, run, "kernels")
    return "—" if call is None else f"{call:.3g} / {kernels:.3g}"


def ratio(case: dict, baseline: str, run: str, how: str) -> str:
    ours, theirs = median(case, "convgen", run, how), median(case, baseline, run, how)
    return "—" if ours is None or theirs is None else f"{theirs / ours:.2f}"


def table(results: dict) -> str:
    rows = ["| case | convgen fwd, call / kernels (ms) | convgen fwd+bwd | PyTorch fwd | PyTorch fwd+bwd "
            "| ratio fwd (call / kernels) | ratio fwd+bwd (call / kernels) |",
            "|---|---|---|---|---|---|---|"]
    for case in results["cases"]:
        ratios = [f"{ratio(case, 'torch_strict', run, 'call')} / {ratio(case, 'torch_strict', run, 'kernels')}"
                  for run in ("fwd", "fwd_bwd")]
        rows.append(f"| {case['title']} | {pair(case, 'convgen', 'fwd')} | {pair(case, 'convgen', 'fwd_bwd')} "
                    f"| {pair(case, 'torch_strict', 'fwd')} | {pair(case, 'torch_strict', 'fwd_bwd')} "
                    f"| {ratios[0]} | {ratios[1]} |")
    return "\n".join(rows)


# The tensor-core table's columns: contestant, heading (kernels fwd / fwd+bwd); convgen's bf16 beside cuDNN's.
MODES = (("convgen", '"highest" (fp32 FMA)'), ("convgen_high", '"high" (3xTF32)'),
         ("convgen_medium", '"medium" (TF32)'), ("torch_strict", "cuDNN strict fp32"), ("torch_tf32", "cuDNN TF32"),
         ("convgen_torch_bf16", "convgen.torch bf16"), ("torch_bf16_cl", "cuDNN bf16 channels-last"))
# The error column, in its heading's order; fp16 has no time column (the table is wide; no cuDNN fp16 beside it).
ERROR_MODES = ("convgen", "convgen_high", "convgen_medium", "convgen_torch_bf16", "convgen_torch_fp16")


def kernels(case: dict, contestant: str) -> str:
    fwd, both = median(case, contestant, "fwd", "kernels"), median(case, contestant, "fwd_bwd", "kernels")
    return "—" if fwd is None else f"{fwd:.3g} / {both:.3g}"


def worst_error(case: dict, contestant: str) -> str:
    errors = case.get("check_rel_err", {}).get(contestant)
    return "—" if not errors else f"{max(errors.values()):.1e}".replace("e-0", "e-")


def precision_table(results: dict) -> str | None:
    """Kernels fwd / fwd+bwd per precision beside cuDNN's, and the worst output's error; None for a run
    without the tensor-core contestants."""
    cases = [case for case in results["cases"] if "convgen_high" in case.get("timings", {})]
    if not cases:
        return None
    rows = ["| case | " + " | ".join(heading for _, heading in MODES)
            + " | error highest / high / medium / bf16 / fp16 |",
            "|---" * (len(MODES) + 2) + "|"]
    for case in cases:
        errors = " / ".join(worst_error(case, contestant) for contestant in ERROR_MODES)
        rows.append(f"| {case['title']} | " + " | ".join(kernels(case, c) for c, _ in MODES) + f" | {errors} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="a JSON written by benchmarks/bench.py")
    results = json.loads(parser.parse_args().json.read_text(encoding="utf-8"))
    meta = results["meta"]
    versions = f"torch {meta.get('torch', '?')}, cuDNN {meta.get('cudnn', '?')}, CuPy {meta.get('cupy', '?')}"
    print(f"Measured {meta.get('date_utc', '?')[:10]} on {meta.get('gpu', '?')} ({versions}).\n")
    print(table(results))
    modes = precision_table(results)
    if modes:
        print("\nTensor-core modes, kernels fwd / fwd+bwd (ms), worst output's error against float64:\n")
        print(modes)


if __name__ == "__main__":
    main()
