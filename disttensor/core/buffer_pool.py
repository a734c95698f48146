"""A size-class pool of host buffers that op outputs and gradients are taken from, so that a
steady training step reuses the memory of the previous step instead of asking the C library
for fresh pages (and faulting them in) every time.

Contract
--------
:meth:`BufferPool.empty` returns an uninitialised C-contiguous NumPy array of the asked shape
and dtype, exactly as ``np.empty`` would, except that its memory is a *view* of one of the
pool's buffers (``out.base`` is that buffer, ``out.flags.owndata`` is False).  A buffer is
handed out again only when **nothing outside the pool references it**: the pool checks
``sys.getrefcount`` of the buffer, and every NumPy view of a view keeps the buffer itself
alive (NumPy collapses ``base`` to the array that owns the memory), as do memoryviews, MPI
requests and arrays made by ``np.frombuffer`` over it.  So an array returned to a caller is
never overwritten while the caller (or anything derived from it) still holds it: the rule
that makes the pool invisible to NumPy and PyTorch semantics.  Memory a caller reaches only
through a raw pointer (``ctypes`` addresses) is not protected, as with any allocator.

Sizes are rounded up to a class (powers of two split in four: at most 25% more than asked);
requests below ``min_bytes`` go straight to ``np.empty``.  The shared pool :data:`POOL`
takes only what glibc would map afresh on each use: 32 MiB and more where the malloc settings
of :mod:`disttensor.core.malloc_tuning` are in force (smaller blocks are then reused from the
heap at no cost, and measured, pooling them as well made steps fault more, not less), 256 KiB
and more where they are not.  The pool holds at most ``limit_bytes``: a request that would
pass it first drops idle buffers of other classes, then, if that is not enough, is served by
``np.empty`` outside the pool.  :meth:`BufferPool.release` drops every idle buffer.  Host
(NumPy) memory only: CuPy arrays have CuPy's own memory pool.

Below ``min_bytes``, :func:`empty` takes arrays from :data:`SMALL`, a :class:`Recycler`:
the same rule keyed by exact shape and dtype (a steady step asks for the same few shapes every
time; a lookup costs about what ``np.empty`` does), so that a steady training step allocates
(almost) no NumPy memory at all (``disttensor.testing.allocations`` counts it).

Settings (read once, when :data:`POOL` is made):
``DISTTENSOR_BUFFER_POOL`` ``on`` (default) / ``off`` (every request is a plain ``np.empty``);
``DISTTENSOR_BUFFER_POOL_LIMIT`` bytes (default 2 GiB, floats such as ``4e9`` accepted);
``DISTTENSOR_BUFFER_POOL_MIN`` bytes, the smallest request pooled (default above);
``DISTTENSOR_BUFFER_POOL_SMALL_LIMIT`` bytes :data:`SMALL` keeps at most (default 256 MiB).

Local (no MPI); thread-safe (one lock around the search of a class).
"""
from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np

from . import malloc_tuning as _malloc_tuning

__all__ = ["BufferPool", "POOL", "SMALL", "empty", "zeros", "copy", "size_class", "DEFAULT_LIMIT",
           "DEFAULT_MIN_BYTES", "DEFAULT_SMALL_LIMIT", "Recycler"]

DEFAULT_LIMIT = 2 << 30
DEFAULT_MIN_BYTES = 256 << 10
DEFAULT_SMALL_LIMIT = 256 << 20


def _idle_positions(bufs: list, idle: int) -> list[int]:
    """Positions in ``bufs`` of the buffers nothing outside ``bufs`` references (``idle``:
    what ``sys.getrefcount`` reads here for such a buffer)."""
    return [i for i, b in enumerate(bufs) if sys.getrefcount(b) == idle]


def _first_idle(bufs: list, idle: int):
    for b in bufs:
        if sys.getrefcount(b) == idle:
            return b
    return None


def _calibrate() -> tuple[int, int]:
    """What ``sys.getrefcount`` reads for an otherwise unreferenced buffer inside
    :func:`_first_idle` and :func:`_idle_positions` (the list, the loop variable, the call's
    argument: 3 on CPython 3.11).  Measured on a probe through the two functions themselves,
    so an interpreter that counts loop references differently still never hands out a
    referenced buffer."""
    probe = [np.empty(1, dtype=np.uint8)]
    first = next(k for k in range(1, 16) if _first_idle(probe, k) is not None)
    positions = next(k for k in range(1, 16) if _idle_positions(probe, k) == [0])
    return first, positions


_IDLE_FIRST, _IDLE_POSITIONS = _calibrate()


def size_class(nbytes: int) -> int:
    """The buffer size (bytes) that serves a request of ``nbytes``: the smallest of
    ``2**k * (4 + j) / 4`` (``j`` in 0..3) that holds it.  Pure; ``size_class(n) >= n`` and
    ``size_class(n) < 1.25 n + 4`` for ``n >= 1``."""
    n = int(nbytes)
    if n <= 4:
        return max(n, 1)
    k = (n - 1).bit_length() - 3       # 2**(k+2) < n <= 2**(k+3)
    step = 1 << k                      # a quarter of the power of two below n
    return -(-n // step) * step


class BufferPool:
    """Reusable host buffers by size class (module docstring for the contract)."""

    def __init__(self, *, limit_bytes: int = DEFAULT_LIMIT,
                 min_bytes: int = DEFAULT_MIN_BYTES, enabled: bool = True):
        self.limit_bytes = int(limit_bytes)
        self.min_bytes = int(min_bytes)
        self.enabled = bool(enabled)
        self._classes: dict[int, list[np.ndarray]] = {}
        self._held = 0                  # bytes of every buffer the pool holds
        self._lock = threading.Lock()
        self.hits = 0                   # requests served by a buffer handed out before
        self.misses = 0                 # requests that made a new pooled buffer

    def empty(self, shape, dtype=np.float64) -> np.ndarray:
        """An uninitialised C-contiguous array like ``np.empty(shape, dtype)``, backed by a
        pooled buffer when it is at least ``min_bytes`` (see the module docstring)."""
        dtype = np.dtype(dtype)
        try:                            # (the common case, a tuple of ints, costs least)
            nbytes = math.prod(shape) * dtype.itemsize
        except TypeError:
            shape = (int(shape),)
            nbytes = shape[0] * dtype.itemsize
        if nbytes < self.min_bytes or not self.enabled or dtype.hasobject:
            return np.empty(shape, dtype=dtype)
        shape = tuple(int(s) for s in shape)
        cls = size_class(nbytes)
        buf = self._take(cls)
        if buf is None:
            return np.empty(shape, dtype=dtype)
        return buf[:nbytes].view(dtype).reshape(shape)

    def empty_like(self, a) -> np.ndarray:
        """``empty(a.shape, a.dtype)`` (C order)."""
        return self.empty(a.shape, a.dtype)

    def _take(self, cls: int):
        with self._lock:
            bufs = self._classes.get(cls)
            if bufs is None:
                bufs = self._classes[cls] = []
            b = _first_idle(bufs, _IDLE_FIRST)
            if b is not None:
                self.hits += 1
                return b
            if self._held + cls > self.limit_bytes:
                self._drop_idle(keep=cls)
                if self._held + cls > self.limit_bytes:
                    return None
            try:
                b = np.empty(cls, dtype=np.uint8)
            except MemoryError:
                self._drop_idle(keep=None)
                return None
            bufs.append(b)
            self._held += cls
            self.misses += 1
            return b

    def _drop_idle(self, keep) -> None:
        """Forget the idle buffers of every class but ``keep`` (lock held)."""
        for cls, bufs in self._classes.items():
            if cls == keep:
                continue
            idle = set(_idle_positions(bufs, _IDLE_POSITIONS))
            self._held -= cls * len(idle)
            bufs[:] = [b for i, b in enumerate(bufs) if i not in idle]

    def release(self) -> None:
        """Drop every idle buffer (buffers still referenced stay until their arrays go)."""
        with self._lock:
            self._drop_idle(keep=None)

    def held_bytes(self) -> int:
        """Bytes of the buffers the pool holds (idle or handed out)."""
        return self._held

    def idle_bytes(self) -> int:
        """Bytes of the pool's buffers that nothing else references now."""
        with self._lock:
            return sum(cls * len(_idle_positions(bufs, _IDLE_POSITIONS))
                       for cls, bufs in self._classes.items())


class Recycler:
    """Arrays of exactly one shape and dtype each, handed out again once nothing references
    them: the rule of :class:`BufferPool` without its size classes, for the outputs and
    temporaries below the pool's ``min_bytes`` that a steady training step makes again and
    again with the same shapes (activations, gradients, dense-layer products, bucket copies),
    where glibc would serve them from its heap anyway and a size-class search would cost more
    than the allocation.

    :meth:`empty` returns a view (``out.base`` is the kept array) of an idle kept array of
    that shape and dtype, else a new array, kept while the recycler holds fewer than
    ``per_key`` of that shape and dtype, fewer than ``max_keys`` shapes and fewer than
    ``limit_bytes`` in all (when full, the arrays nothing references are forgotten first).
    An array a caller (or anything derived from it) still holds is never handed out again.  Requests of the pool's ``min_bytes`` and more go to :data:`POOL`;
    with the pool off (``DISTTENSOR_BUFFER_POOL=off``) every request is a plain ``np.empty``.
    NumPy only; thread-safe (one lock)."""

    __slots__ = ("_arrays", "_lock", "per_key", "max_keys", "limit_bytes", "_held")

    def __init__(self, per_key: int = 2, max_keys: int = 16, limit_bytes: int = 64 << 20):
        self._arrays: dict = {}
        self._lock = threading.Lock()
        self.per_key, self.max_keys = int(per_key), int(max_keys)
        self.limit_bytes, self._held = int(limit_bytes), 0

    def empty(self, shape: tuple, dtype) -> np.ndarray:
        """Like ``np.empty(shape, dtype)`` (``shape`` a tuple of ints, ``dtype`` a
        ``np.dtype``), reusing an idle kept array."""
        if not POOL.enabled:
            return np.empty(shape, dtype)
        lock = self._lock
        lock.acquire()
        try:
            return self._take(shape, dtype)
        finally:
            lock.release()

    def _take(self, shape, dtype, make=None) -> np.ndarray:
        key = (shape, dtype)
        kept = self._arrays.get(key)
        if kept is not None:
            for a in kept:
                if sys.getrefcount(a) == _IDLE_RECYCLED:
                    return a[...]
        # (a plain np.empty below the pool's min_bytes, a view of a pooled buffer from it)
        a = POOL.empty(shape, dtype) if make is None else make(shape, dtype)
        if a.base is not None or len(kept or ()) >= self.per_key:
            return a
        if self._held + a.nbytes > self.limit_bytes or \
                (kept is None and len(self._arrays) >= self.max_keys):
            self._drop_idle()           # full: forget what nothing uses now, then try again
            kept = self._arrays.get(key)
            if self._held + a.nbytes > self.limit_bytes or \
                    (kept is None and len(self._arrays) >= self.max_keys):
                return a
        if kept is None:
            kept = self._arrays[key] = []
        kept.append(a)
        self._held += a.nbytes
        return a[...]

    def _drop_idle(self) -> None:
        """Forget every kept array nothing references (lock held)."""
        for key in list(self._arrays):
            kept = self._arrays[key]
            busy = [a for a in kept if sys.getrefcount(a) > _IDLE_DROP]
            self._held -= sum(a.nbytes for a in kept) - sum(a.nbytes for a in busy)
            if busy:
                self._arrays[key] = busy
            else:
                del self._arrays[key]

    def held_bytes(self) -> int:
        """Bytes of the arrays kept (idle or handed out)."""
        return self._held

    def clear(self) -> None:
        """Forget every kept array (those still referenced live on with their holders)."""
        with self._lock:
            self._arrays.clear()
            self._held = 0


def _calibrate_recycler() -> int:
    """What ``sys.getrefcount`` reads inside :meth:`Recycler._take` for a kept array nothing
    else references (measured through the method itself, as :func:`_calibrate`)."""
    global _IDLE_RECYCLED
    r = Recycler(per_key=1)
    u8 = np.dtype(np.uint8)
    for k in range(1, 16):
        _IDLE_RECYCLED = k
        r.clear()
        first = r._take((1,), u8, np.empty)
        base = id(first.base)           # (an id: a reference would change the count)
        del first
        again = r._take((1,), u8, np.empty)
        if id(again.base) == base:
            held = r._take((1,), u8, np.empty)    # ``again`` holds it: must be fresh
            if id(held.base) != base:
                return k
    raise RuntimeError("buffer_pool: cannot calibrate the recycler's reference count")


def _calibrate_drop() -> int:
    """What ``sys.getrefcount`` reads inside :meth:`Recycler._drop_idle`'s scan for a kept
    array nothing else references."""
    global _IDLE_DROP
    for k in range(1, 16):
        _IDLE_DROP = k
        r = Recycler(per_key=2)
        held = r._take((2,), np.dtype(np.uint8), np.empty)
        r._take((2,), np.dtype(np.uint8), np.empty)      # dropped at once: idle
        r._drop_idle()
        if len(r._arrays.get(((2,), np.dtype(np.uint8)), ())) == 1:
            del held
            return k
    raise RuntimeError("buffer_pool: cannot calibrate the recycler's reference count")


_IDLE_RECYCLED = _IDLE_DROP = 0


def _limit_from_env() -> int:
    v = os.environ.get("DISTTENSOR_BUFFER_POOL_LIMIT")
    return DEFAULT_LIMIT if not v else int(float(v))


def _small_limit_from_env() -> int:
    v = os.environ.get("DISTTENSOR_BUFFER_POOL_SMALL_LIMIT")
    return DEFAULT_SMALL_LIMIT if not v else int(float(v))


def _min_from_env() -> int:
    v = os.environ.get("DISTTENSOR_BUFFER_POOL_MIN")
    if v:
        return int(float(v))
    tuned = _malloc_tuning.tune_malloc() == "applied"
    return _malloc_tuning.MMAP_BYTES if tuned else DEFAULT_MIN_BYTES


def _enabled_from_env() -> bool:
    v = os.environ.get("DISTTENSOR_BUFFER_POOL", "on").strip().lower()
    if v in ("", "on", "1", "true", "yes"):
        return True
    if v in ("off", "0", "false", "no"):
        return False
    raise ValueError(f"DISTTENSOR_BUFFER_POOL must be 'on' or 'off', got {v!r}")


POOL = BufferPool(limit_bytes=_limit_from_env(), min_bytes=_min_from_env(),
                  enabled=_enabled_from_env())


_IDLE_RECYCLED = _calibrate_recycler()
_IDLE_DROP = _calibrate_drop()

SMALL = Recycler(per_key=8, max_keys=1024, limit_bytes=_small_limit_from_env())
"""The shared recycler of the requests below :data:`POOL`'s ``min_bytes``."""


def empty(shape, dtype=np.float64) -> np.ndarray:
    """``np.empty(shape, dtype)`` from the shared pool: :data:`POOL` from its ``min_bytes``
    on, :data:`SMALL` below (a ``shape`` that is not a tuple of ints goes to :data:`POOL`)."""
    if type(shape) is tuple:
        return SMALL.empty(shape, np.dtype(dtype))
    return POOL.empty(shape, dtype)


def copy(a):
    """``a.copy()`` (C order) into an array from the shared pool for a NumPy array; other
    arrays' own ``copy()``; objects without one are returned as they are."""
    if type(a) is np.ndarray:
        out = empty(a.shape, a.dtype)
        np.copyto(out, a)
        return out
    return a.copy() if hasattr(a, "copy") else a


def zeros(shape: tuple, dtype=np.float64) -> np.ndarray:
    """``np.zeros(shape, dtype)`` from the shared pool (:func:`empty`, then filled)."""
    out = empty(shape, dtype)
    out.fill(0)
    return out
