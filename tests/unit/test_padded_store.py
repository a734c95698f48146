"""disttensor.core.padded_store and its use by the direct convolutions: a window of a
zero-padded store is padded by reading the store in place (no copy), only where the store
holds exactly that padded operand (cells outside the window all outside the data box, the
padding spanning the store, all channels, any run of samples, lifted 1-d/2-d windows), and the
direct kernels give bit for bit what they give on a padded copy, and the float64 reference."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from disttensor.core import padded_store as ps
from disttensor.ops.local.cpu import conv_direct as D
from disttensor.ops.local.cpu.conv_direct.geometry import embed
from .test_local_cpu_conv_direct import ref_backward_filter, ref_forward

DIRECT = sorted(a for a in D.ALGORITHMS if a != "gemm1x1")


def store_with_window(shape=(3, 2, 6, 5, 7), box=((0, 3), (0, 2), (1, 5), (1, 4), (1, 6)),
                      seed=0, dtype=np.float64):
    """A registered store of ``shape`` whose data box ``box`` holds random values."""
    store = np.zeros(shape, dtype=dtype)
    inner = tuple(slice(a, b) for a, b in box)
    store[inner] = np.random.default_rng(seed).standard_normal(store[inner].shape)
    ps.register(store, box)
    return store, inner


def test_a_window_covering_the_data_box_is_the_store_itself():
    store, inner = store_with_window()
    x = store[inner]
    got = embed(x, (1, 1, 1), store.shape[2:])
    assert np.shares_memory(got, store) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (0, 0)) + ((1, 1),) * 3))
    part = embed(x[1:3], (1, 1, 1), store.shape[2:])    # a micro-batch: samples 1..2
    assert np.shares_memory(part, store[1:3])
    np.testing.assert_array_equal(part, store[1:3])
    # a larger window (zero cells of the store inside it) is the store as well
    wide = (slice(None), slice(None), slice(0, 6), slice(1, 4), slice(1, 6))
    assert np.shares_memory(embed(store[wide], (0, 1, 1), store.shape[2:]), store)


@pytest.mark.parametrize("case", ["box not covered", "other offset", "other size",
                                  "some channels", "step", "dtype"])
def test_other_windows_are_padded_into_scratch(case):
    store, inner = store_with_window()
    x, lo, size, step = store[inner], (1, 1, 1), store.shape[2:], (1, 1, 1)
    if case == "box not covered":     # data cells outside the window must not leak in
        x = store[inner[:2] + (slice(1, 4),) + inner[3:]]
    elif case == "other offset":
        lo = (2, 1, 1)
    elif case == "other size":
        size = (6, 5, 8)
    elif case == "some channels":
        x = store[(slice(None), slice(0, 1)) + inner[2:]]
    elif case == "step":
        step, size = (1, 2, 1), (6, 6, 7)
    else:
        x = x.astype(np.float32)
    got = embed(x, lo, size, step)
    assert not np.shares_memory(got, store)
    want = np.zeros(x.shape[:2] + tuple(size))
    want[(slice(None), slice(None)) + tuple(
        slice(l, l + (n - 1) * s + 1, s) for l, n, s in zip(lo, x.shape[2:], step))] = x
    np.testing.assert_array_equal(got, want)


def test_unregistered_and_dead_stores_are_never_read():
    a = np.zeros((1, 1, 4, 4, 4))
    x = a[:, :, 1:3, 1:3, 1:3]
    assert ps.padded_view(x, (1, 1, 1), (4, 4, 4)) is None
    store, inner = store_with_window()
    n = ps.registered()
    del store, inner
    gc.collect()
    assert ps.registered() < n
    with pytest.raises(ValueError):
        ps.register(np.zeros((4, 4))[:, 1:], ((0, 4), (0, 3)))


def test_a_lifted_two_dimensional_window():
    """A 2-d store read through a window lifted to three spatial axes (a leading 1)."""
    store = np.zeros((2, 3, 6, 5))
    store[:, :, 1:5, 1:4] = np.random.default_rng(1).standard_normal((2, 3, 4, 3))
    ps.register(store, ((0, 2), (0, 3), (1, 5), (1, 4)))
    x = store[:, :, 1:5, 1:4]
    lifted = x.reshape(x.shape[:2] + (1,) + x.shape[2:])
    got = ps.padded_view(lifted, (0, 1, 1), (1, 6, 5))
    assert got is not None and np.shares_memory(got, store) and got.shape == (2, 3, 1, 6, 5)
    np.testing.assert_array_equal(got[:, :, 0], store)
    assert ps.padded_view(lifted, (1, 1, 1), (3, 6, 5)) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("algo", DIRECT)
def test_direct_kernels_on_a_store_window_equal_them_on_a_copy(algo, dtype):
    """Forward and backward filter of a window of a store (the halo'd buffer of a depth
    split's first block: one zero halo plane below, margins around H and W) equal, bit for
    bit, the same kernel on a contiguous copy of the window, and the float64 reference."""
    store, inner = store_with_window((2, 4, 7, 7, 8), ((0, 2), (0, 4), (1, 7), (1, 6), (1, 7)),
                                     seed=3, dtype=dtype)
    x = store[inner]
    w = np.random.default_rng(4).standard_normal((5, 4, 3, 3, 3)).astype(dtype)
    geo = ((1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 1, 1))
    alg = D.ALGORITHMS[algo]
    y = alg.forward(x, w, *geo)
    np.testing.assert_array_equal(y, alg.forward(np.ascontiguousarray(x), w, *geo))
    want = ref_forward(x, w, *geo, 1)
    tol = 1e-10 if dtype == np.float64 else 2e-5
    assert np.abs(y - want).max() <= tol * np.abs(want).max()
    dy = np.random.default_rng(5).standard_normal(y.shape).astype(dtype)
    dw = alg.backward_filter(x, dy, (3, 3, 3), *geo)
    np.testing.assert_array_equal(dw, alg.backward_filter(np.ascontiguousarray(x), dy,
                                                          (3, 3, 3), *geo))
    want = ref_backward_filter(x, dy, (3, 3, 3), *geo, 1)
    assert np.abs(dw - want).max() <= tol * np.abs(want).max()
