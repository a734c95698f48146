"""The ufunc methods on DistArrays (disttensor.routines.ufunc_methods) against NumPy:
``reduce`` of every kind of binary ufunc (reorderable ones combine partial results, the others
gather the axis), ``accumulate``, ``outer`` and ``reduceat``, with axis/dtype/keepdims/initial,
on 1-D and 2-D grids with uneven and empty blocks; the results keep the documented layouts;
unsupported options and bad input raise on every rank."""
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

# (ufunc, dtype of the data): reorderable (combined from partial results) and not
REDUCE_CASES = [(np.hypot, "f"), (np.logaddexp, "f"), (np.fmax, "f"), (np.bitwise_or, "i"),
                (np.bitwise_xor, "i"), (np.gcd, "i"), (np.logical_xor, "b"),
                (np.subtract, "f"), (np.divide, "f"), (np.arctan2, "f"), (np.power, "f"),
                (np.equal, "b"), (np.maximum, "f"), (np.add, "i")]


def data(shape, kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind == "i":
        return rng.integers(1, 40, size=shape).astype(np.int64)
    return rng.uniform(0.5, 1.5, size=shape)


def outcome(fn):
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - compared with ours
        return None, e


def compare(want_fn, got_fn, what, rtol=1e-12):
    """NumPy's result or exception against ours (same type, the same message start)."""
    want, err = outcome(want_fn)
    if err is not None:
        _, got_err = outcome(got_fn)
        expect(type(got_err) is type(err) and str(got_err).startswith(str(err)),
               f"{what}: NumPy raised {type(err).__name__}({err}), we {got_err!r}")
        return
    got = got_fn()
    if not isinstance(got, dt.DistArray):
        expect(False, f"{what}: got {type(got).__name__}")
        return
    check(got, np.asarray(want), what, rtol=rtol, atol=1e-300)


@st.composite
def axis_specs(draw, nd):
    return draw(st.one_of(st.just(None), st.integers(-nd, nd - 1) if nd else st.just(0),
                          st.lists(st.integers(0, max(nd - 1, 0)), min_size=1, max_size=nd,
                                   unique=True).map(tuple) if nd else st.just(())))


@settings(max_examples=examples(12))
@given(shape=shapes(0, 3, 5), case=st.sampled_from(REDUCE_CASES), data_=st.data(),
       seed=st.integers(0, 2**16), keepdims=st.booleans(), use_initial=st.booleans())
@collective_checks
def test_reduce(shape, case, data_, seed, keepdims, use_initial):
    uf, kind = case
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = data(shape, kind, seed)
    x = dist(a, layout)
    axis = data_.draw(axis_specs(len(shape)))
    kw = dict(axis=axis, keepdims=keepdims)
    if use_initial and kind != "b":
        kw["initial"] = a.dtype.type(3)
    compare(lambda: uf.reduce(a, **kw), lambda: uf.reduce(x, **kw), f"{uf.__name__}.reduce{kw}")


@settings(max_examples=examples(10))
@given(shape=shapes(1, 3, 5), case=st.sampled_from(REDUCE_CASES), data_=st.data(),
       seed=st.integers(0, 2**16))
@collective_checks
def test_accumulate(shape, case, data_, seed):
    """The result keeps ``x``'s distribution."""
    uf, kind = case
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = data(shape, kind, seed)
    x = dist(a, layout)
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    want, err = outcome(lambda: uf.accumulate(a, axis=axis))
    if err is not None:
        compare(lambda: uf.accumulate(a, axis=axis), lambda: uf.accumulate(x, axis=axis),
                f"{uf.__name__}.accumulate")
        return
    check(uf.accumulate(x, axis=axis), want, f"{uf.__name__}.accumulate(axis={axis})",
          rtol=1e-12, atol=1e-300, layout=layout)
    if kind == "f":
        check(uf.accumulate(x, axis=axis, dtype=np.float32),
              uf.accumulate(a, axis=axis, dtype=np.float32), "accumulate dtype=float32",
              rtol=1e-5, atol=1e-30)


@settings(max_examples=examples(8))
@given(sa=shapes(0, 2, 4), sb=shapes(0, 2, 4), data_=st.data(), seed=st.integers(0, 2**16),
       uf=st.sampled_from([np.multiply, np.subtract, np.arctan2, np.maximum]),
       b_kind=st.sampled_from(["dist", "numpy", "scalar"]))
@collective_checks
def test_outer(sa, sb, data_, seed, uf, b_kind):
    """``a``'s axes keep their split (the alignment rule)."""
    layout = data_.draw(layouts(sa, SIZE, 2))
    a = data(sa, "f", seed)
    b = data(sb, "f", seed + 1) if b_kind != "scalar" else 0.75
    x = dist(a, layout)
    y = dist(b, data_.draw(layouts(sb, SIZE, 2))) if b_kind == "dist" else b
    got = uf.outer(x, y)
    check(got, uf.outer(a, b), f"{uf.__name__}.outer", rtol=1e-14)
    expect(got.split[:len(sa)] == x.split if isinstance(got, dt.DistArray) else False,
           f"outer: split {getattr(got, 'split', None)} does not start with {x.split}")


@settings(max_examples=examples(8))
@given(shape=shapes(1, 2, 6, min_side=1), data_=st.data(), seed=st.integers(0, 2**16),
       uf=st.sampled_from([np.add, np.maximum, np.subtract]))
@collective_checks
def test_reduceat(shape, data_, seed, uf):
    layout = data_.draw(layouts(shape, SIZE, 2))
    a = data(shape, "f", seed)
    x = dist(a, layout)
    axis = data_.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    idx = np.asarray(data_.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=5)))
    check(uf.reduceat(x, idx, axis=axis), uf.reduceat(a, idx, axis=axis),
          f"{uf.__name__}.reduceat({idx}, axis={axis})", rtol=1e-13)


@pytest.mark.parametrize("case", REDUCE_CASES, ids=[c[0].__name__ for c in REDUCE_CASES])
@collective_checks
def test_along_split_axes(case):
    """Every case reduced and accumulated along a split axis, uneven blocks and an empty one."""
    uf, kind = case
    a = data((3 * SIZE + 1, 2), kind, 5)
    sizes = [3] * SIZE  # uneven, and an empty block in the middle from 3 ranks on
    if SIZE > 2:
        sizes[1] = 0
    sizes[-1] += 3 * SIZE + 1 - sum(sizes)
    x = dt.from_global(a, split=(0, None), sizes=[sizes, None])
    for kw in (dict(axis=0), dict(axis=None), dict(axis=0, keepdims=True)):
        compare(lambda: uf.reduce(a, **kw), lambda: uf.reduce(x, **kw),
                f"{uf.__name__}.reduce{kw}")
    compare(lambda: uf.accumulate(a, axis=0), lambda: uf.accumulate(x, axis=0),
            f"{uf.__name__}.accumulate")


def test_documented_layouts():
    a = data((2 * SIZE + 1, 3), "f", 0)
    x = dt.from_global(a)
    check(np.subtract.reduce(x, axis=1), np.subtract.reduce(a, axis=1), "reduce keeps split",
          rtol=1e-14, layout=((SIZE,), (0,), None))
    r = np.hypot.reduce(x, axis=None)
    check(r, np.hypot.reduce(a, axis=None), "0-d reduce", rtol=1e-14, layout=((SIZE,), (), ()))
    check(np.logaddexp.accumulate(x), np.logaddexp.accumulate(a), "accumulate layout",
          rtol=1e-13, layout=((SIZE,), (0, None), None))
    from checks import settle
    settle()


def test_errors():
    x = dt.from_global(data((2 * SIZE, 3), "f", 0))
    assert_raises_all(COMM, ValueError, "reduction operation 'subtract' is not reorderable",
                      lambda: np.subtract.reduce(x, axis=(0, 1)))
    assert_raises_all(COMM, ValueError, "zero-size array to reduction operation fmax which has "
                      "no identity", lambda: np.fmax.reduce(dt.zeros((0, 3)), axis=0))
    assert_raises_all(COMM, TypeError, r"subtract.reduce on DistArrays does not support where=",
                      lambda: np.subtract.reduce(x, where=np.ones(3, bool)))
    assert_raises_all(COMM, TypeError, "does not support out=",
                      lambda: np.subtract.accumulate(x, out=x))
    assert_raises_all(COMM, ValueError, "accumulate does not allow multiple axes",
                      lambda: np.add.accumulate(x, axis=(0, 1)))
    assert_raises_all(COMM, np.exceptions.AxisError, "axis 2 is out of bounds",
                      lambda: np.hypot.reduce(x, axis=2))
    assert_raises_all(COMM, TypeError, "not supported for the input types",
                      lambda: np.bitwise_or.reduce(x))
    if SIZE > 1:
        with mismatch("subtract.reduce", "axis"):
            np.subtract.reduce(x, axis=last_rank_only(1, 0))
