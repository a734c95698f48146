"""SampleDataset under MPI: spatially partitioned batches equal the serial read of the same
samples in the same order (vector targets and per-voxel label volumes); background reads;
errors."""
from __future__ import annotations

import math
import os

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import io, ops
from disttensor.io import _h5file, _temps
from disttensor.io import dataset as dsmod
from checks import check_blocks, expect, settle
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
            assert_all_ranks(comm, (ds.target_kind, ds.target_shape) == ("vector", (3,)))
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
        want = "mpio" if (_h5file.h5py_has_mpi() and MPI.Query_thread() == MPI.THREAD_MULTIPLE) \
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
        assert_all_ranks(comm, ds.driver == ("mpio" if _h5file.h5py_has_mpi() else "independent"))
    if _h5file.h5py_has_mpi():
        assert_raises_all(comm, ValueError, "MPI_THREAD_MULTIPLE",
                           lambda: io.SampleDataset(files, g, driver="mpio"))
    g.free()


# -- per-voxel label volumes -------------------------------------------------------------------
NL, SL, CL, KL = 5, 7, 2, 3  # samples, side (odd: uneven spatial blocks), channels, classes


def _label_grids():
    """(grid dims, split) for label batches on this rank count: spatial splits (7 voxels over 2,
    3 or 4 blocks: uneven), samples (5 over the ranks, batches of 2: empty blocks), channels
    split (the labels replicated over that grid axis; empty channel blocks on 3 and 4 ranks)."""
    a = 2 if SIZE % 2 == 0 else 1
    out = [((1, a, SIZE // a, 1), (0, None, 1, 2, 3))]                # D x H
    if SIZE > 1:
        out.append(((SIZE,), (0,)))                                    # samples only
        out.append(((1, SIZE), (0, None, None, None, 1)))              # W
        out.append(((SIZE,), (None, 0)))                               # channels
    if SIZE % 2 == 0 and SIZE > 2:
        out.append(((2, SIZE // 2), (0, None, None, 1, None)))         # samples x H
        out.append(((2, SIZE // 2), (None, 0, None, None, 1)))         # channels x W
    return out


@pytest.fixture(scope="module")
def seg_data(tmp_path_factory):
    comm = MPI.COMM_WORLD
    d = comm.bcast(str(tmp_path_factory.mktemp("seg")) if comm.rank == 0 else None, root=0)
    kw = dict(size=SL, channels=CL, seed=4, task="segmentation", classes=KL)
    files = io.generate_synthetic(os.path.join(d, "files"), NL, **kw)
    stacked = io.generate_synthetic(os.path.join(d, "stacked.h5"), NL, layout="stacked", **kw)
    return files, stacked


def _serial_labels(files, stacked, idx):
    """Inputs and label volumes of samples ``idx`` read whole by plain h5py."""
    xs, ys = [], []
    for i in idx:
        with h5py.File(files if stacked else files[i], "r") as f:
            xs.append(f["full"][i] if stacked else f["full"][...])
            ys.append(f["labels"][i] if stacked else f["labels"][...])
    return np.stack(xs), np.stack(ys)


def _check_label_batch(x, y, wx, wy, dims, split, what):
    """Record (see checks.settle) whether ``x`` and ``y`` hold exactly their blocks of the serial
    batch ``wx``, ``wy``, ``y`` laid out like ``x`` without the channel axis."""
    full = tuple(split) + (None,) * (5 - len(split))
    ysplit = (full[0],) + full[2:]
    check_blocks(x, wx, f"{what} x", layout=(dims, full, None))
    check_blocks(y, wy, f"{what} y", layout=(dims, ysplit, None))
    expect(y.dtype == np.uint8, f"{what}: labels dtype {y.dtype}")
    expect(y.distribution == x.distribution.drop_axes([1]), f"{what}: {y.distribution}")
    xs, ys = x.local_slices, y.local_slices
    expect(ys == (xs[0],) + xs[2:], f"{what}: label block {ys} vs sample block {xs}")


@pytest.mark.parametrize("layout", ["files", "stacked"])
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "sync"])
def test_label_volumes_equal_serial_read(comm, seg_data, layout, driver, prefetch):
    """Label batches (N, D, H, W) read partitioned over grids with sample, spatial and channel
    splits, uneven and empty blocks, equal the serial h5py read of the same samples in the
    same order."""
    files, stacked = seg_data
    src, ref = (files, (files, False)) if layout == "files" else (stacked, (stacked, True))
    if prefetch and driver == "mpio" and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        driver = "independent"  # (what driver=None would choose)
    for dims, split in _label_grids():
        g = dt.ProcessGrid(dims)
        with io.SampleDataset(src, g, split=split, batch_size=2, seed=6, prefetch=prefetch,
                              driver=driver, y_dataset="labels") as ds:
            expect((ds.target_kind, ds.target_shape, ds.num_targets, ds.target_dtype) ==
                   ("volume", (SL,) * 3, None, np.uint8), repr(ds))
            order = np.random.default_rng([6, 1]).permutation(NL)
            seen = []
            for b, (x, y) in enumerate(ds.epoch(1)):
                idx = order[2 * b:2 * b + 2]
                seen.extend(idx.tolist())
                dx, dy = ds.batch_distribution(len(idx))
                expect(x.distribution == dx and y.distribution == dy, f"{dims} {split}")
                wx, wy = _serial_labels(*ref, idx)
                _check_label_batch(x, y, wx, wy, dims, split, f"{dims} {split} batch {b}")
            expect(seen == order.tolist(), f"order {seen}")
            # read_batch: any samples, any order
            x, y = ds.read_batch([4, 0, 4])
            wx, wy = _serial_labels(*ref, [4, 0, 4])
            _check_label_batch(x, y, wx, wy, dims, split, f"{dims} {split} read_batch")
        g.free()
    settle()


def test_label_volumes_feed_cross_entropy(comm, seg_data):
    """The label batch has the layout the distributed cross-entropy expects: the loss of
    logits laid out like ``x`` (classes as channels) against it equals the serial loss."""
    files, _ = seg_data
    a = 2 if SIZE % 2 == 0 else 1
    g = dt.ProcessGrid((1, a, SIZE // a))
    split = (0, None, 1, None, 2)
    with io.SampleDataset(files, g, split=split, batch_size=3, seed=1,
                          y_dataset="labels") as ds:
        (x, y), *_ = list(ds.epoch(0))
        logits_np = np.random.default_rng(0).standard_normal((3, KL, SL, SL, SL))
        logits = dt.from_global(logits_np, grid=g, split=split)
        loss, _ = ops.cross_entropy_forward(logits, y)
        lab = _serial_labels(files, False, ds.batch_indices(0)[0])[1].astype(np.int64)
        z = logits_np - logits_np.max(1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(1, keepdims=True))
        want = -np.take_along_axis(logp, lab[:, None], axis=1).mean()
        assert_allclose_all(comm, loss, want, rtol=1e-10)
    g.free()


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "sync"])
def test_channels_last_label_volumes(comm, shared_tmp_path, prefetch):
    """D,H,W,C samples with D,H,W label volumes (not transposed), per file and stacked, non-cubic
    samples split unevenly."""
    rng = np.random.default_rng(1)
    full = rng.standard_normal((4, 5, 3, 6, 2)).astype("float32")  # N, D, H, W, C
    lab = rng.integers(0, 5, (4, 5, 3, 6)).astype("int16")
    if comm.rank == 0:
        for i in range(4):
            with h5py.File(shared_tmp_path / f"s{i}.h5", "w") as f:
                f["x"] = full[i]
                f["seg"] = lab[i]
        with h5py.File(shared_tmp_path / "stacked.h5", "w") as f:
            f["x"] = full
            f["seg"] = lab
    comm.Barrier()
    files = [str(shared_tmp_path / f"s{i}.h5") for i in range(4)]
    want = np.moveaxis(full, -1, 1)
    for src, dims, split in [(files, (SIZE,), (None, None, 0)),
                             (str(shared_tmp_path / "stacked.h5"), (1, SIZE),
                              (0, None, None, None, 1))]:
        g = dt.ProcessGrid(dims)
        with io.SampleDataset(src, g, split=split, batch_size=3, shuffle=False, x_dataset="x",
                              y_dataset="seg", channels_last=True, prefetch=prefetch) as ds:
            expect(ds.target_shape == (5, 3, 6) and ds.sample_shape == (2, 5, 3, 6), repr(ds))
            for b, (x, y) in enumerate(ds.epoch(0)):
                sl = slice(3 * b, 3 * b + 3)
                full_split = tuple(split) + (None,) * (5 - len(split))
                check_blocks(x, want[sl], f"{src} x", layout=(dims, full_split, None))
                check_blocks(y, lab[sl], f"{src} y",
                             layout=(dims, (full_split[0],) + full_split[2:], None))
        g.free()
    settle()


@pytest.mark.parametrize("driver", DRIVERS)
def test_bad_label_shapes_raise_on_every_rank(comm, seg_data, shared_tmp_path, driver):
    files, stacked = seg_data
    t = shared_tmp_path
    if comm.rank == 0:
        x = np.zeros((CL, SL, SL, SL), "float32")
        for name, lab in [("wide", (SL, SL, SL + 1)), ("flat", (SL, SL)),
                          ("chan", (SL, SL, SL, CL))]:
            with h5py.File(t / f"{name}.h5", "w") as f:
                f["full"] = x
                f["labels"] = np.zeros(lab, "uint8")
        for name, lab in [("s_wide", (NL, SL, SL - 1, SL)), ("s_n", (NL + 1, SL, SL, SL)),
                          ("s_flat", (NL, SL, SL))]:
            with h5py.File(t / f"{name}.h5", "w") as f:
                f["full"] = np.zeros((NL, CL, SL, SL, SL), "float32")
                f["labels"] = np.zeros(lab, "uint8")
    comm.Barrier()
    g = dt.ProcessGrid((SIZE,))
    def make(src):
        return io.SampleDataset(src, g, split=(None, None, 0), y_dataset="labels",
                                driver=driver, prefetch=False)
    # the first file decides the kind: a volume of the wrong shape, or neither kind
    assert_raises_all(comm, ValueError, r"spatial shape \(7, 7, 7\)",
                      lambda: make([str(t / "wide.h5")] + files[1:]))
    for bad in ("flat", "chan"):
        assert_raises_all(comm, ValueError, "expected a vector .* or a label volume",
                          lambda: make([str(t / f"{bad}.h5")] + files[1:]))
    assert_raises_all(comm, ValueError, r"spatial shape \(5, 7, 7, 7\)",
                      lambda: make(str(t / "s_wide.h5")))
    assert_raises_all(comm, ValueError, r"expected \(5, k\) target vectors or an",
                      lambda: make(str(t / "s_n.h5")))
    assert_raises_all(comm, ValueError, "label volume", lambda: make(str(t / "s_flat.h5")))
    # a later file with a wrong label volume: raised on every rank when its batch is read
    # (sample-parallel: only the ranks reading that sample see the file), then still usable
    for prefetch in (True, False):
        gs = dt.ProcessGrid((SIZE,))
        drv = driver if not (prefetch and driver == "mpio" and
                             MPI.Query_thread() < MPI.THREAD_MULTIPLE) else "independent"
        with io.SampleDataset(files[:2] + [str(t / "wide.h5")], gs, split=(0,), batch_size=3,
                              shuffle=False, y_dataset="labels", driver=drv,
                              prefetch=prefetch) as ds:
            assert_raises_all(comm, ValueError, "has shape",
                              lambda: [None for _ in ds.epoch(0)])
            x, y = ds.read_batch([1, 0])
            wx, wy = _serial_labels(files, False, [1, 0])
            check_blocks(y, wy, "after the error", layout=((SIZE,), (0, None, None, None), None))
        gs.free()
    settle()
    g.free()


# -- arguments that differ between ranks ----------------------------------------------------
def test_rank_dependent_arguments_raise_on_every_rank(comm, data_dir):
    """A file list, batch size, seed, ... that differs on the last rank raises
    ArgumentMismatchError on every rank at construction; an epoch, sample indices or a
    different dataset object per rank raise when the iteration starts / the batch is read."""
    if SIZE == 1:
        pytest.skip("needs ranks that can disagree")
    from disttensor.core.agreement import ArgumentMismatchError
    d, files, stacked = data_dir
    g = dt.ProcessGrid((SIZE,))
    last = comm.rank == SIZE - 1

    def per_rank(bad, good):
        return bad if last else good

    def make(**kw):
        kw = {"source": files, "grid": g, "split": (None, None, 0), "batch_size": 2,
              "seed": 1, **kw}
        return lambda: io.SampleDataset(kw.pop("source"), **kw).close()

    for what, fn in [
            (r"len\(source\)", make(source=per_rank(files[:-1], files))),  # one file fewer
            (r"source\[0\]", make(source=per_rank(files[::-1], files))),  # another order
            ("source", make(source=per_rank(os.path.join(d, "files"), files))),  # dir vs list
            ("source", make(source=per_rank(stacked, os.path.join(d, "files")))),
            (r"source\[7\]", make(source=per_rank(files + [os.path.join(d, "none.h5")],
                                                    files))),
            ("batch_size", make(batch_size=per_rank(3, 2))),
            ("batch_size", make(batch_size=per_rank(0, 2))),  # invalid on one rank only
            ("seed", make(seed=per_rank(2, 1))),
            ("shuffle", make(shuffle=per_rank(False, True))),
            ("drop_last", make(drop_last=per_rank(True, False))),
            ("split", make(split=per_rank((0,), (None, None, 0)))),
            ("y_dataset", make(y_dataset=per_rank("full", "unitPar"))),
            ("prefetch", make(prefetch=per_rank(False, True)))]:
        assert_raises_all(comm, ArgumentMismatchError,
                          rf"SampleDataset: arguments differ between ranks.*'{what}' \(rank 0: ",
                          fn)
    # a file list names the differing item (short lists by the dataset, long ones by the
    # agreement: 7 and 14 files)
    for src in (files, files * 2):
        assert_raises_all(comm, ArgumentMismatchError,
                          rf"'source\[3\]' \(rank 0: '.*sample_000003.h5', .*rank {SIZE - 1}: "
                          r"'.*sample_000004",
                          make(source=per_rank(src[:3] + src[4:] + src[3:4], src)))
    with io.SampleDataset(files, g, split=(None, None, 0), batch_size=2, seed=1) as ds, \
            io.SampleDataset(files, g, split=(None, None, 0), batch_size=3, seed=1) as other:
        consume = lambda ds, e: [None for _ in ds.epoch(e)]  # noqa: E731
        assert_raises_all(comm, ArgumentMismatchError,
                          r"SampleDataset.epoch: arguments differ.*'epoch' \(rank 0: 0, ",
                          lambda: consume(ds, per_rank(1, 0)))
        assert_raises_all(comm, ArgumentMismatchError,
                          r"SampleDataset.epoch: arguments differ.*'batch_size'",
                          lambda: consume(per_rank(other, ds), 0))
        assert_raises_all(comm, ArgumentMismatchError,
                          r"SampleDataset.read_batch: arguments differ.*'indices' \(rank 0: ",
                          lambda: ds.read_batch(per_rank([1, 2], [1, 3])))
        assert_raises_all(comm, ArgumentMismatchError, r"read_batch: arguments differ",
                          lambda: ds.read_batch(per_rank(np.array([9]), np.array([1]))))
        # still usable, with equal arguments given in different forms
        x, y = ds.read_batch(per_rank(np.array([1, 3]), [1, 3]))
        assert_allclose_all(comm, x.to_numpy(), _serial(files, False, [1, 3])[0], rtol=0)
        assert_all_ranks(comm, len(consume(ds, 0)) == math.ceil(N / 2))
    from pathlib import Path
    with io.SampleDataset(per_rank([Path(f) for f in files], files), g, batch_size=N) as ds:
        assert_all_ranks(comm, ds.num_samples == N)
    g.free()


def test_temporary_files_are_not_samples(comm, shared_tmp_path):
    """A directory holding the temporary file of an interrupted write lists its samples only."""
    d = shared_tmp_path / "ds"
    files = io.generate_synthetic(d, 3, size=4, channels=1, seed=0)
    if comm.rank == 0:
        (d / f".sample_000001.h5.{_temps.host_tag()}.{os.getpid()}.0123456789ab.tmp").write_bytes(
            open(files[1], "rb").read())
    comm.Barrier()
    g = dt.ProcessGrid((SIZE,))
    with io.SampleDataset(str(d), g, split=(None, None, 0)) as ds:
        assert_all_ranks(comm, ds.num_samples == 3 and ds.files == files, f"{ds.files}")
    g.free()
