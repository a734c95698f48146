"""ProcessGrid: a Cartesian grid of MPI ranks."""
from __future__ import annotations

import math
from typing import Sequence

from mpi4py import MPI

from .comm import check_same, collective
from .distribution import coords_to_rank, rank_to_coords

__all__ = ["ProcessGrid", "get_default_grid", "set_default_grid"]


class ProcessGrid:
    """A Cartesian process grid over a communicator (collective to create).

    Parameters
    ----------
    dims : grid shape; ``0`` entries are filled by ``MPI.Compute_dims``.  ``None`` gives a
        1-D grid over all ranks.  The product must equal the communicator size.
    comm : the communicator (default ``MPI.COMM_WORLD``).
    periods : per grid axis, whether :meth:`neighbor` wraps around (default: no axis).

    Ranks are numbered row-major over the grid (``reorder=False``), so a rank's grid
    coordinates are a pure function of its rank in ``comm`` (see
    :func:`disttensor.core.distribution.rank_to_coords`).
    """

    def __init__(self, dims: Sequence[int] | int | None = None, comm: MPI.Comm | None = None,
                 periods: Sequence[bool] | bool | None = None):
        comm = MPI.COMM_WORLD if comm is None else comm
        with collective(comm):
            if dims is None:
                dims = (0,)
            elif isinstance(dims, int):
                dims = (dims,)
            dims = tuple(dims)
            if not dims or any((not isinstance(d, int)) or d < 0 for d in dims):
                raise ValueError(f"grid dims must be non-negative integers, got {dims}")
            fixed = math.prod(d for d in dims if d > 0)
            if 0 in dims:
                if comm.size % fixed:
                    raise ValueError(f"grid dims {dims} cannot be completed for {comm.size} ranks")
                dims = tuple(MPI.Compute_dims(comm.size, list(dims)))
            if math.prod(dims) != comm.size:
                raise ValueError(f"grid dims {dims} hold {math.prod(dims)} ranks but the "
                                 f"communicator has {comm.size}")
            if periods is None:
                periods = (False,) * len(dims)
            elif isinstance(periods, bool):
                periods = (periods,) * len(dims)
            periods = tuple(bool(p) for p in periods)
            if len(periods) != len(dims):
                raise ValueError(f"periods {periods} must have one entry per grid axis {dims}")
        check_same(comm, (dims, periods), "grid dims and periods")
        self.comm = comm
        self.dims: tuple[int, ...] = dims
        self.periods: tuple[bool, ...] = periods
        self.cart: MPI.Cartcomm = comm.Create_cart(list(dims), list(periods), reorder=False)
        self.rank: int = self.cart.rank
        self.coords: tuple[int, ...] = rank_to_coords(self.rank, dims)
        self._subs: dict[tuple[int, ...], MPI.Comm] = {}

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    def __repr__(self) -> str:
        return f"ProcessGrid(dims={self.dims}, periods={self.periods}, rank={self.rank}, coords={self.coords})"

    def rank_of(self, coords: Sequence[int]) -> int:
        """Rank at grid ``coords`` (no wrap-around)."""
        if len(coords) != self.ndim or any(not 0 <= c < d for c, d in zip(coords, self.dims)):
            raise IndexError(f"grid coordinates {tuple(coords)} outside the grid {self.dims}")
        return coords_to_rank(coords, self.dims)

    def coords_of(self, rank: int) -> tuple[int, ...]:
        if not 0 <= rank < self.size:
            raise IndexError(f"rank {rank} outside a grid of {self.size} ranks")
        return rank_to_coords(rank, self.dims)

    def neighbor(self, axis: int, disp: int = 1, periodic: bool | None = None) -> int:
        """Rank ``disp`` steps along grid ``axis``; ``MPI.PROC_NULL`` past a non-periodic edge."""
        if not 0 <= axis < self.ndim:
            raise ValueError(f"grid axis {axis} outside a {self.ndim}-d grid")
        periodic = self.periods[axis] if periodic is None else periodic
        c = list(self.coords)
        c[axis] += disp
        if periodic:
            c[axis] %= self.dims[axis]
        elif not 0 <= c[axis] < self.dims[axis]:
            return MPI.PROC_NULL
        return coords_to_rank(c, self.dims)

    def neighbors(self, axis: int, periodic: bool | None = None) -> tuple[int, int]:
        """``(lower, upper)`` neighbour ranks along grid ``axis``."""
        return self.neighbor(axis, -1, periodic), self.neighbor(axis, 1, periodic)

    def sub_comm(self, axes: Sequence[int]) -> MPI.Comm:
        """Communicator over the ranks that differ only along grid ``axes`` (collective on
        first use for a given set of axes; cached).  Ranks in it are row-major over ``axes``."""
        if type(axes) is tuple:  # (a sorted tuple of ints, as plans keep it: one look-up)
            sub = self._subs.get(axes)
            if sub is not None:
                return sub
        key = tuple(sorted(set(int(a) for a in axes)))
        if any(not 0 <= a < self.ndim for a in key):
            raise ValueError(f"grid axes {tuple(axes)} outside a {self.ndim}-d grid")
        sub = self._subs.get(key)
        if sub is None:
            if len(key) == self.ndim:
                sub = self.cart
            elif not key:
                # MPI_Cart_sub with no axis kept should give every rank a 0-d topology of
                # size 1, but MPICH hands MPI_COMM_NULL to all ranks but one; COMM_SELF is
                # exactly the communicator asked for.
                sub = MPI.COMM_SELF.Dup()
            else:
                sub = self.cart.Sub([g in key for g in range(self.ndim)])
            self._subs[key] = sub
        return sub

    def same_as(self, other: "ProcessGrid") -> bool:
        """Whether ``other`` has the same shape over a congruent communicator."""
        if self is other:
            return True
        return (self.dims == other.dims and
                MPI.Comm.Compare(self.comm, other.comm) in (MPI.IDENT, MPI.CONGRUENT))

    def compatible(self, other: "ProcessGrid") -> bool:
        """Whether data can move between the two grids (same ranks, same order)."""
        return self is other or MPI.Comm.Compare(self.comm, other.comm) in (MPI.IDENT, MPI.CONGRUENT)

    def free(self) -> None:
        """Free the communicators (collective)."""
        for key, c in self._subs.items():
            if c is not self.cart:
                c.Free()
        self._subs.clear()
        self.cart.Free()


_default_grid: ProcessGrid | None = None


def get_default_grid() -> ProcessGrid:
    """The grid used when ``grid=`` is omitted: 1-D over ``COMM_WORLD`` unless set
    (created collectively on first use)."""
    global _default_grid
    if _default_grid is None:
        _default_grid = ProcessGrid()
    return _default_grid


def set_default_grid(grid: ProcessGrid | None) -> None:
    """Set (or with ``None`` reset) the default grid."""
    global _default_grid
    if grid is not None and not isinstance(grid, ProcessGrid):
        raise TypeError(f"expected a ProcessGrid, got {type(grid).__name__}")
    _default_grid = grid
