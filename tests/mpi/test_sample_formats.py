"""SampleDataset over the other sample formats (Zarr groups, ``.npy`` pairs, TFRecords) under
MPI: the same batches as over the equivalent HDF5 file, on spatial and data-parallel grids;
the readers against plain numpy / zarr / the ``tfrecord`` package; errors on every rank."""
from __future__ import annotations

import gzip
import os

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import io
from disttensor.io import _h5file, npy_samples, sources, zarr_samples
from conftest import assert_all_ranks, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
N, C, S, K = 5, 4, 6, 4  # samples, channels, side, targets


def _grids():
    """Spatial (D and H split; uneven blocks of the side 6 on 4 ranks) and, with several
    ranks, sample x W (4 ranks) or data parallel."""
    a = 2 if SIZE % 2 == 0 else 1
    out = [((1, a, SIZE // a, 1), (0, None, 1, 2, 3))]
    if SIZE == 4:
        out.append(((2, 2), (0, None, None, None, 1)))
    elif SIZE > 1:
        out.append(((SIZE, 1), (0, None, None, 1)))
    return out


def _data():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 3000, (N, C, S, S, S)).astype(np.int16)     # N,C,D,H,W
    y = rng.standard_normal((N, K)).astype(np.float32)
    lab = rng.integers(0, 3, (N, S, S, S)).astype(np.uint8)
    return x, y, lab


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Every format of the same samples, written by rank 0."""
    comm = MPI.COMM_WORLD
    d = comm.bcast(str(tmp_path_factory.mktemp("fmt")) if comm.rank == 0 else None, root=0)
    x, y, lab = _data()
    xl = np.moveaxis(x, 1, -1)                                         # N,D,H,W,C
    p = {k: os.path.join(d, k) for k in ("ref.h5", "seg.h5", "cdhw.zarr", "dhwc.zarr",
                                         "seg.zarr", "npy", "npyseg", "tfr", "tfr_plain")}

    def make():
        with h5py.File(p["ref.h5"], "w") as f:
            f["full"], f["unitPar"] = x, y
        with h5py.File(p["seg.h5"], "w") as f:
            f["full"], f["labels"] = x, lab
        zs = zarr_samples
        if _has("zarr"):
            zs.write_zarr_samples(p["cdhw.zarr"], x, y)
            zs.write_zarr_samples(p["dhwc.zarr"], xl, y, x_dataset="x", y_dataset="y",
                                  compressors="blosc")
            zs.write_zarr_samples(p["seg.zarr"], x, lab, y_dataset="labels")
        for k in ("npy", "npyseg", "tfr", "tfr_plain"):
            os.makedirs(p[k])
        for i in range(N):
            npy_samples.write_npy_pair(p["npy"], f"univ_{i:03d}", xl[i], y[i])
            npy_samples.write_npy_pair(p["npyseg"], f"s{i}", x[i], lab[i])
        if _has("tfrecord"):
            from disttensor.io import tfrecord_samples as ts
            ts.write_tfrecord(os.path.join(p["tfr"], "a.tfrecord"),
                              [(xl[i], y[i]) for i in range(3)])
            ts.write_tfrecord(os.path.join(p["tfr"], "b.tfrecord"),
                              [(xl[i], y[i]) for i in range(3, N)])
            # written by the package's own writer (uncompressed), one record per file
            from tfrecord import TFRecordWriter
            for i in range(N):
                w = TFRecordWriter(os.path.join(p["tfr_plain"], f"r{i}.tfrecord"))
                w.write({"x": (xl[i].tobytes(), "byte"), "y": (y[i].tolist(), "float")})
                w.close()
    _h5file.root_call(comm, make)
    return p


def _has(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


def _same_batches(comm, ref_src, src, ref_kw=None, grids=None, **kw):
    for dims, split in grids or _grids():
        g = dt.ProcessGrid(dims)
        try:
            with io.SampleDataset(ref_src, g, split=split, batch_size=3, seed=3,
                                  prefetch=False, **(ref_kw or {})) as ref, \
                    io.SampleDataset(src, g, split=split, batch_size=3, seed=3,
                                     prefetch=True, **kw) as ds:
                assert_all_ranks(comm, (ds.num_samples, ds.sample_shape, ds.target_shape,
                                        ds.dtype) == (ref.num_samples, ref.sample_shape,
                                                      ref.target_shape, ref.dtype), repr(ds))
                for (xr, yr), (xb, yb) in zip(ref.epoch(1), ds.epoch(1)):
                    assert_all_ranks(comm, xb.distribution == xr.distribution and
                                     yb.distribution == yr.distribution, "distributions")
                    assert_all_ranks(comm, np.array_equal(xb.local, xr.local) and
                                     xb.local.dtype == xr.local.dtype, f"x blocks {dims}")
                    assert_all_ranks(comm, np.array_equal(yb.local, yr.local), "y blocks")
        finally:
            g.free()


@pytest.mark.parametrize("kind", ["cdhw", "dhwc", "seg"])
def test_zarr_batches_equal_hdf5(comm, stores, kind):
    pytest.importorskip("zarr")
    if kind == "seg":
        _same_batches(comm, stores["seg.h5"], stores["seg.zarr"], {"y_dataset": "labels"},
                      y_dataset="labels")
    elif kind == "cdhw":
        _same_batches(comm, stores["ref.h5"], stores["cdhw.zarr"])
    else:
        _same_batches(comm, stores["ref.h5"], stores["dhwc.zarr"], channels_last=True)


@pytest.mark.parametrize("kind", ["vector", "seg"])
def test_npy_pairs_batches_equal_hdf5(comm, stores, kind):
    if kind == "seg":
        _same_batches(comm, stores["seg.h5"], stores["npyseg"], {"y_dataset": "labels"})
    else:
        _same_batches(comm, stores["ref.h5"], stores["npy"], channels_last=True)


@pytest.mark.parametrize("which", ["tfr", "tfr_plain"])
def test_tfrecord_batches_equal_hdf5(comm, stores, which):
    pytest.importorskip("tfrecord")
    from disttensor.io.tfrecord_samples import TFRecordSource
    _same_batches(comm, stores["ref.h5"], stores[which])              # shape inferred
    src = TFRecordSource(stores[which], sample_shape=(S, S, S, C), records_per_file=None)
    _same_batches(comm, stores["ref.h5"], src, grids=_grids()[-1:])


def test_tfrecord_files_readable_by_the_package(comm, stores):
    """Our gzipped records decode with the package's own loader; its records with ours."""
    pytest.importorskip("tfrecord")
    from tfrecord.reader import tfrecord_loader
    from disttensor.io.tfrecord_samples import decode_example, read_records
    x, y, _ = _data()
    xl = np.moveaxis(x, 1, -1)
    got = list(tfrecord_loader(os.path.join(stores["tfr"], "b.tfrecord"), None,
                               {"x": "byte", "y": "float"}, compression_type="gzip"))
    ok = len(got) == 2 and all(
        np.array_equal(np.frombuffer(r["x"], np.int16).reshape(S, S, S, C), xl[3 + j]) and
        np.allclose(r["y"], y[3 + j]) for j, r in enumerate(got))
    assert_all_ranks(comm, ok, "package reader")
    recs = read_records(os.path.join(stores["tfr_plain"], "r2.tfrecord"))
    xb, yv = decode_example(recs[0])
    assert_all_ranks(comm, len(recs) == 1 and np.array_equal(
        np.frombuffer(xb, np.int16).reshape(S, S, S, C), xl[2]) and np.array_equal(yv, y[2]))


def test_npy_block_reads_equal_numpy_load(comm, shared_tmp_path):
    """Hyperslab reads of C-order, Fortran-order and big-endian files equal numpy.load."""
    rng = np.random.default_rng(comm.rank)
    a = rng.standard_normal((5, 6, 7, 3))
    for k, arr in enumerate([a, np.asfortranarray(a), a.astype(">f8"), a.astype(np.int16)]):
        path = shared_tmp_path / f"blk{comm.rank}_{k}.npy"
        np.save(path, arr)
        h = npy_samples._header(path)
        ref = np.load(path)
        ok = True
        for _ in range(20):
            start = [int(rng.integers(0, n + 1)) for n in a.shape]
            count = [int(rng.integers(0, n - s + 1)) for s, n in zip(start, a.shape)]
            out = np.empty(count, dtype=ref.dtype.newbyteorder("="))
            npy_samples.read_npy_block(path, h, start, out)
            ok &= np.array_equal(out, ref[tuple(slice(s, s + c) for s, c in zip(start, count))])
        assert_all_ranks(comm, ok, f"file {k}")


def test_errors_on_every_rank(comm, stores, shared_tmp_path):
    g = dt.ProcessGrid((1, SIZE), comm=comm)
    split = (0, None, 1)
    # TFRecords: a declared shape the records do not have; one bad record later on
    if _has("tfrecord"):
        from disttensor.io import tfrecord_samples as ts
        assert_raises_all(comm, ValueError, "holds .* bytes", lambda: io.SampleDataset(
            ts.TFRecordSource(stores["tfr"], sample_shape=(S, S, S, 3)), g, split=split))
        bad = shared_tmp_path / "badtfr"
        x, y, _ = _data()
        xl = np.moveaxis(x, 1, -1)

        def mk():
            os.makedirs(bad, exist_ok=True)
            ts.write_tfrecord(bad / "a.tfrecord", [(xl[0], y[0])])
            ts.write_tfrecord(bad / "b.tfrecord", [(xl[1, :-1], y[1])])
        _h5file.root_call(comm, mk)
        with io.SampleDataset(str(bad), g, split=split, batch_size=1, shuffle=False,
                              prefetch=False) as ds:
            assert_raises_all(comm, ValueError, "holds .* bytes",
                              lambda: ds.read_batch([1]))
    # npy pairs: a later pair of another shape; a data file without its label file
    bad = shared_tmp_path / "badnpy"
    x, y, _ = _data()

    def mk2():
        os.makedirs(bad, exist_ok=True)
        npy_samples.write_npy_pair(bad, "a", x[0], y[0])
        npy_samples.write_npy_pair(bad, "b", x[1, :, :-1], y[1])
    _h5file.root_call(comm, mk2)
    with io.SampleDataset(str(bad), g, split=split, batch_size=1, shuffle=False,
                          prefetch=False) as ds:
        assert_raises_all(comm, ValueError, "shapes", lambda: ds.read_batch([1]))
    _h5file.root_call(comm, lambda: os.remove(bad / "b_label.npy"))
    assert_raises_all(comm, ValueError, "lack", lambda: io.SampleDataset(
        str(bad), g, split=split))
    # Zarr: a store whose sample array is not stacked 5-d
    if _has("zarr"):
        import zarr
        zbad = shared_tmp_path / "bad.zarr"

        def mk3():
            grp = zarr.open_group(zbad, mode="w")
            grp.create_array("full", shape=(C, S, S, S), dtype="f4")
            grp.create_array("unitPar", shape=(N, K), dtype="f4")
        _h5file.root_call(comm, mk3)
        assert_raises_all(comm, ValueError, "expected stacked", lambda: io.SampleDataset(
            str(zbad), g, split=split))
        assert_raises_all(comm, KeyError, "no array", lambda: io.SampleDataset(
            str(zbad), g, split=split, y_dataset="nope"))
    g.free()


def test_openers_registered():
    names = [f.__name__ for f in sources.OPENERS]
    assert names[-1] == "open_hdf5"
    assert {"open_npy_pairs", "open_zarr_samples", "open_tfrecords"} <= set(names)


@pytest.mark.parametrize("fmt", ["zarr", "npy", "tfrecord"])
def test_generator_writes_each_format(comm, shared_tmp_path, fmt):
    """generate_synthetic_format on every rank: SampleDataset reads back sample i as the serial
    generator's (int16 counts of synthetic_sample), the same in every format."""
    pytest.importorskip({"zarr": "zarr", "tfrecord": "tfrecord"}.get(fmt, "numpy"))
    from disttensor.io.synthetic import synthetic_sample
    from disttensor.io.synthetic_formats import generate_synthetic_format, int16_counts
    n, side = 3, 6
    out = str(shared_tmp_path / f"gen_{fmt}")
    generate_synthetic_format(out, n, side, 4, seed=2, format=fmt, comm=comm,
                              records_per_file=2)
    g = dt.ProcessGrid((1, SIZE))
    with io.SampleDataset(out, g, split=(0, None, 1), batch_size=n, shuffle=False,
                          prefetch=False, channels_last=fmt != "zarr") as ds:
        x, y = ds.read_batch(range(n))
    ref = [synthetic_sample(i, side, 4, 2) for i in range(n)]
    want_x = np.stack([int16_counts(r[0]) for r in ref])
    want_y = np.stack([r[1] for r in ref])
    assert_all_ranks(comm, x.dtype == np.int16 and np.array_equal(
        x.local, want_x[x.local_slices]), "samples")
    assert_all_ranks(comm, np.allclose(y.local, want_y[y.local_slices]), "targets")
    if fmt == "tfrecord":
        assert_raises_all(comm, ValueError, "target vectors only", lambda:
                          generate_synthetic_format(out, 2, side, 4, format=fmt, comm=comm,
                                                    task="segmentation"))
    g.free()
