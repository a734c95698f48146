"""Memory guards: local allocations that fail on one rank only, and the gather limit.

* :func:`allocate` is the one place where the creation functions (``zeros``, ``empty``,
  ``ones``, ``full``, the ``*_like`` forms, ``eye``, ``arange``, ``linspace``, ``from_global``)
  allocate a rank's block.  A block too large for one rank (explicit uneven ``sizes`` that
  give one rank 80 TB, a node with less free memory than its peers) raises ``MemoryError``
  on that rank only; left alone, the other ranks went on into the next collective call and
  met a misleading "rank-dependent branch" error there, or hung.  :func:`allocate` raises a
  ``MemoryError`` that names the rank, the block's shape and dtype and the bytes it asked
  for, and it is always called inside a block that agrees failures across the ranks
  (:func:`disttensor.core.entry.agreed` with ``rank_local=True``, or
  :func:`disttensor.core.comm.collective`): their one all-reduce
  (:func:`disttensor.core.agreement.status_allreduce`) tells every rank that a rank failed,
  and every rank raises the same ``MemoryError``.  Where the creation function's own
  argument-agreement all-reduce is that block, the check costs no message at all.
* :func:`gather_limit` reads ``DISTTENSOR_GATHER_LIMIT`` (bytes; default 1 GiB), the most a
  call may replicate whole on a rank: ``x.to_numpy()``, ``np.asarray(x)``, ``x.gather()``
  and the linear-algebra gather path (:mod:`disttensor.linalg.gather_path`) check it with
  :func:`check_gather_size` before any data moves (metadata only: every rank raises).
"""
from __future__ import annotations

import math
import os

import numpy as np

from . import profiler as _profiler

__all__ = ["allocate", "format_bytes", "gather_limit", "check_gather_size",
           "DEFAULT_GATHER_LIMIT"]

DEFAULT_GATHER_LIMIT = 1 << 30


def format_bytes(n: int) -> str:
    """``n`` bytes in binary units (``'72.8 TiB'``)."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} bytes"  # pragma: no cover


def allocate(shape, dtype, *, xp=np, fill=None, rank: int | None = None, call: str = ""):
    """A new local array of ``shape`` and ``dtype`` from the array module ``xp``
    (``fill``: ``None`` uninitialised, else filled with that value).

    Local (no communication): on failure it raises ``MemoryError`` naming ``call``, ``rank``,
    the shape, the dtype and the bytes asked for.  Call it inside a block that agrees
    failures across the ranks (see the module docstring) so that every rank raises."""
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    if _profiler._active is not None:
        with _profiler.region("alloc"):
            return _allocate(shape, dtype, xp, fill, rank, call)
    return _allocate(shape, dtype, xp, fill, rank, call)


def _allocate(shape, dtype, xp, fill, rank, call):
    try:
        if fill is None:
            return xp.empty(shape, dtype=dtype)
        if isinstance(fill, (int, float)) and fill == 0:
            return xp.zeros(shape, dtype=dtype)
        return xp.full(shape, fill, dtype=dtype)
    except MemoryError as err:
        nbytes = math.prod(shape) * dtype.itemsize
        who = "this rank" if rank is None else f"rank {rank}"
        raise MemoryError(
            f"{call + ': ' if call else ''}{who} cannot allocate its block of shape {shape} "
            f"and dtype {dtype} ({format_bytes(nbytes)}, {nbytes} bytes): {err}") from err


def gather_limit() -> int:
    """Bytes a call may replicate whole on a rank (``DISTTENSOR_GATHER_LIMIT``, read at each
    call; unset or empty: 1 GiB; a float such as ``2e9`` is accepted)."""
    v = os.environ.get("DISTTENSOR_GATHER_LIMIT")
    return DEFAULT_GATHER_LIMIT if not v else int(float(v))


def check_gather_size(call: str, *xs, what: str = "the gather path would replicate",
                      where: str = "on every rank") -> None:
    """``ValueError`` when the DistArrays ``xs`` together exceed :func:`gather_limit` bytes
    (call it inside ``agreed``: it reads agreed metadata only, so every rank raises)."""
    total = sum(x.nbytes for x in xs)
    lim = gather_limit()
    if total > lim:
        raise ValueError(f"{call}: {what} {total} bytes {where}, more than "
                         f"DISTTENSOR_GATHER_LIMIT={lim} bytes (raise the variable, or "
                         "reduce or slice the array first)")


# glibc keeps freed blocks below 32 MiB for reuse instead of trimming and remapping them
# every training step (core/malloc_tuning.py; DISTTENSOR_MALLOC_TUNING=off leaves it alone)
from . import malloc_tuning as _malloc_tuning  # noqa: E402

_malloc_tuning.tune_malloc()
