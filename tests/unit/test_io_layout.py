"""Pure index math of disttensor.io (no MPI): selections, hyperslabs, writers, batches,
distribution attributes."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.core.distribution import Distribution, rank_to_coords
from disttensor.io.layout import (AxisSelection, batch_indices, check_dataset_name,
                                  decode_distribution, encode_distribution, epoch_order,
                                  file_hyperslab, is_writer, normalize_selection,
                                  selection_shape)

FAST = settings(max_examples=150, deadline=None)


@st.composite
def slice_tuples(draw, shape):
    k = draw(st.integers(0, len(shape)))
    out = []
    for n in shape[:k]:
        lo = draw(st.none() | st.integers(-n - 3, n + 3))
        hi = draw(st.none() | st.integers(-n - 3, n + 3))
        step = draw(st.none() | st.integers(1, 4))
        out.append(slice(lo, hi, step))
    return tuple(out)


@st.composite
def distributions(draw, shape):
    dims = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple))
    free = list(range(len(dims)))
    split, sizes = [], []
    for n in shape:
        g = draw(st.sampled_from([None] + free))
        if g is not None:
            free.remove(g)
            p = dims[g]
            if draw(st.booleans()):
                cuts = sorted(draw(st.lists(st.integers(0, n), min_size=p - 1, max_size=p - 1)))
                b = [0, *cuts, n]
                sizes.append(tuple(y - x for x, y in zip(b[:-1], b[1:])))
            else:
                sizes.append(None)
        else:
            sizes.append(None)
        split.append(g)
    return Distribution(shape, dims, split, sizes)


shapes = st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple)


@FAST
@given(shape=shapes, data=st.data())
def test_selection_matches_numpy(shape, data):
    sl = data.draw(slice_tuples(shape))
    sel = normalize_selection(sl, shape)
    a = np.arange(math.prod(shape)).reshape(shape)
    want = a[sl]
    assert selection_shape(sel) == want.shape
    # the selection's elements are the file elements start + step * i
    idx = np.ix_(*[np.arange(s.start, s.start + s.step * s.count, s.step, dtype=np.int64)
                   for s in sel]) if shape else ()
    np.testing.assert_array_equal(a[idx] if shape else a, want)


@FAST
@given(shape=shapes, data=st.data())
def test_block_hyperslabs_tile_the_selection(shape, data):
    """Every block's file hyperslab is the block of the selected array."""
    sl = data.draw(slice_tuples(shape))
    sel = normalize_selection(sl, shape)
    dist = data.draw(distributions(selection_shape(sel)))
    a = np.arange(math.prod(shape)).reshape(shape)
    want = a[sl]
    for r in range(dist.grid_size):
        coords = rank_to_coords(r, dist.grid_dims)
        box = dist.block_box(coords)
        start, stride, count = file_hyperslab(sel, box)
        idx = tuple(slice(s0, s0 + st_ * c, st_) if c else slice(0, 0)
                    for s0, st_, c in zip(start, stride, count))
        np.testing.assert_array_equal(a[idx], want[box.slices()])


@FAST
@given(shape=shapes, data=st.data())
def test_exactly_one_writer_per_nonempty_block(shape, data):
    dist = data.draw(distributions(shape))
    writers: dict = {}
    for r in range(dist.grid_size):
        coords = rank_to_coords(r, dist.grid_dims)
        box = dist.block_box(coords)
        if is_writer(dist, coords):
            assert box.size > 0
            writers.setdefault(box, []).append(r)
    blocks = {dist.block_box(rank_to_coords(r, dist.grid_dims)) for r in range(dist.grid_size)}
    nonempty = {b for b in blocks if b.size > 0}
    assert set(writers) == nonempty
    assert all(len(v) == 1 for v in writers.values())
    # the written blocks tile the array
    assert sum(b.size for b in nonempty) == math.prod(shape)


def test_selection_errors():
    with pytest.raises(ValueError, match="step must be > 0"):
        normalize_selection((slice(None, None, -1),), (4,))
    with pytest.raises(ValueError, match="step must be > 0"):
        normalize_selection((slice(None, None, 0),), (4,))
    with pytest.raises(TypeError, match="must be a slice"):
        normalize_selection((1,), (4,))
    with pytest.raises(ValueError, match="has 2 entries"):
        normalize_selection((slice(None), slice(None)), (4,))
    with pytest.raises(TypeError):
        normalize_selection("abc", (4,))
    assert normalize_selection(slice(1, 3), (4, 2)) == (AxisSelection(1, 1, 2),
                                                        AxisSelection(0, 1, 2))
    assert normalize_selection(None, ()) == ()


@FAST
@given(n=st.integers(0, 40), b=st.integers(1, 9), seed=st.integers(0, 2**32), e=st.integers(0, 5),
       shuffle=st.booleans(), drop=st.booleans())
def test_batches_cover_the_epoch(n, b, seed, e, shuffle, drop):
    batches = batch_indices(n, b, seed, e, shuffle, drop)
    order = epoch_order(n, seed, e, shuffle)
    assert sorted(order.tolist()) == list(range(n))
    flat = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    np.testing.assert_array_equal(flat, order[:len(flat)])
    assert all(len(x) == b for x in batches[:-1])
    if drop:
        assert len(batches) == n // b and all(len(x) == b for x in batches)
    else:
        assert len(flat) == n
    if not shuffle:
        np.testing.assert_array_equal(order, np.arange(n))


def test_epoch_order_is_the_documented_permutation():
    np.testing.assert_array_equal(epoch_order(10, 3, 2, True),
                                  np.random.default_rng([3, 2]).permutation(10))
    assert not np.array_equal(epoch_order(50, 3, 0, True), epoch_order(50, 3, 1, True))
    np.testing.assert_array_equal(epoch_order(50, 3, 1, True), epoch_order(50, 3, 1, True))


@FAST
@given(shape=shapes, data=st.data())
def test_distribution_attributes_round_trip(shape, data):
    dist = data.draw(distributions(shape))
    assert decode_distribution(encode_distribution(dist)) == dist


def test_dataset_names():
    assert check_dataset_name("a/b") == "a/b"
    assert check_dataset_name("/x") == "x"
    for bad in ("", "/", "a//b", "a/./b", "../x", "a/"):
        with pytest.raises(ValueError):
            check_dataset_name(bad)
    with pytest.raises(TypeError):
        check_dataset_name(3)


def test_hyperslab_of_empty_block():
    sel = normalize_selection((slice(1, 9, 3),), (10,))
    start, stride, count = file_hyperslab(sel, Distribution((3,), (4,), (0,)).block_box((3,)))
    assert count == (0,)
    assert list(itertools.islice(range(1, 9, 3), 3)) == [1, 4, 7]
