"""disttensor.routines.npyio: parallel .npy save/load against numpy.save/numpy.load, for random
shapes, dtypes and layouts (1-3-D grids, uneven and empty blocks, replicated axes), Fortran-order and
big-endian files, the atomic replacement (a failed save leaves the previous file and no
temporary file), and errors raised on every rank."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from disttensor import npyio
from disttensor.core.distribution import Box
from checks import SIZE, check_blocks as check, collective_checks, dist, examples, expect, grid
from conftest import assert_all_ranks, assert_raises_all
from disttensor.testing.strategies import layouts, shapes

COMM = MPI.COMM_WORLD
DTYPES = ("float64", "float32", "int16", "uint8", "complex64", "bool")


def values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) * 100
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return (a > 0) if dtype == "bool" else a.astype(dtype)


def test_header_matches_numpy():
    for shape, dtype in [((), "f8"), ((3, 4), "<i2"), ((0, 5, 7), "c8"), ((1,) * 30, "?")]:
        buf = io.BytesIO()
        np.save(buf, np.zeros(shape, dtype))
        h = npyio.header_bytes(shape, dtype)
        assert buf.getvalue()[:len(h)] == h
        assert len(buf.getvalue()) == len(h) + np.zeros(shape, dtype).nbytes


@settings(max_examples=200, deadline=None)
@given(shapes(0, 4, 5), st.data())
def test_runs_cover_the_box_exactly(shape, data):
    start = tuple(data.draw(st.integers(0, n)) for n in shape)
    stop = tuple(data.draw(st.integers(a, n)) for a, n in zip(start, shape))
    box = Box(start, stop)
    want = np.zeros(shape, bool)
    want[box.slices()] = True
    got = np.zeros(int(np.prod(shape)), int)
    rs = npyio.runs(shape, box)
    for s, c in rs:
        got[s:s + c] += 1
    assert np.array_equal(got.reshape(shape), want.astype(int))
    # runs are maximal: none ends where the next begins
    assert all(a[0] + a[1] < b[0] for a, b in zip(rs, rs[1:]))


@settings(max_examples=examples(25))
@given(shapes(0, 3, 5), st.sampled_from(DTYPES), st.integers(0, 2**16), st.data())
@collective_checks
def test_save_then_numpy_load_and_load_in_another_layout(shape, dtype, seed, data):
    a = values(shape, dtype, seed)
    path = COMM.bcast(os.path.join(_dir(), "a.npy") if COMM.rank == 0 else None)
    x = dist(a, data.draw(layouts(shape, SIZE)))
    npyio.save(path, x)
    got = np.load(path)
    expect(got.dtype == a.dtype and np.array_equal(got, a), f"np.load: {got!r} != {a!r}")
    dims, split, sizes = layout = data.draw(layouts(shape, SIZE))
    y = npyio.load(path, grid=grid(dims), split=split, sizes=sizes)
    check(y, a, "load", layout=layout)
    expect(not [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".tmp")],
           "temporary file left")


_DIR: list = []


def _dir():
    import tempfile
    if not _DIR:
        _DIR.append(tempfile.mkdtemp(prefix="npyio"))
    return _DIR[0]


def test_fortran_order_and_big_endian(shared_tmp_path):
    a = np.arange(5 * 6 * 2, dtype=">f8").reshape(5, 6, 2) * 0.5
    p1, p2 = str(shared_tmp_path / "f.npy"), str(shared_tmp_path / "b.npy")
    if COMM.rank == 0:
        np.save(p1, np.asfortranarray(a.astype("<i4")))
        np.save(p2, a)
    COMM.Barrier()
    for split in [(0, None, None), (None, 0, None), (None, None, 0)]:
        y = npyio.load(p1, split=split)
        check(y, a.astype("<i4"), "fortran", layout=((SIZE,), split, (None,) * 3))
        z = npyio.load(p2, split=split)
        check(z, a.astype("=f8"), "big endian", layout=((SIZE,), split, (None,) * 3))
    from checks import settle
    settle()


def test_failed_save_keeps_previous_file(shared_tmp_path, monkeypatch):
    path = str(shared_tmp_path / "keep.npy")
    old = np.arange(4 * SIZE, dtype=float)
    npyio.save(path, dt.from_global(old, split=0))
    real = npyio._pwrite_all

    def failing(fd, data, offset):
        if COMM.rank == SIZE - 1:
            raise OSError(28, "No space left on device (injected)")
        real(fd, data, offset)
    monkeypatch.setattr(npyio, "_pwrite_all", failing)
    new = dt.from_global(-old, split=0)
    assert_raises_all(COMM, OSError, "No space left", lambda: npyio.save(path, new))
    monkeypatch.undo()
    assert_all_ranks(COMM, np.array_equal(np.load(path), old), "previous content kept")
    left = [f for f in os.listdir(shared_tmp_path) if f.endswith(".tmp")]
    assert_all_ranks(COMM, not left, f"temporary files left: {left}")


def test_errors_raise_everywhere(shared_tmp_path):
    x = dt.zeros((2 * SIZE, 3))
    assert_raises_all(COMM, FileNotFoundError, "",
                      lambda: npyio.load(str(shared_tmp_path / "missing.npy")))
    assert_raises_all(COMM, FileNotFoundError, "does not exist",
                      lambda: npyio.save(str(shared_tmp_path / "no" / "x.npy"), x))
    bad = str(shared_tmp_path / "trunc.npy")
    obj = str(shared_tmp_path / "obj.npy")
    if COMM.rank == 0:
        np.save(bad, np.zeros((10, 10)))
        with open(bad, "r+b") as f:
            f.truncate(300)
        np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    COMM.Barrier()
    assert_raises_all(COMM, ValueError, "truncated", lambda: npyio.load(bad))
    assert_raises_all(COMM, ValueError, "object", lambda: npyio.load(obj))
    assert_raises_all(COMM, TypeError, "DistArray", lambda: npyio.save(bad, np.zeros(3)))


def test_paths_differ_between_ranks(shared_tmp_path):
    from checks import last_rank_only, mismatch
    if SIZE == 1:
        pytest.skip("needs two ranks to differ")
    x = dt.zeros((2 * SIZE, 3))
    p = str(shared_tmp_path / "p.npy")
    with mismatch("npyio.save", "path"):
        npyio.save(last_rank_only(p + ".other", p), x)
    npyio.save(p, x)
    with mismatch("npyio.load", "split"):
        npyio.load(p, split=last_rank_only(1, 0))
    assert_all_ranks(COMM, not os.path.exists(p + ".other"), "nothing written on mismatch")


def test_numpy_save_dispatches_and_file_objects_raise_everywhere(shared_tmp_path):
    """``np.save(path, x)`` writes the parallel ``.npy`` (NumPy's suffix rule), readable by
    ``np.load``; an open file object raises TypeError on every rank (no rank left waiting)."""
    a = np.arange(SIZE * 12, dtype=np.float64).reshape(SIZE * 3, 4)
    x = dist(a, ((SIZE,), (0, None), None))
    np.save(str(shared_tmp_path / "via_numpy"), x)
    COMM.Barrier()
    got = np.load(str(shared_tmp_path / "via_numpy.npy"))
    assert_all_ranks(COMM, got.shape == a.shape and (got == a).all(), "np.save round trip")
    assert_raises_all(COMM, TypeError, "needs a path",
                      lambda: np.save(io.BytesIO(), x))
