#!/usr/bin/env python3
"""Print the README's benchmark table from a JSON that bench.py wrote, so the README's figures are
copied by a program, not by hand.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="a JSON written by benchmarks/bench.py")
    results = json.loads(parser.parse_args().json.read_text(encoding="utf-8"))
    meta = results["meta"]
    versions = f"torch {meta.get('torch', '?')}, cuDNN {meta.get('cudnn', '?')}, CuPy {meta.get('cupy', '?')}"
    print(f"Measured {meta.get('date_utc', '?')[:10]} on {meta.get('gpu', '?')} ({versions}).\n")
    print(table(results))


if __name__ == "__main__":
    main()
