"""Collective argument agreement: every rank of a collective call must pass the same metadata.

The commonest MPI bug in user scripts is an argument that differs between ranks (a
rank-dependent branch, a different file list or configuration).  Left alone it hangs (one rank
waits for a message its peer never sends), ends in an MPI error on one rank while the others
wait, or computes garbage silently (inconsistent global metadata).  So every collective entry
point of the library states its metadata arguments (shapes, dtypes, distributions, op
hyper-parameters, file paths, dataset names, the name of the call itself) and the ranks agree
on them *before any data moves*:

* each rank reduces the arguments to a 128-bit digest of a canonical description
  (:func:`token`: a DistArray is its distribution, grid, halo, dtype and device; a replicated
  array its shape and dtype; numbers, strings, tuples and dicts as themselves);
* one all-reduce (``MPI_MAX`` of five int64: a failure flag, the digest and its bitwise
  complement, so the maximum and the minimum digest come back together) tells every rank
  whether the digests are all equal and whether any rank failed validating its arguments.
  This is the all-reduce :func:`disttensor.core.comm.collective` already makes to agree on failure,
  so where an entry point validates inside a ``collective`` block the agreement costs nothing
  more; elsewhere it is one small all-reduce;
* on a mismatch (only then) the readable arguments are all-gathered and every rank raises the
  same :class:`ArgumentMismatchError` naming the call, each differing argument and its value
  on every rank.  Ranks that reached *different* collective calls (a rank-dependent branch
  that skips one) meet in the same all-reduce and get an error naming both calls.

Cost: digests are cached (a training step repeats the same calls with the same metadata, so
hashing is a dictionary lookup), and the all-reduce is a few microseconds on shared memory.
The all-reduce itself is never skipped: whether another rank's arguments match cannot be known
without communicating, and a rank that skipped while another did not would hang.

Deferred agreement of calls that move no data
---------------------------------------------
An elementwise call whose DistArray operands all share one layout (and whose other operands
are scalars) moves no data: each rank computes on its own block.  Agreeing it at once would
cost an all-reduce (tens of microseconds on a loaded machine) for a call that takes one.  So on
more than one rank such a call is not agreed when it runs; it is recorded with
:func:`defer`: its canonical description (the call's name and the tokens of its operands, as
for an agreed call) is folded into a rolling 127-bit digest kept per communicator, and the last
64 descriptions are kept for the error message.  The next agreement over the *same*
communicator (:func:`disttensor.core.entry.agreed` of any entry point, :func:`agree`,
:func:`settle`) takes the pending record and agrees it together with its own arguments, in its
one all-reduce.  How the guarantee "no rank moves data on arguments the other ranks did not
get" holds:

* a deferred call moves no data, by construction: the decision to defer is made per rank from
  the operands' layouts, and any call that redistributes, or whose operands are not all of one
  layout, is agreed at once;
* every call that moves data over a communicator is agreed first (the library's rule), and that
  agreement includes every call deferred over the same communicator since the previous
  agreement, in order: ranks whose deferred calls differed (another function, another operand
  layout or dtype, another scalar type, one call more or less) raise
  :class:`ArgumentMismatchError` on every rank before that data moves, naming the first
  differing call and its arguments;
* a rank that deferred a call while another agreed it at once (its operand needed a
  redistribution there: a layout that differs between ranks) meets the other in its next
  agreement: the digests differ and both raise, before the redistribution moves data;
* a result computed from a deferred call carries its metadata into the calls that use it,
  which agree it as their own operand, so inconsistent metadata is caught there even when it
  is used over another communicator;
* a deferred call that raises on one rank (a dtype it does not support) is retried as an
  agreed call, so the error (or the mismatch behind it) is raised on every rank.

The cost of a deferred call is one dictionary look-up and some integer arithmetic; the
mismatch is raised at the next communicating call rather than at the call that caused it
(the message names both).  ``DISTTENSOR_AGREEMENT=eager`` (read at import), the block
:func:`eager`, or ``DISTTENSOR_DEBUG=1`` agree every call at once, to stop at the first
differing call; :func:`settle` agrees the pending calls now (one all-reduce).

``DISTTENSOR_DEBUG=1`` (read at import) turns on the heavier checks for debugging sessions:
the digest cache is off, replicated arrays are compared by value (a digest of their bytes)
rather than by shape and dtype, and :func:`disttensor.nn.replicas.check_replicas` compares
every value.  :func:`disabled` switches agreement off inside a block (benchmarks measure its
cost with it; it is not meant for production: mismatches then hang again).
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import re
import threading
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from . import watchdog as _watchdog

__all__ = ["ArgumentMismatchError", "agree", "token", "digest", "status_allreduce",
           "DEBUG", "enabled", "disabled", "current_call", "describe", "deferring", "eager",
           "defer", "take_pending", "settle", "EAGER"]

DEBUG = os.environ.get("DISTTENSOR_DEBUG", "0").lower() not in ("", "0", "false", "no")
#: every call agreed at once (no deferred agreement): DISTTENSOR_AGREEMENT=eager or debugging
EAGER = DEBUG or os.environ.get("DISTTENSOR_AGREEMENT", "deferred").lower() == "eager"

class _State(threading.local):
    """This thread's agreement state; the class attributes are the defaults (a plain attribute
    read, cheaper than ``getattr`` with a default on every deferred call)."""
    enabled = True       # agreement on (off inside :func:`disabled`)
    eager = EAGER        # every call agreed at once (:func:`eager`)
    pending = None       # id(comm) -> PendingCalls
    call = None          # (call, args) of the collective call entered last


_state = _State()
_ADDRESS = re.compile(r"at 0x[0-9a-fA-F]+")


class ArgumentMismatchError(ValueError):
    """Raised on every rank when the ranks of a collective call passed different metadata
    arguments (or reached different collective calls)."""


def enabled() -> bool:
    """Whether argument agreement is on (it is, unless inside :func:`disabled`)."""
    return _state.enabled


@contextlib.contextmanager
def disabled():
    """Switch argument agreement off in this thread for the block (for measuring its cost;
    every rank must do the same)."""
    prev = enabled()
    _state.enabled = False
    try:
        yield
    finally:
        _state.enabled = prev


def deferring() -> bool:
    """Whether calls that move no data may defer their agreement (see the module docstring):
    agreement is on and neither :data:`EAGER` nor an :func:`eager` block asks for each call
    to be agreed at once."""
    st = _state
    return st.enabled and not st.eager


@contextlib.contextmanager
def eager():
    """Agree every call at once in this thread for the block (no deferred agreement), as
    ``DISTTENSOR_AGREEMENT=eager`` does for the whole run: a rank-dependent argument then
    raises at the call that takes it.  Every rank must do the same."""
    prev = _state.eager
    _state.eager = True
    try:
        yield
    finally:
        _state.eager = prev


# -- canonical descriptions ----------------------------------------------------------------------
def _array_token(a) -> tuple:
    shape, dtype = tuple(int(n) for n in a.shape), np.dtype(a.dtype).str
    if not DEBUG:
        return ("array", shape, dtype)
    from .backend import to_host
    host = np.ascontiguousarray(to_host(a))
    return ("array", shape, dtype, hashlib.blake2b(host.view(np.uint8).reshape(-1),
                                                   digest_size=16).hexdigest())


_DistArray = None  # disttensor.core.array.DistArray, resolved on first use (import cycle)


def _distarray_type():
    global _DistArray
    if _DistArray is None:
        from .array import DistArray
        _DistArray = DistArray
    return _DistArray


_LATE_TYPES = None  # (DistArray, Distribution, ProcessGrid), resolved on first use


def _late_types() -> tuple:
    """The core classes :func:`token` tells apart, imported once (an import statement in
    :func:`token` itself cost ~1 us per argument and nesting level: a call's digest went
    through it a dozen times)."""
    global _LATE_TYPES
    if _LATE_TYPES is None:
        from .array import DistArray
        from .distribution import Distribution
        from .grid import ProcessGrid
        _LATE_TYPES = (DistArray, Distribution, ProcessGrid)
    return _LATE_TYPES


def token(value):
    """A hashable, rank-independent description of ``value`` for agreement: equal on two ranks
    exactly when the two values count as the same argument of a collective call.

    Fast paths: ints, strings and ``None`` are their own tokens; a DistArray's token (its
    metadata never changes: distribution, grid shape, halo, dtype and device are fixed at
    construction) is computed once and kept on the array."""
    t = type(value)
    if t is int or t is str or value is None:
        return value
    if t is float:
        return ("float", repr(value))  # exact; -0.0 != 0.0 and nan == nan, as for a repr
    if t is (_DistArray or _distarray_type()):
        tok = value.__dict__.get("_agreement_token")
        if tok is None:
            tok = value.__dict__["_agreement_token"] = (
                "DistArray", value.distribution, value.grid.dims, value.halo, value.dtype.str,
                value.device)
        return tok
    if t is PendingCalls:
        return ("deferred calls", value.count, value.rolling)
    if isinstance(value, bool):
        return ("bool", value)  # not True == 1: the digest cache would merge them
    if value is None or isinstance(value, (int, str, bytes)):
        return value
    if isinstance(value, float):
        return ("float", repr(value))  # exact; -0.0 != 0.0 and nan == nan, as for a repr
    if t is tuple or t is list:  # (a shape, axes, a geometry: ints are their own tokens)
        return (t.__name__,) + (tuple(value) if all(type(v) is int for v in value)
                                else tuple(token(v) for v in value))
    DistArray, Distribution, ProcessGrid = _LATE_TYPES or _late_types()
    if isinstance(value, DistArray):
        return ("DistArray", value.distribution, value.grid.dims, value.halo,
                value.dtype.str, value.device)
    if isinstance(value, Distribution):
        return value
    if isinstance(value, ProcessGrid):
        return ("ProcessGrid", value.dims, value.periods)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(token(v) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple(sorted(((repr(k), token(v)) for k, v in value.items())))
    if isinstance(value, (set, frozenset)):
        return ("set",) + tuple(sorted(repr(token(v)) for v in value))
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return ("dtype", np.dtype(value).str)
    if isinstance(value, np.generic):
        return token(value.item())
    if isinstance(value, slice):
        return ("slice", token(value.start), token(value.stop), token(value.step))
    if value is Ellipsis:
        return "..."
    if isinstance(value, os.PathLike):
        return ("path", os.fspath(value))
    if hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "__len__"):
        return _array_token(value)  # NumPy / CuPy arrays (replicated values)
    if callable(value):
        return ("callable", getattr(value, "__module__", ""), getattr(value, "__qualname__",
                                                                       repr(value)))
    # a default repr carries the object's address, which differs between processes
    return (type(value).__qualname__, _ADDRESS.sub("at 0x?", repr(value)))


def _digest_of(tokens) -> tuple[int, int]:
    h = hashlib.blake2b(repr(tokens).encode(), digest_size=16).digest()
    a, b = np.frombuffer(h, dtype=np.int64)
    return int(a), int(b)


_digest_cached = lru_cache(maxsize=4096)(_digest_of)


def digest(call: str, args: dict) -> tuple[int, int]:
    """128-bit digest (two int64) of a call name and its arguments' tokens."""
    tokens = (call, tuple((k, token(v)) for k, v in args.items()))
    if DEBUG:
        return _digest_of(tokens)
    try:
        return _digest_cached(tokens)
    except TypeError:  # an unhashable token (cannot happen for the types above; be safe)
        return _digest_of(tokens)


# -- what this thread is in (for error messages and the watchdog) ----------------------------------
def current_call():
    """``(call, args)`` of the collective call this thread entered last (or ``None``)."""
    return _state.call


def _describe_distarray(d, dtype, grid_dims, halo, device) -> str:
    sizes = tuple(None if d.split[t] is None else
                  tuple(b - a for a, b in zip(d.offsets[t][:-1], d.offsets[t][1:]))
                  for t in range(d.ndim))
    return (f"DistArray(shape={d.shape}, dtype={np.dtype(dtype)}, split={d.split}, "
            f"sizes={sizes}, grid={grid_dims}, halo={halo}, device={device!r})")


def describe_token(tok, limit: int = 400) -> str:
    """Readable form of an argument known only by its :func:`token` (a deferred call's)."""
    if isinstance(tok, tuple) and len(tok) == 6 and tok[0] == "DistArray":
        s = _describe_distarray(tok[1], tok[4], tok[2], tok[3], tok[5])
    elif isinstance(tok, tuple) and len(tok) == 2 and tok[0] == "scalar":
        s = f"{tok[1]} scalar"
    else:
        s = repr(tok)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def describe(value, limit: int = 160) -> str:
    """Short readable form of an argument for messages."""
    from .array import DistArray
    if isinstance(value, DistArray):
        s = _describe_distarray(value.distribution, value.dtype, value.grid.dims, value.halo,
                                value.device)
    elif hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic):
        t = _array_token(value)
        s = f"array(shape={t[1]}, dtype={np.dtype(t[2])}" + (f", digest={t[3][:12]})" if DEBUG
                                                              else ")")
    elif isinstance(value, (list, tuple)) and any(isinstance(v, DistArray) for v in value):
        # (a DistArray's repr shows its values: describe the elements instead)
        s = ", ".join(describe(v, limit) for v in value)
        s = f"[{s}]" if isinstance(value, list) else f"({s}{',' if len(value) == 1 else ''})"
    else:
        s = repr(value)
    return s if len(s) <= limit else s[:limit - 3] + "..."


# -- the all-reduce ----------------------------------------------------------------------------------
def status_allreduce(comm: MPI.Comm, failed: bool, dig: tuple[int, int] | None
                     ) -> tuple[bool, bool]:
    """One all-reduce of a failure flag and a digest: returns ``(any rank failed, digests
    differ)``.  ``dig=None`` (no agreement) contributes a fixed digest, so all ranks must pass
    ``None`` alike.  Collective over ``comm``."""
    d0, d1 = (0, 0) if dig is None else dig
    buf = np.array([int(bool(failed)), d0, d1, ~d0, ~d1], dtype=np.int64)
    with _watchdog.waiting(comm, "MPI_Allreduce (argument agreement)"):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
    return bool(buf[0]), not (buf[1] == ~buf[3] and buf[2] == ~buf[4])


# -- deferred agreement (module docstring) -------------------------------------------------------
_P127 = (1 << 127) - 1  # the rolling digest is a polynomial hash modulo this prime
_MULT = 0x5851F42D4C957F2D_9E3779B97F4A7C15 % _P127
_M64 = (1 << 64) - 1
LOG_LENGTH = 64  # deferred calls kept (described) for the error message


class PendingCalls:
    """The calls deferred over one communicator since its last agreement: their number, a
    rolling digest of their descriptions in order, and the last :data:`LOG_LENGTH`
    descriptions ``(call, ((name, token), ...))``.  Passed as an argument of the next agreement
    (its token is ``(count, rolling)``)."""
    __slots__ = ("comm", "count", "rolling", "log")

    def __init__(self, comm):
        self.comm = comm
        self.count = 0
        self.rolling = 0
        self.log = collections.deque(maxlen=LOG_LENGTH)

    def __repr__(self):
        return f"<{self.count} deferred call(s)>"


def _pending_map() -> dict:
    m = _state.pending
    if m is None:
        m = _state.pending = {}
    return m


def defer(comm: MPI.Comm, call: str, tokens: tuple) -> None:
    """Record a call over ``comm`` that moves no data, to be agreed with the next agreement over
    ``comm`` (no message).  ``tokens``: ``((name, token(arg)), ...)``, hashable; every rank
    must describe an equal call equally.  Only where :func:`deferring` is true."""
    m = _state.pending or _pending_map()
    p = m.get(id(comm))
    if p is None or p.comm is not comm:
        p = m[id(comm)] = PendingCalls(comm)
        if not _exit_hook:
            _register_exit_hook()
    entry = (call, tokens)
    try:
        word = _entry_word(entry)
    except TypeError:
        word = _entry_word.__wrapped__(entry)
    p.rolling = (p.rolling * _MULT + word) % _P127
    p.count += 1
    p.log.append(entry)


@lru_cache(maxsize=4096)
def _entry_word(entry) -> int:
    """A deferred call's description as the 128-bit word the rolling digest adds (its
    :func:`digest`, plus one), cached: a step defers the same few calls again and again."""
    a, b = _digest_of(entry)
    return ((a & _M64) << 64 | (b & _M64)) + 1


_exit_hook = False


def _register_exit_hook() -> None:
    global _exit_hook
    import atexit
    atexit.register(_settle_at_exit)  # runs before mpi4py's MPI_Finalize (registered earlier)
    _exit_hook = True


def _settle_at_exit() -> None:
    """At interpreter exit, agree the calls still deferred on this rank (main thread), one
    communicator after the other in the order they were first deferred over.  In a correct
    program every rank holds the same pending calls, so this is one small all-reduce per such
    communicator.  Where a rank instead entered an agreed call that the others deferred (an
    operand laid out differently on one rank only), it waits in that call's all-reduce: this
    is what it meets, so every rank raises ``ArgumentMismatchError`` instead of the job
    hanging in ``MPI_Finalize``."""
    if MPI.Is_finalized():
        return
    m = _state.pending
    for p in list((m or {}).values()):
        if p.comm != MPI.COMM_NULL:
            settle(p.comm)


def take_pending(comm: MPI.Comm) -> PendingCalls | None:
    """Remove and return the calls deferred over ``comm`` (``None`` if there are none): the
    caller agrees them now, as an argument of its agreement."""
    m = _state.pending
    if not m:
        return None
    p = m.get(id(comm))
    if p is None or p.comm is not comm:
        return None
    del m[id(comm)]
    return p


def clear_pending() -> None:
    """Forget every call deferred on this rank, over any communicator (local).  For a fresh
    start after an interrupted sequence of calls (the pytest plugin calls it before each test,
    so a test that failed half-way leaves nothing for the next test's first agreement)."""
    m = _state.pending
    if m:
        m.clear()


def settle(comm: MPI.Comm | None) -> None:
    """Collective over ``comm``: agree the calls deferred over it now (one small all-reduce,
    also when none are pending on this rank: every rank must call it).  Raises
    :class:`ArgumentMismatchError` on every rank if they differed."""
    agree(comm, "settle")


def _pending_rows(p: PendingCalls | None) -> tuple[int, list]:
    """``(count, [(index, call, shown, tokens)])`` of a rank's deferred calls, for messages."""
    if p is None:
        return 0, []
    base = p.count - len(p.log)
    return p.count, [(base + i, c, {k: describe_token(t) for k, t in toks},
                      {k: repr(t) for k, t in toks}) for i, (c, toks) in enumerate(p.log)]


def _deferred_error(everyone, call_of_rank) -> ArgumentMismatchError | None:
    """The error naming the first call (deferred or current) that differs between ranks."""
    seqs, lo = [], 0
    for call, shown, toks, (count, rows) in everyone:
        seq = {i: (c, sh, tk) for i, c, sh, tk in rows}
        seq[count] = (call, shown, toks)
        seqs.append(seq)
        lo = max(lo, rows[0][0] if rows else count)
    hi = max(max(s) for s in seqs)
    for i in range(lo, hi + 1):
        items = [s.get(i) for s in seqs]
        if items[0] is not None and all(it is not None and it[0] == items[0][0]
                                        and it[2] == items[0][2] for it in items):
            continue
        where = ("" if all(i == max(s) for s in seqs) else
                 f" (call {i + 1} since the ranks last agreed: calls that move no data are "
                 f"agreed with the next call that communicates, here {call_of_rank}; "
                 "DISTTENSOR_AGREEMENT=eager agrees each call at once)")
        if any(it is None for it in items) or len({it[0] for it in items}) > 1:
            by_rank = ", ".join(f"rank {r}: {'<none>' if it is None else it[0]}"
                                for r, it in enumerate(items))
            return ArgumentMismatchError(
                f"the ranks of a communicator reached different collective calls ({by_rank}): "
                "a rank-dependent branch skips or adds a collective call" + where)
        return ArgumentMismatchError(_argument_message(items[0][0], [it[1] for it in items],
                                                       [it[2] for it in items]) + where)
    return None


def _argument_message(call: str, shown: list[dict], toks: list[dict]) -> str:
    names = list(dict.fromkeys(k for sh in shown for k in sh))
    parts = []
    for k in names:
        vals = [t.get(k, "<missing>") for t in toks]
        if len(set(vals)) > 1:
            by_rank = ", ".join(f"rank {r}: {sh.get(k, '<missing>')}"
                                for r, sh in enumerate(shown))
            parts.append(f"{k!r} ({by_rank})")
    detail = "; ".join(parts) if parts else "(the digests differ but no argument does)"
    return (f"{call}: arguments differ between ranks, they must be the same on every rank of "
            f"the communicator: {detail}")


def mismatch_error(comm: MPI.Comm, call: str, args: dict, failure: tuple | None = None
                   ) -> BaseException:
    """Collective (all-gather of the readable arguments): the error every rank raises when the
    digests of a call differed.  Where calls were deferred (an argument ``PendingCalls``), the
    first differing call among the deferred ones and this one is named.  ``failure``:
    ``(exception type, message)`` where this rank's rank-local work failed after its call was
    agreed (:func:`disttensor.core.entry.failure_deferred`): then every rank gets that error
    (the lowest such rank's; its ``failed_rank`` attribute names the rank) instead."""
    pending = next((v for v in args.values() if type(v) is PendingCalls), None)
    args = {k: v for k, v in args.items() if type(v) is not PendingCalls}

    def flat(args):  # sequences element-wise, so a long argument list names the item
        out = {}
        for k, v in args.items():
            if isinstance(v, (list, tuple)) and 8 < len(v) <= 256:
                out.update({f"{k}[{i}]": e for i, e in enumerate(v)})
                out[f"len({k})"] = len(v)
            else:
                out[k] = v
        return out
    mine = flat(args)
    mine = (call, {k: describe(v, 400) for k, v in mine.items()},
            {k: repr(token(v)) for k, v in mine.items()}, _pending_rows(pending), failure)
    everyone = comm.allgather(mine)
    failed = [(r, e[4]) for r, e in enumerate(everyone) if len(e) > 4 and e[4] is not None]
    if failed:
        from .comm import _rebuild
        r, (exc_type, msg) = failed[0]
        exc = _rebuild(exc_type, msg if r == comm.rank else f"{msg} (raised on rank {r})")
        exc.failed_rank = r
        return exc
    if any(e[3][0] for e in everyone):
        err = _deferred_error([e[:4] for e in everyone], call)
        if err is not None:
            return err
        return ArgumentMismatchError(
            f"{call}: calls that moved no data differed between ranks more than {LOG_LENGTH} "
            "calls before this one (deferred agreement); run with DISTTENSOR_AGREEMENT=eager "
            "to stop at the first differing call")
    everyone = [e[:3] for e in everyone]
    calls = [c for c, _, _ in everyone]
    if len(set(calls)) > 1:
        by_rank = ", ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
        return ArgumentMismatchError(
            f"the ranks of a communicator reached different collective calls ({by_rank}): "
            "a rank-dependent branch skips or adds a collective call")
    return ArgumentMismatchError(_argument_message(call, [sh for _, sh, _ in everyone],
                                                   [tk for _, _, tk in everyone]))


def enter(call: str, args: dict) -> tuple[int, int] | None:
    """Record ``call`` as this thread's current collective call and return its digest
    (``None`` when agreement is off)."""
    _state.call = (call, args)
    _watchdog.note_call(_state.call)
    if not enabled():
        return None
    return digest(call, args)


def agree(comm: MPI.Comm | None, call: str, /, **args) -> None:
    """Collective over ``comm``: raise :class:`ArgumentMismatchError` on every rank unless
    every rank called ``call`` with equal ``args`` (compared through :func:`token`), and made the
    same calls deferred over ``comm`` since its last agreement.  One small all-reduce; nothing
    on one rank or when agreement is :func:`disabled`."""
    if comm is None or comm.size == 1:
        return
    pending = take_pending(comm) if enabled() else None
    if pending is not None:
        args["calls before"] = pending  # the calls deferred over comm are agreed here
    dig = enter(call, args)
    if dig is None:
        return
    _, differ = status_allreduce(comm, False, dig)
    if differ:
        raise mismatch_error(comm, call, args)
