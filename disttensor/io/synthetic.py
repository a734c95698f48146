"""Synthetic datasets whose targets can really be learnt: a CosmoFlow-like regression task
(``task='regression'``, the default) and a 3D segmentation task for a U-Net
(``task='segmentation'``).

Regression
----------

Each sample is a Gaussian random field on a periodic ``size^3`` grid with ``channels``
channels, made by FFT filtering one realization of white noise ``w``:

    x_c = amplitude / 3 * irfftn( rfftn(w) * T_c ),
    T_c(k) = |k|^(slope / 2) * exp(-|k|^2 sigma_c^2 / 2) / norm_c,   sigma_c = sigma * c / 2

(``|k|`` in radians per voxel, ``T_c(0) = 0`` so every field has zero mean, ``norm_c`` makes
the expected variance of ``irfftn(rfftn(w) T_c)`` exactly 1).  So the power spectrum is a power
law of spectral index ``slope`` cut off by Gaussian smoothing of scale ``sigma_c``; channel
``c`` is the same field seen at a growing smoothing scale (channel 0 unsmoothed, which shows
the slope best; like CosmoFlow's redshifts, the channels are views of one realization).  The
amplitude sets the standard deviation (``amplitude / 3``, values mostly within [-1, 1]), the
smoothing scale and the slope set the two-point correlation.  Learnability: on 16^3 x 4
samples a linear fit on nine summary statistics (log variance and log finite-difference
variance ratios per channel) already explains more than 90% of the variance of each target on
held-out samples (``tests/unit/test_io_synthetic.py``); ``sigma`` needs ``channels >= 2``.

The targets are the three parameters drawn uniformly in :data:`PARAM_RANGES`, mapped linearly
to ``[-1, 1]``: ``y = 2 (p - lo) / (hi - lo) - 1`` in the order of :data:`PARAM_NAMES`.

Sample ``i`` is a pure function of ``(seed, i, size, channels)``
(``numpy.random.default_rng([seed, i])``), so a dataset does not depend on how many ranks made it.

Segmentation
------------
:func:`synthetic_segmentation_sample` makes an input ``x (C,D,H,W)`` (float) and a per-voxel
label volume ``labels (D,H,W)`` (``uint8``, values in ``[0, classes)``) on a ``size^3`` grid:

* **Objects.**  Class 0 is the background; classes ``k = 1 .. K-1`` (``K = classes``, 2 to 8)
  are solid, axis-aligned ellipsoids whose size tells the class: the volume-equivalent radius
  is ``r_k (1 + u)``, ``u`` uniform in ``[-0.06, 0.06]``, with ``r_k`` spaced geometrically from
  ``size / 12`` (class 1, at least 1 voxel) to ``size / 4.5`` (class ``K-1``, at least 1.5;
  ``K = 2``: their geometric mean) (:func:`segmentation_radii`; neighbouring classes differ
  by a factor >= 1.17, more than the jitter), semi-axes ``r exp(a)`` with ``a`` uniform in
  ``[-0.15, 0.15]`` per axis (renormalized to keep the volume).  Class ``k`` gets about
  ``0.4 / (K-1) size^3 / (4/3 pi r_k^3)`` objects (times a uniform factor in ``[0.7, 1.3]``,
  stochastically rounded), placed largest class first at uniform centres anywhere in the
  volume (objects may be cut by the border); an object whose ellipsoid grown by 1 voxel would
  touch an earlier one is redrawn (up to 30 tries, then dropped), so objects never touch and
  a voxel belongs to one object at most.
  A voxel is labelled ``k`` when its centre lies inside an object of class ``k``.
* **Input.**  Every object gets a contrast ``a_j`` uniform in ``[0.6, 1.4]`` (the same range
  for every class: brightness does not tell the class).  All channels see the same signal
  ``s = G_1 * sum_j a_j 1_j`` (a Gaussian blur of 1 voxel, zero outside the volume) plus noise:
  ``x_c = s + 0.8 n_c`` with ``n_c`` the unit-variance Gaussian random field of the regression
  task (:func:`transfer_functions` with ``slope = -0.5``, ``sigma = 1``, one white-noise
  realization seen at smoothing ``c / 2``: channel 0 is nearly white).
* **Learnability.**  No function of one voxel's value does better than predicting the
  background everywhere (within a percent: the noise is as strong as the signal and the
  brightness says nothing about the class), while the mean over a 3x3x3 neighbourhood
  already beats it by about 9 points of accuracy, and means at two scales (3^3 and 7^3) by
  about 13, finding both classes of objects (``tests/unit/test_io_synthetic.py`` checks
  this on held-out samples): the labels need context, which a small 3D U-Net has.
* **Balance.**  Background about 70-75% of the voxels (per sample between about 60% and 80%
  for ``size >= 16``), the rest shared roughly evenly by the classes (each about
  ``0.28 / (K-1)`` on average; for ``K = 3`` at ``size = 32``: 71% / 14% / 15%).

The labels are a pure function of ``(seed, i, size, classes)``
(``numpy.random.default_rng([seed, i, 1])``: the object draws come first, then the noise), and
do not depend on ``channels`` or ``dtype``; ``x`` is a pure function of
``(seed, i, size, channels, classes)``.

Layouts
-------
Written by :func:`generate_synthetic` (those :class:`~disttensor.io.SampleDataset` reads):
``'files'`` (a directory of ``sample_000000.h5`` ..., each with ``full (C,D,H,W)`` and
``unitPar (3,)``, or for segmentation ``labels (D,H,W) uint8``) or ``'stacked'`` (one file with
``full (N,C,D,H,W)`` and ``unitPar (N,3)``, or ``labels (N,D,H,W) uint8``).  In parallel,
samples are dealt round-robin over the ranks; with ``'files'`` each rank writes its own files,
with ``'stacked'`` each rank writes its samples' hyperslabs of the shared file.  Read a
segmentation dataset with ``SampleDataset(..., y_dataset="labels")``: ``y`` is then an
``(N,D,H,W)`` DistArray split like ``x``'s sample and spatial axes.

``'raw'``: the raw CosmoFlow format (a directory of ``sample_000000.h5`` ..., each with
``full (D,H,W,C)`` int16 particle counts and ``unitPar (4,)``) from a log-normal density field
(:mod:`disttensor.io.synthetic_raw`); read it with ``SampleDataset(..., channels_last=True,
dtype='float32', log1p=True)``.

Command line (serial or under ``mpiexec``)::

    python -m disttensor.io.synthetic --out DIR --samples 64 --size 32 --channels 4 [--seed 0]
        [--layout files|stacked|raw] [--dtype float32] [--driver mpio|independent]
        [--task regression|segmentation] [--classes 3]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

__all__ = ["PARAM_NAMES", "PARAM_RANGES", "TASKS", "LABEL_DTYPE", "MAX_CLASSES",
           "synthetic_sample", "synthetic_params", "synthetic_segmentation_sample",
           "segmentation_radii", "generate_synthetic", "transfer_functions", "main"]

PARAM_NAMES = ("sigma", "amplitude", "slope")
#: Ranges the parameters are drawn from (uniformly): smoothing scale in voxels, standard
#: deviation times 3, spectral index of the power spectrum.
PARAM_RANGES = {"sigma": (1.0, 3.0), "amplitude": (0.5, 1.5), "slope": (-3.0, 0.0)}

TASKS = ("regression", "segmentation")
#: dtype of the segmentation label volumes (in memory and in the files).
LABEL_DTYPE = np.dtype(np.uint8)
#: Largest number of classes (background included) of the segmentation task.
MAX_CLASSES = 8
# The segmentation model (see the module docstring).
_SEG_STREAM = 1               # third seed word of the segmentation generator
_SEG_FILL = 0.4               # nominal object volume fraction (before failed placements)
_SEG_RADII = (1 / 12, 1 / 4.5)  # class 1 and class K-1 radius as fractions of size
_SEG_MIN_RADII = (1.0, 1.5)   # ... and their lower bounds in voxels
_SEG_JITTER = 0.06            # relative radius jitter
_SEG_ANISO = 0.15             # log semi-axis jitter
_SEG_MARGIN = 1.0             # gap between objects, voxels
_SEG_TRIES = 30               # placement tries per object
_SEG_CONTRAST = (0.6, 1.4)
_SEG_BLUR = 1.0               # Gaussian blur of the signal, voxels
_SEG_NOISE = 0.8              # noise standard deviation
_SEG_NOISE_SLOPE = -0.5
_SEG_NOISE_SIGMA = 1.0


def synthetic_params(index: int, seed: int = 0) -> tuple[dict, np.ndarray, np.random.Generator]:
    """Physical parameters of sample ``index``, its normalized targets, and the generator
    (positioned after the parameter draws) that makes its noise."""
    if index < 0 or seed < 0:
        raise ValueError(f"index and seed must be >= 0, got {index}, {seed}")
    rng = np.random.default_rng([int(seed), int(index)])
    u = rng.uniform(size=len(PARAM_NAMES))
    params = {n: PARAM_RANGES[n][0] + ui * (PARAM_RANGES[n][1] - PARAM_RANGES[n][0])
              for n, ui in zip(PARAM_NAMES, u)}
    return params, 2.0 * u - 1.0, rng


def transfer_functions(size: int, channels: int, sigma: float, slope: float) -> np.ndarray:
    """``T_c`` on the ``rfftn`` grid, shape ``(channels, size, size, size // 2 + 1)``,
    normalized so that filtered unit white noise has unit expected variance."""
    k1 = 2 * np.pi * np.fft.fftfreq(size)
    kz = 2 * np.pi * np.fft.rfftfreq(size)
    k2 = k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2
    kk = np.sqrt(k2)
    with np.errstate(divide="ignore"):
        base = np.where(kk > 0, kk, 1.0) ** (slope / 2)
    base[0, 0, 0] = 0.0
    # rfft half-grid weights: kz = 0 and (even size) Nyquist planes count once, others twice
    w = np.full(kz.shape, 2.0)
    w[0] = 1.0
    if size % 2 == 0:
        w[-1] = 1.0
    out = np.empty((channels,) + k2.shape)
    for c in range(channels):
        s = sigma * c / 2
        t = base * np.exp(-0.5 * k2 * s * s)
        mean_sq = float((t * t * w).sum()) / size ** 3
        out[c] = t / math.sqrt(mean_sq) if mean_sq > 0 else t
    return out


def synthetic_sample(index: int, size: int = 32, channels: int = 4, seed: int = 0,
                     dtype="float32") -> tuple[np.ndarray, np.ndarray]:
    """Sample ``index``: ``x`` of shape ``(channels, size, size, size)`` and targets ``y`` of
    shape ``(3,)`` (both ``dtype``); see the module docstring."""
    if size < 2 or channels < 1:
        raise ValueError(f"need size >= 2 and channels >= 1, got {size}, {channels}")
    params, y, rng = synthetic_params(index, seed)
    noise = rng.standard_normal((size, size, size))
    f = np.fft.rfftn(noise)
    tf = transfer_functions(size, channels, params["sigma"], params["slope"])
    x = np.empty((channels, size, size, size), dtype=dtype)
    for c in range(channels):
        x[c] = params["amplitude"] / 3.0 * np.fft.irfftn(f * tf[c], s=(size,) * 3, axes=(0, 1, 2))
    return x, y.astype(dtype)


def segmentation_radii(size: int, classes: int) -> np.ndarray:
    """Nominal volume-equivalent radius (voxels) of the objects of classes ``1 .. classes-1``:
    geometric from ``max(1, size / 12)`` to ``max(1.5, size / 4.5)`` (one class: their
    geometric mean)."""
    lo = max(_SEG_MIN_RADII[0], size * _SEG_RADII[0])
    hi = max(_SEG_MIN_RADII[1], size * _SEG_RADII[1])
    m = classes - 1
    if m == 1:
        return np.array([math.sqrt(lo * hi)])
    return lo * (hi / lo) ** (np.arange(m) / (m - 1))


def _gaussian_blur(v: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of a 3-d array, zero outside (no wrap-around)."""
    h = int(math.ceil(4 * sigma))
    t = np.arange(-h, h + 1)
    k = np.exp(-0.5 * (t / sigma) ** 2)
    k /= k.sum()
    for a in range(3):
        v = np.moveaxis(v, a, -1)
        p = np.pad(v, [(0, 0), (0, 0), (h, h)])
        n = v.shape[-1]
        out = k[0] * p[..., 0:n]
        for j in range(1, 2 * h + 1):
            out += k[j] * p[..., j:j + n]
        v = np.moveaxis(out, -1, a)
    return np.ascontiguousarray(v)


def _check_segmentation_args(size, channels, classes):
    if size < 2 or channels < 1:
        raise ValueError(f"need size >= 2 and channels >= 1, got {size}, {channels}")
    if not isinstance(classes, (int, np.integer)) or not 2 <= classes <= MAX_CLASSES:
        raise ValueError(f"classes must be an int in [2, {MAX_CLASSES}] (background "
                         f"included), got {classes!r}")


def _segmentation_objects(rng: np.random.Generator, size: int, classes: int):
    """Labels ``(size,)*3`` and the unblurred signal (object contrasts) of one sample."""
    labels = np.zeros((size,) * 3, dtype=LABEL_DTYPE)
    signal = np.zeros((size,) * 3)
    radii = segmentation_radii(size, classes)
    for k in range(classes - 1, 0, -1):  # largest objects first
        r0 = float(radii[k - 1])
        mean = _SEG_FILL / (classes - 1) * size ** 3 / (4 / 3 * math.pi * r0 ** 3)
        count = int(math.floor(mean * rng.uniform(0.7, 1.3) + rng.uniform()))
        for _ in range(count):
            r = r0 * rng.uniform(1 - _SEG_JITTER, 1 + _SEG_JITTER)
            a = np.exp(rng.uniform(-_SEG_ANISO, _SEG_ANISO, 3))
            ax = r * a / np.cbrt(a.prod())
            grown = ax + _SEG_MARGIN
            contrast = rng.uniform(*_SEG_CONTRAST)
            for _try in range(_SEG_TRIES):
                c = rng.uniform(-0.5, size - 0.5, 3)
                lo = np.maximum(np.floor(c - grown).astype(int), 0)
                hi = np.minimum(np.ceil(c + grown).astype(int) + 1, size)
                if np.any(hi <= lo):
                    continue
                box = tuple(slice(int(a0), int(b0)) for a0, b0 in zip(lo, hi))
                dz = (np.arange(box[0].start, box[0].stop) - c[0])[:, None, None]
                dy = (np.arange(box[1].start, box[1].stop) - c[1])[None, :, None]
                dx = (np.arange(box[2].start, box[2].stop) - c[2])[None, None, :]
                near = (dz / grown[0]) ** 2 + (dy / grown[1]) ** 2 + (dx / grown[2]) ** 2 <= 1
                if labels[box][near].any():
                    continue
                inside = (dz / ax[0]) ** 2 + (dy / ax[1]) ** 2 + (dx / ax[2]) ** 2 <= 1
                labels[box][inside] = k
                signal[box][inside] = contrast
                break
    return labels, signal


def synthetic_segmentation_sample(index: int, size: int = 32, channels: int = 1,
                                  classes: int = 3, seed: int = 0,
                                  dtype="float32") -> tuple[np.ndarray, np.ndarray]:
    """Segmentation sample ``index``: input ``x`` of shape ``(channels, size, size, size)``
    (``dtype``) and labels of shape ``(size, size, size)`` (``uint8``, values in
    ``[0, classes)``, 0 the background); see the module docstring."""
    if index < 0 or seed < 0:
        raise ValueError(f"index and seed must be >= 0, got {index}, {seed}")
    _check_segmentation_args(size, channels, classes)
    rng = np.random.default_rng([int(seed), int(index), _SEG_STREAM])
    labels, signal = _segmentation_objects(rng, size, classes)
    s = _gaussian_blur(signal, _SEG_BLUR)
    f = np.fft.rfftn(rng.standard_normal((size, size, size)))
    tf = transfer_functions(size, channels, _SEG_NOISE_SIGMA, _SEG_NOISE_SLOPE)
    x = np.empty((channels, size, size, size), dtype=dtype)
    for c in range(channels):
        x[c] = s + _SEG_NOISE * np.fft.irfftn(f * tf[c], s=(size,) * 3, axes=(0, 1, 2))
    return x, labels


def _file_attrs(size, channels, seed, samples, task="regression", classes=None):
    if task == "segmentation":
        return {"generator": "disttensor.io.synthetic", "task": task, "seed": seed,
                "size": size, "channels": channels, "samples": samples, "classes": classes,
                "class_radii": segmentation_radii(size, classes)}
    return {"generator": "disttensor.io.synthetic", "task": task, "seed": seed, "size": size,
            "channels": channels, "samples": samples,
            "param_names": ",".join(PARAM_NAMES),
            "param_ranges": np.asarray([PARAM_RANGES[n] for n in PARAM_NAMES])}


def generate_synthetic(out, samples: int, size: int = 32, channels: int = 4, seed: int = 0, *,
                       layout: str = "files", dtype="float32", comm=None,
                       driver: str | None = None, x_dataset: str = "full",
                       y_dataset: str | None = None, task: str = "regression",
                       classes: int = 3):
    """Write a synthetic dataset (collective over ``comm``, default ``COMM_WORLD``).

    ``task='regression'`` (default): inputs ``x_dataset`` (``"full"``) and target vectors
    ``y_dataset`` (default ``"unitPar"``) from :func:`synthetic_sample`.
    ``task='segmentation'``: inputs and ``uint8`` label volumes ``y_dataset`` (default
    ``"labels"``; ``(D,H,W)`` per file, ``(N,D,H,W)`` stacked) from
    :func:`synthetic_segmentation_sample` with ``classes`` classes (2 to 8, background
    included).

    ``layout='raw'``: the raw CosmoFlow format (:mod:`disttensor.io.synthetic_raw`: int16
    ``D,H,W,C`` counts, 4 targets; regression only, ``dtype`` ignored), one file per sample as
    ``'files'``.

    ``layout='files'``: ``out`` is a directory (created if missing) that receives
    ``sample_%06d.h5`` per sample; returns the sorted list of paths.  ``layout='stacked'``:
    ``out`` is the file to write; returns its path.  Samples are dealt round-robin over the
    ranks; every file is written atomically (temporary name, then rename; the writer of a file
    first removes the stale temporary files an interrupted run left for it, see
    :mod:`disttensor.io`).  The result is the same for any number of ranks.

    Collective: the arguments are agreed across the ranks before anything is written (one that
    differs raises :class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank)."""
    from mpi4py import MPI

    from ..core.comm import collective
    from ._args import arg_dtype, arg_path
    from ._atomic import atomic_update, replace_atomically
    from ._h5file import open_file, resolve_driver, root_call
    from ._sessions import DatasetSpec
    from ._space import check_space
    from ._temps import remove_quietly, remove_stale_temps, temp_path_for
    from .layout import check_dataset_name

    comm = MPI.COMM_WORLD if comm is None else comm
    with collective(comm, "generate_synthetic", out=arg_path(out), samples=samples,
                    size=size, channels=channels, seed=seed, layout=layout,
                    dtype=arg_dtype(dtype), driver=driver, x_dataset=x_dataset,
                    y_dataset=y_dataset, task=task,
                    classes=classes if task == "segmentation" else None):
        for name, v in (("samples", samples), ("size", size), ("channels", channels),
                        ("seed", seed)):
            least = 0 if name in ("samples", "seed") else 1
            if not isinstance(v, (int, np.integer)) or v < least:
                raise ValueError(f"{name} must be a {'non-negative' if least == 0 else 'positive'}"
                                 f" int, got {v!r}")
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if layout not in ("files", "stacked", "raw"):
            raise ValueError(f"layout must be 'files', 'stacked' or 'raw', got {layout!r}")
        raw = layout == "raw"  # int16 D,H,W,C counts, 4 targets (disttensor.io.synthetic_raw)
        if raw and task != "regression":
            raise ValueError("layout 'raw' is the CosmoFlow regression format (task "
                             f"'regression'), got task {task!r}")
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        seg = task == "segmentation"
        if seg:
            _check_segmentation_args(size, channels, classes)
            classes = int(classes)
        else:
            classes = None
        dtype = np.dtype(dtype)
        if dtype.kind != "f" and not raw:
            raise TypeError(f"dtype must be a floating type, got {dtype}")
        if y_dataset is None:
            y_dataset = "labels" if seg else "unitPar"
        xname, yname = check_dataset_name(x_dataset), check_dataset_name(y_dataset)
        if xname == yname:
            raise ValueError(f"x_dataset and y_dataset must differ, both are {xname!r}")
        driver = resolve_driver(driver)
        out = os.path.abspath(os.fspath(out))
    attrs = _file_attrs(size, channels, seed, samples, task, classes)
    if raw:
        from .synthetic_raw import RAW_PARAM_NAMES, RAW_PARAM_RANGES
        attrs.update(layout="raw", axes="D,H,W,C", param_names=",".join(RAW_PARAM_NAMES),
                     param_ranges=np.asarray([RAW_PARAM_RANGES[n] for n in RAW_PARAM_NAMES]))
    mine = range(comm.rank, samples, comm.size)

    def make(i):
        if raw:
            from .synthetic_raw import synthetic_raw_sample
            return synthetic_raw_sample(i, size, channels, seed)
        if seg:
            return synthetic_segmentation_sample(i, size, channels, classes, seed, dtype)
        return synthetic_sample(i, size, channels, seed, dtype)

    if layout in ("files", "raw"):
        def mkdir():
            os.makedirs(out, exist_ok=True)
        root_call(comm, mkdir)
        paths = [os.path.join(out, f"sample_{i:06d}.h5") for i in range(samples)]
        with collective(comm):
            # each rank writes its own files: it removes the stale temporary files of those
            # (left by a killed run), one scan of the directory
            remove_stale_temps(out, {os.path.basename(paths[i]) for i in mine})
            for i in mine:
                x, y = make(i)
                tmp = temp_path_for(paths[i])
                try:
                    check_space(tmp, x.nbytes + y.nbytes)
                    with open_file(tmp, "w") as f:
                        f.attrs.update(attrs)
                        f.attrs["index"] = i
                        f.create_dataset(xname, data=x)
                        f.create_dataset(yname, data=y)
                    replace_atomically(tmp, paths[i])
                except BaseException:
                    remove_quietly(tmp)
                    raise
        return paths

    if seg:
        yspec = DatasetSpec(yname, (samples, size, size, size), LABEL_DTYPE,
                            attrs={"axes": "N,D,H,W", "classes": classes})
        ny = samples * size ** 3 * LABEL_DTYPE.itemsize
    else:
        yspec = DatasetSpec(yname, (samples, len(PARAM_NAMES)), dtype,
                            attrs={"names": ",".join(PARAM_NAMES)})
        ny = 0
    nx = samples * channels * size ** 3 * dtype.itemsize + ny
    ystart = (0, 0, 0) if seg else (0,)

    def body(sess):
        sess.create([DatasetSpec(xname, (samples, channels, size, size, size), dtype,
                                 attrs={"axes": "N,C,D,H,W"}), yspec])
        sess.metadata(lambda f: f.attrs.update(attrs))
        for r in range(-(-samples // comm.size)):
            i = r * comm.size + comm.rank
            with collective(comm):
                x = y = None
                if i < samples:
                    x, y = make(i)
            sess.write([(xname, (i, 0, 0, 0, 0), None if x is None else x[None]),
                        (yname, (i,) + ystart, None if y is None else y[None])])

    atomic_update(comm, out, driver, "w", True, nx, body, agreed=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m disttensor.io.synthetic",
                                description="Write a learnable synthetic dataset: 'regression' "
                                            "(CosmoFlow-like Gaussian random fields; targets: "
                                            "smoothing scale, amplitude, spectral slope in "
                                            "[-1, 1]) or 'segmentation' (noisy blurred "
                                            "ellipsoids whose size gives the class; uint8 "
                                            "label volumes 'labels').  Run under mpiexec to "
                                            "generate in parallel.")
    p.add_argument("--out", required=True, help="directory (layout 'files') or file ('stacked')")
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--size", type=int, default=32, help="grid points per side (default 32)")
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=("files", "stacked", "raw"), default="files",
                   help="'raw': the raw CosmoFlow format, one file per sample with int16 "
                        "D,H,W,C particle counts 'full' and 4 targets 'unitPar' "
                        "(disttensor.io.synthetic_raw; --dtype is ignored)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--driver", choices=("mpio", "independent"), default=None)
    p.add_argument("--task", choices=TASKS, default="regression")
    p.add_argument("--classes", type=int, default=3,
                   help=f"segmentation classes, background included (2 to {MAX_CLASSES}, "
                        "default 3)")
    p.add_argument("--format", choices=("hdf5", "zarr", "npy", "tfrecord"), default="hdf5",
                   help="hdf5 (default; --layout applies), zarr (a group, one sample per "
                        "chunk), npy (a directory of *_data.npy/*_label.npy pairs, D,H,W,C) or "
                        "tfrecord (gzipped MLPerf-layout records, D,H,W,C); --dtype int16 "
                        "stores count-like integers (see disttensor.io.synthetic_formats)")
    p.add_argument("--records-per-file", type=int, default=1, help="--format tfrecord only")
    a = p.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    t0 = MPI.Wtime()
    if a.format != "hdf5":
        from .synthetic_formats import generate_synthetic_format
        res = generate_synthetic_format(a.out, a.samples, a.size, a.channels, a.seed,
                                        format=a.format, dtype=a.dtype, comm=comm,
                                        task=a.task, classes=a.classes,
                                        records_per_file=a.records_per_file)
        comm.Barrier()
        if comm.rank == 0:
            print(f"wrote {a.samples} samples of {a.channels}x{a.size}^3 {a.dtype} "
                  f"({a.format}, {a.task}) to {res} in {MPI.Wtime() - t0:.2f} s on "
                  f"{comm.size} rank(s)")
        return 0
    res = generate_synthetic(a.out, a.samples, a.size, a.channels, a.seed, layout=a.layout,
                             dtype=a.dtype, comm=comm, driver=a.driver, task=a.task,
                             classes=a.classes)
    comm.Barrier()
    if comm.rank == 0:
        where = res if isinstance(res, str) else a.out
        what = f"{a.task}, {a.classes} classes" if a.task == "segmentation" else a.task
        what += ", int16 D,H,W,C counts" if a.layout == "raw" else ""
        print(f"wrote {a.samples} samples of {a.channels}x{a.size}^3 "
              f"{'int16' if a.layout == 'raw' else a.dtype} ({a.layout}, "
              f"{what}) to {where} in {MPI.Wtime() - t0:.2f} s on {comm.size} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
