"""``where=`` and ``initial=`` of the reductions (sum, prod, min, max, any, all; mean, var, std
``where=``) against NumPy: masks as NumPy arrays (broadcast rows too) and as DistArrays of
another layout, through ``dt.*``, ``np.*`` and ``ufunc.reduce``; uneven and empty blocks on
1-D and 2-D grids; bad masks and a missing ``initial`` raising NumPy's errors on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import SIZE, examples, dist, expect, collective_checks, check_blocks as check
from checks import last_rank_only, mismatch
from conftest import assert_raises_all
from disttensor.testing.strategies import layouts, shapes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def run(fn):
    try:
        with np.errstate(all="ignore"):
            return fn(), None
    except Exception as e:  # noqa: BLE001
        return None, e


def compare(f_np, f_dt, what, **tol):
    want, err = run(f_np)
    got, derr = run(f_dt)
    if err is not None:
        expect(type(derr) is type(err), f"{what}: NumPy raised {err!r}; got {derr!r}")
        return
    if derr is not None:
        expect(False, f"{what}: NumPy passed, got {derr!r}")
        return
    check(got, want, what, **tol)


@settings(max_examples=examples(20), deadline=None)
@given(sl=layouts(shapes(1, 3, 5), SIZE, 2), seed=st.integers(0, 2**31),
       keepdims=st.booleans(), data=st.data())
@collective_checks
def test_where_initial(sl, seed, keepdims, data):
    shape, layout = sl
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape)
    ai = rng.integers(-4, 5, size=shape)
    m = rng.random(shape) < 0.6
    x, xi = dist(a, layout), dist(ai, layout)
    # the mask as a NumPy array, as a broadcast row, as a DistArray of another layout
    kind = data.draw(st.sampled_from(["numpy", "row", "dist"]))
    if kind == "row":  # a mask of the last axis only, broadcast along the others
        w = rng.random(shape[-1]) < 0.6
        m = np.broadcast_to(w, shape)
    elif kind == "dist":
        w = dist(m, data.draw(layouts(shape, SIZE, 2)))
    else:
        w = m
    axis = data.draw(st.sampled_from([None] + list(range(-len(shape), len(shape)))))
    kw = dict(axis=axis, keepdims=keepdims)
    tol = dict(rtol=1e-12, atol=1e-12)
    for name in ("sum", "prod"):
        for init in (None, 2):
            ini = {} if init is None else {"initial": init}
            compare(lambda: getattr(np, name)(a, where=m, **kw, **ini),
                    lambda: getattr(dt, name)(x, where=w, **kw, **ini), f"{name} {ini}", **tol)
            compare(lambda: getattr(np, name)(ai, where=m, **kw, **ini),
                    lambda: getattr(np, name)(xi, where=w, **kw, **ini), f"np.{name} int")
    for name in ("min", "max"):
        compare(lambda: getattr(np, name)(a, where=m, initial=0.5, **kw),
                lambda: getattr(dt, name)(x, where=w, initial=0.5, **kw), f"{name} where")
        compare(lambda: getattr(np, name)(ai, initial=-1, **kw),
                lambda: getattr(np, name)(xi, initial=-1, **kw), f"np.{name} initial")
    for name in ("any", "all"):
        compare(lambda: getattr(np, name)(a > 0, where=m, **kw),
                lambda: getattr(dt, name)(x > 0, where=w, **kw), f"{name} where")
    for name in ("mean", "var", "std"):
        ddof = {} if name == "mean" else {"ddof": data.draw(st.integers(0, 1))}
        compare(lambda: getattr(np, name)(a, where=m, **kw, **ddof),
                lambda: getattr(np, name)(x, where=w, **kw, **ddof), f"np.{name} where", **tol)
    ax = 0 if axis is None else axis
    compare(lambda: np.add.reduce(a, axis=ax, where=m, initial=1.5),
            lambda: np.add.reduce(x, axis=ax, where=w, initial=1.5), "add.reduce", **tol)
    compare(lambda: np.minimum.reduce(ai, axis=ax, where=m, initial=3),
            lambda: np.minimum.reduce(xi, axis=ax, where=w, initial=3), "minimum.reduce")
    compare(lambda: np.logical_and.reduce(a > 0, axis=ax, where=m),
            lambda: np.logical_and.reduce(x > 0, axis=ax, where=w), "logical_and.reduce")


def test_bad_options(comm):
    x = dt.from_global(np.arange(12.0).reshape(3, 4))
    assert_raises_all(comm, TypeError, "Cannot cast array data",
                      lambda: dt.sum(x, where=np.ones(4, int)))
    assert_raises_all(comm, ValueError, "could not be broadcast",
                      lambda: dt.sum(x, where=np.ones(3, bool)))
    assert_raises_all(comm, ValueError, "to use a where mask one has to specify 'initial'",
                      lambda: dt.min(x, where=np.ones(4, bool)))
    assert_raises_all(comm, ValueError, "zero-size array",
                      lambda: dt.max(dt.zeros((0, 3))))
    assert float(dt.max(dt.zeros((0, 3)), initial=-2.0)) == -2.0
    assert_raises_all(comm, TypeError, "not supported", lambda: np.nansum(x, initial=1))
    if SIZE > 1:
        with mismatch("sum", "initial"):
            dt.sum(x, initial=last_rank_only(1, 0))
