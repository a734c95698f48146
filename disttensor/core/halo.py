"""Halo exchange on a DistArray's buffer, split phase, and its adjoint.

A DistArray created with a halo stores its owned block inside a larger local *buffer*: ``lo``
extra cells below and ``hi`` above along every axis (``x.local`` is the interior view, so a
stencil reads neighbours' values without a copy).  :class:`HaloExchange` fills the halo cells
from the ranks that own them (faces, edges and corners, each straight from its owner; see
:mod:`disttensor.core.plans`) or with zeros beyond a non-periodic global boundary.

``begin()`` posts every receive and send and does the local copies; ``end()`` waits.  Work on
the interior between the two overlaps the messages.  ``reverse_begin()/reverse_end()`` is
the adjoint: every halo cell is sent back to its owner and *added* there, then the halo is
zeroed (this is what a backward pass needs after a forward stencil read the halo).

Messages go point to point on a private duplicate of the grid's communicator (so an exchange
in flight never matches other traffic).  A piece that is contiguous in the buffer (a face
normal to axis 0, say) moves straight from/to the buffer; any other is packed into contiguous
scratch allocated once per :class:`HaloExchange` (see :class:`disttensor.core.comm.PieceExchange`
for why not MPI subarray datatypes).  GPU buffers are packed on the device and go through host
memory unless MPI is CUDA-aware (``disttensor.core.comm.cuda_aware_mpi``).  Reuse one
``x.halo_exchange()`` object for repeated exchanges: it keeps the plan, the views, the
scratch and persistent MPI requests, so an exchange is one ``MPI_Startall``/``MPI_Waitall``
pair plus the zero fills, local copies and packs (measured within ~1.0-1.2x of a bare
``MPI_Sendrecv`` of the same bytes for contiguous faces of 4 KiB-2 MiB,
``bench/halo_bench.py``).  :func:`reverse_window` is the adjoint of "exchange, then read a
window" computed straight from the window's gradient (what the window ops' backward uses).

:class:`EdgeFill` runs after an exchange and refills the halo cells beyond a non-periodic global
boundary the way ``np.pad`` does, axis after axis: ``'reflect'`` (``np.pad``'s ``'symmetric'``:
the edge cell is repeated, Dask's ``'reflect'``), ``'nearest'`` (``'edge'``) or a constant.
The cells it copies may live on other ranks (a block thinner than the halo): they come point to
point from their owners, one exchange per axis.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from . import buffer_pool as _pool
from .comm import PieceExchange, copier, copy_into, private_comm, zero_filler
from .distribution import Distribution, coords_to_rank
from .plans import CommPlan, halo_plan

__all__ = ["HaloExchange", "plan", "normalize_boundary", "reverse_window", "EdgeFill",
           "check_edge_modes"]

_REVERSE_TAG = 1 << 14


@lru_cache(maxsize=512)
def plan(dist: Distribution, rank: int, lo: tuple[int, ...], hi: tuple[int, ...],
         periodic: tuple[bool, ...]) -> CommPlan:
    p = halo_plan(dist, rank, lo, hi, periodic)
    if any(t.tag >= _REVERSE_TAG for t in p.recvs):
        raise ValueError("halo too wide: it spans too many blocks for one exchange")
    return p


def normalize_boundary(boundary, ndim: int) -> tuple[bool, ...]:
    """``'zero'``/``'periodic'`` (all axes) or one of them per axis -> periodic flags."""
    def one(b):
        if b in ("zero", "zeros", None, False):
            return False
        if b in ("periodic", "wrap", True):
            return True
        raise ValueError(f"halo boundary must be 'zero' or 'periodic', got {b!r}")
    if isinstance(boundary, (str, bool)) or boundary is None:
        return (one(boundary),) * ndim
    boundary = tuple(boundary)
    if len(boundary) != ndim:
        raise ValueError(f"boundary {boundary} needs one entry per axis ({ndim})")
    return tuple(one(b) for b in boundary)


def _zero_fill(v):
    """The fastest way to zero one (precomputed) view, as a function of one ignored argument:
    ``memset`` for a large contiguous one (measured ~3x faster than ``ndarray.fill`` at
    256 KiB: all-zero bytes are 0 in every numeric dtype), ``fill`` for a small one (a ctypes
    call costs more below ~32 KiB), the run merging of :func:`disttensor.core.comm.fill_zero` for
    a strided one (its merged view made once, :func:`disttensor.core.comm.zero_filler`)."""
    if type(v) is np.ndarray and v.flags.c_contiguous and not v.dtype.hasobject:
        if v.nbytes >= 32768:
            addr, n, memset = v.ctypes.data, v.nbytes, ctypes.memset
            return lambda value, _keep=v: memset(addr, 0, n)
        flat = v.reshape(-1)   # an unsigned view: fill(0) then needs no conversion
        for ut in (np.uint64, np.uint32, np.uint16, np.uint8):
            if v.dtype.itemsize % np.dtype(ut).itemsize == 0:
                return flat.view(ut).fill
        return v.fill
    return zero_filler(v)


class HaloExchange:
    """A reusable, split-phase halo exchange of ``x``'s buffer (collective).

    ``x`` must have a halo (see :meth:`DistArray.with_halo`); ``boundary`` is ``'zero'`` or
    ``'periodic'``, or one of these per axis.  A non-periodic halo wider than the global
    extent of its axis is an error (raised on every rank).  ``persistent=False`` for an
    object used once: plain ``Isend``/``Irecv`` instead of persistent requests.

    Construction agrees the arguments (``x``'s metadata and the boundary) across the ranks,
    one all-reduce, unless it runs inside a collective entry point that agreed already (a
    window op exchanging the halo it derived from its agreed arguments, see
    :func:`disttensor.core.entry.nested`).  Each exchange after that is purely point to point:
    the plan, the views of the buffer's pieces, the zero-fill and local-copy work lists and
    the persistent MPI requests (:class:`~disttensor.core.comm.PieceExchange`) are made once, so
    :meth:`exchange` costs one ``MPI_Startall``/``MPI_Waitall`` pair plus the fills, copies
    and packs; every rank must make the same sequence of exchange calls on its object."""

    def __init__(self, x, boundary="zero", persistent: bool = True):
        from .entry import agreed
        self.persistent = persistent   # False: one-shot use, plain Isend/Irecv
        self.x = x
        dist = x.distribution
        self.comm: MPI.Comm = x.grid.cart
        lo = tuple(h[0] for h in x.halo)
        hi = tuple(h[1] for h in x.halo)
        # Validate before the first message, and agree on it: the widths and the boundary are
        # per-rank arguments, and a rank whose plan differs would leave its peers waiting.
        try:  # agree on the meaning ('zero' and 'zeros' are the same), else on the spelling
            bnd = normalize_boundary(boundary, x.ndim)
        except ValueError:
            bnd = boundary
        with agreed(self.comm, "halo_exchange", x=x, boundary=bnd):
            self.periodic = normalize_boundary(boundary, x.ndim)
            for t, (a, b, per) in enumerate(zip(lo, hi, self.periodic)):
                if not per and max(a, b) > dist.shape[t]:
                    raise ValueError(
                        f"halo ({a}, {b}) on axis {t} is wider than its global extent "
                        f"{dist.shape[t]} and the axis is not periodic")
            self.plan = plan(dist, self.comm.rank, lo, hi, self.periodic)
        self.pcomm: MPI.Comm = private_comm(self.comm, "halo") if self.comm.size > 1 else self.comm
        buf = x.buffer
        p = self.plan
        self._zero = [_zero_fill(buf[box.slices()]) for box in p.zero]
        self._local = [(buf[d.slices()], buf[s.slices()]) for s, d in p.local]
        self._copies = [copier(d, s) for d, s in self._local]
        self._forward: PieceExchange | None = None
        self._reverse: PieceExchange | None = None
        self._mode: str | None = None

    def _engine(self, reverse: bool) -> PieceExchange:
        """The message part of the exchange, built on first use and reused: views of the
        buffer's boxes, contiguous scratch for the pieces that need packing, persistent
        requests."""
        buf = self.x.buffer
        p = self.plan
        if not reverse:
            if self._forward is None:
                self._forward = PieceExchange(
                    self.pcomm, [(t.peer, t.tag, buf[t.box.slices()]) for t in p.sends],
                    [(t.peer, t.tag, buf[t.box.slices()]) for t in p.recvs],
                    persistent=self.persistent)
            return self._forward
        if self._reverse is None:
            self._reverse = PieceExchange(
                self.pcomm,
                [(t.peer, t.tag + _REVERSE_TAG, buf[t.box.slices()]) for t in p.recvs],
                [(t.peer, t.tag + _REVERSE_TAG, buf[t.box.slices()]) for t in p.sends],
                accumulate=True, persistent=self.persistent)
        return self._reverse

    def prepare(self, reverse: bool = False) -> "HaloExchange":
        """Make the forward exchange's views, scratch and persistent requests now rather than
        at the first exchange (with ``reverse``, the reverse exchange's too; local, no
        message)."""
        self._engine(reverse=False).prepare()
        if reverse:
            self._engine(reverse=True).prepare()
        return self

    def free(self) -> None:
        """Free the persistent MPI requests now (they are also freed with the object)."""
        for e in (self._forward, self._reverse):
            if e is not None:
                e.free()
        self._forward = self._reverse = None

    @property
    def nbytes_sent(self) -> int:
        """Bytes this rank sends in one (forward) exchange."""
        return sum(t.box.size for t in self.plan.sends) * self.x.dtype.itemsize

    # -- forward --------------------------------------------------------------------------------
    def begin(self) -> "HaloExchange":
        """Post all messages of the exchange, then do the zero fills and local copies (while
        the messages fly)."""
        if self._mode is not None:
            raise RuntimeError("halo exchange already in progress; call end() first")
        (self._forward or self._engine(reverse=False)).start()
        self._mode = "forward"
        for fill in self._zero:
            fill(0)
        for copy in self._copies:
            copy()
        return self

    def end(self) -> None:
        """Wait for the exchange begun by :meth:`begin` (and unpack what needs it)."""
        if self._mode != "forward":
            raise RuntimeError("end() without a matching begin()")
        self._mode = None
        self._forward.finish()

    def test(self) -> bool:
        """Whether the messages of the exchange in flight (:meth:`begin` or
        :meth:`reverse_begin`) have all arrived (non-blocking ``MPI_Testall``: it drives MPI
        progress, which a rendezvous message between processes needs on both sides while the
        caller computes; see :mod:`disttensor.core.progress`).  :meth:`end` or
        :meth:`reverse_end` is still due.  ``True`` when nothing is in flight."""
        if self._mode == "forward":
            return self._forward.test()
        if self._mode == "reverse":
            return self._reverse.test()
        return True

    def exchange(self) -> None:
        """:meth:`begin` + :meth:`end` in one go: the zero fills and local copies first (they
        touch cells no message does), then the messages, without split-phase bookkeeping."""
        if self._mode is not None:
            raise RuntimeError("halo exchange already in progress; call end() first")
        for fill in self._zero:
            fill(0)
        for copy in self._copies:
            copy()
        (self._forward or self._engine(reverse=False)).run()

    # -- adjoint ----------------------------------------------------------------------------------
    def reverse_begin(self) -> "HaloExchange":
        """Adjoint exchange: send every halo piece received from a peer back to it, and add
        the halo pieces copied locally into their owned cells."""
        if self._mode is not None:
            raise RuntimeError("halo exchange already in progress; call end() first")
        (self._reverse or self._engine(reverse=True)).start()
        self._mode = "reverse"
        for d, s in self._local:  # reads halo cells (sends only read them too)
            s += d
        return self

    def reverse_end(self) -> None:
        """Finish the adjoint: add what came back into the owned block, zero the halo."""
        if self._mode != "reverse":
            raise RuntimeError("reverse_end() without a matching reverse_begin()")
        self._mode = None
        self._reverse.finish()
        self.x.zero_halo()

    def reverse(self) -> None:
        self.reverse_begin()
        self.reverse_end()


def _inside(box, start, stop) -> bool:
    return all(a >= lo and b <= hi for a, b, lo, hi in zip(box.start, box.stop, start, stop))


def _shifted(box, delta):
    return tuple(slice(a - d, b - d) for a, b, d in zip(box.start, box.stop, delta))


def reverse_window(window, read_start, x_dist: Distribution, grid, halo, periodic):
    """Adjoint of "exchange the halo, then read a window of the buffer", straight from the
    window's gradient, or ``None`` where this fast path does not apply (the caller then adds
    ``window`` into a zero halo'd buffer and runs :meth:`HaloExchange.reverse`).

    ``window`` (NumPy) is the gradient of the buffer box starting at ``read_start`` (buffer
    coordinates: the owned block starts at ``lo``); ``halo`` the buffer's ``(lo, hi)`` per
    axis.  Returns this rank's gradient block (new, C-contiguous): its owned part of
    ``window`` plus every halo piece that its peers send back, added.  Applies when every
    halo piece received from a peer (and every periodic piece copied locally) lies inside the
    window; the messages are then those of the reverse exchange (same private communicator,
    peers, tags and contents: cells outside the window have zero gradient), so ranks taking
    this path and ranks taking the other one match.  Collective over the grid's ranks (like
    the reverse exchange); no agreement (the caller agreed).

    Everything but the data is cached per layout (:func:`_reverse_recipe`: the slices, the
    scratch and the persistent requests of the messages), so a call of a training step's
    steady state binds the cached exchange to this call's arrays and posts it."""
    if type(window) is not np.ndarray:
        return None
    r = _reverse_recipe(x_dist, grid, tuple(tuple(h) for h in halo), tuple(periodic),
                        tuple(read_start), window.shape, window.dtype)
    if r is None:
        return None
    block, covered, own, local, sends, recvs, ex = r
    out = _pool.empty(tuple(block), window.dtype) if covered else \
        _pool.zeros(tuple(block), window.dtype)    # (recycled: none made in a steady step)
    if ex is not None:
        if ex._active:  # (left in flight by a failure: a one-shot exchange instead)
            ex = _reverse_exchange(grid, sends, recvs, window, out, persistent=False)
        else:
            ex.rebind([window[sl] for _, _, sl in sends],
                      [out[sl] for _, _, sl in recvs])
        ex.start()
    try:
        if own is not None:
            copy_into(out[own[0]], window[own[1]])
        for dst, src in local:
            out[dst] += window[src]
    finally:
        if ex is not None:
            ex.finish()
            if ex.packed:
                ex.rebind()   # keep no array of this call alive
    return out


def _reverse_exchange(grid, sends, recvs, window, out, persistent=True):
    """The reverse exchange of :func:`reverse_window`: pieces of ``window`` to the peers,
    pieces of ``out`` accumulated from them (``sends``/``recvs``: ``(peer, tag, slices)``)."""
    return PieceExchange(private_comm(grid.cart, "halo"),
                         [(p, t, window[sl]) for p, t, sl in sends],
                         [(p, t, out[sl]) for p, t, sl in recvs],
                         accumulate=True, persistent=persistent, packed=persistent)


_REVERSE_RECIPES: dict = {}
_REVERSE_RECIPES_MAX = 256


def _reverse_recipe(x_dist, grid, halo, periodic, r0, shape, dtype):
    """What :func:`reverse_window` does for one layout, made once: ``None`` where its fast
    path does not apply, else ``(block, covered, own, local, sends, recvs, exchange)``:
    the owned block's shape, whether the window covers it (else zeros first), the slices
    ``(out, window)`` of the owned part and of each local (periodic) piece, the slices of the
    non-empty message pieces (window: sent, out: received) and their cached
    ``packed=True`` :class:`PieceExchange` (``None`` without messages)."""
    key = (x_dist, grid, halo, periodic, r0, tuple(shape), np.dtype(dtype).str)
    hit = _REVERSE_RECIPES.get(key, _MISSING)
    if hit is not _MISSING:
        return hit
    comm = grid.cart
    lo = tuple(h[0] for h in halo)
    p = plan(x_dist, comm.rank, lo, tuple(h[1] for h in halo), periodic)
    block = x_dist.block_shape(grid.coords)
    r1 = tuple(a + n for a, n in zip(r0, shape))
    recipe = None
    if all(_inside(t.box, r0, r1) for t in p.recvs) and \
            all(_inside(d, r0, r1) for _, d in p.local):
        own0, own1 = lo, tuple(a + n for a, n in zip(lo, block))
        c0 = tuple(max(a, b) for a, b in zip(own0, r0))
        c1 = tuple(min(a, b) for a, b in zip(own1, r1))
        covered = all(a == o and b == e for a, b, o, e in zip(c0, c1, own0, own1))
        own = (tuple(slice(a - o, b - o) for a, b, o in zip(c0, c1, own0)),
               tuple(slice(a - r, b - r) for a, b, r in zip(c0, c1, r0))) \
            if all(b > a for a, b in zip(c0, c1)) else None
        local = tuple((_shifted(sbox, lo), _shifted(dbox, r0)) for sbox, dbox in p.local)
        sends = recvs = ()
        ex = None
        if comm.size > 1 and (p.recvs or p.sends):
            # (the messages of the reverse exchange: a received halo piece goes back)
            sends = tuple((t.peer, t.tag + _REVERSE_TAG, _shifted(t.box, r0))
                          for t in p.recvs if t.box.size)
            recvs = tuple((t.peer, t.tag + _REVERSE_TAG, _shifted(t.box, lo))
                          for t in p.sends if t.box.size)
            if sends or recvs:
                ex = _reverse_exchange(grid, sends, recvs, np.empty(shape, dtype),
                                       np.empty(block, dtype)).prepare().rebind()
        recipe = (block, covered, own, local, sends, recvs, ex)
    if len(_REVERSE_RECIPES) >= _REVERSE_RECIPES_MAX:
        _REVERSE_RECIPES.clear()
    _REVERSE_RECIPES[key] = recipe
    return recipe


_MISSING = object()


def clear_caches() -> None:
    """Drop the cached reverse-window exchanges (their scratch and persistent requests are
    freed with them)."""
    _REVERSE_RECIPES.clear()


# -- filling the halo beyond the global boundary (reflect, nearest, constant) -------------------
_EDGE_TAG = 0  # its own private communicator: no tag can meet the exchange's


def check_edge_modes(shape, halo, modes) -> None:
    """``ValueError`` where a mode cannot fill the halo of an axis: ``'reflect'`` wider than the
    axis (one mirror image only, as Dask), ``'reflect'``/``'nearest'`` on an empty axis.  Pure
    (replicated metadata): every rank raises alike."""
    for t, (mode, (lo, hi), n) in enumerate(zip(modes, halo, shape)):
        if mode in ("reflect", "nearest") and max(lo, hi) > 0:
            if n == 0:
                raise ValueError(f"boundary {mode!r} cannot fill the halo of empty axis {t}")
            if mode == "reflect" and max(lo, hi) > n:
                raise ValueError(f"depth {max(lo, hi)} on axis {t} is larger than the axis "
                                 f"({n}): boundary 'reflect' mirrors the array once")


def _outside(offsets, c, lo, hi):
    """The global ranges of block ``c``'s buffer beyond the boundary: ``(side, g0, g1)``."""
    n, b0, b1 = offsets[-1], offsets[c] - lo, offsets[c + 1] + hi
    out = []
    if b0 < 0:
        out.append((0, b0, min(0, b1)))
    if b1 > n:
        out.append((1, max(n, b0), b1))
    return out


def _source(side, g0, g1, n, mode):
    """The global range whose cells fill ``[g0, g1)`` beyond the boundary."""
    if mode == "nearest":
        return (0, 1) if side == 0 else (n - 1, n)
    if mode == "mirror":   # np.pad 'reflect' (PyTorch's): the edge cell is not repeated
        return (1 - g1, 1 - g0) if side == 0 else (2 * n - 1 - g1, 2 * n - 1 - g0)
    return (-g1, -g0) if side == 0 else (2 * n - g1, 2 * n - g0)


def _along(nd, t, sl):
    idx = [slice(None)] * nd
    idx[t] = sl
    return tuple(idx)


class EdgeFill:
    """Fill the halo cells of ``x``'s buffer beyond the global boundary, after an exchange
    that filled every other halo cell (zero beyond the boundary), as ``np.pad`` would, axis
    after axis in order: ``modes[t]`` is ``None`` (leave the cells: zero or periodic),
    ``'reflect'`` (``np.pad`` ``'symmetric'``), ``'mirror'`` (``np.pad`` ``'reflect'``, a
    halo narrower than the axis), ``'nearest'`` (``'edge'``) or
    ``('constant', value)``.  An axis's fill covers the whole buffer along the other axes, so
    edges and corners come out as ``np.pad`` applied to one axis after the other.

    Collective over the ranks that own or need boundary cells (point to point, on a private
    communicator; no agreement: the caller agreed ``x`` and ``modes``, see
    :func:`check_edge_modes` for what is refused)."""

    def __init__(self, x, modes):
        self.x = x
        dist = x.distribution
        comm = x.grid.cart
        self.pcomm = private_comm(comm, "halo_edges") if comm.size > 1 else comm
        me = x.grid.coords
        self.steps = []
        for t, mode in enumerate(modes):
            if mode is None or (x.halo[t] == (0, 0)):
                continue
            self.steps.append(self._axis_step(dist, me, t, mode))

    def _axis_step(self, dist, me, t, mode):
        buf = self.x.buffer
        nd, n = buf.ndim, dist.shape[t]
        lo, hi = self.x.halo[t]
        off = dist.offsets[t]
        c = dist.axis_coord(t, me)
        base = off[c] - lo
        g = dist.split[t]
        fills, recvs, local, sends = [], [], [], []
        for side, g0, g1 in _outside(off, c, lo, hi):
            dst = buf[_along(nd, t, slice(g0 - base, g1 - base))]
            if isinstance(mode, tuple):
                fills.append((dst, mode[1], None))   # a constant: nothing to send back
                continue
            s0, s1 = _source(side, g0, g1, n, mode)
            shape = list(buf.shape)
            shape[t] = s1 - s0
            tmp = np.empty(shape, dtype=buf.dtype) if type(buf) is np.ndarray else \
                self.x.xp.empty(shape, dtype=buf.dtype)
            fills.append((dst, tmp, mode))
            for q in range(len(off) - 1):
                a, b = max(s0, off[q]), min(s1, off[q + 1])
                if a >= b:
                    continue
                piece = tmp[_along(nd, t, slice(a - s0, b - s0))]
                if q == c:
                    local.append((piece, buf[_along(nd, t, slice(a - base, b - base))]))
                else:
                    peer = coords_to_rank([q if k == g else v for k, v in enumerate(me)],
                                          dist.grid_dims)
                    recvs.append((peer, _EDGE_TAG + 2 * t + side, piece))
        if g is not None and not isinstance(mode, tuple):
            for q in range(len(off) - 1):   # the blocks whose boundary cells I own
                if q == c:
                    continue
                for side, g0, g1 in _outside(off, q, lo, hi):
                    s0, s1 = _source(side, g0, g1, n, mode)
                    a, b = max(s0, off[c]), min(s1, off[c + 1])
                    if a < b:
                        peer = coords_to_rank([q if k == g else v for k, v in enumerate(me)],
                                              dist.grid_dims)
                        sends.append((peer, _EDGE_TAG + 2 * t + side,
                                      buf[_along(nd, t, slice(a - base, b - base))]))
        return t, fills, recvs, local, sends

    def run(self) -> None:
        """Fill now (after the exchange has ended)."""
        for t, fills, recvs, local, sends in self.steps:
            ex = PieceExchange(self.pcomm, sends, recvs, persistent=False).start() \
                if (sends or recvs) else None
            for d, s in local:
                copy_into(d, s)
            if ex is not None:
                ex.finish()
            for dst, src, mode in fills:
                if mode is None:
                    dst[...] = src
                elif mode in ("reflect", "mirror"):
                    dst[...] = src[_along(dst.ndim, t, slice(None, None, -1))]
                else:
                    dst[...] = src

    def reverse(self) -> None:
        """The adjoint of :meth:`run` (a constant counts as zero: the linear part): every
        filled cell's value is added into the cell it was copied from (on its owner, point to
        point) and the filled cells are zeroed, axis after axis in reverse order."""
        for t, fills, recvs, local, sends in reversed(self.steps):
            for dst, src, mode in fills:
                if mode in ("reflect", "mirror"):
                    src[...] = dst[_along(dst.ndim, t, slice(None, None, -1))]
                elif mode is not None:
                    src[...] = dst.sum(axis=t, keepdims=True)
                dst[...] = 0
            ex = PieceExchange(self.pcomm, recvs, sends, accumulate=True,
                               persistent=False).start() if (sends or recvs) else None
            for piece, owned in local:
                owned += piece
            if ex is not None:
                ex.finish()
