"""Samples stored as directories of ``.npy`` sample/label pairs (the form NVIDIA's MLPerf HPC
CosmoFlow submissions convert the TFRecords to), read as hyperslabs.

Layout
------
A directory holding, per sample, ``{stem}{data_suffix}`` and ``{stem}{label_suffix}``
(defaults ``_data.npy`` and ``_label.npy``, a naming chosen here: ``univ_0001_data.npy`` +
``univ_0001_label.npy``),
paired by ``stem`` and sorted by it; dot-files are skipped and a data file without its label
file (or the reverse) is an error.  The data file is one sample, ``D,H,W,C`` (the MLPerf
layout, ``channels_last=True``) or ``C,D,H,W`` (``channels_last=False``), any fixed-size dtype
(MLPerf: ``int16`` counts); the label file is a target vector ``(k,)`` (a scalar counts as
``k = 1``; MLPerf: 4 ``float32``) or a ``D,H,W`` label volume.  Every pair must have the first
pair's shapes and dtypes (checked when it is read, ``ValueError``/``TypeError`` on every rank).

Reading
-------
Each rank reads only its block: the header is parsed by :mod:`disttensor.routines.npyio`'s
reader, and the block's bytes are read with positional reads (``os.pread``) of the contiguous
runs that :func:`disttensor.routines.npyio.runs` computes for the block (one read per run;
files in Fortran order or non-native byte order are read through a read-only memory map of
the block instead).  No MPI-IO: ``driver``/``collective_io`` are ignored; failures are made
collective over the ranks that read the same sample.

:func:`write_npy_pair` writes one pair (serial, atomically: temporary names, then rename).
"""
from __future__ import annotations

import os

import numpy as np

from ..core.comm import collective
from ..core.distribution import Box
from ..routines.npyio import _read_header, runs
from ._atomic import replace_atomically
from ._temps import remove_quietly, temp_path_for
from .sources import OPENERS, SampleSource, SourceReader

__all__ = ["NpyPairsSource", "list_npy_pairs", "read_npy_block", "write_npy_pair",
           "DATA_SUFFIX", "LABEL_SUFFIX"]

DATA_SUFFIX = "_data.npy"
LABEL_SUFFIX = "_label.npy"


def list_npy_pairs(directory, data_suffix: str = DATA_SUFFIX,
                   label_suffix: str = LABEL_SUFFIX) -> list[tuple[str, str]]:
    """The ``(data, label)`` path pairs of ``directory``, sorted by stem (serial).
    ``FileNotFoundError`` when there is none, ``ValueError`` for an unpaired file."""
    d = os.fspath(directory)
    names = [f for f in os.listdir(d) if not f.startswith(".")]
    data = {f[:-len(data_suffix)] for f in names if f.endswith(data_suffix)}
    label = {f[:-len(label_suffix)] for f in names if f.endswith(label_suffix)}
    if not data and not label:
        raise FileNotFoundError(f"no '*{data_suffix}' / '*{label_suffix}' pairs in {d!r}")
    lonely = sorted(data ^ label)
    if lonely:
        raise ValueError(f"{d!r}: sample(s) {lonely[:5]} lack their "
                         f"'{data_suffix}' or '{label_suffix}' file")
    return [(os.path.join(d, s + data_suffix), os.path.join(d, s + label_suffix))
            for s in sorted(data)]


def _header(path):
    """``(shape, fortran_order, dtype, data offset)`` of a ``.npy`` file (npyio's reader)."""
    shape, fortran, descr, offset = _read_header(path)
    return tuple(shape), fortran, np.dtype(descr), offset


def read_npy_block(path, header, start, out: np.ndarray) -> None:
    """Read the box of the ``.npy`` file ``path`` that starts at ``start`` and has
    ``out.shape`` into ``out`` (C-contiguous, the file's dtype in native byte order);
    ``header`` is :func:`_header`'s result for the file.  Serial."""
    shape, fortran, dtype, offset = header
    if out.size == 0:
        return
    box = Box(tuple(int(s) for s in start), tuple(int(s) + n for s, n in zip(start, out.shape)))
    if fortran or not dtype.isnative or not shape:
        m = np.load(path, mmap_mode="r", allow_pickle=False)
        out[...] = m[box.slices()] if shape else m
        del m
        return
    item = dtype.itemsize
    flat = out.reshape(-1).view(np.uint8)
    done = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for first, count in runs(shape, box):
            want = count * item
            pos = offset + first * item
            view = memoryview(flat[done:done + want])
            while len(view):
                n = os.preadv(fd, [view], pos)
                if n <= 0:
                    raise OSError(f"{path}: unexpected end of file")
                view, pos = view[n:], pos + n
            done += want
    finally:
        os.close(fd)


def write_npy_pair(directory, stem: str, x: np.ndarray, y: np.ndarray,
                   data_suffix: str = DATA_SUFFIX, label_suffix: str = LABEL_SUFFIX):
    """Write ``{stem}_data.npy`` (``x``) and ``{stem}_label.npy`` (``y``) in ``directory``
    (serial; each file atomically).  Returns the two paths."""
    paths = (os.path.join(directory, stem + data_suffix),
             os.path.join(directory, stem + label_suffix))
    for p, a in zip(paths, (x, y)):
        tmp = temp_path_for(p)
        try:
            with open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(a), allow_pickle=False)
            replace_atomically(tmp, p)
        except BaseException:
            remove_quietly(tmp)
            raise
    return paths


class NpyPairsSource(SampleSource):
    """A directory of ``.npy`` sample/label pairs (see the module docstring)."""

    format = "npy-pairs"

    def __init__(self, directory, channels_last: bool = True, data_suffix: str = DATA_SUFFIX,
                 label_suffix: str = LABEL_SUFFIX):
        self.directory = os.path.abspath(os.fspath(directory))
        self.pairs = list_npy_pairs(self.directory, data_suffix, label_suffix)
        self.files = [p for pair in self.pairs for p in pair]
        self.channels_last = bool(channels_last)
        self.stored_axes = "DHWC" if channels_last else "CDHW"
        self.stacked = False
        self.num_samples = len(self.pairs)
        xs, _, xdt, _ = _header(self.pairs[0][0])
        ys, _, ydt, _ = _header(self.pairs[0][1])
        if len(xs) != 4:
            raise ValueError(f"{self.pairs[0][0]!r} has shape {xs}: a sample must be 4-d "
                             f"({'D,H,W,C' if channels_last else 'C,D,H,W'})")
        self.stored_shape, self.dtype = xs, xdt.newbyteorder("=")
        self.y_shape = ys
        self.target_dtype = ydt.newbyteorder("=")
        if len(ys) <= 1:
            self.target_kind, self.target_shape = "vector", (ys[0] if ys else 1,)
        elif len(ys) == 3:
            self.target_kind, self.target_shape = "volume", ys
        else:
            raise ValueError(f"{self.pairs[0][1]!r} has shape {ys}: expected a target vector "
                             "(k,) or a D,H,W label volume")
        self.check()

    def __repr__(self) -> str:
        return (f"NpyPairsSource({self.directory!r}, channels_last={self.channels_last}, "
                f"samples={self.num_samples})")

    def open(self, comm, driver=None, collective_io=True) -> SourceReader:
        return _NpyReader(self, comm)


class _NpyReader(SourceReader):
    def __init__(self, src: NpyPairsSource, comm):
        self.src, self.comm = src, comm

    def read(self, sample, start, xout, ystart, yout):
        s = self.src
        xpath, ypath = s.pairs[int(sample)]
        with collective(self.comm):
            hx, hy = _header(xpath), _header(ypath)
            if hx[0] != s.stored_shape or hy[0] != s.y_shape:
                raise ValueError(f"sample pair {xpath!r}: shapes {hx[0]} / {hy[0]}, but the "
                                 f"first pair has {s.stored_shape} / {s.y_shape}")
            if hx[2].newbyteorder("=") != s.dtype or hy[2].newbyteorder("=") != s.target_dtype:
                raise TypeError(f"sample pair {xpath!r}: dtypes {hx[2]} / {hy[2]} differ from "
                                f"the first pair's {s.dtype} / {s.target_dtype}")
            read_npy_block(xpath, hx, start, xout)
            if s.target_kind == "volume":
                read_npy_block(ypath, hy, ystart, yout)
            else:
                yout[...] = np.load(ypath, allow_pickle=False).reshape(yout.shape)


def open_npy_pairs(source, *, channels_last=False, **_) -> SampleSource | None:
    """Opener: a directory holding ``*_data.npy`` files (and no HDF5 files)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    p = os.fspath(source)
    if not os.path.isdir(p):
        return None
    names = os.listdir(p)
    if not any(f.endswith(DATA_SUFFIX) and not f.startswith(".") for f in names):
        return None
    return NpyPairsSource(p, channels_last=channels_last)


OPENERS.insert(-1, open_npy_pairs)
