"""Z-Morton order inside a ``beta x beta`` block and the compact in-block index types (pure
NumPy index math, no MPI, no GPU).

The Morton code of an in-block position ``(r, c)`` interleaves the bits of the two indices,
the column's bit ``b`` going to bit ``2b`` and the row's to bit ``2b + 1``:
``code = sum_b (c_b << 2b) | (r_b << (2b + 1))``.  Sorting by it visits the block in the
recursive Z order of Buluç et al. (SPAA'09): the four quadrants of the block one after the
other (top-left, top-right, bottom-left, bottom-right), each again in Z order, so the
nonzeros of any aligned sub-block are contiguous and both the rows and the columns a run of
nonzeros touches stay close together (the locality both ``A @ X`` and ``A.T @ X`` need).

Indices are at most 16 bits (``beta <= 65536``); codes are ``uint64`` (32 bits used).
"""
from __future__ import annotations

import numpy as np

__all__ = ["MAX_BLOCK_SIZE", "index_dtype", "morton_encode", "morton_decode"]

MAX_BLOCK_SIZE = 1 << 16      # in-block indices fit uint16

_SPREAD = ((8, 0x00FF00FF), (4, 0x0F0F0F0F), (2, 0x33333333), (1, 0x55555555))


def index_dtype(beta: int) -> np.dtype:
    """The compact type of in-block row/column indices of ``beta x beta`` blocks: ``uint8``
    for ``beta <= 256`` (lg beta <= 8 bits), ``uint16`` up to :data:`MAX_BLOCK_SIZE`;
    ``ValueError`` beyond."""
    beta = int(beta)
    if not 1 <= beta <= MAX_BLOCK_SIZE:
        raise ValueError(f"block size must be in [1, {MAX_BLOCK_SIZE}], got {beta}")
    return np.dtype(np.uint8) if beta <= 256 else np.dtype(np.uint16)


def _spread(v):
    """Bits ``b`` of the 16-bit values ``v`` moved to bit ``2b`` (uint64)."""
    v = np.asarray(v).astype(np.uint64) & np.uint64(0xFFFF)
    for shift, mask in _SPREAD:
        v = (v | (v << np.uint64(shift))) & np.uint64(mask)
    return v


def _compact(v):
    """The inverse of :func:`_spread`: bits ``2b`` of ``v`` moved to bit ``b``."""
    v = np.asarray(v).astype(np.uint64) & np.uint64(0x55555555)
    for shift, mask in reversed(((8, 0x0000FFFF), (4, 0x00FF00FF), (2, 0x0F0F0F0F),
                                 (1, 0x33333333))):
        v = (v | (v >> np.uint64(shift))) & np.uint64(mask)
    return v


def morton_encode(rows, cols):
    """Z-Morton codes (``uint64``) of in-block positions ``(rows, cols)`` (integer arrays of
    one shape, values in ``[0, 65536)``): column bits at even positions, row bits at odd."""
    rows = np.asarray(rows)
    cols = np.asarray(cols)
    if rows.shape != cols.shape:
        raise ValueError(f"rows and cols differ in shape: {rows.shape} vs {cols.shape}")
    return _spread(cols) | (_spread(rows) << np.uint64(1))


def morton_decode(codes):
    """``(rows, cols)`` (``int64``) of Z-Morton ``codes``: the inverse of
    :func:`morton_encode`."""
    codes = np.asarray(codes).astype(np.uint64)
    return (_compact(codes >> np.uint64(1)).astype(np.int64),
            _compact(codes).astype(np.int64))
