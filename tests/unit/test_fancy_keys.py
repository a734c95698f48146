"""The pure planning of advanced-indexing keys (disttensor.routines.fancy_keys) against NumPy:
for random keys mixing integers, slices, None, Ellipsis, integer arrays, lists and boolean
arrays, the plan's basic step, indexed axes and position give NumPy's result shape, and bad
keys raise NumPy's IndexError with its message."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.routines.fancy_keys import (as_key_entries, broadcast_index_shapes,
                                            is_fancy_key, plan_key)
from disttensor.testing.strategies import shapes


@st.composite
def keys(draw, shape):
    """A key for an array of ``shape`` (in bounds unless drawn otherwise) with one index array
    at least, and sometimes a wrong-shape boolean array or too many entries."""
    entries, axis = [], 0
    nd = len(shape)
    ell = False
    while axis < nd and draw(st.booleans()):
        kind = draw(st.sampled_from(["int", "slice", "none", "array", "list", "bool",
                                     "ellipsis"]))
        n = shape[axis]
        if kind == "ellipsis" and not ell:
            ell = True
            entries.append(Ellipsis)
            axis = nd - 1  # at most one more axis after it
            continue
        if kind == "none":
            entries.append(None)
            continue
        if kind == "int" and n:
            entries.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            entries.append(slice(draw(st.integers(-n - 1, n + 1)), draw(st.integers(-n - 1, n + 1)),
                                 draw(st.sampled_from([None, 1, 2, -1, -2]))))
        elif kind in ("array", "list") and n:
            ishape = draw(st.sampled_from([(), (1,), (2,), (3,), (2, 1), (1, 3)]))
            a = np.asarray(draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(ishape)),
                                         max_size=int(np.prod(ishape))))).reshape(ishape)
            entries.append(a.tolist() if kind == "list" and a.ndim else a)
        elif kind == "bool":
            k = draw(st.integers(1, nd - axis))
            bshape = list(shape[axis:axis + k])
            if draw(st.integers(0, 9)) == 0:
                bshape[-1] += 1  # wrong shape
            m = np.asarray(draw(st.lists(st.booleans(), min_size=int(np.prod(bshape)),
                                         max_size=int(np.prod(bshape))))).reshape(bshape)
            entries.append(m)
            axis += k
            continue
        else:
            entries.append(slice(None))
        axis += 1
    if not any(isinstance(e, (list, np.ndarray)) for e in entries):
        entries.append(np.asarray([0]) if nd and shape[min(axis, nd - 1)] else [])
    if draw(st.integers(0, 9)) == 0:
        entries.append(np.asarray([0]))  # maybe too many indices
    return tuple(entries)


def predicted_shape(key, shape):
    key = as_key_entries(key)
    plan = plan_key(key, shape)
    y = np.empty(shape)[plan.basic]
    arrays = []
    for k in key:
        if isinstance(k, (slice, type(None), type(Ellipsis))):
            continue
        k = np.asarray(k)
        arrays.extend(np.nonzero(k) if k.dtype == bool else [k])
    assert len(arrays) == len(plan.sources)
    b = broadcast_index_shapes([a.shape for a in arrays])
    rest = [n for t, n in enumerate(y.shape) if t not in plan.axes]
    p = plan.position
    assert [y.shape[t] for t in plan.axes] == [shape[a] for a in plan.x_axes]
    return tuple(rest[:p]) + tuple(b) + tuple(rest[p:])


@settings(max_examples=400, deadline=None)
@given(data=st.data(), shape=shapes(1, 3, 4))
def test_plan_matches_numpy(data, shape):
    key = data.draw(keys(shape))
    assert is_fancy_key(key)
    try:
        want = np.empty(shape)[key].shape
    except IndexError as e:
        if "out of bounds" in str(e):
            return  # bounds are checked on the index data (tests/mpi/test_fancy_indexing.py)
        with pytest.raises(IndexError) as got:
            predicted_shape(key, shape)
        assert str(got.value) == str(e)
        return
    assert predicted_shape(key, shape) == want


def test_messages():
    with pytest.raises(IndexError, match=r"^too many indices for array: array is 1-dimensional, "
                       r"but 2 were indexed$"):
        plan_key((np.array([0]), 0), (3,))
    with pytest.raises(IndexError, match=r"^boolean index did not match indexed array along "
                       r"axis 1; size of axis is 4 but size of corresponding boolean axis is 3$"):
        plan_key((slice(None), np.ones(3, bool)), (2, 4))
    with pytest.raises(IndexError, match=r"along axis 2; size of axis is 5 but size of "
                       r"corresponding boolean axis is 4$"):
        plan_key((0, np.ones((3, 4), bool)), (2, 3, 5))
    with pytest.raises(IndexError, match=r"^arrays used as indices must be of integer \(or "
                       r"boolean\) type$"):
        plan_key(np.array([1.0]), (3,))
    with pytest.raises(IndexError, match="only integers, slices"):
        plan_key(([0], "a"), (3, 3))
    with pytest.raises(TypeError, match="scalar boolean"):
        plan_key(([0], True), (3, 3))
    assert not is_fancy_key((0, slice(None), None))
    assert as_key_entries([]).dtype == np.intp


@pytest.mark.parametrize("key,position", [
    ((slice(None), [0], [1]), 1), (([0], slice(None), [1]), 0), ((0, slice(None), [1]), 0),
    ((slice(None), 0, [1]), 1), ((None, [0], [1]), 1), (([0], None, [1]), 0),
    ((Ellipsis, [1]), 3), (([0], Ellipsis, [1]), 0), ((slice(None), [0], slice(None), [1]), 0),
    ((slice(None), [0], None, [1]), 0), ((slice(None), np.ones((3, 4), bool)), 1)])
def test_position(key, position):
    """Where the index axes land: in place when the advanced entries are adjacent (integers
    count), else first (NumPy's rule)."""
    shape = (2, 3, 4, 5)
    plan = plan_key(key, shape)
    assert plan.position == position
    assert predicted_shape(key, shape) == np.empty(shape)[key].shape
