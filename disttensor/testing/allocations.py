"""Counting the NumPy data allocations a block of code makes (for tests and benchmarks).

    from disttensor.testing.allocations import numpy_allocations
    with numpy_allocations() as seen:
        step()
    seen.count, seen.nbytes        # data buffers NumPy allocated inside the block
    seen.sites                     # with where=True: {(file:line, ...): bytes}

What is counted: every request for an array's data memory that NumPy makes in this thread
(``np.empty`` and friends, ufunc and reduction outputs, temporaries, copies, 0-d arrays a
Python scalar operand turns into), in bytes asked, whether or not it is freed again inside the
block.  Not counted: Python objects (array headers, views, tuples), memory that Numba
kernels, MPI or BLAS allocate themselves, other threads.  So a block that reuses buffers
(``out=``, pooled arrays, views) counts zero, however its peak memory moved; tracemalloc's
peak, by contrast, sees only the high-water mark of everything Python allocates.

How: a NumPy memory handler (NEP 49, ``PyDataMem_SetHandler``) for the duration of the
block, which forwards to the handler that was in force and counts.  The handler is set in
the current context only (NumPy keeps it in a context variable), and restored on exit;
arrays allocated inside the block are freed later by the forwarded handler's own ``free``
(plain C), so they may outlive the block and the interpreter safely.  Local (no MPI).
"""
from __future__ import annotations

import ctypes
import traceback
from collections import Counter

import numpy as np

__all__ = ["numpy_allocations", "AllocationRecord"]

_API_SET_HANDLER, _API_GET_HANDLER = 304, 305   # NumPy C-API table slots (stable since 1.22)
_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_CALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_REALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _Allocator(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("malloc", ctypes.c_void_p),
                ("calloc", ctypes.c_void_p), ("realloc", ctypes.c_void_p),
                ("free", ctypes.c_void_p)]


class _Handler(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8),
                ("allocator", _Allocator)]


class AllocationRecord:
    """What :func:`numpy_allocations` saw: ``count`` requests, ``nbytes`` bytes asked, and
    with ``where=True`` ``sites``, a :class:`collections.Counter` of bytes by call stack
    (innermost last, ``depth`` frames of ``file:line function``)."""

    def __init__(self, where: bool, depth: int):
        self.count = 0
        self.nbytes = 0
        self.sites: Counter = Counter()
        self._where, self._depth = where, depth

    def _note(self, n: int) -> None:
        self.count += 1
        self.nbytes += n
        if self._where:
            st = traceback.extract_stack(limit=self._depth + 3)[:-3]
            self.sites[tuple(f"{f.filename}:{f.lineno} {f.name}" for f in st)] += n

    def __repr__(self):
        return f"AllocationRecord(count={self.count}, nbytes={self.nbytes})"


_active: list = []            # the records being filled (nested blocks all count)
_state: dict = {}


def _note(n: int) -> None:
    for r in _active:
        r._note(int(n))


def _install():
    """Build the counting handler once (kept for the life of the process)."""
    if _state:
        return _state
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_New.restype = ctypes.py_object
    api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    from numpy._core import _multiarray_umath as mu
    table = ctypes.cast(api.PyCapsule_GetPointer(mu._ARRAY_API, None),
                        ctypes.POINTER(ctypes.c_void_p))
    set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(
        table[_API_SET_HANDLER])
    get_handler = ctypes.PYFUNCTYPE(ctypes.py_object)(table[_API_GET_HANDLER])
    inner = _Handler.from_address(api.PyCapsule_GetPointer(get_handler(), b"mem_handler"))
    ctx = inner.allocator.ctx
    # the inner functions called without releasing the GIL (PYFUNCTYPE): NumPy may call the
    # handler with the GIL released (np.zeros of large arrays), and the callback holds it then
    c_malloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_size_t)(inner.allocator.malloc)
    c_calloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_size_t)(inner.allocator.calloc)
    c_realloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_size_t)(inner.allocator.realloc)

    @_MALLOC
    def counting_malloc(_ctx, n):
        _note(n)
        return c_malloc(ctx, n)

    @_CALLOC
    def counting_calloc(_ctx, n, size):
        _note(n * size)
        return c_calloc(ctx, n, size)

    @_REALLOC
    def counting_realloc(_ctx, p, n):
        _note(n)
        return c_realloc(ctx, p, n)

    # the struct and the capsule's name in memory that is never freed: arrays made under the
    # handler keep its capsule and call its free (the inner handler's C function) whenever
    # they go, possibly while the interpreter shuts down
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    name = b"mem_handler\0"
    name_at = libc.malloc(len(name))
    ctypes.memmove(name_at, name, len(name))
    at = libc.malloc(ctypes.sizeof(_Handler))
    h = _Handler.from_address(at)
    h.name = b"disttensor_counting"
    h.version = 1
    h.allocator.ctx = ctx
    h.allocator.malloc = ctypes.cast(counting_malloc, ctypes.c_void_p).value
    h.allocator.calloc = ctypes.cast(counting_calloc, ctypes.c_void_p).value
    h.allocator.realloc = ctypes.cast(counting_realloc, ctypes.c_void_p).value
    h.allocator.free = inner.allocator.free
    _state.update(set=set_handler, capsule=api.PyCapsule_New(at, name_at, None),
                  keep=(counting_malloc, counting_calloc, counting_realloc, c_malloc,
                        c_calloc, c_realloc))
    return _state


class numpy_allocations:
    """Context manager counting NumPy's data allocations in this thread (module docstring);
    ``where=True`` also records the ``depth`` innermost frames of each (slow: for finding
    them, not for timing)."""

    def __init__(self, *, where: bool = False, depth: int = 6):
        self.record = AllocationRecord(where, depth)

    def __enter__(self) -> AllocationRecord:
        st = _install()
        self._old = st["set"](st["capsule"])
        _active.append(self.record)
        return self.record

    def __exit__(self, *exc):
        _active.remove(self.record)
        _state["set"](self._old)
        return False


def _selfcheck() -> bool:
    """Whether the handler sees an allocation (used by the tests)."""
    with numpy_allocations() as seen:
        np.empty(1000)
    return seen.count == 1 and seen.nbytes == 8000
