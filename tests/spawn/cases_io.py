"""Rank-mismatch cases: parallel HDF5 I/O, sample datasets, checkpoints, synthetic data (see
``registry.py``).  ``ctx.tmp`` is shared by the ranks; files every case needs are written
collectively first, with equal arguments."""
import numpy as np

import disttensor as dt
from disttensor import io
from disttensor.core.agreement import ArgumentMismatchError

from .registry import case


def _x(ctx):
    return dt.from_global(np.arange(6.0 * ctx.size * 4).reshape(6 * ctx.size, 4))


def _written(ctx, name="data.h5"):
    """A file with datasets 'x' and 'y', written with equal arguments on every rank."""
    p = ctx.tmp / name
    io.write_hdf5(_x(ctx), p, "x", mode="w")
    io.write_hdf5(_x(ctx), p, "y")
    return p


def _samples(ctx, n=5):
    return io.generate_synthetic(ctx.tmp / "samples", n, size=4, channels=1, seed=0)


# -- write_hdf5 --------------------------------------------------------------------------------
@case(ArgumentMismatchError, match="write_hdf5.*'path'")
def write_path(ctx):
    """A rank-dependent file name (e.g. built from the rank): with MPI-IO each rank would open
    its own file in a collective open."""
    io.write_hdf5(_x(ctx), ctx.tmp / ctx.per_rank("b.h5", "a.h5"), "x")


@case(ArgumentMismatchError, match="write_hdf5.*'path'")
def write_path_independent_driver(ctx):
    """The same with ordered POSIX writes (the token would pass between different files)."""
    io.write_hdf5(_x(ctx), ctx.tmp / ctx.per_rank("b.h5", "a.h5"), "x", driver="independent")


@case(ArgumentMismatchError, match="write_hdf5.*'dataset'")
def write_dataset_name(ctx):
    io.write_hdf5(_x(ctx), ctx.tmp / "a.h5", ctx.per_rank("y", "x"))


@case(ArgumentMismatchError, match="write_hdf5.*'mode'")
def write_mode(ctx):
    _written(ctx, "a.h5")
    io.write_hdf5(_x(ctx), ctx.tmp / "a.h5", "x", mode=ctx.per_rank("r+", "w"))


@case(ArgumentMismatchError, match="write_hdf5.*'chunks'")
def write_chunks(ctx):
    io.write_hdf5(_x(ctx), ctx.tmp / "a.h5", "x", chunks=ctx.per_rank((2, 2), (3, 4)))


@case(ArgumentMismatchError, match="write_hdf5.*'compression'")
def write_compression(ctx):
    """Parallel HDF5 needs identical filter pipelines on every rank."""
    io.write_hdf5(_x(ctx), ctx.tmp / "a.h5", "x", chunks=(3, 4),
                  compression=ctx.per_rank("gzip", None))


@case(ArgumentMismatchError, match="write_hdf5.*'x'")
def write_array_distribution(ctx):
    """Arrays of different distributions (split) passed on different ranks."""
    a = dt.zeros((6, 4), split=(0, None))
    b = dt.zeros((6, 4), split=(None, 0))
    io.write_hdf5(ctx.per_rank(b, a), ctx.tmp / "a.h5", "x")


# -- read_hdf5 ---------------------------------------------------------------------------------
@case(ArgumentMismatchError, match="read_hdf5.*'dataset'")
def read_dataset_name(ctx):
    p = _written(ctx)
    io.read_hdf5(p, ctx.per_rank("y", "x"))


@case(ArgumentMismatchError, match="read_hdf5.*'path'")
def read_missing_file_on_one_rank(ctx):
    """A path that exists on some ranks only: the mismatch is reported, not a missing file."""
    p = _written(ctx)
    io.read_hdf5(ctx.per_rank(ctx.tmp / "none.h5", p), "x")


@case(ArgumentMismatchError, match="read_hdf5.*'split'")
def read_split(ctx):
    p = _written(ctx)
    io.read_hdf5(p, "x", split=ctx.per_rank((None, 0), (0, None)))


# -- SampleDataset -----------------------------------------------------------------------------
@case(ArgumentMismatchError, match=r"SampleDataset.*'len\(source\)'")
def dataset_file_list(ctx):
    """A file list that lacks a file on one rank."""
    files = _samples(ctx)
    io.SampleDataset(ctx.per_rank(files[:-1], files), batch_size=2)


@case(ArgumentMismatchError, match=r"SampleDataset.*'source\[1\]'")
def dataset_file_order(ctx):
    """The same files in another order (e.g. listed with os.listdir, unsorted)."""
    files = _samples(ctx)
    io.SampleDataset(ctx.per_rank(files[::-1], files), batch_size=2)


@case(ArgumentMismatchError, match="SampleDataset.*'batch_size'")
def dataset_batch_size(ctx):
    files = _samples(ctx)
    io.SampleDataset(files, batch_size=ctx.per_rank(3, 2))


@case(ArgumentMismatchError, match="SampleDataset.*'seed'")
def dataset_seed(ctx):
    files = _samples(ctx)
    io.SampleDataset(files, batch_size=2, seed=ctx.per_rank(1, 0))


@case(ArgumentMismatchError, match="SampleDataset.epoch.*'epoch'")
def dataset_epoch(ctx):
    """Different epochs (different shuffles: different samples per batch on each rank)."""
    files = _samples(ctx)
    with io.SampleDataset(files, batch_size=2, prefetch=False) as ds:
        for _ in ds.epoch(ctx.per_rank(1, 0)):
            pass


@case(ArgumentMismatchError, match="SampleDataset.read_batch.*'indices'")
def dataset_read_batch_indices(ctx):
    files = _samples(ctx)
    with io.SampleDataset(files, batch_size=2) as ds:
        ds.read_batch(ctx.per_rank([0, 2], [0, 1]))


@case(ArgumentMismatchError, match="SampleDataset.epoch.*'batch_size'")
def dataset_other_object(ctx):
    """One rank iterates the validation dataset while the others iterate the training one."""
    files = _samples(ctx)
    with io.SampleDataset(files, batch_size=2) as train, \
            io.SampleDataset(files, batch_size=1, shuffle=False) as val:
        for _ in ctx.per_rank(val, train).epoch(0):
            pass


# -- synthetic data ----------------------------------------------------------------------------
@case(ArgumentMismatchError, match="generate_synthetic.*'samples'")
def synthetic_samples(ctx):
    io.generate_synthetic(ctx.tmp / "syn", ctx.per_rank(4, 3), size=4, channels=1)


@case(ArgumentMismatchError, match="generate_synthetic.*'layout'")
def synthetic_layout(ctx):
    io.generate_synthetic(ctx.tmp / "syn", 3, size=4, channels=1,
                          layout=ctx.per_rank("stacked", "files"))


# -- checkpoints -------------------------------------------------------------------------------
@case(ArgumentMismatchError, match="save_checkpoint.*'arrays'")
def save_checkpoint_names(ctx):
    """A different set of names (a parameter missing on one rank)."""
    w, b = dt.zeros((4, 3)), dt.zeros((3,))
    arrays = {"w": w, "b": b}
    io.save_checkpoint(ctx.tmp / "ck.h5", ctx.per_rank({"w": w}, arrays))


@case(ArgumentMismatchError, match="save_checkpoint.*'scalars'")
def save_checkpoint_scalars(ctx):
    io.save_checkpoint(ctx.tmp / "ck.h5", {"w": dt.zeros((4,))},
                       scalars={"step": ctx.per_rank(11, 10)})


@case(ArgumentMismatchError, match="save_checkpoint.*'path'")
def save_checkpoint_path(ctx):
    io.save_checkpoint(ctx.tmp / ctx.per_rank("b.h5", "a.h5"), {"w": dt.zeros((4,))})


@case(ArgumentMismatchError, match="load_checkpoint.*'path'")
def load_checkpoint_path(ctx):
    io.save_checkpoint(ctx.tmp / "a.h5", {"w": dt.zeros((4,))})
    io.save_checkpoint(ctx.tmp / "b.h5", {"w": dt.zeros((5,))})
    io.load_checkpoint(ctx.tmp / ctx.per_rank("b.h5", "a.h5"))


@case(ArgumentMismatchError, match="load_checkpoint.*'split'")
def load_checkpoint_split(ctx):
    io.save_checkpoint(ctx.tmp / "a.h5", {"w": dt.zeros((4 * ctx.size,))})
    io.load_checkpoint(ctx.tmp / "a.h5", split={"w": ctx.per_rank((None,), (0,))})
