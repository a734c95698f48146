"""Creation functions, from_global/from_local/gather, and the counter-based random generator,
checked against NumPy on random shapes, grids, splits and (uneven, empty) ownership sizes.

Every check compares each rank's local block with the matching block of the NumPy result
(which also checks the distribution metadata) and reduces the verdict over all ranks.
"""
from __future__ import annotations


import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import COMM, SIZE, examples, grid, expect, collective_checks, check_blocks as check
from disttensor.testing.strategies import layouts, shapes

RANK = COMM.Get_rank()


def layout_kw(layout) -> dict:
    dims, split, sizes = layout
    return dict(grid=grid(dims), split=split, sizes=sizes)


def global_array(shape, dtype, seed) -> np.ndarray:
    """A deterministic global array (the same on every rank)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.array(rng.random(shape) < 0.5)
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -20
        return np.array(rng.integers(lo, 20, size=shape), dtype=dtype)
    if dtype.kind == "c":
        return np.array(rng.normal(size=shape) + 1j * rng.normal(size=shape), dtype=dtype)
    return np.array(rng.normal(size=shape), dtype=dtype)


DTYPES = ["float64", "float32", "float16", "int32", "int64", "uint8", "bool", "complex128"]
seeds = st.integers(0, 2**32 - 1)


# -- constant fills --------------------------------------------------------------------------
@settings(max_examples=examples(25))
@given(shape=shapes(0, 4, 5), dtype=st.sampled_from(DTYPES + [None]), data=st.data())
@collective_checks
def test_zeros_ones_empty_full(shape, dtype, data):
    layout = data.draw(layouts(shape, SIZE))
    kw = layout_kw(layout)
    check(dt.zeros(shape, dtype=dtype, **kw), np.zeros(shape, dtype=dtype), layout=layout)
    check(dt.ones(shape, dtype, **kw), np.ones(shape, dtype=dtype), layout=layout)
    check(dt.empty(shape, dtype=dtype, **kw), np.empty(shape, dtype=dtype), values=False,
          layout=layout)
    fill = data.draw(st.sampled_from([3, -2.5, True, 7.25]))
    if dtype is not None and np.dtype(dtype).kind == "u" and fill < 0:
        fill = 5
    check(dt.full(shape, fill, dtype=dtype, **kw), np.full(shape, fill, dtype=dtype),
          layout=layout)


@settings(max_examples=examples(8))
@given(shape=shapes(0, 3, 4))
@collective_checks
def test_default_grid_and_split(shape):
    """Without grid/split: a 1-D grid over all ranks, tensor axis 0 split (NumPy on 1 rank)."""
    x = dt.zeros(shape)
    want = (0,) + (None,) * (len(shape) - 1) if shape else ()
    expect(x.split == want and x.grid.dims == (SIZE,), f"split {x.split}, grid {x.grid.dims}")
    check(x, np.zeros(shape))
    check(dt.ones(shape, dtype="int32"), np.ones(shape, dtype="int32"))


@settings(max_examples=examples(20))
@given(shape=shapes(0, 4, 5), dtype=st.sampled_from(DTYPES), new=st.sampled_from(DTYPES + [None]),
       seed=seeds, data=st.data())
@collective_checks
def test_like_functions(shape, dtype, new, seed, data):
    layout = data.draw(layouts(shape, SIZE))
    a = global_array(shape, dtype, seed)
    x = dt.from_global(a, **layout_kw(layout))
    fill = data.draw(st.sampled_from([1, 4, True]))
    cases = [
        (dt.zeros_like(x, dtype=new), np.zeros_like(a, dtype=new), True),
        (dt.ones_like(x, dtype=new), np.ones_like(a, dtype=new), True),
        (dt.full_like(x, fill, dtype=new), np.full_like(a, fill, dtype=new), True),
        (dt.empty_like(x, dtype=new), np.empty_like(a, dtype=new), False),
        (np.zeros_like(x), np.zeros_like(a), True),       # through __array_function__
        (np.ones_like(x, dtype=new), np.ones_like(a, dtype=new), True),
        (np.full_like(x, fill), np.full_like(a, fill), True),
        (np.empty_like(x), np.empty_like(a), False),
    ]
    for y, want, values in cases:
        check(y, want, values=values, layout=layout)


# -- ranges ------------------------------------------------------------------------------------
int_args = st.one_of(
    st.tuples(st.integers(-5, 12)),
    st.tuples(st.integers(-6, 6), st.integers(-6, 12)),
    st.tuples(st.integers(-6, 6), st.integers(-6, 12), st.integers(-3, 3).filter(bool)),
)
float_args = st.tuples(st.sampled_from([-1.5, 0.0, 0.1, 2.25]),
                       st.sampled_from([-2.0, 1.0, 3.3, 5.0]),
                       st.sampled_from([0.3, 0.5, 1.0, -0.7, -0.25]))


@settings(max_examples=examples(30))
@given(args=st.one_of(int_args, float_args),
       dtype=st.sampled_from([None, "float32", "float16", "int32", "float64", "int64"]),
       data=st.data())
@collective_checks
def test_arange(args, dtype, data):
    want = np.arange(*args, dtype=dtype)   # float32/float16: NumPy's values, bit for bit
    layout = data.draw(layouts(want.shape, SIZE))
    check(dt.arange(*args, dtype=dtype, **layout_kw(layout)), want, layout=layout)


@settings(max_examples=examples(25))
@given(start=st.sampled_from([0, -3, 1.5, 10.0]), stop=st.sampled_from([1, 7.5, -2.0, 1e-300]),
       num=st.integers(0, 11), endpoint=st.booleans(),
       dtype=st.sampled_from([None, "float32", "int64", "float64"]), data=st.data())
@collective_checks
def test_linspace(start, stop, num, endpoint, dtype, data):
    want = np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype)
    layout = data.draw(layouts(want.shape, SIZE))
    x = dt.linspace(start, stop, num, endpoint=endpoint, dtype=dtype, **layout_kw(layout))
    check(x, want, layout=layout)


# -- moving whole arrays -------------------------------------------------------------------------
@settings(max_examples=examples(30))
@given(shape=shapes(0, 4, 5), dtype=st.sampled_from(DTYPES), seed=seeds,
       root=st.one_of(st.none(), st.integers(0, SIZE - 1)), gather_root=st.integers(0, SIZE - 1),
       halo=st.sampled_from([None, 0, 1]), data=st.data())
@collective_checks
def test_from_global_gather_identity(shape, dtype, seed, root, gather_root, halo, data):
    layout = data.draw(layouts(shape, SIZE))
    a = global_array(shape, dtype, seed)
    if halo is not None and not shape:
        halo = None
    arg = a if root is None or RANK == root else None   # only the root passes the array
    x = dt.from_global(arg, root=root, halo=halo, **layout_kw(layout))
    check(x, a, layout=layout)
    g = x.gather(root=gather_root)
    if RANK == gather_root:
        ok = isinstance(g, np.ndarray) and g.shape == a.shape and g.dtype == a.dtype \
            and np.array_equal(g, a, equal_nan=a.dtype.kind in "fc")
        msg = f"gather on root gave {g!r}"
    else:
        ok, msg = g is None, f"gather off the root gave {type(g).__name__}"
    expect(ok, msg)
    t = x.to_numpy()
    expect(isinstance(t, np.ndarray) and t.dtype == a.dtype and t.shape == a.shape
           and np.array_equal(t, a), f"to_numpy gave {t!r}")
    t2 = np.asarray(x)
    expect(np.array_equal(t2, a), "np.asarray(x) differs")


@settings(max_examples=examples(15))
@given(shape=shapes(1, 3, 5), seed=seeds, data=st.data())
@collective_checks
def test_from_global_then_redistribute_is_the_same_array(shape, seed, data):
    a = global_array(shape, "float64", seed)
    la, lb = data.draw(layouts(shape, SIZE)), data.draw(layouts(shape, SIZE))
    x = dt.from_global(a, **layout_kw(la))
    y = x.redistribute(**layout_kw(lb))
    check(y, a, layout=lb)


@settings(max_examples=examples(20))
@given(shape=shapes(0, 4, 5), dtype=st.sampled_from(["float64", "int32", "bool"]), seed=seeds,
       explicit=st.booleans(), data=st.data())
@collective_checks
def test_from_local(shape, dtype, seed, explicit, data):
    layout = data.draw(layouts(shape, SIZE))
    dims, split, sizes = layout
    a = global_array(shape, dtype, seed)
    d = dt.Distribution(shape, dims, split, sizes)
    local = a[d.block_slices(grid(dims).coords)].copy()
    if explicit:   # ownership sizes given
        x = dt.from_local(local, grid=grid(dims), split=split,
                          sizes=sizes if any(s is not None for s in sizes) else None)
        if any(s is not None for s in sizes):
            check(x, a, layout=layout)
        else:
            check(x, a)
    else:          # ownership sizes inferred from the blocks' extents
        x = dt.from_local(local, grid=grid(dims), split=split)
        check(x, a, layout=layout)
    expect(np.array_equal(x.to_numpy(), a), "to_numpy after from_local")


# -- random ------------------------------------------------------------------------------------
def _draws(rng, shape, kw):
    return [
        rng.random(shape, **kw),
        rng.normal(0.5, 2.0, shape=shape, **kw),
        rng.uniform(-3.0, 5.0, shape=shape, **kw),
        rng.integers(-4, 9, shape=shape, **kw),
        rng.random(shape, dtype="float32", **kw),
        rng.integers(7, shape=shape, dtype="int32", **kw),
    ]


@settings(max_examples=examples(20))
@given(shape=shapes(0, 4, 5), seed=st.integers(0, 2**63), data=st.data())
@collective_checks
def test_random_does_not_depend_on_the_distribution(shape, seed, data):
    la, lb = data.draw(layouts(shape, SIZE)), data.draw(layouts(shape, SIZE))
    xs = _draws(dt.random.default_rng(seed), shape, layout_kw(la))
    ys = _draws(dt.random.default_rng(seed), shape, layout_kw(lb))
    ref = [x.to_numpy() for x in xs]
    for x, y, r in zip(xs, ys, ref):
        check(x, r, layout=la)
        check(y, r, layout=lb)
    u, n, un, i, u32, i32 = ref
    ok = (u.dtype == np.float64 and np.all((0 <= u) & (u < 1))
          and n.dtype == np.float64 and np.all(np.isfinite(n))
          and np.all((-3 <= un) & (un < 5))
          and i.dtype == np.int64 and np.all((-4 <= i) & (i < 9))
          and u32.dtype == np.float32 and np.all((0 <= u32) & (u32 <= 1))
          and i32.dtype == np.int32 and np.all((0 <= i32) & (i32 < 7)))
    expect(ok, "random values out of range or of the wrong dtype")
    if u.size > 1:   # successive calls (and values within one call) differ
        expect(len(np.unique(u)) == u.size and not np.array_equal(u, u32),
               "repeated random values")
    other = dt.random.default_rng(seed + 1).random(shape, **layout_kw(la)).to_numpy()
    expect(u.size <= 1 or not np.array_equal(other, u),
           "different seeds gave the same numbers")


@collective_checks
def test_random_statistics():
    n = 10_000
    kw = layout_kw(((SIZE,), (0,), (None,)))
    rng = dt.random.default_rng(1234)
    z = rng.normal(shape=(n,), **kw)
    u = rng.random((100, 100), grid=grid((SIZE,)), split=(None, 0))
    k = rng.integers(0, 6, shape=(n,), **kw)
    m, s = float(z.mean()), float(z.std())
    tol = 5.0 / np.sqrt(n)
    expect(abs(m) < tol and abs(s - 1.0) < 0.05, f"normal mean {m}, std {s}")
    mu, su = float(u.mean()), float(u.std())
    expect(abs(mu - 0.5) < tol and abs(su - np.sqrt(1 / 12)) < 0.02,
           f"uniform mean {mu}, std {su}")
    counts = np.bincount(k.to_numpy(), minlength=6)
    expect(counts.size == 6 and np.all(np.abs(counts - n / 6) < 6 * np.sqrt(n / 6)),
           f"integer counts {counts}")
    zn = z.to_numpy()
    corr = np.corrcoef(zn[:-1], zn[1:])[0, 1]
    expect(abs(corr) < 5.0 / np.sqrt(n), f"lag-1 correlation {corr}")
