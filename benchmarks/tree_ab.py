#!/usr/bin/env python3
"""A/B of two trees whose kernels differ in their contract (a packed operand's size, the shared memory, the stages),
where kernel_ab.py's one-process A/B cannot run the other tree's sources: each conv stage of the batched cases timed
in processes of their own, alternately on the other tree's `convgen` and on this one's, and per stage the mean of
each side's process medians compared. The other tree is first laid out as an importable package, where
pyproject.toml's package-dir puts each folder (on a machine with the repository, for example an earlier commit's):

    python benchmarks/tree_ab.py layout COMMIT /tmp/base
    python benchmarks/tree_ab.py run --base /tmp/base [--cases conv2d_128_128_n8,conv1d_64_4096_n32]
        [--dtypes bfloat16,float16] [--precision medium] [--processes 2] [--json PATH]

A process times, per case and dtype, kernel_ab.py's stage calls (packs and reduces included) after a warm-up call:
the median of three rounds of tile_sweep.median_us, µs a call. Bits are not compared (the sides never share a
process); tests/ does that on each tree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
SIDES = ("base", "new")
ROUNDS = 3  # of tile_sweep.median_us per stage in a process


def package_dirs(pyproject: Path = REPOSITORY / "pyproject.toml") -> dict[str, str]:
    """Folder of the repository -> its place in an importable tree ("runtime" -> "convgen", ...), from the
    `"package" = "folder"` lines of pyproject.toml's [tool.setuptools.package-dir] (no tomllib on Python 3.10)."""
    section = pyproject.read_text().split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    return {folder: package.replace(".", "/") for package, folder in re.findall(r'^"([\w.]+)" = "([\w/]+)"$', section,
                                                                                    re.MULTILINE)}


def layout(commit: str, destination: Path) -> Path:
    """`commit`'s package folders copied into `destination` as the `convgen` package it installs as."""
    if (destination / "convgen").exists():
        sys.exit(f"layout: {destination / 'convgen'} exists; give an empty folder")
    dirs = package_dirs()
    with tempfile.TemporaryDirectory() as work:
        archive = Path(work) / "tree.tar"
        subprocess.run(["git", "-C", str(REPOSITORY), "archive", "-o", str(archive), commit, *dirs], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        for folder, place in sorted(dirs.items(), key=lambda item: item[1].count("/")):  # convgen before its parts
            shutil.copytree(Path(work) / folder, destination / place, dirs_exist_ok=True)
    return destination / "convgen"


def times(cases: list[str], dtypes: list[str], precision: str) -> dict[str, Any]:
    """One side's process: the convgen it imported, and "case dtype" -> stage -> µs a call."""
    import convgen
    import cupy
    from convgen.cuda import CupyBackend
    from kernel_ab import SAMPLES_PER_ROUND, STAGES, stage_calls
    from suite.cases import CASES_BY_NAME
    from suite.contestants import random_inputs
    from tile_sweep import median_us

    out: dict[str, Any] = {"convgen": convgen.__file__, "us": {}}
    for name in cases:
        for dtype in dtypes:
            geom = CASES_BY_NAME[name].geometry
            inputs, grad = random_inputs(cupy, geom, dtype, seed=7)
            calls = stage_calls(CupyBackend(dtype, precision), geom, inputs, grad)
            for call in calls.values():
                call()  # compiles and warms
            out["us"][f"{name} {dtype}"] = {
                stage: statistics.median(median_us(calls[stage], SAMPLES_PER_ROUND, cupy) for _ in range(ROUNDS))
                for stage in STAGES}
    return out


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """"case dtype stage" -> the mean µs of each side's processes, and new / base."""
    rows = {}
    for key, stages in runs["base"][0]["us"].items():
        for stage in stages:
            base, new = (statistics.mean(run["us"][key][stage] for run in runs[side]) for side in SIDES)
            rows[f"{key} {stage}"] = {"base": base, "new": new, "ratio": new / base}
    return rows


def side_process(side: str, base: Path, cases: str, dtypes: str, precision: str) -> dict[str, Any]:
    """One `times` process on `side`'s tree: the base's package ahead of every other on the path."""
    env = dict(os.environ)
    if side == "base":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(base.resolve()), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, __file__, "times", cases, dtypes, precision], capture_output=True,
                          text=True, env=env, cwd=Path(__file__).parent)
    if done.returncode != 0:
        sys.exit(f"run: the {side} side's process failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if (side == "base") != Path(result["convgen"]).resolve().is_relative_to(base.resolve()):
        sys.exit(f"run: the {side} side imported {result['convgen']}, not its tree's convgen")
    return result


def main(argv: list[str] | None = None) -> int:
    from suite.cases import BATCHED_CASES, CASES_BY_NAME

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lay = commands.add_parser("layout", help="lay a commit's package out in a folder")
    lay.add_argument("commit")
    lay.add_argument("destination", type=Path)
    run = commands.add_parser("run", help="time both trees' stages, processes alternating")
    run.add_argument("--base", type=Path, required=True, help="a folder holding the other tree's convgen/")
    run.add_argument("--cases", default=",".join(c.name for c in BATCHED_CASES if c.in_c >= 32))
    run.add_argument("--dtypes", default="bfloat16,float16", help="comma-separated: float32, float16, bfloat16")
    run.add_argument("--precision", default="medium", help="highest, high or medium")
    run.add_argument("--processes", type=int, default=2, help="processes a side")
    run.add_argument("--json", type=Path, default=None, help="where to write the numbers")
    one = commands.add_parser("times", help="one side's process (run starts these): JSON on stdout")
    for name in ("cases", "dtypes", "precision"):
        one.add_argument(name)
    args = parser.parse_args(argv)
    if args.command == "layout":
        print(layout(args.commit, args.destination))
        return 0
    if args.command == "times":
        print(json.dumps(times(args.cases.split(","), args.dtypes.split(","), args.precision)))
        return 0
    if not (args.base / "convgen" / "__init__.py").is_file():
        parser.error(f"--base {args.base}: no convgen package in it (tree_ab.py layout COMMIT {args.base})")
    unknown = [name for name in args.cases.split(",") if name not in CASES_BY_NAME]
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(sorted(CASES_BY_NAME))})")
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: at least 1")
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for _ in range(args.processes):
        for side in SIDES:
            runs[side].append(side_process(side, args.base, args.cases, args.dtypes, args.precision))
    rows = compare(runs)
    for key, row in rows.items():
        print(f"{key:40} base {row['base']:8.1f}  new {row['new']:8.1f}  new/base {row['ratio']:6.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
