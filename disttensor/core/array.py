"""DistArray: a global N-d array whose blocks live on the ranks of a process grid.

Contract
--------
* Global metadata (``shape``, ``dtype``, ``distribution``, ``grid``) is the same on every rank;
  every function that takes DistArrays is collective over the grid's communicator and must be
  called by all its ranks in the same order.
* ``x.local`` is this rank's owned block (a NumPy or CuPy array, a view into ``x.buffer``,
  which also holds the halo cells when the array has a halo).
* Elementwise operations follow NumPy (broadcasting, dtype promotion, ``out=``, ``where=``)
  through ``__array_ufunc__``; NumPy functions such as ``np.sum`` or ``np.concatenate`` are
  dispatched through ``__array_function__``.

Operands with different distributions (the alignment rule)
----------------------------------------------------------
The result of an elementwise operation takes the layout of ``out=`` if given, else of the
first DistArray operand whose shape equals the broadcast result shape.  When no operand has
the full shape, each result axis takes the split (and ownership sizes) of the first DistArray
operand that is not broadcast along it, if that grid axis is still free.  Every other operand
is then redistributed to match: its non-broadcast axes get the result's split and ownership,
its broadcast (length-1) axes are replicated.  NumPy arrays and scalars are treated as
replicated values (every rank must pass the same).  Operands must live on grids over the same
ranks; a different grid shape is fine (the data is redistributed).

Argument agreement
------------------
Every collective method agrees its arguments before any data moves
(:mod:`disttensor.core.entry`): an argument that differs between ranks raises
:class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank instead of hanging.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .backend import array_module, device_of, to_host, xp_for
from .distribution import Distribution
from .entry import (agreed, canon, collective_entry, device_key, dtype_key, halo_key,
                    split_key)
from .grid import ProcessGrid, get_default_grid
from .array_methods import NumPyMethods
from .layout import default_split, make_distribution, normalize_halo
from .memory import check_gather_size

__all__ = ["DistArray"]


_NO_HALO = {n: ((0, 0),) * n for n in range(9)}  # the zero halo of each number of axes


class DistArray(NumPyMethods):
    """A distributed N-d array (see module docstring).  Create with :func:`disttensor.zeros`,
    :func:`disttensor.from_global`, ...; ``DistArray(buffer, distribution, grid, halo)`` wraps an
    existing local buffer without checks.  The NumPy methods (``x.sum()``, ``x.ravel()``, ...)
    come from :class:`~disttensor.core.array_methods.NumPyMethods`."""

    __array_priority__ = 1000

    def __init__(self, buffer, distribution: Distribution, grid: ProcessGrid, halo=None):
        self._buffer = buffer
        self._dist = distribution
        self._grid = grid
        if halo is None:  # (the common case: no halo, the buffer is the block)
            self._halo = _NO_HALO.get(len(distribution.shape)) or normalize_halo(
                None, len(distribution.shape))
            self._local = buffer
            return
        self._halo = normalize_halo(halo, distribution.ndim)
        self._local = buffer[tuple(slice(lo, lo + n) for (lo, _), n in
                                   zip(self._halo, distribution.block_shape(grid.coords)))] \
            if any(lo or hi for lo, hi in self._halo) else buffer

    # -- construction helpers -----------------------------------------------------------------
    @classmethod
    @collective_entry
    def from_local(cls, local, grid: ProcessGrid | None = None, split=None, sizes=None,
                   distribution: Distribution | None = None) -> "DistArray":
        """Collective: wrap per-rank blocks.  Without ``sizes``/``distribution`` the ownership
        sizes are taken from the blocks' extents along the split axes (allgathered), and the
        global shape follows.  Raises on every rank if the blocks do not fit together.

        The ranks agree on ``grid``, ``split``, ``sizes``, ``distribution`` and the blocks'
        number of axes, dtype and device (the blocks themselves are rank-local)."""
        from .distribution import rank_to_coords
        grid = get_default_grid() if grid is None else grid
        local_shape = tuple(local.shape)
        nd = len(local_shape)
        with agreed(grid.cart, "from_local", rank_local=True, grid=grid,
                    split=split_key(split, nd), sizes=canon(sizes), distribution=distribution,
                    ndim=nd, dtype=dtype_key(getattr(local, "dtype", None)),
                    device=device_of(local)):
            if distribution is None:
                if split is None:
                    split = default_split(nd, grid)
                elif isinstance(split, numbers.Integral):
                    split = split_key(split, nd)
                split = tuple(split) + (None,) * (nd - len(tuple(split)))
            else:
                want = distribution.block_shape(grid.coords)
                if local_shape != want:
                    raise ValueError(f"local block of shape {local_shape} does not match the "
                                     f"distribution's block {want} on rank {grid.rank}")
        if distribution is None:
            # every rank checks every block (the same gathered shapes): no further agreement
            shapes = grid.cart.allgather(local_shape)
            if any(len(s) != nd for s in shapes):
                raise ValueError(f"local blocks have different numbers of axes: {shapes}")
            glob, all_sizes = [], []
            for t, g in enumerate(split):
                if g is None:
                    ext = {s[t] for s in shapes}
                    if len(ext) != 1:
                        raise ValueError(f"axis {t} is not split but the local extents "
                                         f"differ between ranks: {sorted(ext)}")
                    glob.append(ext.pop())
                    all_sizes.append(None)
                else:
                    per = {}
                    for r, s in enumerate(shapes):
                        c = rank_to_coords(r, grid.dims)[g]
                        if per.setdefault(c, s[t]) != s[t]:
                            raise ValueError(f"ranks at grid coordinate {c} along grid axis {g}"
                                             f" hold different extents of tensor axis {t}")
                    sz = [per[c] for c in range(grid.dims[g])]
                    glob.append(sum(sz))
                    all_sizes.append(sz)
            # explicit ownership sizes are checked against the blocks (below), not ignored
            distribution = Distribution(glob, grid.dims, split,
                                        all_sizes if sizes is None else sizes)
            for r, s in enumerate(shapes):
                want = distribution.block_shape(rank_to_coords(r, grid.dims))
                if s != want:
                    raise ValueError(f"local block of shape {s} does not match the "
                                     f"distribution's block {want} on rank {r}")
        return cls(local, distribution, grid)

    def _new(self, local, distribution: Distribution | None = None) -> "DistArray":
        return DistArray(local, self._dist if distribution is None else distribution, self._grid)

    # -- metadata -----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._dist.shape

    @property
    def ndim(self) -> int:
        return self._dist.ndim

    @property
    def size(self) -> int:
        return math.prod(self._dist.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._buffer.dtype

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def distribution(self) -> Distribution:
        return self._dist

    @property
    def grid(self) -> ProcessGrid:
        return self._grid

    @property
    def split(self) -> tuple[int | None, ...]:
        return self._dist.split

    @property
    def local(self):
        """This rank's owned block (view into :attr:`buffer`)."""
        return self._local

    @property
    def buffer(self):
        """This rank's whole local buffer: owned block plus halo cells."""
        return self._buffer

    @property
    def halo(self) -> tuple[tuple[int, int], ...]:
        return self._halo

    @property
    def local_slices(self) -> tuple[slice, ...]:
        """Global index slices of the owned block."""
        return self._dist.block_slices(self._grid.coords)

    @property
    def local_shape(self) -> tuple[int, ...]:
        return tuple(self._local.shape)

    @property
    def device(self) -> str:
        return device_of(self._buffer)

    @property
    def xp(self):
        return array_module(self._buffer)

    @property
    def T(self) -> "DistArray":
        return self.transpose()

    def __array_namespace__(self, *, api_version=None):
        """The array API namespace :mod:`disttensor.array_api` (standard version 2024.12;
        ``api_version`` ``None`` or one of 2021.12 ... 2024.12)."""
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"unsupported array API version {api_version!r}")
        from .. import array_api
        return array_api

    @property
    def mT(self) -> "DistArray":
        """The last two axes swapped (no data moves)."""
        from ..linalg import matrix_transpose
        return matrix_transpose(self)

    def __matmul__(self, other):
        from ..linalg import matmul
        return matmul(self, other)

    def __rmatmul__(self, other):
        from ..linalg import matmul
        return matmul(other, self)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d DistArray")
        return self.shape[0]

    def __repr__(self) -> str:
        """Never communicates (safe on one rank: pytest, debuggers, error messages): NumPy's
        repr when this rank holds every value, else the metadata and this rank's block
        (:mod:`disttensor.core.printing`)."""
        from .printing import local_repr
        return local_repr(self)

    def __str__(self) -> str:
        """The values as NumPy prints them (:mod:`disttensor.core.printing`): a 0-d array's
        value on every rank (no communication: it is replicated); otherwise collective, the
        text (summarised as NumPy would; only the shown elements are gathered) on rank 0 of the
        grid and ``""`` on the other ranks, so ``print(x)`` on every rank shows it once."""
        from .printing import to_str
        return to_str(self)

    def __format__(self, spec: str) -> str:
        """As NumPy: a 0-d array formats as its scalar on every rank, without communication
        (``f"{x.sum():.2f}"``); otherwise an empty ``spec`` is ``str(x)`` and any other spec
        raises ``TypeError``."""
        if self.ndim == 0:
            return format(to_host(self._local)[()], spec)
        if spec:
            raise TypeError("unsupported format string passed to DistArray.__format__")
        return str(self)

    # -- halo ---------------------------------------------------------------------------------
    @collective_entry
    def with_halo(self, halo) -> "DistArray":
        """A copy of this array whose buffer has ``halo`` cells (an int, per-axis ints, or
        per-axis ``(lo, hi)`` pairs); halo cells are zero until exchanged (collective: the
        ranks agree on ``halo``)."""
        with agreed(self._grid.cart, "with_halo", x=self, halo=halo_key(halo, self.ndim)):
            h = normalize_halo(halo, self.ndim)
        shape = tuple(lo + n + hi for (lo, hi), n in zip(h, self.local_shape))
        buf = self.xp.zeros(shape, dtype=self.dtype)
        out = DistArray(buf, self._dist, self._grid, h)
        out.local[...] = self._local
        return out

    def zero_halo(self) -> None:
        """Set every halo cell of the local buffer to zero (local, not collective)."""
        nd = self.ndim
        for t, (lo, hi) in enumerate(self._halo):
            for sl in ((slice(0, lo),) if lo else ()) + ((slice(lo + self.local_shape[t], None),) if hi else ()):
                idx = [slice(None)] * nd
                idx[t] = sl
                self._buffer[tuple(idx)] = 0

    def halo_exchange(self, boundary="zero"):
        """A split-phase :class:`~disttensor.core.halo.HaloExchange` of this array (collective):
        ``h = x.halo_exchange(); h.begin(); ...interior work...; h.end()``."""
        from .halo import HaloExchange
        return HaloExchange(self, boundary)

    def exchange_halo(self, boundary="zero") -> "DistArray":
        """Fill the halo cells now (collective); returns ``self``."""
        self.halo_exchange(boundary).exchange()
        return self

    def reverse_exchange_halo(self, boundary="zero") -> "DistArray":
        """Adjoint of :meth:`exchange_halo`: add halo cells into their owners, zero the halo."""
        self.halo_exchange(boundary).reverse()
        return self

    # -- data movement ------------------------------------------------------------------------
    @collective_entry
    def redistribute(self, grid: ProcessGrid | None = None, split=None, sizes=None,
                     distribution: Distribution | None = None) -> "DistArray":
        """This array under another block distribution, possibly on another grid over the
        same ranks (collective; point-to-point messages to the ranks whose blocks meet, see
        :mod:`disttensor.core.redistribute`)."""
        from .redistribute import redistribute_blocks
        grid = self._grid if grid is None else grid
        with agreed(self._grid.cart, "redistribute", x=self, grid=grid,
                    split=split_key(split, self.ndim), sizes=canon(sizes),
                    distribution=distribution):
            if distribution is None:
                if split is None and sizes is None and grid is self._grid:
                    split = self.split
                grid, distribution = make_distribution(self.shape, grid, split, sizes)
            if not isinstance(grid, ProcessGrid):
                raise TypeError(f"grid must be a ProcessGrid, got {type(grid).__name__}")
            _check_grids(self._grid, grid)
            if distribution.shape != self.shape:
                raise ValueError(f"target distribution has shape {distribution.shape}, array has "
                                 f"{self.shape}")
            if grid.dims != distribution.grid_dims:
                raise ValueError(f"distribution grid {distribution.grid_dims} != grid {grid.dims}")
        if distribution == self._dist and grid is self._grid:
            return self.copy()
        local = redistribute_blocks(grid.cart, self._local, self._dist, distribution)
        return DistArray(local, distribution, grid)

    @collective_entry
    def redistribute_adjoint(self, like: "DistArray") -> "DistArray":
        """Adjoint of ``like.redistribute(...)`` applied to this array (collective): a DistArray
        with ``like``'s distribution (see :mod:`disttensor.core.redistribute`)."""
        from .redistribute import redistribute_adjoint_blocks
        with agreed(self._grid.cart, "redistribute_adjoint", x=self, like=like):
            if not isinstance(like, DistArray):
                raise TypeError(f"like must be a DistArray, got {type(like).__name__}")
            _check_grids(self._grid, like._grid)
            if like.shape != self.shape:
                raise ValueError(f"like has shape {like.shape}, the array has {self.shape}")
        local = redistribute_adjoint_blocks(self._grid.cart, self._local, like._dist, self._dist)
        return DistArray(local, like._dist, like._grid)

    @collective_entry
    def gather(self, root: int = 0):
        """Collective: the global array (NumPy) on ``root``, ``None`` elsewhere (``ValueError``
        on every rank beyond ``DISTTENSOR_GATHER_LIMIT`` bytes, see
        :func:`disttensor.core.memory.gather_limit`)."""
        from .redistribute import redistribute_blocks
        comm = self._grid.cart
        with agreed(comm, "gather", x=self, root=root):
            if not isinstance(root, numbers.Integral) or not 0 <= root < comm.size:
                raise ValueError(f"root {root} outside 0..{comm.size - 1}")
            check_gather_size("gather", self, what="gathering the array puts",
                              where=f"on rank {root}")
        local = to_host(self._local)
        if self.ndim == 0:
            return np.array(local) if comm.rank == root else None
        sizes = [0] * comm.size
        sizes[root] = self.shape[0]
        target = Distribution(self.shape, (comm.size,), (0,), [sizes] + [None] * (self.ndim - 1))
        out = redistribute_blocks(comm, np.ascontiguousarray(local), self._dist, target)
        return out if comm.rank == root else None

    @collective_entry
    def to_numpy(self) -> np.ndarray:
        """Collective: the global array as NumPy on every rank (``ValueError`` on every rank
        beyond ``DISTTENSOR_GATHER_LIMIT`` bytes, see
        :func:`disttensor.core.memory.gather_limit`; ``np.asarray(x)`` is this too)."""
        from .redistribute import redistribute_blocks
        with agreed(self._grid.cart, "to_numpy", x=self):
            check_gather_size("to_numpy", self, what="gathering the array puts")
        if self.ndim == 0:
            return np.array(to_host(self._local))
        local = np.ascontiguousarray(to_host(self._local))
        target = Distribution(self.shape, self._dist.grid_dims, (None,) * self.ndim)
        return redistribute_blocks(self._grid.cart, local, self._dist, target)

    def __array__(self, dtype=None, copy=None):
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype)

    def item(self):
        """The only element as a Python scalar: local for a 0-d array (its value is
        replicated), collective (gathered) for other arrays of size 1."""
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        if self.ndim == 0:
            return to_host(self._local).item()
        return self.to_numpy().item()

    # Python scalar conversions: collective (the value is gathered), with NumPy's rules and
    # messages, checked on the global shape and dtype, so every rank raises alike
    def _scalar(self):
        if self.ndim != 0:
            raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
        return self.item()

    def __float__(self):
        return float(self._scalar())

    def __complex__(self):
        return complex(self._scalar())

    def __int__(self):
        return int(self._scalar())

    def __bool__(self):
        if self.size == 0:
            raise ValueError("The truth value of an empty array is ambiguous. Use `array.size "
                             "> 0` to check that an array is not empty.")
        if self.size > 1:
            raise ValueError("The truth value of an array with more than one element is "
                             "ambiguous. Use a.any() or a.all()")
        return bool(self.item())

    def __index__(self):
        if self.ndim != 0 or self.dtype.kind not in "iu":
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(self.item())

    @collective_entry
    def to_device(self, device: str, /, *, stream=None) -> "DistArray":
        """A copy of this array with its blocks on ``device`` (``'cpu'`` or ``'cuda'``;
        collective: the ranks agree on ``device``).  ``stream`` (array API) must be
        ``None``: copies run on the current stream."""
        # rank_local: whether a GPU is there is a property of the node, not of the arguments
        with agreed(self._grid.cart, "to_device", rank_local=True, x=self,
                    device=device_key(device), stream=stream is None):
            if stream is not None:
                raise ValueError("to_device: only stream=None is supported")
            xp = xp_for(device if device != "gpu" else "cuda")
        buf = to_host(self._buffer) if xp is np else xp.asarray(self._buffer)
        if buf is self._buffer:
            buf = buf.copy()
        return DistArray(buf, self._dist, self._grid, self._halo)

    # -- copies and casts ---------------------------------------------------------------------
    @collective_entry
    def copy(self) -> "DistArray":
        """A copy (collective, as every call on a DistArray)."""
        with agreed(self._grid.cart, "copy", x=self):
            pass
        return self._new(self._local.copy())

    @collective_entry
    def astype(self, dtype, copy: bool = True) -> "DistArray":
        """This array cast to ``dtype`` (collective: the ranks agree on ``dtype``)."""
        with agreed(self._grid.cart, "astype", x=self, dtype=dtype_key(dtype), copy=bool(copy)):
            dtype = np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        return self._new(self._local.astype(dtype))

    # -- NumPy protocols ----------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from ..routines.ufuncs import array_ufunc
        return array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from ..routines.array_function import implementation
        impl = implementation(func)
        if impl is None:
            raise TypeError(f"numpy.{func.__name__} is not supported for DistArray; "
                            "use x.to_numpy() for a global NumPy copy")
        return impl(*args, **kwargs)

    # -- indexing (the NumPy methods: core/array_methods.py) --------------------------------
    def __getitem__(self, key):
        from ..routines.indexing import getitem
        return getitem(self, key)

    def __setitem__(self, key, value):
        from ..routines.indexing import setitem
        setitem(self, key, value)


def _check_grids(a: ProcessGrid, b: ProcessGrid) -> None:
    if not a.compatible(b):
        raise ValueError("the two grids are over different communicators; data cannot move "
                         "between them")


def _binary(ufunc):
    def fwd(self, other):
        return ufunc(self, other)

    def rev(self, other):
        return ufunc(other, self)

    def inplace(self, other):
        return ufunc(self, other, out=(self,))
    return fwd, rev, inplace


for _name, _uf in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                   ("truediv", np.true_divide), ("floordiv", np.floor_divide),
                   ("mod", np.remainder), ("pow", np.power), ("and", np.bitwise_and),
                   ("or", np.bitwise_or), ("xor", np.bitwise_xor), ("lshift", np.left_shift),
                   ("rshift", np.right_shift)]:
    _f, _r, _i = _binary(_uf)
    setattr(DistArray, f"__{_name}__", _f)
    setattr(DistArray, f"__r{_name}__", _r)
    setattr(DistArray, f"__i{_name}__", _i)

for _name, _uf in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                   ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)]:
    setattr(DistArray, f"__{_name}__", _binary(_uf)[0])

DistArray.__neg__ = lambda self: np.negative(self)
DistArray.__pos__ = lambda self: np.positive(self)
DistArray.__abs__ = lambda self: np.absolute(self)
DistArray.__invert__ = lambda self: np.invert(self)
DistArray.__divmod__ = lambda self, other: np.divmod(self, other)
DistArray.__hash__ = None
