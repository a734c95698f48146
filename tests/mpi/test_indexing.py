"""Indexing and shape manipulation of DistArrays against NumPy: ``x[key]`` with integers
(negative too), slices with positive and negative steps, ``...`` and ``None``; ``x[key] =
value`` with scalars, NumPy arrays and DistArrays (differently distributed, broadcast, negative
steps); transpose/moveaxis/swapaxes, reshape (done locally or through the gather fallback, with
-1), concatenate (along split and unsplit axes, operands distributed differently) and flip.

``x[key]`` returns a copy (documented), so only values are compared.  Each example records its
checks locally and settles them with one collective assertion.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import SIZE, examples, grid, dist, expect, collective_checks, check_blocks as check
from disttensor.testing.strategies import layouts, shapes


def outcome(fn):
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001
        return None, e


def compare(f_np, f_dt, what=""):
    """Both raise the same kind of exception, or the results agree."""
    want, err = outcome(f_np)
    got, derr = outcome(f_dt)
    if err is not None:
        kind = next(k for k in (IndexError, TypeError, ValueError, Exception) if isinstance(err, k))
        expect(isinstance(derr, kind),
               f"{what}: NumPy raised {type(err).__name__}: {err}; "
               + (f"got {type(derr).__name__}: {derr}" if derr else f"got {got!r}"))
        return None
    if derr is not None:
        expect(False, f"{what}: NumPy passed, got {type(derr).__name__}: {derr}")
        return None
    check(got, want, what)
    return got


def values(shape, seed, dtype="float64") -> np.ndarray:
    """Distinct values (so a wrong element is always noticed)."""
    n = math.prod(shape)
    perm = np.random.default_rng(seed).permutation(n)
    return np.array(perm.reshape(shape), dtype=dtype)


seeds = st.integers(0, 2**32 - 1)


@st.composite
def keys(draw, shape, allow_none=True, allow_ellipsis=True, allow_int=True):
    """A basic index for ``shape``: per axis an int (maybe negative), or a slice with any
    bounds (out of range too) and any non-zero step; some ``None``s; maybe an ``...`` in
    place of a run of full slices; sometimes fewer entries than axes."""
    parts: list = []
    for n in shape:
        kinds = ["slice", "slice", "full"] + (["int"] if allow_int and n > 0 else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "int":
            parts.append(draw(st.integers(-n, n - 1)))
        elif kind == "full":
            parts.append(slice(None))
        else:
            bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
            step = st.one_of(st.none(), st.sampled_from([1, 2, 3, -1, -2, -3]))
            parts.append(slice(draw(bound), draw(bound), draw(step)))
    if allow_ellipsis and parts and draw(st.booleans()):
        i = draw(st.integers(0, len(parts)))
        j = draw(st.integers(i, len(parts)))
        if all(p == slice(None) for p in parts[i:j]):
            parts[i:j] = [Ellipsis]
    elif parts and draw(st.booleans()):   # trailing full slices may be left out
        while parts and parts[-1] == slice(None):
            parts.pop()
    if allow_none:
        for _ in range(draw(st.integers(0, 2))):
            parts.insert(draw(st.integers(0, len(parts))), None)
    if len(parts) == 1 and draw(st.booleans()):
        return parts[0]
    return tuple(parts)


@st.composite
def broadcastable(draw, shape):
    k = draw(st.integers(0, len(shape)))
    return tuple(1 if draw(st.booleans()) else n for n in shape[k:])


# -- getitem ---------------------------------------------------------------------------------
@settings(max_examples=examples(60))
@given(shape=shapes(0, 4, 6), seed=seeds, data=st.data())
@collective_checks
def test_getitem(shape, seed, data):
    layout = data.draw(layouts(shape, SIZE))
    a = values(shape, seed)
    x = dist(a, layout)
    for _ in range(3):
        key = data.draw(keys(shape))
        y = compare(lambda: a[key], lambda: x[key], f"x[{key!r}]")
        if y is not None and y.size:   # a copy: writing it leaves x alone
            y.local[...] = -1
    check(x, a, "x after writing x[key]")
    # chained selections
    k1 = data.draw(keys(shape, allow_none=False))
    b = a[k1]
    k2 = data.draw(keys(b.shape))
    compare(lambda: a[k1][k2], lambda: x[k1][k2], f"x[{k1!r}][{k2!r}]")


@settings(max_examples=examples(15))
@given(shape=shapes(1, 3, 4), data=st.data())
@collective_checks
def test_getitem_errors(shape, data):
    a = values(shape, 0)
    x = dist(a, data.draw(layouts(shape, SIZE)))
    n = shape[0]
    for key in [n, -n - 1, (0,) * (len(shape) + 1), (Ellipsis, Ellipsis), 1.5, slice(0, 1, 0),
                (None, 2.0)]:
        compare(lambda: a[key], lambda: x[key], f"x[{key!r}]")


# -- setitem ---------------------------------------------------------------------------------
@settings(max_examples=examples(60))
@given(shape=shapes(0, 4, 5), kind=st.sampled_from(["scalar", "numpy", "list", "dist", "dist_flipped",
                                                    "dist0d"]),
       dtype=st.sampled_from(["float64", "int32"]), seed=seeds, data=st.data())
@collective_checks
def test_setitem(shape, kind, dtype, seed, data):
    layout = data.draw(layouts(shape, SIZE))
    a = values(shape, seed, dtype)
    x = dist(a, layout)
    key = data.draw(keys(shape))
    res_shape = a[key].shape
    vs = data.draw(broadcastable(res_shape))
    v = values(vs, seed + 1) + 1000.5        # float values (cast like NumPy into int32)
    if kind == "scalar":
        val = vnp = data.draw(st.sampled_from([7, -2.5, np.float32(3.25)]))
    elif kind == "numpy":
        val = vnp = v
    elif kind == "list":
        val = vnp = v.tolist()
    elif kind == "dist":
        val, vnp = dist(v, data.draw(layouts(vs, SIZE))), v
    elif kind == "dist0d":
        val, vnp = dist(np.array(42.0), data.draw(layouts((), SIZE))), np.array(42.0)
    else:   # a DistArray that is itself a negative-step selection
        big = values(tuple(2 * n + 1 for n in vs), seed + 2) + 0.5
        sel = tuple(slice(None, None, -2) for _ in vs)
        val, vnp = dist(big, data.draw(layouts(big.shape, SIZE)))[sel], big[sel]
    want = a.copy()
    _, err = outcome(lambda: want.__setitem__(key, vnp))
    _, derr = outcome(lambda: x.__setitem__(key, val))
    if err is not None:
        expect(isinstance(derr, type(err)) or isinstance(derr, (ValueError, IndexError)),
               f"NumPy raised {err!r}, got {derr!r}")
        return
    expect(derr is None, f"x[{key!r}] = {kind}{vs}: {derr!r}")
    check(x, want, f"x[{key!r}] = {kind}{vs}")


@settings(max_examples=examples(30))
@given(shape=shapes(1, 3, 5), seed=seeds, data=st.data())
@collective_checks
def test_setitem_negative_steps_distarray_value(shape, seed, data):
    """Slices with negative steps on every axis, a DistArray value of the full selection
    shape (so each selected element gets a different value) distributed differently."""
    layout = data.draw(layouts(shape, SIZE))
    a = values(shape, seed)
    x = dist(a, layout)
    key = tuple(slice(data.draw(st.one_of(st.none(), st.integers(-n - 1, n))),
                      data.draw(st.one_of(st.none(), st.integers(-n - 1, n))),
                      data.draw(st.sampled_from([-1, -2, -3, 1, 2]))) for n in shape)
    vs = a[key].shape
    v = values(vs, seed + 1) + 1000
    a[key] = v
    x[key] = dist(v, data.draw(layouts(vs, SIZE)))
    check(x, a, f"x[{key!r}] = DistArray{vs}")


@settings(max_examples=examples(20))
@given(shape=shapes(1, 3, 5), seed=seeds, data=st.data())
@collective_checks
def test_setitem_from_a_selection_of_itself(shape, seed, data):
    """x[k1] = x[k2] (the value is a copy, so overlapping is fine) and x[...] = x[::-1]."""
    layout = data.draw(layouts(shape, SIZE))
    a = values(shape, seed)
    x = dist(a, layout)
    rev = (slice(None, None, -1),) * len(shape)
    a[...] = a[rev].copy()
    x[...] = x[rev]
    check(x, a, "x[...] = x[::-1]")
    k = data.draw(keys(shape, allow_none=False))
    a[k] = np.asarray(a[k]).copy() * 2
    x[k] = x[k] * 2
    check(x, a, f"x[{k!r}] = x[{k!r}] * 2")


# -- transpose, moveaxis, swapaxes -------------------------------------------------------------
@settings(max_examples=examples(30))
@given(shape=shapes(0, 4, 4), seed=seeds, data=st.data())
@collective_checks
def test_transpose_moveaxis_swapaxes(shape, seed, data):
    layout = data.draw(layouts(shape, SIZE))
    a = values(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    perm = tuple(data.draw(st.permutations(range(nd))))
    neg = tuple(p - nd if data.draw(st.booleans()) else p for p in perm)
    compare(lambda: a.T, lambda: x.T, "x.T")
    compare(lambda: a.transpose(), lambda: x.transpose(), "x.transpose()")
    compare(lambda: np.transpose(a, neg), lambda: np.transpose(x, neg), f"np.transpose {neg}")
    compare(lambda: a.transpose(*perm), lambda: x.transpose(*perm), f"x.transpose(*{perm})")
    compare(lambda: a.transpose(perm), lambda: x.transpose(perm), f"x.transpose({perm})")
    t = dt.transpose(x, perm)   # metadata only: the blocks stay where they are (a view)
    expect(t.distribution == x.distribution.transpose(perm) and t.grid is x.grid
           and (t.local.size == 0 or np.shares_memory(t.local, x.local)),
           f"transpose moved data: {t.distribution}")
    if nd:
        src = data.draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=nd,
                                 unique_by=lambda v: v % nd))
        dst = data.draw(st.lists(st.integers(-nd, nd - 1), min_size=len(src), max_size=len(src),
                                 unique_by=lambda v: v % nd))
        compare(lambda: np.moveaxis(a, src, dst), lambda: np.moveaxis(x, src, dst),
                f"moveaxis {src} {dst}")
        compare(lambda: np.moveaxis(a, src[0], dst[0]), lambda: dt.moveaxis(x, src[0], dst[0]),
                "moveaxis int")
        i, j = data.draw(st.integers(-nd, nd - 1)), data.draw(st.integers(-nd, nd - 1))
        compare(lambda: np.swapaxes(a, i, j), lambda: np.swapaxes(x, i, j), f"swapaxes {i} {j}")
        compare(lambda: np.transpose(a, perm[:-1] + (nd,)), lambda: np.transpose(x, perm[:-1] + (nd,)),
                "bad axes")
    # transposed (non-contiguous) blocks go on through communication
    y = x.T
    b = a.T
    lb = data.draw(layouts(b.shape, SIZE))
    check(y.redistribute(grid=grid(lb[0]), split=lb[1], sizes=lb[2]), b, "x.T redistributed")
    compare(lambda: b + b[..., ::-1], lambda: y + y[..., ::-1], "x.T arithmetic")


# -- reshape -----------------------------------------------------------------------------------
def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def new_shapes(draw, shape):
    """A shape with the same size: the prime factors regrouped (order kept or shuffled), some
    1s inserted; for size 0 any shape with a 0."""
    size = math.prod(shape)
    if size == 0:
        s = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
        s[draw(st.integers(0, len(s) - 1))] = 0
        return tuple(s)
    f = _factors(size)
    if draw(st.booleans()):
        f = draw(st.permutations(f))
    groups: list[int] = []
    for p in f:
        if groups and draw(st.booleans()):
            groups[-1] *= p
        else:
            groups.append(p)
    for _ in range(draw(st.integers(0, 2))):
        groups.insert(draw(st.integers(0, len(groups))), 1)
    return tuple(groups) if groups else ()


@settings(max_examples=examples(60))
@given(shape=shapes(0, 4, 6), seed=seeds, data=st.data())
@collective_checks
def test_reshape(shape, seed, data):
    layout = data.draw(layouts(shape, SIZE))
    a = values(shape, seed)
    x = dist(a, layout)
    new = data.draw(new_shapes(shape))
    y = compare(lambda: a.reshape(new), lambda: x.reshape(new), f"reshape {shape}->{new}")
    if y is not None and y.size:
        y.local[...] = -1    # never aliases x
        check(x, a, "x after writing its reshape")
    compare(lambda: np.reshape(a, new), lambda: np.reshape(x, new), "np.reshape")
    if new:
        compare(lambda: a.reshape(*new), lambda: x.reshape(*new), "x.reshape(*shape)")
    if new and a.size:
        i = data.draw(st.integers(0, len(new) - 1))
        m1 = new[:i] + (-1,) + new[i + 1:]
        compare(lambda: a.reshape(m1), lambda: x.reshape(m1), f"reshape {m1}")
    compare(lambda: a.reshape(-1), lambda: dt.reshape(x, -1), "reshape(-1)")
    compare(lambda: a.reshape(new + (2,)), lambda: x.reshape(new + (2,)), "bad reshape")
    # merging trailing unsplit axes keeps the leading split: no communication needed
    if len(shape) >= 2 and a.size and shape[0] > 1:
        lead = layout[1][0]
        spl = (lead,) + (None,) * (len(shape) - 1)
        z = dist(a, (layout[0], spl, (layout[2][0],) + (None,) * (len(shape) - 1)))
        r = compare(lambda: a.reshape(shape[0], -1), lambda: z.reshape(shape[0], -1), "local reshape")
        if r is not None:
            same = lead is None or r.distribution.sizes(0) == z.distribution.sizes(0)
            expect(r.split[0] == lead and same,
                   f"local reshape changed the split: {r.distribution}")


# -- concatenate ---------------------------------------------------------------------------------
@settings(max_examples=examples(40))
@given(shape=shapes(1, 3, 4), n=st.integers(1, 3), seed=seeds,
       dtypes=st.lists(st.sampled_from(["float64", "int32", "float32"]), min_size=3, max_size=3),
       data=st.data())
@collective_checks
def test_concatenate(shape, n, seed, dtypes, data):
    nd = len(shape)
    axis = data.draw(st.integers(-nd, nd - 1))
    arrays, dists = [], []
    for i in range(n):
        s = list(shape)
        s[axis] = data.draw(st.integers(0, 4))
        a = values(tuple(s), seed + i, dtypes[i])
        arrays.append(a)
        dists.append(dist(a, data.draw(layouts(a.shape, SIZE))))
    r = compare(lambda: np.concatenate(arrays, axis=axis), lambda: np.concatenate(dists, axis=axis),
                f"concatenate axis={axis}")
    if r is not None:   # the result keeps the first operand's split
        expect(r.split == dists[0].split, f"split {r.split} != first operand's {dists[0].split}")
    compare(lambda: np.concatenate(arrays, axis=axis, dtype="float32"),
            lambda: dt.concatenate(dists, axis=axis, dtype="float32"), "concatenate dtype=")
    compare(lambda: np.concatenate(arrays, axis=None), lambda: np.concatenate(dists, axis=None),
            "concatenate axis=None")
    compare(lambda: np.concatenate(tuple(arrays), 0 if axis % nd else -1),
            lambda: np.concatenate(tuple(dists), 0 if axis % nd else -1), "other axis")
    compare(lambda: np.concatenate(arrays, axis=nd), lambda: np.concatenate(dists, axis=nd), "bad axis")


# -- flip ----------------------------------------------------------------------------------------
@settings(max_examples=examples(30))
@given(shape=shapes(1, 4, 5), seed=seeds, data=st.data())
@collective_checks
def test_flip(shape, seed, data):
    layout = data.draw(layouts(shape, SIZE))
    a = values(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    compare(lambda: np.flip(a), lambda: np.flip(x), "np.flip(x)")
    ax = data.draw(st.integers(-nd, nd - 1))
    compare(lambda: np.flip(a, ax), lambda: np.flip(x, ax), f"flip axis={ax}")
    axes = tuple(data.draw(st.lists(st.integers(0, nd - 1), unique=True, max_size=nd)))
    compare(lambda: np.flip(a, axes), lambda: dt.flip(x, axes), f"flip axes={axes}")
    y = dt.flip(dt.flip(x, axes), axes)
    check(y, a, "flip twice")
    compare(lambda: np.flip(a, nd), lambda: np.flip(x, nd), "bad axis")


def test_take_of_an_empty_index_list():
    """NumPy takes ``[]`` (a float64 array to ``np.asarray``) as an empty index list."""
    a = np.arange(2.0 * SIZE + 3)
    x = dt.from_global(a)
    for idx, axis in (([], None), ([[], []], 0)):
        got = np.take(x, idx, axis=axis)
        want = np.take(a, idx, axis=axis)
        assert got.shape == want.shape and got.dtype == want.dtype
    assert x.take([]).shape == (0,)
