"""Property tests of the pure block-distribution index math (no MPI)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from disttensor.core.distribution import (Box, Distribution, balanced_sizes, coords_to_rank,
                                     intersect_ranges, offsets_from_sizes, rank_to_coords)

from disttensor.testing.strategies import explicit_sizes as compositions
from disttensor.testing.strategies import grids
from disttensor.testing.strategies import splits as split_st

FAST = settings(max_examples=150, deadline=None)
MEDIUM = settings(max_examples=80, deadline=None)


# --------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------


@st.composite
def distributions(draw, max_ndim=3, max_extent=9, min_ndim=1, dims=None, explicit=None):
    """Random Distribution: 1-3 tensor axes, grid of 1-3 axes, random split, sometimes
    explicit (uneven / empty) ownership sizes."""
    if dims is None:
        dims = draw(st.integers(1, 24).flatmap(lambda n: grids(n, 3)))
    ndim = draw(st.integers(min_ndim, max_ndim))
    shape = tuple(draw(st.lists(st.integers(0, max_extent), min_size=ndim, max_size=ndim)))
    split = draw(split_st(ndim, len(dims)))
    sizes = []
    for n, g in zip(shape, split):
        use_explicit = draw(st.booleans()) if explicit is None else explicit
        if g is None or not use_explicit:
            sizes.append(None)
        else:
            sizes.append(draw(compositions(n, dims[g])))
    return Distribution(shape, dims, split, sizes)


def all_coords(dims):
    return list(itertools.product(*(range(d) for d in dims)))


def representative(dist: Distribution, coords):
    """Coordinates with 0 on replication axes (one rank per distinct block)."""
    c = list(coords)
    for g in dist.replicated_grid_axes:
        c[g] = 0
    return tuple(c)


# --------------------------------------------------------------------------------------------
# helpers: balanced_sizes, offsets, rank <-> coords
# --------------------------------------------------------------------------------------------
@FAST
@given(st.integers(0, 200), st.integers(1, 40))
def test_balanced_sizes(n, p):
    s = balanced_sizes(n, p)
    assert len(s) == p
    assert sum(s) == n
    assert max(s) - min(s) <= 1
    # remainder to the lowest coordinates: non-increasing, exactly n % p large blocks first
    assert list(s) == sorted(s, reverse=True)
    assert s == tuple(n // p + (c < n % p) for c in range(p))
    assert sum(1 for v in s if v == n // p + 1) == (n % p if n % p else 0)


def test_balanced_sizes_errors():
    with pytest.raises(ValueError):
        balanced_sizes(5, 0)
    with pytest.raises(ValueError):
        balanced_sizes(5, -1)
    with pytest.raises(ValueError):
        balanced_sizes(-1, 2)


@FAST
@given(st.lists(st.integers(0, 20), max_size=10))
def test_offsets_from_sizes(sizes):
    o = offsets_from_sizes(sizes)
    assert len(o) == len(sizes) + 1
    assert o[0] == 0
    assert o[-1] == sum(sizes)
    assert all(o[i + 1] - o[i] == sizes[i] for i in range(len(sizes)))


@FAST
@given(st.lists(st.integers(1, 5), max_size=4))
def test_rank_coords_inverse_row_major(dims):
    dims = tuple(dims)
    size = math.prod(dims)
    # row-major: itertools.product enumerates coordinates in row-major (C) order
    for r, c in enumerate(itertools.product(*(range(d) for d in dims))):
        assert coords_to_rank(c, dims) == r
        assert rank_to_coords(r, dims) == c
        assert np.ravel_multi_index(c, dims) == r if dims else True
    assert [coords_to_rank(rank_to_coords(r, dims), dims) for r in range(size)] == list(range(size))


# --------------------------------------------------------------------------------------------
# Box and ranges
# --------------------------------------------------------------------------------------------
@st.composite
def boxes(draw, ndim):
    start = draw(st.lists(st.integers(-5, 5), min_size=ndim, max_size=ndim))
    stop = draw(st.lists(st.integers(-5, 8), min_size=ndim, max_size=ndim))
    return Box(tuple(start), tuple(stop))


def box_set(b: Box):
    return set(itertools.product(*(range(a, c) for a, c in zip(b.start, b.stop))))


@FAST
@given(st.integers(1, 3).flatmap(lambda n: st.tuples(boxes(n), boxes(n),
                                                     st.lists(st.integers(-4, 4), min_size=n,
                                                              max_size=n))))
def test_box(args):
    a, b, delta = args
    assert a.size == len(box_set(a)) == math.prod(a.shape)
    assert all(s >= 0 for s in a.shape)
    inter = a.intersect(b)
    expected = box_set(a) & box_set(b)
    if inter is None:
        assert not expected
    else:
        assert box_set(inter) == expected and inter.size > 0
    shifted = a.shift(delta)
    assert box_set(shifted) == {tuple(i + d for i, d in zip(p, delta)) for p in box_set(a)}
    assert shifted.shape == a.shape
    if all(s >= 0 for s in a.start):
        arr = np.zeros(tuple(max(c, 0) + 1 for c in a.stop))
        arr[a.slices()] = 1
        assert arr.sum() == a.size


@FAST
@given(st.integers(-5, 5), st.integers(-5, 5), st.integers(-5, 5), st.integers(-5, 5))
def test_intersect_ranges(a0, a1, b0, b1):
    r = intersect_ranges((a0, a1), (b0, b1))
    expected = set(range(a0, a1)) & set(range(b0, b1))
    if r is None:
        assert not expected
    else:
        assert set(range(*r)) == expected and expected


# --------------------------------------------------------------------------------------------
# Distribution: blocks tile the array
# --------------------------------------------------------------------------------------------
@MEDIUM
@given(distributions())
def test_blocks_tile_global_array(dist):
    count = np.zeros(dist.shape, dtype=np.int64)
    reps = set()
    for coords in all_coords(dist.grid_dims):
        box = dist.block_box(coords)
        rep = representative(dist, coords)
        # replicas own the same block
        assert box == dist.block_box(rep)
        assert box.slices() == dist.block_slices(coords)
        assert box.shape == dist.block_shape(coords)
        assert box == dist.rank_box(coords_to_rank(coords, dist.grid_dims))
        assert all(0 <= a <= b <= n for a, b, n in zip(box.start, box.stop, dist.shape))
        if rep not in reps:
            reps.add(rep)
            count[box.slices()] += 1
    assert np.all(count == 1)
    assert len(reps) == math.prod(dist.grid_dims[g] for g in dist.split if g is not None)


@MEDIUM
@given(distributions())
def test_sizes_and_offsets(dist):
    for t, g in enumerate(dist.split):
        s = dist.sizes(t)
        p = 1 if g is None else dist.grid_dims[g]
        assert len(s) == p and sum(s) == dist.shape[t] and min(s) >= 0
        assert dist.offsets[t] == offsets_from_sizes(s)
        assert dist.is_balanced(t) == (s == balanced_sizes(dist.shape[t], p))
        for c in range(p):
            assert dist.block_range(t, c) == (dist.offsets[t][c], dist.offsets[t][c + 1])
    assert dist.split_tensor_axes == tuple(t for t, g in enumerate(dist.split) if g is not None)
    assert set(dist.replicated_grid_axes) | {g for g in dist.split if g is not None} == \
        set(range(len(dist.grid_dims)))
    assert dist.grid_size == math.prod(dist.grid_dims)
    assert dist.ndim == len(dist.shape)


@MEDIUM
@given(distributions(explicit=False))
def test_default_sizes_are_balanced(dist):
    for t, g in enumerate(dist.split):
        p = 1 if g is None else dist.grid_dims[g]
        assert dist.sizes(t) == balanced_sizes(dist.shape[t], p)
        assert dist.is_balanced(t)
    for coords in all_coords(dist.grid_dims):
        shape = dist.block_shape(coords)
        for t, g in enumerate(dist.split):
            n = dist.shape[t]
            if g is None:
                assert shape[t] == n
            else:
                p, c = dist.grid_dims[g], coords[g]
                assert shape[t] == n // p + (c < n % p)


@MEDIUM
@given(distributions())
def test_equality_and_hash(dist):
    sizes = [dist.sizes(t) if g is not None else None for t, g in enumerate(dist.split)]
    same = Distribution(dist.shape, dist.grid_dims, dist.split, sizes)
    assert same == dist and hash(same) == hash(dist)
    # explicit sizes equal to the balanced ones give the same distribution
    balanced = Distribution(dist.shape, dist.grid_dims, dist.split)
    explicit_balanced = Distribution(dist.shape, dist.grid_dims, dist.split,
                                     [balanced.sizes(t) if g is not None else None
                                      for t, g in enumerate(dist.split)])
    assert balanced == explicit_balanced and hash(balanced) == hash(explicit_balanced)
    assert (dist == balanced) == all(dist.is_balanced(t) for t in range(dist.ndim))
    # a shorter split is padded with None
    k = len(dist.split)
    while k and dist.split[k - 1] is None:
        k -= 1
    assert Distribution(dist.shape, dist.grid_dims, dist.split[:k], sizes) == dist
    assert dist != "not a distribution"
    repr(dist)


def test_explicit_sizes_with_empty_blocks():
    d = Distribution((5, 3), (3, 2), (0, None), [(0, 5, 0), None])
    assert d.block_box((0, 0)) == Box((0, 0), (0, 3))
    assert d.block_box((1, 1)) == Box((0, 0), (5, 3))
    assert d.block_box((2, 0)) == Box((5, 0), (5, 3))
    assert d.block_shape((0, 1)) == (0, 3)
    assert d.replicas((1, 0)) == [2, 3]
    assert d.owner_coords((4, 2)) == (1, None)
    assert d.coords_range_overlapping(0, -3, 10) == (1,)


# --------------------------------------------------------------------------------------------
# ownership lookups
# --------------------------------------------------------------------------------------------
@MEDIUM
@given(distributions())
def test_owner_coords_agree_with_block_box(dist):
    for index in np.ndindex(*dist.shape):
        oc = dist.owner_coords(index)
        assert len(oc) == len(dist.grid_dims)
        for g in range(len(dist.grid_dims)):
            assert (oc[g] is None) == (g in dist.replicated_grid_axes)
        coords = tuple(0 if c is None else c for c in oc)
        box = dist.block_box(coords)
        assert all(a <= i < b for a, i, b in zip(box.start, index, box.stop))
        for t in range(dist.ndim):
            c = dist.owner_coord(t, index[t])
            lo, hi = dist.block_range(t, c)
            assert lo <= index[t] < hi
            if dist.split[t] is not None:
                assert oc[dist.split[t]] == c
            else:
                assert c == 0
    # out-of-range lookups
    for t, n in enumerate(dist.shape):
        for bad in (-1, n, n + 3):
            with pytest.raises(IndexError):
                dist.owner_coord(t, bad)
    with pytest.raises(IndexError):
        dist.owner_coords((0,) * (dist.ndim + 1))


@FAST
@given(distributions(max_ndim=1), st.integers(-12, 12), st.integers(-12, 12))
def test_coords_range_overlapping_brute_force(dist, lo, hi):
    for t in range(dist.ndim):
        p = len(dist.offsets[t]) - 1
        expected = []
        for c in range(p):
            a, b = dist.block_range(t, c)
            if b > a and max(a, lo) < min(b, hi):  # non-empty block meeting [lo, hi)
                expected.append(c)
        got = dist.coords_range_overlapping(t, lo, hi)
        assert list(got) == expected, (dist, t, lo, hi, got)


@FAST
@given(st.data())
def test_coords_range_overlapping_many_empty_blocks(data):
    # heavy on zeros: most blocks empty
    p = data.draw(st.integers(1, 8))
    n = data.draw(st.integers(0, 6))
    sizes = data.draw(compositions(n, p))
    dist = Distribution((n,), (p,), (0,), [sizes])
    lo = data.draw(st.integers(-3, n + 3))
    hi = data.draw(st.integers(-3, n + 3))
    expected = [c for c in range(p)
                if sizes[c] and max(dist.offsets[0][c], lo) < min(dist.offsets[0][c + 1], hi)]
    assert list(dist.coords_range_overlapping(0, lo, hi)) == expected


@MEDIUM
@given(distributions())
def test_replicas(dist):
    dims = dist.grid_dims
    rep_axes = dist.replicated_grid_axes
    n_rep = math.prod(dims[g] for g in rep_axes)
    for coords in all_coords(dims):
        reps = dist.replicas(coords)
        assert reps == sorted(reps) and len(reps) == len(set(reps)) == n_rep
        me = coords_to_rank(coords, dims)
        assert me in reps
        expected = [r for r in range(math.prod(dims))
                    if all(a == b for g, (a, b) in enumerate(zip(rank_to_coords(r, dims), coords))
                           if g not in rep_axes)]
        assert reps == expected
        box = dist.block_box(coords)
        assert all(dist.rank_box(r) == box for r in reps)


# --------------------------------------------------------------------------------------------
# derived distributions
# --------------------------------------------------------------------------------------------
@MEDIUM
@given(st.data())
def test_restrict(data):
    dist = data.draw(distributions())
    t = data.draw(st.integers(0, dist.ndim - 1))
    n = dist.shape[t]
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    r = dist.restrict(t, start, stop)
    assert r.shape == dist.shape[:t] + (stop - start,) + dist.shape[t + 1:]
    assert r.split == dist.split and r.grid_dims == dist.grid_dims
    for c in range(len(dist.offsets[t]) - 1):
        a, b = dist.block_range(t, c)
        assert r.sizes(t)[c] == sum(1 for i in range(a, b) if start <= i < stop)
    for u in range(dist.ndim):
        if u != t:
            assert r.offsets[u] == dist.offsets[u]
    for coords in all_coords(dist.grid_dims):
        ob, rb = dist.block_box(coords), r.block_box(coords)
        a, b = max(ob.start[t], start), min(ob.stop[t], stop)
        if a < b:
            assert (rb.start[t], rb.stop[t]) == (a - start, b - start)
        else:
            assert rb.shape[t] == 0


@MEDIUM
@given(st.data())
def test_slice_axis(data):
    dist = data.draw(distributions())
    t = data.draw(st.integers(0, dist.ndim - 1))
    n = dist.shape[t]
    s = slice(data.draw(st.one_of(st.none(), st.integers(-12, 12))),
              data.draw(st.one_of(st.none(), st.integers(-12, 12))),
              data.draw(st.one_of(st.none(), st.integers(1, 5))))
    start, stop, step = s.indices(n)
    r = dist.slice_axis(t, start, stop, step)
    selected = list(range(start, stop, step))
    assert r.shape[t] == len(selected) == len(range(n)[s])
    assert r.shape[:t] + r.shape[t + 1:] == dist.shape[:t] + dist.shape[t + 1:]
    for c in range(len(dist.offsets[t]) - 1):
        a, b = dist.block_range(t, c)
        assert r.sizes(t)[c] == sum(1 for i in selected if a <= i < b)
    # the k-th selected element lives in the block that owned it before
    for k, i in enumerate(selected):
        assert r.owner_coord(t, k) == dist.owner_coord(t, i)
    with pytest.raises(ValueError):
        dist.slice_axis(t, 0, n, 0)
    with pytest.raises(ValueError):
        dist.slice_axis(t, 0, n, -1)


@FAST
@given(st.integers(-3, 12), st.integers(0, 12), st.integers(-3, 14), st.integers(-3, 14),
       st.integers(1, 5))
def test_count_selected(a, length, start, stop, step):
    from disttensor.core.distribution import _count_selected
    b = a + length
    assume(start >= 0)
    expected = sum(1 for i in range(start, stop, step) if a <= i < b)
    assert _count_selected(a, b, start, stop, step) == expected


@MEDIUM
@given(st.data())
def test_transpose(data):
    dist = data.draw(distributions())
    axes = data.draw(st.permutations(range(dist.ndim)))
    tr = dist.transpose(axes)
    assert tr.shape == tuple(dist.shape[t] for t in axes)
    assert tr.split == tuple(dist.split[t] for t in axes)
    for coords in all_coords(dist.grid_dims):
        ob, tb = dist.block_box(coords), tr.block_box(coords)
        assert tb.start == tuple(ob.start[t] for t in axes)
        assert tb.stop == tuple(ob.stop[t] for t in axes)
    inv = list(np.argsort(axes))
    assert tr.transpose(inv) == dist


@MEDIUM
@given(st.data())
def test_drop_axes(data):
    dist = data.draw(distributions())
    drop = data.draw(st.sets(st.integers(0, dist.ndim - 1)))
    keep = [t for t in range(dist.ndim) if t not in drop]
    dd = dist.drop_axes(drop)
    assert dd.shape == tuple(dist.shape[t] for t in keep)
    assert dd.split == tuple(dist.split[t] for t in keep)
    assert dd.grid_dims == dist.grid_dims
    for g in dist.replicated_grid_axes:
        assert g in dd.replicated_grid_axes
    for coords in all_coords(dist.grid_dims):
        ob, db = dist.block_box(coords), dd.block_box(coords)
        assert db.start == tuple(ob.start[t] for t in keep)
        assert db.stop == tuple(ob.stop[t] for t in keep)


@MEDIUM
@given(st.data())
def test_with_sizes(data):
    dist = data.draw(distributions())
    t = data.draw(st.integers(0, dist.ndim - 1))
    g = dist.split[t]
    extent = data.draw(st.integers(0, 9))
    p = 1 if g is None else dist.grid_dims[g]
    sizes = data.draw(compositions(extent, p))
    w = dist.with_sizes(t, sizes, extent=extent)
    assert w.shape[t] == extent
    assert w.sizes(t) == (sizes if g is not None else (extent,))
    for u in range(dist.ndim):
        if u != t:
            assert w.offsets[u] == dist.offsets[u]
    wb = dist.with_sizes(t, None, extent=extent)
    assert wb.is_balanced(t)


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def test_validation_split():
    with pytest.raises(ValueError):
        Distribution((4, 4), (2, 2), (0, 2))          # grid axis out of range
    with pytest.raises(ValueError):
        Distribution((4, 4), (2, 2), (-1, None))      # negative grid axis
    with pytest.raises(ValueError):
        Distribution((4, 4), (2, 2), (1, 1))          # duplicated grid axis
    with pytest.raises(ValueError):
        Distribution((4, 4), (2, 2), (0, 1, None))    # more entries than axes
    with pytest.raises(ValueError):
        Distribution((4,), (), (0,))                  # no grid axes at all
    with pytest.raises(TypeError):
        Distribution((4, 4), (2, 2), (0.5, None))
    with pytest.raises(TypeError):
        Distribution((4, 4), (2, 2), ("a", None))
    # valid corner cases
    assert Distribution((), (3,)).grid_size == 3
    assert Distribution((4,), ()).block_box(()) == Box((0,), (4,))
    assert Distribution((4, 4), (2, 2), (1.0, None)).split == (1, None)


def test_validation_sizes_and_shape():
    with pytest.raises(ValueError):
        Distribution((5,), (2,), (0,), [(2, 2)])       # wrong sum
    with pytest.raises(ValueError):
        Distribution((5,), (2,), (0,), [(6, -1)])      # negative size
    with pytest.raises(ValueError):
        Distribution((5,), (2,), (0,), [(5,)])         # wrong number of blocks
    with pytest.raises(ValueError):
        Distribution((5,), (2,), (0,), [(1, 1, 3)])
    with pytest.raises(ValueError):
        Distribution((5, 2), (2,), (0,), [(2, 3)])     # sizes needs one entry per axis
    with pytest.raises(ValueError):
        Distribution((5,), (2,), None, [(2, 3)])       # unsplit axis has one block
    with pytest.raises(TypeError):
        Distribution((5,), (2,), (0,), [(2.5, 2.5)])
    with pytest.raises(ValueError):
        Distribution((-1, 3), (2,), (0,))              # negative extent
    with pytest.raises(TypeError):
        Distribution((2.5, 3), (2,), (0,))
    with pytest.raises(ValueError):
        Distribution((4,), (0,), (0,))                 # grid extent < 1
    with pytest.raises(TypeError):
        Distribution((4,), (1.5,), (0,))


@FAST
@given(distributions(), st.data())
def test_validation_random_bad_split(dist, data):
    ngrid = len(dist.grid_dims)
    t = data.draw(st.integers(0, dist.ndim - 1))
    bad = list(dist.split)
    kind = data.draw(st.sampled_from(["out_of_range", "duplicate", "too_long"]))
    if kind == "out_of_range":
        bad[t] = data.draw(st.one_of(st.integers(ngrid, ngrid + 3), st.integers(-4, -1)))
    elif kind == "duplicate":
        used = [g for g in bad if g is not None]
        assume(used)
        g = data.draw(st.sampled_from(used))
        others = [u for u in range(dist.ndim) if bad[u] != g]
        assume(others)
        bad[data.draw(st.sampled_from(others))] = g
    else:
        bad = bad + [None]
    with pytest.raises(ValueError):
        Distribution(dist.shape, dist.grid_dims, bad)


@FAST
@given(distributions(), st.data())
def test_validation_random_bad_sizes(dist, data):
    split_axes = [t for t, g in enumerate(dist.split) if g is not None]
    assume(split_axes)
    t = data.draw(st.sampled_from(split_axes))
    sizes = [dist.sizes(u) if g is not None else None for u, g in enumerate(dist.split)]
    s = list(sizes[t])
    kind = data.draw(st.sampled_from(["sum", "negative", "length"]))
    if kind == "sum":
        s[data.draw(st.integers(0, len(s) - 1))] += data.draw(st.sampled_from([-1, 1, 2]))
        assume(sum(s) != dist.shape[t])
    elif kind == "negative":
        i = data.draw(st.integers(0, len(s) - 1))
        s[i] -= dist.shape[t] + 1
        s[(i + 1) % len(s)] += dist.shape[t] + 1 if len(s) > 1 else 0
    else:
        if data.draw(st.booleans()) or len(s) == 1:
            s = s + [0]          # one block too many
        else:
            s[-2] += s[-1]       # one block too few (same sum)
            s = s[:-1]
    sizes[t] = tuple(s)
    with pytest.raises(ValueError):
        Distribution(dist.shape, dist.grid_dims, dist.split, sizes)


def test_pickle_round_trip_rebuilds_hash():
    import pickle
    d = Distribution((5, 3), (2, 1), (0, None), [(4, 1), None])
    e = pickle.loads(pickle.dumps(d))
    assert e == d and hash(e) == hash(d) and e.offsets == d.offsets
