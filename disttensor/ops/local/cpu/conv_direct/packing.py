"""Numba transposes that pack the operands of the gathered GEMM into lane-major blocks and
unpack its blocked result (per rank, no MPI; ``parallel=True`` over blocks of positions, so
the threads write disjoint parts of the output).

* :func:`pack` / :func:`unpack`: ``(N, M, Q)`` arrays to and from ``(ceil(M / C), N*Q, C)``
  blocks of ``C`` channels (the weights of the forward pass, ``dy`` of backward filter, the
  blocked outputs), through an L1-resident tile so both sides move in whole cache lines;
* :func:`pack_flipped`: backward data's weights, the kernel flipped and the group's channel
  axes swapped, in the same blocks;
* :func:`pack_columns`: the column matrix with the output positions on the lanes (the
  weight-broadcast variants).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["pack", "unpack", "pack_flipped", "pack_columns"]

_QB = 64     # positions per block of the pack/unpack transposes (a 64 x C tile in L1)
_QCHUNK = 512  # positions per parallel work item of the transposes


@njit(cache=True, parallel=True)
def pack(src, dst, m_n):
    """``dst[cob, n*Q + q, c] = src[n, cob*C + c, q]`` (0 where ``cob*C + c >= m_n``);
    ``src`` is ``(N, >= m_n, Q)`` (any strides), ``dst`` ``(n_cob, N*Q, C)``.  A blocked
    transpose: ``_QB`` positions x C channels go through an L1-resident tile, so that both
    sides are read and written in whole cache lines whatever the strides."""
    n_n, _, q_n = src.shape
    n_cob, _, c_n = dst.shape
    n_qc = (q_n + _QCHUNK - 1) // _QCHUNK
    for t in prange(n_cob * n_n * n_qc):
        cob = t // (n_n * n_qc)
        rem = t - cob * n_n * n_qc
        n = rem // n_qc
        qc0 = (rem - n * n_qc) * _QCHUNK
        qc1 = min(qc0 + _QCHUNK, q_n)
        c_hi = max(0, min(c_n, m_n - cob * c_n))
        tile = np.zeros((_QB, c_n), dtype=dst.dtype)   # columns >= c_hi stay 0
        for q0 in range(qc0, qc1, _QB):
            q1 = min(q0 + _QB, qc1)
            for c in range(c_hi):
                m = cob * c_n + c
                for q in range(q0, q1):
                    tile[q - q0, c] = src[n, m, q]
            for q in range(q0, q1):
                dst[cob, n * q_n + q, :] = tile[q - q0]


@njit(cache=True, parallel=True)
def unpack(src, dst):
    """``dst[n, m, q] = src[m // C, n*Q + q, m % C]`` (the inverse of :func:`pack`;
    ``dst`` may have any strides), blocked as :func:`pack`."""
    n_n, m_n, q_n = dst.shape
    c_n = src.shape[2]
    n_cob = (m_n + c_n - 1) // c_n
    n_qc = (q_n + _QCHUNK - 1) // _QCHUNK
    for t in prange(n_cob * n_n * n_qc):
        cob = t // (n_n * n_qc)
        rem = t - cob * n_n * n_qc
        n = rem // n_qc
        qc0 = (rem - n * n_qc) * _QCHUNK
        qc1 = min(qc0 + _QCHUNK, q_n)
        c_hi = min(c_n, m_n - cob * c_n)
        tile = np.empty((_QB, c_n), dtype=src.dtype)
        for q0 in range(qc0, qc1, _QB):
            q1 = min(q0 + _QB, qc1)
            for q in range(q0, q1):
                tile[q - q0] = src[cob, n * q_n + q, :]
            for c in range(c_hi):
                m = cob * c_n + c
                for q in range(q0, q1):
                    dst[n, m, q] = tile[q - q0, c]


@njit(cache=True, parallel=True)
def pack_flipped(w, dst):
    """``dst[cb, ci*KK + k, c] = w[ci, cb*C + c, KK-1-k]`` (0 past ``w.shape[1]``): the
    backward-data operand, the kernel flipped (reversing the flat ``(kd, kh, kw)`` index flips
    all three axes) and the channel axes of the group swapped; ``w`` is ``(Cin_fwd_out,
    Cg, KK)`` = one group's forward weight, ``dst`` ``(ceil(Cg / C), Cin_fwd_out*KK, C)``."""
    m_n, cg, kk = w.shape
    n_cb, _, c_n = dst.shape
    for t in prange(n_cb * m_n):
        cb = t // m_n
        ci = t - cb * m_n
        c_hi = min(c_n, cg - cb * c_n)
        for k in range(kk):
            row = dst[cb, ci * kk + k]
            for c in range(c_hi):
                row[c] = w[ci, cb * c_n + c, kk - 1 - k]
            for c in range(c_hi, c_n):
                row[c] = 0


@njit(cache=True, parallel=True)
def pack_columns(xf, pos_off, red_off, dst):
    """``dst[pb, j, c] = xf[pos_off[pb*C + c] + red_off[j]]``: the column matrix with the
    positions on the lanes (``pos_off`` has ``n_pb * C`` entries)."""
    n_pb, j_n, c_n = dst.shape
    n_jc = (j_n + 63) // 64
    for t in prange(n_pb * n_jc):
        pb = t // n_jc
        j0 = (t - pb * n_jc) * 64
        # the block's lane offsets in a private copy: read through ``pos_off`` itself they are
        # reloaded for every element (``dst`` might alias them), 1.6-1.9x slower at 8^3
        lane = pos_off[pb * c_n:(pb + 1) * c_n].copy()
        for j in range(j0, min(j0 + 64, j_n)):
            o = red_off[j]
            row = dst[pb, j]
            for c in range(c_n):
                row[c] = xf[lane[c] + o]
