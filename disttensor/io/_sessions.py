"""Parallel transfers between HDF5 datasets and local blocks: read and write sessions.

* :class:`ReadSession` / :class:`WriteSession`: one file open on every rank of a communicator
  (collective to create, to call each method, and to close).  With the ``mpio`` driver the
  file is opened once over the communicator and each dataset moves in one collective
  transfer; with ``independent`` every rank opens the file with HDF5's POSIX driver, reads are
  independent and writes are *ordered* (:func:`ordered`: a token passes from rank to rank and
  only the holder has the file open for writing; metadata is written by rank 0 alone).
* A part of a transfer is a hyperslab ``(start, stride, count)`` of the file dataset and a
  C-contiguous local buffer of shape ``count`` (:func:`read_into`, :func:`write_from`).
  Transfers go through h5py's low-level API (``DatasetID.read/write`` with explicit
  dataspaces and transfer property lists), because h5py's high-level ``dset[...]`` (a) returns
  early for an empty selection, which would leave the other ranks waiting inside a collective
  transfer forever, and (b) reads int/float datasets through a fast path that uses the default
  transfer list, silently ignoring ``with dset.collective:`` (h5py 3.16).  Here a rank with
  nothing to transfer still takes part with an empty (``select_none``) selection.
* Failures are made collective: every step runs inside :func:`disttensor.core.comm.collective`,
  and rank-local preparation is done (and agreed on) before entering a collective HDF5 call.
* Arguments are agreed (:mod:`disttensor.core.agreement`): the sessions compare their file
  names, drivers, dataset specs and dataset names across the ranks before any collective HDF5
  call (a separate small all-reduce where the HDF5 call itself is collective, i.e. with
  ``mpio``; folded into the failure all-reduce otherwise), so a rank-dependent file or dataset
  raises :class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank instead of
  hanging in MPI-IO or corrupting the file.
* A writer with ``reserve`` claims the disk blocks of its data before any raw data moves
  (:func:`disttensor.io._space.reserve_space`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..core.agreement import agree
from ..core.comm import collective
from ._h5file import (check_file, dataset_meta, drain_background_reads, get_dataset, h5fd, h5p,
                      h5s, h5t, open_file)
from ._space import reserve_space

__all__ = ["TOKEN_TAG", "c_contiguous", "read_into", "write_from", "ordered", "DatasetSpec",
           "WriteSession", "ReadSession"]

TOKEN_TAG = 0x4844  # 'HD': tag of the ordered-write token


def c_contiguous(a) -> np.ndarray:
    """``a`` as a C-contiguous NumPy array, without copying when it is one (unlike
    ``np.ascontiguousarray`` this keeps 0-d arrays 0-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.array(a, order="C")


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

    def read(self, parts: Sequence[tuple[str, Sequence[int], Sequence[int] | None,
                                         np.ndarray | None]]) -> None:
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
