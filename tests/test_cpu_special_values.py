"""Special values and extreme geometry on the CPU tape: inf and NaN follow SEMANTICS §3-§4 (IEEE
products of in-bounds terms only) and raise no NumPy warning; work is bounded by the in-bounds
terms, not by K or the padding; memory the machine cannot hold is a Result error."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import convgen
import numpy as np
import pytest
import reference
from convgen.backend import BackendError, OutOfMemory
from convgen.cpu import NumpyBackend
from convgen.geometry import Family

INF, NAN = np.inf, np.nan


@pytest.mark.parametrize("name", reference.SPECIAL_CASES)
def test_special_values_follow_semantics(name: str) -> None:
    case = reference.SPECIAL_CASES[name]
    out, grads = reference.run_on_tape(convgen.cpu.Tape(), case.geom, case.inputs, case.grad)
    np.testing.assert_array_equal(out, case.output)  # NaN equals NaN here
    for got, expected in zip(grads, case.grads, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", reference.SPECIAL_CASES)
def test_the_reference_agrees_on_special_values(name: str) -> None:
    case = reference.SPECIAL_CASES[name]
    out, grads = reference.run(case.geom, case.inputs, case.grad)
    np.testing.assert_array_equal(out, case.output)
    for got, expected in zip(grads, case.grads, strict=True):
        np.testing.assert_array_equal(got, expected)


def special(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal values with inf, -inf, NaN, zeros and float32's extremes mixed in."""
    values = reference.draw(rng, shape)
    extremes = np.array([INF, -INF, NAN, 0.0, 3e38, -3e38, 1e-45], np.float32)
    mask = rng.random(shape) < 0.4
    values[mask] = rng.choice(extremes, size=int(mask.sum()))
    return values


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("family", Family, ids=lambda f: f.value)
def test_no_warning_leaks_out_of_an_op(family: Family, rank: int) -> None:
    rng = reference.case_rng("special", family.value, rank)
    for _ in range(4):
        geom = reference.random_geometry(rng, family, rank, budget=150)
        inputs = tuple(special(rng, shape) for shape in geom.parent_shapes)
        reference.run_on_tape(convgen.cpu.Tape(), geom, inputs, special(rng, geom.output_shape))
    # Smooth max over [1, inf]: inf − inf inside, a NaN out, no warning.
    t, x = convgen.cpu.Tape().leaf(np.array([[1, INF]], np.float32))
    t, y = t.smooth_max_pool(x, 1.0, c=1, in_spatial=(2,), kernel=(2,), stride=(1,), padding=(0,)).unwrap()
    t.backward(y, np.ones((1, 1), np.float32)).unwrap()


def test_huge_windows_visit_only_the_real_cells() -> None:
    # 65535² offsets and 32767 cells of padding per side around one cell: one offset reaches it.
    t, x = convgen.cpu.Tape().leaf(np.array([[[3.0]]], np.float32))
    window = dict(c=1, in_spatial=(1, 1), kernel=(65535, 65535), stride=(1, 1), padding=(32767, 32767))
    for op, beta, expected, d_expected in (
        ("max_pool", (), 3.0, 1.0),
        ("avg_pool", (), 3.0 / 65535**2, 1.0 / 65535**2),
        ("smooth_max_pool", (1.0,), 3.0 + np.log1p((65535**2 - 1) * np.exp(-3.0)),
         1.0 / (1.0 + (65535**2 - 1) * np.exp(-3.0))),
    ):
        after, y = getattr(t, op)(x, *beta, **window).unwrap()
        np.testing.assert_allclose(after.value(y), [[[expected]]], rtol=1e-6)
        d_x = after.backward(y, np.ones((1, 1, 1), np.float32)).unwrap()[x]
        np.testing.assert_allclose(d_x, [[[d_expected]]], rtol=1e-6)
    kernel = np.zeros((1, 1, 65535), np.float32)
    kernel[0, 0, 32767] = 2.0  # the one offset that reaches the cell
    t, (w, b, x) = reference.record_leaves(convgen.cpu.Tape(), [kernel, np.ones(1, np.float32), np.ones((1, 1), np.float32)])
    t, y = t.conv(w, b, x, in_c=1, out_c=1, kernel=(65535,), stride=(1,), padding=(32767,), in_spatial=(1,)).unwrap()
    np.testing.assert_array_equal(t.value(y), [[3.0]])


class NumpyOutOfMemory(NumpyBackend):
    """Asks NumPy for an array no machine holds (8 EiB): NumPy's own MemoryError, which says its size."""

    def forward(self, geom, inputs):
        np.empty((2**20, 2**20, 1000))


class PlainOutOfMemory(NumpyBackend):
    def backward(self, geom, inputs, saved, grad):
        raise MemoryError


class DeviceOutOfMemory(NumpyBackend):
    def forward(self, geom, inputs):
        raise OutOfMemory(3 * 2**30)


def tape_on(backend: type[NumpyBackend]):
    tape_class = type(backend.__name__ + "Tape", (convgen.cpu.Tape,), {"backend_class": backend})
    return reference.record_leaves(tape_class(), [np.ones((1, 4), np.float32)])


POOL = dict(c=1, in_spatial=(4,), kernel=(2,), stride=(2,), padding=(0,))


def test_out_of_memory_is_an_error_naming_the_op() -> None:
    assert issubclass(OutOfMemory, BackendError) and OutOfMemory(3 * 2**30).needed_bytes == 3 * 2**30
    t, (x,) = tape_on(NumpyOutOfMemory)
    assert t.avg_pool(x, **POOL).error == "autograd: cpu: avg_pool: out of memory (needs 8192000.0 GiB)"
    t, (x,) = tape_on(DeviceOutOfMemory)
    assert t.max_pool(x, **POOL).error == "autograd: cpu: max_pool: out of memory (needs 3.0 GiB)"
    assert len(t) == 1
    t, (x,) = tape_on(PlainOutOfMemory)  # no size given: the output's, 2 float32 cells
    t, y = t.avg_pool(x, **POOL).unwrap()
    assert t.backward(y, np.ones((1, 2), np.float32)).error == "autograd: cpu: avg_pool: out of memory (needs 0.0 GiB)"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space limit via RLIMIT_AS")
def test_a_legal_geometry_too_large_for_memory_is_an_error() -> None:
    # 1×1 input, padding 30000: a 60001² float64 accumulator, 26.8 GiB, under a 4 GiB address-space limit.
    script = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        import convgen, numpy as np
        t = convgen.cpu.Tape()
        for shape in ((1, 1, 1, 1), (1,), (1, 1, 1)):
            t, _ = t.leaf(np.ones(shape, np.float32))
        r = t.conv(0, 1, 2, in_c=1, out_c=1, kernel=(1, 1), stride=(1, 1), padding=(30000, 30000), in_spatial=(1, 1))
        print(r.error, len(t), t.max_pool(2, c=1, in_spatial=(1, 1), kernel=(1, 1), stride=(1, 1), padding=(0, 0)).is_ok())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "autograd: cpu: conv: out of memory (needs 26.8 GiB) 3 True", done.stderr
