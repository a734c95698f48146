"""h5py access for the I/O layer: the driver, opening files, checking files and datasets.

* Driver choice (:func:`resolve_driver`): ``'mpio'`` (one file handle per communicator,
  MPI-IO, collective transfers) when h5py was built with MPI, else ``'independent'`` (every
  rank opens the file with HDF5's default POSIX driver; reads are independent, writes are
  *ordered*, see :mod:`disttensor.io._sessions`).
* HDF5 file locking is switched off (``HDF5_USE_FILE_LOCKING=FALSE`` set when this module is
  imported, before h5py is, plus ``locking=False`` at every :func:`open_file`): several
  processes open the same file, and many parallel file systems do not support the locks.
  Every module of :mod:`disttensor.io` gets h5py from here.
* Serial checks on one rank (:func:`check_file`, :func:`probe`, :func:`get_dataset`,
  :func:`dataset_meta`) raise the errors of :mod:`disttensor.io.errors` with clear messages;
  :func:`root_call` runs such a check on one rank and makes its outcome collective.
* :func:`drain_background_reads`: the main thread waits for the background readers of
  :class:`~disttensor.io.SampleDataset` before any collective HDF5 call of its own.

Nothing here is collective except :func:`root_call` (over its ``comm``) and :func:`open_file`
with a ``comm`` (the ``mpio`` open is collective over it).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import threading
import weakref
from typing import Any, Callable, Sequence

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")

import numpy as np  # noqa: E402

from ..core.comm import collective  # noqa: E402
from .errors import DatasetNotFoundError, HDF5UnavailableError, NotHDF5FileError  # noqa: E402



class _Deferred:
    """The module ``name``, imported on first attribute access (h5py costs ~30 ms and several
    MB per process: it loads when a file is first touched, not with :mod:`disttensor`).  A
    missing h5py raises :class:`~disttensor.io.errors.HDF5UnavailableError` there."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        try:
            module = importlib.import_module(self._name)
        except ImportError:
            raise HDF5UnavailableError("disttensor.io needs h5py (pip install h5py)") from None
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<deferred module {self._name!r}>"


h5py: Any = _Deferred("h5py")
h5fd: Any = _Deferred("h5py.h5fd")
h5p: Any = _Deferred("h5py.h5p")
h5s: Any = _Deferred("h5py.h5s")
h5t: Any = _Deferred("h5py.h5t")

__all__ = ["DRIVERS", "h5py", "h5py_available", "h5py_has_mpi", "resolve_driver", "open_file", "storable_dtype",
           "check_file", "dataset_meta", "get_dataset", "probe", "root_call", "BACKGROUND",
           "drain_background_reads"]

DRIVERS = ("mpio", "independent")

#: Objects with a ``_drain()`` method whose background thread makes collective HDF5 calls
#: (the :class:`~disttensor.io.SampleDataset` objects that prefetch with ``mpio``).
BACKGROUND: "weakref.WeakSet" = weakref.WeakSet()


def drain_background_reads() -> None:
    """Wait until no background thread of this process is inside a collective HDF5 read.

    Called (from the main thread) by every collective entry point of :mod:`disttensor.io`
    before it opens a file: h5py serializes its calls with a global lock, so a main-thread
    collective HDF5 call waiting for that lock while the background thread of another rank
    waits for the main thread would deadlock."""
    if threading.current_thread() is not threading.main_thread():
        return
    for obj in list(BACKGROUND):
        obj._drain()


def h5py_available() -> bool:
    """Whether h5py can be imported (checked without importing it)."""
    return importlib.util.find_spec("h5py") is not None


def _need_h5py() -> None:
    if not h5py_available():
        raise HDF5UnavailableError("disttensor.io needs h5py (pip install h5py)")


def h5py_has_mpi() -> bool:
    """Whether h5py was built with MPI (its ``mpio`` driver is available)."""
    return h5py_available() and bool(h5py.get_config().mpi)


def resolve_driver(driver: str | None) -> str:
    """``None`` -> ``'mpio'`` if available else ``'independent'``; validates explicit choices."""
    _need_h5py()
    if driver is None:
        return "mpio" if h5py_has_mpi() else "independent"
    if driver not in DRIVERS:
        raise ValueError(f"driver must be one of {DRIVERS} or None, got {driver!r}")
    if driver == "mpio" and not h5py_has_mpi():
        raise HDF5UnavailableError("driver='mpio' needs h5py built with MPI "
                                   "(HDF5_MPI=ON against a parallel HDF5); use "
                                   "driver='independent' or driver=None")
    return driver


_LOCKING_KW = None


def open_file(path, mode: str, comm=None):
    """``h5py.File`` without file locking; with ``comm`` the ``mpio`` driver over ``comm``
    (collective over it)."""
    global _LOCKING_KW
    _need_h5py()
    if _LOCKING_KW is None:
        _LOCKING_KW = h5py.version.hdf5_version_tuple >= (1, 10, 7)
    kw: dict[str, Any] = {"locking": False} if _LOCKING_KW else {}
    if comm is not None:
        kw.update(driver="mpio", comm=comm)
    return h5py.File(os.fspath(path), mode, **kw)


def storable_dtype(dtype) -> np.dtype:
    """``dtype`` if HDF5 and NumPy share it (fixed-size: bool, ints, floats incl. float16 and
    long double, complex, fixed-length bytes, structured types of those), else ``TypeError``."""
    _need_h5py()
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.kind in "OUVMm" and not (dtype.kind == "V" and dtype.names):
        raise TypeError(f"dtype {dtype} cannot be stored in HDF5 by disttensor.io "
                        "(object, unicode, datetime and raw void types are not supported)")
    try:
        h5t.py_create(dtype)
    except Exception as e:  # noqa: BLE001
        raise TypeError(f"dtype {dtype} has no HDF5 equivalent: {e}") from None
    return dtype


# -- probing (serial, one rank) --------------------------------------------------------------
def check_file(path, what: str = "file") -> str:
    """Raise a clear error unless ``path`` is an existing, readable HDF5 file."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"no such {what}: {p!r}")
    if os.path.isdir(p):
        raise IsADirectoryError(f"{p!r} is a directory, not an HDF5 file")
    if not os.access(p, os.R_OK):
        raise PermissionError(f"{p!r} is not readable")
    if not h5py.is_hdf5(p):
        raise NotHDF5FileError(f"{p!r} is not an HDF5 file (no HDF5 signature)")
    return p


def dataset_meta(dset) -> dict:
    """Shape, dtype, chunks and compression of the open dataset ``dset`` (``TypeError`` for a
    variable-length type)."""
    dtype = dset.dtype
    if dtype.hasobject or dtype.kind == "O":
        raise TypeError(f"dataset {dset.name!r} has a variable-length type ({dtype}); "
                        "disttensor.io reads fixed-size types only")
    return {"shape": tuple(int(n) for n in dset.shape), "dtype": dtype,
            "chunks": dset.chunks, "compression": dset.compression}


def get_dataset(f, name: str, path=None):
    """The dataset ``name`` of the open file ``f``, else :class:`DatasetNotFoundError` (naming
    the file ``path``, default ``f.filename``, and its top-level names)."""
    try:
        obj = f.get(name)
    except Exception as e:  # noqa: BLE001 - broken links etc.
        raise DatasetNotFoundError(f"cannot open {name!r} in {os.fspath(path or f.filename)!r}: "
                                   f"{e}") from None
    if obj is None:
        names = sorted(f.keys())
        more = ", ..." if len(names) > 20 else ""
        raise DatasetNotFoundError(
            f"{os.fspath(path or f.filename)!r} has no dataset {name!r} (top-level names: "
            f"{', '.join(names[:20])}{more})")
    if not isinstance(obj, h5py.Dataset):
        raise DatasetNotFoundError(f"{name!r} in {os.fspath(path or f.filename)!r} is a "
                                   f"{type(obj).__name__}, not a dataset")
    return obj


def probe(path, datasets: Sequence[str] = ()) -> dict[str, dict]:
    """Serial check of an HDF5 file and metadata of ``datasets`` in it."""
    p = check_file(path)
    try:
        f = open_file(p, "r")
    except OSError as e:
        raise NotHDF5FileError(f"cannot open {p!r} as HDF5: {e}") from None
    with f:
        return {name: dataset_meta(get_dataset(f, name, p)) for name in datasets}


def root_call(comm, fn: Callable[[], Any], root: int = 0):
    """Run ``fn`` on ``root`` only; its exception is raised on every rank, its result is
    broadcast (collective)."""
    res = None
    with collective(comm):
        if comm is None or comm.rank == root:
            res = fn()
    if comm is not None and comm.size > 1:
        res = comm.bcast(res, root=root)
    return res
