"""Samples stored in a Zarr v3 group (``zarr`` 3.x, the ``disttensor[zarr]`` extra), read as
hyperslabs: each rank reads only the chunks that meet its block.

Layout
------
A group (a ``.zarr`` directory) with a stacked sample array ``N,C,D,H,W`` (``N,D,H,W,C`` with
``channels_last=True``) and a target array ``N,k`` (vectors) or ``N,D,H,W`` (label volumes),
named like the HDF5 datasets (``x_dataset``/``y_dataset``, defaults ``full``/``unitPar``); when
the group has no array of the default names it may use ``x``/``y``.  The generator
(``python -m disttensor.io.synthetic --format zarr``) chunks the sample array one sample per
chunk along ``N`` (``1,C,D,H,W``, zstd), so a batch never decompresses another sample's data;
any chunking reads correctly.

Reading is independent (no MPI-IO: ``driver``/``collective_io`` are ignored); failures are
made collective over the ranks that read the same sample.

:func:`write_zarr_samples` writes such a group from NumPy arrays (serial).
"""
from __future__ import annotations

import os

import numpy as np

from ..core.comm import collective
from .errors import DatasetNotFoundError
from .sources import OPENERS, SampleSource, SourceReader
from .zarrio import _codecs, _zarr

__all__ = ["ZarrSamplesSource", "write_zarr_samples"]

_DEFAULT_NAMES = ("full", "unitPar")


def _member(group, name):
    try:
        return group[name]
    except KeyError:
        return None


class ZarrSamplesSource(SampleSource):
    """A Zarr group of stacked samples and targets (see the module docstring)."""

    format = "zarr"

    def __init__(self, store, x_dataset: str = "full", y_dataset: str = "unitPar",
                 channels_last: bool = False):
        zarr = _zarr()
        self.store = os.path.abspath(os.fspath(store))
        if not os.path.isdir(self.store):
            raise FileNotFoundError(f"no Zarr store {self.store!r}")
        g = zarr.open_group(self.store, mode="r")
        if (x_dataset, y_dataset) == _DEFAULT_NAMES and _member(g, x_dataset) is None \
                and _member(g, "x") is not None:
            x_dataset, y_dataset = "x", "y"
        xa, ya = _member(g, x_dataset), _member(g, y_dataset)
        for nm, a in ((x_dataset, xa), (y_dataset, ya)):
            if not isinstance(a, zarr.Array):
                raise DatasetNotFoundError(f"Zarr store {self.store!r} has no array {nm!r} "
                               f"(arrays: {sorted(g.array_keys())})")
        self.x_dataset, self.y_dataset = x_dataset, y_dataset
        self.files = [self.store]
        self.stacked = True
        self.channels_last = bool(channels_last)
        self.stored_axes = "DHWC" if channels_last else "CDHW"
        xs, ys = tuple(xa.shape), tuple(ya.shape)
        if len(xs) != 5:
            raise ValueError(f"array {x_dataset!r} of {self.store!r} has shape {xs}: expected "
                             f"stacked samples {'N,D,H,W,C' if channels_last else 'N,C,D,H,W'}")
        n = xs[0]
        self.num_samples, self.stored_shape = n, xs[1:]
        self.dtype, self.target_dtype = np.dtype(xa.dtype), np.dtype(ya.dtype)
        if len(ys) == 0 or ys[0] != n or len(ys) not in (1, 2, 4):
            raise ValueError(f"targets {y_dataset!r} of {self.store!r} have shape {ys}, "
                             f"expected ({n}, k) vectors or ({n}, D, H, W) label volumes")
        if len(ys) == 4:
            self.target_kind, self.target_shape = "volume", ys[1:]
        else:
            self.target_kind, self.target_shape = "vector", (ys[1] if len(ys) == 2 else 1,)
        self.y_shape = ys
        self.check()

    def __repr__(self) -> str:
        return (f"ZarrSamplesSource({self.store!r}, {self.x_dataset!r}, {self.y_dataset!r}, "
                f"channels_last={self.channels_last})")

    def open(self, comm, driver=None, collective_io=True) -> SourceReader:
        return _ZarrReader(self, comm)


class _ZarrReader(SourceReader):
    def __init__(self, src: ZarrSamplesSource, comm):
        self.src, self.comm = src, comm
        self.arrays = None

    def _open(self):
        s = self.src
        zarr = _zarr()
        g = zarr.open_group(s.store, mode="r")
        xa, ya = g[s.x_dataset], g[s.y_dataset]
        if (tuple(xa.shape), tuple(ya.shape)) != ((s.num_samples,) + s.stored_shape,
                                                  s.y_shape):
            raise ValueError(f"Zarr store {s.store!r} changed: shapes {xa.shape} / {ya.shape}")
        return xa, ya

    def read(self, sample, start, xout, ystart, yout):
        s = self.src
        with collective(self.comm):
            if self.arrays is None:
                self.arrays = self._open()
            xa, ya = self.arrays
            i = int(sample)
            if xout.size:
                key = (i,) + tuple(slice(a, a + n) for a, n in zip(start, xout.shape))
                xout[...] = xa[key]
            if s.target_kind == "volume":
                if yout.size:
                    yout[...] = ya[(i,) + tuple(slice(a, a + n)
                                                for a, n in zip(ystart, yout.shape))]
            else:
                yout[...] = np.asarray(ya[i]).reshape(yout.shape)


def write_zarr_samples(store, x: np.ndarray, y: np.ndarray, *, x_dataset: str = "full",
                       y_dataset: str = "unitPar", compressors="zstd", attrs=None) -> str:
    """Write stacked samples ``x`` (``N,C,D,H,W`` or ``N,D,H,W,C``) and targets ``y`` as the
    Zarr group ``store`` (replaced; serial), one sample per chunk.  Returns the path."""
    zarr = _zarr()
    store = os.path.abspath(os.fspath(store))
    g = zarr.open_group(store, mode="w", attributes=dict(attrs or {}))
    codecs = _codecs(zarr, compressors)
    for name, a in ((x_dataset, x), (y_dataset, y)):
        a = np.asarray(a)
        chunks = (1,) + tuple(max(n, 1) for n in a.shape[1:]) if a.ndim else ()
        arr = g.create_array(name, shape=a.shape, chunks=chunks, dtype=a.dtype,
                             compressors=codecs, fill_value=0)
        arr[...] = a
    return store


def open_zarr_samples(source, *, x_dataset="full", y_dataset="unitPar", channels_last=False,
                      **_) -> SampleSource | None:
    """Opener: a directory that is a Zarr group (has ``zarr.json``)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    p = os.fspath(source)
    if not (os.path.isdir(p) and os.path.isfile(os.path.join(p, "zarr.json"))):
        return None
    return ZarrSamplesSource(p, x_dataset, y_dataset, channels_last)


OPENERS.insert(-1, open_zarr_samples)
