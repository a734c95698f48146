"""read_hdf5 / write_hdf5 under MPI: round trips against serial h5py, both drivers, errors."""
from __future__ import annotations

import errno
import itertools
import os
import subprocess

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from disttensor import io
from disttensor.core.agreement import ArgumentMismatchError
from disttensor.io import _atomic, _h5file, _sessions, _space, _temps
from conftest import assert_all_ranks, assert_allclose_all, assert_raises_all
from disttensor.testing.strategies import explicit_sizes, grids, shapes, splits

SIZE = MPI.COMM_WORLD.Get_size()
DRIVERS = [d for d in ("mpio", "independent") if io.hdf5_driver_available(d)]
DTYPES = ["float32", "float64", "float16", "int8", "uint16", "int32", "int64", "bool",
          "complex64", "complex128"]
_counter = itertools.count()


def _values(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) * 50
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return a > 0
    if dtype.kind == "c":
        return (a + 1j * rng.standard_normal(shape)).astype(dtype)
    return a.astype(dtype)


def _serial_read(comm, path, name):
    """The dataset read by rank 0 alone with plain h5py (POSIX driver); broadcast."""
    def rd():
        with h5py.File(path, "r") as f:
            return f[name][...]
    return _h5file.root_call(comm, rd)


def _no_temp_files(comm, d):
    left = [p for p in os.listdir(d) if p.endswith(".tmp")] if comm.rank == 0 else []
    assert_all_ranks(comm, not left, f"temporary files left behind: {left}")


@st.composite
def layouts(draw, ndim_max=4):
    dims = draw(grids(SIZE, 3))
    shape = draw(shapes(0, ndim_max, 5))
    split = draw(splits(len(shape), len(dims)))
    sizes = []
    for t, g in enumerate(split):
        if g is not None and draw(st.booleans()):
            sizes.append(draw(explicit_sizes(shape[t], dims[g])))
        else:
            sizes.append(None)
    return dims, shape, split, tuple(sizes)


@given(lay=layouts(), lay2=layouts(), dtype=st.sampled_from(DTYPES), data=st.data())
def test_round_trip_random_layouts(comm, shared_tmp_path, lay, lay2, dtype, data):
    """Written by every rank, the file equals the gathered array read serially; read back
    under another distribution (and a strided sub-selection) it equals NumPy's."""
    dims, shape, split, sizes = lay
    driver = data.draw(st.sampled_from(DRIVERS))
    driver2 = data.draw(st.sampled_from(DRIVERS))
    g = dt.ProcessGrid(dims)
    dims2, _, _, _ = lay2
    g2 = dt.ProcessGrid(dims2)
    try:
        a = _values(shape, dtype, seed=len(shape))
        x = dt.from_global(a, grid=g, split=split, sizes=sizes)
        path = shared_tmp_path / f"rt{next(_counter)}.h5"
        io.write_hdf5(x, path, "grp/data", driver=driver, mode="w")
        got = _serial_read(comm, path, "grp/data")
        gathered = x.gather(root=0)
        ok = comm.rank != 0 or (got.dtype == a.dtype and np.array_equal(got, gathered))
        assert_all_ranks(comm, ok, f"file differs from the gathered array ({driver})")
        assert_all_ranks(comm, np.array_equal(got, a), "file differs from the source array")

        split2 = data.draw(splits(len(shape), len(dims2)))
        sl = tuple(slice(data.draw(st.integers(0, 2)), None, data.draw(st.integers(1, 3)))
                   for _ in shape[:data.draw(st.integers(0, len(shape)))])
        coll = data.draw(st.booleans())
        y = io.read_hdf5(path, "grp/data", grid=g2, split=split2, slices=sl, driver=driver2,
                         collective_io=coll)
        want = a[sl]
        assert_all_ranks(comm, y.shape == want.shape and y.dtype == a.dtype,
                         f"{y.shape}/{y.dtype} vs {want.shape}/{a.dtype}")
        assert_all_ranks(comm, y.distribution == dt.Distribution(want.shape, dims2, split2),
                         "result distribution")
        assert_all_ranks(comm, np.array_equal(y.local, want[y.local_slices]),
                         f"block {y.local_slices} differs ({driver2})")
    finally:
        g.free()
        g2.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_written_by_two_ranks_read_by_all(comm, shared_tmp_path, driver):
    """A grid over a sub-communicator writes (2 ranks when there are >= 3); every rank reads."""
    w = 2 if SIZE >= 3 else 1
    sub = comm.Split(0 if comm.rank < w else MPI.UNDEFINED, comm.rank)
    path = shared_tmp_path / "two.h5"
    a = _values((7, 5, 3), "float64", seed=2)
    if sub != MPI.COMM_NULL:
        g = dt.ProcessGrid((w,), comm=sub)
        x = dt.from_global(a, grid=g, split=(None, 0))
        io.write_hdf5(x, path, "x", driver=driver, mode="w")
        assert_all_ranks(sub, x.grid.size == w)
        g.free()
        sub.Free()
    comm.Barrier()
    g = dt.ProcessGrid((SIZE,))
    for split in [(0,), (None, 0), (None, None, 0), ()]:
        y = io.read_hdf5(path, "x", grid=g, split=split, driver=driver)
        assert_allclose_all(comm, y.local, a[y.local_slices], rtol=0)
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_chunked_compressed_files(comm, shared_tmp_path, driver):
    """A chunked, gzip/shuffle-compressed dataset made by serial h5py reads partitioned; a
    compressed write is read back by h5py."""
    path = shared_tmp_path / "chunked.h5"
    a = _values((9, 10, 11), "float32", seed=3)
    if comm.rank == 0:
        with h5py.File(path, "w") as f:
            f.create_dataset("c", data=a, chunks=(4, 3, 5), compression="gzip", shuffle=True)
            f.create_dataset("l", data=a[:3], chunks=(1, 10, 11), compression="lzf")
    comm.Barrier()
    g = dt.ProcessGrid((0, 0), comm=comm)
    y = io.read_hdf5(path, "c", grid=g, split=(1, None, 0), driver=driver)
    assert_allclose_all(comm, y.local, a[y.local_slices], rtol=0)
    y = io.read_hdf5(path, "c", grid=g, split=(0, 1), slices=(slice(1, None, 2), slice(None, 7)),
                     driver=driver)
    assert_allclose_all(comm, y.to_numpy(), a[1::2, :7], rtol=0)
    z = io.read_hdf5(path, "l", grid=g, split=(None, 0, 1), driver=driver)
    assert_allclose_all(comm, z.local, a[:3][z.local_slices], rtol=0)

    out = shared_tmp_path / "written_gz.h5"
    io.write_hdf5(y, out, "d", driver=driver, mode="w", chunks=(2, 3, 4), compression="gzip",
                  compression_opts=4, shuffle=True, attrs={"units": "m", "scale": 2.5})

    def check():
        with h5py.File(out, "r") as f:
            d = f["d"]
            return (d.chunks, d.compression, d.attrs["units"], float(d.attrs["scale"]),
                    np.array_equal(d[...], a[1::2, :7]))
    assert_all_ranks(comm, _h5file.root_call(comm, check) == ((2, 3, 4), "gzip", "m", 2.5, True))
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_replicated_blocks_written_once(comm, shared_tmp_path, driver, monkeypatch):
    """On a grid whose second axis is a replication axis, each block is written by one rank."""
    calls = []
    real = _sessions.write_from

    def counting(dset, start, data, dxpl):
        if data is not None:
            calls.append(data.shape)
        return real(dset, start, data, dxpl)
    monkeypatch.setattr(_sessions, "write_from", counting)
    dims = (2, SIZE // 2) if SIZE % 2 == 0 else (1, SIZE)
    g = dt.ProcessGrid(dims)
    a = _values((5, 4), "int32", seed=4)
    x = dt.from_global(a, grid=g, split=(0,))
    path = shared_tmp_path / "rep.h5"
    io.write_hdf5(x, path, "x", driver=driver, mode="w")
    writes = comm.allreduce(len(calls))
    assert_all_ranks(comm, writes == dims[0], f"{writes} block writes for {dims[0]} blocks")
    got = _serial_read(comm, path, "x")
    assert_all_ranks(comm, np.array_equal(got, a))
    g.free()


def test_scalars_empty_and_modes(comm, shared_tmp_path):
    g = dt.ProcessGrid((SIZE,))
    path = shared_tmp_path / "modes.h5"
    for driver in DRIVERS:
        s = dt.from_global(np.array(3.5), grid=g)
        e = dt.zeros((0, 4), dtype="int16", grid=g)
        io.write_hdf5(s, path, "s", driver=driver, mode="w")
        io.write_hdf5(e, path, "e", driver=driver)  # mode 'a' keeps "s"
        big = dt.from_global(np.arange(12.0).reshape(3, 4), grid=g)
        io.write_hdf5(big, path, "s", driver=driver)  # replaces "s" with another shape
        assert_all_ranks(comm, io.read_hdf5(path, "e", grid=g).shape == (0, 4))
        assert_allclose_all(comm, io.read_hdf5(path, "s", grid=g, driver=driver).to_numpy(),
                            np.arange(12.0).reshape(3, 4))
        io.write_hdf5(big * 2, path, "s", driver=driver, mode="r+")
        assert_allclose_all(comm, io.read_hdf5(path, "s", grid=g).to_numpy(),
                            2 * np.arange(12.0).reshape(3, 4))
        io.write_hdf5(s, path, "t", driver=driver, mode="a", atomic=False)
        assert_allclose_all(comm, io.read_hdf5(path, "t", grid=g, driver=driver).to_numpy(), 3.5)
        names = _h5file.root_call(comm, lambda: sorted(h5py.File(path, "r").keys()))
        assert_all_ranks(comm, names == ["e", "s", "t"], str(names))
        out = dt.zeros((2, 4), grid=g)
        io.read_hdf5(path, "s", out=out, slices=(slice(1, None),), driver=driver)
        assert_allclose_all(comm, out.to_numpy(), 2 * np.arange(4.0, 12.0).reshape(2, 4))
    _no_temp_files(comm, shared_tmp_path)
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_errors_are_collective(comm, shared_tmp_path, driver):
    g = dt.ProcessGrid((SIZE,))
    d = shared_tmp_path
    good = d / "good.h5"
    a = np.arange(24.0).reshape(4, 6)
    x = dt.from_global(a, grid=g)
    io.write_hdf5(x, good, "x", driver=driver, mode="w")
    if comm.rank == 0:
        (d / "text.h5").write_text("this is not HDF5\n" * 10)
    comm.Barrier()
    rd = lambda p, n="x", **kw: io.read_hdf5(p, n, grid=g, driver=driver, **kw)  # noqa: E731
    assert_raises_all(comm, FileNotFoundError, "no such file", lambda: rd(d / "missing.h5"))
    assert_raises_all(comm, IsADirectoryError, "is a directory", lambda: rd(d))
    assert_raises_all(comm, io.NotHDF5FileError, "not an HDF5 file", lambda: rd(d / "text.h5"))
    assert_raises_all(comm, io.DatasetNotFoundError, "has no dataset 'y'",
                       lambda: rd(good, "y"))
    assert_raises_all(comm, KeyError, "has no dataset", lambda: rd(good, "y"))
    assert_raises_all(comm, ValueError, r"has shape \(4, 6\), expected \(4, 5\)",
                       lambda: rd(good, shape=(4, 5)))
    assert_raises_all(comm, TypeError, "has dtype float64, expected float32",
                       lambda: rd(good, dtype="float32"))
    assert_raises_all(comm, ValueError, "step must be > 0",
                       lambda: rd(good, slices=(slice(None, None, -1),)))
    assert_raises_all(comm, ValueError, "grid axis",
                       lambda: rd(good, split=(3,)))
    assert_raises_all(comm, TypeError, "out has dtype",
                       lambda: io.read_hdf5(good, "x", out=dt.zeros((4, 6), dtype="float32",
                                                                   grid=g), driver=driver))
    assert_raises_all(comm, ValueError, "out has shape",
                       lambda: io.read_hdf5(good, "x", out=dt.zeros((4, 5), grid=g),
                                            driver=driver))
    # writes: mismatching dataset in mode 'r+', bad arguments, non-HDF5 target, missing dir
    wr = lambda p, y=x, **kw: io.write_hdf5(y, p, "x", driver=driver, **kw)  # noqa: E731
    assert_raises_all(comm, ValueError, r"has shape \(4, 6\), the array has \(3, 6\)",
                       lambda: wr(good, dt.zeros((3, 6), grid=g), mode="r+"))
    assert_raises_all(comm, TypeError, "has dtype float64, the array has int32",
                       lambda: wr(good, dt.zeros((4, 6), dtype="int32", grid=g), mode="r+"))
    assert_raises_all(comm, FileNotFoundError, "no such file",
                       lambda: wr(d / "nope.h5", mode="r+"))
    assert_raises_all(comm, io.NotHDF5FileError, "not an HDF5 file",
                       lambda: wr(d / "text.h5", mode="a"))
    assert_raises_all(comm, FileNotFoundError, "does not exist",
                       lambda: wr(d / "no_dir" / "f.h5"))
    assert_raises_all(comm, ValueError, "mode must be", lambda: wr(good, mode="x"))
    assert_raises_all(comm, TypeError, "cannot be stored",
                       lambda: wr(good, dt.from_global(np.array(["ab", "c"]), grid=g)))
    assert_raises_all(comm, ValueError, "driver must be",
                       lambda: io.write_hdf5(x, good, "x", driver="posix"))
    # nothing above changed the good file, and nothing was left behind
    assert_allclose_all(comm, rd(good).to_numpy(), a)
    if comm.rank == 0:
        assert (d / "text.h5").read_text().startswith("this is not HDF5")
    _no_temp_files(comm, d)
    g.free()


def _listing(comm, d):
    """Sorted names in ``d`` as rank 0 sees them (broadcast)."""
    return _h5file.root_call(comm, lambda: sorted(os.listdir(d)))


@pytest.mark.parametrize("driver", DRIVERS)
def test_rank_dependent_write_arguments_raise_before_anything_is_written(comm, shared_tmp_path,
                                                                         driver):
    """Every metadata argument of write_hdf5 that differs on the last rank raises
    ArgumentMismatchError on every rank, naming it, before any file is created (also where the
    value is invalid on that rank only: the mismatch is reported, not the validation error)."""
    if SIZE == 1:
        pytest.skip("needs ranks that can disagree")
    g = dt.ProcessGrid((SIZE,))
    x = dt.zeros((4, 6), grid=g)
    x_cols = dt.zeros((4, 6), grid=g, split=(None, 0))
    x_f4 = dt.zeros((4, 6), grid=g, dtype="float32")
    d = shared_tmp_path / "w"
    _h5file.root_call(comm, lambda: os.makedirs(d))
    last = comm.rank == SIZE - 1

    def per_rank(bad, good):
        return bad if last else good

    def wr(**kw):
        kw = {"y": x, "path": d / "a.h5", "dataset": "x", "driver": driver, **kw}
        return lambda: io.write_hdf5(kw.pop("y"), kw.pop("path"), kw.pop("dataset"), **kw)

    cases = [
        ("path", wr(path=d / per_rank("b.h5", "a.h5"))),
        ("dataset", wr(dataset=per_rank("y", "x"))),
        ("dataset", wr(dataset=per_rank("a//b", "x"))),  # invalid on one rank only
        ("mode", wr(mode=per_rank("w", "a"))),
        ("atomic", wr(atomic=per_rank(False, True))),
        ("chunks", wr(chunks=per_rank((2, 3), (2, 2)))),
        ("compression", wr(compression=per_rank("gzip", None))),
        ("compression_opts", wr(compression="gzip", compression_opts=per_rank(4, 5))),
        ("shuffle", wr(shuffle=per_rank(True, False))),
        ("attrs", wr(attrs={"unit": per_rank("m", "cm")})),
        ("attrs", wr(attrs={"v": np.array(per_rank([1, 2], [1, 3]))})),  # by value
        ("driver", wr(driver=per_rank("posix", driver))),
        ("x", wr(y=per_rank(x_cols, x))),
        ("x", wr(y=per_rank(x_f4, x))),
    ]
    for what, fn in cases:
        assert_raises_all(comm, ArgumentMismatchError,
                          rf"write_hdf5: arguments differ between ranks.*'{what}' \(rank 0: ",
                          fn)
        assert_all_ranks(comm, _listing(comm, d) == [], f"{what}: {_listing(comm, d)}")
    # the same path as a str on one rank and a Path on another is the same argument
    io.write_hdf5(x, per_rank(str(d / "a.h5"), d / "a.h5"), "x", driver=driver)
    assert_all_ranks(comm, _listing(comm, d) == ["a.h5"])
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_rank_dependent_read_arguments_raise_on_every_rank(comm, shared_tmp_path, driver):
    if SIZE == 1:
        pytest.skip("needs ranks that can disagree")
    g = dt.ProcessGrid((SIZE,))
    p = shared_tmp_path / "r.h5"
    a = _values((4, 6), "float64")
    io.write_hdf5(dt.from_global(a, grid=g), p, "x", mode="w")
    io.write_hdf5(dt.from_global(a, grid=g), p, "y")
    out1 = dt.zeros((4, 6), grid=g)
    out2 = dt.zeros((4, 6), grid=g, split=(None, 0))
    last = comm.rank == SIZE - 1

    def per_rank(bad, good):
        return bad if last else good

    def rd(**kw):
        kw = {"path": p, "dataset": "x", "driver": driver, **kw}
        if "out" not in kw:
            kw.setdefault("grid", g)
        return lambda: io.read_hdf5(kw.pop("path"), kw.pop("dataset"), **kw)

    cases = [
        ("path", rd(path=per_rank(shared_tmp_path / "none.h5", p))),  # missing on one rank
        ("dataset", rd(dataset=per_rank("y", "x"))),
        ("split", rd(split=per_rank((None, 0), (0, None)))),
        ("sizes", rd(sizes=per_rank([[4] + [0] * (SIZE - 1), None], None))),
        ("slices", rd(slices=per_rank((slice(0, 2),), (slice(0, 3),)))),
        ("dtype", rd(dtype=per_rank("float32", "float64"))),
        ("shape", rd(shape=per_rank((4, 5), (4, 6)))),
        ("collective_io", rd(collective_io=per_rank(False, True))),
        ("out", rd(out=per_rank(out2, out1))),
    ]
    for what, fn in cases:
        assert_raises_all(comm, ArgumentMismatchError,
                          rf"read_hdf5: arguments differ between ranks.*'{what}' \(rank 0: ", fn)
    y = io.read_hdf5(per_rank(str(p), p), "x", grid=g, dtype=per_rank(np.float64, "f8"))
    assert_allclose_all(comm, y.to_numpy(), a, rtol=0)
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_sessions_agree_their_arguments(comm, shared_tmp_path, driver):
    """The low-level sessions compare file names, dataset specs and names across the ranks
    before a collective HDF5 call (unless the caller says it agreed them already)."""
    if SIZE == 1:
        pytest.skip("needs ranks that can disagree")
    last = comm.rank == SIZE - 1

    def per_rank(bad, good):
        return bad if last else good

    a, b = shared_tmp_path / "a.h5", shared_tmp_path / "b.h5"
    assert_raises_all(comm, ArgumentMismatchError, r"WriteSession: .*'target'",
                      lambda: _sessions.WriteSession(per_rank(b, a), comm, driver, True))
    s = _sessions.WriteSession(a, comm, driver, True)
    spec = lambda n: _sessions.DatasetSpec("x", (n,), np.dtype("f8"))  # noqa: E731
    assert_raises_all(comm, ArgumentMismatchError, r"WriteSession.create: .*'specs'",
                      lambda: s.create([per_rank(spec(5), spec(4))]))
    s.create([spec(4)])
    assert_raises_all(comm, ArgumentMismatchError, r"WriteSession.write: .*'names'",
                      lambda: s.write([(per_rank("y", "x"), (0,), None)]))
    s.write([("x", (0,), np.arange(4.0) if comm.rank == 0 else None)])
    s.close()
    assert_raises_all(comm, ArgumentMismatchError, r"ReadSession: .*'path'",
                      lambda: _sessions.ReadSession(per_rank(b, a), comm, driver))
    with _sessions.ReadSession(a, comm, driver) as r:
        out = np.empty(4)
        assert_raises_all(comm, ArgumentMismatchError, r"ReadSession.read: .*'names'",
                          lambda: r.read([(per_rank("y", "x"), (0,), None, out)]))
        assert_raises_all(comm, ArgumentMismatchError, r"ReadSession.meta: .*'names'",
                          lambda: r.meta([per_rank("y", "x")]))
        r.read([("x", (0,), None, out)])
    assert_allclose_all(comm, out, np.arange(4.0), rtol=0)
    assert_raises_all(comm, ArgumentMismatchError, r"atomic_update: .*'mode'",
                      lambda: _atomic.atomic_update(comm, a, driver, per_rank("r+", "a"), True, 8,
                                                lambda sess: None))
    assert_all_ranks(comm, _listing(comm, shared_tmp_path) == ["a.h5"])


def test_single_rank_validation_errors_without_disagreement(comm, shared_tmp_path):
    """An invalid argument passed alike on every rank is reported as itself."""
    g = dt.ProcessGrid((SIZE,))
    x = dt.zeros((4,), grid=g)
    assert_raises_all(comm, ValueError, "invalid dataset name",
                      lambda: io.write_hdf5(x, shared_tmp_path / "r.h5", "a//b"))
    assert_all_ranks(comm, _listing(comm, shared_tmp_path) == [])
    g.free()


def _dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _plant(d, base, host, pid, age_s=0.0):
    name = f".{base}.{host}.{pid}.{os.urandom(6).hex()}.tmp"
    f = d / name
    f.write_bytes(b"partial")
    if age_s:
        t = f.stat().st_mtime - age_s
        os.utime(f, (t, t))
    return name


@pytest.mark.parametrize("atomic", [True, False])
def test_write_removes_stale_temporary_files_of_its_path(comm, shared_tmp_path, atomic):
    """Temporary files of killed writes to the same path (dead writer on this host, or another
    host's untouched for longer than DISTTENSOR_STALE_TMP_AGE) are removed by the next write;
    a live writer's, a recent foreign one and other paths' are kept."""
    g = dt.ProcessGrid((SIZE,))
    d = shared_tmp_path
    here = _temps.host_tag()

    def plant():
        dead = _dead_pid()
        stale = [_plant(d, "f.h5", here, dead), _plant(d, "f.h5", "elsewhere", 4242, 7200),
                 f".f.h5.{os.urandom(6).hex()}.tmp"]  # the older pattern, old
        (d / stale[2]).write_bytes(b"old")
        t = (d / stale[2]).stat().st_mtime - 7200
        os.utime(d / stale[2], (t, t))
        kept = [_plant(d, "f.h5", here, os.getppid()),  # a live process (the launcher)
                _plant(d, "f.h5", "elsewhere", 4242, 60),  # recent: maybe being written
                _plant(d, "g.h5", here, dead),  # another target
                _plant(d, "f.h5.bak", here, dead),  # another target, whose name extends ours
                ".f.h5.tmp", "f.h5.tmp"]  # not our pattern
        for n in kept[-2:]:
            (d / n).write_bytes(b"user")
        return stale, kept
    stale, kept = _h5file.root_call(comm, plant)
    io.write_hdf5(dt.zeros((4,), grid=g), d / "f.h5", "x", atomic=atomic)
    left = _listing(comm, d)
    assert_all_ranks(comm, sorted(kept + ["f.h5"]) == left, f"{left} (stale: {stale})")
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_injected_enospc_keeps_the_old_file(comm, shared_tmp_path, driver, monkeypatch):
    """A rank that fails with ENOSPC (injected: while reserving space, or in the final fsync)
    makes every rank raise, removes the temporary file, and the old file stays as it was."""
    g = dt.ProcessGrid((SIZE,))
    path = shared_tmp_path / "keep.h5"
    old = np.arange(10.0)
    io.write_hdf5(dt.from_global(old, grid=g), path, "x", driver=driver, mode="w")
    new = dt.from_global(-np.arange(20.0).reshape(4, 5), grid=g)

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    for module, target in ((_sessions, "reserve_space"), (_atomic, "fsync_path")):
        with monkeypatch.context() as m:
            if comm.rank == SIZE - 1 or target == "fsync_path" or driver == "mpio":
                m.setattr(module, target, enospc)
            for mode in ("w", "a"):
                assert_raises_all(comm, OSError, "No space left on device",
                                   lambda: io.write_hdf5(new, path, "x", driver=driver, mode=mode))
        assert_allclose_all(comm, io.read_hdf5(path, "x", grid=g).to_numpy(), old)
        _no_temp_files(comm, shared_tmp_path)
    g.free()


def _try_mount_tmpfs(comm, where, size="1m"):
    def mount():
        if os.geteuid() != 0:
            return "not root"
        os.makedirs(where, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True)
        return None if r.returncode == 0 else (r.stderr.strip() or "mount failed")
    return _h5file.root_call(comm, mount)


@pytest.mark.parametrize("check", [True, False], ids=["precheck", "midwrite"])
def test_real_no_space_left(comm, shared_tmp_path, check, monkeypatch):
    """On a real 1 MiB tmpfs: writing 2.4 MB fails with ENOSPC on every rank (found by the
    free-space check, or with it off, while reserving/writing), for both drivers, compressed
    or not; the existing file stays intact and no temporary file is left."""
    mnt = shared_tmp_path / "small"
    why = _try_mount_tmpfs(comm, mnt)
    if why:
        pytest.skip(f"cannot mount a tmpfs: {why}")
    try:
        monkeypatch.setattr(_space, "SPACE_CHECK", check)
        g = dt.ProcessGrid((SIZE,))
        old = np.arange(10.0)
        path = mnt / "f.h5"
        io.write_hdf5(dt.from_global(old, grid=g), path, "x", mode="w")
        big = dt.random.default_rng(1).random((300, 1000), grid=g)
        for driver, comp in itertools.product(DRIVERS, (None, "gzip")):
            assert_raises_all(comm, OSError, "No space left on device",
                               lambda: io.write_hdf5(big, path, "x", driver=driver, mode="w",
                                                     compression=comp,
                                                     chunks=(50, 100) if comp else None))
            assert_allclose_all(comm, io.read_hdf5(path, "x", grid=g).to_numpy(), old)
            left = os.listdir(mnt) if comm.rank == 0 else ["f.h5"]
            assert_all_ranks(comm, left == ["f.h5"], f"files left: {left}")
        g.free()
    finally:
        comm.Barrier()
        if comm.rank == 0:
            subprocess.run(["umount", str(mnt)], check=False)
        comm.Barrier()


def test_gpu_blocks(comm, shared_tmp_path):
    from disttensor.core.backend import gpu_available
    if not gpu_available():
        pytest.skip("no CUDA GPU")
    g = dt.ProcessGrid((SIZE,))
    a = _values((6, 5), "float32")
    x = dt.from_global(a, grid=g, device="cuda")
    path = shared_tmp_path / "gpu.h5"
    io.write_hdf5(x, path, "x", mode="w")
    y = io.read_hdf5(path, "x", grid=g, split=(None, 0), device="cuda")
    assert_all_ranks(comm, y.device == "cuda")
    assert_allclose_all(comm, y.local.get(), a[y.local_slices], rtol=0)
    g.free()
