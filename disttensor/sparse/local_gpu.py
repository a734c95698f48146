"""GPU kernels of CSB matrices: the CuPy RawKernels of ``kernels/csb.cu`` behind the
contracts of :mod:`.local_cpu` (``spmm``, ``sddmm``), one device, no MPI.

The kernels are compiled and launched through ``disttensor.ops.local.gpu.rawmodules`` (module
``"csb"``; imported inside the functions, since ``sparse`` sits beside ``ops`` in the layers).
Work items are the chunks of :func:`~.blocking.line_chunks` with a GPU-sized target (many
more chunks than CPU threads: about :data:`THREADS_WANTED` threads of (chunk, column) in
flight), one thread per (chunk, right-hand column); the chunks of a split line add into the
result with ``atomicAdd`` (so the float summation order of a split line is not fixed), all
others with plain stores.
"""
from __future__ import annotations

import numpy as np

from .blocking import MIN_CHUNK_NNZ

__all__ = ["spmm", "sddmm", "chunk_target"]

THREADS_WANTED = 1 << 17       # (chunk, column) threads to keep a large GPU busy
MIN_GPU_CHUNK = 32


def _rm():
    from ..ops.local.gpu import rawmodules
    return rawmodules


def _ctypes(dtype, structure):
    t = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}.get(np.dtype(dtype))
    if t is None:
        raise TypeError(f"CSB GPU kernels take float32 or float64, got {np.dtype(dtype)}")
    index = "unsigned char" if structure.lrow.dtype == np.uint8 else "unsigned short"
    return t, index


def chunk_target(nnz: int, k: int) -> int:
    """Nonzeros per chunk on the GPU: enough chunks that ``chunks * k`` reaches
    :data:`THREADS_WANTED`, between :data:`MIN_GPU_CHUNK` and the CPU's minimum chunk."""
    want = -(-int(nnz) * max(1, int(k)) // THREADS_WANTED)
    return int(min(max(want, MIN_GPU_CHUNK), MIN_CHUNK_NNZ))


def spmm(structure, values, x, by_columns: bool, target=None):
    """``A @ x`` or ``A.T @ x`` (``by_columns``) on the GPU: the contract of
    :func:`.local_cpu.spmm` with CuPy arrays."""
    rm = _rm()
    cp = rm.cupy()
    m, n = structure.shape
    out_rows = n if by_columns else m
    k = int(x.shape[1])
    y = cp.zeros((out_rows, k), dtype=values.dtype)
    if structure.nnz == 0 or k == 0:
        return y
    t = chunk_target(structure.nnz, k) if target is None else int(target)
    plan = structure.plan(by_columns, 0, t)
    T, L = _ctypes(values.dtype, structure)
    if by_columns:
        out_loc, in_loc = structure.lcol, structure.lrow
        line_mul, step, count = 1, structure.nbc, structure.nbr
    else:
        out_loc, in_loc = structure.lrow, structure.lcol
        line_mul, step, count = structure.nbc, 1, structure.nbc
    nchunks = int(plan.line.shape[0])
    rm.launch(rm.kernel("csb", f"csb_spmm_lines<{T}, {L}>"), nchunks * k,
              (structure.blk_ptr, out_loc, in_loc, values, x, y, plan.line, plan.lo, plan.hi,
               plan.slot) + rm.i64(nchunks, line_mul, step, count, structure.beta, k))
    return y


def sddmm(structure, left, right, dtype):
    """The contract of :func:`.local_cpu.sddmm` with CuPy arrays (sums in ``dtype``)."""
    rm = _rm()
    cp = rm.cupy()
    nnz = structure.nnz
    k = int(left.shape[1])
    if nnz == 0 or k == 0:
        return cp.zeros(nnz, dtype=dtype)
    out = cp.empty(nnz, dtype=dtype)
    T, L = _ctypes(dtype, structure)
    nblocks = structure.nbr * structure.nbc
    rm.launch(rm.kernel("csb", f"csb_sddmm<{T}, {L}>"), nnz,
              (structure.blk_ptr, np.int64(nblocks), structure.lrow, structure.lcol, left,
               right, out) + rm.i64(nnz, structure.nbc, structure.beta, k))
    return out
