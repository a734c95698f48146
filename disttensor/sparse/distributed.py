"""``DistCSBMatrix``: a global sparse matrix whose pieces are CSB matrices distributed over a
process grid, and its products with DistArrays.

Layouts (``layout=``):

* ``"rows"`` (1-D grid of ``p`` ranks): rank ``r`` owns the rows ``[ro[r], ro[r+1])`` (balanced
  or ``row_sizes``) and keeps them as a :class:`~disttensor.sparse.CSBMatrix` over the columns
  they reference, numbered compactly (``ext``, sorted).  ``A @ x`` takes ``x`` split along its
  rows by the column ownership ``co`` (balanced or ``col_sizes``) or replicated; the entries of
  ``x`` a rank needs (the halo of the matrix) arrive by point-to-point messages or an
  all-gather, whichever the alpha-beta cost rule of :mod:`disttensor.sparse.dist_plan` says is
  cheaper (:mod:`disttensor.sparse.dist_exchange`).  The result is split like the rows.
* ``"blocks"`` (2-D grid ``pr x pc``): rank ``(i, j)`` holds the block of rows ``ro[i]..`` and
  columns ``co[j]..`` as a CSBMatrix.  ``A @ x`` takes ``x`` split over grid axis 1 by ``co``
  (replicated over axis 0) or replicated; the partial products are summed over each grid row
  (all-reduce over axis 1): the result is split over grid axis 0 by ``ro``, replicated over
  axis 1.  ``A.T @ y`` is the mirror image.

``A.T @ y`` (the adjoint) takes ``y`` laid out like ``A @ x``'s result and returns a DistArray
laid out like ``A @ x``'s input: in the row layout each rank's partial ``A_loc.T @ y_loc`` goes
back to the owners of its columns (the reverse exchange), who add the pieces.

Construction (collective): :meth:`DistCSBMatrix.from_local_coo` (each rank passes triplets,
usually of its own rows; every triplet goes to its owner; duplicates are summed, as in
``scipy.sparse.coo_matrix``), :meth:`~DistCSBMatrix.from_global_coo` /
:meth:`~DistCSBMatrix.from_dense` (the same global matrix on every rank; each keeps its part)
and :meth:`~DistCSBMatrix.from_function` (``fn(lo, hi)`` gives the triplets of the global rows
``lo..hi-1``; each rank calls it for its rows).  Integer or boolean values become float64.
Bad input (indices out of range: ``IndexError``; shapes: ``ValueError``; types: ``TypeError``)
and arguments that differ between ranks (``ArgumentMismatchError``) raise on every rank.

CPU blocks only (NumPy); the local products are the CSB kernels of S1's local type.
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.comm import allreduce, collective
from ..core.distribution import Distribution, balanced_sizes, offsets_from_sizes
from ..core.entry import agreed, canon, collective_entry, dtype_key, operand_key
from ..core.grid import ProcessGrid, get_default_grid
from .dist_exchange import RowHalo
from .dist_plan import block_of_entries

__all__ = ["DistCSBMatrix"]


def _csb():
    from . import CSBMatrix   # S1's local type (the package imports this module)
    return CSBMatrix


def _value_dtype(values) -> np.dtype:
    dt = np.asarray(values).dtype
    if dt.kind in "biu":
        return np.dtype(np.float64)
    if dt not in (np.float32, np.float64):
        raise TypeError(f"sparse values must be float32 or float64 (or integers, taken as "
                        f"float64), got {dt}")
    return dt


def _triplets(rows, cols, values, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, cols, values = np.asarray(rows), np.asarray(cols), np.asarray(values)
    if rows.ndim != 1 or cols.ndim != 1 or values.ndim != 1:
        raise ValueError("rows, cols and values must be 1-D arrays")
    if not len(rows) == len(cols) == len(values):
        raise ValueError(f"rows, cols and values must have the same length, got "
                         f"{len(rows)}, {len(cols)} and {len(values)}")
    for what, idx in (("row", rows), ("column", cols)):
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"{what} indices must be integers, got {idx.dtype}")
    m, n = shape
    for what, idx, ext, ax in (("row", rows, m, 0), ("column", cols, n, 1)):
        if idx.size and (idx.min() < 0 or idx.max() >= ext):
            bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
            raise IndexError(f"{what} index {bad} is out of bounds for axis {ax} with size {ext}")
    return (rows.astype(np.int64, copy=False), cols.astype(np.int64, copy=False),
            values.astype(_value_dtype(values), copy=False))


def _shape2(shape) -> tuple[int, int]:
    try:
        m, n = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a pair of non-negative integers, got {shape!r}") from None
    if m < 0 or n < 0:
        raise ValueError(f"shape must be a pair of non-negative integers, got {shape!r}")
    return m, n


def _sum_duplicates(keys: np.ndarray, values: np.ndarray):
    if keys.size == 0:
        return keys, values
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    return k[starts], np.add.reduceat(values[order], starts)


class _Layout:
    """Agreed metadata: grid, shape, layout name and ownership offsets (replicated)."""

    def __init__(self, grid: ProcessGrid, shape, layout, row_sizes, col_sizes):
        layout = ("rows" if grid.ndim == 1 else "blocks") if layout is None else layout
        if layout not in ("rows", "blocks"):
            raise ValueError(f"layout must be 'rows' or 'blocks', got {layout!r}")
        if layout == "rows" and grid.ndim != 1:
            raise ValueError(f"layout 'rows' needs a 1-D grid, got dims {grid.dims}")
        if layout == "blocks" and grid.ndim != 2:
            raise ValueError(f"layout 'blocks' needs a 2-D grid, got dims {grid.dims}")
        m, n = _shape2(shape)
        pr = grid.dims[0]
        pc = grid.dims[0] if layout == "rows" else grid.dims[1]
        rs = balanced_sizes(m, pr) if row_sizes is None else tuple(int(s) for s in row_sizes)
        cs = balanced_sizes(n, pc) if col_sizes is None else tuple(int(s) for s in col_sizes)
        for what, s, p, ext in (("row_sizes", rs, pr, m), ("col_sizes", cs, pc, n)):
            if len(s) != p or min(s) < 0 or sum(s) != ext:
                raise ValueError(f"{what} {s} must be {p} non-negative integers summing to {ext}")
        self.grid, self.shape, self.layout = grid, (m, n), layout
        self.row_sizes, self.col_sizes = rs, cs
        self.ro, self.co = offsets_from_sizes(rs), offsets_from_sizes(cs)
        c = grid.coords
        self.ri = c[0]
        self.cj = c[0] if layout == "rows" else c[1]
        self.dest_dims = (grid.size,) if layout == "rows" else grid.dims

    def key(self):
        return (self.layout, self.shape, self.grid.dims, self.row_sizes, self.col_sizes)


class DistCSBMatrix:
    """A distributed sparse matrix (see the module doc).  Build it with the ``from_*``
    class methods; ``A @ x``, ``A.T @ y``, :meth:`diagonal`, :meth:`to_coo`,
    :meth:`to_dense` (gathers: small matrices only)."""

    def __init__(self, lay: _Layout, local, ext, dtype, nnz: int, diag: np.ndarray,
                 block_size):
        self._lay = lay
        self.grid = lay.grid
        self.local = local
        self.ext = ext
        self.dtype = np.dtype(dtype)
        self.nnz = int(nnz)
        self._diag = diag
        self.block_size = block_size
        self._cast: dict = {}
        self._dists: dict = {}
        self.halo = RowHalo(lay.grid.cart, ext, lay.co) if lay.layout == "rows" else None

    # -- metadata ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self._lay.shape

    @property
    def layout(self) -> str:
        return self._lay.layout

    @property
    def row_sizes(self) -> tuple[int, ...]:
        return self._lay.row_sizes

    @property
    def col_sizes(self) -> tuple[int, ...]:
        return self._lay.col_sizes

    @property
    def ndim(self) -> int:
        return 2

    def __repr__(self) -> str:
        return (f"DistCSBMatrix(shape={self.shape}, dtype={self.dtype}, nnz={self.nnz}, "
                f"layout={self.layout!r}, grid={self.grid.dims})")

    def output_distribution(self, k: int | None = None) -> Distribution:
        """The distribution of ``A @ x`` (``k``: columns of ``x``, ``None`` for a vector)."""
        return self._vec_dist(self.shape[0], 0, self._lay.row_sizes, k)

    def input_distribution(self, k: int | None = None) -> Distribution:
        """The distribution ``A @ x`` takes ``x`` in (and ``A.T @ y`` returns)."""
        g = 0 if self.layout == "rows" else 1
        return self._vec_dist(self.shape[1], g, self._lay.col_sizes, k)

    def _vec_dist(self, n, g, sizes, k):
        key = (n, g, tuple(sizes), k)   # cached: a product asks for two per call
        d = self._dists.get(key)
        if d is None:
            shape, split, sz = ((n,), (g,), [sizes]) if k is None else \
                ((n, k), (g, None), [sizes, None])
            d = self._dists[key] = Distribution(shape, self.grid.dims, split, sz)
        return d

    def _key(self):
        return self._lay.key() + (self.dtype.str, self.nnz)

    @property
    def T(self) -> "_Transpose":
        return _Transpose(self)

    # -- construction --------------------------------------------------------------------
    @classmethod
    @collective_entry
    def from_local_coo(cls, rows, cols, values, shape, grid: ProcessGrid | None = None, *,
                       layout: str | None = None, row_sizes=None, col_sizes=None,
                       block_size=None) -> "DistCSBMatrix":
        """Collective: the matrix of every rank's triplets (global indices, any rows; each
        goes to the rank that owns it; duplicates are summed)."""
        grid = get_default_grid() if grid is None else grid
        comm = grid.cart
        with agreed(comm, "DistCSBMatrix.from_local_coo", rank_local=True, grid=grid,
                    shape=canon(shape), layout=layout, row_sizes=canon(row_sizes),
                    col_sizes=canon(col_sizes), block_size=block_size,
                    dtype=dtype_key(getattr(values, "dtype", None))):
            lay = _Layout(grid, shape, layout, row_sizes, col_sizes)
            rows, cols, values = _triplets(rows, cols, values, lay.shape)
        dest = block_of_entries(rows, cols, lay.ro, lay.co, lay.dest_dims)
        rows, cols, values = route(comm, dest, rows, cols, values)
        return cls._assemble(lay, rows, cols, values, block_size)

    @classmethod
    @collective_entry
    def from_global_coo(cls, rows, cols, values, shape, grid: ProcessGrid | None = None, *,
                        layout: str | None = None, row_sizes=None, col_sizes=None,
                        block_size=None) -> "DistCSBMatrix":
        """Collective: every rank passes the same global triplets and keeps its own
        (no data moves; their shapes and dtypes are agreed, their contents only under
        ``DISTTENSOR_DEBUG``)."""
        grid = get_default_grid() if grid is None else grid
        with agreed(grid.cart, "DistCSBMatrix.from_global_coo", grid=grid, rows=rows,
                    cols=cols, values=values, shape=canon(shape), layout=layout,
                    row_sizes=canon(row_sizes), col_sizes=canon(col_sizes),
                    block_size=block_size):
            lay = _Layout(grid, shape, layout, row_sizes, col_sizes)
            rows, cols, values = _triplets(rows, cols, values, lay.shape)
        mine = block_of_entries(rows, cols, lay.ro, lay.co, lay.dest_dims) == grid.rank
        return cls._assemble(lay, rows[mine], cols[mine], values[mine], block_size)

    @classmethod
    def from_dense(cls, a, grid: ProcessGrid | None = None, **kw) -> "DistCSBMatrix":
        """Collective: the nonzeros of the 2-D array ``a`` (the same on every rank)."""
        a = np.asarray(a)
        if a.ndim != 2:
            raise ValueError(f"from_dense needs a 2-D array, got {a.ndim}-D")
        r, c = np.nonzero(a)
        return cls.from_global_coo(r, c, a[r, c], a.shape, grid, **kw)

    @classmethod
    @collective_entry
    def from_function(cls, fn, shape, grid: ProcessGrid | None = None, *,
                      layout: str | None = None, row_sizes=None, col_sizes=None,
                      block_size=None) -> "DistCSBMatrix":
        """Collective: ``fn(lo, hi) -> (rows, cols, values)`` gives the entries of the global
        rows ``lo <= i < hi``; each rank calls it once for the rows it owns (in the block
        layout the ranks of a grid row each call it and keep their columns)."""
        grid = get_default_grid() if grid is None else grid
        comm = grid.cart
        with agreed(comm, "DistCSBMatrix.from_function", grid=grid, fn=fn,
                    shape=canon(shape), layout=layout, row_sizes=canon(row_sizes),
                    col_sizes=canon(col_sizes), block_size=block_size):
            if not callable(fn):
                raise TypeError(f"fn must be callable, got {type(fn).__name__}")
            lay = _Layout(grid, shape, layout, row_sizes, col_sizes)
        lo, hi = lay.ro[lay.ri], lay.ro[lay.ri + 1]
        with collective(comm):
            rows, cols, values = _triplets(*fn(lo, hi), lay.shape)
            if rows.size and (rows.min() < lo or rows.max() >= hi):
                raise IndexError(f"fn({lo}, {hi}) returned rows outside [{lo}, {hi})")
        dts = comm.allgather(values.dtype.str) if comm.size > 1 else [values.dtype.str]
        dt = np.result_type(*[np.dtype(d) for d in dts])
        if lay.layout == "blocks":
            keep = (cols >= lay.co[lay.cj]) & (cols < lay.co[lay.cj + 1])
            rows, cols, values = rows[keep], cols[keep], values[keep]
        return cls._assemble(lay, rows, cols, values.astype(dt, copy=False), block_size)

    @classmethod
    def _assemble(cls, lay: _Layout, rows, cols, values, block_size) -> "DistCSBMatrix":
        """This rank's (owned) triplets -> the matrix (collective: nnz, the halo).  The values'
        dtype is the same on every rank (agreed, or made so, by the caller)."""
        comm = lay.grid.cart
        dtype = values.dtype
        r0, r1 = lay.ro[lay.ri], lay.ro[lay.ri + 1]
        lr = rows - r0
        if lay.layout == "rows":
            ext = np.unique(cols)
            lc = np.searchsorted(ext, cols)
            width = len(ext)
        else:
            ext = None
            lc = cols - lay.co[lay.cj]
            width = lay.co[lay.cj + 1] - lay.co[lay.cj]
        keys, values = _sum_duplicates(lr * max(width, 1) + lc, values)
        lr, lc = keys // max(width, 1), keys % max(width, 1)
        gcol = ext[lc] if ext is not None else lc + lay.co[lay.cj]
        diag = np.zeros(r1 - r0, dtype=dtype)
        on = gcol == lr + r0
        diag[lr[on]] = values[on]
        if lay.layout == "blocks" and lay.grid.dims[1] > 1:
            diag = allreduce(lay.grid.sub_comm([1]), diag, "sum")
        local = None
        if keys.size:
            local = _csb().from_coo(lr, lc, values, (r1 - r0, width), block_size=block_size)
        nnz = int(comm.allreduce(int(keys.size))) if comm.size > 1 else int(keys.size)
        return cls(lay, local, ext if ext is not None else np.empty(0, np.int64), dtype, nnz,
                   diag, block_size)

    # -- local pieces ----------------------------------------------------------------------
    def _local_as(self, dtype):
        if self.local is None or dtype == self.dtype:
            return self.local
        m = self._cast.get(dtype.str)
        if m is None:
            m = self._cast[dtype.str] = self.local.with_values(self.local.values.astype(dtype))
        return m

    def _local_product(self, X: np.ndarray, adjoint: bool) -> np.ndarray:
        r0, r1 = self._lay.ro[self._lay.ri], self._lay.ro[self._lay.ri + 1]
        if self.layout == "rows":
            width = len(self.ext)
        else:
            width = self._lay.co[self._lay.cj + 1] - self._lay.co[self._lay.cj]
        rows = width if adjoint else r1 - r0
        loc = self._local_as(X.dtype)
        if loc is None or X.shape[1] == 0:
            return np.zeros((rows, X.shape[1]), dtype=X.dtype)
        out = (loc.T @ X) if adjoint else (loc @ X)
        return np.asarray(out).reshape(rows, X.shape[1])

    def diagonal(self) -> DistArray:
        """The main diagonal of a square matrix, laid out like ``A @ x``'s result (computed at
        construction; no communication)."""
        if self.shape[0] != self.shape[1]:
            raise ValueError(f"diagonal needs a square matrix, got shape {self.shape}")
        return DistArray(self._diag.copy(), self.output_distribution(), self.grid)

    # -- products ----------------------------------------------------------------------------
    def __matmul__(self, x):
        from .dist_products import matmul
        return matmul(self, x, adjoint=False)

    def matmul(self, x, *, exchange: str | None = None) -> DistArray:
        """``A @ x``; ``exchange`` (``"p2p"`` / ``"allgather"``) overrides the cost rule."""
        from .dist_products import matmul
        return matmul(self, x, adjoint=False, exchange=exchange)

    def rmatmul(self, y, *, exchange: str | None = None) -> DistArray:
        """``A.T @ y`` (the adjoint); ``exchange`` as for :meth:`matmul`."""
        from .dist_products import matmul
        return matmul(self, y, adjoint=True, exchange=exchange)

    def align_input(self, x: DistArray) -> DistArray:
        """``x`` redistributed to :meth:`input_distribution` (collective; no copy when it is
        laid out so already)."""
        k = None if x.ndim == 1 else x.shape[1]
        want = self.input_distribution(k)
        if x.distribution == want and x.grid.dims == self.grid.dims:
            return x
        return x.redistribute(self.grid, split=want.split, sizes=list(want.split_sizes))

    # -- gathers (small matrices) -------------------------------------------------------------
    def local_coo(self):
        """This rank's entries as global ``(rows, cols, values)`` (no communication; in the
        row layout a rank's rows, in the block layout its block)."""
        lay = self._lay
        if self.local is None:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, self.dtype)
        r, c, v = self.local.to_coo()
        r = np.asarray(r, np.int64) + lay.ro[lay.ri]
        c = self.ext[np.asarray(c, np.int64)] if self.layout == "rows" else \
            np.asarray(c, np.int64) + lay.co[lay.cj]
        return r, c, np.asarray(v).astype(self.dtype, copy=False)

    def to_coo(self):
        """Collective: the global ``(rows, cols, values)`` on every rank, sorted by row and
        column (each entry once)."""
        comm = self.grid.cart
        mine = self.local_coo()
        parts = comm.allgather(mine) if comm.size > 1 else [mine]
        r = np.concatenate([p[0] for p in parts])
        c = np.concatenate([p[1] for p in parts])
        v = np.concatenate([p[2] for p in parts]).astype(self.dtype, copy=False)
        order = np.lexsort((c, r))
        return r[order], c[order], v[order]

    def to_dense(self) -> np.ndarray:
        """Collective: the global dense matrix on every rank (small matrices only)."""
        r, c, v = self.to_coo()
        a = np.zeros(self.shape, dtype=self.dtype)
        np.add.at(a, (r, c), v)
        return a


class _Transpose:
    """``A.T``: ``A.T @ y`` is :meth:`DistCSBMatrix.rmatmul`."""

    def __init__(self, a: DistCSBMatrix):
        self.T = a
        self.shape = a.shape[::-1]
        self.dtype = a.dtype

    def __matmul__(self, y):
        from .dist_products import matmul
        return matmul(self.T, y, adjoint=True)


def route(comm, dest: np.ndarray, rows, cols, values):
    """Send every triplet to rank ``dest[i]`` of ``comm`` (one ``MPI_Alltoallv`` per array;
    collective); returns the triplets this rank received."""
    if comm.size == 1:
        return rows, cols, values
    from mpi4py import MPI
    from ..core.comm import mpi_type
    p = comm.size
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=p).astype(np.int64)
    got = np.empty(p, dtype=np.int64)
    comm.Alltoall(counts, got)
    sd = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rd = np.concatenate(([0], np.cumsum(got)[:-1]))
    out = []   # (the values' dtype is the same on every rank: agreed by the caller)
    for arr, t in ((rows, MPI.INT64_T), (cols, MPI.INT64_T), (values, mpi_type(values.dtype))):
        send = np.ascontiguousarray(arr[order])
        recv = np.empty(int(got.sum()), dtype=send.dtype)
        comm.Alltoallv([send, (counts, sd), t], [recv, (got, rd), t])
        out.append(recv)
    return out[0], out[1], out[2]
