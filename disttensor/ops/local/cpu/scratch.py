"""Per-thread scratch buffers reused between calls of the CPU convolution kernels.

A fresh large array costs its page faults on every call (~25 ms for 64 MiB on the development
machine), so the kernels take their column matrices, padded operands and packed blocks from
buffers that each thread keeps per *slot* and dtype and grows to the largest request seen.
An array handed out is valid until the next request for the same slot in the same thread.
No MPI; thread-safe because every thread has its own buffers.
"""
from __future__ import annotations

import math
import threading

import numpy as np

__all__ = ["ScratchBuffers"]


class ScratchBuffers(threading.local):
    """One set of reusable buffers per thread (a ``threading.local``)."""

    def __init__(self):
        self.bufs: dict = {}

    def get(self, slot: str, shape, dtype) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype`` backed by this
        thread's buffer ``slot`` (grown if too small)."""
        key = (slot, np.dtype(dtype).str)
        n = math.prod(int(s) for s in shape)
        buf = self.bufs.get(key)
        if buf is None or buf.size < n:
            buf = self.bufs[key] = np.empty(max(n, 1), dtype=dtype)
        return buf[:n].reshape(shape)

    def release(self) -> None:
        """Drop this thread's buffers (the next requests allocate afresh)."""
        self.bufs = {}
