"""benchmarks/tree_ab.py without a GPU: a commit's package laid out where pyproject.toml puts it imports from
there ahead of the installed convgen, the sides' process medians are compared per stage, a side that imported the
other tree's convgen is refused, and so are bad arguments, each with its reason. Its times are only taken on a
GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tree_ab


def test_a_commits_package_imports_from_its_layout(tmp_path) -> None:
    package = tree_ab.layout("HEAD", tmp_path)
    assert package == tmp_path / "convgen"
    for part in ("__init__.py", "torch/__init__.py", "generated/contract.py", "generated/cuda/conv_r2.cu",
                 "templates/cuda/conv.cu.j2", "generator/grammar.lark"):
        assert (package / part).is_file(), part
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    imported = subprocess.run([sys.executable, "-c", "import convgen.generated.contract as c; print(c.__file__)"],
                              capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert Path(imported).resolve() == (package / "generated" / "contract.py").resolve()
    with pytest.raises(SystemExit, match=f"^layout: {tmp_path / 'convgen'} exists; give an empty folder$"):
        tree_ab.layout("HEAD", tmp_path)


def test_each_stage_compares_the_means_of_the_sides_processes() -> None:
    def run(forward: float, weight: float) -> dict:
        return {"convgen": "x", "us": {"conv2d_64_56_n32 bfloat16": {"forward": forward, "backward_weight": weight}}}

    rows = tree_ab.compare({"base": [run(100.0, 200.0), run(110.0, 220.0)], "new": [run(84.0, 210.0), run(84.0, 210.0)]})
    assert rows == {"conv2d_64_56_n32 bfloat16 forward": {"base": 105.0, "new": 84.0, "ratio": 0.8},
                    "conv2d_64_56_n32 bfloat16 backward_weight": {"base": 210.0, "new": 210.0, "ratio": 1.0}}


def test_a_side_that_imported_the_other_trees_convgen_is_refused(tmp_path, monkeypatch) -> None:
    shadowing = json.dumps({"convgen": "/elsewhere/convgen/__init__.py", "us": {}})
    monkeypatch.setattr(tree_ab.subprocess, "run",
                        lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, shadowing + "\n", ""))
    with pytest.raises(SystemExit, match="^run: the base side imported /elsewhere/convgen/__init__.py, not its "
                                         "tree's convgen$"):
        tree_ab.side_process("base", tmp_path, "conv2d_64_56_n32", "bfloat16", "medium")
    inside = json.dumps({"convgen": str(tmp_path / "convgen" / "__init__.py"), "us": {}})
    monkeypatch.setattr(tree_ab.subprocess, "run",
                        lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, inside + "\n", ""))
    with pytest.raises(SystemExit, match="^run: the new side imported .*, not its tree's convgen$"):
        tree_ab.side_process("new", tmp_path, "conv2d_64_56_n32", "bfloat16", "medium")
    assert tree_ab.side_process("base", tmp_path, "conv2d_64_56_n32", "bfloat16", "medium")["us"] == {}


def test_bad_arguments_are_refused_with_the_reason(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        tree_ab.main(["run", "--base", str(tmp_path)])
    assert (f"--base {tmp_path}: no convgen package in it (tree_ab.py layout COMMIT {tmp_path})"
            in capsys.readouterr().err)
    (tmp_path / "convgen").mkdir()
    (tmp_path / "convgen" / "__init__.py").write_text("")
    with pytest.raises(SystemExit):
        tree_ab.main(["run", "--base", str(tmp_path), "--cases", "conv2d_64_56_n32,conv9d"])
    assert "--cases: unknown conv9d (known: " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tree_ab.main(["run", "--base", str(tmp_path), "--processes", "0"])
    assert "--processes 0: at least 1" in capsys.readouterr().err


def test_the_base_goes_first_on_the_path_as_an_absolute_folder(tmp_path, monkeypatch) -> None:
    """The sides' processes run in benchmarks/: a relative --base on PYTHONPATH would name nothing there (on the
    H200 the base side then imported the installed convgen, which the check above refused)."""
    seen = {}

    def fake_run(command, **kwargs):
        seen.update(kwargs["env"])
        out = json.dumps({"convgen": str(tmp_path / "convgen" / "__init__.py"), "us": {}})
        return subprocess.CompletedProcess(command, 0, out + "\n", "")

    monkeypatch.setattr(tree_ab.subprocess, "run", fake_run)
    monkeypatch.chdir(tmp_path.parent)
    tree_ab.side_process("base", Path(tmp_path.name), "conv2d_64_56_n32", "bfloat16", "medium")
    assert seen["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path.resolve())
