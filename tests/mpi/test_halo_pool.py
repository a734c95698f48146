"""The window ops' cached halo machinery: pooled halo'd buffers (:mod:`disttensor.core.halo_pool`)
and the cached reverse exchange of :func:`disttensor.core.halo.reverse_window`.

Every pooled buffer must equal the slice of the globally padded array (zeros beyond a
non-periodic boundary, wrapped on a periodic one) however often its slot was used before
and whatever layout used the pool in between; a buffer still referenced (the array, a view
of it, a convolution's saved input) is never handed out again; the cached reverse exchange
stays the adjoint of exchange-then-read on every call.  Layouts with uneven and empty blocks,
halos wider than a neighbour's block, periodic axes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from conftest import assert_all_ranks, assert_allclose_all
from disttensor.core import halo_pool
from disttensor.core.entry import nested
from disttensor.ops import _spatial
from disttensor.ops._spatial import spatial_windows, window_plan
from disttensor.ops.convolution import conv_forward
from test_halo import padded_slice

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()
_GRIDS: dict = {}


def get_grid(dims):
    if dims not in _GRIDS:
        _GRIDS[dims] = dt.ProcessGrid(dims)
    return _GRIDS[dims]


def _sizes(draw, n: int, parts: int):
    """Balanced (None) or explicit sizes of ``parts`` blocks summing to ``n`` (empty ones
    allowed)."""
    if parts == 1 or not draw(st.booleans()):
        return None
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=parts - 1, max_size=parts - 1)))
    return [b - a for a, b in zip([0] + cuts, cuts + [n])]


@st.composite
def window_cases(draw):
    """(shape (N, C, D, H), grid dims, sizes per axis, kernel, padding, periodic)."""
    a = draw(st.sampled_from([d for d in range(1, SIZE + 1) if SIZE % d == 0]))
    dims = (a, SIZE // a)
    kernel = draw(st.integers(1, 4))
    periodic = draw(st.booleans())
    pad = draw(st.integers(0, kernel - 1))
    spatial = [draw(st.integers(max(2, kernel), 7)) for _ in range(2)]
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *spatial)
    sizes = [None, None] + [_sizes(draw, n, p) for n, p in zip(spatial, dims)]
    return shape, dims, sizes, kernel, pad, periodic


def make(case, seed: int, dtype=np.float64):
    shape, dims, sizes, kernel, pad, periodic = case
    grid = get_grid(dims)
    g = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    x = dt.from_global(g, grid=grid, split=(None, None, 0, 1), sizes=sizes)
    windows = spatial_windows(2, (kernel,) * 2, (1, 1), (1, 1), ((pad, pad),) * 2, periodic)
    return g, x, window_plan(x.distribution, windows, grid.coords)


def halo_input(x, plan):
    """:func:`_spatial.halo_input` as a window op calls it: inside a collective entry point
    that agreed the arguments (its choices of pooled or fresh buffers are rank-local)."""
    with nested():
        return _spatial.halo_input(x, plan)


def halo_gradient(w, x_dist, grid, plan):
    with nested():
        return _spatial.halo_gradient(w, x_dist, grid, plan)


def reference(g, x, plan):
    box = x.distribution.block_box(x.grid.coords)
    return padded_slice(g, box.start, box.stop, plan.halo, plan.periodic)


@settings(max_examples=10)
@given(case=window_cases())
def test_pooled_buffers_match_the_padded_array_on_every_reuse(case):
    g1, x1, plan = make(case, 1)
    g2, x2, _ = make(case, 2)
    a = halo_input(x1, plan)
    b = halo_input(x2, plan)       # a second array of the layout while the first is held
    assert_allclose_all(COMM, a.buffer, reference(g1, x1, plan), rtol=0)
    assert_allclose_all(COMM, b.buffer, reference(g2, x2, plan), rtol=0)
    pooled = {id(s.buffer) for v in halo_pool._slots.values() for s in v}
    del a, b
    for gi, xi in ((g2, x2), (g1, x1)):   # slots reused: stale halos must not show
        c = halo_input(xi, plan)
        assert_allclose_all(COMM, c.buffer, reference(gi, xi, plan), rtol=0)
        assert_all_ranks(COMM, not plan.needs_exchange or id(c.buffer) in pooled,
                         "an idle pooled buffer was not reused")
        del c


def test_referenced_buffers_are_never_handed_out_again():
    case = ((2, 2, 6, 5), (SIZE, 1), [None, None, None, None], 3, 1, False)
    g1, x1, plan = make(case, 1)
    a = halo_input(x1, plan)
    view = a.buffer[:, :1]            # a view alone keeps the buffer (its base) in use
    del a
    held = [halo_input(make(case, 10 + i)[1], plan) for i in range(halo_pool.PER_LAYOUT + 2)]
    for i, h in enumerate(held):      # (past PER_LAYOUT: fresh buffers, not pooled)
        gi = make(case, 10 + i)[0]
        assert_allclose_all(COMM, h.buffer, reference(gi, x1, plan), rtol=0)
        assert_all_ranks(COMM, not np.shares_memory(h.buffer, view), "buffer handed out twice")
    assert_allclose_all(COMM, view, reference(g1, x1, plan)[:, :1], rtol=0)
    # a convolution's saved input (held for its backward) stays intact over later forwards
    w = np.random.default_rng(3).standard_normal((2, 2, 3, 3))
    _, saved = conv_forward(x1, w, padding=1)
    for i in range(3):
        conv_forward(make(case, 20 + i)[1], w, padding=1)
    if saved.xin.halo == plan.halo:
        assert_allclose_all(COMM, saved.xin.buffer, reference(g1, x1, plan), rtol=0)


def test_pool_bounds_and_clear():
    case = ((1, 1, 4, 4), (SIZE, 1), [None, None, None, None], 3, 1, True)
    _, x, plan = make(case, 0, np.float32)
    held = [halo_input(x, plan) for _ in range(halo_pool.PER_LAYOUT + 1)]
    assert_all_ranks(COMM, halo_pool.pooled_slots() <= halo_pool.MAX_SLOTS, "pool unbounded")
    halo_pool.clear()
    assert_all_ranks(COMM, halo_pool.pooled_slots() == 0, "clear() left slots")
    del held
    assert_allclose_all(COMM, halo_input(x, plan).buffer,
                        reference(x.to_numpy(), x, plan), rtol=0)


def _dot(a, b) -> float:
    return COMM.allreduce(float(np.vdot(a, b)), op=MPI.SUM)


@settings(max_examples=10)
@given(case=window_cases(), seed=st.integers(0, 2**16))
def test_cached_reverse_window_stays_the_adjoint(case, seed):
    """<read(exchange(x)), w> == <x, halo_gradient(w)>, on two calls (the second one on the
    cached exchange) with different window gradients."""
    g, x, plan = make(case, seed)
    win = halo_input(x, plan).buffer[plan.read]
    rng = np.random.default_rng(seed + 1)
    for _ in range(2):
        w = rng.standard_normal(win.shape)
        dx = halo_gradient(w, x.distribution, x.grid, plan)
        lhs, rhs = _dot(win, w), _dot(x.local, dx.local)
        assert_all_ranks(COMM, abs(lhs - rhs) <= 1e-9 * (1 + abs(lhs)),
                         f"not the adjoint: {lhs} vs {rhs}")


def test_a_slot_used_for_a_reverse_exchange_is_idle_again():
    """A gradient sent back through a pooled buffer (:func:`_spatial.zero_halo_buffer`, the
    reverse exchange) leaves its slot idle: the next call reuses it instead of making a new
    one each time (the views the reverse exchange makes of the buffer are the pool's own)."""
    case = ((2, 2, 6, 5), (SIZE, 1), [None, None, None, None], 3, 1, False)
    _, x, plan = make(case, 4)
    halo_pool.clear()
    for i in range(3):
        with nested():
            g, ex = _spatial.zero_halo_buffer(x.distribution, x.grid, plan, x.dtype)
            g.buffer[...] = i
            ex.reverse()
        del g, ex
    slots = [s for v in halo_pool._slots.values() for s in v]
    assert_all_ranks(COMM, len(slots) == 1 and slots[0].idle(),
                     f"{len(slots)} slot(s) after 3 reverse exchanges of one layout")


def _outside(store, box):
    """The store's cells outside ``box`` (a copy, flat)."""
    mask = np.ones(store.shape, dtype=bool)
    mask[tuple(slice(a, b) for a, b in box)] = False
    return store[mask]


@settings(max_examples=6)
@given(case=window_cases())
def test_a_padded_slot_keeps_its_padding_zero(case):
    """A convolution's pooled buffer (``padded=True``) lies in a store with room for its local
    zero padding: after a user write over the whole buffer (halo cells included) and the
    next exchange, the buffer equals the globally padded array and every store cell outside
    the data box (margins, halo beyond a non-periodic boundary) is zero, so the read window
    padded by ``pad_lo``/``pad_hi`` is the whole store, a C-contiguous array."""
    from disttensor.core.padded_store import _stores
    g, x, plan = make(case, 5)
    halo_pool.clear()
    for i in range(2):
        with nested():
            a = _spatial.halo_input(x, plan, padded=True)
        if not plan.needs_exchange:
            return
        slot = [s for v in halo_pool._slots.values() for s in v
                if np.shares_memory(s.buffer, a.buffer)]
        assert_all_ranks(COMM, len(slot) == 1, "the buffer is not a pooled one")
        store = slot[0].store
        box = _stores[id(store)][1]
        assert_allclose_all(COMM, a.buffer, reference(g, x, plan), rtol=0)
        assert_all_ranks(COMM, not np.any(_outside(store, box)), "padding not zero")
        whole = True
        if plan.margins is not None:   # (rank-local: the read window and its padding)
            window = a.buffer[plan.read]
            padded = np.pad(window, ((0, 0), (0, 0)) + tuple(zip(plan.pad_lo, plan.pad_hi)))
            whole = store.shape == padded.shape and np.array_equal(store, padded)
        assert_all_ranks(COMM, whole, "the store is not the padded operand")
        a.buffer[...] = 7.0        # a user write; the next exchange repairs the halo
        del a


def test_a_depth_split_conv_reads_its_halo_buffer_in_place():
    """A depth-split convolution's saved input (its halo'd buffer) is, with its local zero
    padding, one C-contiguous store that the direct kernels read in place (no padded copy)
    on every rank with outputs and a halo; the convolution, its filter gradient and the direct
    kernel run on the store all equal the float64 reference.  Uneven blocks, an empty one
    where the ranks allow."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import reference as ref
    from disttensor.core.padded_store import padded_view
    from disttensor.ops import conv_backward
    from disttensor.ops.local.cpu import conv_direct
    n = 4 + 3 * SIZE
    sizes = [n - 3 * (SIZE - 1)] + [3] * (SIZE - 1)
    if SIZE > 2:
        sizes[1:3] = [0, 6]             # an empty block in the middle
    rng = np.random.default_rng(7)
    g = rng.standard_normal((2, 3, n, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3, 3)).astype(np.float32)
    grid = get_grid((SIZE, 1))
    split = (None, None, 0, None, None)
    x = dt.from_global(g, grid=grid, split=split, sizes=[None, None, sizes, None, None])
    y, saved = conv_forward(x, w, padding=1)
    dyg = rng.standard_normal(y.shape).astype(np.float32)
    dy = dt.from_global(dyg, grid=grid, split=split,
                        sizes=[None, None, list(y.distribution.split_sizes[2]), None, None])
    _, dw, _ = conv_backward(saved, dy)
    want_y = ref.conv(g, w, padding=1)
    _, want_dw, _ = ref.conv_backward(g, w, dyg, padding=1)
    assert_allclose_all(COMM, y.to_numpy(), want_y, rtol=1e-4, atol=1e-4)
    assert_allclose_all(COMM, dw, want_dw, rtol=1e-4, atol=1e-3)
    plan = saved.plan
    ok = True
    if plan.has_output and SIZE > 1:
        window = saved.xin.buffer[plan.read]
        size = tuple(m + lo + hi for m, lo, hi in zip(window.shape[2:], plan.pad_lo,
                                                      plan.pad_hi))
        store = padded_view(window, plan.pad_lo, size)
        ok = store is not None and np.shares_memory(store, saved.xin.buffer)
        if ok:
            got = conv_direct.ALGORITHMS["direct8x2"].forward(window, w, (1, 1, 1), (1, 1, 1),
                                                              plan.pad_lo, plan.pad_hi)
            ok = np.allclose(got, want_y[y.local_slices], rtol=1e-4, atol=1e-4)
    assert_all_ranks(COMM, ok, "the halo'd buffer is not read in place, or reads wrong")
