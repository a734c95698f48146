"""Distributed linear algebra: ``matmul``/``@``, ``tensordot``, ``vecdot``, ``einsum`` (two
operands), ``outer``, ``trace``, ``diagonal``, ``cross``, norms, TSQR ``qr``, ``svd``, and
``solve``/``inv``/``det``/``cholesky``/``eigh``/``slogdet`` through a guarded gather path.

Every function here is collective over the grid of its first DistArray operand; the ranks
agree the operands' metadata and the options before any data moves, and bad input (shape
mismatch, non-square ``solve``, 1-D ``qr``, ...) raises the same NumPy-like exception on every
rank.  NumPy arrays passed next to a DistArray are treated as replicated values (every rank
must pass the same).  Operands on different grids over the same ranks are fine (data moves).

matmul (``a @ b``)
------------------
NumPy semantics: 1-D operands are promoted (``(k,)`` -> ``(1, k)`` / ``(k, 1)``, the axis
removed again), batch axes broadcast.  The product is computed by one of these plans:

* **aligned** (no data moves before the product): ``a`` and ``b`` are laid out so that the
  local product ``a.local @ b.local`` is this rank's block of ``C`` or a partial sum of it --
  the contracted axis ``k`` has the same split and ownership in both (or is whole), batch axes
  agree (a broadcast axis must be whole), and the split grid axes of ``C``'s axes and of ``k``
  are distinct.  Partial sums are all-reduced over the sub-communicator of ``k``'s grid axis.
* **SUMMA** (2-D operands both split ``(r, c)`` over two grid axes): the ``k`` axis is cut at
  the union of ``a``'s column and ``b``'s row block boundaries; for each cut, the owning grid
  column broadcasts its ``a`` panel along the grid rows (``grid.sub_comm([c])``) and the owning
  grid row its ``b`` panel along the grid columns (``grid.sub_comm([r])``), and every rank adds
  ``A_panel @ B_panel`` to its block (panels at most 1024 wide).  Uneven and empty blocks are
  fine.  The next panel's
  broadcasts are posted (``Ibcast``) before the current panel's product runs.
* **redistribute, then aligned**: candidate layouts ``rows`` (``a`` split on rows over all
  ranks, ``b`` replicated), ``cols`` (``a`` replicated, ``b`` split on columns), ``k`` (both
  split on ``k`` over all ranks; local partial product + all-reduce), ``target`` (``a`` rows
  and ``b`` columns already as the output wants them, ``k`` whole) and, on grids with >= 2
  axes, ``summa`` after moving both operands to ``(0, 1)``.

**Cost rule** (documented, deterministic, computed from agreed metadata only): the estimated
number of elements one rank receives -- for each operand that must move, the largest block of
its new layout; for an all-reduce, twice the largest output block; for SUMMA,
``ceil(m/p_r) k + k ceil(n/p_c)``; plus moving the result to the output layout.  The cheapest
plan wins, ties in the order: aligned, SUMMA, target, rows, cols, k, summa-after-move.

**Output distribution**: on ``a``'s grid; rows split like ``a``'s rows (same ownership), columns
like ``b``'s columns when ``b`` is on a grid of the same shape and that grid axis is still free,
batch axes like the first operand not broadcast along them; any other axis is whole.

Error: float sums in a different order than NumPy's BLAS; ``|C - AB| <= c k eps |A||B|``.

Contractions
------------
``tensordot``, ``einsum`` (two operands, explicit or implicit output, no ellipsis, no repeated
label inside one operand) and ``outer`` transpose and reshape the operands into a batched
``matmul`` (labels only in one operand and not in the output are summed first).  ``vecdot`` is
``sum(conj(x1) * x2, axis)`` with the elementwise alignment rule of :mod:`disttensor.core.array`.

Norms
-----
``vector_norm`` (ord ``2``, ``1``, ``inf``, ``-inf``, ``0``, any other ``p``) and the elementwise
matrix norms (``'fro'``, ``1``, ``-1``, ``inf``, ``-inf``) are reductions (one all-reduce
each).  ``matrix_norm`` with ``2``, ``-2`` or ``'nuc'`` uses singular values: of a 2-D matrix
through TSQR (of its transpose when wide), of stacks through the gather path.  ``norm``
follows ``numpy.linalg.norm``'s rules for ``ord`` and ``axis``.  Results are DistArrays (0-d for
full reductions).

QR and SVD (TSQR)
-----------------
``qr(a)`` for a 2-D ``a`` (any shape; tall-skinny is the fast case): ``a`` is brought to a
layout with whole rows (its own row split if its columns are whole, else rows split over all
ranks), each rank factors its block ``A_i = Q_i R_i``, the ``R_i`` (at most ``n x n`` each) are
all-gathered over the row sub-communicator and stacked, and the stack is factored
``[R_0; R_1; ...] = Q_s R``; this rank's ``Q = Q_i Q_s[rows of i]``.  ``R`` (``min(m,n) x n``) is
replicated; ``Q`` (``m x min(m,n)``) is split like the row layout used.  One all-gather of
``P n^2`` elements; flops ``2 m n^2 / P + 2 P n^3`` per rank.  Backward stable:
``|A - QR| <= c m n eps |A|``, ``|Q^H Q - I| <= c m n eps``.  ``R`` equals NumPy's up to the
signs of its rows.  ``svd(a, full_matrices=False)``: TSQR, then the SVD of ``R`` on every rank,
``U = Q U_R`` (``U`` split like ``Q``, ``S`` and ``Vh`` replicated); a wide ``a`` is done as
``svd(a^H)``.  ``full_matrices=True`` uses the gather path.

Gather path
-----------
``solve``, ``inv``, ``det``, ``slogdet``, ``cholesky``, ``eigh``, ``eigvalsh``, and ``svd`` with
``full_matrices=True`` or on stacks: the operands are all-gathered to every rank, LAPACK (NumPy)
runs on every rank, and every rank keeps its block of the result (laid out like the input:
``solve``'s result like ``b``, ``inv``/``cholesky``/eigenvectors like ``a``; eigenvalues,
``det`` and ``slogdet`` replicated).  The operands' total size in bytes must not exceed
``DISTTENSOR_GATHER_LIMIT`` (default 1 GiB); beyond it a ``ValueError`` is raised on every
rank before any data moves.  Errors from LAPACK (singular matrix, not positive definite) are
raised on every rank.
"""
from __future__ import annotations

import math
import numbers
import os
import string
import weakref

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import array_module, to_host
from ..core.comm import allreduce, collective, mpi_type
from ..core.distribution import Distribution
from ..core.grid import ProcessGrid

__all__ = ["matmul", "tensordot", "vecdot", "einsum", "outer", "trace", "diagonal", "cross",
           "norm", "vector_norm", "matrix_norm", "qr", "svd", "svdvals", "solve", "inv", "det",
           "slogdet", "cholesky", "eigh", "eigvalsh", "matrix_transpose", "gather_limit",
           "matrix_rank", "pinv", "matrix_power", "HANDLED_FUNCTIONS"]

_DEFAULT_GATHER_LIMIT = 1 << 30


def gather_limit() -> int:
    """Bytes the gather path may replicate on every rank (``DISTTENSOR_GATHER_LIMIT``)."""
    v = os.environ.get("DISTTENSOR_GATHER_LIMIT")
    return _DEFAULT_GATHER_LIMIT if not v else int(float(v))


# -- small layout helpers --------------------------------------------------------------------------
_FLAT: "weakref.WeakKeyDictionary[ProcessGrid, ProcessGrid]" = weakref.WeakKeyDictionary()


def _flat(grid: ProcessGrid) -> ProcessGrid:
    """A 1-D grid over the same ranks (collective on first use for ``grid``; cached)."""
    if grid.ndim == 1:
        return grid
    g = _FLAT.get(grid)
    if g is None:
        g = ProcessGrid((grid.size,), comm=grid.comm)
        _FLAT[grid] = g
    return g


def _dist(shape, grid: ProcessGrid, split, sizes=None) -> Distribution:
    split = list(split) + [None] * (len(shape) - len(split))
    if sizes is None:
        sizes = [None] * len(shape)
    sizes = [s if g is not None else None for s, g in zip(sizes, split)]
    return Distribution(shape, grid.dims, split, sizes)


def _max_block(d: Distribution) -> int:
    n = 1
    for t in range(d.ndim):
        n *= max(d.sizes(t)) if d.split[t] is not None else d.shape[t]
    return n


def _moved(x: DistArray, grid: ProcessGrid, d: Distribution) -> int:
    """Cost rule: elements one rank receives to hold ``x`` as ``d`` on ``grid``."""
    if x.grid.dims == grid.dims and x.distribution == d:
        return 0
    return _max_block(d)


def _move(x: DistArray, grid: ProcessGrid, d: Distribution) -> DistArray:
    if x.distribution == d and x.grid.dims == grid.dims:
        return x if x.grid is grid else DistArray(x.local, d, grid)
    return x.redistribute(grid=grid, distribution=d)


def _sizes(x: DistArray, t: int):
    return x.distribution.sizes(t) if x.split[t] is not None else None


def _expand(x: DistArray, axis: int) -> DistArray:
    """``x`` with a whole length-1 axis inserted at ``axis`` (no data moves)."""
    d = x.distribution
    split, sizes, shape = list(d.split), list(d.split_sizes), list(d.shape)
    split.insert(axis, None)
    sizes.insert(axis, None)
    shape.insert(axis, 1)
    return DistArray(x.xp.expand_dims(x.local, axis),
                     Distribution(shape, d.grid_dims, split, sizes), x.grid)


def _squeeze(x: DistArray, axis: int) -> DistArray:
    """``x`` without its whole length-1 axis ``axis`` (no data moves)."""
    assert x.shape[axis] == 1 and x.split[axis] is None
    return DistArray(x.xp.squeeze(x.local, axis), x.distribution.drop_axes([axis]), x.grid)


def _replicated(a, grid: ProcessGrid) -> DistArray:
    """A NumPy array (the same on every rank) as a replicated DistArray on ``grid``."""
    a = np.asarray(a)
    return DistArray(a, Distribution(a.shape, grid.dims, None), grid)


def _from_full(full, grid: ProcessGrid, d: Distribution, xp=np) -> DistArray:
    """This rank's block of the replicated global array ``full`` laid out as ``d``."""
    full = np.asarray(full)
    block = full[d.block_slices(grid.coords)] if full.ndim else full
    block = np.array(block, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    return DistArray(block if xp is np else xp.asarray(block), d, grid)


def _first_grid(*xs) -> ProcessGrid | None:
    for x in xs:
        if isinstance(x, DistArray):
            return x.grid
    return None


def _as_dist(x, grid: ProcessGrid, what: str) -> DistArray:
    if isinstance(x, DistArray):
        if not x.grid.compatible(grid):
            raise ValueError(f"{what}: the operands live on grids over different communicators")
        return x
    if isinstance(x, (numbers.Number, np.ndarray, np.generic, list, tuple)):
        return _replicated(x, grid)
    raise TypeError(f"{what}: unsupported operand type {type(x).__name__}")


def _comm_of(*xs):
    g = _first_grid(*xs)
    if g is None:
        raise TypeError("expected at least one DistArray operand")
    return g.cart


def _check_dist(x, what: str) -> None:
    if not isinstance(x, DistArray):
        raise TypeError(f"{what}: expected a DistArray, got {type(x).__name__}")


# -- matmul ------------------------------------------------------------------------------------
def _aligned_layout(a: DistArray, b: DistArray):
    """The output (split, sizes) of the aligned local product of ``a (..., m, k)`` and
    ``b (..., k, n)`` (same ndim, same grid shape), or ``None`` when they are not aligned."""
    if a.grid.dims != b.grid.dims:
        return None
    nd = a.ndim
    if a.split[-1] != b.split[-2] or _sizes(a, nd - 1) != _sizes(b, nd - 2):
        return None
    split, sizes = [], []
    for t in range(nd - 2):
        na, nb = a.shape[t], b.shape[t]
        if na == nb:
            if a.split[t] != b.split[t] or _sizes(a, t) != _sizes(b, t):
                return None
            split.append(a.split[t])
            sizes.append(_sizes(a, t))
        elif na == 1:
            if a.split[t] is not None:
                return None
            split.append(b.split[t])
            sizes.append(_sizes(b, t))
        else:
            if b.split[t] is not None:
                return None
            split.append(a.split[t])
            sizes.append(_sizes(a, t))
    split += [a.split[-2], b.split[-1]]
    sizes += [_sizes(a, nd - 2), _sizes(b, nd - 1)]
    used = [g for g in split + [a.split[-1]] if g is not None]
    if len(used) != len(set(used)):
        return None
    return split, sizes


def _aligned_product(a: DistArray, b: DistArray, grid: ProcessGrid, layout) -> DistArray:
    split, sizes = layout
    xp = a.xp
    c = xp.matmul(a.local, b.local if array_module(b.local) is xp else xp.asarray(b.local))
    g = a.split[-1]
    if g is not None and grid.dims[g] > 1:
        c = allreduce(grid.sub_comm([g]), c, "sum")
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    return DistArray(c, Distribution(shape, grid.dims, split, sizes), grid)


def _bcast(comm, buf, root: int):
    """Non-blocking broadcast of a (NumPy or CuPy, contiguous) panel; returns (request, array
    to use after the wait)."""
    if comm.size == 1:
        return None, buf
    host = to_host(buf)
    req = comm.Ibcast([host, mpi_type(host.dtype)], root=root)
    return req, host


_PANEL = 1024  # SUMMA panel width cap: more, narrower panels overlap better, cost more calls


def _summa(a: DistArray, b: DistArray, grid: ProcessGrid) -> DistArray:
    """SUMMA for ``a`` and ``b`` both split ``(r, c)`` over the same grid (see module doc)."""
    r, c = a.split
    da, db = a.distribution, b.distribution
    xp = a.xp
    dtype = np.result_type(a.dtype, b.dtype)
    ao, bo = da.offsets[1], db.offsets[0]
    cuts = sorted(set(ao) | set(bo))
    row_comm, col_comm = grid.sub_comm([c]), grid.sub_comm([r])
    my_c, my_r = grid.coords[c], grid.coords[r]
    mloc, nloc = a.local.shape[0], b.local.shape[1]
    out = xp.zeros((mloc, nloc), dtype=dtype)
    segs = [(k0, min(k0 + _PANEL, k1)) for c0, k1 in zip(cuts[:-1], cuts[1:])
            for k0 in range(c0, k1, _PANEL)]

    def post(k0, k1):
        ca, rb = da.owner_coord(1, k0), db.owner_coord(0, k0)
        if my_c == ca:
            pa = xp.ascontiguousarray(a.local[:, k0 - ao[ca]:k1 - ao[ca]], dtype=dtype)
        else:
            pa = xp.empty((mloc, k1 - k0), dtype=dtype)
        if my_r == rb:
            pb = xp.ascontiguousarray(b.local[k0 - bo[rb]:k1 - bo[rb], :], dtype=dtype)
        else:
            pb = xp.empty((k1 - k0, nloc), dtype=dtype)
        ra, ha = _bcast(row_comm, pa, ca)
        rbq, hb = _bcast(col_comm, pb, rb)
        return ra, ha, rbq, hb

    pending = post(*segs[0]) if segs else None
    for i in range(len(segs)):
        ra, ha, rbq, hb = pending
        for q in (ra, rbq):
            if q is not None:
                q.Wait()
        pending = post(*segs[i + 1]) if i + 1 < len(segs) else None
        pa = ha if array_module(ha) is xp else xp.asarray(ha)
        pb = hb if array_module(hb) is xp else xp.asarray(hb)
        out += pa @ pb
    return DistArray(out, Distribution((a.shape[0], b.shape[1]), grid.dims, (r, c),
                                       (da.sizes(0) if r is not None else None,
                                        db.sizes(1) if c is not None else None)), grid)


def _output_layout(a: DistArray, b: DistArray, shape):
    """Default output (split, sizes) on ``a``'s grid (see module doc)."""
    nd = len(shape)
    same = b.grid.dims == a.grid.dims
    cand = []
    for t in range(nd - 2):
        if a.shape[t] == shape[t]:
            cand.append((a.split[t], _sizes(a, t)))
        elif same:
            cand.append((b.split[t], _sizes(b, t)))
        else:
            cand.append((None, None))
    cand.append((a.split[-2], _sizes(a, nd - 2)))
    cand.append((b.split[-1], _sizes(b, nd - 1)) if same else (None, None))
    used, split, sizes = set(), [], []
    for g, s in cand:
        if g is None or g in used:
            split.append(None)
            sizes.append(None)
        else:
            used.add(g)
            split.append(g)
            sizes.append(s)
    return split, sizes


def _operand_layouts_for(out_split, out_sizes, a: DistArray, b: DistArray, shape):
    """Layouts of ``a`` and ``b`` (k whole) whose aligned product has the given output
    layout."""
    nd = len(shape)
    sa, za, sb, zb = [], [], [], []
    for t in range(nd - 2):
        for x, s, z in ((a, sa, za), (b, sb, zb)):
            bc = x.shape[t] != shape[t]
            s.append(None if bc else out_split[t])
            z.append(None if bc else out_sizes[t])
    sa += [out_split[-2], None]
    za += [out_sizes[-2], None]
    sb += [None, out_split[-1]]
    zb += [None, out_sizes[-1]]
    return (sa, za), (sb, zb)


def _plan_2d(a: DistArray, b: DistArray, grid: ProcessGrid, out_d: Distribution):
    """Candidate plans for 2-D operands with their estimated cost (see the cost rule)."""
    m, k = a.shape
    n = b.shape[1]
    plans = []

    def out_cost(g2: ProcessGrid, split, sizes):
        d = _dist((m, n), g2, split, sizes)
        if g2.dims == grid.dims and d == out_d:
            return 0
        if all(s is None for s in split):
            return 0  # replicated: every rank slices its block
        return _max_block(out_d)

    lay = _aligned_layout(a, b)
    if lay is not None:
        g = a.split[1]
        red = 2 * _max_block(_dist((m, n), grid, *lay)) if g is not None and grid.dims[g] > 1 else 0
        plans.append((red + out_cost(grid, *lay), "aligned", None))
    if (grid.dims == b.grid.dims and a.split == b.split and None not in a.split):
        r, c = a.split
        cost = -(-m // grid.dims[r]) * k + k * (-(-n // grid.dims[c]))
        plans.append((cost + out_cost(grid, (r, c), (a.distribution.sizes(0),
                                                       b.distribution.sizes(1))), "summa", None))
    (sa, za), (sb, zb) = _operand_layouts_for(list(out_d.split), list(out_d.split_sizes), a, b,
                                              (m, n))
    da, db = _dist((m, k), grid, sa, za), _dist((k, n), grid, sb, zb)
    plans.append((_moved(a, grid, da) + _moved(b, grid, db), "target", (grid, da, db)))
    p = grid.size
    if p > 1:
        f = _flat(grid)
        for name, xa, xb, red in (("rows", (0, None), (None, None), 0),
                                  ("cols", (None, None), (None, 0), 0),
                                  ("k", (None, 0), (0, None), 2 * m * n)):
            da, db = _dist((m, k), f, xa), _dist((k, n), f, xb)
            osplit = (xa[0], xb[1])
            cost = _moved(a, f, da) + _moved(b, f, db) + red + out_cost(f, osplit, (None, None))
            plans.append((cost, name, (f, da, db)))
        if grid.ndim >= 2:
            da, db = _dist((m, k), grid, (0, 1)), _dist((k, n), grid, (0, 1))
            cost = (_moved(a, grid, da) + _moved(b, grid, db)
                    + -(-m // grid.dims[0]) * k + k * (-(-n // grid.dims[1]))
                    + out_cost(grid, (0, 1), (None, None)))
            plans.append((cost, "summa-after-move", (grid, da, db)))
    order = ["aligned", "summa", "target", "rows", "cols", "k", "summa-after-move"]
    return min(plans, key=lambda pl: (pl[0], order.index(pl[1])))


def _matmul_nd(a: DistArray, b: DistArray) -> DistArray:
    """``a (..., m, k) @ b (..., k, n)`` (same ndim >= 2, validated)."""
    grid = a.grid
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    osplit, osizes = _output_layout(a, b, shape)
    out_d = _dist(shape, grid, osplit, osizes)
    if a.ndim == 2:
        _, name, arg = _plan_2d(a, b, grid, out_d)
        if name == "aligned":
            c = _aligned_product(a, b, grid, _aligned_layout(a, b))
        elif name == "summa":
            c = _summa(a, b, grid)
        else:
            g2, da, db = arg
            a2, b2 = _move(a, g2, da), _move(b, g2, db)
            c = _summa(a2, b2, g2) if name == "summa-after-move" else \
                _aligned_product(a2, b2, g2, _aligned_layout(a2, b2))
    else:
        lay = _aligned_layout(a, b)
        if lay is not None:
            c = _aligned_product(a, b, grid, lay)
        else:
            (sa, za), (sb, zb) = _operand_layouts_for(osplit, osizes, a, b, shape)
            a2 = _move(a, grid, _dist(a.shape, grid, sa, za))
            b2 = _move(b, grid, _dist(b.shape, grid, sb, zb))
            c = _aligned_product(a2, b2, grid, _aligned_layout(a2, b2))
    return _move(c, grid, out_d)


def _check_matmul_shapes(a: DistArray, b: DistArray) -> None:
    for i, x in enumerate((a, b)):
        if x.ndim == 0:
            raise ValueError(f"matmul: Input operand {i} does not have enough dimensions "
                             "(has 0, gufunc core with signature (n?,k),(k,m?)->(n?,m?) "
                             "requires 1)")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, "
                         f"with gufunc signature (n?,k),(k,m?)->(n?,m?) (size {kb} is "
                         f"different from {ka})")
    np.broadcast_shapes(a.shape[:-2], b.shape[:-2])  # ValueError as NumPy's


@collective_entry
def matmul(x1, x2) -> DistArray:
    """``x1 @ x2`` with NumPy's rules (collective; see the module doc for the plans, the cost
    rule and the output distribution)."""
    comm = _comm_of(x1, x2)
    with agreed(comm, "matmul", x1=operand_key(x1), x2=operand_key(x2)):
        grid = _first_grid(x1, x2)
        a, b = _as_dist(x1, grid, "matmul"), _as_dist(x2, grid, "matmul")
        _check_matmul_shapes(a, b)
    return _matmul(a, b)


def _matmul(a: DistArray, b: DistArray) -> DistArray:
    va, vb = a.ndim == 1, b.ndim == 1
    if va:
        a = _expand(a, 0)
    if vb:
        b = _expand(b, 1)
    while a.ndim < b.ndim:
        a = _expand(a, 0)
    while b.ndim < a.ndim:
        b = _expand(b, 0)
    c = _matmul_nd(a, b)
    if vb:
        c = _squeeze(c, c.ndim - 1)
    if va:
        c = _squeeze(c, c.ndim - (1 if vb else 2))
    return c


def matrix_transpose(x: DistArray) -> DistArray:
    """``x`` with its last two axes swapped (no data moves; ``x.mT``)."""
    _check_dist(x, "matrix_transpose")
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose needs at least 2 dimensions, got {x.ndim}")
    from ..routines.manipulation import swapaxes
    return swapaxes(x, -1, -2)


# -- contractions ------------------------------------------------------------------------------
def _regroup(x: DistArray, shape) -> DistArray:
    from ..routines.manipulation import reshape
    shape = tuple(int(s) for s in shape)
    return x if x.shape == shape else reshape(x, shape)


def _contract(a: DistArray, b: DistArray, ba, bb, ca, cb) -> DistArray:
    """Contract axes ``ca`` of ``a`` with ``cb`` of ``b``, batch axes ``ba``/``bb`` paired;
    result axes: batch, free axes of ``a``, free axes of ``b`` (sizes already checked)."""
    from ..routines.manipulation import transpose
    fa = [t for t in range(a.ndim) if t not in ba and t not in ca]
    fb = [t for t in range(b.ndim) if t not in bb and t not in cb]
    A = transpose(a, list(ba) + fa + list(ca))
    B = transpose(b, list(bb) + list(cb) + fb)
    bshape = [a.shape[t] for t in ba]
    sa = [a.shape[t] for t in fa]
    sb = [b.shape[t] for t in fb]
    K = math.prod(a.shape[t] for t in ca)
    A = _regroup(A, bshape + [math.prod(sa), K])
    B = _regroup(B, bshape + [K, math.prod(sb)])
    C = _matmul_nd(A, B)
    return _regroup(C, bshape + sa + sb)


def _axes_list(v, nd: int, what: str):
    from numpy.lib.array_utils import normalize_axis_index
    if isinstance(v, numbers.Integral):
        v = [v]
    return [normalize_axis_index(int(t), nd, what) for t in v]


@collective_entry
def tensordot(x1, x2, axes=2) -> DistArray:
    """``numpy.tensordot`` (collective): ``axes`` an int ``N`` (last ``N`` axes of ``x1`` with the
    first ``N`` of ``x2``) or a pair of axis sequences.  Transpose + reshape + matmul."""
    comm = _comm_of(x1, x2)
    with agreed(comm, "tensordot", x1=operand_key(x1), x2=operand_key(x2), axes=canon(axes)):
        grid = _first_grid(x1, x2)
        a, b = _as_dist(x1, grid, "tensordot"), _as_dist(x2, grid, "tensordot")
        if isinstance(axes, numbers.Integral):
            n = int(axes)
            if n < 0 or n > a.ndim or n > b.ndim:
                raise ValueError(f"tensordot: axes={n} is out of range for operands with "
                                 f"{a.ndim} and {b.ndim} dimensions")
            ca, cb = list(range(a.ndim - n, a.ndim)), list(range(n))
        else:
            try:
                ia, ib = axes
            except (TypeError, ValueError):
                raise TypeError("tensordot: axes must be an int or a pair of axis "
                                "sequences") from None
            ca, cb = _axes_list(ia, a.ndim, "axes"), _axes_list(ib, b.ndim, "axes")
        if len(ca) != len(cb) or len(set(ca)) != len(ca) or len(set(cb)) != len(cb):
            raise ValueError("shape-mismatch for sum")
        if any(a.shape[i] != b.shape[j] for i, j in zip(ca, cb)):
            raise ValueError("shape-mismatch for sum")
    return _contract(a, b, [], [], ca, cb)


def _parse_einsum(subscripts: str, nda: int, ndb: int):
    if not isinstance(subscripts, str):
        raise TypeError("einsum: subscripts must be a string")
    s = subscripts.replace(" ", "")
    if "." in s:
        raise ValueError("einsum: ellipsis ('...') is not supported for DistArrays")
    ins, arrow, out = s.partition("->")
    parts = ins.split(",")
    if len(parts) != 2:
        raise ValueError("einsum: DistArrays support exactly two operands")
    la, lb = parts
    for lab in (la, lb, out):
        if any(c not in string.ascii_letters for c in lab):
            raise ValueError(f"einsum: invalid subscript in {subscripts!r}")
    for i, (lab, nd) in enumerate(((la, nda), (lb, ndb))):
        if len(lab) != nd:
            raise ValueError(f"einsum: operand {i} has {nd} dimensions but the subscripts "
                             f"give {len(lab)}")
        if len(set(lab)) != len(lab):
            raise ValueError("einsum: a label repeated within one operand (a diagonal) is not "
                             "supported for DistArrays")
    if not arrow:
        out = "".join(sorted(c for c in set(la + lb) if (la + lb).count(c) == 1))
    if len(set(out)) != len(out):
        raise ValueError(f"einsum: output subscript {out!r} repeats a label")
    for c in out:
        if c not in la and c not in lb:
            raise ValueError(f"einsum: output label {c!r} does not appear in an input")
    return la, lb, out


@collective_entry
def einsum(subscripts: str, x1, x2) -> DistArray:
    """Two-operand ``numpy.einsum`` without ellipsis or repeated labels inside one operand
    (collective): labels only in one operand and not in the output are summed first, the rest
    becomes a batched matmul (batch: in both and the output; contracted: in both only)."""
    from ..routines import reductions
    from ..routines.manipulation import transpose
    comm = _comm_of(x1, x2)
    with agreed(comm, "einsum", subscripts=subscripts, x1=operand_key(x1),
                x2=operand_key(x2)):
        grid = _first_grid(x1, x2)
        a, b = _as_dist(x1, grid, "einsum"), _as_dist(x2, grid, "einsum")
        la, lb, out = _parse_einsum(subscripts, a.ndim, b.ndim)
        for c in set(la) & set(lb):
            if a.shape[la.index(c)] != b.shape[lb.index(c)]:
                raise ValueError(f"einsum: operands could not be broadcast together: label "
                                 f"{c!r} has sizes {a.shape[la.index(c)]} and "
                                 f"{b.shape[lb.index(c)]}")
    sum_a = [i for i, c in enumerate(la) if c not in lb and c not in out]
    sum_b = [i for i, c in enumerate(lb) if c not in la and c not in out]
    if sum_a:
        a = reductions.sum(a, axis=tuple(sum_a))
        la = "".join(c for i, c in enumerate(la) if i not in sum_a)
    if sum_b:
        b = reductions.sum(b, axis=tuple(sum_b))
        lb = "".join(c for i, c in enumerate(lb) if i not in sum_b)
    batch = [c for c in la if c in lb and c in out]
    con = [c for c in la if c in lb and c not in out]
    res = _contract(a, b, [la.index(c) for c in batch], [lb.index(c) for c in batch],
                    [la.index(c) for c in con], [lb.index(c) for c in con])
    labels = batch + [c for c in la if c not in lb] + [c for c in lb if c not in la]
    perm = [labels.index(c) for c in out]
    return res if perm == list(range(len(perm))) else transpose(res, perm)


@collective_entry
def vecdot(x1, x2, /, *, axis: int = -1) -> DistArray:
    """``sum(conj(x1) * x2, axis)`` over broadcast operands (collective; the array API's and
    NumPy 2's ``vecdot``); the product follows the elementwise alignment rule."""
    from ..routines import reductions
    comm = _comm_of(x1, x2)
    with agreed(comm, "vecdot", x1=operand_key(x1), x2=operand_key(x2), axis=canon(axis)):
        grid = _first_grid(x1, x2)
        a, b = _as_dist(x1, grid, "vecdot"), _as_dist(x2, grid, "vecdot")
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("vecdot: operands must have at least one dimension")
        shape = np.broadcast_shapes(a.shape, b.shape)
        from numpy.lib.array_utils import normalize_axis_index
        ax = normalize_axis_index(int(axis), len(shape), "axis")
        na = a.shape[ax - len(shape) + a.ndim] if ax - len(shape) + a.ndim >= 0 else 1
        nb = b.shape[ax - len(shape) + b.ndim] if ax - len(shape) + b.ndim >= 0 else 1
        if na != nb:
            raise ValueError(f"vecdot: the contracted axis has sizes {na} and {nb}")
    prod = np.multiply(np.conj(a) if a.dtype.kind == "c" else a, b)
    return reductions.sum(prod, axis=ax)


@collective_entry
def outer(x1, x2) -> DistArray:
    """``numpy.outer``: ``x1.ravel()[:, None] * x2.ravel()[None, :]`` (collective); rows split
    like ``x1``, columns like ``x2`` when its grid axis is free (the alignment rule)."""
    from ..routines.manipulation import reshape
    comm = _comm_of(x1, x2)
    with agreed(comm, "outer", x1=operand_key(x1), x2=operand_key(x2)):
        grid = _first_grid(x1, x2)
        a, b = _as_dist(x1, grid, "outer"), _as_dist(x2, grid, "outer")
    a = a if a.ndim == 1 else reshape(a, (a.size,))
    b = b if b.ndim == 1 else reshape(b, (b.size,))
    return np.multiply(_expand(a, 1), _expand(b, 0))


@collective_entry
def diagonal(x: DistArray, offset: int = 0, axis1: int = 0, axis2: int = 1) -> DistArray:
    """``numpy.diagonal`` (collective): the diagonal becomes the last axis, split like
    ``axis1`` was (each rank keeps the diagonal entries of its rows); ``axis2`` is made whole
    first (a redistribution when it is split)."""
    from numpy.lib.array_utils import normalize_axis_index
    from ..routines.manipulation import moveaxis
    _check_dist(x, "diagonal")
    with agreed(x.grid.cart, "diagonal", x=x, offset=canon(offset), axis1=canon(axis1),
                axis2=canon(axis2)):
        if x.ndim < 2:
            raise ValueError("diag requires an array of at least two dimensions")
        a1 = normalize_axis_index(int(axis1), x.ndim, "axis1")
        a2 = normalize_axis_index(int(axis2), x.ndim, "axis2")
        if a1 == a2:
            raise ValueError("axis1 and axis2 cannot be the same")
        offset = int(offset)
    y = moveaxis(x, (a1, a2), (-2, -1))
    if y.split[-1] is not None:
        d = y.distribution
        y = _move(y, y.grid, Distribution(d.shape, d.grid_dims, d.split[:-1] + (None,),
                                          d.split_sizes[:-1] + (None,)))
    n1, n2 = y.shape[-2:]
    ro, co = max(0, -offset), max(0, offset)
    L = max(0, min(n1 - ro, n2 - co))
    d = y.distribution
    o = d.offsets[-2]
    r0 = o[d.axis_coord(y.ndim - 2, y.grid.coords)]
    r1 = r0 + y.local.shape[-2]
    i0, i1 = max(r0 - ro, 0), max(min(r1 - ro, L), max(r0 - ro, 0))
    idx = np.arange(i0, i1)
    loc = y.local[..., idx + ro - r0, idx + co] if i1 > i0 else \
        y.xp.zeros(y.local.shape[:-2] + (0,), dtype=y.dtype)
    g = y.split[-2]
    sizes = None
    if g is not None:
        sizes = [max(0, min(o[c + 1] - ro, L) - max(o[c] - ro, 0)) for c in range(len(o) - 1)]
    dist = Distribution(y.shape[:-2] + (L,), d.grid_dims, d.split[:-2] + (g,),
                        d.split_sizes[:-2] + (sizes,))
    return DistArray(y.xp.ascontiguousarray(loc), dist, y.grid)


@collective_entry
def trace(x: DistArray, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype=None) -> DistArray:
    """``numpy.trace``: the sum of :func:`diagonal` along its last axis (collective)."""
    from ..routines import reductions
    from ..core.entry import dtype_key
    _check_dist(x, "trace")
    with agreed(x.grid.cart, "trace", x=x, offset=canon(offset), axis1=canon(axis1),
                axis2=canon(axis2), dtype=dtype_key(dtype)):
        if x.ndim < 2:
            raise ValueError("diag requires an array of at least two dimensions")
    return reductions.sum(diagonal(x, offset, axis1, axis2), axis=-1, dtype=dtype)


@collective_entry
def cross(x1, x2, /, *, axis: int = -1) -> DistArray:
    """Cross product of 3-vectors along ``axis`` (collective; operands of the same shape): the
    vector axis is made whole, the rest keeps ``x1``'s layout."""
    from numpy.lib.array_utils import normalize_axis_index
    comm = _comm_of(x1, x2)
    with agreed(comm, "cross", x1=operand_key(x1), x2=operand_key(x2), axis=canon(axis)):
        grid = _first_grid(x1, x2)
        a, b = _as_dist(x1, grid, "cross"), _as_dist(x2, grid, "cross")
        if a.shape != b.shape:
            raise ValueError(f"cross: operands must have the same shape, got {a.shape} and "
                             f"{b.shape}")
        if a.ndim == 0:
            raise ValueError("cross: operands must have at least one dimension")
        ax = normalize_axis_index(int(axis), a.ndim, "axis")
        if a.shape[ax] != 3:
            raise ValueError("incompatible dimensions for cross product (dimension must be 3)")
    d = a.distribution
    split, sizes = list(d.split), list(d.split_sizes)
    split[ax] = sizes[ax] = None
    target = Distribution(d.shape, d.grid_dims, split, sizes)
    A, B = _move(a, grid, target), _move(b, grid, target)
    xp = A.xp
    return DistArray(xp.cross(A.local, B.local, axis=ax), target, grid)


# -- norms -----------------------------------------------------------------------------------------
def _float(x: DistArray) -> DistArray:
    return x.astype(np.float64) if x.dtype.kind in "biu" else x


def _vector_norm(x: DistArray, axes, keepdims: bool, ord) -> DistArray:
    from ..routines import reductions
    x = _float(x)
    ax = np.abs(x)
    if ord == np.inf:
        return reductions.max(ax, axis=axes, keepdims=keepdims)
    if ord == -np.inf:
        return reductions.min(ax, axis=axes, keepdims=keepdims)
    if ord == 0:
        return reductions.sum(np.not_equal(ax, 0).astype(ax.dtype), axis=axes, keepdims=keepdims)
    if ord == 1:
        return reductions.sum(ax, axis=axes, keepdims=keepdims)
    if ord == 2:
        return np.sqrt(reductions.sum(np.multiply(ax, ax), axis=axes, keepdims=keepdims))
    return np.power(reductions.sum(np.power(ax, ord), axis=axes, keepdims=keepdims), 1.0 / ord)


def _norm_axes(x: DistArray, axis):
    from numpy.lib.array_utils import normalize_axis_tuple
    if axis is None:
        return tuple(range(x.ndim))
    return tuple(sorted(normalize_axis_tuple(axis, x.ndim)))


@collective_entry
def vector_norm(x: DistArray, /, *, axis=None, keepdims: bool = False, ord=2) -> DistArray:
    """Array API ``vector_norm`` (collective; one all-reduce): ``ord`` 2, 1, inf, -inf, 0 or any
    other real ``p`` (``sum(|x|^p)^(1/p)``); ``axis`` None (all), an int or a tuple."""
    _check_dist(x, "vector_norm")
    with agreed(x.grid.cart, "vector_norm", x=x, axis=canon(axis), keepdims=bool(keepdims),
                ord=canon(ord)):
        axes = _norm_axes(x, axis)
        if isinstance(ord, str) or not isinstance(ord, numbers.Real):
            raise ValueError(f"Invalid norm order '{ord}' for vectors")
    return _vector_norm(x, axes, bool(keepdims), ord)


_MATRIX_ORDS = ("fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf)


def _matrix_norm_last2(x: DistArray, ord, keepdims: bool) -> DistArray:
    from ..routines import reductions
    nd = x.ndim
    if ord == "fro":
        r = _vector_norm(x, (nd - 2, nd - 1), True, 2)
    elif ord in (1, -1, np.inf, -np.inf):
        ax = np.abs(_float(x))
        first, second = (nd - 2, nd - 1) if ord in (1, -1) else (nd - 1, nd - 2)
        s = reductions.sum(ax, axis=first, keepdims=True)
        r = (reductions.max if ord > 0 else reductions.min)(s, axis=second, keepdims=True)
    else:
        s = _svdvals(x)
        red = {2: reductions.max, -2: reductions.min, "nuc": reductions.sum}[ord]
        r = _expand(red(s, axis=-1, keepdims=True), nd - 1)
    if not keepdims:
        r = _squeeze(_squeeze(r, nd - 1), nd - 2)
    return r


@collective_entry
def matrix_norm(x: DistArray, /, *, keepdims: bool = False, ord="fro") -> DistArray:
    """Array API ``matrix_norm`` over the last two axes (collective): ``'fro'``, 1, -1, inf,
    -inf by reductions; 2, -2, ``'nuc'`` from singular values (TSQR for 2-D, else gather)."""
    _check_dist(x, "matrix_norm")
    with agreed(x.grid.cart, "matrix_norm", x=x, keepdims=bool(keepdims), ord=canon(ord)):
        if x.ndim < 2:
            raise ValueError("matrix_norm needs an array of at least two dimensions")
        if not any(ord == o and type(ord) is not bool for o in _MATRIX_ORDS):
            raise ValueError("Invalid norm order for matrices.")
        if ord in (2, -2, "nuc"):
            _svd_guard(x, "matrix_norm")
    return _matrix_norm_last2(x, ord, bool(keepdims))


@collective_entry
def norm(x: DistArray, ord=None, axis=None, keepdims: bool = False) -> DistArray:
    """``numpy.linalg.norm`` (collective): with ``axis=None`` the 2-norm of the flattened array
    for ``ord=None``, else the vector (1-D) or matrix (2-D) norm; an int ``axis`` gives vector
    norms, a pair of axes matrix norms.  Returns a DistArray (0-d for a full reduction)."""
    from numpy.lib.array_utils import normalize_axis_tuple
    from ..routines.manipulation import moveaxis
    _check_dist(x, "norm")
    with agreed(x.grid.cart, "norm", x=x, ord=canon(ord), axis=canon(axis),
                keepdims=bool(keepdims)):
        if axis is None:
            if ord is None:
                kind, axes = "vector", tuple(range(x.ndim))
            elif x.ndim == 1:
                kind, axes = "vector", (0,)
            elif x.ndim == 2:
                kind, axes = "matrix", (0, 1)
            else:
                raise ValueError("Improper number of dimensions to norm.")
        else:
            axes = normalize_axis_tuple(axis, x.ndim)
            if len(axes) == 1:
                kind = "vector"
            elif len(axes) == 2:
                kind = "matrix"
            else:
                raise ValueError("Improper number of dimensions to norm.")
        if kind == "vector":
            if ord is None:
                ord = 2
            if isinstance(ord, str) or not isinstance(ord, numbers.Real):
                raise ValueError(f"Invalid norm order '{ord}' for vectors")
        else:
            if ord is None:
                ord = "fro"
            if not any(ord == o and type(ord) is not bool for o in _MATRIX_ORDS):
                raise ValueError("Invalid norm order for matrices.")
            if ord in (2, -2, "nuc"):
                _svd_guard(moveaxis(x, axes, (-2, -1)), "norm")
    if kind == "vector":
        return _vector_norm(x, tuple(sorted(axes)), bool(keepdims), ord)
    r = _matrix_norm_last2(moveaxis(x, axes, (-2, -1)), ord, False)
    if keepdims:
        for t in sorted(axes):
            r = _expand(r, t)
    return r


# -- QR / SVD (TSQR) --------------------------------------------------------------------------
def _row_layout(a: DistArray) -> DistArray:
    """``a`` (2-D) with whole rows: as it is when its columns are whole, else rows split over
    all ranks."""
    if a.split[1] is None:
        return a
    f = _flat(a.grid)
    return _move(a, f, _dist(a.shape, f, (0, None)))


def _lapack(xp):
    return xp.linalg if xp is not np else np.linalg


def _tsqr(a: DistArray, want_q: bool):
    """TSQR of a 2-D DistArray: (Q DistArray or None, R replicated host array)."""
    x = _row_layout(a)
    grid, g = x.grid, x.split[0]
    xp = x.xp
    loc = x.local
    q1, r1 = _lapack(xp).qr(loc)  # q1 (m_i, min(m_i, n)), r1 (min(m_i, n), n)
    comm = grid.sub_comm([g]) if g is not None and grid.dims[g] > 1 else None
    rh = to_host(r1)
    rs = comm.allgather(rh) if comm is not None else [rh]
    q2, r = np.linalg.qr(np.concatenate(rs, axis=0))
    if not want_q:
        return None, r
    my = comm.rank if comm is not None else 0
    start = sum(t.shape[0] for t in rs[:my])
    piece = q2[start:start + rh.shape[0]]
    q = q1 @ (piece if xp is np else xp.asarray(piece))
    m, n = a.shape
    d = x.distribution
    qd = Distribution((m, min(m, n)), d.grid_dims, (g, None), (_sizes(x, 0), None))
    return DistArray(xp.ascontiguousarray(q), qd, grid), r


def _check_matrix(x, what: str) -> None:
    _check_dist(x, what)
    if x.ndim < 2:
        raise np.linalg.LinAlgError(f"{x.ndim}-dimensional array given. Array must be at "
                                    "least two-dimensional")


@collective_entry
def qr(a: DistArray, mode: str = "reduced"):
    """TSQR (collective; see the module doc).  ``mode='reduced'``: ``(Q, R)`` with ``Q`` (m x
    min(m,n)) split along rows, ``R`` (min(m,n) x n) replicated; ``mode='r'``: ``R`` only.
    2-D only (``LinAlgError`` for fewer dimensions, ``ValueError`` for stacks)."""
    _check_dist(a, "qr")
    with agreed(a.grid.cart, "qr", a=a, mode=mode):
        if mode not in ("reduced", "r"):
            raise ValueError(f"qr: mode must be 'reduced' or 'r' for DistArrays, got {mode!r}")
        _check_matrix(a, "qr")
        if a.ndim > 2:
            raise ValueError("qr: stacks of matrices are not supported for DistArrays")
    q, r = _tsqr(a, mode == "reduced")
    R = _replicated(r, a.grid)
    return R if mode == "r" else (q, R)


def _gather_check(call: str, *xs) -> None:
    total = sum(x.nbytes for x in xs)
    lim = gather_limit()
    if total > lim:
        raise ValueError(f"{call}: the gather path would replicate {total} bytes on every rank, "
                         f"more than DISTTENSOR_GATHER_LIMIT={lim} bytes")


def _svd_guard(x: DistArray, call: str) -> None:
    if x.ndim > 2:
        _gather_check(call, x)


def _svdvals(x: DistArray) -> DistArray:
    """Singular values over the last two axes: 2-D by TSQR (replicated 1-D result), stacks by
    the gather path (batch axes split like ``x``, last axis whole)."""
    if x.ndim == 2:
        m, n = x.shape
        y = x if m >= n else np.conj(matrix_transpose(x)) if x.dtype.kind == "c" \
            else matrix_transpose(x)
        _, r = _tsqr(y, False)
        s = np.linalg.svd(r, compute_uv=False)
        return _replicated(s, x.grid)
    full = x.to_numpy()
    with collective(x.grid.cart):
        s = np.linalg.svd(full, compute_uv=False)
    d = x.distribution
    return _from_full(s, x.grid, Distribution(s.shape, d.grid_dims, d.split[:-2] + (None,),
                                              d.split_sizes[:-2] + (None,)), x.xp)


@collective_entry
def svdvals(x: DistArray) -> DistArray:
    """Singular values (descending) over the last two axes (collective): 2-D by TSQR,
    stacks by the gather path (guarded)."""
    _check_dist(x, "svdvals")
    with agreed(x.grid.cart, "svdvals", x=x):
        _check_matrix(x, "svdvals")
        _svd_guard(x, "svdvals")
    return _svdvals(x)


@collective_entry
def svd(a: DistArray, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False):
    """``numpy.linalg.svd`` (collective).  ``full_matrices=False`` on a 2-D ``a``: TSQR + SVD of
    R (``U`` split along rows like the TSQR ``Q``, ``S`` and ``Vh`` replicated; a wide ``a`` via
    ``a^H``: ``U`` and ``S`` replicated, ``Vh`` split along columns).  ``full_matrices=True``
    (NumPy's default) and stacks: gather path (guarded), results laid out with the batch axes
    like ``a`` and the matrix axes whole.  ``compute_uv=False``: :func:`svdvals`."""
    _check_dist(a, "svd")
    with agreed(a.grid.cart, "svd", a=a, full_matrices=bool(full_matrices),
                compute_uv=bool(compute_uv), hermitian=bool(hermitian)):
        _check_matrix(a, "svd")
        gather = a.ndim > 2 or (full_matrices and compute_uv) or hermitian
        if gather:
            _gather_check("svd", a)
    if not compute_uv and not hermitian:
        return _svdvals(a)
    if not gather:
        m, n = a.shape
        if m >= n:
            q, r = _tsqr(a, True)
            ur, s, vh = np.linalg.svd(r, full_matrices=False)
            xp = q.xp
            u = DistArray(q.local @ (ur if xp is np else xp.asarray(ur)),
                          q.distribution, q.grid)
            return u, _replicated(s, a.grid), _replicated(vh, a.grid)
        at = matrix_transpose(a)
        if a.dtype.kind == "c":
            at = np.conj(at)
        q, r = _tsqr(at, True)
        ur, s, vh = np.linalg.svd(r, full_matrices=False)
        xp = q.xp
        w = q.local @ (ur if xp is np else xp.asarray(ur))  # rows of a^H = columns of a
        wt = xp.ascontiguousarray(w.conj().T)
        d = q.distribution
        vd = Distribution((s.shape[0], n), d.grid_dims, (None, d.split[0]),
                          (None, d.split_sizes[0]))
        return (_replicated(np.ascontiguousarray(vh.conj().T), a.grid), _replicated(s, a.grid),
                DistArray(wt, vd, q.grid))
    full = a.to_numpy()
    with collective(a.grid.cart):
        res = np.linalg.svd(full, full_matrices=full_matrices, compute_uv=compute_uv,
                            hermitian=hermitian)
    res = res if compute_uv else (res,)
    d = a.distribution
    outs = []
    for r in res:
        k = r.ndim - (a.ndim - 2)
        outs.append(_from_full(r, a.grid, Distribution(
            r.shape, d.grid_dims, d.split[:-2] + (None,) * k,
            d.split_sizes[:-2] + (None,) * k), a.xp))
    return tuple(outs) if compute_uv else outs[0]


# -- gather path ---------------------------------------------------------------------------------
def _square(a: DistArray) -> None:
    if a.shape[-1] != a.shape[-2]:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")


def _replicated_dist(shape, grid: ProcessGrid) -> Distribution:
    return Distribution(shape, grid.dims, None)


def _run_gathered(a: DistArray, fn, *xs):
    fulls = [x.to_numpy() for x in xs]
    with collective(a.grid.cart):
        return fn(*fulls)


@collective_entry
def solve(a, b) -> DistArray:
    """``numpy.linalg.solve`` by the gather path (collective, guarded by
    ``DISTTENSOR_GATHER_LIMIT``): the result is laid out like ``b`` (replicated when its shape
    differs from ``b``'s)."""
    comm = _comm_of(a, b)
    with agreed(comm, "solve", a=operand_key(a), b=operand_key(b)):
        grid = _first_grid(a, b)
        a, b = _as_dist(a, grid, "solve"), _as_dist(b, grid, "solve")
        _check_matrix(a, "solve")
        _square(a)
        if b.ndim == 0:
            raise ValueError("solve: b must have at least one dimension")
        kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if kb != a.shape[-1]:
            raise ValueError(f"solve: a is {a.shape[-2]}x{a.shape[-1]} but b has {kb} rows "
                             f"(shapes {a.shape} and {b.shape})")
        if b.ndim > 1:
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        _gather_check("solve", a, b)
    x = _run_gathered(a, np.linalg.solve, a, b)
    d = b.distribution if x.shape == b.shape else _replicated_dist(x.shape, grid)
    return _from_full(x, b.grid if x.shape == b.shape else grid, d, b.xp)


def _square_op(call: str, fn, like_a: bool):
    @collective_entry
    def op(a: DistArray) -> DistArray:
        _check_dist(a, call)
        with agreed(a.grid.cart, call, a=a):
            _check_matrix(a, call)
            _square(a)
            _gather_check(call, a)
        r = _run_gathered(a, fn, a)
        if isinstance(r, tuple):
            return tuple(_from_full(v, a.grid, _replicated_dist(np.shape(v), a.grid), a.xp)
                         for v in r)
        d = a.distribution if like_a else _replicated_dist(np.shape(r), a.grid)
        return _from_full(r, a.grid, d, a.xp)
    op.__name__ = op.__qualname__ = call
    return op


inv = _square_op("inv", np.linalg.inv, True)
inv.__doc__ = ("``numpy.linalg.inv`` by the gather path (collective, guarded); the result "
               "is laid out like ``a``.")
det = _square_op("det", np.linalg.det, False)
det.__doc__ = "``numpy.linalg.det`` by the gather path (collective, guarded); replicated."
slogdet = _square_op("slogdet", lambda a: tuple(np.linalg.slogdet(a)), False)
slogdet.__doc__ = ("``numpy.linalg.slogdet`` by the gather path: ``(sign, logabsdet)``, "
                   "replicated.")
eigvalsh = _square_op("eigvalsh", np.linalg.eigvalsh, False)
eigvalsh.__doc__ = "``numpy.linalg.eigvalsh`` by the gather path; replicated eigenvalues."


@collective_entry
def cholesky(a: DistArray, /, *, upper: bool = False) -> DistArray:
    """``numpy.linalg.cholesky`` by the gather path (collective, guarded); the factor is laid
    out like ``a``; ``LinAlgError`` on every rank when ``a`` is not positive definite."""
    _check_dist(a, "cholesky")
    with agreed(a.grid.cart, "cholesky", a=a, upper=bool(upper)):
        _check_matrix(a, "cholesky")
        _square(a)
        _gather_check("cholesky", a)
    r = _run_gathered(a, lambda m: np.linalg.cholesky(m, upper=bool(upper)), a)
    return _from_full(r, a.grid, a.distribution, a.xp)


@collective_entry
def eigh(a: DistArray, UPLO: str = "L"):
    """``numpy.linalg.eigh`` by the gather path (collective, guarded): ``(w, v)`` with the
    eigenvalues ``w`` replicated and the eigenvectors ``v`` laid out like ``a``."""
    _check_dist(a, "eigh")
    with agreed(a.grid.cart, "eigh", a=a, UPLO=UPLO):
        _check_matrix(a, "eigh")
        _square(a)
        if UPLO not in ("L", "U"):
            raise ValueError("UPLO argument must be 'L' or 'U'")
        _gather_check("eigh", a)
    w, v = _run_gathered(a, lambda m: tuple(np.linalg.eigh(m, UPLO=UPLO)), a)
    return (_from_full(w, a.grid, _replicated_dist(w.shape, a.grid), a.xp),
            _from_full(v, a.grid, a.distribution, a.xp))


# -- rank, pseudo-inverse, powers ----------------------------------------------------------------
def _rtol(x: DistArray, rtol):
    """The array API's default relative tolerance ``max(M, N) * eps`` (of the result's float
    type), or ``rtol`` (a number)."""
    if rtol is None:
        return max(x.shape[-2:]) * np.finfo(_float(x).dtype).eps
    if isinstance(rtol, (bool, np.bool_)) or not np.isscalar(rtol) or not np.isfinite(rtol) \
            or rtol < 0:
        raise ValueError(f"rtol must be a finite non-negative number, got {rtol!r}")
    return float(rtol)


@collective_entry
def matrix_rank(x: DistArray, /, *, rtol=None) -> DistArray:
    """Rank over the last two axes (array API; collective): the number of singular values
    above ``rtol * max(singular value)`` (default ``rtol = max(M, N) * eps``).  Singular
    values as :func:`svdvals` (2-D: TSQR, the rank replicated; stacks: the gather path,
    guarded, batch axes laid out like ``x``)."""
    _check_dist(x, "matrix_rank")
    with agreed(x.grid.cart, "matrix_rank", x=x,
                rtol=canon(rtol)):
        _check_matrix(x, "matrix_rank")
        tol = _rtol(x, rtol)
        _svd_guard(x, "matrix_rank")
    s = _svdvals(x)
    if 0 in x.shape[-2:]:
        return (s > 0).sum(axis=-1)
    return (s > s.max(axis=-1, keepdims=True) * tol).sum(axis=-1)


@collective_entry
def pinv(x: DistArray, /, *, rtol=None) -> DistArray:
    """Moore-Penrose pseudo-inverse over the last two axes (array API; collective): singular
    values at most ``rtol * max(singular value)`` (default ``max(M, N) * eps``) count as zero.
    2-D: from the TSQR :func:`svd` (``full_matrices=False``), ``V diag(1/s) U^H`` by the
    distributed :func:`matmul` (the ``M`` axis of the result is split as ``x``'s rows were);
    stacks: the gather path (guarded), laid out with the batch axes like ``x``."""
    _check_dist(x, "pinv")
    with agreed(x.grid.cart, "pinv", x=x, rtol=canon(rtol)):
        _check_matrix(x, "pinv")
        tol = _rtol(x, rtol)
        if x.ndim > 2:
            _gather_check("pinv", x)
    if x.ndim > 2 or 0 in x.shape:
        r = _run_gathered(x, lambda a: np.linalg.pinv(a, rcond=tol), x)
        d = x.distribution
        return _from_full(r, x.grid, Distribution(r.shape, d.grid_dims, d.split[:-2] + (None,) * 2,
                                                  d.split_sizes[:-2] + (None,) * 2), x.xp)
    u, s, vh = svd(x, full_matrices=False)
    sv = s.to_numpy()
    keep = sv > tol * (sv.max() if sv.size else 0.0)
    sinv = np.where(keep, 1.0 / np.where(keep, sv, 1.0), 0.0).astype(sv.dtype)
    v = matrix_transpose(vh)
    uh = matrix_transpose(u)
    if x.dtype.kind == "c":
        v, uh = np.conj(v), np.conj(uh)
    return matmul(v * sinv.astype(_float(x).dtype), uh)


@collective_entry
def matrix_power(x: DistArray, n: int, /) -> DistArray:
    """``x`` to the integer power ``n`` over the last two axes (square; collective): repeated
    squaring with the distributed :func:`matmul` (``n = 0``: the identity; ``n < 0``: powers
    of :func:`inv`, gather path).  The result is laid out like ``x``."""
    _check_dist(x, "matrix_power")
    with agreed(x.grid.cart, "matrix_power", x=x, n=canon(n)):
        _check_matrix(x, "matrix_power")
        _square(x)
        _exact_int(n)
    n = int(n)
    if n == 0:
        eye = np.broadcast_to(np.eye(x.shape[-1], dtype=x.dtype), x.shape)
        return _from_full(np.ascontiguousarray(eye), x.grid, x.distribution, x.xp)
    base = inv(x) if n < 0 else x
    n = abs(n)
    result = None
    while True:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if not n:
            break
        base = matmul(base, base)
    if result.distribution != x.distribution or result.grid is not x.grid:
        result = result.redistribute(grid=x.grid, distribution=x.distribution)
    return result if result is not x else result.copy()


def _exact_int(n) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"exponent must be an integer, got {n!r}")
    return int(n)


# -- NumPy dispatch ------------------------------------------------------------------------------
def _no_out(name, kwargs):
    if kwargs.pop("out", None) is not None:
        raise TypeError(f"out= is not supported for DistArray {name}")
    if kwargs:
        raise TypeError(f"{name}: unsupported keyword argument(s) {sorted(kwargs)}")


def _np_dot(a, b, out=None):
    _no_out("dot", {"out": out})
    na = a.ndim if hasattr(a, "ndim") else np.ndim(a)
    nb = b.ndim if hasattr(b, "ndim") else np.ndim(b)
    if na > 2 or nb > 2:
        return tensordot(a, b, axes=([na - 1], [max(nb - 2, 0)]))
    if na == 0 or nb == 0:
        return np.multiply(a, b)
    return matmul(a, b)


def _np_einsum(subscripts, *operands, **kwargs):
    _no_out("einsum", {k: v for k, v in kwargs.items() if k not in ("optimize",)})
    if len(operands) != 2:
        raise ValueError("einsum: DistArrays support exactly two operands")
    return einsum(subscripts, *operands)


def _np_vecdot(x1, x2, /, *, axis=-1, **kwargs):
    _no_out("vecdot", kwargs)
    return vecdot(x1, x2, axis=axis)


def _np_matmul(x1, x2, /, **kwargs):
    _no_out("matmul", kwargs)
    return matmul(x1, x2)


def _np_matrix_rank(A, tol, hermitian, rtol):
    """``numpy.linalg.matrix_rank``: ``tol`` is absolute in NumPy; only ``rtol`` (or neither)
    is supported here."""
    if tol is not None:
        raise TypeError("matrix_rank of a DistArray takes rtol=, not the absolute tol=")
    return matrix_rank(A, rtol=rtol)


# gufuncs (np.matmul, np.vecdot) reach DistArrays through __array_ufunc__, see ufuncs.py
GUFUNCS = {np.matmul: _np_matmul}
if hasattr(np, "vecdot"):
    GUFUNCS[np.vecdot] = _np_vecdot

HANDLED_FUNCTIONS = {
    np.dot: _np_dot,
    np.tensordot: lambda a, b, axes=2: tensordot(a, b, axes),
    np.einsum: _np_einsum,
    np.outer: lambda a, b, out=None: (_no_out("outer", {"out": out}), outer(a, b))[1],
    np.trace: lambda a, offset=0, axis1=0, axis2=1, dtype=None, out=None:
        (_no_out("trace", {"out": out}), trace(a, offset, axis1, axis2, dtype))[1],
    np.diagonal: lambda a, offset=0, axis1=0, axis2=1: diagonal(a, offset, axis1, axis2),
    np.cross: lambda a, b, axisa=-1, axisb=-1, axisc=-1, axis=None:
        cross(a, b, axis=-1 if axis is None else axis),
    np.linalg.norm: lambda x, ord=None, axis=None, keepdims=False: norm(x, ord, axis, keepdims),
    np.linalg.qr: lambda a, mode="reduced": qr(a, mode),
    np.linalg.svd: lambda a, full_matrices=True, compute_uv=True, hermitian=False:
        svd(a, full_matrices, compute_uv, hermitian),
    np.linalg.solve: solve,
    np.linalg.inv: inv,
    np.linalg.det: det,
    np.linalg.slogdet: slogdet,
    np.linalg.cholesky: lambda a, /, *, upper=False: cholesky(a, upper=upper),
    np.linalg.eigh: lambda a, UPLO="L": eigh(a, UPLO),
    np.linalg.eigvalsh: lambda a, UPLO="L": eigvalsh(a),
    np.linalg.matrix_power: matrix_power,
    np.linalg.matrix_rank: lambda A, tol=None, hermitian=False, *, rtol=None:
        _np_matrix_rank(A, tol, hermitian, rtol),
    np.linalg.pinv: lambda a, rcond=None, hermitian=False, *, rtol=None:
        pinv(a, rtol=rtol if rcond is None else rcond),
}
for _name, _fn in (("matmul", _np_matmul), ("tensordot", None), ("vecdot", _np_vecdot),
                   ("matrix_norm", None), ("vector_norm", None), ("outer", None),
                   ("svdvals", None), ("matrix_transpose", None), ("cross", None),
                   ("trace", lambda x, /, *, offset=0, dtype=None:
                       trace(x, offset, -2, -1, dtype)),
                   ("diagonal", lambda x, /, *, offset=0: diagonal(x, offset, -2, -1))):
    _f = getattr(np.linalg, _name, None)
    if _f is not None and not isinstance(_f, np.ufunc):
        HANDLED_FUNCTIONS[_f] = _fn if _fn is not None else globals()[_name]
del _name, _fn, _f
