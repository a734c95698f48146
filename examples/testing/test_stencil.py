"""Tests of ``stencil.py`` with ``disttensor.testing``: on every layout of the ranks this run
has (1-D to 3-D grids, uneven and empty blocks), the distributed stencil equals NumPy's and its
adjoint passes the dot-product test.  Run on 1-4 ranks::

    mpiexec -n 4 python -m pytest examples/testing -q
"""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from disttensor.testing import assert_adjoint, assert_allclose
from disttensor.testing.strategies import dist_arrays, shapes
from stencil import forward_difference, forward_difference_adjoint

finite = st.floats(-1e3, 1e3)


def reference(a: np.ndarray, axis: int) -> np.ndarray:
    """Serial float64 forward differences with a zero past the end."""
    edge = np.zeros(a.shape[:axis] + (1,) + a.shape[axis + 1:])
    return np.diff(np.concatenate([a, edge], axis=axis), axis=axis)


@given(xa=dist_arrays(np.float64, shapes(1, 3, max_side=7), elements=finite), data=st.data())
def test_matches_numpy(xa, data):
    x, a = xa
    axis = data.draw(st.integers(0, x.ndim - 1), label="axis")
    assert_allclose(forward_difference(x, axis), reference(a, axis), rtol=1e-12)


@given(xa=dist_arrays(np.float64, shapes(1, 3, max_side=7), elements=finite), data=st.data())
def test_adjoint(xa, data):
    x, a = xa
    axis = data.draw(st.integers(0, x.ndim - 1), label="axis")
    y = x * 0.5 + 1.0            # a second vector laid out like x
    assert_adjoint(lambda v: forward_difference(v, axis),
                   lambda w: forward_difference_adjoint(w, axis), x, y)
