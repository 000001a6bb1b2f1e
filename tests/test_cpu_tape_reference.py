"""The CPU tape's public API on top of the NumPy backend: leaves are stored as float32 copies,
random ops of every family (empty outputs included) match the reference through `leaf`, the op,
`value` and `backward`, and the *2d* ops agree with the N-D ops."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from convgen.cpu import NumpyBackend, Tape
from convgen.geometry import Family, Geometry

BACKEND = NumpyBackend()


def test_store_makes_a_float32_copy() -> None:
    original = np.arange(6, dtype=np.float32).reshape(2, 3)
    stored = BACKEND.store(original)
    original[0, 0] = 9
    assert stored.dtype == np.float32 and stored.flags.c_contiguous and stored[0, 0] == 0
    np.testing.assert_array_equal(BACKEND.store([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]], np.float32))
    assert BACKEND.store(np.float64(0.1)).dtype == np.float32
    assert BACKEND.store(np.arange(4.0)[::2]).tolist() == [0, 2]
    assert BACKEND.device_of(stored) == "cpu"


def test_store_reads_dlpack_producers() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.arange(4, dtype=torch.float64)
    stored = BACKEND.store(tensor)
    tensor[0] = 7
    assert stored.dtype == np.float32 and stored.tolist() == [0, 1, 2, 3]
    assert BACKEND.device_of(tensor) == "cpu"


@pytest.mark.parametrize("rank", (1, 2, 4, 8))
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_random_ops_through_the_tape(family: Family, rank: int) -> None:
    rng = reference.case_rng("tape", family.value, rank)
    for _ in range(6):
        geom = reference.random_geometry(rng, family, rank, allow_empty=True)
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        output, grads = reference.run_on_tape(Tape(), geom, inputs, grad)
        assert output.dtype == np.float32 and output.shape == geom.output_shape
        if output.size == 0:  # an empty node passes zero gradients back
            for got, shape in zip(grads, geom.parent_shapes, strict=True):
                assert got.shape == shape and not got.any()
        else:
            reference.check_against_reference(geom, inputs, grad, output, grads)


def nd_and_2d(tape: Tape, family: Family, ids: tuple[int, ...], beta: float | None):
    """The same rank-2 op through the N-D and the *2d* entry point (3×4 input, 2×2 kernel,
    stride 2, padding 1)."""
    nd = dict(in_spatial=(3, 4), kernel=(2, 2), stride=(2, 2), padding=(1, 1))
    flat = dict(k_h=2, k_w=2, in_h=3, in_w=4, stride=2, padding=1)
    betas = () if beta is None else (beta,)
    if family.is_conv:
        name = family.value
        return (getattr(tape, name)(*ids, in_c=2, out_c=3, **nd),
                getattr(tape, f"{name}2d")(*ids, in_c=2, out_c=3, **flat))
    return (getattr(tape, family.value)(*ids, *betas, c=2, **nd),
            getattr(tape, f"{family.value}2d_pad")(*ids, *betas, in_c=2, **flat))


@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_2d_ops_match_the_nd_ops(family: Family) -> None:
    rng = reference.case_rng("2d", family.value)
    beta = 1.5 if family is Family.SMOOTH_MAX_POOL else None
    geom = Geometry.build(family, 2, 3 if family.is_conv else 2, (3, 4), (2, 2), (2, 2), (1, 1), beta)
    tape, ids = reference.record_leaves(Tape(), reference.draw_inputs(rng, geom))
    seed = reference.draw_grad(rng, geom)
    results = []
    for result in nd_and_2d(tape, family, ids, beta):
        after, out = result.unwrap()
        grads = after.backward(out, seed).unwrap()
        results.append([after.value(out), *(grads[i] for i in ids)])
    for nd, flat in zip(*results, strict=True):
        np.testing.assert_array_equal(nd, flat)
