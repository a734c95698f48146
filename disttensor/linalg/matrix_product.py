"""``matmul`` (``a @ b``): the plans that compute a distributed matrix product, the cost rule
that picks one, and the batched product the contractions build on (:func:`matmul_nd`).

Collective over the grid of the first DistArray operand; the ranks agree the operands'
metadata before any data moves, and a shape mismatch raises NumPy's ``ValueError`` on every
rank.  NumPy arrays passed next to a DistArray are replicated values (every rank must pass the
same); operands on different grids over the same ranks are fine (data moves).

Semantics are NumPy's: 1-D operands are promoted (``(k,)`` -> ``(1, k)`` / ``(k, 1)``, the
axis removed again), batch axes broadcast.  The product is computed by one of these plans:

* **aligned** (no data moves before the product): ``a`` and ``b`` are laid out so that the
  local product ``a.local @ b.local`` is this rank's block of ``C`` or a partial sum of it --
  the contracted axis ``k`` has the same split and ownership in both (or is whole), batch axes
  agree (a broadcast axis must be whole), and the split grid axes of ``C``'s axes and of ``k``
  are distinct.  Partial sums are all-reduced over the sub-communicator of ``k``'s grid axis.
* **SUMMA** (2-D operands both split ``(r, c)`` over two grid axes): :mod:`.summa`.
* **redistribute, then aligned**: candidate layouts ``rows`` (``a`` split on rows over all
  ranks, ``b`` replicated), ``cols`` (``a`` replicated, ``b`` split on columns), ``k`` (both
  split on ``k`` over all ranks; local partial product + all-reduce), ``target`` (``a`` rows
  and ``b`` columns already as the output wants them, ``k`` whole) and, on grids with >= 2
  axes, ``summa`` after moving both operands to ``(0, 1)``.

Operands of more than two dimensions use the aligned product, after moving both operands to
the layouts whose aligned product has the output layout when they are not aligned.

**Cost rule** (documented, deterministic, computed from agreed metadata only): the estimated
number of elements one rank receives -- for each operand that must move, the largest block of
its new layout; for an all-reduce, twice the largest output block; for SUMMA,
``ceil(m/p_r) k + k ceil(n/p_c)``; plus moving the result to the output layout.  The cheapest
plan wins, ties in the order: aligned, SUMMA, target, rows, cols, k, summa-after-move.

**Output distribution**: on ``a``'s grid; rows split like ``a``'s rows (same ownership), columns
like ``b``'s columns when ``b`` is on a grid of the same shape and that grid axis is still free,
batch axes like the first operand not broadcast along them; any other axis is whole.

Error: float sums in a different order than NumPy's BLAS; ``|C - AB| <= c k eps |A||B|``.
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.backend import array_module
from ..core.comm import allreduce
from ..core.distribution import Distribution
from ..core.entry import agreed, collective_entry, operand_key
from ..core.grid import ProcessGrid
from .operands import (comm_of, distribution_on, flat_grid, insert_axis, laid_out,
                       operand_pair, remove_axis, split_sizes_of)
from .summa import summa

__all__ = ["matmul", "matmul_nd"]


# -- cost rule ---------------------------------------------------------------------------------
def _largest_block(d: Distribution) -> int:
    n = 1
    for t in range(d.ndim):
        n *= max(d.sizes(t)) if d.split[t] is not None else d.shape[t]
    return n


def _receive_cost(x: DistArray, grid: ProcessGrid, d: Distribution) -> int:
    """Cost rule: elements one rank receives to hold ``x`` as ``d`` on ``grid``."""
    if x.grid.dims == grid.dims and x.distribution == d:
        return 0
    return _largest_block(d)



# -- the aligned product ---------------------------------------------------------------------
def _aligned_layout(a: DistArray, b: DistArray):
    """The output (split, sizes) of the aligned local product of ``a (..., m, k)`` and
    ``b (..., k, n)`` (same ndim, same grid shape), or ``None`` when they are not aligned."""
    if a.grid.dims != b.grid.dims:
        return None
    nd = a.ndim
    if a.split[-1] != b.split[-2] or split_sizes_of(a, nd - 1) != split_sizes_of(b, nd - 2):
        return None
    split, sizes = [], []
    for t in range(nd - 2):
        na, nb = a.shape[t], b.shape[t]
        if na == nb:
            if a.split[t] != b.split[t] or split_sizes_of(a, t) != split_sizes_of(b, t):
                return None
            split.append(a.split[t])
            sizes.append(split_sizes_of(a, t))
        elif na == 1:
            if a.split[t] is not None:
                return None
            split.append(b.split[t])
            sizes.append(split_sizes_of(b, t))
        else:
            if b.split[t] is not None:
                return None
            split.append(a.split[t])
            sizes.append(split_sizes_of(a, t))
    split += [a.split[-2], b.split[-1]]
    sizes += [split_sizes_of(a, nd - 2), split_sizes_of(b, nd - 1)]
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


# -- plans -------------------------------------------------------------------------------------
def _output_layout(a: DistArray, b: DistArray, shape):
    """Default output (split, sizes) on ``a``'s grid (see module doc)."""
    nd = len(shape)
    same = b.grid.dims == a.grid.dims
    cand = []
    for t in range(nd - 2):
        if a.shape[t] == shape[t]:
            cand.append((a.split[t], split_sizes_of(a, t)))
        elif same:
            cand.append((b.split[t], split_sizes_of(b, t)))
        else:
            cand.append((None, None))
    cand.append((a.split[-2], split_sizes_of(a, nd - 2)))
    cand.append((b.split[-1], split_sizes_of(b, nd - 1)) if same else (None, None))
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
        d = distribution_on((m, n), g2, split, sizes)
        if g2.dims == grid.dims and d == out_d:
            return 0
        if all(s is None for s in split):
            return 0  # replicated: every rank slices its block
        return _largest_block(out_d)

    lay = _aligned_layout(a, b)
    if lay is not None:
        g = a.split[1]
        red = 0
        if g is not None and grid.dims[g] > 1:
            red = 2 * _largest_block(distribution_on((m, n), grid, *lay))
        plans.append((red + out_cost(grid, *lay), "aligned", None))
    if (grid.dims == b.grid.dims and a.split == b.split and None not in a.split):
        r, c = a.split
        cost = -(-m // grid.dims[r]) * k + k * (-(-n // grid.dims[c]))
        plans.append((cost + out_cost(grid, (r, c), (a.distribution.sizes(0),
                                                       b.distribution.sizes(1))), "summa", None))
    (sa, za), (sb, zb) = _operand_layouts_for(list(out_d.split), list(out_d.split_sizes), a, b,
                                              (m, n))
    da, db = distribution_on((m, k), grid, sa, za), distribution_on((k, n), grid, sb, zb)
    plans.append((_receive_cost(a, grid, da) + _receive_cost(b, grid, db), "target",
                  (grid, da, db)))
    p = grid.size
    if p > 1:
        f = flat_grid(grid)
        for name, xa, xb, red in (("rows", (0, None), (None, None), 0),
                                  ("cols", (None, None), (None, 0), 0),
                                  ("k", (None, 0), (0, None), 2 * m * n)):
            da, db = distribution_on((m, k), f, xa), distribution_on((k, n), f, xb)
            osplit = (xa[0], xb[1])
            cost = (_receive_cost(a, f, da) + _receive_cost(b, f, db) + red
                    + out_cost(f, osplit, (None, None)))
            plans.append((cost, name, (f, da, db)))
        if grid.ndim >= 2:
            da, db = distribution_on((m, k), grid, (0, 1)), distribution_on((k, n), grid, (0, 1))
            cost = (_receive_cost(a, grid, da) + _receive_cost(b, grid, db)
                    + -(-m // grid.dims[0]) * k + k * (-(-n // grid.dims[1]))
                    + out_cost(grid, (0, 1), (None, None)))
            plans.append((cost, "summa-after-move", (grid, da, db)))
    order = ["aligned", "summa", "target", "rows", "cols", "k", "summa-after-move"]
    return min(plans, key=lambda pl: (pl[0], order.index(pl[1])))


def matmul_nd(a: DistArray, b: DistArray) -> DistArray:
    """``a (..., m, k) @ b (..., k, n)`` (same ndim >= 2, validated)."""
    grid = a.grid
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    osplit, osizes = _output_layout(a, b, shape)
    out_d = distribution_on(shape, grid, osplit, osizes)
    if a.ndim == 2:
        _, name, arg = _plan_2d(a, b, grid, out_d)
        if name == "aligned":
            c = _aligned_product(a, b, grid, _aligned_layout(a, b))
        elif name == "summa":
            c = summa(a, b, grid)
        else:
            g2, da, db = arg
            a2, b2 = laid_out(a, g2, da), laid_out(b, g2, db)
            c = summa(a2, b2, g2) if name == "summa-after-move" else \
                _aligned_product(a2, b2, g2, _aligned_layout(a2, b2))
    else:
        lay = _aligned_layout(a, b)
        if lay is not None:
            c = _aligned_product(a, b, grid, lay)
        else:
            (sa, za), (sb, zb) = _operand_layouts_for(osplit, osizes, a, b, shape)
            a2 = laid_out(a, grid, distribution_on(a.shape, grid, sa, za))
            b2 = laid_out(b, grid, distribution_on(b.shape, grid, sb, zb))
            c = _aligned_product(a2, b2, grid, _aligned_layout(a2, b2))
    return laid_out(c, grid, out_d)


# -- matmul ------------------------------------------------------------------------------------
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
    comm = comm_of(x1, x2)
    with agreed(comm, "matmul", x1=operand_key(x1), x2=operand_key(x2)):
        _, a, b = operand_pair(x1, x2, "matmul")
        _check_matmul_shapes(a, b)
    return _matmul(a, b)


def _matmul(a: DistArray, b: DistArray) -> DistArray:
    va, vb = a.ndim == 1, b.ndim == 1
    if va:
        a = insert_axis(a, 0)
    if vb:
        b = insert_axis(b, 1)
    while a.ndim < b.ndim:
        a = insert_axis(a, 0)
    while b.ndim < a.ndim:
        b = insert_axis(b, 0)
    c = matmul_nd(a, b)
    if vb:
        c = remove_axis(c, c.ndim - 1)
    if va:
        c = remove_axis(c, c.ndim - (1 if vb else 2))
    return c
