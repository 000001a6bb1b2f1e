"""The tape as a value and its backward rules (SEMANTICS §6), on the CPU tape. Expected gradients
are worked out by hand for ops whose gradient is a plain sum (avg pool, bias)."""

from __future__ import annotations

import convgen
import numpy as np
import pytest

POOL = dict(c=1, in_spatial=(4,), kernel=(2,), stride=(2,), padding=(0,))


def test_the_documented_example():
    t = convgen.cpu.Tape()
    t, k = t.leaf(np.ones((1, 1, 2, 2), np.float32))
    t, b = t.leaf(np.zeros(1, np.float32))
    t, x = t.leaf(np.arange(9, dtype=np.float32), shape=(1, 3, 3))
    r = t.conv2d(k, b, x, in_c=1, out_c=1, k_h=2, k_w=2, stride=1, padding=0, in_h=3, in_w=3)
    assert r.is_ok() and r.error is None
    t2, y = r.unwrap()
    np.testing.assert_array_equal(t2.value(y), [[[8, 12], [20, 24]]])
    grads = t2.backward(y, np.ones((1, 2, 2), np.float32)).unwrap()
    assert [g.shape for g in grads] == [(1, 1, 2, 2), (1,), (1, 3, 3), (1, 2, 2)]
    np.testing.assert_array_equal(grads[b], [4])
    np.testing.assert_array_equal(grads[x], [[[1, 2, 1], [2, 4, 2], [1, 2, 1]]])
    np.testing.assert_array_equal(grads[k], [[[[8, 12], [20, 24]]]])


def test_ops_return_new_tapes_and_old_ones_stay_valid():
    t0 = convgen.cpu.Tape()
    t1, a = t0.leaf(np.array([[1, 2, 3, 4]], np.float32))
    t2, p = t1.avg_pool(a, **POOL).unwrap()
    t3, q = t1.max_pool(a, **POOL).unwrap()  # branch from the older tape
    assert (len(t0), len(t1), len(t2), len(t3)) == (0, 1, 2, 2)
    assert a == 0 and p == 1 and q == 1
    assert t2.name(p) == "avg_pool" and t3.name(q) == "max_pool"
    np.testing.assert_array_equal(t2.value(p), [[1.5, 3.5]])
    np.testing.assert_array_equal(t3.value(q), [[2, 4]])
    t4, r = t2.avg_pool(p, **dict(POOL, in_spatial=(2,))).unwrap()
    assert r == 2 and t4.parents(r) == (p,) and len(t2) == 2
    with pytest.raises(convgen.TapeError, match="^autograd: invalid node id$"):
        t1.value(p)


def test_leaf_stores_a_float32_copy():
    source = np.array([[1.0, 2.0]], np.float64)
    t, a = convgen.cpu.Tape().leaf(source, name="a")
    source[0, 0] = 99
    assert t.value(a).dtype == np.float32 and t.value(a)[0, 0] == 1 and t.name(a) == "a"


def test_unwrap_raises_tape_error_with_the_message():
    t, a = convgen.cpu.Tape().leaf(np.ones((1, 4), np.float32))
    result = t.avg_pool(a, **dict(POOL, stride=(0,)))
    with pytest.raises(convgen.TapeError) as info:
        result.unwrap()
    assert str(info.value) == "autograd: cpu: avg_pool: stride must be > 0"


def test_backward_rejections():
    t, a = convgen.cpu.Tape().leaf(np.ones((1, 4), np.float32))
    t, p = t.avg_pool(a, **POOL).unwrap()
    assert t.backward(5, np.ones((1, 2), np.float32)).error == "autograd: invalid output id"
    assert t.backward(-1, np.ones((1, 2), np.float32)).error == "autograd: invalid output id"
    assert t.backward(p, np.ones((2, 1), np.float32)).error == "autograd: seed gradient shape mismatch for output"


def test_contributions_add_up_and_frozen_leaves_get_none():
    t = convgen.cpu.Tape()
    t, w = t.leaf(np.full((1, 1, 1), 3, np.float32))  # a 1x1 kernel used by both layers
    t, b = t.leaf(np.zeros(1, np.float32), requires_grad=False)
    t, x = t.leaf(np.array([[2.0]], np.float32))
    t, unused = t.leaf(np.array([[1.0]], np.float32))
    geometry = dict(in_c=1, out_c=1, kernel=(1,), stride=(1,), padding=(0,), in_spatial=(1,))
    t, y1 = t.conv(w, b, x, **geometry).unwrap()
    t, y2 = t.conv(w, b, y1, **geometry).unwrap()  # y2 = w * w * x
    grads = t.backward(y2, np.ones((1, 1), np.float32)).unwrap()
    np.testing.assert_array_equal(t.value(y2), [[18]])
    np.testing.assert_array_equal(grads[w], [[[12]]])  # 2 * w * x, one contribution per layer
    np.testing.assert_array_equal(grads[x], [[9]])
    np.testing.assert_array_equal(grads[y1], [[3]])
    np.testing.assert_array_equal(grads[b], [0])  # requires_grad=False: contributions dropped
    np.testing.assert_array_equal(grads[unused], [[0]])  # not an ancestor of y2


def test_nodes_after_the_output_and_off_its_path_get_zeros():
    t, a = convgen.cpu.Tape().leaf(np.array([[1, 2, 3, 4]], np.float32))
    t, p = t.avg_pool(a, **POOL).unwrap()
    t, q = t.max_pool(a, **POOL).unwrap()
    grads = t.backward(p, np.array([[2, 4]], np.float32)).unwrap()
    np.testing.assert_array_equal(grads[a], [[1, 1, 2, 2]])
    np.testing.assert_array_equal(grads[q], [[0, 0]])
    assert len(grads) == 3


def test_empty_output_is_recorded_and_passes_back_zeros():
    t, a = convgen.cpu.Tape().leaf(np.ones((2, 3), np.float32))
    t, p = t.max_pool(a, c=2, in_spatial=(3,), kernel=(3,), stride=(1,), padding=(2,)).unwrap()  # p > k//2
    assert t.shape(p) == (2, 0) and t.value(p).size == 0
    grads = t.backward(p, np.zeros((2, 0), np.float32)).unwrap()
    np.testing.assert_array_equal(grads[a], np.zeros((2, 3)))


def test_seed_on_a_leaf_is_returned_for_that_leaf():
    t, a = convgen.cpu.Tape().leaf(np.ones((1, 2), np.float32), requires_grad=False)
    grads = t.backward(a, np.array([[5, 6]], np.float32)).unwrap()
    np.testing.assert_array_equal(grads[a], [[5, 6]])
