"""The few MPI patterns used everywhere: collective errors, datatypes, reductions, and
moving GPU buffers through MPI.

Collective errors: validation that depends only on replicated metadata (global shapes,
distributions, dtypes) raises the same exception on every rank without any message.  Where a
check depends on rank-local data, wrap it in :func:`collective`: every rank learns whether any
rank failed, and all raise the same exception type with the message of the lowest failing rank.
"""
from __future__ import annotations

import atexit
import contextlib
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from .backend import array_module, to_host
from .copies import copier, copy_into, fill_zero, zero_filler
from . import profiler as _profiler
from . import watchdog as _watchdog
from .watchdog import waiting

__all__ = ["CollectiveError", "collective", "check_same", "any_true", "mpi_type",
           "allreduce", "allreduce_owned", "host_staging", "cuda_aware_mpi", "private_comm",
           "PieceExchange", "copy_into", "copier", "fill_zero", "zero_filler"]


class CollectiveError(RuntimeError):
    """Raised on every rank when a rank failed with an exception that cannot be rebuilt."""


def _rebuild(exc_type: type, msg: str) -> BaseException:
    try:
        e = exc_type(msg)
        if str(e) == msg:
            return e
    except Exception:
        pass
    return CollectiveError(msg)


@contextlib.contextmanager
def collective(comm: MPI.Comm, call: str | None = None, /, **args):
    """Run a block on every rank; if it raised on any rank, raise on all ranks.

    All ranks raise an exception of the type raised on the lowest failing rank, with its
    message (plus which rank it came from, when it is not this one).  Costs one small
    all-reduce when nothing failed.

    With ``call`` (the name of a collective entry point) and its metadata ``args``, the same
    all-reduce also agrees the arguments across ranks (see :mod:`disttensor.core.agreement`): if
    they differ, every rank raises :class:`~disttensor.core.agreement.ArgumentMismatchError`
    naming them, in preference to any validation error the block raised (a rank-dependent
    argument is the cause then).  Put the argument validation inside the block, so that no
    data moves before the ranks agree."""
    from . import agreement
    dig = None
    if call is not None and comm is not None and comm.size > 1:
        if _profiler._active is None:
            dig = agreement.enter(call, args)
        else:
            with _profiler.region("agreement", f"agree {call}"):
                dig = agreement.enter(call, args)
    err: BaseException | None = None
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised below on every rank
        err = e
    if comm is None or comm.size == 1:
        if err is not None:
            raise err
        return
    if _profiler._active is None:
        failed, differ = agreement.status_allreduce(comm, err is not None, dig)
    else:
        with _profiler.region("agreement", "agreement all-reduce" if call is None else
                              f"agreement all-reduce {call}"):
            failed, differ = agreement.status_allreduce(comm, err is not None, dig)
    if differ:  # (a rank whose local work failed after agreeing reports it: its error wins)
        local = err is not None and "rank-local failure" in args
        exc = agreement.mismatch_error(comm, call, args,
                                       (type(err), str(err)) if local else None)
        if local and getattr(exc, "failed_rank", None) == comm.rank:
            raise err
        raise exc from err
    if not failed:
        return
    infos = comm.allgather(None if err is None else (type(err), str(err)))
    first = next(r for r, i in enumerate(infos) if i is not None)
    exc_type, msg = infos[first]
    if err is not None and first == comm.rank:
        raise err
    raise _rebuild(exc_type, f"{msg} (raised on rank {first})") from err


def check_same(comm: MPI.Comm, value, what: str) -> None:
    """Raise ``ValueError`` (an :class:`~disttensor.core.agreement.ArgumentMismatchError`) on every
    rank unless ``value`` is equal on all ranks (compared by digest: one small all-reduce; the
    values are gathered only to word the error)."""
    if comm is None or comm.size == 1:
        return
    from . import agreement
    _, differ = agreement.status_allreduce(comm, False, agreement.digest(what, {"value": value}))
    if differ:
        values = comm.allgather(value)
        raise agreement.ArgumentMismatchError(f"{what} differ between ranks: {values}")


def any_true(comm: MPI.Comm, flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (collective)."""
    return bool(comm.allreduce(bool(flag), op=MPI.LOR)) if comm.size > 1 else bool(flag)


# -- datatypes -------------------------------------------------------------------------------
_NATIVE = {
    "b": MPI.SIGNED_CHAR, "B": MPI.UNSIGNED_CHAR, "h": MPI.SHORT, "H": MPI.UNSIGNED_SHORT,
    "i": MPI.INT, "I": MPI.UNSIGNED, "l": MPI.LONG, "L": MPI.UNSIGNED_LONG,
    "q": MPI.LONG_LONG, "Q": MPI.UNSIGNED_LONG_LONG, "f": MPI.FLOAT, "d": MPI.DOUBLE,
    "g": MPI.LONG_DOUBLE, "F": MPI.C_FLOAT_COMPLEX, "D": MPI.C_DOUBLE_COMPLEX,
    "?": MPI.C_BOOL,
}


_derived: dict = {}  # cache of committed derived datatypes, freed before MPI_Finalize


def _free_derived() -> None:
    if not MPI.Is_finalized():
        for t in _derived.values():
            if t not in _NATIVE.values():
                t.Free()
    _derived.clear()


def _register_free_at_finalize() -> None:
    """Free the cached datatypes when MPI is finalized, however that happens: an attribute on
    ``MPI_COMM_SELF`` is deleted at the very start of ``MPI_Finalize`` (the MPI standard's hook
    for clean-up), so an explicit ``MPI.Finalize()`` by the application frees them too (an
    ``atexit`` handler alone runs too late then, and MPICH warns of leaked handles)."""
    try:
        if MPI.Is_finalized() or not MPI.Is_initialized():
            return
        keyval = MPI.Comm.Create_keyval(delete_fn=lambda comm, key, val: _free_derived())
        MPI.COMM_SELF.Set_attr(keyval, None)
    except Exception:  # pragma: no cover - an MPI without attribute callbacks: atexit only
        pass


_register_free_at_finalize()
atexit.register(_free_derived)  # when MPI is finalized by mpi4py at exit (after atexit)


def mpi_type(dtype: np.dtype) -> MPI.Datatype:
    """An MPI datatype for moving elements of ``dtype`` (native byte order).  Types MPI has no
    name for (float16, bfloat16, structured) move as contiguous bytes."""
    dtype = np.dtype(dtype)
    key = ("elem", dtype.str)
    t = _derived.get(key)
    if t is None:
        t = _NATIVE.get(dtype.char) if dtype.isnative else None
        if t is None or t == MPI.DATATYPE_NULL or t.Get_size() != dtype.itemsize:
            t = MPI.BYTE.Create_contiguous(dtype.itemsize)
            t.Commit()
        _derived[key] = t
    return t


# -- reductions ------------------------------------------------------------------------------
_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
        "land": MPI.LAND, "lor": MPI.LOR}


def allreduce(comm: MPI.Comm, arr, op: str):
    """All-reduce a NumPy or CuPy array elementwise over ``comm`` (returns a new array of the
    same kind and dtype).  float16/bfloat16 reduce in float32; bool reduces as uint8.
    ``min``/``max`` propagate NaN as NumPy does."""
    xp = array_module(arr)
    if comm.size == 1:
        return arr.copy()
    if xp is not np and op == "sum":
        out = _device_sum(comm, arr)
        if out is not None:
            return out
    host = to_host(arr)
    dtype = host.dtype
    work = np.ascontiguousarray(host)
    if dtype == np.bool_:
        work = work.astype(np.uint8)
    elif dtype.kind == "f" and dtype.itemsize < 4 or dtype.char not in _NATIVE:
        work = work.astype(np.float32 if dtype.kind == "f" else np.float64)
    top = None
    if op in ("min", "max") and work.dtype.kind == "u":
        # MPICH 4.0 (ch4) compares unsigned types as signed in MPI_MIN/MPI_MAX (min(4, 255)
        # of uint8 gives 255); flipping the top bit maps the unsigned order onto the signed
        # order exactly, so this is right with any MPI
        unsigned = work.dtype
        top = np.array(1 << (8 * unsigned.itemsize - 1), dtype=unsigned)
        work = np.ascontiguousarray(work ^ top).view(f"i{unsigned.itemsize}")
    out = np.empty_like(work)
    with waiting(comm, f"MPI_Allreduce ({op})"):
        comm.Allreduce(work, out, op=_OPS[op])
    if top is not None:
        out = out.view(unsigned) ^ top
    if op in ("min", "max") and work.dtype.kind in "fc":
        nan = np.isnan(work).astype(np.uint8)
        anynan = np.empty_like(nan)
        comm.Allreduce(nan, anynan, op=MPI.MAX)
        out[anynan.astype(bool)] = np.nan
    out = out.astype(dtype, copy=False)
    return out if xp is np else xp.asarray(out)


def allreduce_owned(comm: MPI.Comm, arr, op: str):
    """:func:`allreduce` of an array the caller made and hands over (nothing else may hold
    it): returned as is on one rank, and a C-contiguous NumPy array of a native dtype is
    reduced in place (``MPI_IN_PLACE``: the same sums, no new array); else :func:`allreduce`."""
    if type(arr) is not np.ndarray:
        return allreduce(comm, arr, op)
    if comm.size == 1:
        return arr
    if op != "sum" or arr.dtype.char not in _NATIVE or not arr.flags.c_contiguous:
        return allreduce(comm, arr, op)
    with waiting(comm, f"MPI_Allreduce ({op})"):
        comm.Allreduce(MPI.IN_PLACE, arr, op=_OPS[op])
    return arr


def _device_sum(comm: MPI.Comm, arr):
    """The sum of CuPy array ``arr`` over ``comm`` computed on the devices with NCCL (float16
    in float32, as the host path does), stream-ordered; ``None`` where NCCL is not used on
    ``comm`` or not for this dtype (collective: the answer is the same on every rank)."""
    from .gpucomm import NCCL_DTYPES, device_allreduce, nccl_communicator
    dtype = np.dtype(arr.dtype)
    if dtype.name not in NCCL_DTYPES or nccl_communicator(comm) is None:
        return None
    work = arr.astype(np.float32) if dtype == np.float16 else arr.copy(order="C")
    if device_allreduce(comm, work, "sum") is None:
        return None
    return work.astype(dtype, copy=False)


# -- GPU buffers -----------------------------------------------------------------------------
def mpix_query_cuda_support() -> bool | None:
    """``MPIX_Query_cuda_support()`` of the MPI library mpi4py is linked to, through ctypes
    (MPICH >= 4 and Open MPI have it; mpi4py 4.1 does not wrap it).  ``None`` where the
    library lacks the symbol."""
    import ctypes
    try:
        lib = ctypes.CDLL(MPI.__file__)  # dlsym on it also searches its libmpi dependency
        fn = lib.MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return bool(fn())


@lru_cache(maxsize=1)
def cuda_aware_mpi() -> bool:
    """Whether device buffers may be handed to MPI: ``DISTTENSOR_CUDA_AWARE_MPI`` (``1``/``0``)
    if set, else ``MPIX_Query_cuda_support()`` of the MPI library (False where it lacks it)."""
    import os
    env = os.environ.get("DISTTENSOR_CUDA_AWARE_MPI")
    if env is not None:
        return env.lower() not in ("0", "", "false", "no")
    try:
        return bool(mpix_query_cuda_support())
    except Exception:
        return False


def host_staging(arr) -> bool:
    """Whether a device array must go through host memory for MPI."""
    return array_module(arr) is not np and not cuda_aware_mpi()


# -- private communicators -------------------------------------------------------------------
_PRIVATE_KEYVAL = None


def _free_private(comm, keyval, comms) -> None:
    if not MPI.Is_finalized():
        for c in comms.values():
            c.Free()
    comms.clear()


def private_comm(comm: MPI.Comm, purpose: str) -> MPI.Comm:
    """A duplicate of ``comm`` reserved for one kind of library traffic (``purpose``), so
    point-to-point messages of, say, a split-phase halo exchange still in flight can never
    match those of another operation or of user code on ``comm``.  Created on first use
    (collective over ``comm``), cached as an MPI attribute of ``comm`` and freed with it."""
    global _PRIVATE_KEYVAL
    if _PRIVATE_KEYVAL is None:
        _PRIVATE_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free_private)
    comms = comm.Get_attr(_PRIVATE_KEYVAL)
    if comms is None:
        comms = {}
        comm.Set_attr(_PRIVATE_KEYVAL, comms)
    c = comms.get(purpose)
    if c is None:
        c = comms[purpose] = comm.Dup()
    return c


# -- point-to-point exchange of array pieces ---------------------------------------------------
def _c_contiguous(a) -> bool:
    return bool(a.flags.c_contiguous)


def _bytes(a):
    """An MPI buffer spec moving the C-contiguous array ``a`` as raw bytes (works for every
    dtype, float16 and bfloat16 included)."""
    return [a, MPI.BYTE]


class PieceExchange:
    """Non-blocking point-to-point exchange of array pieces, reusable.

    ``sends`` and ``recvs`` are ``(peer, tag, view)`` triples; the views (NumPy or CuPy, all of
    one kind) stay bound to their arrays, so one object serves many exchanges of the same
    buffers.  :meth:`start` packs and posts every message; :meth:`finish` waits and unpacks
    (or, with ``accumulate=True``, adds what arrived into the receive views).  Both sides
    order a piece's elements C-wise.

    Transport (CPU): a C-contiguous piece goes straight from/to its array, any other piece
    through a contiguous scratch buffer allocated once (a NumPy copy).  MPI subarray datatypes
    would avoid that copy, but measured with Debian's MPICH (ch4:ucx) they were never faster
    than the NumPy pack and up to ~40x slower under load for short runs (strided faces; see
    ``bench/README.md``).  GPU pieces are packed on the device, the stream is synchronized
    before MPI sees them, and they go through host memory unless MPI is CUDA-aware.

    Persistent requests (CPU, ``persistent=True``, the default there): the first
    :meth:`start` makes one ``MPI_Recv_init``/``MPI_Send_init`` per piece, bound to the
    piece's view or scratch, and every exchange is then one ``MPI_Startall`` and one
    ``MPI_Waitall`` (no request objects, lists or buffer specs built per call: the
    per-exchange Python cost that dominates small messages).  ``persistent=False`` posts
    fresh ``Irecv``/``Isend`` requests each time (for one-shot exchanges, where setting up
    persistent requests would cost more than it saves).  The requests are freed with the
    object (or by :meth:`free`); a :meth:`finish` that failed inside MPI drops them, and the
    next :meth:`start` makes new ones.

    ``packed=True`` (CPU) moves every piece through scratch, contiguous ones too, so the
    persistent requests are bound to the scratch alone and :meth:`rebind` can point the
    exchange at new arrays of the same pieces (a cached exchange serving every call of one
    layout, :func:`disttensor.core.halo.reverse_window`).

    Contract: every rank named as a peer makes the matching :meth:`start`/:meth:`finish` pair
    the same number of times (collective over the peers, like the ``Isend``/``Irecv`` it
    replaces); :meth:`start` while an exchange is in flight raises ``RuntimeError`` and leaves
    the one in flight intact."""

    def __init__(self, comm: MPI.Comm, sends, recvs, accumulate: bool = False,
                 persistent: bool = True, packed: bool = False):
        self.comm = comm
        self.accumulate = accumulate
        self.sends = [(int(p), int(t), v) for p, t, v in sends if v.size]
        self.recvs = [(int(p), int(t), v) for p, t, v in recvs if v.size]
        views = [v for _, _, v in self.sends + self.recvs]
        self.xp = array_module(views[0]) if views else np
        self.gpu = self.xp is not np
        self.staged = self.gpu and not cuda_aware_mpi()
        self.packed = bool(packed) and not self.gpu
        self._send_scratch = [self._scratch(v, recv=False) for _, _, v in self.sends]
        self._recv_scratch = [self._scratch(v, recv=True) for _, _, v in self.recvs]
        self.persistent = bool(persistent) and not self.gpu
        self._bind_views()
        self._preqs: list | None = None
        self._reqs: list = []
        self._keep: list = []
        self._active = False

    def _bind_views(self) -> None:
        """List once what start() packs and finish() unpacks; a persistent exchange (its views
        copied many times) also makes its copy functions once (:func:`copier`)."""
        self._pack = [(s, v) for (_, _, v), s in zip(self.sends, self._send_scratch)
                      if s is not None]
        self._unpack = [(v, s) for (_, _, v), s in zip(self.recvs, self._recv_scratch)
                        if s is not None]
        self._packers = [copier(s, v) for s, v in self._pack] \
            if self.persistent and not self.packed else None
        self._unpackers = [copier(v, s) for v, s in self._unpack] \
            if self.persistent and not self.packed and not self.accumulate else None

    def _scratch(self, v, recv: bool):
        if self.staged:  # page-locked, made once per exchange and reused by every start()
            import cupyx
            return cupyx.empty_pinned(v.shape, dtype=v.dtype)
        if _c_contiguous(v) and not (recv and self.accumulate) and not self.packed:
            return None
        return self.xp.empty(v.shape, dtype=v.dtype)

    def rebind(self, sends=None, recvs=None) -> "PieceExchange":
        """Point a ``packed=True`` exchange at new views (not while one is in flight):
        ``sends`` and ``recvs`` list one view per piece kept at construction (the non-empty
        ones), in order, each of the shape and dtype of the one it replaces (unchecked: the
        caller derives them from the same recipe).  The peers, tags, scratch and persistent
        requests stay.  ``None`` for both lets go of the views (so a cached exchange keeps no
        array of its last call alive); rebind before the next :meth:`start`."""
        if not self.packed or self._active:
            raise RuntimeError("rebind() needs an idle exchange made with packed=True")
        if sends is None and recvs is None:
            self._pack, self._unpack = [], []
            self.sends = [(p, t, None) for p, t, _ in self.sends]
            self.recvs = [(p, t, None) for p, t, _ in self.recvs]
            return self
        self.sends = [(p, t, v) for (p, t, _), v in zip(self.sends, sends)]
        self.recvs = [(p, t, v) for (p, t, _), v in zip(self.recvs, recvs)]
        self._bind_views()
        return self

    def prepare(self) -> "PieceExchange":
        """Make the persistent requests now rather than at the first :meth:`start`."""
        if self.persistent and self._preqs is None:
            self._preqs = self._persistent_requests()
        return self

    @property
    def nbytes_sent(self) -> int:
        return sum(int(v.nbytes) for _, _, v in self.sends)

    def _persistent_requests(self) -> list:
        comm = self.comm
        reqs = [comm.Recv_init(_bytes(v if s is None else s), p, tag)
                for (p, tag, v), s in zip(self.recvs, self._recv_scratch)]
        reqs += [comm.Send_init(_bytes(v if s is None else s), p, tag)
                 for (p, tag, v), s in zip(self.sends, self._send_scratch)]
        return reqs

    def free(self) -> None:
        """Free the persistent requests (also done when the object is collected).  Not while
        an exchange is in flight."""
        if self._active:
            raise RuntimeError("free() while an exchange is in progress")
        reqs, self._preqs = self._preqs, None
        if reqs and not MPI.Is_finalized():
            for r in reqs:
                if r != MPI.REQUEST_NULL:
                    r.Free()

    @staticmethod
    def _drop(recvs, sends) -> None:
        """Release requests a failed wait left in flight: all freed, none cancelled (MPI
        completes freed ones in the background, into buffers that stay with this object, so
        the messages of the failed exchange are consumed by its own requests and cannot
        match the next exchange's)."""
        if MPI.Is_finalized():
            return
        for r in list(recvs) + list(sends):
            try:
                if r != MPI.REQUEST_NULL:
                    r.Free()
            except Exception:  # noqa: BLE001
                pass

    def __del__(self):
        try:
            if not self._active:
                self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown: MPI may be gone
            pass

    def start(self) -> "PieceExchange":
        if self._active:
            raise RuntimeError("exchange already in progress")
        if self.persistent:
            if _profiler._active is None:
                self._pack_pieces()
            else:
                with _profiler.region("pack") if self._pack else _profiler.NULL:
                    self._pack_pieces()
            if self._preqs is None:
                self._preqs = self._persistent_requests()
            if self._preqs:
                MPI.Prequest.Startall(self._preqs)
            self._active = True
            return self
        comm = self.comm
        reqs = []
        for (p, tag, v), s in zip(self.recvs, self._recv_scratch):
            reqs.append(comm.Irecv(_bytes(v if s is None else s), p, tag))
        data = []
        with _profiler.region("pack") if self._pack else _profiler.NULL:
            for (_, _, v), s in zip(self.sends, self._send_scratch):
                if s is None:
                    data.append(v)
                elif self.staged:  # device -> the pinned scratch (no allocation per exchange)
                    self.xp.ascontiguousarray(v).get(out=s)
                    data.append(s)
                else:
                    copy_into(s, v)
                    data.append(s)
            if self.gpu and self.sends:
                self.xp.cuda.get_current_stream().synchronize()
        for (p, tag, _), d in zip(self.sends, data):
            reqs.append(comm.Isend(_bytes(d), p, tag))
        self._keep = data  # alive until the sends complete
        self._reqs = reqs
        self._active = True
        return self

    def finish(self) -> None:
        if not self._active:
            raise RuntimeError("finish() without a matching start()")
        reqs = self._preqs if self.persistent else self._reqs
        try:
            if reqs:
                with waiting(self.comm, "MPI_Waitall (point-to-point exchange)"):
                    MPI.Request.Waitall(reqs)
        except BaseException:
            if self.persistent:  # requests in an unknown state: make new ones next time
                self._preqs = None
                self._drop(reqs[:len(self.recvs)], reqs[len(self.recvs):])
            raise
        finally:
            self._reqs, self._keep, self._active = [], [], False
        if _profiler._active is None:
            self._unpack_received()
        else:
            with _profiler.region("pack", "unpack") if self._unpack else _profiler.NULL:
                self._unpack_received()

    def _pack_pieces(self) -> None:
        if self._packers is not None:
            for f in self._packers:
                f()
            return
        for s, v in self._pack:
            copy_into(s, v)

    def _unpack_received(self) -> None:
        if self.staged:
            for v, s in self._unpack:
                s = self.xp.asarray(s)
                if self.accumulate:
                    v += s
                else:
                    copy_into(v, s)
        elif self.accumulate:
            for v, s in self._unpack:
                v += s
        elif self._unpackers is not None:
            for f in self._unpackers:
                f()
        else:
            for v, s in self._unpack:
                copy_into(v, s)

    def test(self) -> bool:
        """Whether every message of the exchange in flight has completed (``MPI_Testall``:
        non-blocking, drives MPI progress; :meth:`finish` is still due, and unpacks).  ``True``
        when nothing is in flight."""
        reqs = self._preqs if self.persistent else self._reqs
        if not self._active or not reqs:
            return True
        return MPI.Request.Testall(reqs)

    def run(self) -> None:
        """:meth:`start` then :meth:`finish` (for persistent requests in one go, without the
        bookkeeping of a split phase: the per-exchange cost of a small message)."""
        if not self.persistent:
            self.start()
            self.finish()
            return
        if self._active:
            raise RuntimeError("exchange already in progress")
        if _profiler._active is None:
            self._pack_pieces()
        else:
            with _profiler.region("pack") if self._pack else _profiler.NULL:
                self._pack_pieces()
        reqs = self._preqs
        if reqs is None:
            reqs = self._preqs = self._persistent_requests()
        if reqs:
            MPI.Prequest.Startall(reqs)
            try:
                if _watchdog._timeout is None and _profiler._active is None:  # (inlined
                    # what waiting() checks first)
                    MPI.Request.Waitall(reqs)
                else:
                    with waiting(self.comm, "MPI_Waitall (point-to-point exchange)"):
                        MPI.Request.Waitall(reqs)
            except BaseException:
                self._preqs = None
                self._drop(reqs[:len(self.recvs)], reqs[len(self.recvs):])
                raise
        if _profiler._active is None:
            self._unpack_received()
        else:
            with _profiler.region("pack", "unpack") if self._unpack else _profiler.NULL:
                self._unpack_received()
