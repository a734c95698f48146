"""The h5py plumbing of disttensor.io in one process (no communicator: ``comm=None``)."""
from __future__ import annotations

import errno
import os

import h5py
import numpy as np
import pytest

from disttensor.io import _atomic, _h5file, _sessions, _space, _temps
from disttensor.io.errors import DatasetNotFoundError, NotHDF5FileError


def test_file_locking_is_off():
    """Importing disttensor.io sets the variable unless the user did (then theirs counts);
    files are opened with locking=False as well."""
    assert "HDF5_USE_FILE_LOCKING" in os.environ


@pytest.mark.parametrize("dtype", ["f2", "f4", "f8", "i1", "u2", "i8", "?", "c8", "c16",
                                   "S5", ">f8", [("a", "i4"), ("b", "f8")]])
def test_storable_dtypes(dtype):
    assert _h5file.storable_dtype(dtype) == np.dtype(dtype)


@pytest.mark.parametrize("dtype", ["O", "U3", "M8[s]", "m8[s]", "V4"])
def test_unstorable_dtypes(dtype):
    with pytest.raises(TypeError):
        _h5file.storable_dtype(dtype)


def test_errors_are_rebuildable_from_their_message():
    for e in (DatasetNotFoundError("f.h5 has no dataset 'x'"), NotHDF5FileError("nope")):
        assert str(type(e)(str(e))) == str(e)
    assert str(DatasetNotFoundError("a 'b'")) == "a 'b'"  # no KeyError quoting


def test_resolve_driver():
    assert _h5file.resolve_driver("independent") == "independent"
    assert _h5file.resolve_driver(None) == ("mpio" if _h5file.h5py_has_mpi() else "independent")
    with pytest.raises(ValueError):
        _h5file.resolve_driver("posix")


def test_read_write_sessions_without_mpi(tmp_path):
    p = tmp_path / "a.h5"
    a = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    s = _sessions.WriteSession(p, None, "independent", create=True, reserve=a.nbytes)
    spec = _sessions.DatasetSpec
    s.create([spec("g/x", a.shape, a.dtype, chunks=(1, 2, 5), compression="gzip"),
              spec("s", (), np.dtype("f8")), spec("e", (0, 2), np.dtype("u1"))])
    s.write([("g/x", (0, 0, 0), a[:2]), ("s", (), np.array(2.5)), ("e", (0, 0), None)])
    s.write([("g/x", (2, 0, 0), a[2:])])
    s.close()
    with h5py.File(p, "r") as f:
        np.testing.assert_array_equal(f["g/x"][...], a)
        assert f["s"][()] == 2.5 and f["e"].shape == (0, 2)
    with _sessions.ReadSession(p, None, "independent") as r:
        out = np.empty((2, 2, 3), np.int32)
        r.read([("g/x", (1, 0, 0), (1, 2, 2), out)])
        np.testing.assert_array_equal(out, a[1:3, 0:4:2, 0:5:2])
        sc = np.empty((), "f8")
        r.read([("s", (), None, sc), ("e", (0, 0), None, np.empty((0, 2), "u1"))])
        assert sc == 2.5
        with pytest.raises(DatasetNotFoundError, match="has no dataset 'nope'"):
            r.read([("nope", (0,), None, np.empty(1))])
    assert _h5file.probe(p, ["g/x"])["g/x"]["shape"] == (3, 4, 5)


def test_open_diagnosis(tmp_path):
    (tmp_path / "t.h5").write_text("text")
    with pytest.raises(FileNotFoundError, match="no such file"):
        _sessions.ReadSession(tmp_path / "none.h5", None, "independent")
    with pytest.raises(NotHDF5FileError, match="not an HDF5 file"):
        _sessions.ReadSession(tmp_path / "t.h5", None, "independent")
    with pytest.raises(IsADirectoryError):
        _sessions.ReadSession(tmp_path, None, "independent")


def test_space_reservation_and_trim(tmp_path, monkeypatch):
    p = tmp_path / "r.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.zeros(10)
    n0 = os.path.getsize(p)
    grew = _space.reserve_space(p, 1 << 20)
    if grew:  # fallocate is supported here
        assert os.path.getsize(p) >= n0 + (1 << 20)
        _space.trim(p)
    assert os.path.getsize(p) == n0
    with h5py.File(p, "r") as f:
        np.testing.assert_array_equal(f["x"][...], np.zeros(10))
    with pytest.raises(OSError) as e:
        _space.check_space(p, 1 << 62)
    assert e.value.errno == errno.ENOSPC and "No space left on device" in str(e.value)
    monkeypatch.setattr(_space, "SPACE_CHECK", False)
    _space.check_space(p, 1 << 62)


def test_atomic_update_keeps_the_file_on_failure(tmp_path):
    p = tmp_path / "k.h5"
    with h5py.File(p, "w") as f:
        f["old"] = np.arange(3)

    def body(sess):
        sess.create([_sessions.DatasetSpec("new", (2,), np.dtype("f4"))])
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        _atomic.atomic_update(None, p, "independent", "a", True, 8, body)
    with h5py.File(p, "r") as f:
        assert list(f) == ["old"]
    assert os.listdir(tmp_path) == ["k.h5"]
    _atomic.atomic_update(None, p, "independent", "a", True, 8,
                      lambda s: (s.create([_sessions.DatasetSpec("new", (2,), np.dtype("f4"))]),
                                 s.write([("new", (0,), np.ones(2, "f4"))])))
    with h5py.File(p, "r") as f:
        assert sorted(f) == ["new", "old"]
        np.testing.assert_array_equal(f["new"][...], np.ones(2))
    assert os.listdir(tmp_path) == ["k.h5"]
    assert os.path.dirname(_temps.temp_path_for(p)) == str(tmp_path)
