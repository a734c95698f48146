"""Distributed test matrices, generated where they live: each rank makes only its own rows.

* :func:`laplacian_3d`: the 7-point finite-difference Laplacian ``-Δ`` on an ``nx x ny x nz``
  grid with Dirichlet boundaries (scaled by ``h^2``: 6 on the diagonal, -1 for each of the up
  to six neighbours), symmetric positive definite; unknown ``(a, b, c)`` is row
  ``(a * ny + b) * nz + c`` (C order, as ``numpy.ravel``).
* :func:`random_graph`: the adjacency matrix of a random undirected multigraph (symmetric,
  non-negative): row ``i`` draws ``degree`` neighbours ``j != i`` from a counter-based hash of
  ``(seed, i, slot)``, each draw adds 1 to ``A[i, j]`` and ``A[j, i]`` (repeated draws add up).
  The same graph for a seed on any grid.
* :func:`hashed_uniform`: the counter-based uniform numbers behind it (also the start vector
  of :func:`disttensor.sparse.linalg.power_iteration`).

Both are collective over the grid (see :class:`~disttensor.sparse.DistCSBMatrix` for
``layout``, ``row_sizes``, ``col_sizes``, ``block_size``).
"""
from __future__ import annotations

import numpy as np

from ..core.distribution import balanced_sizes, offsets_from_sizes
from ..core.entry import agreed, canon, collective_entry
from ..core.grid import ProcessGrid, get_default_grid
from .distributed import DistCSBMatrix

__all__ = ["laplacian_3d", "random_graph", "hashed_uniform"]

_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), \
    np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64, good avalanche)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _hash(seed: int, *counters) -> np.ndarray:
    z = np.full(np.broadcast_shapes(*(np.shape(c) for c in counters)),
                np.uint64(seed & 0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for c in counters:
            z = _mix(z * _GOLD + np.asarray(c).astype(np.uint64))
    return z


def hashed_uniform(seed: int, index) -> np.ndarray:
    """Uniform float64 numbers in ``[0, 1)``, a pure function of ``(seed, index)``."""
    return (_hash(seed, index) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _dims3(n) -> tuple[int, int, int]:
    dims = (n, n, n) if np.ndim(n) == 0 else tuple(n)
    if len(dims) != 3 or any(int(d) != d or d < 1 for d in dims):
        raise ValueError(f"n must be a positive integer or three of them, got {n!r}")
    return tuple(int(d) for d in dims)


class _Stencil:
    """``fn(lo, hi)`` of the 7-point Laplacian (a picklable, named callable: agreed by name)."""

    def __init__(self, dims, dtype):
        self.dims, self.dtype = dims, np.dtype(dtype)

    def __repr__(self) -> str:
        return f"_Stencil({self.dims}, {self.dtype})"

    def __call__(self, lo: int, hi: int):
        nx, ny, nz = self.dims
        i = np.arange(lo, hi, dtype=np.int64)
        a, b, c = np.unravel_index(i, self.dims) if i.size else (i, i, i)
        rows, cols = [i], [i]
        for coord, ext, step in ((a, nx, ny * nz), (b, ny, nz), (c, nz, 1)):
            for d in (-1, 1):
                ok = (coord + d >= 0) & (coord + d < ext)
                rows.append(i[ok])
                cols.append(i[ok] + d * step)
        vals = [np.full(len(i), 6.0, self.dtype)] + [np.full(len(r), -1.0, self.dtype)
                                                     for r in rows[1:]]
        return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)


@collective_entry
def laplacian_3d(n, grid: ProcessGrid | None = None, *, dtype=np.float64, layout=None,
                 row_sizes=None, col_sizes=None, block_size=None) -> DistCSBMatrix:
    """The 7-point Dirichlet Laplacian of an ``n^3`` (or ``nx x ny x nz``) grid as a
    :class:`DistCSBMatrix` of shape ``(N, N)``, ``N = nx ny nz`` (collective; each rank
    generates its rows)."""
    grid = get_default_grid() if grid is None else grid
    with agreed(grid.cart, "laplacian_3d", n=canon(n), grid=grid, dtype=np.dtype(dtype),
                layout=layout, row_sizes=canon(row_sizes), col_sizes=canon(col_sizes),
                block_size=block_size):
        dims = _dims3(n)
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {np.dtype(dtype)}")
    size = dims[0] * dims[1] * dims[2]
    return DistCSBMatrix.from_function(_Stencil(dims, dtype), (size, size), grid,
                                       layout=layout, row_sizes=row_sizes,
                                       col_sizes=col_sizes, block_size=block_size)


@collective_entry
def random_graph(n: int, degree: int, seed: int = 0, grid: ProcessGrid | None = None, *,
                 dtype=np.float64, layout=None, row_sizes=None, col_sizes=None,
                 block_size=None) -> DistCSBMatrix:
    """The symmetric adjacency matrix ``(n, n)`` of a random multigraph in which every vertex
    draws ``degree`` neighbours (see the module doc; collective: each rank draws for a
    balanced share of the vertices and the entries go to their owners)."""
    grid = get_default_grid() if grid is None else grid
    with agreed(grid.cart, "random_graph", n=n, degree=degree, seed=seed, grid=grid,
                dtype=np.dtype(dtype), layout=layout, row_sizes=canon(row_sizes),
                col_sizes=canon(col_sizes), block_size=block_size):
        if int(n) != n or n < 1 or int(degree) != degree or degree < 0:
            raise ValueError(f"n must be a positive and degree a non-negative integer, got "
                             f"{n!r} and {degree!r}")
        if n == 1 and degree:
            raise ValueError("a graph of one vertex has no other vertex to connect to")
    n, degree = int(n), int(degree)
    off = offsets_from_sizes(balanced_sizes(n, grid.size))
    i = np.arange(off[grid.rank], off[grid.rank + 1], dtype=np.int64)
    slots = np.arange(degree, dtype=np.int64)
    # j uniform over the n - 1 other vertices
    draw = (_hash(seed, i[:, None], slots[None, :]) % np.uint64(max(n - 1, 1))).astype(np.int64)
    src = np.repeat(i, degree)
    dst = draw.ravel()
    dst = dst + (dst >= src)
    rows = np.concatenate([src, dst])
    cols = np.concatenate([dst, src])
    vals = np.ones(len(rows), dtype=dtype)
    return DistCSBMatrix.from_local_coo(rows, cols, vals, (n, n), grid, layout=layout,
                                        row_sizes=row_sizes, col_sizes=col_sizes,
                                        block_size=block_size)
