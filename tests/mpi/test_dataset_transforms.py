"""SampleDataset's read-time transforms, crops and augmentation under MPI: every rank's block
equals the same block of a serial NumPy pipeline (whole samples read with h5py, cropped at the
offsets drawn from the documented generator, np.flip/np.transpose, conversion, log1p,
division by the mean, target normalization) on grids with uneven and empty blocks; label
volumes see the same crops and flips; bad input raises on every rank."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import io
from checks import check_blocks, expect, settle
from conftest import assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
N, C, SP = 5, 2, (9, 7, 9)   # samples, channels, spatial (odd: uneven blocks on 2-4 ranks)
CROP = (5, 5, 5)
STREAM = 0x61756720          # the view generator's fourth seed word (documented)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """int16 D,H,W,C counts per file (+ unitPar) and a stacked C,D,H,W file with labels."""
    comm = MPI.COMM_WORLD
    d = comm.bcast(str(tmp_path_factory.mktemp("tr")) if comm.rank == 0 else None, root=0)
    rng = np.random.default_rng(3)
    full = rng.poisson(4.0, (N,) + SP + (C,)).astype("int16")     # N, D, H, W, C
    par = rng.uniform(-1, 1, (N, 4)).astype("float32")
    lab = rng.integers(0, 3, (N,) + SP).astype("uint8")
    files = [f"{d}/univ_{i}.hdf5" for i in range(N)]
    if comm.rank == 0:
        for i in range(N):
            with h5py.File(files[i], "w") as f:
                f["full"] = full[i]
                f["unitPar"] = par[i]
        with h5py.File(f"{d}/stacked.h5", "w") as f:
            f["full"] = np.moveaxis(full, -1, 1)
            f["labels"] = lab
    comm.Barrier()
    return files, f"{d}/stacked.h5", np.moveaxis(full, -1, 1), par, lab


def _view(seed, epoch, s, crop, random_crop, flip, permute):
    """The documented draws: offsets, flips, permutation from default_rng([seed, epoch, s,
    STREAM])."""
    rng = np.random.default_rng([seed, epoch, s, STREAM])
    off = rng.integers(0, [n - c + 1 for n, c in zip(SP, crop)])
    flips = rng.integers(0, 2, 3).astype(bool)
    perm = rng.permutation(3)
    if not random_crop:
        off = [(n - c) // 2 for n, c in zip(SP, crop)]
    return off, flips if flip else np.zeros(3, bool), perm if permute else np.arange(3)


def _see(a, view, lead):
    off, flips, perm = view
    sl = tuple([slice(None)] * lead + [slice(o, o + c) for o, c in zip(off, CROP)])
    a = a[sl]
    for ax in range(3):
        if flips[ax]:
            a = np.flip(a, lead + ax)
    return np.transpose(a, list(range(lead)) + [lead + p for p in perm])


def _grids():
    a = 2 if SIZE % 2 == 0 else 1
    out = [((1, a, SIZE // a, 1), (0, None, 1, 2, 3))]     # D x H (uneven crops of 5)
    if SIZE > 1:
        out.append(((SIZE,), (0,)))                          # samples (empty blocks)
        out.append(((1, SIZE), (None, 0, None, None, 1)))    # channels x W: empty channels
    return out


@pytest.mark.parametrize("augment", [True, "flip", False])
def test_cropped_augmented_transformed_equal_serial_pipeline(comm, raw, augment):
    files, _, full, par, _ = raw
    flip, permute = augment in (True, "flip"), augment is True
    for k, (dims, split) in enumerate(_grids()):
        g = dt.ProcessGrid(dims)
        kw = dict(dtype="float32", log1p=True, divide_by_mean=True, target_shift=0.5,
                  target_scale=(2, 2, 4, 4), crop=CROP, augment=augment, x_shift=0.25,
                  x_scale=0.5)
        with io.SampleDataset(files, g, split=split, batch_size=2, seed=7, channels_last=True,
                              prefetch=k == 0, **kw) as ds:
            expect(ds.sample_shape == (C,) + CROP and ds.dtype == np.float32, repr(ds))
            for e in (0, 1):
                order = np.random.default_rng([7, e]).permutation(N)
                for b, (x, y) in enumerate(ds.epoch(e)):
                    idx = order[2 * b:2 * b + 2]
                    wx, wy = [], []
                    for s in idx:
                        v = _see(np.log1p(full[s].astype(np.float32)),
                                 _view(7, e, s, CROP, True, flip, permute), 1)
                        wx.append((v / float(v.astype(np.float64).mean()) - 0.25) / 0.5)
                        wy.append(((par[s] - 0.5) / np.array([2, 2, 4, 4])).astype("float32"))
                    fs = tuple(split) + (None,) * (5 - len(split))
                    check_blocks(x, np.stack(wx), f"{dims} {split} e{e} b{b} x", rtol=2e-6,
                                 layout=(dims, fs, None))
                    check_blocks(y, np.stack(wy), f"{dims} {split} e{e} b{b} y", rtol=1e-6)
            # read_batch sees the samples as the epoch does
            x, y = ds.read_batch([3, 1], epoch=1)
            v = _see(np.log1p(full[3].astype(np.float32)), _view(7, 1, 3, CROP, True, flip,
                                                                  permute), 1)
            expect(np.allclose(x.to_numpy()[0], (v / float(v.astype(np.float64).mean()) - 0.25)
                               / 0.5, rtol=2e-6, atol=1e-6), "read_batch(epoch=1)")
        g.free()
    settle()


def test_labels_cropped_and_flipped_like_samples(comm, raw):
    """Stacked C,D,H,W int16 with label volumes: int16 -> float16 conversion only, centred
    and random crops, flips and permutations; the labels see the same view."""
    _, stacked, full, _, lab = raw
    for k, (dims, split) in enumerate(_grids()):
        g = dt.ProcessGrid(dims)
        for random_crop in (True, False):
            with io.SampleDataset(stacked, g, split=split, batch_size=3, seed=2,
                                  y_dataset="labels", dtype="float16", crop=CROP,
                                  random_crop=random_crop, augment=True,
                                  prefetch=random_crop) as ds:
                expect(ds.target_shape == CROP, repr(ds))
                order = np.random.default_rng([2, 0]).permutation(N)
                for b, (x, y) in enumerate(ds.epoch(0)):
                    idx = order[3 * b:3 * b + 3]
                    views = [_view(2, 0, s, CROP, random_crop, True, True) for s in idx]
                    wx = np.stack([_see(full[s], v, 1) for s, v in zip(idx, views)])
                    wy = np.stack([_see(lab[s], v, 0) for s, v in zip(idx, views)])
                    what = f"{dims} {split} random={random_crop} b{b}"
                    check_blocks(x, wx.astype(np.float16), what + " x")
                    check_blocks(y, wy, what + " y")
                    expect(y.distribution == x.distribution.drop_axes([1]), what)
        g.free()
    settle()


def test_plain_crops_without_transforms(comm, raw):
    """A crop alone keeps the stored dtype and reads straight into the batch."""
    files, _, full, par, _ = raw
    g = dt.ProcessGrid((SIZE,))
    with io.SampleDataset(files, g, split=(None, None, 0), batch_size=N, shuffle=False,
                          channels_last=True, crop=(4, 7, 3), seed=1) as ds:
        (x, y), = list(ds.epoch(3))
        rng = [np.random.default_rng([1, 3, s, STREAM]) for s in range(N)]
        offs = [r.integers(0, [6, 1, 7]) for r in rng]
        want = np.stack([full[s][:, o[0]:o[0] + 4, o[1]:o[1] + 7, o[2]:o[2] + 3]
                         for s, o in enumerate(offs)])
        check_blocks(x, want, "plain crop")
        check_blocks(y, par, "targets as stored")
    # an affine input normalization alone (log1p off): in float64
    with io.SampleDataset(files, g, split=(None, None, 0), batch_size=N, shuffle=False,
                          channels_last=True, dtype="float64", x_shift=3, x_scale=2) as ds:
        (x, _), = list(ds.epoch(0))
        check_blocks(x, (full.astype(np.float64) - 3) / 2, "x_shift/x_scale", rtol=1e-15)
    g.free()
    settle()


def test_bad_transforms_raise_on_every_rank(comm, raw, shared_tmp_path):
    files, stacked, _, _, _ = raw
    if comm.rank == 0:
        with h5py.File(shared_tmp_path / "f.h5", "w") as f:
            f["full"] = np.zeros((C,) + SP, "float32")
            f["unitPar"] = np.zeros(4, "float32")
        with h5py.File(shared_tmp_path / "b.h5", "w") as f:
            f["full"] = np.zeros((C,) + SP, bool)
            f["unitPar"] = np.zeros(4, "float32")
        with h5py.File(shared_tmp_path / "c.h5", "w") as f:
            f["full"] = np.zeros((C,) + SP, "complex64")
            f["unitPar"] = np.zeros(4, "float32")
    comm.Barrier()
    g = dt.ProcessGrid((SIZE,))

    def make(src=files, **kw):
        return lambda: io.SampleDataset(src, g, split=(None, None, 0), prefetch=False,
                                        channels_last=src is files, **kw).close()
    t = shared_tmp_path
    for exc, match, fn in [
            (ValueError, r"crop \(10, 5, 5\) is larger than", make(crop=(10, 5, 5))),
            (ValueError, "larger than", make(src=stacked, y_dataset="labels", crop=8)),
            (ValueError, "crop must be", make(crop=(4, 4))),
            (ValueError, "cubic", make(crop=(4, 5, 4), augment=True)),
            (ValueError, "augment must be", make(augment="mirror")),
            (TypeError, "log1p needs a floating output", make(log1p=True)),
            (TypeError, "divide_by_mean needs a floating", make(divide_by_mean=True,
                                                                  dtype="int32")),
            (TypeError, "cannot convert the stored float32 samples to dtype=int16",
             make(src=str(t / "f.h5"), dtype="int16")),
            (TypeError, "cannot convert the stored int16 samples to dtype=int8",
             make(dtype="int8")),
            (TypeError, "log1p cannot take bool", make(src=str(t / "b.h5"), log1p=True,
                                                       dtype="float32")),
            (TypeError, "log1p cannot take complex64", make(src=str(t / "c.h5"), log1p=True)),
            (ValueError, "label volumes", make(src=stacked, y_dataset="labels",
                                               target_scale=2)),
            (ValueError, "non-zero", make(target_scale=(1, 0, 1, 1))),
            (ValueError, "one per target", make(target_shift=(1, 2))),
            (TypeError, "x_shift/x_scale needs a floating", make(x_shift=2.0)),
            (ValueError, "x_scale must be non-zero", make(x_scale=0, dtype="float32"))]:
        assert_raises_all(comm, exc, match, fn)
    if SIZE > 1:
        from disttensor.core.agreement import ArgumentMismatchError
        last = comm.rank == SIZE - 1
        assert_raises_all(comm, ArgumentMismatchError, "SampleDataset: arguments differ.*crop",
                          make(crop=(4, 4, 4) if last else (4, 4, 5)))
        assert_raises_all(comm, ArgumentMismatchError, "arguments differ.*log1p",
                          make(log1p=last, dtype="float32"))
    g.free()
