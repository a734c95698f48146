"""Sample sources: the stored formats :class:`~disttensor.io.SampleDataset` reads, one class each.

:class:`SampleDataset` knows nothing about files: it asks a *source* what the samples look like
and to read hyperslabs of them.  Everything format-specific (listing files, probing shapes,
opening files, which dataset holds what, axis order on disk, per-file consistency checks) lives
in a source class here.  A new format is a new class plus one entry in :data:`OPENERS`; nothing
in :class:`SampleDataset` changes.

The interface
-------------
A source is a :class:`SampleSource` (subclass it) with these attributes, fixed at construction
and the same on every rank (the source is built on rank 0 and broadcast, so it must pickle):

* ``format``: a short name (``'hdf5-files'``, ``'hdf5-stacked'``, ...), used in messages.
* ``num_samples``: ``N``.
* ``stored_shape``: the shape of ONE sample as stored (4 axes, in stored order).
* ``stored_axes``: a string naming the stored axes, ``'CDHW'`` or ``'DHWC'`` (any order of
  those four letters works): ``sample_shape`` (``C,D,H,W``) is derived from it.  The source
  never transposes; :class:`SampleDataset` maps its block to the stored hyperslab and
  transposes (and flips, for augmentation) the block locally.
* ``dtype``: the stored dtype of the samples (any NumPy fixed-size dtype).
* ``target_kind``: ``'vector'`` (a ``(k,)`` vector per sample, a stored scalar counting as
  ``k = 1``) or ``'volume'`` (a per-voxel label volume, always stored ``D,H,W`` with the
  sample's spatial shape, whatever ``stored_axes`` is).
* ``target_shape``: ``(k,)`` or ``(D,H,W)``; ``target_dtype``: its stored dtype.
* ``files``: the list of paths (or URLs) the source reads, in sample order where that means
  anything; only used to identify the dataset in the cross-rank agreement and in messages.
* ``stacked``: whether all samples share one file (informational).

and one method, :meth:`SampleSource.open`, which returns a :class:`SourceReader` for one
batch::

    with source.open(comm, driver, collective_io) as reader:   # collective over comm
        for j, s in enumerate(samples):                          # the same samples, same order
            reader.read(s, start, xout, ystart, yout)            # on every rank of comm

* ``comm``: the communicator of the ranks that read the same samples (the grid axes other
  than the sample axis), a private duplicate that is safe to use from the background thread;
  ``None`` means this process alone (no MPI call allowed).  ``driver`` is ``'mpio'``
  (collective MPI-IO, ``comm`` not ``None``) or ``'independent'`` (every rank opens the file
  with a serial driver; **no MPI call** on ``comm`` except to make failures collective).
  ``collective_io``: with ``mpio``, collective or independent transfers.
* ``reader.read(sample, start, xout, ystart, yout)`` reads the hyperslab of sample ``sample``
  that starts at ``start`` (stored axis order, 4 ints) and has ``xout.shape`` (the count) into
  the C-contiguous NumPy buffer ``xout`` (dtype ``source.dtype``), and the target: a vector
  (``ystart = (0,)``, ``yout`` of shape ``(k,)``) or the label volume's hyperslab at ``ystart``
  (3 ints, ``D,H,W``) of shape ``yout.shape``.  A rank whose block is empty passes buffers of
  size 0 and still calls ``read`` (collective transfers).  Errors (a missing file, a file
  whose shape or dtype differs from the first one) must be raised on every rank of ``comm``
  (wrap the checks in :func:`disttensor.core.comm.collective`), and a failed ``read`` leaves
  the reader usable for ``close``.
* Sessions: open files per batch, not per dataset: the HDF5 sources open one
  :class:`~disttensor.io._sessions.ReadSession` per batch (stacked: one file for the whole
  batch) or per sample (one file per sample), always with ``agreed=True`` (the dataset agreed
  its arguments already).  Closing the reader closes what is open (collective).  A format
  without collective I/O (``.npy``, Zarr, TFRecord) ignores ``driver``/``collective_io`` and
  reads independently, calling ``collective(comm)`` around its per-rank work so that a failure
  on one rank is raised on all.

Finding the source for a ``source`` argument
--------------------------------------------
:func:`open_source` (serial: rank 0 calls it and broadcasts the result) tries the functions of
:data:`OPENERS` in order; each gets the ``source`` argument (a path, a list of paths, or a
:class:`SampleSource` used as it is) and the options ``x_dataset``, ``y_dataset``,
``channels_last``, and returns a source or ``None`` (not its format).  The HDF5 opener comes
last and takes everything else.  Insert a new format's opener before it
(``OPENERS.insert(-1, my_opener)``).
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from ..core.comm import collective
from ._h5file import probe
from ._sessions import ReadSession

__all__ = ["SampleSource", "SourceReader", "HDF5FilesSource", "HDF5StackedSource",
           "OPENERS", "open_source", "list_sample_files", "HDF5_EXTENSIONS"]

HDF5_EXTENSIONS = (".h5", ".hdf5", ".hdf")
LOGICAL_AXES = "CDHW"


def list_sample_files(directory) -> list[str]:
    """The sample files of ``directory``: its HDF5 files (``.h5``, ``.hdf5``, ``.hdf``) sorted
    by name, without dot-files (the temporary files of interrupted writes).  Serial."""
    d = os.fspath(directory)
    return sorted(os.path.join(d, f) for f in os.listdir(d)
                  if f.lower().endswith(HDF5_EXTENSIONS) and not f.startswith("."))


class SourceReader:
    """What :meth:`SampleSource.open` returns: reads samples of one batch (see the module
    docstring); a context manager whose exit calls :meth:`close` (collective)."""

    def read(self, sample: int, start, xout: np.ndarray, ystart, yout: np.ndarray) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            if exc[0] is None:
                raise


class SampleSource:
    """Base class of the sample sources (the contract is in the module docstring)."""

    format: str = "?"
    num_samples: int
    stored_shape: tuple[int, ...]
    stored_axes: str = "CDHW"
    dtype: np.dtype
    target_kind: str
    target_shape: tuple[int, ...]
    target_dtype: np.dtype
    files: list[str]
    stacked: bool = False

    @property
    def num_targets(self) -> int | None:
        """``k`` of vector targets, ``None`` for label volumes."""
        return self.target_shape[0] if self.target_kind == "vector" else None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """``(C, D, H, W)`` of one sample."""
        return tuple(self.stored_shape[self.stored_axes.index(a)] for a in LOGICAL_AXES)

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return self.sample_shape[1:]

    def to_stored(self, logical) -> tuple:
        """A ``C,D,H,W`` tuple (start or count) in stored axis order."""
        return tuple(logical[LOGICAL_AXES.index(a)] for a in self.stored_axes)

    def to_logical_axes(self) -> tuple[int, ...]:
        """The ``np.transpose`` axes that turn a stored-order block into ``C,D,H,W``."""
        return tuple(self.stored_axes.index(a) for a in LOGICAL_AXES)

    def open(self, comm, driver: str, collective_io: bool = True) -> SourceReader:
        raise NotImplementedError

    def check(self) -> None:
        """Validate the probed metadata (``ValueError`` naming the source)."""
        if sorted(self.stored_axes) != sorted(LOGICAL_AXES):
            raise ValueError(f"{self.format}: stored_axes {self.stored_axes!r} must order the "
                             f"letters {LOGICAL_AXES!r}")
        if len(self.stored_shape) != 4:
            raise ValueError(f"{self.format}: a sample must have 4 axes, got "
                             f"{self.stored_shape}")
        if self.target_kind not in ("vector", "volume"):
            raise ValueError(f"{self.format}: target_kind {self.target_kind!r}")
        if self.target_kind == "volume" and tuple(self.target_shape) != self.spatial_shape:
            raise ValueError(f"{self.format}: label volumes {self.target_shape} must have the "
                             f"samples' spatial shape {self.spatial_shape}")

    def describe(self) -> str:
        return f"{self.format} ({len(self.files)} file(s), {self.num_samples} samples)"


# -- HDF5 ---------------------------------------------------------------------------------------
def _target_layout(ys, spatial, stacked, n, where, xname, xs, axes):
    """``(kind, k, target_shape)`` from the target dataset's shape ``ys`` (see SampleDataset)."""
    lead = (n,) if stacked else ()
    ysample = ys[1:] if stacked else ys
    if stacked and (len(ys) == 0 or ys[0] != n):
        raise ValueError(f"{where} have shape {ys}, expected ({n}, k) target vectors or an "
                         f"({n}, D, H, W) label volume {lead + spatial}")
    if len(ysample) == 1 or (not stacked and len(ysample) == 0):  # a scalar counts as k = 1
        k = ysample[0] if ysample else 1
        return "vector", k, (k,)
    if len(ysample) == 3:
        if tuple(ysample) != spatial:
            raise ValueError(f"{where} have shape {ys}: a label volume must have the samples' "
                             f"spatial shape {lead + spatial} ({xname!r} has shape {xs}, axes "
                             f"{'N,' if stacked else ''}{axes})")
        return "volume", None, spatial
    raise ValueError(f"{where} have shape {ys}, expected a vector "
                     f"{'(N, k)' if stacked else '(k,)'} or a label volume "
                     f"{lead + spatial} with the samples' spatial shape")


class _HDF5Source(SampleSource):
    def __init__(self, files, x_dataset, y_dataset, channels_last, meta):
        self.files = list(files)
        self.x_dataset, self.y_dataset = x_dataset, y_dataset
        self.channels_last = bool(channels_last)
        self.stored_axes = "DHWC" if channels_last else "CDHW"
        self.stacked = meta["stacked"]
        self.num_samples = int(meta["n"])
        self.stored_shape = tuple(meta["file_sample_shape"])
        self.dtype = np.dtype(meta["dtype"])
        self.target_kind = meta["target_kind"]
        self.target_shape = tuple(meta["target_shape"])
        self.target_dtype = np.dtype(meta["ydtype"])
        self.y_shape = tuple(meta["y_shape"])  # the target dataset's whole shape
        self.check()

    @staticmethod
    def probe(files, xname, yname, channels_last) -> "_HDF5Source":
        """Serial: the source of ``files`` from the first file's metadata."""
        meta = probe(files[0], [xname, yname])
        xs, ys = meta[xname]["shape"], meta[yname]["shape"]
        if len(files) == 1 and len(xs) == 5:
            stacked, n, fsample = True, xs[0], xs[1:]
        elif len(xs) == 4:
            stacked, n, fsample = False, len(files), xs
        else:
            raise ValueError(f"dataset {xname!r} of {files[0]!r} has shape {xs}: expected a "
                             "4-d sample (C,D,H,W), one per file, or one 5-d stacked dataset "
                             "(N,C,D,H,W) in a single file")
        spatial = tuple(fsample[:3]) if channels_last else tuple(fsample[1:])
        axes = "D,H,W,C" if channels_last else "C,D,H,W"
        where = f"{'stacked layout: ' if stacked else ''}targets {yname!r} of {files[0]!r}"
        kind, _, tshape = _target_layout(ys, spatial, stacked, n, where, xname, xs, axes)
        m = {"stacked": stacked, "n": n, "file_sample_shape": tuple(fsample),
             "target_kind": kind, "target_shape": tshape, "y_shape": tuple(ys),
             "dtype": meta[xname]["dtype"], "ydtype": meta[yname]["dtype"]}
        cls = HDF5StackedSource if stacked else HDF5FilesSource
        return cls(files, xname, yname, channels_last, m)


class HDF5FilesSource(_HDF5Source):
    """One HDF5 file per sample: ``x_dataset`` ``C,D,H,W`` (``D,H,W,C`` with
    ``channels_last``: the NERSC cosmoUniverse files' ``full``), ``y_dataset`` ``(k,)``, a
    scalar, or a ``D,H,W`` label volume.  Every file is checked against the first one (shapes
    and dtypes) when it is read."""

    format = "hdf5-files"

    def open(self, comm, driver, collective_io=True):
        return _FilesReader(self, comm, driver, collective_io)


class HDF5StackedSource(_HDF5Source):
    """One HDF5 file: ``x_dataset`` ``N,C,D,H,W`` (``N,D,H,W,C`` with ``channels_last``),
    ``y_dataset`` ``(N,k)`` or ``(N,D,H,W)``."""

    format = "hdf5-stacked"

    def open(self, comm, driver, collective_io=True):
        return _StackedReader(self, comm, driver, collective_io)


class _StackedReader(SourceReader):
    def __init__(self, src: HDF5StackedSource, comm, driver, collective_io):
        self.src = src
        self.sess = ReadSession(src.files[0], comm, driver, collective_io, agreed=True)

    def read(self, sample, start, xout, ystart, yout):
        s = self.src
        self.sess.read([(s.x_dataset, (int(sample),) + tuple(start), None, xout[None]),
                        (s.y_dataset, (int(sample),) + tuple(ystart), None, yout[None])])

    def close(self):
        sess, self.sess = self.sess, None
        if sess is not None:
            sess.close()


class _FilesReader(SourceReader):
    def __init__(self, src: HDF5FilesSource, comm, driver, collective_io):
        self.src, self.comm, self.driver, self.collective_io = src, comm, driver, collective_io

    def read(self, sample, start, xout, ystart, yout):
        s = self.src
        path = s.files[int(sample)]
        with ReadSession(path, self.comm, self.driver, self.collective_io,
                         agreed=True) as sess:
            got = sess.meta([s.x_dataset, s.y_dataset])
            with collective(self.comm):
                gx, gy = got[s.x_dataset], got[s.y_dataset]
                if gx["shape"] != s.stored_shape or gy["shape"] != s.y_shape:
                    raise ValueError(
                        f"sample file {path!r}: {s.x_dataset!r} has shape {gx['shape']} and "
                        f"{s.y_dataset!r} {gy['shape']}, but the first file has "
                        f"{s.stored_shape} and {s.y_shape}")
                if gx["dtype"] != s.dtype or gy["dtype"] != s.target_dtype:
                    raise TypeError(
                        f"sample file {path!r}: dtypes {gx['dtype']}/{gy['dtype']} differ "
                        f"from the first file's {s.dtype}/{s.target_dtype}")
            yrow = yout if s.y_shape else yout.reshape(())
            sess.read([(s.x_dataset, tuple(start), None, xout),
                       (s.y_dataset, tuple(ystart) if s.y_shape else (), None, yrow)])


def _hdf5_files(source) -> list[str]:
    if isinstance(source, (str, os.PathLike)):
        p = os.fspath(source)
        if os.path.isdir(p):
            files = list_sample_files(p)
            if not files:
                raise FileNotFoundError(f"no HDF5 files ({', '.join(HDF5_EXTENSIONS)}) in "
                                        f"directory {p!r}")
            return files
        return [p]
    if isinstance(source, (list, tuple)):
        files = [os.fspath(s) for s in source]
        if not files:
            raise ValueError("SampleDataset needs at least one file")
        return files
    raise TypeError(f"source must be a path (file or directory) or a list of paths, got "
                    f"{type(source).__name__}")


def open_hdf5(source, *, x_dataset, y_dataset, channels_last, **_) -> SampleSource:
    """The HDF5 opener (takes any source): a directory of sample files, a list of them, or one
    file (stacked if its sample dataset is 5-d)."""
    return _HDF5Source.probe(_hdf5_files(source), x_dataset, y_dataset, channels_last)


def _given(source, **_):
    return source if isinstance(source, SampleSource) else None


#: The openers :func:`open_source` tries in order (see the module docstring); the HDF5 one,
#: last, claims every source.
OPENERS: list[Callable[..., SampleSource | None]] = [_given, open_hdf5]


def open_source(source, *, x_dataset: str = "full", y_dataset: str = "unitPar",
                channels_last: bool = False) -> SampleSource:
    """The :class:`SampleSource` of ``source`` (serial: probes files on the calling process)."""
    for opener in OPENERS:
        got = opener(source, x_dataset=x_dataset, y_dataset=y_dataset,
                     channels_last=channels_last)
        if got is not None:
            return got
    raise TypeError(f"no sample source reads {source!r}")
