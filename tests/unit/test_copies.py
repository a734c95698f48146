"""disttensor.core.copies: copies and zero fills of strided boxes equal NumPy's assignment,
whichever path they take (runs merged into void elements where the box is cut along the last
axis, NumPy's own copy otherwise)."""
import numpy as np
from hypothesis import given, settings, strategies as st

from disttensor.core.copies import _merged_axis, copier, copy_into, fill_zero, into, zero_filler


@st.composite
def boxes(draw):
    """A buffer and a box of it (any axes cut, possibly to width 1), and a fresh array of the
    box's shape."""
    nd = draw(st.integers(1, 5))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(nd))
    box = []
    for n in shape:
        a = draw(st.integers(0, n - 1))
        b = draw(st.integers(a + 1, n))
        box.append(slice(a, b))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int16]))
    seed = draw(st.integers(0, 2 ** 16))
    return shape, tuple(box), np.dtype(dtype), seed


@settings(max_examples=120, deadline=None)
@given(boxes())
def test_copies_equal_numpy_assignment(case):
    shape, box, dtype, seed = case
    rng = np.random.default_rng(seed)
    buf = (rng.standard_normal(shape) * 100).astype(dtype)
    view = buf[box]
    fresh = (rng.standard_normal(view.shape) * 100).astype(dtype)
    # into the box
    want = buf.copy()
    want[box] = fresh
    got = buf.copy()
    copy_into(got[box], fresh)
    np.testing.assert_array_equal(got, want)
    got = buf.copy()
    copier(got[box], fresh)()
    np.testing.assert_array_equal(got, want)
    got = buf.copy()
    fill = into(got[box])   # (made once, filled from several sources)
    fill(np.zeros(view.shape, dtype))
    fill(fresh)
    np.testing.assert_array_equal(got, want)
    other = (rng.standard_normal(shape) * 100).astype(dtype)
    fill(other[box])        # (a strided source)
    want[box] = other[box]
    np.testing.assert_array_equal(got, want)
    # out of the box
    out = np.zeros(view.shape, dtype)
    copy_into(out, view)
    np.testing.assert_array_equal(out, view)
    out = np.zeros(view.shape, dtype)
    copier(out, view)()
    np.testing.assert_array_equal(out, view)
    # zero fills touch the box only
    want = buf.copy()
    want[box] = 0
    got = buf.copy()
    fill_zero(got[box])
    np.testing.assert_array_equal(got, want)
    got = buf.copy()
    zero_filler(got[box])(0)
    np.testing.assert_array_equal(got, want)


def test_runs_merged_only_for_boxes_cut_along_the_last_axis():
    buf = np.zeros((4, 16, 18, 16, 18), np.float32)
    # cut along the last axis: runs of 16 elements within it
    assert _merged_axis(buf[..., 1:17], np.empty((4, 16, 18, 16, 16), np.float32)) == 4
    # cut along an outer axis: NumPy merges the trailing axes itself
    depth = buf[:, :, 1:17, :, :]
    assert _merged_axis(depth, np.empty(depth.shape, np.float32)) is None
    # runs of one element: nothing to merge
    assert _merged_axis(buf[..., 0:1], np.empty((4, 16, 18, 16, 1), np.float32)) is None


def test_into_empty_and_mismatched_blocks():
    """``into`` on a view with an empty leading axis, and a source of another dtype (cast,
    as NumPy's assignment does)."""
    buf = np.ones((0, 3, 6, 6), np.float32)
    into(buf[:, :, 1:-1, 1:-1])(np.zeros((0, 3, 4, 4), np.float32))
    buf = np.ones((2, 3, 6, 6), np.float32)
    src = np.arange(2 * 3 * 4 * 4, dtype=np.float64).reshape(2, 3, 4, 4)
    into(buf[:, :, 1:-1, 1:-1])(src)
    want = np.ones((2, 3, 6, 6), np.float32)
    want[:, :, 1:-1, 1:-1] = src
    np.testing.assert_array_equal(buf, want)
