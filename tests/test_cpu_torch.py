"""The NumPy backend against PyTorch's CPU ops (float64) at ranks 1..3: conv, conv transpose, max
pool and avg pool (count_include_pad), forward and backward, on random geometry. Skipped without
torch (`pip install torch==2.13.0`, the CPU build)."""

from __future__ import annotations

import numpy as np
import pytest
import reference
import torch_oracle
from convgen.geometry import Family, Geometry

torch = pytest.importorskip("torch")

LARGER_CASES = {
    "conv2d": Geometry.build(Family.CONV, 4, 5, (17, 13), (3, 4), (2, 1), (1, 2)),
    "conv_transpose2d": Geometry.build(Family.CONV_TRANSPOSE, 3, 2, (9, 7), (4, 3), (3, 2), (2, 1)),
    "conv3d": Geometry.build(Family.CONV, 2, 3, (6, 5, 7), (3, 2, 3), (1, 2, 3), (1, 0, 2)),
    "max_pool3d": Geometry.build(Family.MAX_POOL, 3, 3, (8, 7, 6), (3, 2, 3), (2, 1, 2), (1, 1, 1)),
    "avg_pool1d": Geometry.build(Family.AVG_POOL, 2, 2, (40,), (5,), (2,), (2,)),
}


def check_against_torch(geom: Geometry, rng: np.random.Generator) -> None:
    inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
    out, grads = reference.run_numpy_backend(geom, inputs, grad)
    reference.check_against_reference(geom, inputs, grad, out, grads, oracle=lambda *args: torch_oracle.run(torch, *args))


@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("family", torch_oracle.FAMILIES, ids=lambda f: f.value)
def test_matches_torch(family: Family, rank: int) -> None:
    rng = reference.case_rng("torch", family.value, rank)
    for geom in reference.torch_geometries(rng, family, rank, 12, budget=2000):
        check_against_torch(geom, rng)


@pytest.mark.parametrize("name", LARGER_CASES)
def test_larger_cases_match_torch(name: str) -> None:
    check_against_torch(LARGER_CASES[name], reference.case_rng("torch", name))
