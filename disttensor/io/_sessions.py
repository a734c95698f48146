"""h5py plumbing shared by the I/O layer.

* Driver choice: ``'mpio'`` (one file handle per communicator, MPI-IO, collective transfers)
  when h5py was built with MPI, else ``'independent'`` (every rank opens the file with HDF5's
  default POSIX driver; reads are independent, writes are *ordered*: a token passes from rank
  to rank and only the holder has the file open for writing).
* HDF5 file locking is switched off (``HDF5_USE_FILE_LOCKING=FALSE`` set before h5py is first
  imported, plus ``locking=False`` at every open): several processes open the same file, and
  many parallel file systems do not support the locks.
* Transfers go through h5py's low-level API (``DatasetID.read/write`` with explicit
  dataspaces and transfer property lists), because h5py's high-level ``dset[...]`` (a) returns
  early for an empty selection, which would leave the other ranks waiting inside a collective
  transfer forever, and (b) reads int/float datasets through a fast path that uses the default
  transfer list, silently ignoring ``with dset.collective:`` (h5py 3.16).  Here a rank with
  nothing to transfer still takes part with an empty (``select_none``) selection.
* Running out of space: writers check the free space first, and before any raw data moves
  claim the blocks it needs (``fallocate``; with ``mpio`` after flushing HDF5's metadata),
  because a collective MPI-IO write that hits ENOSPC can leave some ranks inside ROMIO for
  ever and HDF5 cannot close a file whose metadata it failed to write (both seen with MPICH
  4.0 / HDF5 1.10.8 on a full tmpfs; the POSIX driver can even crash in ``H5D_close``).  The
  reservation needs the *uncompressed* size even for compressed datasets; the unused part is
  trimmed when the file is closed.
* Failures are made collective: every step runs inside :func:`disttensor.core.comm.collective`, and
  rank-local preparation is done (and agreed on) before entering a collective HDF5 call.
* Arguments are agreed (:mod:`disttensor.core.agreement`): the sessions and :func:`atomic_update`
  compare their file names, drivers, dataset specs and dataset names across the ranks before
  any collective HDF5 call (a separate small all-reduce where the HDF5 call itself is
  collective, i.e. with ``mpio``; folded into the failure all-reduce otherwise), so a
  rank-dependent file or dataset raises :class:`~disttensor.core.agreement.ArgumentMismatchError`
  on every rank instead of hanging in MPI-IO or corrupting the file.
* Temporary files of atomic writes are named ``.{name}.{host}.{pid}.{random}.tmp`` next to the
  target ``name`` (:func:`temp_path_for`); a write left behind by a killed process is removed
  by the next write to the same path once it is stale (:func:`remove_stale_temps`: the writer
  was on this host and its process is gone, or it was on another host and the file has not
  been modified for ``DISTTENSOR_STALE_TMP_AGE`` seconds, default 3600).
"""
from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import shutil
import socket
import stat
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")

import numpy as np  # noqa: E402

from ..core.agreement import agree  # noqa: E402
from ..core.comm import collective  # noqa: E402
from .errors import DatasetNotFoundError, HDF5UnavailableError, NotHDF5FileError  # noqa: E402

try:  # noqa: E402
    import h5py
    from h5py import h5fd, h5p, h5s, h5t
except ImportError:  # pragma: no cover - h5py is a dependency
    h5py = None

__all__ = ["DRIVERS", "h5py_has_mpi", "resolve_driver", "open_file", "probe", "check_file",
           "DatasetSpec", "WriteSession", "ReadSession", "ordered", "temp_path_for",
           "replace_atomically", "remove_quietly", "check_space", "reserve_space", "trim",
           "root_call", "storable_dtype", "atomic_update", "drain_background_reads",
           "TempName", "parse_temp_name", "temp_is_stale", "remove_stale_temps",
           "stale_temp_age", "STALE_TMP_AGE_ENV", "DEFAULT_STALE_TMP_AGE",
           "remove_stale_temps_for", "host_tag",
           "arg_path", "arg_paths", "arg_dtype", "arg_attrs"]

DRIVERS = ("mpio", "independent")
TOKEN_TAG = 0x4844  # 'HD': tag of the ordered-write token

#: Whether writers check, before writing, that the target directory has room for the data.
#: Tests switch it off to exercise a real "no space left" failure in the middle of a write.
SPACE_CHECK = True
SPACE_MARGIN = 64 * 1024  # bytes of HDF5 metadata allowed for on top of the raw data


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


def _need_h5py() -> None:
    if h5py is None:
        raise HDF5UnavailableError("disttensor.io needs h5py (pip install h5py)")


def h5py_has_mpi() -> bool:
    """Whether h5py was built with MPI (its ``mpio`` driver is available)."""
    return h5py is not None and bool(h5py.get_config().mpi)


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


# -- arguments as the ranks compare them ------------------------------------------------------
def arg_path(p):
    """A path argument as it is agreed across ranks: ``str`` and ``os.PathLike`` alike (a
    ``Path`` on one rank and the same ``str`` on another are the same file); anything else as
    it is (validation reports it)."""
    return os.fspath(p) if isinstance(p, (str, bytes, os.PathLike)) else p


def arg_paths(source):
    """:func:`arg_path` of a path or of each path of a list/tuple."""
    if isinstance(source, (list, tuple)):
        return [arg_path(s) for s in source]
    return arg_path(source)


def arg_dtype(dtype):
    """A dtype argument as it is agreed (``'f4'``, ``np.float32`` and ``np.dtype('f4')`` are the
    same); ``None`` and anything NumPy rejects as it is."""
    if dtype is None:
        return None
    try:
        return np.dtype(dtype).str
    except Exception:  # noqa: BLE001 - validation reports it
        return dtype


def arg_attrs(attrs):
    """HDF5 attributes as they are agreed: by value (small NumPy arrays as lists, since an
    array argument is otherwise compared by shape and dtype only); anything else as it is."""
    if not isinstance(attrs, dict):
        return attrs
    return {k: v.tolist() if isinstance(v, np.ndarray) and v.size <= 4096
            and not v.dtype.hasobject else v for k, v in attrs.items()}


def c_contiguous(a) -> np.ndarray:
    """``a`` as a C-contiguous NumPy array, without copying when it is one (unlike
    ``np.ascontiguousarray`` this keeps 0-d arrays 0-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.array(a, order="C")


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
    dtype = dset.dtype
    if dtype.hasobject or dtype.kind == "O":
        raise TypeError(f"dataset {dset.name!r} has a variable-length type ({dtype}); "
                        "disttensor.io reads fixed-size types only")
    return {"shape": tuple(int(n) for n in dset.shape), "dtype": dtype,
            "chunks": dset.chunks, "compression": dset.compression}


def get_dataset(f, name: str, path=None):
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


# -- transfers -------------------------------------------------------------------------------
def _dxpl(collective_io: bool):
    if not collective_io:
        return None
    dxpl = h5p.create(h5p.DATASET_XFER)
    dxpl.set_dxpl_mpio(h5fd.MPIO_COLLECTIVE)
    return dxpl


def _spaces(dset, start, stride, count, active: bool):
    fspace = dset.id.get_space()
    if len(count) == 0:  # scalar dataset
        mspace = h5s.create(h5s.SCALAR)
        if not active:
            fspace.select_none()
            mspace.select_none()
        return fspace, mspace, active
    if not active or 0 in count:
        fspace.select_none()
        mspace = h5s.create_simple((1,))
        mspace.select_none()
        return fspace, mspace, False
    fspace.select_hyperslab(tuple(start), tuple(count), tuple(stride) if stride else None)
    return fspace, h5s.create_simple(tuple(count)), True


_BUILTIN_FILTERS = frozenset(range(1, 7))  # deflate, shuffle, fletcher32, szip, nbit, scaleoffset


def _third_party_filters(dset) -> bool:
    plist = dset.id.get_create_plist()
    return any(plist.get_filter(i)[0] not in _BUILTIN_FILTERS for i in range(plist.get_nfilters()))


def read_into(dset, start, stride, out: np.ndarray | None, dxpl) -> None:
    """Read the hyperslab ``(start, stride, out.shape)`` of ``dset`` into the C-contiguous
    ``out``; ``out=None`` takes part in a collective transfer with nothing."""
    if 0 in dset.shape:  # nothing stored; every rank knows (global shape)
        return
    count = tuple(out.shape) if out is not None else (0,) * len(dset.shape)
    fspace, mspace, active = _spaces(dset, start, stride, count, out is not None)
    buf = out if active else np.empty(1, dtype=dset.dtype if out is None else out.dtype)
    dset.id.read(mspace, fspace, buf, h5t.py_create(buf.dtype), dxpl=dxpl)


def write_from(dset, start, data: np.ndarray | None, dxpl) -> None:
    """Write the C-contiguous ``data`` to the hyperslab at ``start``; ``data=None`` takes
    part in a collective transfer with nothing."""
    if 0 in dset.shape:  # nothing to store; every rank knows (global shape)
        return
    count = tuple(data.shape) if data is not None else (0,) * len(dset.shape)
    fspace, mspace, active = _spaces(dset, start, None, count, data is not None)
    buf = data if active else np.zeros(1, dtype=dset.dtype)
    dset.id.write(mspace, fspace, buf, h5t.py_create(buf.dtype), dxpl=dxpl)


def ordered(comm, fn: Callable[[], None]) -> None:
    """Run ``fn()`` on the ranks of ``comm`` one after another in rank order (a token passed
    from rank to rank); collective, and if ``fn`` raised on any rank the later ranks skip it
    and every rank raises."""
    if comm is None or comm.size == 1:
        with collective(comm):
            fn()
        return
    token = np.ones(1, dtype=np.int8)
    with collective(comm):
        if comm.rank > 0:
            comm.Recv(token, source=comm.rank - 1, tag=TOKEN_TAG)
        try:
            if token[0]:
                fn()
        except BaseException:
            token[0] = 0
            raise
        finally:
            if comm.rank < comm.size - 1:
                comm.Send(token, dest=comm.rank + 1, tag=TOKEN_TAG)


@dataclass
class DatasetSpec:
    """A dataset to create: identical on every rank."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: Any = None
    compression: Any = None
    compression_opts: Any = None
    shuffle: bool = False
    attrs: dict = field(default_factory=dict)


def _create(f, spec: DatasetSpec, replace: bool = True):
    if spec.name in f:
        if not replace:
            raise ValueError(f"{spec.name!r} already exists in {f.filename!r}")
        del f[spec.name]
    kw: dict[str, Any] = {}
    size = int(np.prod(spec.shape)) if spec.shape else 1
    if spec.shape and size > 0:  # no chunking/filters for scalar or empty datasets
        if spec.chunks is not None:
            kw["chunks"] = spec.chunks
        if spec.compression is not None:
            kw["compression"] = spec.compression
            if spec.compression_opts is not None:
                kw["compression_opts"] = spec.compression_opts
        if spec.shuffle:
            kw["shuffle"] = True
    # every element is written by exactly one rank: skip the fill-value pass (which with
    # MPI-IO would write the whole dataset once more)
    d = f.create_dataset(spec.name, shape=spec.shape, dtype=spec.dtype, fill_time="never", **kw)
    for k, v in spec.attrs.items():
        d.attrs[k] = v
    return d


class WriteSession:
    """A file open for parallel writing on every rank of ``comm`` (collective to create, to
    call each method, and to close).

    ``create=True`` creates (truncates) ``target``; otherwise it must exist.  With the
    ``independent`` driver, metadata (datasets, attributes) is written by rank 0 alone and data
    in rank order; with ``mpio`` every rank makes the same metadata calls and data moves in one
    collective transfer per dataset.

    The arguments of every call (file, driver, dataset specs and names) are agreed across the
    ranks: folded into the failure all-reduce of the call where only rank 0 touches the file,
    else (``mpio``: the HDF5 call is collective) by a small all-reduce before it, which
    ``agreed=True`` skips: the caller guarantees that everything it passes to this session
    derives from arguments it has agreed already (the entry points of :mod:`disttensor.io`)."""

    def __init__(self, target, comm, driver: str, create: bool, reserve: int = 0, *,
                 agreed: bool = False):
        self.target = os.fspath(target)
        self.agreed = bool(agreed)
        self.comm = comm
        self.driver = driver
        self.f = None
        self.reserve = int(reserve)
        self.extended = False  # whether reserve_space made the file longer (trim it later)
        self.root = comm is None or comm.rank == 0
        drain_background_reads()
        mode = "w" if create else "r+"
        self.base_size = 0
        args = {"target": self.target, "driver": driver, "create": bool(create),
                "reserve": self.reserve}
        if driver == "mpio":
            if not self.agreed:
                agree(comm, "WriteSession", **args)  # before the collective MPI-IO open
            with collective(comm):
                self.f = open_file(self.target, mode, comm)
                if self.root:
                    self.base_size = os.path.getsize(self.target)
        else:
            with collective(comm, "WriteSession", **args):
                if self.root:
                    open_file(self.target, mode).close()

    def _gate(self, call: str, args: dict):
        """The collective block of a metadata call: with ``mpio`` every rank makes the HDF5
        call, so the arguments are agreed first (one all-reduce); otherwise rank 0 alone does
        and the agreement rides on the block's failure all-reduce."""
        if self.driver == "mpio":
            if not self.agreed:
                agree(self.comm, call, **args)
            return collective(self.comm)
        return collective(self.comm, call, **args)

    def _metadata(self, fn, call: str, args: dict) -> None:
        with self._gate(call, dict(args, target=self.target)):
            if self.driver == "mpio":
                fn(self.f)
            elif self.root:
                with open_file(self.target, "r+") as f:
                    fn(f)

    def metadata(self, fn: Callable[[Any], None]) -> None:
        """Run ``fn(h5file)`` as a metadata operation (same arguments on every rank; ranks
        that pass different functions raise)."""
        self._metadata(fn, "WriteSession.metadata", {"fn": fn})

    def create(self, specs: Sequence[DatasetSpec], replace: bool = True) -> None:
        """Create the datasets ``specs`` (the same on every rank, agreed)."""
        specs = list(specs)
        self._metadata(lambda f: [_create(f, s, replace) for s in specs],
                       "WriteSession.create", {"specs": specs, "replace": bool(replace)})
        self.flush()

    def flush(self) -> None:
        """Write HDF5's cached metadata to the file now (collective with ``mpio``)."""
        if self.driver == "mpio":
            with collective(self.comm):
                self.f.flush()

    def write(self, parts: Sequence[tuple[str, tuple[int, ...], np.ndarray | None]]) -> None:
        """Write ``parts``: ``(dataset name, start, data or None)``, the names in the same order
        on every rank (agreed before any data moves; ``None``: nothing to write on this
        rank)."""
        names = [p[0] if isinstance(p, (tuple, list)) and p else p for p in parts]
        with collective(self.comm, "WriteSession.write", target=self.target, names=names):
            prepared = [(n, tuple(s), None if d is None or d.size == 0 else c_contiguous(d))
                        for n, s, d in parts]
        if self.driver == "mpio":
            if self.reserve:
                # A collective MPI-IO write that runs out of space can leave some ranks inside
                # ROMIO for ever, and HDF5 cannot close a file whose metadata it failed to
                # write: write the metadata now and claim the data's blocks first, where
                # failing is harmless.
                self.flush()
                with collective(self.comm):
                    if self.root:
                        self.extended = reserve_space(self.target, self.reserve, self.base_size)
                self.reserve = 0
            dxpl = _dxpl(True)
            with collective(self.comm):
                for name, start, data in prepared:
                    write_from(self.f[name], start, data, dxpl)
        else:
            mine = [p for p in prepared if p[2] is not None]
            reserve = self.reserve > 0  # every ordered write claims its own bytes

            def fn():
                if mine:
                    # claim the blocks of this rank's data before HDF5 opens the file (its
                    # POSIX driver trims the unused rest when it closes the file): running
                    # out of space while HDF5 flushes chunks can crash it
                    if reserve:
                        reserve_space(self.target, sum(d.nbytes for _, _, d in mine))
                    with open_file(self.target, "r+") as f:
                        for name, start, data in mine:
                            write_from(f[name], start, data, None)
            ordered(self.comm, fn)

    def close(self) -> None:
        """Close (collective); errors while flushing are raised on every rank."""
        f, self.f = self.f, None
        if f is not None:
            with collective(self.comm, "WriteSession.close", target=self.target):
                f.close()

    def abort(self) -> None:
        """Close after a failure (collective, errors ignored)."""
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class ReadSession:
    """A file open for reading on every rank of ``comm`` (``comm=None``: this process alone,
    no MPI calls at all).  Collective to create, to read, and to close.  Arguments are agreed
    as for :class:`WriteSession` (``agreed=True``: the caller agreed them already)."""

    def __init__(self, path, comm, driver: str, collective_io: bool = True, *,
                 agreed: bool = False):
        self.path = os.fspath(path)
        self.agreed = bool(agreed)
        self.comm = comm
        self.mpio = driver == "mpio" and comm is not None
        self.collective_io = self.mpio and collective_io
        self.f = None
        drain_background_reads()
        args = {"path": self.path, "driver": driver, "collective_io": bool(collective_io)}
        if self.mpio and not self.agreed:
            agree(comm, "ReadSession", **args)  # before the collective MPI-IO open
        try:
            with collective(comm) if self.mpio else collective(comm, "ReadSession", **args):
                try:
                    self.f = open_file(self.path, "r", comm if self.mpio else None)
                except OSError:
                    check_file(self.path)  # a clearer error when that is the cause
                    raise
        except BaseException:
            if self.f is not None and not self.mpio:
                self.f.close()
            self.f = None
            raise

    def meta(self, names: Sequence[str]) -> dict[str, dict]:
        """Shape, dtype, chunks and compression of the datasets ``names`` (agreed)."""
        names = list(names)
        with collective(self.comm, "ReadSession.meta", path=self.path, names=names):
            return {n: dataset_meta(get_dataset(self.f, n, self.path)) for n in names}

    def read(self, parts: Sequence[tuple[str, Sequence[int], Sequence[int] | None, np.ndarray | None]]) -> None:
        """Read ``parts``: ``(dataset name, file start, file stride or None, out or None)``, the
        names in the same order on every rank; ``out`` (C-contiguous) gets the hyperslab of its
        shape.  ``None``/empty ``out``: nothing to read on this rank.  The names are agreed
        before any data moves (separately when the transfer is collective)."""
        args = {"path": self.path, "names": [p[0] if isinstance(p, (tuple, list)) and p else p
                                             for p in parts]}
        dxpl = _dxpl(self.collective_io)
        if self.collective_io and not self.agreed:
            agree(self.comm, "ReadSession.read", **args)
        with collective(self.comm) if self.collective_io else \
                collective(self.comm, "ReadSession.read", **args):
            for name, start, stride, out in parts:
                dset = get_dataset(self.f, name, self.path)
                # HDF5 1.10's collective read of chunks compressed by a filter that is not
                # built into HDF5 (h5py's LZF, plugins) hands the filter wrong buffer sizes
                # ("Invalid data for LZF decompression"): read those independently
                x = dxpl if dxpl is None or not _third_party_filters(dset) else None
                read_into(dset, start, stride, out if out is not None and out.size else None, x)

    def close(self) -> None:
        f, self.f = self.f, None
        if f is not None:
            with collective(self.comm, "ReadSession.close", path=self.path):
                f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            if exc[0] is None:
                raise


# -- files -----------------------------------------------------------------------------------
_libc_fallocate = None


def _fallocate(fd: int, length: int) -> None:
    """``fallocate(fd, 0, 0, length)`` without glibc's slow emulation on file systems that do
    not support it (then nothing happens)."""
    global _libc_fallocate
    if _libc_fallocate is None:
        try:
            import ctypes
            import ctypes.util
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            f = libc.fallocate
            f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
            f.restype = ctypes.c_int
            _libc_fallocate = f
        except (OSError, AttributeError):
            _libc_fallocate = False
    if not _libc_fallocate:
        return
    import ctypes
    if _libc_fallocate(fd, 0, 0, length) != 0:
        e = ctypes.get_errno()
        if e == errno.ENOSPC or e == errno.EDQUOT:
            raise OSError(e, os.strerror(e))
        # EOPNOTSUPP, EINVAL, ...: no reservation on this file system


def reserve_space(path, nbytes: int, base: int | None = None) -> bool:
    """Allocate disk blocks so that ``path`` can hold ``nbytes`` more than ``base`` bytes (its
    current size by default) plus a metadata margin without running out of space;
    ``OSError(ENOSPC)`` now if it cannot.  (HDF5's MPI-IO driver extends the file to cover
    space it allocated but did not write yet, hence the ``max`` with the current size.)
    Returns whether the file got longer (then :func:`trim` it once written)."""
    size = os.path.getsize(path)
    base = size if base is None else base
    want = max(size, base + int(nbytes)) + SPACE_MARGIN
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            _fallocate(fd, want)
        except OSError as e:
            raise OSError(e.errno, f"No space left on device: cannot reserve {want} bytes for "
                          f"{os.fspath(path)!r} ({e.strerror})") from None
    finally:
        os.close(fd)
    return os.path.getsize(path) > size


def trim(path) -> None:
    """Cut an HDF5 file back to its end of allocation (after :func:`reserve_space`)."""
    open_file(path, "r+").close()  # the POSIX driver truncates to the end of allocation


# -- temporary files of atomic writes ----------------------------------------------------------
#: Environment variable: seconds after its last modification when a temporary file written from
#: another host (whose process cannot be checked) counts as abandoned.
STALE_TMP_AGE_ENV = "DISTTENSOR_STALE_TMP_AGE"
DEFAULT_STALE_TMP_AGE = 3600.0
#: A live process that started more than this many seconds after the temporary file was last
#: modified cannot have written it (its pid was reused after the writer died).
_PID_REUSE_SLACK = 10.0

_NEW_TEMP = re.compile(r"\.(?P<base>.+)\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>[0-9]+)"
                       r"\.(?P<rand>[0-9a-f]{12})\.tmp", re.S)
_OLD_TEMP = re.compile(r"\.(?P<base>.+)\.(?P<rand>[0-9a-f]{12})\.tmp", re.S)

_inflight: set[str] = set()  # temporary files this process is writing now (absolute paths)
_inflight_lock = threading.Lock()
_host_cache: list[str] = []


def host_tag() -> str:
    """This host's name as it appears in temporary file names: the host name with every
    character but letters, digits, ``_`` and ``-`` replaced by ``_`` (no dots: the name
    splits unambiguously), at most 40 characters."""
    if not _host_cache:
        tag = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40]
        _host_cache.append(tag or "unknown")
    return _host_cache[0]


class TempName(NamedTuple):
    """What a temporary file name says: the target's base name, the writer's host tag and pid
    (``None`` for the older pattern ``.{name}.{random}.tmp``, which recorded no writer) and
    the random part."""

    base: str
    host: str | None
    pid: int | None
    rand: str


def parse_temp_name(name: str) -> TempName | None:
    """The parts of a temporary file name of disttensor's own pattern, else ``None``:
    ``.{base}.{host}.{pid}.{random}.tmp`` (``random``: 12 hex digits), or the older
    ``.{base}.{random}.tmp`` (no writer recorded)."""
    m = _NEW_TEMP.fullmatch(name)
    if m:
        return TempName(m["base"], m["host"], int(m["pid"]), m["rand"])
    m = _OLD_TEMP.fullmatch(name)
    if m:
        return TempName(m["base"], None, None, m["rand"])
    return None


def temp_path_for(path) -> str:
    """A fresh hidden name next to ``path`` (same directory, so ``os.replace`` is atomic):
    ``.{name}.{host}.{pid}.{random}.tmp``.  The name is recorded as in flight in this process
    (never stale to :func:`remove_stale_temps`) until :func:`replace_atomically` or
    :func:`remove_quietly` ends it."""
    d, b = os.path.split(os.path.abspath(os.fspath(path)))
    tmp = os.path.join(d, f".{b}.{host_tag()}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    with _inflight_lock:
        _inflight.add(tmp)
    return tmp


def _release(tmp) -> None:
    with _inflight_lock:
        _inflight.discard(os.path.abspath(os.fspath(tmp)))


def stale_temp_age() -> float:
    """Seconds from ``DISTTENSOR_STALE_TMP_AGE`` (default 3600; ``inf``, ``never`` or a
    negative value: never by age).  ``ValueError`` for anything else."""
    raw = os.environ.get(STALE_TMP_AGE_ENV, "").strip()
    if not raw:
        return DEFAULT_STALE_TMP_AGE
    if raw.lower() in ("inf", "never", "off"):
        return math.inf
    try:
        age = float(raw)
    except ValueError:
        raise ValueError(f"{STALE_TMP_AGE_ENV}={raw!r}: expected seconds (a number), 'inf' or "
                         "'never'") from None
    return math.inf if age < 0 or math.isnan(age) else age


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _writer_alive(pid: int, mtime: float) -> bool:
    """Whether process ``pid`` of this host may still be writing a file last modified at
    ``mtime``: it exists, is not a zombie, and (where ``/proc`` tells) started before that
    modification (else the pid was reused).  Unknown counts as alive."""
    if pid == os.getpid():
        return True  # handled by the caller (the in-flight set)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    except (OSError, OverflowError, ValueError):
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            line = f.read()
        fields = line[line.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X", "x"):  # a zombie: dead, not yet reaped
            return False
        boot = _boot_time()
        if boot is not None:
            started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
            if started > mtime + _PID_REUSE_SLACK:
                return False
    except (OSError, ValueError, IndexError):
        pass
    return True


def temp_is_stale(path, parsed: TempName | None = None, now: float | None = None,
                  age: float | None = None) -> bool:
    """Whether the temporary file ``path`` (of disttensor's naming pattern) is abandoned:

    * written on this host (its host tag is this host's) by a process that no longer exists
      (``os.kill(pid, 0)`` fails with ``ProcessLookupError``), is a zombie, or started after
      the file was last modified (its pid was reused); by this very process: when no write of
      this process has it in flight;
    * written on another host, or by a version that did not record the writer: not modified
      for more than ``age`` seconds (default :func:`stale_temp_age`).

    Anything else (and anything that is not a regular file, or cannot be examined) is not
    stale."""
    p = os.path.abspath(os.fspath(path))
    parsed = parse_temp_name(os.path.basename(p)) if parsed is None else parsed
    if parsed is None:
        return False
    try:
        st = os.lstat(p)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    if parsed.host == host_tag() and parsed.pid is not None and parsed.pid > 0:
        if parsed.pid == os.getpid():
            with _inflight_lock:
                return p not in _inflight
        return not _writer_alive(parsed.pid, st.st_mtime)
    now = time.time() if now is None else now
    age = stale_temp_age() if age is None else age
    return now - st.st_mtime > age


def remove_stale_temps(directory, basenames) -> list[str]:
    """Remove the stale (:func:`temp_is_stale`) temporary files of the targets ``basenames``
    (file names in ``directory``) left by interrupted atomic writes; one scan of the
    directory.  Only names of disttensor's own pattern for those targets are considered;
    errors (a file that vanished, no permission) are ignored.  Returns the removed paths."""
    d = os.path.abspath(os.fspath(directory))
    bases = {basenames} if isinstance(basenames, str) else set(basenames)
    removed: list[str] = []
    if not bases:
        return removed
    age = stale_temp_age()
    now = time.time()
    try:
        entries = list(os.scandir(d))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(".") or not e.name.endswith(".tmp"):
            continue
        parsed = parse_temp_name(e.name)
        if parsed is None or parsed.base not in bases:
            continue
        try:
            if temp_is_stale(e.path, parsed, now, age):
                os.remove(e.path)
                removed.append(e.path)
        except OSError:
            pass
    return removed


def remove_stale_temps_for(path) -> list[str]:
    """:func:`remove_stale_temps` of the one target ``path``."""
    d, b = os.path.split(os.path.abspath(os.fspath(path)))
    return remove_stale_temps(d, {b})


def fsync_path(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(tmp, path) -> None:
    """Flush ``tmp`` to disk and rename it over ``path`` (one rank)."""
    fsync_path(tmp)
    os.replace(tmp, path)
    _release(tmp)
    try:
        fsync_path(os.path.dirname(os.path.abspath(path)))
    except OSError:
        pass  # directories cannot be fsynced on every file system


def remove_quietly(path) -> None:
    """Remove ``path`` ignoring errors (and end its in-flight record if it is a temporary
    file of this process)."""
    try:
        os.remove(path)
    except OSError:
        pass
    _release(path)


def check_space(path, needed: int) -> None:
    """Raise ``OSError(ENOSPC)`` if the directory of ``path`` has less than ``needed`` bytes
    (plus a metadata margin) free.  A best-effort early check: the write itself still reports
    running out of space."""
    if not SPACE_CHECK:
        return
    d = os.path.dirname(os.path.abspath(os.fspath(path)))
    try:
        free = shutil.disk_usage(d).free
    except OSError:
        return
    if needed + SPACE_MARGIN > free:
        raise OSError(errno.ENOSPC, f"No space left on device: writing {os.fspath(path)!r} needs "
                      f"about {needed + SPACE_MARGIN} bytes but only {free} are free in {d!r}")


def atomic_update(comm, path, driver: str, mode: str, atomic: bool, needed: int,
                  body: Callable[[WriteSession], None],
                  validate: Callable[[str], None] | None = None, *,
                  agreed: bool = False) -> None:
    """Write ``path`` through ``body(session)`` so that it changes all at once (collective).

    ``mode``: ``'w'`` (the file gets only what ``body`` writes), ``'a'`` (keep the rest of an
    existing file, create it if missing) or ``'r+'`` (the file must exist).  With ``atomic``
    the work happens on a temporary file in the same directory (a copy of the existing file for
    ``'a'``/``'r+'``) that rank 0 renames over ``path`` only after every rank finished without
    error; on any failure the temporary file is removed and ``path`` is untouched.  Without
    ``atomic`` ``path`` is written in place.  ``validate(path)`` runs on rank 0 before anything
    is written when the file exists (``'a'``/``'r+'``).  ``needed``: bytes of raw data, for the
    free-space check.  The arguments are agreed across the ranks first (one small all-reduce;
    ``agreed=True``: the caller agreed them, and everything ``body`` passes to the session,
    already), and rank 0 removes the stale temporary files of earlier, interrupted writes to
    ``path`` (:func:`remove_stale_temps`) before it creates its own."""
    with collective(comm, "atomic_update", path=arg_path(path), driver=driver, mode=mode,
                    atomic=atomic, needed=needed) if not agreed else contextlib.nullcontext():
        path = os.path.abspath(os.fspath(path))
        if mode not in ("w", "a", "r+"):
            raise ValueError(f"mode must be 'w', 'a' or 'r+', got {mode!r}")

    def prep():
        d = os.path.dirname(path)
        if not os.path.isdir(d):
            raise FileNotFoundError(f"directory {d!r} does not exist (writing {path!r})")
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path!r} is a directory")
        exists = os.path.exists(path)
        if mode == "r+" and not exists:
            raise FileNotFoundError(f"no such file: {path!r} (mode 'r+' updates an existing file)")
        keep = exists and mode in ("a", "r+")
        if keep:
            check_file(path)
            if validate is not None:
                validate(path)
        copy = os.path.getsize(path) if keep and atomic else 0
        # the temporary files of earlier writes to this path that were killed (their writer
        # is gone): removed before this write claims space (never a live writer's)
        remove_stale_temps_for(path)
        check_space(path, needed + copy)
        if not atomic:
            return path, not keep
        tmp = temp_path_for(path)
        if keep:
            try:
                shutil.copyfile(path, tmp)
            except BaseException:
                remove_quietly(tmp)
                raise
        return tmp, not keep

    target, create = root_call(comm, prep)
    sess = None
    try:
        sess = WriteSession(target, comm, driver, create, reserve=needed, agreed=agreed)
        body(sess)
        s, sess = sess, None
        s.close()

        def finish():
            if s.extended:
                trim(target)
            if atomic:
                replace_atomically(target, path)
        root_call(comm, finish)
    except BaseException:
        if sess is not None:
            sess.abort()
        if atomic and (comm is None or comm.rank == 0):
            remove_quietly(target)
        raise
