"""``python -m disttensor.predict`` under MPI: predictions and label volumes equal a serial
forward pass of the same model (float64, on a one-rank grid over ``MPI.COMM_SELF`` on rank 0,
broadcast) on 1-4 ranks with uneven blocks; sliding windows equal a NumPy re-implementation of
nnU-Net's Gaussian blending over per-window serial forwards; bad input raises on every rank
and leaves an earlier output intact.
"""
from __future__ import annotations

import csv
import itertools
import math
import os

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from disttensor import nn, predict
from disttensor.autograd import Tensor, no_grad
from disttensor.core.array import DistArray
from disttensor.core.distribution import Distribution
from disttensor.core.grid import ProcessGrid
from disttensor.io import DatasetNotFoundError
from disttensor.io.synthetic import generate_synthetic
from disttensor.train.arguments import parse_args
from disttensor.train.builders import build_model
from conftest import assert_all_ranks, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()
FLAGS = {"unet3d": ["--unet-widths", "2,3:3,3:3,4"], "nnunet": ["--nnunet-features", "2,3,4"],
         "cosmoflow": ["--widths", "2,3", "--dense", "5"],
         "resnet3d": ["--resnet-layers", "1,1", "--resnet-widths", "2,3"]}
PATCH = (8, 8, 8)
VOLUME = (2, 13, 10, 9)  # (C, D, H, W): larger than the patch, not a multiple of anything


def _bcast(comm, value):
    return comm.bcast(value if comm.rank == 0 else None, root=0)


def _model(name, sample_shape, outputs, seed=0):
    """The model as ``python -m disttensor.train NAME FLAGS`` builds it, in float64, its
    batch-norm statistics perturbed (so that loading buffers is checked too)."""
    a = parse_args([name, "--data", "unused", "--dtype", "float64", *FLAGS[name]])
    a.classes = a.outputs = outputs
    m = build_model(a, sample_shape, nn.init.manual_seed(seed))
    rng = np.random.default_rng(seed + 1)
    state = {k: np.asarray(v) for k, v in m.state_dict().items()}
    for k, v in state.items():
        if k.endswith("running_mean"):
            state[k] = rng.standard_normal(v.shape) * 0.1
        elif k.endswith("running_var"):
            state[k] = 0.5 + rng.random(v.shape)
        elif k.startswith(("out.", "heads.")):  # the segmentation heads: varied classes
            state[k] = 3 * rng.standard_normal(v.shape) if k.endswith("weight") else 0 * v
        elif v.dtype.kind == "f":
            state[k] = v + 0.5 * rng.standard_normal(v.shape)
    m.load_state_dict(state)
    if name in ("unet3d", "nnunet"):
        m.input_size = None  # the reference takes any (divisible) size too
    return m


def _checkpoint(comm, root, name, sample_shape, outputs, seed=0):
    path = os.path.join(root, f"{name}_{seed}.h5")
    m = _model(name, sample_shape, outputs, seed)
    predict.save_model_checkpoint(path, name, m, sample_shape, "float64",
                                  ProcessGrid((comm.size,), comm=comm))
    return path, m


def _serial(model, x: np.ndarray) -> np.ndarray:
    """``model(x)`` for the (N, C, D, H, W) NumPy batch ``x`` on a one-rank grid."""
    g = ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF)
    xd = DistArray(np.ascontiguousarray(x), Distribution(x.shape, g.dims, (0, None, 1, 2, 3)),
                   g)
    model.eval()
    with no_grad():
        return model(Tensor(xd)).data.to_numpy()


def _grids(segmentation):
    if SIZE == 1:
        return ["1x1x1x1"]
    if segmentation:
        return {2: ["1x2x1x1", "1x1x1x2"], 3: ["1x3x1x1", "1x1x3x1"],
                4: ["1x2x2x1", "1x1x2x2"]}[SIZE]
    return {2: ["2x1x1x1", "1x2x1x1"], 3: ["3x1x1x1", "1x3x1x1"],
            4: ["2x2x1x1", "4x1x1x1"]}[SIZE]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    comm = MPI.COMM_WORLD
    return _bcast(comm, str(tmp_path_factory.mktemp("predict")))


@pytest.fixture(scope="module")
def volume(root):
    comm = MPI.COMM_WORLD
    path = os.path.join(root, "volume.h5")
    vol = np.random.default_rng(7).standard_normal(VOLUME)
    if comm.rank == 0:
        with h5py.File(path, "w") as f:
            f["full"] = vol
            f["single"] = vol[0]
    comm.Barrier()
    return path, vol


def _pad_to(x, shape):
    return np.pad(x, [(0, 0)] * (x.ndim - 3) + [(0, n - m) for n, m in zip(shape,
                                                                             x.shape[-3:])])


# -- NumPy reference of nnU-Net's sliding-window inference ------------------------------------
def _ref_steps(size, tile, step=0.5):
    n = int(np.ceil((size - tile) / (tile * step))) + 1
    if n == 1:
        return [0]
    return [int(np.round((size - tile) / (n - 1) * i)) for i in range(n)]


def _ref_gaussian(tile, scale=1 / 8):
    g = np.zeros(tile)
    idx = np.indices(tile).astype(np.float64)
    for a, t in enumerate(tile):
        g += (idx[a] - t // 2) ** 2 / (2 * (scale * t) ** 2)
    return np.exp(-g)


def _ref_sliding(model, vol, tile):
    shape = tuple(max(n, t) for n, t in zip(vol.shape[1:], tile))
    x = _pad_to(vol, shape)
    gauss = _ref_gaussian(tile)
    acc = wsum = None
    for starts in itertools.product(*[_ref_steps(n, t) for n, t in zip(shape, tile)]):
        sl = tuple(slice(s, s + t) for s, t in zip(starts, tile))
        logits = _serial(model, x[(slice(None),) + sl][None])[0]
        if acc is None:
            acc = np.zeros((logits.shape[0],) + shape)
            wsum = np.zeros(shape)
        acc[(slice(None),) + sl] += logits * gauss
        wsum[sl] += gauss
    crop = tuple(slice(0, n) for n in vol.shape[1:])
    return np.argmax(acc / wsum, axis=0)[crop]


def _ref_whole(model, vol, factor):
    shape = tuple(-(-n // factor) * factor for n in vol.shape[1:])
    logits = _serial(model, _pad_to(vol, shape)[None])[0]
    return np.argmax(logits, axis=0)[tuple(slice(0, n) for n in vol.shape[1:])]


# -- segmentation ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["unet3d", "nnunet"])
@pytest.mark.parametrize("mode", ["whole", "sliding"])
def test_segmentation_equals_serial(comm, root, volume, name, mode):
    path, vol = volume
    ck, model = _checkpoint(comm, root, name, (2,) + PATCH, 3)
    if comm.rank == 0:
        factor = 4  # both networks: two downsamplings
        ref = _ref_whole(model, vol, factor) if mode == "whole" else \
            _ref_sliding(model, vol, PATCH)
    ref = _bcast(comm, ref if comm.rank == 0 else None)
    for grid in _grids(True):
        out = os.path.join(root, f"{name}_{mode}_{grid}.h5")
        res = predict.run([name, "--checkpoint", ck, "--data", path, "--out", out,
                           "--mode", mode, "--grid", grid, "--quiet", *FLAGS[name]], comm=comm)
        got = res.labels.to_numpy()
        stored = _bcast(comm, h5py.File(out, "r")["labels"][...] if comm.rank == 0 else None)
        assert_all_ranks(comm, got.shape == VOLUME[1:] and np.array_equal(got, ref),
                         f"{name} {mode} on {grid}: labels differ from the serial reference "
                         f"in {int(np.sum(got != ref)) if got.shape == ref.shape else 'shape'}")
        assert_all_ranks(comm, np.array_equal(stored, ref) and stored.dtype == np.uint8,
                         f"{name} {mode} on {grid}: the written labels differ")
        assert_all_ranks(comm, len(set(np.unique(ref))) > 1, "a constant reference proves "
                         "little: change the seed")


def test_single_channel_volume_and_zarr(comm, root, volume):
    """A (D, H, W) volume for a one-channel model; ``.zarr`` output where zarr is installed."""
    path, vol = volume
    ck, model = _checkpoint(comm, root, "unet3d", (1,) + PATCH, 2, seed=3)
    ref = _bcast(comm, _ref_whole(model, vol[:1], 4) if comm.rank == 0 else None)
    outs = [os.path.join(root, "single.h5")]
    try:
        import zarr
        outs.append(os.path.join(root, "single.zarr"))
    except ImportError:
        zarr = None
    res = predict.run(["unet3d", "--checkpoint", ck, "--data", path, "--x-dataset", "single",
                       "--out", *outs, "--quiet", *FLAGS["unet3d"]], comm=comm)
    assert_all_ranks(comm, np.array_equal(res.labels.to_numpy(), ref), "single channel")
    if zarr is not None:
        stored = _bcast(comm, zarr.open_group(outs[1], mode="r")["labels"][...]
                        if comm.rank == 0 else None)
        assert_all_ranks(comm, np.array_equal(stored, ref), "the Zarr labels differ")


# -- regression -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def samples(root):
    comm = MPI.COMM_WORLD
    d = os.path.join(root, "samples")
    generate_synthetic(d, 5, size=8, channels=2, seed=4, comm=comm)
    bare = os.path.join(root, "bare.h5")  # a stacked file without targets
    if comm.rank == 0:
        with h5py.File(bare, "w") as f:
            f["full"] = np.random.default_rng(5).standard_normal((3, 2, 8, 8, 8))
    comm.Barrier()
    return d, bare


def _read_sample(path):
    with h5py.File(path, "r") as f:
        return f["full"][...].astype(np.float64), f["unitPar"][...].astype(np.float64)


@pytest.mark.parametrize("name", ["cosmoflow", "resnet3d"])
def test_regression_equals_serial(comm, root, samples, name):
    d, _ = samples
    ck, model = _checkpoint(comm, root, name, (2, 8, 8, 8), 3)
    files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".h5"))
    if comm.rank == 0:
        xs, ys = zip(*(_read_sample(f) for f in files))
        ref = (_serial(model, np.stack(xs)), np.stack(ys))
    ref, targets = _bcast(comm, ref if comm.rank == 0 else None)
    for grid in _grids(False):
        base = os.path.join(root, f"{name}_{grid}")
        # batch 3 of 5 samples: a short last batch, uneven over the sample axis
        res = predict.run([name, "--checkpoint", ck, "--data", d, "--out", base + ".csv",
                           base + ".h5", "--grid", grid, "--batch-size", "3", "--quiet",
                           *FLAGS[name]], comm=comm)
        p = res.predictions
        ok = (p.files == files and np.allclose(p.predictions, ref, rtol=1e-10, atol=1e-12)
              and np.array_equal(p.targets, targets)
              and math.isclose(p.mae, float(np.abs(ref - targets).mean()), rel_tol=1e-9))
        assert_all_ranks(comm, ok, f"{name} on {grid}: predictions differ from the serial "
                         "reference")
        if comm.rank == 0:
            with h5py.File(base + ".h5", "r") as f:
                h5ok = (np.allclose(f["predictions"][...], ref, rtol=1e-10, atol=1e-12)
                        and np.array_equal(f["targets"][...], targets)
                        and [s.decode() for s in f["files"][...]] == files
                        and math.isclose(f.attrs["mae"], p.mae))
            with open(base + ".csv", newline="") as f:
                rows = list(csv.reader(f))
            csvok = (rows[0] == ["file"] + [f"pred_{j}" for j in range(3)] +
                     [f"target_{j}" for j in range(3)] and [r[0] for r in rows[1:]] == files
                     and np.allclose(np.array([r[1:4] for r in rows[1:]], float), ref,
                                     rtol=1e-10, atol=1e-12))
        assert_all_ranks(comm, _bcast(comm, h5ok and csvok if comm.rank == 0 else None),
                         f"{name} on {grid}: the written tables differ")


def test_regression_without_targets(comm, root, samples):
    _, bare = samples
    ck, model = _checkpoint(comm, root, "cosmoflow", (2, 8, 8, 8), 3)
    if comm.rank == 0:
        with h5py.File(bare, "r") as f:
            ref = _serial(model, f["full"][...])
    ref = _bcast(comm, ref if comm.rank == 0 else None)
    out = os.path.join(root, "bare.csv")
    res = predict.run(["cosmoflow", "--checkpoint", ck, "--data", bare, "--out", out,
                       "--quiet", *FLAGS["cosmoflow"]], comm=comm)
    p = res.predictions
    assert_all_ranks(comm, p.targets is None and p.mae is None and
                     np.allclose(p.predictions, ref, rtol=1e-10, atol=1e-12) and
                     p.files == [f"{bare}[{i}]" for i in range(3)], "no targets")


# -- errors, on every rank ------------------------------------------------------------------
def _digest(comm, path):
    return _bcast(comm, open(path, "rb").read() if comm.rank == 0 else None)


def test_errors_on_every_rank(comm, root, volume, samples):
    path, _ = volume
    d, _ = samples
    unet, _ = _checkpoint(comm, root, "unet3d", (2,) + PATCH, 3)
    cosmo, _ = _checkpoint(comm, root, "cosmoflow", (2, 8, 8, 8), 3)
    out = os.path.join(root, "previous.h5")
    predict.run(["unet3d", "--checkpoint", unet, "--data", path, "--out", out, "--quiet",
                 *FLAGS["unet3d"]], comm=comm)
    before = _digest(comm, out)

    def seg(*extra, ck=unet, flags=FLAGS["unet3d"], model="unet3d", data=path, o=out):
        return lambda: predict.run([model, "--checkpoint", ck, "--data", data, "--out", o,
                                    "--quiet", *flags, *extra], comm=comm)

    # a checkpoint of another model: both names in the message
    assert_raises_all(comm, ValueError, r"written by a 'cosmoflow' model.*asked for 'unet3d'",
                      seg(ck=cosmo))
    # the same model in another configuration (widths)
    assert_raises_all(comm, ValueError, r"another configuration.*first difference",
                      seg(flags=["--unet-widths", "2,4:4,4"]))
    assert_raises_all(comm, ValueError, r"another configuration",
                      seg(ck=cosmo, model="cosmoflow", data=d, o=out[:-3] + ".csv",
                          flags=["--widths", "2,4", "--dense", "5"]))
    # a missing dataset name (input; regression targets asked for by name)
    assert_raises_all(comm, DatasetNotFoundError, "nope", seg("--x-dataset", "nope"))
    assert_raises_all(comm, DatasetNotFoundError, "nope",
                      seg("--y-dataset", "nope", ck=cosmo, model="cosmoflow", data=d,
                          o=out[:-3] + ".csv", flags=FLAGS["cosmoflow"]))
    # a model of 4 targets on files of 3
    cosmo4, _ = _checkpoint(comm, root, "cosmoflow", (2, 8, 8, 8), 4, seed=9)
    assert_raises_all(comm, ValueError, "predicts 4 targets",
                      seg(ck=cosmo4, model="cosmoflow", data=d, o=out[:-3] + ".csv",
                          flags=FLAGS["cosmoflow"]))
    # outputs that cannot be written
    assert_raises_all(comm, FileNotFoundError, "does not exist",
                      seg(o=os.path.join(root, "no", "such", "dir.h5")))
    assert_raises_all(comm, ValueError, "unknown extension", seg(o=out[:-3] + ".txt"))
    os.makedirs(os.path.join(root, "adir.h5"), exist_ok=True)
    assert_raises_all(comm, IsADirectoryError, "directory",
                      seg(o=os.path.join(root, "adir.h5")))
    # a volume with the wrong channel count, a bad grid
    assert_raises_all(comm, ValueError, "takes a", seg("--x-dataset", "single"))
    if SIZE > 1:
        assert_raises_all(comm, ValueError, "sample axis", seg("--grid", f"{SIZE}x1x1x1"))
    # none of that touched the earlier output
    assert_all_ranks(comm, _digest(comm, out) == before, "a failed run changed the output")
