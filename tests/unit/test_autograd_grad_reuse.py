"""Leaf gradients without copies: ``.grad`` takes the backward's own array when nothing else
references it (the refcount rule of disttensor.core.buffer_pool) and accumulates in place
into a ``.grad`` that only its tensor holds; a gradient the user or a hook holds, or one
shared by two leaves, is copied as before, and every value matches a float64 reference."""
from __future__ import annotations

import numpy as np

from disttensor.autograd import Tensor
from disttensor.autograd import tensor as T


def spy(monkeypatch):
    seen = []
    orig = T._add_into_grad

    def add(t, g, owned=False):
        seen.append(owned)
        return orig(t, g, owned)
    monkeypatch.setattr(T, "_add_into_grad", add)
    return seen


def test_fresh_gradient_is_adopted(monkeypatch):
    seen = spy(monkeypatch)
    xv = np.arange(12.0).reshape(3, 4)
    w = Tensor(np.ones((3, 4)), requires_grad=True)
    (w * Tensor(xv)).sum().backward()
    assert seen == [True]
    np.testing.assert_array_equal(w.grad, xv)


def test_shared_gradient_is_not_aliased(monkeypatch):
    seen = spy(monkeypatch)
    a = Tensor(np.zeros(5), requires_grad=True)
    b = Tensor(np.zeros(5), requires_grad=True)
    (a + b).sum().backward()        # the add hands one array to both leaves
    assert not np.shares_memory(a.grad, b.grad)
    a.grad[...] = 7
    np.testing.assert_array_equal(b.grad, np.ones(5))
    assert False in seen


def test_user_array_and_hook_keep_theirs(monkeypatch):
    spy(monkeypatch)
    keep = np.arange(4.0)
    u = Tensor(np.zeros(4), requires_grad=True)
    u.backward(keep)                 # a leaf's own gradient: the user's array
    assert not np.shares_memory(u.grad, keep)
    kept = []
    v = Tensor(np.ones(4), requires_grad=True)
    v.register_hook(lambda g: kept.append(g))
    (v * Tensor(np.full(4, 3.0))).sum().backward()
    assert kept and not np.shares_memory(v.grad, kept[0])


def test_accumulation_in_place_unless_held():
    xv = np.linspace(-1, 1, 6)
    w = Tensor(np.ones(6), requires_grad=True)
    ref = np.zeros(6)
    for k in range(1, 4):
        (w * Tensor(xv * k)).sum().backward()
        ref += xv * k
        np.testing.assert_allclose(w.grad, ref, rtol=1e-15)
    before = w.grad
    snapshot = before.copy()
    (w * Tensor(xv)).sum().backward()    # the user holds the old .grad: a new array
    np.testing.assert_array_equal(before, snapshot)
    np.testing.assert_allclose(w.grad, ref + xv, rtol=1e-15)
    del before
    ident = id(w.grad)
    (w * Tensor(xv)).sum().backward()    # held by w alone: summed in place
    assert id(w.grad) == ident
    np.testing.assert_allclose(w.grad, ref + 2 * xv, rtol=1e-15)


def test_dtype_mismatch_promotes_as_before():
    w = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    w.grad = np.zeros(3, dtype=np.float32)
    T._add_into_grad(w, np.full(3, 0.1), owned=False)     # float64 into float32: new array
    assert w.grad.dtype == np.float64
