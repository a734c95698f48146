"""Communication plans of halo exchange and redistribution: pure index math (no MPI).

A plan says, for one rank, which boxes of its local buffer go to which peer and which boxes
arrive from which peer.  Both sides of every message compute the same plan independently (the
functions are deterministic and need only the distributions), so no negotiation is needed.

Halo exchange (:func:`halo_plan`)
    The local *buffer* of a rank is its owned block extended by ``lo[t]`` cells below and
    ``hi[t]`` cells above along each tensor axis ``t``; it covers the global range
    ``[start - lo, stop + hi)``.  Every cell of the buffer that is not owned is filled from
    the rank that owns it (with periodic wrap-around) or set to zero (outside a non-periodic
    global boundary).  Faces, edges and corners are all sent directly from their owners, in
    one phase: this is what makes a true split-phase ``begin()/end()`` possible (the
    axis-after-axis scheme, which forwards corners through faces, must finish axis ``k``
    before it can start axis ``k+1``).  A halo wider than the neighbour's block simply has
    pieces from ranks further away.

Redistribution (:func:`redistribution_plan`)
    Every destination block is the union of its intersections with the source blocks; each
    intersection is one message.  When a source block is replicated, the destination reads it
    from itself if it holds a copy, else from replica ``dst_rank % n_replicas``.
"""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from .distribution import Box, Distribution, coords_to_rank, rank_to_coords

__all__ = ["Segment", "Transfer", "CommPlan", "halo_axis_segments", "halo_plan",
           "redistribution_plan"]


@dataclass(frozen=True)
class Segment:
    """A run of ``length`` buffer cells along one axis, starting at ``buf_start``.

    ``src_coord is None`` marks cells outside a non-periodic global boundary (zeros);
    otherwise they are copied from block ``src_coord``, starting ``src_start`` cells into
    that block's owned range.  ``interior`` marks the rank's own owned range."""

    src_coord: int | None
    src_start: int
    buf_start: int
    length: int
    interior: bool = False


@dataclass(frozen=True)
class Transfer:
    """One message: ``box`` (in this rank's buffer coordinates) to/from ``peer``."""

    peer: int
    box: Box
    tag: int


@dataclass(frozen=True)
class CommPlan:
    """Messages of one rank.  ``local`` holds ``(src_box, dst_box)`` copies within the rank,
    ``zero`` holds buffer boxes to set to zero (halo outside a non-periodic boundary)."""

    sends: tuple[Transfer, ...]
    recvs: tuple[Transfer, ...]
    local: tuple[tuple[Box, Box], ...] = ()
    zero: tuple[Box, ...] = ()

    @property
    def nbytes_elements(self) -> int:
        """Number of elements this rank receives (messages plus local copies)."""
        return sum(t.box.size for t in self.recvs) + sum(d.size for _, d in self.local)


def halo_axis_segments(offsets: Sequence[int], coord: int, lo: int, hi: int,
                       periodic: bool) -> list[Segment]:
    """Cover the buffer of block ``coord`` along one axis (``lo`` below, ``hi`` above its
    owned range) by segments, each from a single source block or zero."""
    n = offsets[-1]
    start, stop = offsets[coord], offsets[coord + 1]
    base = start - lo
    segs: list[Segment] = []

    def cover(g0: int, g1: int):
        g = g0
        while g < g1:
            if n == 0 or (not periodic and (g < 0 or g >= n)):
                # zero run up to the boundary (or to the end)
                end = g1 if n == 0 else (min(g1, 0) if g < 0 else g1)
                segs.append(Segment(None, 0, g - base, end - g))
                g = end
                continue
            gg = g % n
            q = bisect.bisect_right(offsets, gg) - 1
            run = min(g1 - g, offsets[q + 1] - gg)
            segs.append(Segment(q, gg - offsets[q], g - base, run))
            g += run

    cover(start - lo, start)
    if stop > start:
        segs.append(Segment(coord, 0, lo, stop - start, interior=True))
    cover(stop, stop + hi)
    return segs


def _rank_with(coords: Sequence[int], changes: dict[int, int], dims: Sequence[int]) -> int:
    c = list(coords)
    for g, v in changes.items():
        c[g] = v
    return coords_to_rank(c, dims)


def halo_plan(dist: Distribution, rank: int, lo: Sequence[int], hi: Sequence[int],
              periodic: Sequence[bool]) -> CommPlan:
    """Halo exchange plan of ``rank``; boxes are in buffer coordinates (owned block at
    ``lo``).  Every rank must use the same ``lo``, ``hi`` and ``periodic``."""
    nd = dist.ndim
    dims = dist.grid_dims
    me = rank_to_coords(rank, dims)
    my_c = [dist.axis_coord(t, me) for t in range(nd)]
    nblocks = [len(dist.offsets[t]) - 1 for t in range(nd)]
    all_segs = [[halo_axis_segments(dist.offsets[t], c, lo[t], hi[t], periodic[t])
                 for c in range(nblocks[t])] for t in range(nd)]

    # receives, zero boxes and local copies: product of my own segments
    recvs, local, zero = [], [], []
    mine = [all_segs[t][my_c[t]] for t in range(nd)]
    shape = [len(s) for s in mine]
    for ks in itertools.product(*(range(k) for k in shape)):
        segs = [mine[t][k] for t, k in enumerate(ks)]
        if all(s.interior for s in segs):
            continue
        dst = Box(tuple(s.buf_start for s in segs), tuple(s.buf_start + s.length for s in segs))
        if any(s.src_coord is None for s in segs):
            zero.append(dst)
            continue
        src_rank = _rank_with(me, {dist.split[t]: s.src_coord for t, s in enumerate(segs)
                                   if dist.split[t] is not None}, dims)
        if src_rank == rank:
            src = Box(tuple(s.src_start + lo[t] for t, s in enumerate(segs)),
                      tuple(s.src_start + lo[t] + s.length for t, s in enumerate(segs)))
            local.append((src, dst))
        else:
            recvs.append(Transfer(src_rank, dst, _ravel(ks, shape)))

    # sends: for each axis the (dst coord, segment index, segment) whose source is my block
    per_axis = []
    for t in range(nd):
        lst = []
        for d in range(nblocks[t]):
            for k, s in enumerate(all_segs[t][d]):
                if s.src_coord == my_c[t]:
                    lst.append((d, k, s))
        per_axis.append(lst)
    sends = []
    for combo in itertools.product(*per_axis):
        if all(s.interior for _, _, s in combo):
            continue
        dst_rank = _rank_with(me, {dist.split[t]: d for t, (d, _, _) in enumerate(combo)
                                   if dist.split[t] is not None}, dims)
        if dst_rank == rank:
            continue  # a local copy, listed above
        src = Box(tuple(s.src_start + lo[t] for t, (_, _, s) in enumerate(combo)),
                  tuple(s.src_start + lo[t] + s.length for t, (_, _, s) in enumerate(combo)))
        dshape = [len(all_segs[t][d]) for t, (d, _, _) in enumerate(combo)]
        sends.append(Transfer(dst_rank, src, _ravel([k for _, k, _ in combo], dshape)))
    return CommPlan(tuple(sends), tuple(recvs), tuple(local), tuple(zero))


def _ravel(idx: Sequence[int], shape: Sequence[int]) -> int:
    r = 0
    for i, n in zip(idx, shape):
        r = r * n + i
    return r


def _chosen_replica(replicas: list[int], dst_rank: int) -> int:
    if dst_rank in replicas:
        return dst_rank
    return replicas[dst_rank % len(replicas)]


def _blocks_meeting(dist: Distribution, box: Box) -> list[tuple[int, ...]]:
    """Grid coordinate patterns (``-1`` on replication axes) of the blocks of ``dist``
    meeting ``box``."""
    per_grid_axis: list[Sequence[int]] = [[-1] for _ in dist.grid_dims]
    for t, g in enumerate(dist.split):
        rng = dist.coords_range_overlapping(t, box.start[t], box.stop[t])
        if g is None:
            if not len(rng):
                return []
        else:
            per_grid_axis[g] = rng
    return list(itertools.product(*per_grid_axis))


def redistribution_plan(src: Distribution, dst: Distribution, rank: int) -> CommPlan:
    """Plan moving ``rank``'s block of ``src`` to the blocks of ``dst`` (same global shape,
    grids of the same size).  Boxes are in owned-block coordinates of each side."""
    if src.shape != dst.shape:
        raise ValueError(f"redistribution needs equal global shapes, got {src.shape} and {dst.shape}")
    if src.grid_size != dst.grid_size:
        raise ValueError(f"redistribution needs grids of the same size, got {src.grid_dims} "
                         f"and {dst.grid_dims}")
    my_src = src.rank_box(rank)
    my_dst = dst.rank_box(rank)
    sends, recvs, local = [], [], []
    if src.grid_size and math.prod(src.shape):
        my_src_coords = rank_to_coords(rank, src.grid_dims)
        replicas = src.replicas(my_src_coords)
        # receives: source blocks meeting my destination box
        if my_dst.size:
            for pattern in _blocks_meeting(src, my_dst):
                coords = [0 if c < 0 else c for c in pattern]
                sbox = src.block_box(coords)
                inter = sbox.intersect(my_dst)
                if inter is None:
                    continue
                peer = _chosen_replica(src.replicas(coords), rank)
                dbox = inter.shift([-a for a in my_dst.start])
                if peer == rank:
                    local.append((inter.shift([-a for a in my_src.start]), dbox))
                else:
                    recvs.append(Transfer(peer, dbox, 0))
        # sends: destination blocks meeting my source box, when I am the chosen replica
        if my_src.size:
            for pattern in _blocks_meeting(dst, my_src):
                base = [0 if c < 0 else c for c in pattern]
                free = [g for g, c in enumerate(pattern) if c < 0]
                dbox_global = dst.block_box(base)
                inter = dbox_global.intersect(my_src)
                if inter is None:
                    continue
                for alt in itertools.product(*(range(dst.grid_dims[g]) for g in free)):
                    d_rank = _rank_with(base, dict(zip(free, alt)), dst.grid_dims)
                    if d_rank == rank or _chosen_replica(replicas, d_rank) != rank:
                        continue
                    sends.append(Transfer(d_rank, inter.shift([-a for a in my_src.start]), 0))
    sends.sort(key=lambda t: t.peer)
    recvs.sort(key=lambda t: t.peer)
    return CommPlan(tuple(sends), tuple(recvs), tuple(local), ())
