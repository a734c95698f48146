"""The sparsity structure of a CSB matrix (:class:`CSBStructure`) and its assembly from
coordinates (:func:`assemble`): validation, duplicates summed, nonzeros sorted block by block
(block-row-major) and in Z-Morton order inside each block.

A structure never changes once built; the product plans (chunks of lines for a given worker
count, and their device copies) are cached on it, so every matrix that shares it (``A.T``,
``A.with_values(v)``, ``A.astype(...)``) shares them too.
"""
from __future__ import annotations

import threading

import numpy as np

from .blocking import block_grid, block_pointers, chunk_target, line_chunks, line_nnz
from .morton import index_dtype, morton_decode, morton_encode

__all__ = ["CSBStructure", "assemble", "value_dtype"]


def value_dtype(dtype) -> np.dtype:
    """The stored value type for input of ``dtype``: float32 and float64 are kept, float16
    becomes float32, bool and integers float64; complex and other kinds raise ``TypeError``."""
    dt = np.dtype(dtype)
    if dt in (np.float32, np.float64):
        return dt
    if dt == np.float16:
        return np.dtype(np.float32)
    if dt.kind in "biu":
        return np.dtype(np.float64)
    raise TypeError(f"CSB matrices hold float32 or float64 values, got {dt}")


class CSBStructure:
    """Where the nonzeros of an ``(m, n)`` matrix are, in ``beta x beta`` blocks.

    ``blk_ptr`` (``int64``, ``nbr * nbc + 1``): block ``b = i * nbc + j`` holds storage
    positions ``blk_ptr[b]:blk_ptr[b + 1]``; ``lrow``/``lcol`` (``uint8`` for ``beta <= 256``,
    else ``uint16``): the in-block row and column of each stored nonzero, in Z-Morton order
    inside its block.  Arrays are NumPy (CPU) or CuPy (GPU) alike (``device``)."""

    def __init__(self, shape, beta, blk_ptr, lrow, lcol, device="cpu", host_blk_ptr=None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.beta = int(beta)
        self.nbr, self.nbc = block_grid(self.shape, self.beta)
        self.blk_ptr, self.lrow, self.lcol = blk_ptr, lrow, lcol
        self.device = device
        self.host_blk_ptr = blk_ptr if host_blk_ptr is None else host_blk_ptr
        self.nnz = int(self.host_blk_ptr[-1])
        self._plans: dict = {}
        self._lock = threading.Lock()

    def plan(self, by_columns: bool, workers: int, target=None):
        """The :class:`~.blocking.LineChunks` of block-rows (``by_columns`` False) or
        block-columns for ``workers`` workers (cached; ``target`` overrides the nonzeros per
        chunk), its arrays on this structure's device."""
        key = (bool(by_columns), int(workers), target)
        with self._lock:
            p = self._plans.get(key)
            if p is None:
                counts = line_nnz(self.host_blk_ptr, self.nbr, self.nbc, by_columns)
                t = chunk_target(self.nnz, workers) if target is None else int(target)
                p = line_chunks(counts, t)
                if self.device != "cpu":
                    import cupy as cp
                    p = type(p)(*(cp.asarray(a) for a in (p.line, p.lo, p.hi, p.slot,
                                                           p.split_lines, p.slot_ptr)))
                self._plans[key] = p
        return p

    def line_blocks(self, by_columns: bool):
        """``(ptr, pos)`` (``int64``, NumPy, cached): the nonempty blocks of each block-row
        (``by_columns`` False) or block-column, in order along it: those of line ``L`` are at
        positions ``pos[ptr[L]:ptr[L + 1]]`` along ``L`` (block-column indices of a block-row,
        block-row indices of a block-column), so the CPU kernels skip empty blocks without
        reading their pointers."""
        key = ("blocks", bool(by_columns))
        with self._lock:
            p = self._plans.get(key)
            if p is None:
                per_block = np.diff(np.asarray(self.host_blk_ptr, dtype=np.int64)).reshape(
                    self.nbr, self.nbc)
                if by_columns:
                    per_block = per_block.T
                line, pos = np.nonzero(per_block)
                ptr = np.zeros(per_block.shape[0] + 1, dtype=np.int64)
                np.cumsum(np.bincount(line, minlength=per_block.shape[0]), out=ptr[1:])
                p = (ptr, pos.astype(np.int64))
                self._plans[key] = p
        return p

    def block_ids(self) -> np.ndarray:
        """The block number of each stored nonzero (``int64``, NumPy)."""
        counts = np.diff(self.host_blk_ptr)
        return np.repeat(np.arange(counts.size, dtype=np.int64), counts)

    def coordinates(self):
        """``(rows, cols)`` (``int64``, NumPy) of the stored nonzeros, in storage order."""
        b = self.block_ids()
        lrow, lcol = self.lrow, self.lcol
        if self.device != "cpu":
            lrow, lcol = lrow.get(), lcol.get()
        return ((b // self.nbc) * self.beta + lrow, (b % self.nbc) * self.beta + lcol)

    def to_device(self, device: str) -> "CSBStructure":
        """This structure with its arrays on ``device`` ('cpu' or 'cuda')."""
        if device == self.device:
            return self
        if device == "cuda":
            import cupy as cp
            return CSBStructure(self.shape, self.beta, cp.asarray(self.blk_ptr),
                                cp.asarray(self.lrow), cp.asarray(self.lcol), "cuda",
                                host_blk_ptr=self.host_blk_ptr)
        return CSBStructure(self.shape, self.beta, self.host_blk_ptr, self.lrow.get(),
                            self.lcol.get(), "cpu")


def _index_array(a, name):
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {a.ndim}-D")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {a.dtype}")
    return a.astype(np.int64, copy=False)


def assemble(rows, cols, values, shape, beta):
    """``(structure, stored values)`` of the coordinate triplets ``(rows, cols, values)`` of a
    matrix of ``shape``: 1-D arrays of one length, indices in range (``IndexError`` otherwise),
    duplicates summed, explicit zeros kept."""
    m, n = (int(s) for s in shape)
    if m < 0 or n < 0:
        raise ValueError(f"negative dimensions in shape {shape}")
    beta = int(beta)
    idt = index_dtype(beta)
    rows, cols = _index_array(rows, "rows"), _index_array(cols, "cols")
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"values must be 1-D, got {values.ndim}-D")
    if not rows.size == cols.size == values.size:
        raise ValueError(f"rows, cols and values differ in length: {rows.size}, {cols.size}, "
                         f"{values.size}")
    values = values.astype(value_dtype(values.dtype), copy=False)
    for idx, extent, name in ((rows, m, "row"), (cols, n, "column")):
        if idx.size and (idx.min() < 0 or idx.max() >= extent):
            bad = idx[(idx < 0) | (idx >= extent)][0]
            raise IndexError(f"{name} index {bad} is out of range for shape {(m, n)}")
    nbr, nbc = block_grid((m, n), beta)
    if nbr * nbc >= 1 << 31:
        raise ValueError(f"{nbr} x {nbc} blocks of {beta} x {beta}: too many blocks (choose a "
                         "larger block_size)")
    bid = (rows // beta) * nbc + cols // beta
    key = (bid.astype(np.uint64) << np.uint64(32)) | morton_encode(rows % beta, cols % beta)
    order = np.argsort(key, kind="stable")
    key = key[order]
    vals = values[order]
    if key.size > 1:
        first = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        if first.size < key.size:
            vals = np.add.reduceat(vals, first).astype(vals.dtype, copy=False)
            key = key[first]
    bid = (key >> np.uint64(32)).astype(np.int64)
    lr, lc = morton_decode(key & np.uint64(0xFFFFFFFF))
    structure = CSBStructure((m, n), beta, block_pointers(bid, nbr * nbc),
                             lr.astype(idt), lc.astype(idt))
    return structure, np.ascontiguousarray(vals)
