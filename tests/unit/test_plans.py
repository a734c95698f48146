"""Property tests of the halo-exchange and redistribution plans (pure, no MPI).

Every rank of a grid is simulated in one process with NumPy: each rank computes its own plan
independently, messages are matched between the plans the way MPI would match them (source,
destination, tag), and the result is compared with a serial reference on the global array.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.core.distribution import Box, Distribution, rank_to_coords

from disttensor.testing.strategies import explicit_sizes as compositions
from disttensor.testing.strategies import grids
from disttensor.testing.strategies import splits as split_st
from disttensor.core.plans import CommPlan, halo_axis_segments, halo_plan, redistribution_plan

FAST = settings(max_examples=200, deadline=None)
HALO = settings(max_examples=200, deadline=None)
REDIST = settings(max_examples=200, deadline=None)


# --------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------


@st.composite
def distribution_on(draw, shape, dims):
    """Random split of ``shape`` over ``dims``, sometimes with explicit uneven/empty sizes."""
    split = draw(split_st(len(shape), len(dims)))
    sizes = []
    for n, g in zip(shape, split):
        if g is None or not draw(st.booleans()):
            sizes.append(None)
        else:
            sizes.append(draw(compositions(n, dims[g])))
    return Distribution(shape, dims, split, sizes)


@st.composite
def shapes(draw, max_ndim=3, max_extent=9):
    ndim = draw(st.integers(1, max_ndim))
    return tuple(draw(st.lists(st.integers(0, max_extent), min_size=ndim, max_size=ndim)))


@st.composite
def distributions(draw):
    return draw(distribution_on(draw(shapes()), draw(st.integers(1, 24).flatmap(lambda n: grids(n, 3)))))


@st.composite
def halo_args(draw):
    dist = draw(distributions())
    nd = dist.ndim
    width = st.one_of(st.integers(0, 3), st.integers(0, 3), st.integers(0, 12))
    lo = tuple(draw(st.lists(width, min_size=nd, max_size=nd)))
    hi = tuple(draw(st.lists(width, min_size=nd, max_size=nd)))
    periodic = tuple(draw(st.lists(st.booleans(), min_size=nd, max_size=nd)))
    return dist, lo, hi, periodic


def _factorizations(p: int, k: int) -> list[tuple[int, ...]]:
    return [f for f in itertools.product(range(1, p + 1), repeat=k) if math.prod(f) == p]


GRIDS_BY_SIZE = {p: [f for k in (1, 2, 3) for f in _factorizations(p, k)] for p in range(1, 7)}


@st.composite
def redist_args(draw):
    p = draw(st.integers(1, 6))
    shape = draw(shapes())
    src = draw(distribution_on(shape, draw(st.sampled_from(GRIDS_BY_SIZE[p]))))
    dst = draw(distribution_on(shape, draw(st.sampled_from(GRIDS_BY_SIZE[p]))))
    return src, dst


# --------------------------------------------------------------------------------------------
# generic helpers
# --------------------------------------------------------------------------------------------
def box_inside(box: Box, shape) -> bool:
    return all(0 <= a <= b <= n for a, b, n in zip(box.start, box.stop, shape))


def match_messages(plans: list[CommPlan]) -> list[tuple[int, int, Box, Box]]:
    """Match every recv with exactly one send (same source, destination and tag, equal box
    shape) and every send with exactly one recv.  Returns ``(dst, src, recv_box, send_box)``."""
    nranks = len(plans)
    sends: dict[tuple[int, int, int], list[Box]] = {}
    recvs: dict[tuple[int, int, int], list[Box]] = {}
    for r, plan in enumerate(plans):
        for t in plan.sends:
            assert 0 <= t.peer < nranks and t.peer != r, (r, t)
            sends.setdefault((r, t.peer, t.tag), []).append(t.box)
        for t in plan.recvs:
            assert 0 <= t.peer < nranks and t.peer != r, (r, t)
            recvs.setdefault((t.peer, r, t.tag), []).append(t.box)
    # at most one message per (src, dst, tag), on either side
    assert all(len(v) == 1 for v in sends.values()), sends
    assert all(len(v) == 1 for v in recvs.values()), recvs
    # no orphans: the two sides name exactly the same messages
    assert set(sends) == set(recvs), (set(sends) ^ set(recvs))
    out = []
    for (src, dst, tag), (rbox,) in recvs.items():
        (sbox,) = sends[(src, dst, tag)]
        assert sbox.shape == rbox.shape, (src, dst, tag, sbox, rbox)
        out.append((dst, src, rbox, sbox))
    return out


def inner(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(sum(np.vdot(x, y) for x, y in zip(a, b)))


def assert_adjoint(lhs: float, rhs: float, scale: float):
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs), abs(rhs), scale), (lhs, rhs)


# --------------------------------------------------------------------------------------------
# halo exchange
# --------------------------------------------------------------------------------------------
def buffer_shape(dist, rank, lo, hi):
    return tuple(s + a + b for s, a, b in zip(dist.rank_box(rank).shape, lo, hi))


def interior(dist, rank, lo):
    shape = dist.rank_box(rank).shape
    return tuple(slice(a, a + s) for a, s in zip(lo, shape))


def reference_buffer(glob: np.ndarray, box: Box, lo, hi, periodic) -> np.ndarray:
    """Global array extended by zeros (non-periodic) or wrapped (periodic, modular indexing,
    any width), restricted to ``[box.start - lo, box.stop + hi)``."""
    idx, masks = [], []
    for t, n in enumerate(glob.shape):
        g = np.arange(box.start[t] - lo[t], box.stop[t] + hi[t])
        if n == 0:
            valid = np.zeros(g.shape, bool)
            gi = np.zeros(g.shape, int)
        elif periodic[t]:
            valid = np.ones(g.shape, bool)
            gi = g % n
        else:
            valid = (g >= 0) & (g < n)
            gi = np.clip(g, 0, n - 1)
        idx.append(gi)
        masks.append(valid)
    out_shape = tuple(len(i) for i in idx)
    if 0 in glob.shape:
        return np.zeros(out_shape)
    vals = glob[np.ix_(*idx)]
    mask = np.ones(out_shape, bool)
    for t, m in enumerate(masks):
        mask &= m.reshape([-1 if u == t else 1 for u in range(glob.ndim)])
    return np.where(mask, vals, 0.0)


def halo_plans_checked(dist, lo, hi, periodic):
    """All ranks' plans, with the structural checks; returns (plans, matched messages)."""
    nranks = dist.grid_size
    plans = [halo_plan(dist, r, lo, hi, periodic) for r in range(nranks)]
    for r, plan in enumerate(plans):
        bshape = buffer_shape(dist, r, lo, hi)
        own = dist.rank_box(r).shape
        inner_box = Box(tuple(lo), tuple(a + s for a, s in zip(lo, own)))
        cover = np.zeros(bshape, dtype=np.int64)
        cover[inner_box.slices()] += 1
        for b in plan.zero:
            assert box_inside(b, bshape) and b.size > 0
            cover[b.slices()] += 1
        for s, d in plan.local:
            assert s.shape == d.shape and d.size > 0
            assert box_inside(d, bshape)
            # sources are owned cells only: no dependence on the order halos are filled in
            assert s.intersect(inner_box) == s
            cover[d.slices()] += 1
        for t in plan.recvs:
            assert box_inside(t.box, bshape) and t.box.size > 0
            cover[t.box.slices()] += 1
        for t in plan.sends:
            assert t.box.size > 0 and t.box.intersect(inner_box) == t.box
        # interior, zeros, local copies and receives tile the buffer exactly
        assert np.all(cover == 1), (r, plan, cover)
        assert plan.nbytes_elements == math.prod(bshape) - math.prod(own) - sum(
            b.size for b in plan.zero)
    return plans, match_messages(plans)


def halo_forward(dist, lo, hi, plans, matched, blocks, fill=np.nan):
    """H: owned blocks of all ranks -> their buffers (simulated exchange)."""
    bufs = []
    for r in range(dist.grid_size):
        buf = np.full(buffer_shape(dist, r, lo, hi), fill)
        buf[interior(dist, r, lo)] = blocks[r]
        bufs.append(buf)
    for r, plan in enumerate(plans):
        for b in plan.zero:
            bufs[r][b.slices()] = 0.0
        for s, d in plan.local:
            bufs[r][d.slices()] = bufs[r][s.slices()]
    for dst, src, rbox, sbox in matched:
        bufs[dst][rbox.slices()] = bufs[src][sbox.slices()]
    return bufs


def halo_adjoint(dist, lo, plans, matched, bufs):
    """H*: buffers -> owned blocks; halo values are sent back and ADDED into the owner."""
    out = [b[interior(dist, r, lo)].copy() for r, b in enumerate(bufs)]
    neg = [-a for a in lo]
    for r, plan in enumerate(plans):
        for s, d in plan.local:
            out[r][s.shift(neg).slices()] += bufs[r][d.slices()]
    for dst, src, rbox, sbox in matched:
        out[src][sbox.shift(neg).slices()] += bufs[dst][rbox.slices()]
    return out


@HALO
@given(halo_args(), st.integers(0, 2**32 - 1))
def test_halo_plan_fills_buffers(args, seed):
    dist, lo, hi, periodic = args
    rng = np.random.default_rng(seed)
    glob = rng.standard_normal(dist.shape)
    plans, matched = halo_plans_checked(dist, lo, hi, periodic)
    blocks = [glob[dist.rank_box(r).slices()] for r in range(dist.grid_size)]
    bufs = halo_forward(dist, lo, hi, plans, matched, blocks)
    for r, buf in enumerate(bufs):
        ref = reference_buffer(glob, dist.rank_box(r), lo, hi, periodic)
        np.testing.assert_array_equal(buf, ref, err_msg=f"rank {r}")
        # cross-check the reference with np.pad where np.pad can do it
        if all(n > 0 and a <= n and b <= n for n, a, b, p in
               zip(dist.shape, lo, hi, periodic) if p):
            padded = glob
            for t, (a, b, p) in enumerate(zip(lo, hi, periodic)):
                w = [(0, 0)] * glob.ndim
                w[t] = (a, b)
                padded = np.pad(padded, w, mode="wrap" if p else "constant")
            box = dist.rank_box(r)
            sl = tuple(slice(s, e + a + b) for s, e, a, b in zip(box.start, box.stop, lo, hi))
            np.testing.assert_array_equal(buf, padded[sl])


@HALO
@given(halo_args(), st.integers(0, 2**32 - 1))
def test_halo_plan_adjoint(args, seed):
    dist, lo, hi, periodic = args
    rng = np.random.default_rng(seed)
    plans, matched = halo_plans_checked(dist, lo, hi, periodic)
    # independent values on every rank, replicas included
    x = [rng.standard_normal(dist.rank_box(r).shape) for r in range(dist.grid_size)]
    y = [rng.standard_normal(buffer_shape(dist, r, lo, hi)) for r in range(dist.grid_size)]
    hx = halo_forward(dist, lo, hi, plans, matched, x, fill=np.nan)
    assert all(not np.isnan(b).any() for b in hx)
    hty = halo_adjoint(dist, lo, plans, matched, y)
    assert [a.shape for a in hty] == [a.shape for a in x]
    scale = sum(float(np.abs(a).sum()) for a in y) * max(
        [float(np.abs(a).max()) for a in x if a.size] or [1.0])
    assert_adjoint(inner(hx, y), inner(x, hty), scale)


@HALO
@given(halo_args())
def test_halo_plan_replicas_exchange_within_their_copy(args):
    """Messages never cross replication axes, and replicas get identical plans."""
    dist, lo, hi, periodic = args
    rep = dist.replicated_grid_axes
    plans = [halo_plan(dist, r, lo, hi, periodic) for r in range(dist.grid_size)]
    for r, plan in enumerate(plans):
        me = rank_to_coords(r, dist.grid_dims)
        for t in plan.sends + plan.recvs:
            peer = rank_to_coords(t.peer, dist.grid_dims)
            assert all(me[g] == peer[g] for g in rep)
        # the plan of a replica is the same up to the peers' replica coordinates
        rep0 = min(dist.replicas(me))
        base = plans[rep0]
        assert plan.zero == base.zero and plan.local == base.local
        assert [(t.box, t.tag) for t in plan.sends] == [(t.box, t.tag) for t in base.sends]
        assert [(t.box, t.tag) for t in plan.recvs] == [(t.box, t.tag) for t in base.recvs]


def test_halo_plan_examples():
    # 1-D, 3 ranks, sizes (1, 0, 2), width 2 both sides, periodic: the halo of the empty block
    # comes from both other ranks, and the width-2 halo of block 0 reaches two ranks away
    d = Distribution((3,), (3,), (0,), [(1, 0, 2)])
    glob = np.arange(3.0) + 1
    plans, matched = halo_plans_checked(d, (2,), (2,), (True,))
    bufs = halo_forward(d, (2,), (2,), plans, matched, [glob[d.rank_box(r).slices()] for r in range(3)])
    np.testing.assert_array_equal(bufs[0], [2, 3, 1, 2, 3])
    np.testing.assert_array_equal(bufs[1], [3, 1, 2, 3])
    np.testing.assert_array_equal(bufs[2], [3, 1, 2, 3, 1, 2])
    # zero boundary, width larger than the whole extent
    plans, matched = halo_plans_checked(d, (4,), (5,), (False,))
    bufs = halo_forward(d, (4,), (5,), plans, matched, [glob[d.rank_box(r).slices()] for r in range(3)])
    np.testing.assert_array_equal(bufs[1], [0, 0, 0, 1, 2, 3, 0, 0, 0])


@FAST
@given(st.data())
def test_halo_axis_segments(data):
    p = data.draw(st.integers(1, 6))
    n = data.draw(st.integers(0, 9))
    sizes = data.draw(compositions(n, p))
    offsets = tuple(itertools.accumulate(sizes, initial=0))
    coord = data.draw(st.integers(0, p - 1))
    lo = data.draw(st.integers(0, 12))
    hi = data.draw(st.integers(0, 12))
    periodic = data.draw(st.booleans())
    start, stop = offsets[coord], offsets[coord + 1]
    segs = halo_axis_segments(offsets, coord, lo, hi, periodic)
    pos = 0
    for s in segs:
        assert s.buf_start == pos and s.length > 0
        pos += s.length
        for k in range(s.length):
            g = start - lo + s.buf_start + k          # global index of this buffer cell
            if s.interior:
                assert s.src_coord == coord and s.buf_start == lo and s.length == stop - start
            if s.src_coord is None:
                assert n == 0 or (not periodic and not 0 <= g < n)
            else:
                assert n > 0 and (periodic or 0 <= g < n)
                b0, b1 = offsets[s.src_coord], offsets[s.src_coord + 1]
                assert 0 <= s.src_start and s.src_start + s.length <= b1 - b0
                assert b0 + s.src_start + k == g % n
    assert pos == lo + (stop - start) + hi
    assert sum(s.interior for s in segs) == (1 if stop > start else 0)


# --------------------------------------------------------------------------------------------
# redistribution
# --------------------------------------------------------------------------------------------
def redist_plans_checked(src: Distribution, dst: Distribution):
    nranks = src.grid_size
    plans = [redistribution_plan(src, dst, r) for r in range(nranks)]
    for r, plan in enumerate(plans):
        sshape, dshape = src.rank_box(r).shape, dst.rank_box(r).shape
        # at most one message per ordered pair of ranks
        assert len({t.peer for t in plan.sends}) == len(plan.sends)
        assert len({t.peer for t in plan.recvs}) == len(plan.recvs)
        assert plan.zero == ()
        count = np.zeros(dshape, dtype=np.int64)
        for s, d in plan.local:
            assert s.shape == d.shape and d.size > 0
            assert box_inside(s, sshape) and box_inside(d, dshape)
            # same global cells
            assert s.shift(src.rank_box(r).start) == d.shift(dst.rank_box(r).start)
            count[d.slices()] += 1
        my_replicas = src.replicas(rank_to_coords(r, src.grid_dims))
        for t in plan.recvs:
            assert box_inside(t.box, dshape) and t.box.size > 0
            # never receive a block I hold a copy of myself
            assert t.peer not in my_replicas
            count[t.box.slices()] += 1
        for t in plan.sends:
            assert box_inside(t.box, sshape) and t.box.size > 0
        # every destination cell arrives exactly once (no element received twice)
        assert np.all(count == 1), (r, plan)
        assert plan.nbytes_elements == math.prod(dshape)
    matched = match_messages(plans)
    for d_rank, s_rank, rbox, sbox in matched:
        # the message carries the same global cells on both sides
        assert rbox.shift(dst.rank_box(d_rank).start) == sbox.shift(src.rank_box(s_rank).start)
    return plans, matched


def redist_forward(src, dst, plans, matched, blocks):
    out = [np.full(dst.rank_box(r).shape, np.nan) for r in range(dst.grid_size)]
    for r, plan in enumerate(plans):
        for s, d in plan.local:
            out[r][d.slices()] = blocks[r][s.slices()]
    for d_rank, s_rank, rbox, sbox in matched:
        out[d_rank][rbox.slices()] = blocks[s_rank][sbox.slices()]
    return out


def redist_adjoint(src, dst, plans, matched, ys):
    out = [np.zeros(src.rank_box(r).shape) for r in range(src.grid_size)]
    for r, plan in enumerate(plans):
        for s, d in plan.local:
            out[r][s.slices()] += ys[r][d.slices()]
    for d_rank, s_rank, rbox, sbox in matched:
        out[s_rank][sbox.slices()] += ys[d_rank][rbox.slices()]
    return out


@REDIST
@given(redist_args(), st.integers(0, 2**32 - 1))
def test_redistribution_moves_blocks(args, seed):
    src, dst = args
    rng = np.random.default_rng(seed)
    glob = rng.permutation(math.prod(src.shape)).reshape(src.shape).astype(float)
    plans, matched = redist_plans_checked(src, dst)
    blocks = [glob[src.rank_box(r).slices()] for r in range(src.grid_size)]
    out = redist_forward(src, dst, plans, matched, blocks)
    for r, b in enumerate(out):
        np.testing.assert_array_equal(b, glob[dst.rank_box(r).slices()], err_msg=f"rank {r}")
    # round trip src -> dst -> src is the identity
    back_plans, back_matched = redist_plans_checked(dst, src)
    back = redist_forward(dst, src, back_plans, back_matched, out)
    for r, b in enumerate(back):
        np.testing.assert_array_equal(b, blocks[r], err_msg=f"rank {r}")


@REDIST
@given(redist_args(), st.integers(0, 2**32 - 1))
def test_redistribution_adjoint(args, seed):
    src, dst = args
    rng = np.random.default_rng(seed)
    plans, matched = redist_plans_checked(src, dst)
    # independent values on every rank, replicas counted separately
    x = [rng.standard_normal(src.rank_box(r).shape) for r in range(src.grid_size)]
    y = [rng.standard_normal(dst.rank_box(r).shape) for r in range(dst.grid_size)]
    rx = redist_forward(src, dst, plans, matched, x)
    assert all(not np.isnan(b).any() for b in rx)
    rty = redist_adjoint(src, dst, plans, matched, y)
    scale = sum(float(np.abs(a).sum()) for a in y) * max(
        [float(np.abs(a).max()) for a in x if a.size] or [1.0])
    assert_adjoint(inner(rx, y), inner(x, rty), scale)


@REDIST
@given(redist_args())
def test_redistribution_identity_is_local(args):
    src, _ = args
    for r in range(src.grid_size):
        plan = redistribution_plan(src, src, r)
        assert plan.sends == () and plan.recvs == ()
        box = src.rank_box(r)
        if box.size:
            full = Box((0,) * src.ndim, box.shape)
            assert plan.local == ((full, full),)


def test_redistribution_plan_errors():
    a = Distribution((4, 4), (2, 2), (0, 1))
    with pytest.raises(ValueError):
        redistribution_plan(a, Distribution((4, 5), (2, 2), (0, 1)), 0)
    with pytest.raises(ValueError):
        redistribution_plan(a, Distribution((4, 4), (3,), (0,)), 0)


def test_redistribution_replicated_source_spreads_reads():
    # source fully replicated over 4 ranks, destination split: everybody reads locally
    src = Distribution((8,), (4,), (None,))
    dst = Distribution((8,), (4,), (0,))
    for r in range(4):
        plan = redistribution_plan(src, dst, r)
        assert plan.recvs == () and plan.sends == ()
    # source replicated over grid axis 1 of a 2x2 grid (ranks 0, 1 hold [0, 4), ranks 2, 3
    # hold [4, 8)): a rank that holds no copy reads from replica dst_rank % n_replicas
    src = Distribution((8,), (2, 2), (0,))
    plans, matched = redist_plans_checked(src, Distribution((8,), (4,), (0,)))
    assert matched == []
    plans, matched = redist_plans_checked(src, Distribution((8,), (4,), (0,), [(0, 0, 4, 4)]))
    assert [(d, s) for d, s, _, _ in matched] == [(2, 0)]
    plans, matched = redist_plans_checked(src, Distribution((8,), (4,), (0,), [(0, 0, 0, 8)]))
    assert [(d, s) for d, s, _, _ in matched] == [(3, 1)]
    assert plans[3].local == ((Box((0,), (4,)), Box((4,), (8,))),)
