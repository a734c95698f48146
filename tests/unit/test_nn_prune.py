"""disttensor.nn.prune on one process: amounts and rounding against PyTorch's documented rules
(re-implemented here in NumPy), which entries each method prunes, masks held by every
optimizer through 100 steps (checked against a NumPy float64 reference of the masked update),
deepcopy, remove, global pruning, the gradual schedule, and the errors."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor import nn
from disttensor.nn import prune
from disttensor.nn.optim import SGD, Adam, AdamW


def ref_count(amount, n):
    """PyTorch's _compute_nparams_toprune: an int as it is, a float round(amount * n)."""
    return amount if isinstance(amount, int) else round(amount * n)


def linear(fin=6, fout=5, seed=0, dtype="float64"):
    return nn.Linear(fin, fout, dtype=dtype, rng=np.random.default_rng(seed))


def zeros_of(m, name="weight"):
    return int((prune.mask_of(m, name) == 0).sum())


@settings(max_examples=40, deadline=None)
@given(fin=st.integers(1, 9), fout=st.integers(1, 9), seed=st.integers(0, 2 ** 16),
       amount=st.one_of(st.sampled_from([0.0, 1.0, 0.5, 0.25, 0.125, 0.9]),
                        st.floats(0, 1), st.integers(0, 4)))
def test_l1_unstructured_prunes_the_smallest(fin, fout, seed, amount):
    m = linear(fin, fout, seed)
    if isinstance(amount, int) and amount > fin * fout:
        with pytest.raises(ValueError, match="should be smaller"):
            prune.l1_unstructured(m, "weight", amount)
        return
    w0 = m.weight.data.copy()
    prune.l1_unstructured(m, "weight", amount)
    k = ref_count(amount, w0.size)
    mask = prune.mask_of(m, "weight")
    assert zeros_of(m) == k
    order = np.argsort(np.abs(w0).ravel(), kind="stable")
    expect = np.ones(w0.size)
    expect[order[:k]] = 0
    np.testing.assert_array_equal(mask.ravel(), expect)
    np.testing.assert_array_equal(m.weight.data, w0 * expect.reshape(w0.shape))
    assert mask.dtype == w0.dtype and prune.is_pruned(m)


def test_rounding_is_half_to_even_and_pruning_compounds():
    m = linear(5, 1)  # 5 entries: 0.5 -> round(2.5) = 2
    prune.l1_unstructured(m, "weight", 0.5)
    assert zeros_of(m) == 2
    m = linear(7, 1)  # 7 entries: 0.5 -> round(3.5) = 4
    prune.l1_unstructured(m, "weight", 0.5)
    assert zeros_of(m) == 4
    m = linear(8, 5)  # 40 -> 20 pruned; then half of the 20 left -> 30
    prune.l1_unstructured(m, "weight", 0.5)
    prune.l1_unstructured(m, "weight", 0.5)
    assert zeros_of(m) == 30
    prune.l1_unstructured(m, "weight", 3)
    assert zeros_of(m) == 33


@pytest.mark.parametrize("amount,exc", [(-0.1, ValueError), (1.5, ValueError),
                                        (-1, ValueError), ("0.5", TypeError),
                                        (True, TypeError)])
def test_bad_amounts(amount, exc):
    m = linear()
    with pytest.raises(exc):
        prune.l1_unstructured(m, "weight", amount)
    with pytest.raises(exc):
        prune.random_unstructured(m, "weight", amount)
    with pytest.raises(exc):
        prune.ln_structured(m, "weight", amount, 2, 0)
    assert not prune.is_pruned(m)


def test_other_errors():
    m = linear()
    with pytest.raises(ValueError, match="does not fit"):
        prune.custom_from_mask(m, "weight", np.ones((6, 5)))
    with pytest.raises(ValueError, match="has to be pruned"):
        prune.remove(m, "weight")
    with pytest.raises(ValueError, match="multidimensional"):
        prune.ln_structured(m, "bias", 0.5, 2, 0)
    with pytest.raises(AttributeError):
        prune.l1_unstructured(m, "nothing", 0.5)
    with pytest.raises(ValueError, match="same shape"):
        prune.l1_unstructured(m, "weight", 0.5, importance_scores=np.ones(3))
    with pytest.raises(TypeError, match="unstructured"):
        prune.global_unstructured([(m, "weight")], prune.LnStructured, amount=0.5, n=2, dim=0)
    assert not prune.is_pruned(m)


@pytest.mark.parametrize("n", [1, 2, np.inf, "fro"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_ln_structured_prunes_channels(n, dim):
    conv = nn.Conv3d(3, 6, 2, dtype="float64", rng=np.random.default_rng(3))
    w0 = conv.weight.data.copy()
    prune.ln_structured(conv, "weight", 0.5, n, dim)
    d = dim % w0.ndim
    rows = np.moveaxis(w0, d, 0).reshape(w0.shape[d], -1)
    p = 2 if n == "fro" else n
    norms = (np.abs(rows).max(axis=1) if p == np.inf
             else (np.abs(rows) ** p).sum(axis=1) ** (1 / p))
    k = round(0.5 * w0.shape[d])
    pruned = np.argsort(norms, kind="stable")[:k]
    expect = np.ones(w0.shape[d])
    expect[pruned] = 0
    shape = [1] * w0.ndim
    shape[d] = -1
    np.testing.assert_array_equal(prune.mask_of(conv, "weight"),
                                  np.broadcast_to(expect.reshape(shape), w0.shape))
    # a second call prunes among the channels left
    prune.ln_structured(conv, "weight", 1, n, dim)
    alive = np.moveaxis(prune.mask_of(conv, "weight"), d, 0).reshape(w0.shape[d], -1)
    assert int((alive.sum(axis=1) == 0).sum()) == k + 1


def test_random_unstructured_count_and_seed():
    a, b = linear(), linear()
    prune.random_unstructured(a, "weight", 0.4, rng=np.random.default_rng(7))
    prune.random_unstructured(b, "weight", 0.4, rng=np.random.default_rng(7))
    assert zeros_of(a) == 12
    np.testing.assert_array_equal(prune.mask_of(a, "weight"), prune.mask_of(b, "weight"))


def test_global_unstructured_ranks_all_entries():
    a, b = linear(6, 5, 1), linear(4, 3, 2)
    b.weight.data *= 3  # b's entries are mostly larger: global pruning takes more of a's
    ws = np.concatenate([a.weight.data.ravel(), b.weight.data.ravel()])
    prune.global_unstructured([(a, "weight"), (b, "weight")], prune.L1Unstructured,
                              amount=0.6)
    k = round(0.6 * ws.size)
    expect = np.ones(ws.size)
    expect[np.argsort(np.abs(ws), kind="stable")[:k]] = 0
    got = np.concatenate([prune.mask_of(a, "weight").ravel(),
                          prune.mask_of(b, "weight").ravel()])
    np.testing.assert_array_equal(got, expect)
    assert zeros_of(a) != round(0.6 * 30)  # not per layer
    assert prune.sparsity([(a, "weight"), (b, "weight")]) == k / ws.size


def ref_masked_run(kind, w, masks, grads, lr, wd):
    """Plain float64 reference: the optimizer's rule on masked gradients (``masks[t]`` at step
    ``t``), weights masked before and after each step (PyTorch's behaviour for weight_orig *
    mask, up to the pruned entries of weight_orig, which stay 0 here)."""
    w = w.copy()
    buf = m = v = None
    for t, (g, mask) in enumerate(zip(grads, masks), start=1):
        w = w * mask
        g = g * mask
        if kind == "sgd":
            g = g + wd * w
            buf = g.copy() if buf is None else 0.9 * buf + g
            w = w - lr * buf
        else:
            if kind == "adamw":
                w = w * (1 - lr * wd)
            else:
                g = g + wd * w
            m = (0 if m is None else 0.9 * m) + 0.1 * g
            v = (0 if v is None else 0.999 * v) + 0.001 * g * g
            w = w - lr / (1 - 0.9 ** t) * (m / (np.sqrt(v) / np.sqrt(1 - 0.999 ** t) + 1e-8))
        w = w * mask
    return w


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("in_backward", [False, True])
def test_masks_hold_through_100_steps(kind, in_backward):
    """20 unpruned steps build up momentum / moments, then pruning, then 100 steps: the
    optimizer state at pruned entries must not revive them."""
    m = linear(8, 6, 4)
    w0 = m.weight.data.copy()
    lr, wd = 0.05, 0.1
    opt = {"sgd": lambda p: SGD(p, lr=lr, momentum=0.9, weight_decay=wd),
           "adam": lambda p: Adam(p, lr=lr, weight_decay=wd),
           "adamw": lambda p: AdamW(p, lr=lr, weight_decay=wd)}[kind]([m.weight])
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=w0.shape) for _ in range(120)]
    masks = [np.ones(w0.shape)] * 20
    for t, g in enumerate(grads):
        if t == 20:
            prune.l1_unstructured(m, "weight", 0.7)
            mask = prune.mask_of(m, "weight").copy()
            masks += [mask] * 100
            w_pruned = m.weight.data.copy()
        if in_backward:
            opt.step_parameter(m.weight, g)
        else:
            m.weight.grad = g.copy()
            opt.step()
    w = m.weight.data
    assert zeros_of(m) == round(0.7 * 48)
    assert np.all(w[mask == 0] == 0) and np.all(w[mask != 0] != w_pruned[mask != 0])
    np.testing.assert_allclose(w, ref_masked_run(kind, w0, masks, grads, lr, wd),
                               rtol=1e-10, atol=1e-12)


def test_state_dict_deepcopy_and_remove():
    model = nn.Sequential(linear(6, 5, 0), nn.ReLU(), linear(5, 2, 1))
    prune.l1_unstructured(model[0], "weight", 0.5)
    sd = model.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "0.weight_mask", "2.weight", "2.bias"]
    twin = copy.deepcopy(model)
    assert prune.mask_of(twin[0], "weight") is not prune.mask_of(model[0], "weight")
    prune.l1_unstructured(twin[0], "weight", 1.0)  # the copy's mask only
    assert zeros_of(model[0]) == 15 and zeros_of(twin[0]) == 30
    opt = SGD(list(twin.parameters()), lr=0.1)
    for p in twin.parameters():
        p.grad = np.ones_like(p.data)
    opt.step()
    assert np.all(twin[0].weight.data == 0)
    assert np.count_nonzero(model[0].weight.data) == 15
    # the state dict loads into an identically pruned model
    other = nn.Sequential(linear(6, 5, 9), nn.ReLU(), linear(5, 2, 9))
    prune.identity(other[0], "weight")
    other.load_state_dict(sd)
    np.testing.assert_array_equal(other[0].weight.data, model[0].weight.data)
    np.testing.assert_array_equal(prune.mask_of(other[0], "weight"),
                                  prune.mask_of(model[0], "weight"))
    # remove: the zeros stay, the mask goes, and updates reach the pruned entries again
    prune.remove(model[0], "weight")
    assert "0.weight_mask" not in model.state_dict() and not prune.is_pruned(model)
    assert np.count_nonzero(model[0].weight.data) == 15
    opt = SGD([model[0].weight], lr=0.1)
    model[0].weight.grad = np.ones((5, 6))
    opt.step()
    assert np.count_nonzero(model[0].weight.data) == 30


def ref_schedule(t, sf, t0, t1, dt, si):
    n = (t1 - t0) // dt
    if t < t0 or (t - t0) % dt or (t - t0) // dt > n:
        return None
    return sf if n == 0 else sf + (si - sf) * (1 - (t - t0) / (n * dt)) ** 3


@pytest.mark.parametrize("t0,t1,dt,si", [(0, 40, 10, 0.0), (5, 35, 7, 0.2), (3, 3, 4, 0.0)])
def test_gradual_schedule(t0, t1, dt, si):
    model = nn.Sequential(linear(10, 8, 0), nn.ReLU(), linear(8, 4, 1))
    sched = prune.GradualPruning(model, 0.9, t0, t1, dt, initial_sparsity=si)
    sizes = [80, 32]
    seen = []
    for t in range(t1 + 2 * dt + 1):
        target = sched.step()
        want = ref_schedule(t, 0.9, t0, t1, dt, si)
        assert (target is None) == (want is None)
        if want is not None:
            assert target == pytest.approx(want, rel=1e-12)
            seen.append(want)
            for (m, _), n in zip(sched.pairs, sizes):
                assert zeros_of(m) == round(want * n)
    assert seen[-1] == pytest.approx(0.9) and seen == sorted(seen)
    assert sched.sparsity() == pytest.approx((72 + round(0.9 * 32)) / 112)


def test_gradual_global_scope_and_errors():
    model = nn.Sequential(linear(10, 8, 0), nn.ReLU(), linear(8, 4, 1))
    sched = prune.GradualPruning(model, 0.5, 0, 0, 1, scope="global")
    assert sched.step() == 0.5
    assert sched.sparsity() == round(0.5 * 112) / 112
    for bad in [dict(final_sparsity=1.2), dict(frequency=0), dict(start_step=5, end_step=2),
                dict(method="l2"), dict(scope="net"), dict(initial_sparsity=-0.1)]:
        kw = dict(final_sparsity=0.9, start_step=0, end_step=10, frequency=2) | bad
        with pytest.raises(ValueError):
            prune.GradualPruning(model, **kw)
