"""Collective entry points and the keys their arguments are agreed by.

Every public collective function (creation, data movement, reductions, ufuncs, shape
manipulation, indexing, random, linalg, fft, the CNN ops) is decorated with
:func:`collective_entry` and validates its arguments inside an :func:`agreed` block before any
data moves: one small all-reduce makes the ranks agree on the call, its metadata arguments and
any validation failure (:mod:`disttensor.core.agreement`), so an argument that differs between
ranks raises :class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank instead of
hanging.  Entry points called inside another one skip their agreement (their arguments derive
from agreed ones).  The ``*_key`` functions give each kind of argument the canonical form the
ranks compare.
"""
from __future__ import annotations

import functools
import numbers
import threading

import numpy as np

from . import agreement
from .backend import normalize_device
from .comm import collective
from .layout import normalize_halo

__all__ = ["collective_entry", "nested", "depth", "agreed", "deferrable", "failure_deferred",
           "LOCAL_FAILURE", "canon", "dtype_key",
           "halo_key", "split_key",
           "device_key", "operand_key"]

class _Nesting(threading.local):
    depth = 0


_NESTING = _Nesting()


def depth() -> int:
    """How many collective entry points this thread is inside (0: at the user's level)."""
    return _NESTING.depth


def collective_entry(fn):
    """Mark ``fn`` as a collective entry point (its body runs one level deeper): an
    :func:`agreed` block agrees only in the outermost entry point of a thread, so entry points
    that ``fn`` calls with arguments derived from its own (already agreed) ones add no
    all-reduce."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _NESTING.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _NESTING.depth -= 1
    return wrapper


class nested:
    """Run a block as if one entry point deeper (see :func:`collective_entry`): the
    :func:`agreed` blocks inside it skip their argument agreement.  For helpers that an entry
    point calls *after* its own agreed block, with arguments derived from the agreed ones
    (the halo of a window op, say), so that one op call agrees once."""
    __slots__ = ()

    def __enter__(self):
        _NESTING.depth += 1

    def __exit__(self, et, ev, tb):
        _NESTING.depth -= 1
        return False


# The blocks below are context-manager classes rather than generator functions: a training
# step enters some 40 of them, and a generator-based one costs ~2 us more per use.

class agreed:
    """The validation block of a collective entry point ``call`` over ``comm``.

    In the outermost entry point (see :func:`collective_entry`) this is
    ``comm.collective(comm, call, **args)``: one all-reduce agrees ``args`` across the ranks
    (:class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank if they differ) and
    any exception the block raised (raised on every rank), together with the calls deferred
    over ``comm`` since its last agreement (see :mod:`disttensor.core.agreement`: elementwise
    calls that move no data).  Nested in another entry point, or
    with agreement :func:`~disttensor.core.agreement.disabled`, the block runs plainly, since its
    checks depend only on agreed, replicated metadata; with ``rank_local=True`` (checks that
    read rank-local data, such as a local block's shape) failures are still agreed."""
    __slots__ = ("_comm", "_call", "_rank_local", "_args", "_inner")

    def __init__(self, comm, call: str, /, *, rank_local: bool = False, **args):
        self._comm, self._call, self._rank_local, self._args = comm, call, rank_local, args
        self._inner = None

    def __enter__(self):
        comm = self._comm
        if comm is None or comm.size <= 1:
            return
        if _NESTING.depth <= 1 and agreement.enabled():
            args = self._args
            pending = agreement.take_pending(comm)
            if pending is not None:  # calls deferred over comm are agreed with this one
                args["calls before"] = pending
            self._inner = collective(comm, self._call, **args)
        elif self._rank_local:
            self._inner = collective(comm)
        else:
            return
        self._inner.__enter__()

    def __exit__(self, et, ev, tb):
        inner = self._inner
        if inner is None:
            return False
        self._inner = None
        return inner.__exit__(et, ev, tb)


class _DeferringBlock:
    """What :class:`deferrable` and :class:`failure_deferred` share on exit: ``_mode`` None
    (a plain block), ``True`` (deferred: on success the call is recorded with
    :func:`~disttensor.core.agreement.defer`, on an exception this rank agrees at once with
    :meth:`_failure_args`, so the error is raised on every rank) or an inner block to exit."""
    __slots__ = ()

    def _deferred_args(self) -> tuple:
        raise NotImplementedError

    def _failure_args(self) -> dict:
        raise NotImplementedError

    def __exit__(self, et, ev, tb):
        mode, self._mode = self._mode, None
        if mode is None:
            return False
        if mode is not True:
            return mode.__exit__(et, ev, tb)
        if et is None:
            agreement.defer(self._comm, self._call, self._deferred_args())
            return False
        if issubclass(et, Exception):  # raised on every rank by the agreed call
            with agreed(self._comm, self._call, **self._failure_args()):
                raise ev
        return False


class deferrable(_DeferringBlock):
    """The validation block of a collective entry point ``call`` that moves no data (each rank
    computes on its own block; no message, no collective): like :func:`agreed`, but where
    agreement may be deferred (:func:`~disttensor.core.agreement.deferring`, the default on
    more than one rank) ``args`` are not agreed at once: the call's description is recorded
    with :func:`~disttensor.core.agreement.defer` and agreed together with the next agreement
    over ``comm``, which comes before any data moves (see :mod:`disttensor.core.agreement`).
    If the block raises on a rank, that rank agrees the call at once instead (the error, or
    the mismatch behind it, is raised on every rank: the others meet it in their next
    agreement).  Saves one all-reduce per call of a training step's layers that move no data
    (activations with a hyper-parameter, dense layers, flatten on the sample axis, the
    gradient of a reduced loss).  The caller must ensure the call moves no data: the decision
    is taken per rank from the operands' layouts, as for the elementwise calls."""
    __slots__ = ("_comm", "_call", "_args", "_mode")

    def __init__(self, comm, call: str, /, **args):
        self._comm, self._call, self._args = comm, call, args
        self._mode = None  # None: plain block; True: deferred; else the agreed block

    def __enter__(self):
        comm = self._comm
        if comm is None or comm.size <= 1 or _NESTING.depth > 1 or not agreement.enabled():
            self._mode = None
        elif agreement.deferring():
            self._mode = True
        else:
            self._mode = agreed(comm, self._call, **self._args)
            self._mode.__enter__()

    def _deferred_args(self) -> tuple:
        token = agreement.token
        return tuple([(k, token(v)) for k, v in self._args.items()])

    def _failure_args(self) -> dict:
        return self._args


LOCAL_FAILURE = "rank-local failure"
"""Argument name marking the agreement a rank makes at once when rank-local work of an agreed
call failed (:func:`failure_deferred`): the ranks that meet it raise that rank's error."""


class failure_deferred(_DeferringBlock):
    """Rank-local work that an entry point ``call`` runs *after* its agreement (a local kernel
    on data its agreed halo exchange brought): it raises on every rank if it raised on one,
    without the failure-only all-reduce of ``comm.collective(comm)`` where agreement may be
    deferred (:func:`~disttensor.core.agreement.deferring`, the default on more than one
    rank).  On success the work is recorded with :func:`~disttensor.core.agreement.defer`
    (no message); on failure this rank agrees at once, marked :data:`LOCAL_FAILURE`, and the
    others meet it in their next agreement over ``comm`` (which comes before any data moves),
    where every rank raises this rank's error (type and message, as ``collective`` does; the
    lowest such rank's).  Nested in another entry point, or eager, it is
    ``collective(comm)`` (one all-reduce)."""
    __slots__ = ("_comm", "_call", "_mode")

    def __init__(self, comm, call: str, /):
        self._comm, self._call, self._mode = comm, call, None

    def __enter__(self):
        comm = self._comm
        if comm is None or comm.size <= 1:
            self._mode = None
        elif _NESTING.depth > 1 or not agreement.deferring():
            self._mode = collective(comm)
            self._mode.__enter__()
        else:
            self._mode = True

    def _deferred_args(self) -> tuple:
        return ()

    def _failure_args(self) -> dict:
        return {LOCAL_FAILURE: True}


def canon(v):
    """Lists (and small NumPy arrays, which would otherwise compare by shape and dtype only)
    as tuples and NumPy integers as ints, recursively (never raises): two spellings of one
    metadata argument (a shape, split, ownership sizes, axes) agree."""
    if isinstance(v, (list, tuple)):
        return tuple(canon(e) for e in v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.ndarray) and v.size <= 4096 and v.dtype.kind in "biu":
        return canon(v.tolist())
    return v


def dtype_key(dtype, default=None):
    """``np.dtype(dtype)`` (``default`` for ``None``), or ``dtype`` itself if it is not one."""
    if dtype is None and default is None:
        return None
    try:
        return np.dtype(default if dtype is None else dtype)
    except Exception:  # noqa: BLE001 - invalid: agree on the spelling, validation raises
        return dtype


def halo_key(halo, ndim: int):
    try:
        return normalize_halo(halo, ndim)
    except Exception:  # noqa: BLE001
        return canon(halo)


def split_key(split, ndim: int):
    """A single int ``s`` as ``make_distribution`` reads it; sequences as tuples."""
    if isinstance(split, numbers.Integral) and not isinstance(split, bool) \
            and -ndim <= split < ndim:
        s = [None] * ndim
        s[split] = 0
        return tuple(s)
    return canon(split)


def device_key(device):
    try:
        return normalize_device(device)
    except Exception:  # noqa: BLE001
        return device


def operand_key(x):
    """What must agree about an operand: a DistArray's metadata, a NumPy/CuPy array's shape and
    dtype, a scalar's type (its value is data; compared under ``DISTTENSOR_DEBUG``)."""
    if isinstance(x, (bool, int, float, complex)):
        return ("scalar", type(x).__name__, np.asarray(x))
    if isinstance(x, np.generic):
        return ("scalar", np.asarray(x))
    if isinstance(x, list):
        return tuple(operand_key(e) for e in x)
    return x
