"""Advanced indexing of DistArrays (disttensor.routines.fancy_indexing) against NumPy: gathers
``x[key]`` and scatters ``x[key] = v`` with integer arrays (NumPy arrays, lists, DistArrays in
their own layouts), integers, slices, None and partial boolean masks, on 1-D and 2-D grids
with uneven and empty blocks; row masks and the layout they keep; ``ufunc.at`` and ``put``
with duplicate indices; the scatter-add as the adjoint of the gather; bad input raising
NumPy's errors on every rank.  Data are small integers (as floats), so every result is exact."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from checks import SIZE, check_blocks as check, collective_checks, dist, examples, \
    last_rank_only, mismatch
from conftest import assert_raises_all
from disttensor.testing import assert_adjoint
from disttensor.testing.strategies import layouts, shapes

COMM = MPI.COMM_WORLD


def values(shape, seed):
    return np.random.default_rng(seed).integers(-9, 10, size=shape).astype(np.float64)


@st.composite
def index_entry(draw, n):
    """An integer index array for an axis of length ``n`` (negative entries, duplicates),
    as a NumPy array, a list or a DistArray spec ``("dist", array)``."""
    ishape = draw(st.sampled_from([(3,), (1,), (0,), (2, 1), (5,)] if n else [(0,)]))
    size = int(np.prod(ishape))
    a = np.asarray(draw(st.lists(st.integers(-n, n - 1), min_size=size, max_size=size))
                   if n else [], dtype=np.int64).reshape(ishape)
    how = draw(st.sampled_from(["numpy", "list", "dist"]))
    return ("dist", a) if how == "dist" else a.tolist() if how == "list" else a


@st.composite
def fancy_keys(draw, shape, write: bool):
    """A key with at least one index array or partial mask (no None / negative steps when
    ``write``)."""
    nd = len(shape)
    entries, axis = [], 0
    adv = False
    while axis < nd:
        n = shape[axis]
        kinds = ["array", "slice", "int", "bool", "end"] + ([] if write else ["none"])
        kind = draw(st.sampled_from(kinds))
        if kind == "end" and adv:
            break
        if kind == "none":
            entries.append(None)
            continue
        if kind == "int" and n:
            entries.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            step = draw(st.sampled_from([1, 2] if write else [1, 2, -1]))
            entries.append(slice(draw(st.integers(0, n)), None, step))
        elif kind == "bool":
            k = draw(st.integers(1, nd - axis))
            size = int(np.prod(shape[axis:axis + k]))
            m = np.asarray(draw(st.lists(st.booleans(), min_size=size, max_size=size)),
                           dtype=bool)
            m = m.reshape(shape[axis:axis + k])
            entries.append(("dist", m) if draw(st.booleans()) else m)
            axis += k
            adv = True
            continue
        else:
            entries.append(draw(index_entry(n)))
            adv = True
        axis += 1
    if not adv:
        entries.append(draw(index_entry(shape[0])) if axis >= nd else draw(index_entry(shape[axis])))
        if axis >= nd:
            entries = entries[-1:]  # one array on axis 0
    return tuple(entries)


def materialize(key, data_, shape, what="key"):
    """(NumPy key, DistArray key): DistArray specs become DistArrays in a drawn layout.  Keys
    whose index arrays do not broadcast together are rejected (``test_errors`` has them)."""
    try:
        np.empty(shape)[tuple(k[1] if isinstance(k, tuple) else k for k in key)]
    except IndexError as e:
        assert "shape mismatch" in str(e), e
        reject()
    np_key, dt_key = [], []
    for k in key:
        if isinstance(k, tuple) and k and k[0] == "dist":
            a = k[1]
            layout = data_.draw(layouts(a.shape, SIZE, 2), label=f"{what} layout")
            np_key.append(a)
            dt_key.append(dist(a, layout))
        else:
            np_key.append(k)
            dt_key.append(k)
    return tuple(np_key), tuple(dt_key)


@settings(max_examples=examples(6))
@given(shape=shapes(1, 3, 5), data_=st.data(), seed=st.integers(0, 2**16))
@collective_checks
def test_getitem(shape, data_, seed):
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = values(shape, seed)
    x = dist(a, layout)
    np_key, dt_key = materialize(data_.draw(fancy_keys(shape, write=False)), data_, shape)
    check(x[dt_key], a[np_key], f"x[{np_key}]")


@settings(max_examples=examples(6))
@given(shape=shapes(1, 3, 5), data_=st.data(), seed=st.integers(0, 2**16),
       vkind=st.sampled_from(["scalar", "numpy", "row", "dist"]))
@collective_checks
def test_setitem(shape, data_, seed, vkind):
    """Assignment; duplicate indices: the last in row-major index order wins (as NumPy)."""
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = values(shape, seed)
    x = dist(a, layout)
    np_key, dt_key = materialize(data_.draw(fancy_keys(shape, write=True)), data_, shape)
    rshape = a[np_key].shape
    v = values(rshape, seed + 1) + 100
    if vkind == "scalar":
        v_np = v_dt = 7.0
    elif vkind == "row":
        v_np = v_dt = v[(0,) * (len(rshape) - 1)] if all(rshape[:-1]) else v
    elif vkind == "numpy":
        v_np = v_dt = v
    else:
        v_np, v_dt = v, dist(v, data_.draw(layouts(rshape, SIZE, 2), label="value layout"))
    b = a.copy()
    b[np_key] = v_np
    x[dt_key] = v_dt
    check(x, b, f"x[{np_key}] = {vkind}", layout=layout)


@settings(max_examples=examples(6))
@given(shape=shapes(1, 3, 5), data_=st.data(), seed=st.integers(0, 2**16),
       uf=st.sampled_from([np.add, np.subtract, np.maximum, np.negative]))
@collective_checks
def test_ufunc_at(shape, data_, seed, uf):
    """``ufunc.at`` applies every occurrence of a duplicate index."""
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = values(shape, seed)
    x = dist(a, layout)
    np_key, dt_key = materialize(data_.draw(fancy_keys(shape, write=True)), data_, shape)
    args_np = args_dt = ()
    if uf.nin == 2:
        v = values(a[np_key].shape, seed + 1)
        args_np, args_dt = (v,), (v if data_.draw(st.booleans()) else
                                  dist(v, data_.draw(layouts(v.shape, SIZE, 2))),)
    b = a.copy()
    uf.at(b, np_key if len(np_key) > 1 else np_key[0], *args_np)
    uf.at(x, dt_key if len(dt_key) > 1 else dt_key[0], *args_dt)
    check(x, b, f"{uf.__name__}.at({np_key})", layout=layout)


@settings(max_examples=examples(6))
@given(shape=shapes(0, 3, 4), data_=st.data(), seed=st.integers(0, 2**16),
       mode=st.sampled_from(["raise", "wrap", "clip"]))
@collective_checks
def test_put(shape, data_, seed, mode):
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = values(shape, seed)
    x = dist(a, layout)
    n = a.size
    lo, hi = (-n, n - 1) if mode == "raise" else (-2 * n - 3, 2 * n + 3)
    ind = np.asarray(data_.draw(st.lists(st.integers(lo, hi), max_size=6) if n else
                                st.just([])), dtype=np.int64)
    v = values((data_.draw(st.integers(1, 3)),), seed + 1)
    b = a.copy()
    np.put(b, ind, v, mode=mode)
    np.put(x, ind, v, mode=mode)
    check(x, b, f"np.put({ind}, {v}, {mode})", layout=layout)
    dt.put(x, dist(ind, data_.draw(layouts(ind.shape, SIZE, 2))), -v, mode=mode)
    np.put(b, ind, -v, mode=mode)
    check(x, b, "dt.put with a DistArray of indices", layout=layout)
    x.put(ind[::-1], 2 * v, mode=mode)
    b.put(ind[::-1], 2 * v, mode=mode)
    check(x, b, "DistArray.put", layout=layout)


def hits_layout(mask, layout, nrows, ncols_shape):
    """The documented layout of ``X[m]`` for a row mask ``m`` of ``X`` (laid out as
    ``layout``): rows where the mask's own blocks hold them (nonzero's layout)."""
    dims, split, sizes = layout
    d = dt.Distribution((nrows,) + ncols_shape, dims, split, sizes)
    g = d.split[0]
    rows = None
    if g is not None:
        rows = [int(mask[slice(*d.block_range(0, c))].sum()) for c in range(dims[g])]
    return dims, split, [rows] + [d.sizes(t) if d.split[t] is not None else None
                                  for t in range(1, len(d.shape))]


@settings(max_examples=examples(6))
@given(shape=shapes(2, 3, 5), data_=st.data(), seed=st.integers(0, 2**16))
@collective_checks
def test_row_mask(shape, data_, seed):
    """``X[X[:, 0] > 0]``: NumPy's rows, each kept on the rank that holds it (no row moves);
    assignment through the mask."""
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = values(shape, seed)
    x = dist(a, layout)
    first = (slice(None),) + (0,) * (len(shape) - 1)  # X[:, 0] of a 2-D X
    m_np = a[first] > 0 if all(shape[1:]) else np.zeros(shape[0], bool)
    m = x[first] > 0 if all(shape[1:]) else dist(m_np, data_.draw(layouts(m_np.shape, SIZE)))
    want = a[m_np]
    got = x[m]
    same_layout = all(shape[1:]) and m.split[0] == x.split[0]
    check(got, want, "X[X[:, 0] > 0]",
          layout=hits_layout(m_np, layout, shape[0], shape[1:]) if same_layout else None)
    check(x[m_np], want, "X[numpy mask]")
    b = a.copy()
    b[m_np] = -1.0
    x[m] = -1.0
    check(x, b, "X[mask] = -1", layout=layout)
    row = values(shape[1:], seed + 2)
    b[~m_np] = row
    x[~m] = row
    check(x, b, "X[~mask] = row", layout=layout)


@settings(max_examples=examples(6))
@given(shape=shapes(1, 2, 6, min_side=1), data_=st.data(), seed=st.integers(0, 2**16))
def test_gather_scatter_adjoint(shape, data_, seed):
    """<x[idx], y> == <x, scatter_add(idx, y)>: ``np.add.at`` with duplicates is the adjoint
    of the gather."""
    layout = data_.draw(layouts(shape, SIZE, 2))
    x = dist(values(shape, seed), layout)
    np_key, dt_key = materialize(data_.draw(fancy_keys(shape, write=True)), data_, shape)
    rshape = values(shape, 0)[np_key].shape
    y = dist(values(rshape, seed + 1), data_.draw(layouts(rshape, SIZE, 2)))

    def gather(v):
        return v[dt_key]

    def scatter_add(w):
        z = x * 0.0
        np.add.at(z, dt_key, w)
        return z

    assert_adjoint(gather, scatter_add, x, y, comm=COMM)


def test_documented_layouts():
    """Balanced along the first index axis over the grid axis of the split indexed axis; whole
    when no indexed axis is split; the kept axes keep their split."""
    a = values((4 * SIZE + 1, 6), 1)
    x = dt.from_global(a)  # split (0, None)
    idx = np.array([3, 0, 4 * SIZE, 3, 1, 2, 0])
    r = x[idx]
    check(r, a[idx], "rows", layout=((SIZE,), (0, None), None))
    check(x[:, [5, 0, 5]], a[:, [5, 0, 5]], "columns", layout=((SIZE,), (0, None), None))
    xc = dt.from_global(a, split=(None, 0))
    check(xc[idx], a[idx], "rows of a column-split array", layout=((SIZE,), (None, 0), None))
    di = dt.from_global(idx)
    check(x[di], a[idx], "DistArray index", layout=((SIZE,), (0, None), None))
    from checks import settle
    settle()


def test_errors():
    n = 2 * SIZE + 1
    x = dt.from_global(values((n, 3), 0))
    bad = np.zeros(4 * SIZE, dtype=np.int64)
    bad[-1] = n  # only the last rank's block holds it
    bad_d = dt.from_global(bad)
    msg = rf"index {n} is out of bounds for axis 0 with size {n}"
    assert_raises_all(COMM, IndexError, msg, lambda: x[bad_d])
    assert_raises_all(COMM, IndexError, msg, lambda: x.__setitem__(bad_d, 1.0))
    assert_raises_all(COMM, IndexError, msg, lambda: np.add.at(x, bad_d, 1.0))
    assert_raises_all(COMM, IndexError, r"index -4 is out of bounds for axis 1 with size 3",
                      lambda: x[:, [0, -4]])
    assert_raises_all(COMM, IndexError, rf"index {3 * n} is out of bounds for axis 0 with size "
                      rf"{3 * n}", lambda: np.put(x, [3 * n], 1.0))
    assert_raises_all(COMM, IndexError,
                      rf"boolean index did not match indexed array along axis 0; size of axis "
                      rf"is {n} but size of corresponding boolean axis is {n + 1}",
                      lambda: x[np.ones(n + 1, bool)])
    mask_d = dt.from_global(np.ones(n - 1, bool))
    assert_raises_all(COMM, IndexError, "boolean index did not match", lambda: x[mask_d])
    assert_raises_all(COMM, IndexError, "boolean index did not match",
                      lambda: x.__setitem__(mask_d, 0.0))
    assert_raises_all(COMM, IndexError, r"arrays used as indices must be of integer \(or "
                      r"boolean\) type", lambda: x[np.array([0.0])])
    assert_raises_all(COMM, IndexError, "shape mismatch: indexing arrays could not be broadcast "
                      r"together with shapes \(2,\) \(3,\)", lambda: x[[0, 1], [0, 1, 2]])
    assert_raises_all(COMM, ValueError, r"shape mismatch: value array of shape \(4,\) could "
                      r"not be broadcast to indexing result of shape \(2,3\)",
                      lambda: x.__setitem__([0, 1], np.ones(4)))
    assert_raises_all(COMM, TypeError, "positive step and no None",
                      lambda: x.__setitem__((None, [0]), 1.0))
    assert_raises_all(COMM, ValueError, "second operand needed",
                      lambda: np.add.at(x, [0]))
    assert_raises_all(COMM, ValueError, "clipmode must be one of",
                      lambda: np.put(x, [0], 1.0, mode="bad"))
    if SIZE > 1:
        with mismatch("getitem", "key"):
            x[last_rank_only([0, 1], [1, 0])]
        with mismatch("setitem", "key"):
            x[last_rank_only([0, 1], [1, 0])] = 1.0


def test_duplicates_last_wins_across_ranks():
    """Duplicates spread over the blocks of several ranks: the last in index order wins."""
    x = dt.zeros((3,))
    idx = np.array([1, 2, 1] * (2 * SIZE))
    v = np.arange(idx.size, dtype=np.float64)
    b = np.zeros(3)
    b[idx] = v
    x[idx] = v
    check(x, b, "x[dup] = v")
    x[dt.from_global(idx)] = dt.from_global(v + 1)
    b[idx] = v + 1
    check(x, b, "x[dup DistArray] = DistArray")
    from checks import settle
    settle()
