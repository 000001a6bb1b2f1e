"""What the CUDA test modules share: the skip when there is no GPU, the poisoning tape, running an
op forward and backward (twice, bit-identical), the closeness check against the CPU tape, and tapes
whose plans are forced onto given tiles. Importing it skips the importing module without CuPy."""

from __future__ import annotations

import numpy as np
import pytest
import reference
import torch_oracle
from convgen.direct_model import no_direct
from convgen.geometry import MAX_RANK, Family, Geometry
from convgen.wgmma_tiles import no_wgmma
from forced_tiles import forced_chooser

cupy = pytest.importorskip("cupy")


def _has_gpu() -> bool:
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


import convgen.cpu  # noqa: E402  (after the skip: convgen.cuda needs CuPy only once a tape is made)
import convgen.cuda  # noqa: E402


class PoisonBackend(convgen.cuda.CupyBackend):
    """The CUDA backend with every output filled with NaN before its kernel runs."""

    poison_outputs = True


class FiniteWgmmaBackend(PoisonBackend):
    """PoisonBackend whose `_wgmma` kernels trap where a block takes the rare path (CONVGEN_TRAP_RARE_PATH): on
    finite values every block must finish on the tensor cores, which right results alone cannot show."""

    def _functions(self, source_name, symbols, options, device):
        return super()._functions(source_name, symbols, (*options, "-DCONVGEN_TRAP_RARE_PATH"), device)


class PoisonTape(convgen.cuda.Tape):
    backend_class = PoisonBackend


class GemmBackend(PoisonBackend):
    """Every conv stage an implicit GEMM: no small-channel direct kernel (the tests of the GEMMs' splits)."""

    direct_chooser = staticmethod(no_direct)


class GemmTape(PoisonTape):
    backend_class = GemmBackend


G = Geometry.build
RANKS = range(1, MAX_RANK + 1)
CASES_PER_RANK = 3  # the last one may have empty extents or channels


def host(array):
    return cupy.asnumpy(array) if isinstance(array, cupy.ndarray) else np.asarray(array)


def recorded(tape, geom: Geometry, inputs):
    """(tape, input ids, Result of the op) with `inputs` recorded as leaves."""
    ids = []
    for value in inputs:
        tape, node = tape.leaf(value)
        ids.append(node)
    return tape, ids, reference.apply_op(tape, geom, tuple(ids))


def run(tape, geom: Geometry, inputs, grad, *, repeat: int = 1):
    """The op's output and the gradients of its inputs as host arrays; with repeat=2 the backward
    runs twice and must give bit-identical gradients (SEMANTICS §4: no scheduling dependence)."""
    tape, ids, result = recorded(tape, geom, inputs)
    tape, out = result.unwrap()
    runs = []
    for _ in range(repeat):
        grads = tape.backward(out, grad).unwrap()
        runs.append([grads[i] for i in ids])
    for again in runs[1:]:
        for first, second in zip(runs[0], again):
            assert cupy.array_equal(first, second, equal_nan=True), f"{geom}: gradients differ between two runs"
    return host(tape.value(out)), [host(g) for g in runs[0]]


def assert_close_to(geom: Geometry, got, ref, ref_abs, rtol: float = reference.RTOL) -> None:
    """`got` = (output, grads) within docs/DESIGN.md's bound `rtol` of `ref`, scaled by `ref_abs` (the
    same computation on absolute values)."""
    names = ["output"] + [f"d{n}" for n in (("kernel", "bias", "input") if geom.family.is_conv else ("x",))]
    refs, scales = [ref[0], *ref[1]], [ref_abs[0], *ref_abs[1]]
    if geom.family is Family.SMOOTH_MAX_POOL:
        # Not a sum: on |x| the result can be far smaller than on x, and float32 expf/logf err
        # relative to the result itself, so the result joins the scale.
        scales = [np.abs(r) + np.abs(a) for r, a in zip(refs, scales)]
    pairs = zip(names, [got[0], *got[1]], refs, scales, strict=True)
    failures = [f"{name}: {err}" for name, g, r, a in pairs
                if (err := reference.close_error(g, r, a, rtol)) is not None]
    assert not failures, f"{geom}: " + "; ".join(failures)


RTOLS = {"float32": reference.RTOL, "float64": reference.RTOL_FLOAT64}


def check_against_cpu(geom: Geometry, rng: np.random.Generator, tape_class=PoisonTape, dtype: str = "float32") -> None:
    """Forward and gradients (twice, bit-identical) of a `dtype` CUDA tape against a `dtype` CPU tape."""
    inputs, grad = reference.draw_inputs(rng, geom, dtype), reference.draw_grad(rng, geom, dtype)
    got = run(tape_class(dtype=dtype), geom, inputs, grad, repeat=2)
    assert all(array.dtype == dtype for array in (got[0], *got[1])), geom
    ref = run(convgen.cpu.Tape(dtype=dtype), geom, inputs, grad)
    ref_abs = run(convgen.cpu.Tape(dtype=dtype), geom, [np.abs(a) for a in inputs], np.abs(grad))
    assert_close_to(geom, got, ref, ref_abs, RTOLS[dtype])


def forced_tape(tile, precision: str = "highest") -> type:
    """A poisoning tape whose plans take `tile` on every GEMM stage, the direct-form ones included (no
    direct or `_wgmma` kernel; its own backend, so its own module cache), computing in `precision`."""

    class Backend(PoisonBackend):
        tile_chooser = staticmethod(forced_chooser(*tile))
        direct_chooser = staticmethod(no_direct)
        wgmma_chooser = staticmethod(no_wgmma)

    class ForcedTape(PoisonTape):
        backend_class = Backend

        def __init__(self, *, dtype: str = "float32") -> None:
            super().__init__(dtype=dtype, precision=precision)

    return ForcedTape


def same_error(got, expected) -> bool:
    """The two tapes' messages agree once the tape names are swapped (`cuda: ` for `cpu: `, the
    buffer labels), whatever detail the messages carry."""
    return got.error.replace("cuda", "cpu").replace("CUDA", "CPU") == expected.error


def check_against_torch_cuda(draw, rng: np.random.Generator, cases: int) -> None:
    """`cases` geometries from `draw(rng)` that torch accepts, each against PyTorch's CUDA ops in
    strict float32 (TF32 off), scaled by the CPU tape on absolute values."""
    torch = pytest.importorskip("torch")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    checked = 0
    while checked < cases:
        geom = draw(rng)
        if not torch_oracle.accepts(geom):
            continue
        checked += 1
        inputs, grad = reference.draw_inputs(rng, geom), reference.draw_grad(rng, geom)
        got = run(PoisonTape(), geom, inputs, grad)
        ref_abs = run(convgen.cpu.Tape(), geom, [np.abs(a) for a in inputs], np.abs(grad))
        assert_close_to(geom, got, torch_oracle.run(torch, geom, inputs, grad, device="cuda"), ref_abs)

