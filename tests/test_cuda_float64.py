"""The CUDA tape in float64 (`Tape(dtype="float64")`, `pytest -m cuda`, skipped without CuPy or a
GPU): the same kernels compiled with double elements (ELEMENT_BYTES 8) held to the CPU tape's
float64 at reference.RTOL_FLOAT64, every family at every rank with SEMANTICS §8 arguments mixed in,
and to float64 torch on the GPU at ranks 1..3. Outputs are poisoned with NaN before their kernels
run and every gradient is computed twice and must be bit-identical (tests/test_cuda.py's helpers).
"""

from __future__ import annotations

import numpy as np
import pytest
import reference
import torch_oracle
from convgen.cuda_launch import H200, plan
from convgen.direct_model import no_direct
from convgen.gemm_shapes import WEIGHT_BK
from convgen.generated.contract import gemm_shared_bytes
from convgen.geometry import Family, Geometry
from cuda_support import (
    RANKS,
    GemmTape,
    PoisonTape,
    _has_gpu,
    assert_close_to,
    check_against_cpu,
    forced_tape,
    run,
)
from forced_tiles import FORCED_GEOMETRY, FORCED_TILES_FLOAT64, forced_chooser
from test_cuda import PHASE_GEOMETRY
from test_cuda_extended import DILATED_GROUPED, circular_geometry

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

import convgen.cpu  # noqa: E402  (after the skip, as in tests/test_cuda.py)

G = Geometry.build
FLOAT64 = "float64"
CASES_PER_RANK = 3  # the last one may have empty extents or channels


def check(geom: Geometry, rng: np.random.Generator, tape_class=PoisonTape) -> None:
    check_against_cpu(geom, rng, tape_class, FLOAT64)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_random_extended_geometry_matches_the_float64_cpu_tape(family: Family, rank: int) -> None:
    """Batch, dilation, groups, circular and output padding as reference.random_geometry mixes them."""
    rng = reference.case_rng("cuda float64", family.value, rank)
    for case in range(CASES_PER_RANK):
        check(reference.random_geometry(rng, family, rank, allow_empty=case == CASES_PER_RANK - 1, budget=300,
                                        extended=True), rng)


@pytest.mark.parametrize("rank", RANKS)
def test_circular_padding_in_float64(rank: int) -> None:
    """The pad and fold kernels in double around the ordinary conv kernels."""
    rng = reference.case_rng("cuda float64 circular", rank)
    for _ in range(2):
        check(circular_geometry(rng, rank), rng)


def _torch_cuda_float64(torch, geom: Geometry, inputs, grad):
    """torch_oracle's op on the GPU in float64 (torch_oracle.run takes float32 on a GPU)."""
    leaves = [torch.tensor(np.asarray(a), dtype=torch.float64, device="cuda", requires_grad=True) for a in inputs]
    batched = geom.batch is not None
    out = torch_oracle._forward(torch.nn.functional, geom, [*leaves[:-1], leaves[-1] if batched else leaves[-1][None]])
    out = out if batched else out[0]
    out.backward(torch.tensor(np.asarray(grad), dtype=torch.float64, device="cuda"))
    return out.detach().cpu().numpy(), [leaf.grad.cpu().numpy() for leaf in leaves]


@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("family", torch_oracle.FAMILIES, ids=lambda f: f.value)
def test_random_extended_geometry_matches_float64_torch_cuda(family: Family, rank: int) -> None:
    torch = pytest.importorskip("torch")
    rng = reference.case_rng("torch cuda float64", family.value, rank)
    for geom in reference.torch_geometries(rng, family, rank, 3, budget=300, extended=True):
        inputs, grad = reference.draw_inputs(rng, geom, FLOAT64), reference.draw_grad(rng, geom, FLOAT64)
        got = run(PoisonTape(dtype=FLOAT64), geom, inputs, grad, repeat=2)
        ref_abs = run(convgen.cpu.Tape(dtype=FLOAT64), geom, [np.abs(a) for a in inputs], np.abs(grad))
        assert_close_to(geom, got, _torch_cuda_float64(torch, geom, inputs, grad), ref_abs, reference.RTOL_FLOAT64)


@pytest.mark.parametrize("tile", FORCED_TILES_FLOAT64, ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}".format(*t))
def test_every_gemm_tile_shape_in_float64(tile) -> None:
    """The double paths of the GEMM kernels (two double2 accesses per fragment of 4, the split
    buffers and reduce kernels in double) through plain, phased, dilated and grouped geometry."""
    bm, bn = tile[:2]
    assert gemm_shared_bytes(bm, bn, WEIGHT_BK, 8) <= H200.shared_per_block, tile
    tape_class = forced_tape(tile)
    rng = reference.case_rng("forced float64", tile)
    for geom in FORCED_GEOMETRY:
        assert plan(geom, H200, forced_chooser(*tile), FLOAT64).defines["ELEMENT_BYTES"] == 8
        check(geom, rng, tape_class)
    for geom in (*PHASE_GEOMETRY[2:6], *DILATED_GROUPED):
        check(geom, rng, tape_class)


def test_planned_splits_in_float64() -> None:
    """Plans that split reductions: partial buffers [split][images][...] of doubles, added in order (GEMMs
    only, as tests/test_cuda.py's planned splits)."""
    rng = reference.case_rng("splits float64")
    for geom in (G(Family.CONV, 1, 1, (300, 300), (3, 3), (1, 1), (1, 1)),
                 G(Family.CONV, 40, 24, (9, 9), (3, 3), (1, 1), (1, 1), batch=3),
                 G(Family.CONV_TRANSPOSE, 16, 8, (30, 30), (3, 2), (2, 1), (1, 0), batch=5),
                 G(Family.CONV, 96, 32, (9, 9), (3, 3), (1, 1), (2, 2), dilation=(2, 2), groups=4)):
        assert max(plan(geom, dtype=FLOAT64, direct_chooser=no_direct).splits.values()) > 1, geom
        check(geom, rng, GemmTape)


def test_pools_in_float64() -> None:
    """A max pool window of padding only is -inf (in double) and passes no gradient; rows held in
    registers (POOL_V = 4, 32-byte groups of doubles) and streamed; smooth max with either sign of β,
    exp and log in double."""
    rng = reference.case_rng("pools float64")
    empty_window = G(Family.MAX_POOL, 2, 2, (2,), (2,), (1,), (2,), dilation=(3,), batch=2)
    inputs, grad = reference.draw_inputs(rng, empty_window, FLOAT64), reference.draw_grad(rng, empty_window, FLOAT64)
    output, (grad_x,) = run(PoisonTape(dtype=FLOAT64), empty_window, inputs, grad)
    assert output.dtype == np.float64 and grad_x.dtype == np.float64
    assert np.isneginf(output[..., 1]).all() and np.isfinite(output[..., [0, 2]]).all()
    for geom in (empty_window,
                 G(Family.MAX_POOL, 2, 2, (20, 37), (17, 16), (1, 1), (8, 8)),
                 G(Family.AVG_POOL, 2, 2, (6, 32), (3, 5), (2, 3), (1, 2), batch=3),
                 G(Family.AVG_POOL, 2, 2, (9, 80), (2, 9), (1, 2), (1, 16), dilation=(2, 9)),
                 G(Family.SMOOTH_MAX_POOL, 2, 2, (5, 150), (3, 70), (1, 2), (1, 30), -0.7),
                 G(Family.SMOOTH_MAX_POOL, 3, 3, (5, 6, 8), (3, 2, 2), (1, 1, 2), (1, 1, 0), 0.5, batch=2)):
        check(geom, rng)
