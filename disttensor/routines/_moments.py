"""Count, mean and sum of squared deviations (``M2``) of a block in one pass over memory, and
their combination over ranks (Chan, Golub and LeVeque's pairwise update): the machinery of
``var``/``std`` over all axes (:mod:`disttensor.routines.reductions`).

A block is read in chunks of about :data:`CHUNK` elements (cache-sized): each chunk's mean is
its pairwise sum over its count, its ``M2`` the dot product of its deviations from that mean
(written into one reused chunk-sized buffer), and the chunks' ``(n, mean, M2)`` are merged in
order with

    n = na + nb,  delta = mean_b - mean_a,  mean = mean_a + delta nb / n,
    M2 = M2a + M2b + |delta|^2 na nb / n,

which never subtracts two large sums (the cancellation of the one-pass ``sum(x^2) - n
mean^2``), so the result agrees with NumPy's two-pass variance to a few ulps.  Memory: one
chunk of the working dtype, no temporary of the block's size (NumPy's ``var`` makes one).
"""
from __future__ import annotations

import numpy as np

from ..core.backend import array_module

__all__ = ["CHUNK", "local_moments", "merge", "combine_over"]

CHUNK = 1 << 14  # elements per chunk (128 KiB of float64: stays in the L2 cache)


def merge(a: tuple, b: tuple) -> tuple:
    """The ``(n, mean, M2)`` of two disjoint sets of elements from theirs."""
    na, ma, qa = a
    nb, mb, qb = b
    if nb == 0:
        return a
    if na == 0:
        return b
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), qa + qb + abs(delta) ** 2 * (na * nb / n)


def local_moments(block, work_dtype) -> tuple:
    """``(n, mean, M2)`` of all elements of ``block`` (NumPy or CuPy), computed in
    ``work_dtype`` (a float or complex dtype); Python numbers, ``mean`` complex for complex
    work dtypes, ``M2`` always real."""
    work_dtype = np.dtype(work_dtype)
    complex_ = work_dtype.kind == "c"
    xp = array_module(block)
    if xp is not np:  # a device block: two passes on the device
        if block.size == 0:
            return 0, 0.0, 0.0
        d = block.astype(work_dtype, copy=False)
        m = d.mean()
        dev = d - m
        q = (dev * dev.conj()).real.sum() if complex_ else (dev * dev).sum()
        return int(block.size), m.item(), float(q)
    if block.ndim <= 1 or block.flags.c_contiguous:
        rows, row = block.reshape(-1), 1
    else:  # a view with a halo: chunks of whole rows of the first axis
        rows, row = block, block.size // block.shape[0] if block.shape[0] else 0
    if rows.size == 0:
        return 0, 0.0, 0.0
    step = max(1, CHUNK // max(row, 1))
    buf = np.empty(min(step * row, rows.size), work_dtype)
    acc = (0, 0.0, 0.0)
    for i in range(0, rows.shape[0], step):
        c = rows[i:i + step]
        k = c.size
        mc = c.sum(dtype=work_dtype) / k
        flat = buf[:k]
        np.subtract(c, mc, out=flat.reshape(c.shape), dtype=work_dtype)
        q = np.vdot(flat, flat).real if complex_ else np.dot(flat, flat)
        acc = merge(acc, (k, complex(mc) if complex_ else float(mc), float(q)))
    return acc


def combine_over(comm, moments: tuple) -> tuple:
    """The ``(n, mean, M2)`` of the union of every rank's elements (collective over ``comm``,
    ``None`` for this rank alone): one all-gather of three numbers per rank, merged in rank
    order, so every rank gets the same result."""
    if comm is None or comm.size == 1:
        return moments
    acc = (0, 0.0, 0.0)
    for m in comm.allgather(moments):
        acc = merge(acc, m)
    return acc
