"""read_zarr / write_zarr under MPI: round trips against plain ``zarr`` reads and writes on
random layouts (uneven and empty blocks, several splits), chunk alignment, atomicity, errors
on every rank."""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from disttensor import io
from disttensor.core.agreement import ArgumentMismatchError
from disttensor.io import _h5file, zarrio
from conftest import assert_all_ranks, assert_raises_all
from disttensor.testing.strategies import explicit_sizes, grids, shapes, splits

zarr = pytest.importorskip("zarr")

SIZE = MPI.COMM_WORLD.Get_size()
DTYPES = ["float32", "float64", "int16", "uint8", "int64", "bool", "complex64"]
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


def _plain_read(comm, path, name=None):
    """The array read by rank 0 alone with plain zarr; broadcast."""
    def rd():
        node = zarr.open_array(path, mode="r") if name is None else \
            zarr.open_group(path, mode="r")[name]
        return node[...], tuple(node.chunks)
    return _h5file.root_call(comm, rd)


def _no_temps(comm, d):
    left = [p for p in os.listdir(d) if p.endswith(".tmp")] if comm.rank == 0 else []
    assert_all_ranks(comm, not left, f"temporary directories left behind: {left}")


@st.composite
def layouts(draw, ndim_max=3):
    dims = draw(grids(SIZE, 3))
    shape = draw(shapes(0, ndim_max, 7))
    split = draw(splits(len(shape), len(dims)))
    sizes = tuple(draw(explicit_sizes(shape[t], dims[g])) if g is not None and
                  draw(st.booleans()) else None for t, g in enumerate(split))
    return dims, shape, split, sizes


@settings(max_examples=12, deadline=None)
@given(lay=layouts(), lay2=layouts(), dtype=st.sampled_from(DTYPES), data=st.data())
def test_round_trip_random_layouts(comm, shared_tmp_path, lay, lay2, dtype, data):
    """Written by every rank, the store read by plain zarr equals the source array and has a
    chunk grid aligned with the written distribution; read back under another distribution
    (and a strided selection) it equals NumPy's."""
    dims, shape, split, sizes = lay
    g, g2 = dt.ProcessGrid(dims), dt.ProcessGrid(lay2[0])
    try:
        a = _values(shape, dtype, seed=len(shape))
        x = dt.from_global(a, grid=g, split=split, sizes=sizes)
        name = data.draw(st.sampled_from([None, "x", "grp/y"]))
        chunks = data.draw(st.sampled_from([None, "explicit"]))
        if chunks == "explicit":
            chunks = tuple(data.draw(st.integers(1, 4)) for _ in shape)
        path = shared_tmp_path / f"rt{next(_counter)}.zarr"
        used = io.write_zarr(x, path, name, chunks=chunks,
                             compressors=data.draw(st.sampled_from(["zstd", "blosc", None])))
        got, stored_chunks = _plain_read(comm, path, name)
        assert_all_ranks(comm, got.dtype == a.dtype and np.array_equal(got, a),
                         "store differs from the source array")
        assert_all_ranks(comm, stored_chunks == used and (chunks is None or used == chunks),
                         f"chunks {stored_chunks} / {used} / {chunks}")
        split2 = data.draw(splits(len(shape), len(lay2[0])))
        sl = tuple(slice(data.draw(st.integers(0, 2)), None, data.draw(st.integers(1, 3)))
                   for _ in shape[:data.draw(st.integers(0, len(shape)))])
        y = io.read_zarr(path, name, grid=g2, split=split2, slices=sl)
        want = a[sl]
        assert_all_ranks(comm, y.shape == want.shape and y.dtype == a.dtype,
                         f"{y.shape}/{y.dtype} vs {want.shape}/{a.dtype}")
        assert_all_ranks(comm, y.distribution == dt.Distribution(want.shape, lay2[0], split2))
        assert_all_ranks(comm, np.array_equal(y.local, want[y.local_slices]),
                         f"block {y.local_slices} differs")
        _no_temps(comm, shared_tmp_path)
    finally:
        g.free()
        g2.free()


def test_chunks_never_shared_between_writers(comm, shared_tmp_path, monkeypatch):
    """Each chunk is written by exactly one rank (recorded by wrapping the write), uneven
    blocks (4,3,3-like) are redistributed first, and the result equals NumPy's."""
    a = _values((10, 6, 5), "float32", seed=4)
    g = dt.ProcessGrid((SIZE,))
    sizes = [1] * (SIZE - 1) + [10 - (SIZE - 1)] if SIZE > 1 else None
    x = dt.from_global(a, grid=g, split=(0,), sizes=[sizes, None, None])
    writes = []
    orig = zarr.Array.__setitem__

    def spy(self, key, value):
        writes.append(key)
        return orig(self, key, value)
    monkeypatch.setattr(zarr.Array, "__setitem__", spy)
    path = shared_tmp_path / "uneven.zarr"
    chunks = io.write_zarr(x, path)
    monkeypatch.undo()
    boxes = comm.allgather([(s.start, s.stop) for key in writes for s in key[:1]])
    got, _ = _plain_read(comm, path)
    assert_all_ranks(comm, np.array_equal(got, a), "content")
    owned = {}
    for rank, bs in enumerate(boxes):
        for lo, hi in bs:
            assert_all_ranks(comm, lo % chunks[0] == 0 and (hi % chunks[0] == 0 or hi == 10),
                             f"rank {rank} wrote [{lo},{hi}) with chunks {chunks}")
            for c in range(lo // chunks[0], -(-hi // chunks[0])):
                assert_all_ranks(comm, c not in owned, f"chunk {c} written twice")
                owned[c] = rank
    assert_all_ranks(comm, len(owned) == -(-10 // chunks[0]), f"{owned}")
    g.free()


def test_plain_zarr_store_read_partitioned(comm, shared_tmp_path):
    """A store written by plain zarr (its own chunks, Blosc, a group with two arrays) reads
    on every split; writing another member keeps the first."""
    path = shared_tmp_path / "plain.zarr"
    a = _values((9, 10, 11), "int16", seed=3)
    if comm.rank == 0:
        grp = zarr.open_group(path, mode="w")
        grp.create_array("vol", shape=a.shape, chunks=(4, 3, 5), dtype=a.dtype,
                         compressors=zarr.codecs.BloscCodec())[...] = a
    comm.Barrier()
    g = dt.ProcessGrid((0, 0), comm=comm)
    for split in [(0, 1), (1, None, 0), (None, None, 1), ()]:
        y = io.read_zarr(path, "vol", grid=g, split=split, dtype="int16", shape=a.shape)
        assert_all_ranks(comm, np.array_equal(y.local, a[y.local_slices]), f"split {split}")
    b = _values((5, 4), "float64", seed=5)
    io.write_zarr(dt.from_global(b, grid=g, split=(1, 0)), path, "other")
    got, _ = _plain_read(comm, path, "vol")
    got2, _ = _plain_read(comm, path, "other")
    assert_all_ranks(comm, np.array_equal(got, a) and np.array_equal(got2, b))
    g.free()


def test_failed_write_keeps_previous_store(comm, shared_tmp_path, monkeypatch):
    """A write failing on the last rank raises on every rank; the previous array is intact and
    no temporary directory is left."""
    g = dt.ProcessGrid((SIZE,))
    a = _values((8, 4), "float64", seed=1)
    path = shared_tmp_path / "keep.zarr"
    io.write_zarr(dt.from_global(a, grid=g, split=(0,)), path)
    if comm.rank == SIZE - 1:
        def boom(self, key, value):
            raise OSError("disk full (test)")
        monkeypatch.setattr(zarr.Array, "__setitem__", boom)
    assert_raises_all(comm, OSError, "disk full",
                      lambda: io.write_zarr(dt.from_global(a * 2, grid=g, split=(0,)), path))
    monkeypatch.undo()
    got, _ = _plain_read(comm, path)
    assert_all_ranks(comm, np.array_equal(got, a), "previous array changed")
    _no_temps(comm, shared_tmp_path)
    io.write_zarr(dt.from_global(a * 2, grid=g, split=(0,)), path)  # replacing works
    got, _ = _plain_read(comm, path)
    assert_all_ranks(comm, np.array_equal(got, a * 2), "replaced array")
    _no_temps(comm, shared_tmp_path)
    g.free()


def test_errors_on_every_rank(comm, shared_tmp_path):
    g = dt.ProcessGrid((SIZE,))
    a = _values((6, 5), "float32")
    x = dt.from_global(a, grid=g, split=(0,))
    path = shared_tmp_path / "err.zarr"
    io.write_zarr(x, path, "a")
    assert_raises_all(comm, ValueError, "has shape", lambda: io.read_zarr(
        path, "a", grid=g, shape=(6, 6)))
    assert_raises_all(comm, TypeError, "has dtype", lambda: io.read_zarr(
        path, "a", grid=g, dtype="float64"))
    assert_raises_all(comm, FileNotFoundError, "does not exist", lambda: io.read_zarr(
        path, "missing", grid=g))
    assert_raises_all(comm, ValueError, "group, not an array",
                      lambda: io.read_zarr(path, grid=g))
    assert_raises_all(comm, ValueError, "invalid array name",
                      lambda: io.read_zarr(path, "../a", grid=g))
    assert_raises_all(comm, ValueError, "chunks", lambda: io.write_zarr(x, path, chunks=(0, 1)))
    assert_raises_all(comm, ValueError, "compressors",
                      lambda: io.write_zarr(x, path, "b", compressors="lz77"))
    plain = shared_tmp_path / "plain_dir"
    if comm.rank == 0:
        os.makedirs(plain / "keepme", exist_ok=True)
    comm.Barrier()
    assert_raises_all(comm, FileExistsError, "not a Zarr",
                      lambda: io.write_zarr(x, plain))
    assert_all_ranks(comm, os.path.isdir(plain / "keepme"), "a plain directory was touched")
    assert_raises_all(comm, FileNotFoundError, "does not exist",
                      lambda: io.write_zarr(x, shared_tmp_path / "no" / "such.zarr"))
    if SIZE > 1:
        assert_raises_all(comm, ArgumentMismatchError, "name",
                          lambda: io.read_zarr(path, "a" if comm.rank else "b", grid=g))
    g.free()


def test_replicated_and_scalar(comm, shared_tmp_path):
    """Replicated blocks (a grid axis the array is not split over) and 0-d arrays."""
    dims = (2, SIZE // 2) if SIZE % 2 == 0 else (1, SIZE)
    g = dt.ProcessGrid(dims)
    a = _values((7, 3), "int64", seed=7)
    path = shared_tmp_path / "rep.zarr"
    io.write_zarr(dt.from_global(a, grid=g, split=(1,)), path, "m")
    io.write_zarr(dt.from_global(np.array(2.5), grid=g), path, "s")
    got, _ = _plain_read(comm, path, "m")
    s, _ = _plain_read(comm, path, "s")
    assert_all_ranks(comm, np.array_equal(got, a) and float(s) == 2.5)
    y = io.read_zarr(path, "s", grid=g)
    assert_all_ranks(comm, y.shape == () and float(y.local) == 2.5)
    g.free()


def test_stale_temp_dirs_removed(comm, shared_tmp_path):
    """The temporary directory of a killed write (its writer's pid is gone) is removed by the
    next write of the same array; one of another target, or a live writer's, is kept."""
    from disttensor.io import _temps
    g = dt.ProcessGrid((SIZE,))
    path = shared_tmp_path / "stale.zarr"
    host = _temps.host_tag()

    def gone():
        for pid in range(4194000, 4000000, -1):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return pid
            except OSError:
                pass
    pid = comm.bcast(gone() if comm.rank == 0 else None, root=0)
    dead = shared_tmp_path / f".stale.zarr.{host}.{pid}.{'a' * 12}.tmp"
    other = shared_tmp_path / f".other.zarr.{host}.{pid}.{'b' * 12}.tmp"
    live = shared_tmp_path / f".stale.zarr.{host}.{os.getppid()}.{'c' * 12}.tmp"

    def mk():
        for dd in (dead, other, live):
            zarr.create_array(store=dd, shape=(2,), dtype="i1")
    _h5file.root_call(comm, mk)
    io.write_zarr(dt.from_global(np.arange(4.0), grid=g, split=(0,)), path)
    assert_all_ranks(comm, not dead.exists() and other.exists() and live.exists(),
                     f"{sorted(os.listdir(shared_tmp_path))}")
    g.free()
