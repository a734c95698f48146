"""CPU kernels of CSB matrices (Numba, one process, no MPI): ``A @ X`` over block-rows,
``A.T @ X`` over block-columns of the SAME structure (no CSC copy), and SDDMM.

Work items are the chunks of :func:`~.blocking.line_chunks`: a chunk of a line that was not
split owns that line's result rows and accumulates into them directly; the chunks of a split
(heavy) line accumulate into their own slots of a partial-result buffer, and a second
parallel pass adds each split line's slots into its rows.  No two threads ever write the same
element, so there are no atomics and no races.  The loop over the ``k`` right-hand columns is
innermost over contiguous memory (``X`` and the result C-contiguous ``(rows, k)``), which the
compiler vectorizes.  Threads: Numba's (``NUMBA_NUM_THREADS`` / ``numba.set_num_threads``);
products of fewer than :data:`PARALLEL_MIN_WORK` multiply-adds run on the calling thread.

Both products run the one kernel :func:`_spmm_lines`: for block-rows the output index of a
nonzero is its in-block row and the input index its in-block column, for block-columns the
two are swapped (``out_loc``/``in_loc``), and the blocks of line ``L`` are
``L * line_mul + t * step``, of which the kernel visits only the nonempty ones
(:meth:`~.structure.CSBStructure.line_blocks`).  With one right-hand column (SpMV) a run of
consecutive nonzeros on one output index is summed in a register and stored once.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

__all__ = ["spmm", "sddmm", "workers", "PARALLEL_MIN_WORK"]

# multiply-adds below which a product runs on one thread: waking a thread team costs tens of
# microseconds on an idle machine and whole scheduler slices on a busy one (measured: 0.1 ms
# serial vs 20-30 ms parallel for a 1024^2, 99 %-sparse A @ X with 64 columns on 2 loaded
# cores), more than such a product's work
PARALLEL_MIN_WORK = 1 << 21


def workers() -> int:
    """The number of threads the kernels run on (Numba's current setting)."""
    return int(numba.get_num_threads())


@njit(parallel=True, cache=True, fastmath={"contract"})
def _spmm_lines(blk_ptr, out_loc, in_loc, vals, x, y, partial, c_line, c_lo, c_hi, c_slot,
                line_mul, step, beta, lb_ptr, lb_pos):
    # indices are unsigned (uint64) where Numba would otherwise wrap negative ones around
    # at every access (about halves the time of a 7-point Laplacian's SpMV)
    k = x.shape[1]
    uk = np.uint64(k)
    x1 = x.reshape(x.size)
    y1 = y.reshape(y.size)
    p1 = partial.reshape(partial.size)
    for c in prange(c_line.size):
        line = c_line[c]
        lo = c_lo[c]
        hi = c_hi[c]
        slot = c_slot[c]
        base = line * line_mul
        if slot < 0:
            dest = y
            dest1 = y1
            rbase = np.uint64(line * beta)  # the line's own rows of y
        else:
            dest = partial
            dest1 = p1
            rbase = np.uint64(slot * beta)  # the chunk's slot of partial results
        # the line's nonempty blocks are lb_pos[e] for lb_ptr[line] <= e < lb_ptr[line + 1];
        # find the one holding virtual position lo, and the positions before it
        e = lb_ptr[line]
        e_end = lb_ptr[line + 1]
        cum = 0
        while e < e_end:
            b = base + lb_pos[e] * step
            size = blk_ptr[b + 1] - blk_ptr[b]
            if cum + size > lo:
                break
            cum += size
            e += 1
        pos = lo
        while pos < hi:                     # every block visited here holds a nonzero
            t = lb_pos[e]
            b = base + t * step
            size = blk_ptr[b + 1] - blk_ptr[b]
            stop = min(cum + size, hi)
            q0 = np.uint64(blk_ptr[b] + (pos - cum))
            q1 = q0 + np.uint64(stop - pos)
            in0 = np.uint64(t * beta)
            if k == 1:
                # SpMV: sum runs of nonzeros on one output index (Z-Morton order makes them
                # common for banded matrices) in a register, not through memory
                r = np.uint64(out_loc[q0])
                acc = vals[q0] * x1[in0 + np.uint64(in_loc[q0])]
                for q in range(q0 + np.uint64(1), q1):
                    rq = np.uint64(out_loc[q])
                    prod = vals[q] * x1[in0 + np.uint64(in_loc[q])]
                    if rq != r:
                        dest1[rbase + r] += acc
                        acc = prod
                        r = rq
                    else:
                        acc += prod
                dest1[rbase + r] += acc
            else:
                for q in range(q0, q1):
                    r = rbase + np.uint64(out_loc[q])
                    s = in0 + np.uint64(in_loc[q])
                    v = vals[q]
                    for j in range(uk):
                        dest[r, j] += v * x[s, j]
            pos = stop
            cum += size
            e += 1


@njit(parallel=True, cache=True)
def _add_partials(y, partial, split_lines, slot_ptr, beta):
    k = y.shape[1]
    nrows = y.shape[0]
    for s in prange(split_lines.size):
        out0 = split_lines[s] * beta
        rows = min(beta, nrows - out0)
        for slot in range(slot_ptr[s], slot_ptr[s + 1]):
            p0 = slot * beta
            for r in range(rows):
                for j in range(k):
                    y[out0 + r, j] += partial[p0 + r, j]


# the same loops on the calling thread (prange runs as range outside a parallel njit)
_spmm_lines_serial = njit(cache=True, fastmath={"contract"})(_spmm_lines.py_func)


def _parallel(work: int) -> bool:
    """Whether a product of ``work`` multiply-adds runs the parallel kernel."""
    return work >= PARALLEL_MIN_WORK


def spmm(structure, values, x, by_columns: bool, target=None):
    """``A @ x`` (``by_columns`` False) or ``A.T @ x`` of the matrix ``(structure, values)``
    for a C-contiguous 2-D ``x`` of A's dtype (``(n, k)``, resp. ``(m, k)``): a new
    C-contiguous ``(m, k)`` (resp. ``(n, k)``) array.  ``target`` overrides the nonzeros per
    chunk (tests force splits with it)."""
    m, n = structure.shape
    out_rows, in_rows = (n, m) if by_columns else (m, n)
    k = x.shape[1]
    parallel = _parallel(structure.nnz * k)
    plan = structure.plan(by_columns, workers() if parallel else 1, target)
    y = np.zeros((out_rows, k), dtype=values.dtype)
    partial = np.zeros((plan.nslots * structure.beta, k), dtype=values.dtype)
    if structure.nnz == 0 or k == 0:
        return y
    if by_columns:
        out_loc, in_loc = structure.lcol, structure.lrow
        line_mul, step = 1, structure.nbc
    else:
        out_loc, in_loc = structure.lrow, structure.lcol
        line_mul, step = structure.nbc, 1
    lb_ptr, lb_pos = structure.line_blocks(by_columns)
    kernel = _spmm_lines if parallel else _spmm_lines_serial
    kernel(structure.blk_ptr, out_loc, in_loc, values, x, y, partial, plan.line, plan.lo,
           plan.hi, plan.slot, line_mul, step, structure.beta, lb_ptr, lb_pos)
    if plan.split_lines.size:
        _add_partials(y, partial, plan.split_lines, plan.slot_ptr, structure.beta)
    return y


@njit(parallel=True, cache=True, fastmath=True)
def _sddmm(blk_ptr, lrow, lcol, left, right, out, nbc, beta, parts, zero):
    nnz = out.size
    k = left.shape[1]
    nblocks = blk_ptr.size - 1
    for p in prange(parts):
        q0 = nnz * p // parts
        q1 = nnz * (p + 1) // parts
        if q0 >= q1:
            continue
        b = np.searchsorted(blk_ptr, q0, side="right") - 1
        while b < nblocks and blk_ptr[b + 1] <= q0:
            b += 1
        for q in range(q0, q1):
            while blk_ptr[b + 1] <= q:
                b += 1
            r = (b // nbc) * beta + np.int64(lrow[q])
            c = (b % nbc) * beta + np.int64(lcol[q])
            acc = zero
            for j in range(k):
                acc += left[r, j] * right[c, j]
            out[q] = acc


_sddmm_serial = njit(cache=True, fastmath=True)(_sddmm.py_func)


def sddmm(structure, left, right, dtype):
    """The values ``left[r] . right[c]`` at every stored nonzero ``(r, c)`` of ``structure``,
    in storage order (``dtype``, summed in ``dtype``): ``left``
    ``(m, k)``, ``right`` ``(n, k)``, C-contiguous, of ``dtype``."""
    out = np.empty(structure.nnz, dtype=dtype)
    if structure.nnz == 0:
        return out
    if left.shape[1] == 0:
        out[:] = 0
        return out
    parallel = _parallel(structure.nnz * left.shape[1])
    parts = min(structure.nnz, 8 * workers() if parallel else 1)
    (_sddmm if parallel else _sddmm_serial)(
        structure.blk_ptr, structure.lrow, structure.lcol, left, right, out,
           structure.nbc, structure.beta, parts, out.dtype.type(0))
    return out
