"""Pure index math of block distributions (no MPI).

A :class:`Distribution` describes how a global N-d array of shape ``shape`` is cut into blocks
over a Cartesian process grid of shape ``grid_dims``:

* ``split[t]`` names the grid axis that tensor axis ``t`` is split over, or is ``None`` when
  the axis is not split (every rank holds all of it).
* Grid axes that no tensor axis is split over are *replication* axes: ranks that differ only
  in their coordinates along them hold identical copies of the same block.
* Along a split axis the block of grid coordinate ``c`` is ``[offsets[t][c], offsets[t][c+1])``.
  The default is the balanced rule ``n // p + (c < n % p)`` (remainder to the lowest
  coordinates; the rule of Distconv, DistDL, mpi4py-fft and Heat); explicit ownership sizes
  (PETSc's ``lx/ly/lz``) are allowed and may contain zeros (empty blocks).

Ranks and grid coordinates are related row-major (the MPI rule for Cartesian communicators
created with ``reorder=False``), so everything here is computable on any rank without
communication.  The plans used by halo exchange and redistribution are built from this module.
"""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "balanced_sizes",
    "offsets_from_sizes",
    "coords_to_rank",
    "rank_to_coords",
    "Distribution",
    "Box",
    "intersect_ranges",
]


def balanced_sizes(n: int, p: int) -> tuple[int, ...]:
    """Sizes of ``p`` balanced blocks of ``n`` items, remainder to the lowest coordinates."""
    if p < 1:
        raise ValueError(f"number of blocks must be >= 1, got {p}")
    if n < 0:
        raise ValueError(f"extent must be >= 0, got {n}")
    q, r = divmod(n, p)
    return tuple(q + (c < r) for c in range(p))


def offsets_from_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    """Cumulative offsets ``(0, s0, s0+s1, ...)`` of length ``len(sizes) + 1``."""
    return tuple(itertools.accumulate(sizes, initial=0))


def coords_to_rank(coords: Sequence[int], dims: Sequence[int]) -> int:
    """Row-major rank of grid coordinates (MPI Cartesian numbering)."""
    rank = 0
    for c, d in zip(coords, dims):
        rank = rank * d + c
    return rank


def rank_to_coords(rank: int, dims: Sequence[int]) -> tuple[int, ...]:
    """Inverse of :func:`coords_to_rank`."""
    coords = []
    for d in reversed(dims):
        rank, c = divmod(rank, d)
        coords.append(c)
    return tuple(reversed(coords))


def intersect_ranges(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """Intersection of half-open ranges, ``None`` when empty."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


@dataclass(frozen=True)
class Box:
    """An N-d half-open index box: ``start[i] <= idx[i] < stop[i]``."""

    start: tuple[int, ...]
    stop: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(max(0, b - a) for a, b in zip(self.start, self.stop))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in zip(self.start, self.stop))

    def shift(self, delta: Sequence[int]) -> "Box":
        return Box(tuple(a + d for a, d in zip(self.start, delta)),
                   tuple(b + d for b, d in zip(self.stop, delta)))

    def intersect(self, other: "Box") -> "Box | None":
        start = tuple(max(a, b) for a, b in zip(self.start, other.start))
        stop = tuple(min(a, b) for a, b in zip(self.stop, other.stop))
        if any(a >= b for a, b in zip(start, stop)):
            return None
        return Box(start, stop)


def _as_int(v, what: str) -> int:
    try:
        i = int(v)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be an integer, got {v!r}") from None
    if i != v:
        raise TypeError(f"{what} must be an integer, got {v!r}")
    return i


class Distribution:
    """Block distribution of a global array over a process grid (immutable, hashable).

    Parameters
    ----------
    shape : global array shape.
    grid_dims : shape of the process grid.
    split : one entry per tensor axis: the grid axis it is split over, or ``None``.
        A shorter sequence is padded with ``None``.
    sizes : optional, one entry per tensor axis: ``None`` (balanced) or the explicit
        ownership sizes along that axis (length = number of grid coordinates along its grid
        axis, summing to the extent; zeros allowed).  Must be ``None`` for axes not split.
    """

    __slots__ = ("shape", "grid_dims", "split", "offsets", "_hash", "_blocks")

    def __init__(self, shape: Sequence[int], grid_dims: Sequence[int],
                 split: Sequence[int | None] | None = None,
                 sizes: Sequence[Sequence[int] | None] | None = None):
        shape = tuple(_as_int(n, "array extent") for n in shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"negative extent in shape {shape}")
        grid_dims = tuple(_as_int(d, "grid extent") for d in grid_dims)
        if any(d < 1 for d in grid_dims):
            raise ValueError(f"grid extents must be >= 1, got {grid_dims}")
        ndim = len(shape)
        split = tuple(split) if split is not None else ()
        if len(split) > ndim:
            raise ValueError(f"split {split} has more entries than the array has axes ({ndim})")
        split = split + (None,) * (ndim - len(split))
        used = set()
        norm = []
        for t, g in enumerate(split):
            if g is None:
                norm.append(None)
                continue
            g = _as_int(g, "split entry")
            if not 0 <= g < len(grid_dims):
                raise ValueError(
                    f"split {split} names grid axis {g} for tensor axis {t}, but the grid "
                    f"{grid_dims} has only {len(grid_dims)} axes")
            if g in used:
                raise ValueError(f"split {split} uses grid axis {g} for more than one tensor axis")
            used.add(g)
            norm.append(g)
        split = tuple(norm)
        if sizes is None:
            sizes = (None,) * ndim
        sizes = tuple(sizes)
        if len(sizes) != ndim:
            raise ValueError(f"sizes has {len(sizes)} entries, the array has {ndim} axes")
        offsets = []
        for t, (n, g, s) in enumerate(zip(shape, split, sizes)):
            p = 1 if g is None else grid_dims[g]
            if s is None:
                s = balanced_sizes(n, p)
            else:
                s = tuple(_as_int(v, "ownership size") for v in s)
                if len(s) != p or any(v < 0 for v in s) or sum(s) != n:
                    raise ValueError(
                        f"ownership sizes {s} for axis {t} must be {p} non-negative integers "
                        f"summing to the extent {n}")
            offsets.append(offsets_from_sizes(s))
        self.shape = shape
        self.grid_dims = grid_dims
        self.split = split
        self.offsets = tuple(offsets)
        self._hash = hash((shape, grid_dims, split, self.offsets))
        self._blocks = {}  # grid coords -> (box, shape): asked for at every op on a block

    # -- basic properties --------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def grid_size(self) -> int:
        return math.prod(self.grid_dims)

    def sizes(self, axis: int) -> tuple[int, ...]:
        o = self.offsets[axis]
        return tuple(b - a for a, b in zip(o[:-1], o[1:]))

    @property
    def split_sizes(self) -> tuple[tuple[int, ...] | None, ...]:
        """Per tensor axis, its ownership sizes when split, else ``None``: the ``sizes``
        argument that rebuilds this distribution."""
        return tuple(self.sizes(t) if g is not None else None for t, g in enumerate(self.split))

    def is_balanced(self, axis: int) -> bool:
        return self.sizes(axis) == balanced_sizes(self.shape[axis], len(self.offsets[axis]) - 1)

    @property
    def replicated_grid_axes(self) -> tuple[int, ...]:
        """Grid axes no tensor axis is split over (ranks along them hold copies)."""
        used = {g for g in self.split if g is not None}
        return tuple(g for g in range(len(self.grid_dims)) if g not in used)

    @property
    def split_tensor_axes(self) -> tuple[int, ...]:
        return tuple(t for t, g in enumerate(self.split) if g is not None)

    def __eq__(self, other) -> bool:
        return (isinstance(other, Distribution) and self._hash == other._hash
                and self.shape == other.shape and self.grid_dims == other.grid_dims
                and self.split == other.split and self.offsets == other.offsets)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # rebuild on unpickling: the cached hash is process-specific (hash(None) varies)
        return (Distribution, (self.shape, self.grid_dims, self.split, list(self.split_sizes)))

    def __repr__(self) -> str:
        sizes = self.split_sizes
        return (f"Distribution(shape={self.shape}, grid_dims={self.grid_dims}, "
                f"split={self.split}, sizes={sizes})")

    # -- blocks ------------------------------------------------------------------------------
    def axis_coord(self, axis: int, grid_coords: Sequence[int]) -> int:
        """Block coordinate along tensor ``axis`` of the rank at ``grid_coords``."""
        g = self.split[axis]
        return 0 if g is None else grid_coords[g]

    def block_range(self, axis: int, coord: int) -> tuple[int, int]:
        o = self.offsets[axis]
        return o[coord], o[coord + 1]

    def block_box(self, grid_coords: Sequence[int]) -> Box:
        """Global index box owned by the rank at ``grid_coords`` (cached per coordinates: the
        distribution is immutable)."""
        return self._block(grid_coords)[0]

    def _block(self, grid_coords) -> tuple:
        try:
            hit = self._blocks.get(grid_coords)
        except TypeError:  # unhashable coordinates (a list)
            hit, grid_coords = None, tuple(grid_coords)
        if hit is None:
            rs = [self.block_range(t, self.axis_coord(t, grid_coords))
                  for t in range(self.ndim)]
            box = Box(tuple(r[0] for r in rs), tuple(r[1] for r in rs))
            if len(self._blocks) > 4096:
                self._blocks.clear()
            hit = self._blocks[tuple(grid_coords)] = (box, box.shape)
        return hit

    def block_slices(self, grid_coords: Sequence[int]) -> tuple[slice, ...]:
        return self.block_box(grid_coords).slices()

    def block_shape(self, grid_coords: Sequence[int]) -> tuple[int, ...]:
        return self._block(grid_coords)[1]

    def rank_box(self, rank: int) -> Box:
        return self.block_box(rank_to_coords(rank, self.grid_dims))

    def owner_coord(self, axis: int, index: int) -> int:
        """Block coordinate along ``axis`` that owns global ``index`` (``0 <= index < n``)."""
        n = self.shape[axis]
        if not 0 <= index < n:
            raise IndexError(f"index {index} is out of bounds for axis {axis} with size {n}")
        return bisect.bisect_right(self.offsets[axis], index) - 1

    def owner_coords(self, index: Sequence[int]) -> tuple[int | None, ...]:
        """Grid coordinates of the owner of a global element; ``None`` on replication axes."""
        if len(index) != self.ndim:
            raise IndexError(f"index {tuple(index)} has {len(index)} entries, array has {self.ndim} axes")
        coords: list[int | None] = [None] * len(self.grid_dims)
        for t, g in enumerate(self.split):
            c = self.owner_coord(t, index[t])
            if g is not None:
                coords[g] = c
        # replicated tensor axes still get bounds-checked above
        return tuple(coords)

    def coords_range_overlapping(self, axis: int, lo: int, hi: int) -> tuple[int, ...]:
        """Block coordinates (ascending) along ``axis`` whose non-empty block meets ``[lo, hi)``.

        Empty blocks never meet anything, so they are left out, also between two non-empty
        ones (which is why this is a tuple, not a ``range``)."""
        o = self.offsets[axis]
        p = len(o) - 1
        if lo >= hi:
            return ()
        first = max(bisect.bisect_right(o, lo) - 1, 0)
        last = min(bisect.bisect_left(o, hi) - 1, p - 1)
        return tuple(c for c in range(first, last + 1) if o[c] < o[c + 1])

    def replicas(self, grid_coords: Sequence[int]) -> list[int]:
        """Ranks (sorted) holding the same block as the rank at ``grid_coords``."""
        rep = self.replicated_grid_axes
        ranks = []
        for alt in itertools.product(*(range(self.grid_dims[g]) for g in rep)):
            c = list(grid_coords)
            for g, v in zip(rep, alt):
                c[g] = v
            ranks.append(coords_to_rank(c, self.grid_dims))
        return sorted(ranks)

    # -- derived distributions ---------------------------------------------------------------
    def with_sizes(self, axis: int, sizes: Sequence[int] | None, extent: int | None = None) -> "Distribution":
        """Same split, new extent and ownership sizes along ``axis``."""
        shape = list(self.shape)
        if extent is not None:
            shape[axis] = extent
        all_sizes = list(self.split_sizes)
        all_sizes[axis] = None if self.split[axis] is None else (None if sizes is None else tuple(sizes))
        return Distribution(shape, self.grid_dims, self.split, all_sizes)

    def restrict(self, axis: int, start: int, stop: int) -> "Distribution":
        """The part of this distribution inside ``[start, stop)`` along ``axis``, re-based at 0.

        Each block keeps the part of the range it owned (possibly nothing)."""
        o = self.offsets[axis]
        sizes = [max(0, min(b, stop) - max(a, start)) for a, b in zip(o[:-1], o[1:])]
        return self.with_sizes(axis, sizes, extent=stop - start)

    def slice_axis(self, axis: int, start: int, stop: int, step: int) -> "Distribution":
        """Distribution of ``x[..., start:stop:step, ...]`` (``step > 0``, normalized bounds)
        when every block keeps the selected elements it owns (no data moves)."""
        if step <= 0:
            raise ValueError("slice_axis needs a positive step")
        o = self.offsets[axis]
        sizes = [_count_selected(a, b, start, stop, step) for a, b in zip(o[:-1], o[1:])]
        return self.with_sizes(axis, sizes, extent=_count_selected(0, self.shape[axis], start, stop, step))

    def transpose(self, axes: Sequence[int]) -> "Distribution":
        sizes = [self.split_sizes[t] for t in axes]
        return Distribution([self.shape[t] for t in axes], self.grid_dims,
                            [self.split[t] for t in axes], sizes)

    def drop_axes(self, axes: Iterable[int]) -> "Distribution":
        axes = set(axes)
        keep = [t for t in range(self.ndim) if t not in axes]
        return Distribution([self.shape[t] for t in keep], self.grid_dims,
                            [self.split[t] for t in keep],
                            [self.split_sizes[t] for t in keep])


def _count_selected(a: int, b: int, start: int, stop: int, step: int) -> int:
    """Number of ``i`` in ``range(start, stop, step)`` with ``a <= i < b`` (``step > 0``)."""
    lo, hi = max(a, start), min(b, stop)
    if lo >= hi:
        return 0
    first = start + -(-(lo - start) // step) * step  # first selected index >= lo
    if first >= hi:
        return 0
    return (hi - 1 - first) // step + 1
