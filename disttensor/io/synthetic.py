"""A synthetic CosmoFlow-like dataset whose targets can really be learnt.

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

Layouts written by :func:`generate_synthetic` (those :class:`~disttensor.io.SampleDataset`
reads): ``'files'`` (a directory of ``sample_000000.h5`` ..., each with ``full (C,D,H,W)`` and
``unitPar (3,)``) or ``'stacked'`` (one file with ``full (N,C,D,H,W)`` and ``unitPar (N,3)``).
In parallel, samples are dealt round-robin over the ranks; with ``'files'`` each rank writes its
own files, with ``'stacked'`` each rank writes its samples' hyperslabs of the shared file.

Command line (serial or under ``mpiexec``)::

    python -m disttensor.io.synthetic --out DIR --samples 64 --size 32 --channels 4 [--seed 0]
        [--layout files|stacked] [--dtype float32] [--driver mpio|independent]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

__all__ = ["PARAM_NAMES", "PARAM_RANGES", "synthetic_sample", "synthetic_params",
           "generate_synthetic", "transfer_functions", "main"]

PARAM_NAMES = ("sigma", "amplitude", "slope")
#: Ranges the parameters are drawn from (uniformly): smoothing scale in voxels, standard
#: deviation times 3, spectral index of the power spectrum.
PARAM_RANGES = {"sigma": (1.0, 3.0), "amplitude": (0.5, 1.5), "slope": (-3.0, 0.0)}


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


def _file_attrs(size, channels, seed, samples):
    return {"generator": "disttensor.io.synthetic", "seed": seed, "size": size,
            "channels": channels, "samples": samples,
            "param_names": ",".join(PARAM_NAMES),
            "param_ranges": np.asarray([PARAM_RANGES[n] for n in PARAM_NAMES])}


def generate_synthetic(out, samples: int, size: int = 32, channels: int = 4, seed: int = 0, *,
                       layout: str = "files", dtype="float32", comm=None,
                       driver: str | None = None, x_dataset: str = "full",
                       y_dataset: str = "unitPar"):
    """Write a synthetic dataset (collective over ``comm``, default ``COMM_WORLD``).

    ``layout='files'``: ``out`` is a directory (created if missing) that receives
    ``sample_%06d.h5`` per sample; returns the sorted list of paths.  ``layout='stacked'``:
    ``out`` is the file to write; returns its path.  Samples are dealt round-robin over the
    ranks; every file is written atomically (temporary name, then rename).  The result is the
    same for any number of ranks."""
    from mpi4py import MPI

    from ..comm import check_same, collective
    from . import _h5
    from .layout import check_dataset_name

    comm = MPI.COMM_WORLD if comm is None else comm
    with collective(comm):
        for name, v in (("samples", samples), ("size", size), ("channels", channels),
                        ("seed", seed)):
            if not isinstance(v, (int, np.integer)) or v < (0 if name in ("samples", "seed") else 1):
                raise ValueError(f"{name} must be a {'non-negative' if name in ('samples', 'seed') else 'positive'} int, got {v!r}")
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if layout not in ("files", "stacked"):
            raise ValueError(f"layout must be 'files' or 'stacked', got {layout!r}")
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise TypeError(f"dtype must be a floating type, got {dtype}")
        xname, yname = check_dataset_name(x_dataset), check_dataset_name(y_dataset)
        driver = _h5.resolve_driver(driver)
        out = os.path.abspath(os.fspath(out))
    check_same(comm, (out, samples, size, channels, seed, layout, dtype.str, driver),
               "generate_synthetic arguments")
    attrs = _file_attrs(size, channels, seed, samples)
    mine = range(comm.rank, samples, comm.size)

    if layout == "files":
        def mkdir():
            os.makedirs(out, exist_ok=True)
        _h5.root_call(comm, mkdir)
        paths = [os.path.join(out, f"sample_{i:06d}.h5") for i in range(samples)]
        with collective(comm):
            for i in mine:
                x, y = synthetic_sample(i, size, channels, seed, dtype)
                tmp = _h5.temp_path_for(paths[i])
                try:
                    _h5.check_space(tmp, x.nbytes + y.nbytes)
                    with _h5.open_file(tmp, "w") as f:
                        f.attrs.update(attrs)
                        f.attrs["index"] = i
                        f.create_dataset(xname, data=x)
                        f.create_dataset(yname, data=y)
                    _h5.replace_atomically(tmp, paths[i])
                except BaseException:
                    _h5.remove_quietly(tmp)
                    raise
        return paths

    nx = samples * channels * size ** 3 * dtype.itemsize

    def body(sess):
        sess.create([_h5.DatasetSpec(xname, (samples, channels, size, size, size), dtype,
                                     attrs={"axes": "N,C,D,H,W"}),
                     _h5.DatasetSpec(yname, (samples, len(PARAM_NAMES)), dtype,
                                     attrs={"names": ",".join(PARAM_NAMES)})])
        sess.metadata(lambda f: f.attrs.update(attrs))
        for r in range(-(-samples // comm.size)):
            i = r * comm.size + comm.rank
            with collective(comm):
                x = y = None
                if i < samples:
                    x, y = synthetic_sample(i, size, channels, seed, dtype)
            sess.write([(xname, (i, 0, 0, 0, 0), None if x is None else x[None]),
                        (yname, (i, 0), None if y is None else y[None])])

    _h5.atomic_update(comm, out, driver, "w", True, nx, body)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m disttensor.io.synthetic",
                                description="Write a learnable synthetic CosmoFlow-like dataset "
                                            "(Gaussian random fields; targets: smoothing scale, "
                                            "amplitude, spectral slope in [-1, 1]).  Run under "
                                            "mpiexec to generate in parallel.")
    p.add_argument("--out", required=True, help="directory (layout 'files') or file ('stacked')")
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--size", type=int, default=32, help="grid points per side (default 32)")
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=("files", "stacked"), default="files")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--driver", choices=("mpio", "independent"), default=None)
    a = p.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    t0 = MPI.Wtime()
    res = generate_synthetic(a.out, a.samples, a.size, a.channels, a.seed, layout=a.layout,
                             dtype=a.dtype, comm=comm, driver=a.driver)
    comm.Barrier()
    if comm.rank == 0:
        where = res if isinstance(res, str) else a.out
        print(f"wrote {a.samples} samples of {a.channels}x{a.size}^3 {a.dtype} ({a.layout}) to "
              f"{where} in {MPI.Wtime() - t0:.2f} s on {comm.size} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
