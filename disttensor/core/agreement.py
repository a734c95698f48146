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

``DISTTENSOR_DEBUG=1`` (read at import) turns on the heavier checks for debugging sessions:
the digest cache is off, replicated arrays are compared by value (a digest of their bytes)
rather than by shape and dtype, and :func:`disttensor.nn.parallel.check_replicas` compares
every value.  :func:`disabled` switches agreement off inside a block (benchmarks measure its
cost with it; it is not meant for production: mismatches then hang again).
"""
from __future__ import annotations

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
           "DEBUG", "enabled", "disabled", "current_call", "describe"]

DEBUG = os.environ.get("DISTTENSOR_DEBUG", "0").lower() not in ("", "0", "false", "no")

_state = threading.local()
_ADDRESS = re.compile(r"at 0x[0-9a-fA-F]+")


class ArgumentMismatchError(ValueError):
    """Raised on every rank when the ranks of a collective call passed different metadata
    arguments (or reached different collective calls)."""


def enabled() -> bool:
    """Whether argument agreement is on (it is, unless inside :func:`disabled`)."""
    return getattr(_state, "enabled", True)


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


def token(value):
    """A hashable, rank-independent description of ``value`` for agreement: equal on two ranks
    exactly when the two values count as the same argument of a collective call.

    Fast paths: ints, strings and ``None`` are their own tokens; a DistArray's token (its
    metadata never changes: distribution, grid shape, halo, dtype and device are fixed at
    construction) is computed once and kept on the array."""
    t = type(value)
    if t is int or t is str or value is None:
        return value
    if t is (_DistArray or _distarray_type()):
        tok = value.__dict__.get("_agreement_token")
        if tok is None:
            tok = value.__dict__["_agreement_token"] = (
                "DistArray", value.distribution, value.grid.dims, value.halo, value.dtype.str,
                value.device)
        return tok
    if isinstance(value, bool):
        return ("bool", value)  # not True == 1: the digest cache would merge them
    if value is None or isinstance(value, (int, str, bytes)):
        return value
    if isinstance(value, float):
        return ("float", repr(value))  # exact; -0.0 != 0.0 and nan == nan, as for a repr
    from .array import DistArray
    if isinstance(value, DistArray):
        return ("DistArray", value.distribution, value.grid.dims, value.halo,
                value.dtype.str, value.device)
    from .distribution import Distribution
    if isinstance(value, Distribution):
        return value
    from .grid import ProcessGrid
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
    return getattr(_state, "call", None)


def describe(value, limit: int = 160) -> str:
    """Short readable form of an argument for messages."""
    from .array import DistArray
    if isinstance(value, DistArray):
        d = value.distribution
        sizes = tuple(None if d.split[t] is None else
                      tuple(b - a for a, b in zip(d.offsets[t][:-1], d.offsets[t][1:]))
                      for t in range(d.ndim))
        s = (f"DistArray(shape={d.shape}, dtype={value.dtype}, split={d.split}, "
             f"sizes={sizes}, grid={value.grid.dims}, halo={value.halo}, "
             f"device={value.device!r})")
    elif hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic):
        t = _array_token(value)
        s = f"array(shape={t[1]}, dtype={np.dtype(t[2])}" + (f", digest={t[3][:12]})" if DEBUG
                                                              else ")")
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


def mismatch_error(comm: MPI.Comm, call: str, args: dict) -> ArgumentMismatchError:
    """Collective (all-gather of the readable arguments): the error every rank raises when the
    digests of a call differed."""
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
            {k: repr(token(v)) for k, v in mine.items()})
    everyone = comm.allgather(mine)
    calls = [c for c, _, _ in everyone]
    if len(set(calls)) > 1:
        by_rank = ", ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
        return ArgumentMismatchError(
            f"the ranks of a communicator reached different collective calls ({by_rank}): "
            "a rank-dependent branch skips or adds a collective call")
    names = list(dict.fromkeys(k for _, shown, _ in everyone for k in shown))
    parts = []
    for k in names:
        toks = [t.get(k, "<missing>") for _, _, t in everyone]
        if len(set(toks)) > 1:
            vals = ", ".join(f"rank {r}: {shown.get(k, '<missing>')}"
                             for r, (_, shown, _) in enumerate(everyone))
            parts.append(f"{k!r} ({vals})")
    detail = "; ".join(parts) if parts else "(the digests differ but no argument does)"
    return ArgumentMismatchError(
        f"{call}: arguments differ between ranks, they must be the same on every rank of the "
        f"communicator: {detail}")


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
    every rank called ``call`` with equal ``args`` (compared through :func:`token`).  One
    small all-reduce; nothing on one rank or when agreement is :func:`disabled`."""
    if comm is None or comm.size == 1:
        return
    dig = enter(call, args)
    if dig is None:
        return
    _, differ = status_allreduce(comm, False, dig)
    if differ:
        raise mismatch_error(comm, call, args)
