"""float16 and bfloat16 on the CUDA backend (`pytest -m cuda`, skipped without CuPy or a GPU): every family
at every rank 1..8 with SEMANTICS §8 arguments mixed in, the convolutions in "highest" (FMAs in float32)
and "medium" (few channels: the TF32 mma on widened values; 16 and more: the 16-bit mma, cases of their
own, kept off the wgmma kernels), each output and gradient in the 16-bit dtype and
within issue 11's 1e-2 of the float64 CPU tape on the same values (tests/half_support.py); outputs are
poisoned with NaN first, and a second run gives the same bits; Hopper's wgmma kernels, where 16-bit elements
multiply as themselves (k16), likewise at every rank."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import reference
from convgen.cuda_launch import CUDA_SOURCES, nvrtc_options, plan
from convgen.geometry import Family, Geometry
from convgen.wgmma_tiles import choose_wgmma, no_wgmma
from cuda_support import RANKS, FiniteWgmmaBackend, PoisonBackend, _has_gpu, host
from forced_tiles import tensor_core_geometry
from half_support import HALF_DTYPES, draw_half, relative_errors, run_backend
from precision_bounds import HALF_BOUND

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

import convgen.cuda  # noqa: E402  (after the skip)
import cupy  # noqa: E402

CASES_PER_RANK = 2


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_16_bit_elements_within_the_bound_at_every_rank(family: Family, rank: int, dtype: str) -> None:
    rng = reference.case_rng("cuda 16-bit", family.value, rank, dtype)
    for _ in range(CASES_PER_RANK):
        geom = reference.random_geometry(rng, family, rank, budget=300, extended=True)
        inputs, grad = draw_half(rng, geom, dtype)
        for precision in ("highest", "medium") if family.is_conv else ("highest",):
            backend = PoisonBackend(dtype, precision)
            errors = relative_errors(backend, geom, inputs, grad)
            assert max(errors) <= HALF_BOUND, f"{geom} {precision}: {errors}"
            first, again = (run_backend(backend, geom, inputs, grad) for _ in range(2))
            for a, b in zip(first, again, strict=True):
                np.testing.assert_array_equal(host(a).view(np.uint16), host(b).view(np.uint16))


class MmaSyncBackend(PoisonBackend):
    """The 16-bit mma.sync (m16n8k16) on every stage that takes it: no wgmma kernel."""

    wgmma_chooser = staticmethod(no_wgmma)


def _mma_geometries(rank: int) -> list[Geometry]:
    """A conv and a transpose with channels for whole k steps of 16 (so "medium" is the 16-bit mma), kernel
    2 on the first two axes, stride 2 with padding and output padding on the first."""
    spatial = (5, 4, 3, 2, 2, 2, 2, 2)[:rank]
    kernel = tuple(2 if axis < 2 else 1 for axis in range(rank))
    stride = tuple(2 if axis == 0 else 1 for axis in range(rank))
    padding = tuple(1 if axis == 0 else 0 for axis in range(rank))
    return [Geometry.build(Family.CONV, 16, 32, spatial, kernel, stride, padding, batch=2),
            Geometry.build(Family.CONV_TRANSPOSE, 32, 16, spatial, kernel, stride, padding, batch=2,
                           output_padding=padding)]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("rank", RANKS)
def test_16_bit_mma_within_the_bound_at_every_rank(rank: int, dtype: str) -> None:
    rng = reference.case_rng("cuda 16-bit mma", rank, dtype)
    for geom in _mma_geometries(rank):
        assert plan(geom, dtype=dtype, precision="medium").defines["MMA_MODE"] == 2
        inputs, grad = draw_half(rng, geom, dtype)
        backend = MmaSyncBackend(dtype, "medium")
        errors = relative_errors(backend, geom, inputs, grad)
        assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
        first, again = (run_backend(backend, geom, inputs, grad) for _ in range(2))
        for a, b in zip(first, again, strict=True):
            np.testing.assert_array_equal(host(a).view(np.uint16), host(b).view(np.uint16))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", (Family.CONV, Family.CONV_TRANSPOSE), ids=lambda f: f.value)
def test_16_bit_on_wgmma_within_the_bound_at_every_rank(family: Family, rank: int, dtype: str) -> None:
    """16-bit elements multiply as themselves on the `_wgmma` kernels (k16, B in the 64-byte swizzle): every stage
    within issue 11's 1e-2 of the float64 CPU tape on the same values, no block on the rare path, and a second run
    gives the same bits."""
    geom = tensor_core_geometry(family, rank)
    device = cupy.cuda.Device()
    hardware = convgen.cuda.device_hardware(device.attributes, device.compute_capability)
    if not hardware.wgmma:
        pytest.skip(f"compute capability {device.compute_capability}: no wgmma")
    launches = plan(geom, hardware, dtype=dtype, precision="medium").launches
    assert all(launches[s].kernel == f"{s}_wgmma" for s in ("forward", "backward_input", "backward_weight"))
    inputs, grad = draw_half(reference.case_rng("cuda 16-bit wgmma", family.value, rank, dtype), geom, dtype)
    backend = FiniteWgmmaBackend(dtype, "medium")  # and no block falls to the rare path
    errors = relative_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
    first, again = (run_backend(backend, geom, inputs, grad) for _ in range(2))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(host(a).view(np.uint16), host(b).view(np.uint16))


@pytest.mark.parametrize("shift", [False, True], ids=["gathered rows", "shifted rows"])
@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("family", (Family.CONV, Family.CONV_TRANSPOSE), ids=lambda f: f.value)
def test_16_bit_channels_last_sources_within_the_bound_at_every_rank(family: Family, rank: int, shift: bool) -> None:
    """The same geometries with every conv-shaped stage reading its source channels-last (by rule only from 700
    products a source element: here from rank 5), each slice's rows staged for one window offset or, with `shift`,
    for every offset of the last axis (WG_SHIFT), bfloat16: within issue 11's bound, the same bits run after run (the
    transpose's two gradients share one copy of the upstream gradient)."""
    geom = tensor_core_geometry(family, rank)
    device = cupy.cuda.Device()
    hardware = convgen.cuda.device_hardware(device.attributes, device.compute_capability)
    if not hardware.wgmma:
        pytest.skip(f"compute capability {device.compute_capability}: no wgmma")
    chooser = functools.partial(choose_wgmma, channels_last_min_uses=0, shift=shift)
    made = plan(geom, hardware, dtype="bfloat16", precision="medium", wgmma_chooser=chooser)
    assert [made.defines[f"{prefix}_WG_CHANNELS_LAST"] for prefix in ("FWD", "BWI", "BWW")] == [1, 1, 1]
    assert [made.defines[f"{prefix}_WG_SHIFT"] for prefix in ("FWD", "BWI")] == [int(shift)] * 2
    inputs, grad = draw_half(reference.case_rng("cuda 16-bit channels-last", family.value, rank), geom, "bfloat16")
    backend = type("ChannelsLastBackend", (FiniteWgmmaBackend,), {"wgmma_chooser": staticmethod(chooser)})(
        "bfloat16", "medium")
    errors = relative_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
    first, again = (run_backend(backend, geom, inputs, grad) for _ in range(2))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(host(a).view(np.uint16), host(b).view(np.uint16))


@pytest.mark.parametrize("family", (Family.CONV, Family.CONV_TRANSPOSE), ids=lambda f: f.value)
def test_16_bit_shifted_slices_in_three_stages_within_the_bound(family: Family) -> None:
    """A k5 window over 64 channels, shifted channels-last (B's five offsets take three slices in shared memory),
    bfloat16: within issue 11's bound, no block on the rare path, the same bits run after run."""
    geom = Geometry.build(family, 64, 64, (300,), (5,), (1,), (2,), batch=3)
    device = cupy.cuda.Device()
    hardware = convgen.cuda.device_hardware(device.attributes, device.compute_capability)
    if not hardware.wgmma:
        pytest.skip(f"compute capability {device.compute_capability}: no wgmma")
    chooser = functools.partial(choose_wgmma, channels_last_min_uses=0)
    made = plan(geom, hardware, dtype="bfloat16", precision="medium", wgmma_chooser=chooser)
    assert [made.defines[f"{prefix}_WG_{field}"] for prefix in ("FWD", "BWI") for field in ("SHIFT", "STAGES")] == [
        1, 3, 1, 3]
    inputs, grad = draw_half(reference.case_rng("cuda 16-bit three stages", family.value), geom, "bfloat16")
    backend = type("ShiftedBackend", (FiniteWgmmaBackend,), {"wgmma_chooser": staticmethod(chooser)})(
        "bfloat16", "medium")
    errors = relative_errors(backend, geom, inputs, grad)
    assert max(errors) <= HALF_BOUND, f"{geom}: {errors}"
    first, again = (run_backend(backend, geom, inputs, grad) for _ in range(2))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(host(a).view(np.uint16), host(b).view(np.uint16))


NARROWING_CHECK = r"""
extern "C" __global__ void narrowing_mismatches(unsigned long long* mismatches)
{
    // 4096 float bit patterns a thread: the finite ones whose narrowed_finite differs from narrowed.
    const unsigned first = (blockIdx.x * blockDim.x + threadIdx.x) * 4096u;
    unsigned count = 0;
    for (unsigned i = 0; i < 4096u; ++i) {
        const float x = __uint_as_float(first + i);
        if (isfinite(x) && narrowed_finite(x).bits != narrowed(x).bits) ++count;
    }
    if (count != 0) atomicAdd(mismatches, (unsigned long long)count);
}
"""


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_one_cvt_narrows_every_finite_float_to_the_bits_of_the_integer_rounding(dtype: str) -> None:
    """The 16-bit wgmma kernels' staged stores narrow their (finite) results in one cvt (`narrowed_finite`), every
    other store by `narrowed`'s integer rounding, which the CPU emulation runs too: on the GPU both give the same 16
    bits for each of the 2^32 float patterns that is finite (inf and NaN skipped: narrowed_finite never sees them)."""
    geom = Geometry.build(Family.CONV, 1, 1, (4,), (3,), (1,), (1,))
    source = (CUDA_SOURCES / "conv_r1.cu").read_text() + NARROWING_CHECK
    module = cupy.RawModule(code=source, options=nvrtc_options(plan(geom, dtype=dtype)))
    mismatches = cupy.zeros(1, dtype=cupy.uint64)
    threads = 256
    module.get_function("narrowing_mismatches")(((1 << 32) // 4096 // threads,), (threads,), (mismatches,))
    assert int(mismatches.get()[0]) == 0
