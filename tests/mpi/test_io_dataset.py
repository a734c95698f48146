"""SampleDataset under MPI: spatially partitioned batches equal the serial read of the same
samples in the same order; background reads; errors."""
from __future__ import annotations

import math
import os

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import io
from disttensor.io import _h5
from disttensor.io import dataset as dsmod
from conftest import assert_all_ranks, assert_allclose_all, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
DRIVERS = [d for d in ("mpio", "independent") if io.hdf5_driver_available(d)]
N, C, S = 7, 2, 6  # samples, channels, side


def _grids():
    """(grid dims, split) configurations for this rank count: purely spatial (D and H split),
    and sample x spatial when the rank count allows."""
    out = []
    a = 2 if SIZE % 2 == 0 else 1
    out.append(((1, a, SIZE // a, 1), (0, None, 1, 2, 3)))      # all ranks spatial
    if SIZE > 1:
        out.append(((SIZE, 1), (0, None, None, 1)))             # data parallel only
    if SIZE % 2 == 0 and SIZE > 2:
        out.append(((2, SIZE // 2), (0, None, None, 1, None)))  # samples x H
    return out


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    comm = MPI.COMM_WORLD
    d = comm.bcast(str(tmp_path_factory.mktemp("ds")) if comm.rank == 0 else None, root=0)
    files = io.generate_synthetic(os.path.join(d, "files"), N, size=S, channels=C, seed=11)
    stacked = io.generate_synthetic(os.path.join(d, "stacked.h5"), N, size=S, channels=C,
                                    seed=11, layout="stacked")
    return d, files, stacked


def _serial(files, stacked, idx):
    """Samples ``idx`` read whole by plain h5py."""
    xs, ys = [], []
    for i in idx:
        if stacked:
            with h5py.File(files, "r") as f:
                xs.append(f["full"][i])
                ys.append(f["unitPar"][i])
        else:
            with h5py.File(files[i], "r") as f:
                xs.append(f["full"][...])
                ys.append(f["unitPar"][...])
    return np.stack(xs), np.stack(ys)


@pytest.mark.parametrize("layout", ["files", "stacked"])
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "sync"])
def test_partitioned_batches_equal_serial_read(comm, data_dir, layout, driver, prefetch):
    d, files, stacked = data_dir
    src = files if layout == "files" else stacked
    ref_src = (files, False) if layout == "files" else (stacked, True)
    for k, (dims, split) in enumerate(_grids()):
        g = dt.ProcessGrid(dims)
        with io.SampleDataset(src if layout == "stacked" else os.path.join(d, "files"), g,
                              split=split, batch_size=3, seed=5, prefetch=prefetch,
                              driver=driver) as ds:
            assert_all_ranks(comm, (ds.num_samples, ds.sample_shape, ds.num_targets) ==
                             (N, (C, S, S, S), 3), repr(ds))
            assert_all_ranks(comm, len(ds) == math.ceil(N / 3))
            for e in ((0, 1) if k == 0 else (1,)):  # (two epochs once: time on 2 cores)
                order = np.random.default_rng([5, e]).permutation(N)
                seen = []
                for b, (x, y) in enumerate(ds.epoch(e)):
                    idx = order[3 * b:3 * b + 3]
                    seen.extend(idx.tolist())
                    assert_all_ranks(comm, x.shape == (len(idx), C, S, S, S) and
                                     y.shape == (len(idx), 3), f"{x.shape} {y.shape}")
                    full = tuple(split) + (None,) * (5 - len(split))
                    assert_all_ranks(comm, x.split == full and y.split == (split[0], None),
                                     f"{x.split} {y.split}")
                    wx, wy = _serial(*ref_src, idx)
                    # each rank holds exactly its block of the serial batch
                    assert_allclose_all(comm, x.local, wx[x.local_slices], rtol=0)
                    assert_allclose_all(comm, y.local, wy[y.local_slices], rtol=0)
                assert_all_ranks(comm, seen == order.tolist(), f"epoch {e} order {seen}")
        g.free()


def test_spatial_partition_on_all_ranks_equals_serial_whole_batch(comm, data_dir):
    """The issue's check: samples read spatially partitioned over all ranks, gathered, equal
    the serial read of the same samples in the documented order for the seed."""
    d, files, _ = data_dir
    g = dt.ProcessGrid((1, SIZE, 1, 1))
    with io.SampleDataset(files, g, split=(0, None, 1, 2, 3), batch_size=N, seed=3) as ds:
        (x, y), = list(ds.epoch(2))
        assert_all_ranks(comm, x.local.shape[2] == len(range(S)[x.local_slices[2]]))
        assert_all_ranks(comm, x.local.size < x.size or SIZE == 1, "no rank holds a whole batch")
        wx, wy = _serial(files, False, np.random.default_rng([3, 2]).permutation(N))
        assert_allclose_all(comm, x.to_numpy(), wx, rtol=0)
        assert_allclose_all(comm, y.to_numpy(), wy, rtol=0)
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_channels_last_files_and_partial_batches(comm, shared_tmp_path, driver):
    """D,H,W,C sample files; more sample-axis ranks than samples in the last batch (empty
    blocks); no shuffling; drop_last."""
    rng = np.random.default_rng(0)
    full = rng.standard_normal((5, 4, 3, 5, 2)).astype("float32")  # N, D, H, W, C
    tgt = rng.standard_normal((5, 4)).astype("float64")
    if comm.rank == 0:
        for i in range(5):
            with h5py.File(shared_tmp_path / f"s{i}.hdf5", "w") as f:
                f["x"] = full[i]
                f["t"] = tgt[i]
        with h5py.File(shared_tmp_path / "stacked_cl.h5", "w") as f:
            f["x"] = full
            f["t"] = tgt
    comm.Barrier()
    files = [str(shared_tmp_path / f"s{i}.hdf5") for i in range(5)]
    g = dt.ProcessGrid((SIZE, 1))
    want = np.moveaxis(full, -1, 1)
    for drop in (False, True):
        with io.SampleDataset(files if not drop else shared_tmp_path / "stacked_cl.h5", g, split=(0, 1, None, None, None), batch_size=2,
                              shuffle=False, x_dataset="x", y_dataset="t", channels_last=True,
                              driver=driver, drop_last=drop, collective_io=drop) as ds:
            batches = list(ds.epoch(0))
            assert_all_ranks(comm, len(batches) == (2 if drop else 3))
            for b, (x, y) in enumerate(batches):
                sl = slice(2 * b, 2 * b + 2)
                assert_allclose_all(comm, x.to_numpy(), want[sl], rtol=0)
                assert_allclose_all(comm, y.to_numpy(), tgt[sl], rtol=0)
                assert_all_ranks(comm, x.dtype == np.float32 and y.dtype == np.float64)
    g.free()


def test_break_early_and_io_inside_the_loop(comm, data_dir, shared_tmp_path):
    """Leaving an epoch early, and main-thread collective I/O while the next batch is being
    read in the background, neither hang nor corrupt anything."""
    d, files, stacked = data_dir
    g = dt.ProcessGrid((SIZE,))
    with io.SampleDataset(stacked, g, split=(None, None, 0), batch_size=2, seed=1) as ds:
        for x, y in ds.epoch(0):
            break
        for b, (x, y) in enumerate(ds.epoch(1)):
            io.write_hdf5(x, shared_tmp_path / "batch.h5", "x", mode="w")
            io.save_checkpoint(shared_tmp_path / "ck.h5", {"x": x}, scalars={"b": b})
            back = io.read_hdf5(shared_tmp_path / "batch.h5", "x", grid=g, split=x.split)
            assert_allclose_all(comm, back.local, x.local, rtol=0)
        x2, y2 = ds.read_batch([6, 0])
        wx, wy = _serial(stacked, True, [6, 0])
        assert_allclose_all(comm, x2.to_numpy(), wx, rtol=0)
        assert_allclose_all(comm, y2.to_numpy(), wy, rtol=0)
    g.free()


@pytest.mark.parametrize("driver", DRIVERS)
def test_bad_samples_raise_on_every_rank(comm, data_dir, shared_tmp_path, driver):
    d, files, stacked = data_dir
    bad_shape = shared_tmp_path / "bad_shape.h5"
    not_h5 = shared_tmp_path / "not.h5"
    if comm.rank == 0:
        with h5py.File(bad_shape, "w") as f:
            f["full"] = np.zeros((C, S, S, S + 1), "float32")
            f["unitPar"] = np.zeros(3, "float32")
        not_h5.write_text("nope")
    comm.Barrier()
    g = dt.ProcessGrid((SIZE,))
    consume = lambda ds: [None for _ in ds.epoch(0)]  # noqa: E731
    for src, exc, match in [(files[:2] + [str(bad_shape)], ValueError, "has shape"),
                            (files[:2] + [str(not_h5)], io.NotHDF5FileError, "not an HDF5 file")]:
        with io.SampleDataset(src, g, split=(None, None, 0), batch_size=1, shuffle=False,
                              driver=driver) as ds:
            assert_raises_all(comm, exc, match, lambda: consume(ds))
            # the dataset is still usable for good samples afterwards
            x, _ = ds.read_batch([1])
            assert_allclose_all(comm, x.to_numpy()[0], _serial(files, False, [1])[0][0], rtol=0)
    assert_raises_all(comm, io.DatasetNotFoundError, "has no dataset 'nope'",
                       lambda: io.SampleDataset(files, g, y_dataset="nope", driver=driver))
    assert_raises_all(comm, FileNotFoundError, "no such file",
                       lambda: io.SampleDataset(files[:1] + [str(shared_tmp_path / "x.h5")], g,
                                                driver=driver).read_batch([1]))
    assert_raises_all(comm, FileNotFoundError, "no such file",
                       lambda: io.SampleDataset(str(shared_tmp_path / "x.h5"), g))
    assert_raises_all(comm, ValueError, "batch_size", lambda: io.SampleDataset(files, g,
                                                                                batch_size=0))
    assert_raises_all(comm, ValueError, "grid axis",
                       lambda: io.SampleDataset(files, g, split=(0, None, 1)))
    assert_raises_all(comm, ValueError, "4-d sample",
                       lambda: io.SampleDataset(files[0], g, x_dataset="unitPar",
                                                y_dataset="unitPar"))
    g.free()


def test_thread_level_choice(comm, data_dir, monkeypatch):
    """Below MPI_THREAD_MULTIPLE background reads make no MPI calls (independent I/O), and
    asking for collective reads from the thread is refused."""
    d, files, _ = data_dir
    g = dt.ProcessGrid((SIZE,))
    with io.SampleDataset(files, g, split=(None, None, 0)) as ds:
        want = "mpio" if (_h5.h5py_has_mpi() and MPI.Query_thread() == MPI.THREAD_MULTIPLE) \
            else "independent"
        assert_all_ranks(comm, ds.driver == want, ds.driver)

    class Serialized:
        THREAD_MULTIPLE = MPI.THREAD_MULTIPLE

        @staticmethod
        def Query_thread():
            return MPI.THREAD_SERIALIZED
    monkeypatch.setattr(dsmod, "MPI", Serialized)
    with io.SampleDataset(files, g, split=(None, None, 0), seed=2) as ds:
        assert_all_ranks(comm, ds.driver == "independent" and ds._io_comm is None)
        (x, y), *_ = list(ds.epoch(0))
        idx = ds.batch_indices(0)[0]
        assert_allclose_all(comm, x.to_numpy(), _serial(files, False, idx)[0], rtol=0)
    with io.SampleDataset(files, g, prefetch=False) as ds:
        assert_all_ranks(comm, ds.driver == ("mpio" if _h5.h5py_has_mpi() else "independent"))
    if _h5.h5py_has_mpi():
        assert_raises_all(comm, ValueError, "MPI_THREAD_MULTIPLE",
                           lambda: io.SampleDataset(files, g, driver="mpio"))
    g.free()
