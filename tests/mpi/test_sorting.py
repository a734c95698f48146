"""Sorting, searching, selections and statistics of DistArrays (disttensor.routines.sorting,
.searching, .indexing masks, .statistics, .sets) against NumPy: exact comparisons (sorting,
searching, counting and selection are exact; quantiles to 1e-12 relative), on 1-D and 2-D
grids with every split, uneven and empty blocks, data with many ties and NaNs; argsort
stability; results keep the documented distributions; bad input raises on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from checks import SIZE, check_blocks as check, collective_checks, dist, examples, expect, \
    last_rank_only, mismatch
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts, shapes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
COMM = MPI.COMM_WORLD


def data(shape, kind: str, seed: int) -> np.ndarray:
    """Few distinct values (many ties); NaNs and infinities in float data."""
    rng = np.random.default_rng(seed)
    if kind == "b":
        return rng.random(shape) < 0.5
    v = rng.integers(-3, 4, size=shape)
    if kind == "i":
        return v.astype(np.int64)
    a = v.astype(np.float64) / 2
    if a.size:
        a.flat[rng.integers(0, a.size, size=max(1, a.size // 6))] = np.nan
        a.flat[rng.integers(0, a.size)] = -np.inf
    return a


def ref_sort(a, axis, descending):
    if not descending:
        return np.sort(a, axis=axis, kind="stable"), np.argsort(a, axis=axis, kind="stable")
    f = np.flip(a, axis=axis)
    i = a.shape[axis] - 1 - np.flip(np.argsort(f, axis=axis, kind="stable"), axis=axis)
    return np.flip(np.sort(f, axis=axis, kind="stable"), axis=axis), i


@settings(max_examples=examples(40))
@given(shape=shapes(1, 3, max_side=7), data_=st.data(), seed=st.integers(0, 2**16),
       kind=st.sampled_from("fib"), descending=st.booleans())
@collective_checks
def test_sort_argsort(shape, data_, seed, kind, descending):
    layout = data_.draw(layouts(shape, SIZE, 2))
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    a = data(shape, kind, seed)
    x = dist(a, layout)
    ws, wi = ref_sort(a, axis, descending)
    check(dt.sort(x, axis=axis, descending=descending), ws, "sort", layout=layout)
    check(dt.argsort(x, axis=axis, descending=descending), wi.astype(np.int64), "argsort",
          layout=layout)
    if not descending:
        check(np.sort(x, axis=axis), ws, "np.sort")
        check(x.argsort(axis=axis), wi.astype(np.int64), "DistArray.argsort", layout=layout)
        y = x.copy()
        y.sort(axis=axis)
        check(y, ws, "DistArray.sort (in place)", layout=layout)


@settings(max_examples=examples(12))
@given(n=st.integers(0, 300), data_=st.data(), seed=st.integers(0, 2**16),
       kind=st.sampled_from("fi"), descending=st.booleans())
@collective_checks
def test_sample_sort_long(n, data_, seed, kind, descending):
    """Long 1-D arrays (the sample sort proper): many elements per rank, uneven blocks."""
    layout = data_.draw(layouts((n,), SIZE, 2))
    a = data((n,), kind, seed)
    x = dist(a, layout)
    ws, wi = ref_sort(a, 0, descending)
    check(dt.sort(x, descending=descending), ws, "sort", layout=layout)
    check(dt.argsort(x, descending=descending), wi, "argsort (stable)", layout=layout)
    check(np.argsort(x, axis=None), np.argsort(a, kind="stable"), "np.argsort axis=None")


@settings(max_examples=examples(25))
@given(n=st.integers(0, 30), shape=shapes(0, 2, max_side=5), data_=st.data(),
       seed=st.integers(0, 2**16), side=st.sampled_from(["left", "right"]))
@collective_checks
def test_searchsorted(n, shape, data_, seed, side):
    a = np.sort(data((n,), "f", seed))
    v = data(shape, "f", seed + 1)
    dims, split, sizes = data_.draw(layouts((n,), SIZE, 2))
    x1 = dist(a, (dims, split, sizes))
    l2 = data_.draw(layouts(shape, SIZE, 2))
    x2 = dist(v, l2)
    check(dt.searchsorted(x1, x2, side=side), np.searchsorted(a, v, side=side), "DistArray x2",
          layout=l2)
    got = np.searchsorted(x1, v, side=side)
    expect(np.array_equal(got, np.searchsorted(a, v, side=side)), "NumPy x2")
    expect(dt.searchsorted(x1, 0.5, side=side) == np.searchsorted(a, 0.5, side=side), "scalar")


@settings(max_examples=examples(30))
@given(shape=shapes(1, 3, max_side=6), data_=st.data(), seed=st.integers(0, 2**16))
@collective_checks
def test_nonzero_masks(shape, data_, seed):
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = data(shape, "i", seed)
    x = dist(a, layout)
    m = a > 0
    xm = x > 0
    for got, want in zip(dt.nonzero(x), np.nonzero(a)):
        check(got, want.astype(np.int64), "nonzero")
    for got, want in zip(x.nonzero(), np.nonzero(a)):
        check(got, want.astype(np.int64), "DistArray.nonzero")
    check(np.argwhere(x), np.argwhere(a).astype(np.int64), "argwhere")
    expect(np.count_nonzero(x) == np.count_nonzero(a), "count_nonzero")
    for ax in range(len(shape)):
        check(dt.count_nonzero(x, axis=ax), np.count_nonzero(a, axis=ax).astype(np.int64),
              "count_nonzero axis")
    check(x[xm], a[m], "x[DistArray mask]")
    check(x[m], a[m], "x[NumPy mask]")
    # the hits of a 1-D array stay on their owners (uneven result sizes)
    if len(shape) == 1 and layout[1][0] is not None:
        r = x[xm]
        expect(r.local.shape[0] == int(m[x.local_slices].sum()), "x[mask] keeps hits local")
    y = x.copy()
    y[xm] = 9
    b = a.copy()
    b[m] = 9
    check(y, b, "x[mask] = scalar", layout=layout)
    k = int(m.sum())
    vals = np.arange(100, 100 + k, dtype=np.int64)
    y = x.copy()
    y[xm] = vals
    b = a.copy()
    b[m] = vals
    check(y, b, "x[mask] = NumPy values", layout=layout)
    y = x.copy()
    y[m] = dt.from_global(vals, grid=x.grid, split=(0,))
    check(y, b, "x[mask] = DistArray values", layout=layout)


@settings(max_examples=examples(30))
@given(shape=shapes(1, 3, max_side=6), data_=st.data(), seed=st.integers(0, 2**16),
       kind=st.sampled_from("fib"))
@collective_checks
def test_unique(shape, data_, seed, kind):
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = data(shape, kind, seed)
    x = dist(a, layout)
    got = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    want = np.unique(a, return_index=True, return_inverse=True, return_counts=True)
    for name, g, w in zip(("values", "index", "inverse", "counts"), got, want):
        check(g, w if name == "values" else w.astype(np.int64), f"np.unique {name}")
    check(got[2], want[2].astype(np.int64), "inverse keeps x's layout", layout=layout)
    check(dt.unique(x), np.unique(a), "np.unique values only")
    for name, g, w in zip(("values", "indices", "inverse", "counts"), dt.unique_all(x),
                          np.unique_all(a)):  # array API: NaNs are distinct
        check(g, w if name == "values" else w.astype(np.int64), f"unique_all {name}")
    # NumPy >= 2.3 may return unique_values unsorted (hash based); ours are sorted
    check(dt.unique_values(x), np.unique(a, equal_nan=False), "unique_values")
    c = dt.unique_counts(x)
    check(c.counts, np.unique_counts(a).counts.astype(np.int64), "unique_counts")


@settings(max_examples=examples(25))
@given(shape=shapes(1, 3, max_side=6, min_side=1), data_=st.data(), seed=st.integers(0, 2**16),
       method=st.sampled_from(["linear", "lower", "higher", "nearest", "midpoint"]),
       keepdims=st.booleans(), nans=st.booleans())
@collective_checks
def test_quantile(shape, data_, seed, method, keepdims, nans):
    layout = data_.draw(layouts(shape, SIZE, 2))
    axis = data_.draw(st.sampled_from([None] + list(range(len(shape)))))
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape)
    if nans:
        a.flat[rng.integers(0, a.size)] = np.nan
    x = dist(a, layout)
    for q in (0.3, [0.0, 0.25, 0.5, 1.0]):
        got = np.quantile(x, q, axis=axis, method=method, keepdims=keepdims)
        check(got, np.quantile(a, q, axis=axis, method=method, keepdims=keepdims),
              f"quantile {method} q={q}", rtol=1e-12, atol=1e-15)
    check(np.percentile(x, 40, axis=axis, keepdims=keepdims),
          np.percentile(a, 40, axis=axis, keepdims=keepdims), "percentile", rtol=1e-12,
          atol=1e-15)
    check(np.median(x, axis=axis), np.median(a, axis=axis), "median", rtol=1e-12, atol=1e-15)
    if nans and a.size > 1:
        a.flat[rng.integers(0, a.size)] = np.nan
        if axis is not None and a.ndim > 1:  # one line of NaNs only
            a[(slice(None),) * axis + (0,)] = np.nan
    x = dist(a, layout)
    for q in (0.3, [0.0, 0.25, 0.5, 1.0]):
        check(np.nanquantile(x, q, axis=axis, method=method, keepdims=keepdims),
              np.nanquantile(a, q, axis=axis, method=method, keepdims=keepdims),
              f"nanquantile {method} q={q}", rtol=1e-12, atol=1e-15)
    check(np.nanpercentile(x, 40, axis=axis), np.nanpercentile(a, 40, axis=axis),
          "nanpercentile", rtol=1e-12, atol=1e-15)
    check(np.nanmedian(x, axis=axis, keepdims=keepdims),
          np.nanmedian(a, axis=axis, keepdims=keepdims), "nanmedian", rtol=1e-12, atol=1e-15)


def test_errors(comm):
    g = dt.ProcessGrid((SIZE,))
    x = dt.from_global(np.arange(10.0), grid=g, split=(0,))
    m = dt.from_global(np.ones((2, 5)), grid=g, split=(0, None))
    assert_raises_all(comm, np.exceptions.AxisError, "axis", lambda: dt.sort(x, axis=1))
    assert_raises_all(comm, np.exceptions.AxisError, "axis", lambda: dt.argsort(m, axis=-3))
    assert_raises_all(comm, ValueError, "x1 must be 1-D", lambda: dt.searchsorted(m, x))
    assert_raises_all(comm, ValueError, "side must be", lambda: dt.searchsorted(x, x, side="up"))
    assert_raises_all(comm, IndexError, "boolean index did not match", lambda: x[np.ones(3, bool)])
    assert_raises_all(comm, IndexError, "integer .or boolean", lambda: x[x])
    assert_raises_all(comm, ValueError, "cannot assign 3 input values",
                      lambda: x.__setitem__(x > 4, np.arange(3.0)))
    assert_raises_all(comm, ValueError, r"range \[0, 1\]", lambda: dt.quantile(x, 1.5))
    assert_raises_all(comm, ValueError, r"range \[0, 100\]", lambda: dt.percentile(x, -1))
    assert_raises_all(comm, ValueError, "'method' must be", lambda: dt.quantile(x, 0.5,
                                                                               method="x"))
    neg = dt.from_global(np.array([0, -1, 2]), grid=g, split=(0,))
    assert_raises_all(comm, ValueError, "negative", lambda: dt.bincount(neg))
    assert_raises_all(comm, TypeError, "Cannot cast", lambda: dt.bincount(x))
    assert_raises_all(comm, ValueError, "0d arrays", lambda: dt.nonzero(x.sum()))
    assert_raises_all(comm, TypeError, "axis=None", lambda: np.unique(m, axis=0))
    assert_raises_all(comm, ValueError, r"kth\(=10\) out of bounds \(10\)",
                      lambda: dt.partition(x, 10))
    assert_raises_all(comm, ValueError, r"kth\(=-1\) out of bounds",
                      lambda: dt.argpartition(x, [2, -11]))
    assert_raises_all(comm, TypeError, "Partition index must be integer",
                      lambda: dt.partition(x, 1.5))
    assert_raises_all(comm, ValueError, "same shape", lambda: dt.lexsort([x, x[:4]]))
    assert_raises_all(comm, IndexError, "out of bounds for axis 0 with size 0",
                      lambda: dt.quantile(x[:0], 0.5))
    if SIZE > 1:
        with mismatch("searchsorted", "side"):
            dt.searchsorted(x, x, side=last_rank_only("right", "left"))
        with mismatch("sort", "axis"):
            dt.sort(m, axis=last_rank_only(0, 1))


@collective_checks
def test_alltoallv_adjoint(comm):
    """The sample sort's exchange is a permutation P of the concatenated pieces; its adjoint
    is the reverse exchange (pieces sent back): <P u, v> = <u, P* v>."""
    from disttensor.routines.sorting import alltoallv
    rng = np.random.default_rng(100 + comm.rank)
    counts = rng.integers(0, 5, comm.size)
    u = rng.normal(size=int(counts.sum()))
    pu, rc = alltoallv(comm, u, counts)
    v = np.random.default_rng(200 + comm.rank).normal(size=pu.shape[0])
    ptv, back = alltoallv(comm, v, rc)
    expect(np.array_equal(back, counts), "reverse exchange returns the send counts")
    lhs = comm.allreduce(float(pu @ v))
    rhs = comm.allreduce(float(u @ ptv))
    expect(abs(lhs - rhs) <= 1e-12 * (abs(lhs) + 1), f"<Pu, v> = {lhs} != <u, P*v> = {rhs}")


@settings(max_examples=examples(25))
@given(shape=shapes(1, 2, max_side=7), data_=st.data(), seed=st.integers(0, 2**16),
       kind=st.sampled_from("fi"))
@collective_checks
def test_partition_lexsort(shape, data_, seed, kind):
    """partition/argpartition: NumPy's guarantees (the kth elements in sorted position, none
    larger before, none smaller after; argpartition's indices a permutation that partitions);
    lexsort and sort_complex equal to NumPy's (both are fully determined)."""
    layout = data_.draw(layouts(shape, SIZE, 2))
    axis = data_.draw(st.sampled_from([None] + list(range(-len(shape), len(shape)))))
    a = data(shape, kind, seed)
    n = a.size if axis is None else a.shape[axis]
    if n == 0:
        return
    kth = data_.draw(st.one_of(st.integers(-n, n - 1),
                               st.lists(st.integers(0, n - 1), min_size=1, max_size=3)))
    x = dist(a, layout)
    ref = np.sort(a, axis=axis)
    lines = a.reshape(-1) if axis is None else a
    ax = 0 if axis is None else axis
    ks = np.atleast_1d(kth) % n

    def partitioned(p, what):
        p = np.moveaxis(p, ax, -1)
        r = np.moveaxis(ref if axis is not None else ref.reshape(-1), ax, -1)
        ok = np.array_equal(p[..., ks], r[..., ks], equal_nan=True)
        for k in ks:  # NaNs sort last: compare as NumPy orders them
            before, at, after = p[..., :k], p[..., k:k + 1], p[..., k + 1:]
            ok &= bool(np.all((before <= at) | np.isnan(at)))
            ok &= bool(np.all((after >= at) | np.isnan(after)))
        expect(ok, f"{what}: partition property at kth={kth}")

    got = dt.partition(x, kth, axis=axis)
    check(got, np.partition(a, kth, axis=axis), "partition", values=False,
          layout=layout if axis is not None else None)
    partitioned(got.to_numpy(), "partition")
    partitioned(np.partition(x, kth, axis=axis).to_numpy(), "np.partition")
    idx = dt.argpartition(x, kth, axis=axis)
    check(idx, np.argpartition(a, kth, axis=axis).astype(np.int64), "argpartition",
          values=False)
    gi = idx.to_numpy()
    expect(np.array_equal(np.sort(gi, axis=ax), np.sort(np.argsort(lines, axis=ax), axis=ax)),
           "argpartition: a permutation of each line")
    partitioned(np.take_along_axis(lines, gi, axis=ax), "argpartition")
    b = data(shape, "i", seed + 1)
    xb = dist(b, layout)
    lax = -1 if axis is None else axis
    check(dt.lexsort([x, xb], axis=lax), np.lexsort([a, b], axis=lax), "lexsort",
          layout=layout)
    check(np.lexsort((xb, x), axis=lax), np.lexsort((b, a), axis=lax), "np.lexsort")
    check(dt.sort_complex(x), np.sort_complex(a), "sort_complex", layout=layout)


@collective_checks
def test_quantile_dtype_and_empty(comm):
    """NumPy 2's dtypes of quantiles (float32 data: a Python float q keeps float32, a list
    or array q gives float64; median keeps float32; integers give float64) and the median of
    empty lines (NaN, or an empty result), on split and unsplit axes."""
    g = dt.ProcessGrid((SIZE,))
    rng = np.random.default_rng(5)
    for shape, split in (((11,), (0,)), ((5, 6), (0, None)), ((5, 6), (None, 0))):
        for dtype in (np.float32, np.float16, np.int32):
            a = (rng.normal(size=shape) * 8).astype(dtype)
            x = dt.from_global(a, grid=g, split=split)
            for axis in (None, 0, len(shape) - 1):
                for q in (0.25, [0.25, 0.5], np.float32(0.5), np.array([0.1])):
                    for method in ("linear", "lower") if dtype is not np.float16 else ("linear",):
                        what = f"quantile {dtype.__name__} {shape} {split} {axis} {q!r}"
                        check(dt.quantile(x, q, axis=axis, method=method),
                              np.quantile(a, q, axis=axis, method=method), what,
                              rtol=1e-6, atol=1e-6)
                check(dt.percentile(x, [30.0], axis=axis), np.percentile(a, [30.0], axis=axis),
                      "percentile dtype", rtol=1e-6, atol=1e-6)
                check(dt.median(x, axis=axis), np.median(a, axis=axis), "median dtype",
                      rtol=1e-3, atol=1e-3)
                check(dt.nanmedian(x, axis=axis), np.nanmedian(a, axis=axis),
                      "nanmedian dtype", rtol=1e-3, atol=1e-3)
    for shape, split, axis in (((0,), (0,), None), ((0, 3), (0, None), 0),
                               ((0, 3), (0, None), 1), ((3, 0), (0, None), 1),
                               ((3, 0), (None, 0), 1), ((3, 0), (0, None), 0),
                               ((0, 4), (None, 0), None)):
        for dtype in (np.float64, np.float32):
            a = np.zeros(shape, dtype)
            x = dt.from_global(a, grid=g, split=split)
            for keepdims in (False, True):
                what = f"median of empty {shape} split {split} axis {axis} {keepdims}"
                check(dt.median(x, axis=axis, keepdims=keepdims),
                      np.median(a, axis=axis, keepdims=keepdims), what)
                check(np.nanmedian(x, axis=axis, keepdims=keepdims),
                      np.nanmedian(a, axis=axis, keepdims=keepdims), "nan" + what)
                check(dt.nanquantile(x, 0.5, axis=axis, keepdims=keepdims),
                      np.nanquantile(a, 0.5, axis=axis, keepdims=keepdims), "nanquantile")
