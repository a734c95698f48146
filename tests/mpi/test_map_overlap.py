"""dt.map_overlap against a serial float64 NumPy reference: ``fn`` on the globally padded array
(``np.pad`` axis after axis: Dask's 'periodic' = 'wrap', 'reflect' = 'symmetric', 'nearest' =
'edge', a number = 'constant'; 'none' = no padding), on random 1-3-D shapes and layouts (1-3-D
grids, uneven and empty blocks, depths wider than a neighbour's block), with and without the
split-phase stencil mode; trim=False blocks; bad input raising on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import (SIZE, check_blocks as check, collective_checks, dist, examples, expect,
                    grid, last_rank_only, mismatch)
from conftest import assert_raises_all
from mpi4py import MPI
from disttensor.testing.strategies import layouts, shapes

COMM = MPI.COMM_WORLD
NP_MODE = {"periodic": "wrap", "reflect": "symmetric", "nearest": "edge"}


def shift(b, k, t):
    """``b`` moved by ``k`` cells along axis ``t``, the edge cell repeated where nothing
    comes in (a stencil's neighbour; at a boundary 'none' window edge this differs from the
    zeros or values beyond it)."""
    n = b.shape[t]
    if n == 0:
        return b.copy()
    return np.take(b, np.clip(np.arange(n) - k, 0, n - 1), axis=t)


def make_stencil(depth):
    """A stencil reaching exactly ``depth[t] = (lo, hi)`` cells along each axis (distinct
    weights, so a wrong neighbour shows)."""
    def fn(b):
        out = 0.5 * b
        for t, (lo, hi) in enumerate(depth):
            for k in range(1, lo + 1):
                out = out + (0.1 * k + 0.03 * t) * shift(b, k, t)
            for k in range(1, hi + 1):
                out = out + (0.2 * k - 0.07 * t) * shift(b, -k, t)
        return out
    return fn


def reference(fn, a, depth, modes):
    """``fn`` on ``a`` padded axis after axis, then trimmed (the serial Dask semantics)."""
    if a.size == 0:
        return np.zeros(a.shape)
    p = a
    for t, ((lo, hi), m) in enumerate(zip(depth, modes)):
        if m == "none":
            continue
        width = [(0, 0)] * a.ndim
        width[t] = (lo, hi)
        if m in NP_MODE:
            p = np.pad(p, width, mode=NP_MODE[m])
        else:
            p = np.pad(p, width, mode="constant", constant_values=m)
    r = fn(p)
    cut = tuple(slice(0, n) if m == "none" else slice(lo, lo + n)
                for (lo, hi), m, n in zip(depth, modes, a.shape))
    return r[cut]


@st.composite
def cases(draw):
    shape = draw(shapes(1, 3, 7))
    layout = draw(layouts(shape, SIZE))
    depth, modes = [], []
    for n in shape:
        m = draw(st.sampled_from(["none", "periodic", "reflect", "nearest", 0.0, -1.5]))
        cap = n + 2 if m in ("periodic", "none") else n
        if n == 0 and m in ("reflect", "nearest", "periodic"):
            cap = 0
        depth.append((draw(st.integers(0, min(cap, 3))), draw(st.integers(0, min(cap, 3)))))
        modes.append(m)
    return shape, layout, tuple(depth), tuple(modes), draw(st.integers(0, 2**16))


def boundary_arg(modes, form):
    if len(set(modes)) == 1 and form == 0:
        return modes[0]
    if form == 1:
        return {t: m for t, m in enumerate(modes) if m != "none"}
    return tuple(modes)


def depth_arg(depth, form):
    if all(lo == hi for lo, hi in depth):
        ints = tuple(lo for lo, _ in depth)
        if len(set(ints)) == 1 and form == 0:
            return ints[0]
        return ints if form == 2 else {t: d for t, d in enumerate(ints) if d}
    return depth


@settings(max_examples=examples(16))
@given(cases(), st.integers(0, 2), st.booleans())
@collective_checks
def test_map_overlap_against_padded_numpy(c, form, stencil):
    shape, layout, depth, modes, seed = c
    a = np.random.default_rng(seed).standard_normal(shape)
    x = dist(a, layout)
    fn = make_stencil(depth)
    want = reference(fn, a, depth, modes)
    got = dt.map_overlap(fn, x, depth_arg(depth, form), boundary=boundary_arg(modes, form),
                         stencil=stencil)
    check(got, want, f"map_overlap depth={depth} modes={modes} stencil={stencil}", rtol=1e-12,
          atol=1e-12, layout=layout)
    np.testing.assert_array_equal(x.local, a[x.local_slices])  # the input is untouched


@settings(max_examples=examples(8))
@given(cases())
@collective_checks
def test_trim_false_blocks_are_the_extended_blocks(c):
    shape, layout, depth, modes, seed = c
    modes = tuple("periodic" if m == "none" else m for m in modes)  # every side extended
    depth = tuple((lo, hi) if n else (0, 0) for (lo, hi), n in zip(depth, shape))
    a = np.random.default_rng(seed).standard_normal(shape)
    x = dist(a, layout)
    y = dt.map_overlap(lambda b: b * 1.0, x, depth, boundary=modes, trim=False)
    d = x.distribution
    box = d.block_box(x.grid.coords)
    want_shape = tuple(n + (lo + hi) * (len(o) - 1)
                       for n, (lo, hi), o in zip(shape, depth, d.offsets))
    expect(y.shape == want_shape, f"trim=False shape {y.shape} != {want_shape}")
    if a.size:
        p = a
        for t, ((lo, hi), m) in enumerate(zip(depth, modes)):
            w = [(0, 0)] * a.ndim
            w[t] = (lo, hi)
            p = np.pad(p, w, mode=NP_MODE[m]) if m in NP_MODE else \
                np.pad(p, w, mode="constant", constant_values=m)
        want = p[tuple(slice(s, e + lo + hi) for s, e, (lo, hi) in
                       zip(box.start, box.stop, depth))]
        expect(y.local.shape == want.shape and np.array_equal(y.local, want),
               f"trim=False block {y.local.shape} vs {want.shape}")


def test_deep_halo_reaches_past_thin_neighbours(comm):
    """Blocks of 1 and 0 cells, depth 3: the halo comes from ranks further away (and the
    reflected/edge cells from the owners of the first and last cells)."""
    n = 2 * SIZE + 4
    sizes = [0] + [1] * (SIZE - 1)
    sizes[-1] += n - sum(sizes)
    a = np.random.default_rng(7).standard_normal(n)
    x = dt.from_global(a, grid=grid((SIZE,)), split=(0,), sizes=[sizes])
    for m in ("reflect", "nearest", "periodic", 2.0, "none"):
        fn = make_stencil([(3, 3)])
        check(dt.map_overlap(fn, x, 3, boundary=m), reference(fn, a, [(3, 3)], [m]),
              f"deep {m}", rtol=1e-12, atol=1e-12)
    from checks import settle
    settle()


def test_stencil_mode_on_a_3d_grid(comm):
    a = np.random.default_rng(3).standard_normal((9, 8, 7))
    dims = {1: (1, 1, 1), 2: (2, 1, 1), 3: (1, 3, 1), 4: (2, 2, 1)}[SIZE]
    x = dt.from_global(a, grid=grid(dims), split=(0, 1, None))
    fn = make_stencil([(1, 1), (2, 2), (1, 1)])
    for m in (0.0, "periodic", "reflect"):
        want = reference(fn, a, [(1, 1), (2, 2), (1, 1)], [m] * 3)
        check(dt.map_overlap(fn, x, (1, 2, 1), boundary=m, stencil=True), want,
              f"3-D stencil {m}", rtol=1e-12, atol=1e-12)
    from checks import settle
    settle()


def test_bad_input_raises_on_every_rank(comm):
    x = dt.from_global(np.arange(12.0).reshape(4, 3))
    stencil = make_stencil([(1, 1), (1, 1)])
    assert_raises_all(comm, ValueError, "larger than the axis",
                      lambda: dt.map_overlap(stencil, x, 4, boundary="reflect"))
    assert_raises_all(comm, ValueError, "larger than the axis",
                      lambda: dt.map_overlap(stencil, x, 5, boundary=0))
    assert_raises_all(comm, ValueError, "boundary must be",
                      lambda: dt.map_overlap(stencil, x, 1, boundary="mirror"))
    assert_raises_all(comm, ValueError, "depth must be >= 0",
                      lambda: dt.map_overlap(stencil, x, -1))
    assert_raises_all(comm, TypeError, "x must be a DistArray",
                      lambda: dt.map_overlap(stencil, np.zeros(3), 1))
    assert_raises_all(comm, ValueError, "trim=True",
                      lambda: dt.map_overlap(lambda b: b.sum(axis=0), x, 1, boundary=0))
    assert_raises_all(comm, ValueError, "stencil=True needs trim=True",
                      lambda: dt.map_overlap(stencil, x, 1, trim=False, stencil=True))

    def fails_on_last_rank(b):
        if COMM.rank == SIZE - 1:
            raise ZeroDivisionError("boom")
        return b
    for st_ in (False, True):
        assert_raises_all(comm, ZeroDivisionError, "boom",
                          lambda: dt.map_overlap(fails_on_last_rank, x, 1, boundary=0,
                                                 stencil=st_))
    if SIZE > 1:
        with mismatch("map_overlap", "depth"):
            dt.map_overlap(stencil, x, last_rank_only(2, 1), boundary=0)
        assert_raises_all(comm, ValueError, "extent differs between ranks",
                          lambda: dt.map_overlap(lambda b: np.zeros((b.shape[0], COMM.rank + 1)),
                                                 x, 1, boundary=0, trim=False))
    y = dt.map_overlap(stencil, x, 1, boundary=0)   # still usable afterwards
    check(y, reference(stencil, np.arange(12.0).reshape(4, 3), [(1, 1)] * 2, [0, 0]), "after",
          rtol=1e-12)
    from checks import settle
    settle()


@pytest.mark.parametrize("boundary", ["reflect", "nearest"])
def test_edge_fill_matches_np_pad_on_the_buffer(comm, boundary):
    """core.halo.EdgeFill itself: each rank's whole buffer equals the padded slice."""
    from disttensor.core.halo import EdgeFill
    a = np.arange(6.0 * 5).reshape(6, 5) ** 1.3
    x = dt.from_global(a).with_halo(((2, 1), (1, 2)))
    x.exchange_halo("zero")
    EdgeFill(x, (boundary, boundary)).run()
    p = np.pad(a, ((2, 1), (1, 2)), mode=NP_MODE[boundary])
    box = x.distribution.block_box(x.grid.coords)
    want = p[tuple(slice(s, e + lo + hi) for s, e, (lo, hi) in zip(box.start, box.stop,
                                                                       x.halo))]
    expect(np.array_equal(x.buffer, want), f"EdgeFill {boundary} buffer differs")
    from checks import settle
    settle()


def test_kept_buffer_is_never_aliased_and_reentrant(comm):
    """map_overlap keeps its halo buffer per layout: results must not share it, and a function
    that calls map_overlap on the same layout gets a buffer of its own."""
    a = np.random.default_rng(11).standard_normal((7, 5))
    x = dt.from_global(a)
    first = dt.map_overlap(lambda b: b, x, 1, boundary="periodic")
    second = dt.map_overlap(lambda b: b, x * 2.0, 1, boundary="periodic")
    check(first, a, "first result after a second call")
    check(second, 2.0 * a, "second result")
    inner = make_stencil([(1, 1), (1, 1)])

    def calls_again(b):
        y = dt.map_overlap(inner, x, 1, boundary="periodic")
        return b + y.local.sum()   # a block-local value: only its shape matters here
    got = dt.map_overlap(calls_again, x, 1, boundary="periodic")
    want_inner = dt.map_overlap(inner, x, 1, boundary="periodic").local.sum()
    check(got, a, "re-entrant call", values=False)
    expect(np.allclose(got.local, a[x.local_slices] + want_inner), "re-entrant values")
    from checks import settle
    settle()


@settings(max_examples=examples(8))
@given(st.data())
def test_edge_fill_adjoint(data):
    """<fill(exchange(x)), y> == <x, exchange*(fill*(y))> over the per-rank buffers, blocks
    thinner than the halo included (the messages of EdgeFill.reverse)."""
    from disttensor.core.halo import EdgeFill
    from disttensor.testing import assert_adjoint
    from disttensor.testing.strategies import explicit_sizes
    nd = data.draw(st.integers(1, 2))
    shape = tuple(data.draw(st.integers(1, 6)) for _ in range(nd))
    sizes = [data.draw(explicit_sizes(shape[0], SIZE))] + [None] * (nd - 1)
    modes = tuple(data.draw(st.sampled_from(["reflect", "nearest", None])) for _ in shape)
    halo = tuple((data.draw(st.integers(0, n)), data.draw(st.integers(0, n))) for n in shape)
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = dt.from_global(rng.standard_normal(shape), grid=grid((SIZE,)),
                       split=(0,) + (None,) * (nd - 1), sizes=sizes)
    h = x.with_halo(halo)
    ex = h.halo_exchange("zero")
    fill = EdgeFill(h, modes)
    y = rng.standard_normal(h.buffer.shape)   # a per-rank buffer

    def forward(v):
        h.local[...] = v.local
        ex.exchange()
        fill.run()
        return h.buffer.copy()

    def adjoint(w):
        h.buffer[...] = w
        fill.reverse()
        ex.reverse()
        return dt.from_local(h.local.copy(), grid=x.grid, distribution=x.distribution)
    assert_adjoint(forward, adjoint, x, y, inner="blocks", comm=COMM)
