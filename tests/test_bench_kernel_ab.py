"""benchmarks/kernel_ab.py without a GPU: a backend that compiles another tree's sources runs them (on the CPU
emulator), the bit comparison tells the trees apart stage by stage, and bad arguments are refused with their
reason. Its times are only taken on a GPU."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from convgen.cuda_launch import plan
from convgen.geometry import Family, Geometry
from emulated_cupy import emulated_cupy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kernel_ab
from suite.stand_in import imports_as

GENERATED_CUDA = Path(__file__).resolve().parents[1] / "generated" / "cuda"
# Every conv stage on its `_wgmma` kernel in "medium" (tests/test_emulated_wgmma.py), small enough to emulate.
GEOMETRY = Geometry.build(Family.CONV, 32, 32, (6, 5), (3, 3), (1, 1), (1, 1), batch=2)
# The wgmma forward's float32 store, then the input gradient's.
FORWARD_STORE = "        if (place(r, cell, step, m)) put(output(cell, step, m), acc[r]);\n"


def stages_on(sources: Path | None) -> dict:
    rng = np.random.default_rng(5)
    cupy = emulated_cupy()  # the arrays as its device arrays, whose addresses the launches take
    inputs = tuple(cupy.asarray(rng.standard_normal(shape), np.float32) for shape in GEOMETRY.parent_shapes)
    grad = cupy.asarray(rng.standard_normal(GEOMETRY.output_shape), np.float32)
    with imports_as(cupy):
        backend = kernel_ab.backend_class(sources)("float32", "medium")
    return kernel_ab.stage_calls(backend, GEOMETRY, inputs, grad)


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++")
def test_another_trees_sources_run_and_differ_only_where_they_do(tmp_path) -> None:
    same, changed = tmp_path / "same", tmp_path / "changed"
    shutil.copytree(GENERATED_CUDA, same)
    shutil.copytree(GENERATED_CUDA, changed)
    source = changed / "conv_r2.cu"
    text = source.read_text()
    assert FORWARD_STORE in text
    source.write_text(text.replace(FORWARD_STORE, FORWARD_STORE.replace("acc[r]);", "acc[r] + 1.f);"), 1))
    current = stages_on(None)
    assert kernel_ab.same_bits(np, stages_on(same), current) == dict.fromkeys(kernel_ab.STAGES, True)
    assert kernel_ab.same_bits(np, stages_on(changed), current) == {
        "forward": False, "backward_input": True, "backward_weight": True}


def test_bad_arguments_are_refused_with_the_reason(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        kernel_ab.main(["--base", str(tmp_path / "missing")])
    assert f"--base {tmp_path / 'missing'}: not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernel_ab.main(["--base", str(tmp_path), "--cases", "conv2d_64_56_n32,conv9d"])
    assert "--cases: unknown conv9d (known: " in capsys.readouterr().err


WGMMA_TILES = Path(__file__).resolve().parents[1] / "runtime" / "wgmma_tiles.py"
BATCHED_128 = Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8)


def test_another_trees_wgmma_tiles_plan_the_base_side(tmp_path) -> None:
    """A copy of this tree's wgmma_tiles.py plans as this tree does; one whose WgmmaTile lacks a field (an earlier
    tree's) gives that field its default; one that chooses nothing sends every stage to its GEMM."""
    copy = tmp_path / "copy_tiles.py"
    copy.write_text(WGMMA_TILES.read_text())
    older = tmp_path / "older_tiles.py"
    older.write_text("from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass Tile:\n    n: int\n"
                     "    cells: int\n    stages: int\n    split: int\n\n\n"
                     "def choose_wgmma(shape, hardware):\n    return Tile(64, 128, 3, 5)\n")
    none = tmp_path / "no_tiles.py"
    none.write_text("def choose_wgmma(shape, hardware):\n    return None\n")
    for precision in ("high", "medium"):
        assert plan(BATCHED_128, precision=precision, wgmma_chooser=kernel_ab.tiles_chooser(copy)).defines == \
            plan(BATCHED_128, precision=precision).defines
    older_plan = plan(BATCHED_128, precision="medium", wgmma_chooser=kernel_ab.tiles_chooser(older)).defines
    assert (older_plan["BWW_WG_N"], older_plan["BWW_SPLIT"], older_plan["BWW_WG_MIN_BLOCKS"]) == (64, 5, 1)
    assert plan(BATCHED_128, precision="medium", wgmma_chooser=kernel_ab.tiles_chooser(none)).defines["FWD_WGMMA"] == 0
    chooser = kernel_ab.tiles_chooser(none)
    assert kernel_ab.backend_class(None, chooser).wgmma_chooser is chooser
    assert kernel_ab.backend_class(None) is kernel_ab.CupyBackend


def test_a_side_that_differs_in_nothing_is_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        kernel_ab.main([])
    assert "give --base, --base-tiles, --base-unshifted-weight or a mix: the sides differ in sources or tiles" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernel_ab.main(["--base-tiles", str(tmp_path)])
    assert f"--base-tiles {tmp_path}: not a file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernel_ab.main(["--base", str(tmp_path), "--dtypes", "float32,int8"])
    assert "--dtypes: unknown int8 (known: float32, float16, bfloat16)" in capsys.readouterr().err


def test_the_base_side_may_plan_its_16_bit_weight_gradients_unshifted(tmp_path, capsys) -> None:
    """--base-unshifted-weight: the base side plans the 16-bit weight gradient unshifted, this tree's side as it does
    by default (shifted); not with --base-tiles, which names the base's chooser itself."""
    geom = Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32)
    unshifted = kernel_ab.base_chooser(None, True)
    assert plan(geom, dtype="bfloat16", precision="medium", wgmma_chooser=unshifted).defines["BWW_WG_SHIFT"] == 0
    assert plan(geom, dtype="bfloat16", precision="medium").defines["BWW_WG_SHIFT"] == 1
    assert kernel_ab.base_chooser(None, False) is None
    with pytest.raises(SystemExit):
        kernel_ab.main(["--base-tiles", str(tmp_path), "--base-unshifted-weight"])
    assert "argument --base-unshifted-weight: not allowed with argument --base-tiles" in capsys.readouterr().err
