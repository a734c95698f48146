"""The pure plans of distributed sparse products (disttensor.sparse.dist_plan), property-tested
without MPI: every rank's receive plan and the owners' send lists, simulated, give each rank
x[ext]; the reverse exchange gives A.T @ y; the cost rule picks the cheaper method."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.core.distribution import offsets_from_sizes
from disttensor.sparse import dist_plan as dp


@st.composite
def halo_cases(draw):
    p = draw(st.integers(1, 6))
    sizes = draw(st.lists(st.integers(0, 6), min_size=p, max_size=p))
    n = sum(sizes)
    offsets = offsets_from_sizes(sizes)
    exts = []
    for _ in range(p):
        chosen = draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=8)) if n else []
        exts.append(np.unique(np.asarray(chosen, dtype=np.int64)))
    return offsets, exts


def _simulate(offsets, exts, x):
    """Every rank's x_ext built from its own block and the pieces the owners send."""
    p = len(offsets) - 1
    plans = [dp.recv_plan(e, offsets, r) for r, e in enumerate(exts)]
    blocks = [x[offsets[q]:offsets[q + 1]] for q in range(p)]
    out = []
    for r, (e, pl) in enumerate(zip(exts, plans)):
        xe = np.full(len(e), np.nan)
        a, b = pl.own
        xe[a:b] = blocks[r][e[a:b] - offsets[r]]
        for q, a, b in pl.recvs:
            idx = dp.send_indices(e[a:b], offsets, q)   # what q packs for r
            xe[a:b] = blocks[q][idx]
        out.append(xe)
    return plans, out


@given(halo_cases())
@settings(max_examples=150, deadline=None)
def test_recv_plan_partitions_ext_and_the_exchange_gives_x_ext(case):
    offsets, exts = case
    x = np.arange(offsets[-1], dtype=float) * 3.0 + 1.0
    plans, got = _simulate(offsets, exts, x)
    for r, (e, pl, xe) in enumerate(zip(exts, plans, got)):
        covered = np.zeros(len(e), dtype=int)
        a, b = pl.own
        covered[a:b] += 1
        assert np.all(dp.owners(e[a:b], offsets) == r)
        peers = [q for q, _, _ in pl.recvs]
        assert peers == sorted(peers) and r not in peers
        for q, a, b in pl.recvs:
            assert b > a
            assert np.all(dp.owners(e[a:b], offsets) == q)
            covered[a:b] += 1
        assert np.all(covered == 1)
        np.testing.assert_array_equal(xe, x[e])


@given(halo_cases(), st.integers(0, 2 ** 31))
@settings(max_examples=100, deadline=None)
def test_reverse_exchange_gives_the_adjoint(case, seed):
    """Each rank's partial z_ext (from its rows) sent back and added by the owners is the
    sum over ranks of the scattered partials: the adjoint of the forward gather."""
    offsets, exts = case
    p = len(offsets) - 1
    n = offsets[-1]
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal(len(e)) for e in exts]
    want = np.zeros(n)
    for e, z in zip(exts, parts):
        np.add.at(want, e, z)
    got = np.zeros(n)
    for r, (e, z) in enumerate(zip(exts, parts)):
        pl = dp.recv_plan(e, offsets, r)
        a, b = pl.own
        got[offsets[r]:offsets[r + 1]][e[a:b] - offsets[r]] += z[a:b]
        for q, a, b in pl.recvs:
            got[offsets[q]:offsets[q + 1]][dp.send_indices(e[a:b], offsets, q)] += z[a:b]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    # and <gather(x), z> == <x, scatter(z)> for a random x
    x = rng.standard_normal(n)
    _, xes = _simulate(offsets, exts, x)
    lhs = sum(float(xe @ z) for xe, z in zip(xes, parts))
    assert math.isclose(lhs, float(x @ got), rel_tol=1e-12, abs_tol=1e-12)
    assert p == len(exts)


@given(halo_cases())
@settings(max_examples=100, deadline=None)
def test_stats_balance_and_cost_rule_picks_the_cheaper(case):
    offsets, exts = case
    p = len(offsets) - 1
    plans = [dp.recv_plan(e, offsets, r) for r, e in enumerate(exts)]
    sends = [[(r, dp.send_indices(exts[r][a:b], offsets, q))
              for r in range(p) for qq, a, b in plans[r].recvs if qq == q] for q in range(p)]
    stats = [dp.exchange_stats(plans[q], sends[q], offsets[q + 1] - offsets[q])
             for q in range(p)]
    assert sum(s.msgs_sent for s in stats) == sum(s.msgs_recv for s in stats)
    assert sum(s.elems_sent for s in stats) == sum(s.elems_recv for s in stats)
    for k in (1, 7):
        c_p2p = dp.exchange_cost("p2p", stats, k, 8)
        c_ag = dp.exchange_cost("allgather", stats, k, 8)
        pick = dp.choose_exchange(stats, k, 8)
        assert pick == ("allgather" if c_ag < c_p2p else "p2p")
        if p == 1:
            assert c_p2p == c_ag == 0.0
        # p2p never moves more elements per rank than the replicated right-hand side
        n = offsets[-1]
        assert all(s.elems_recv <= n - s.owned for s in stats)
    assert dp.exchange_cost("p2p", stats, 3, 8) >= dp.exchange_cost("p2p", stats, 1, 8)


def _stats_of(exts, offsets):
    p = len(offsets) - 1
    plans = [dp.recv_plan(e, offsets, r) for r, e in enumerate(exts)]
    sends = [[(r, dp.send_indices(exts[r][a:b], offsets, q))
              for r in range(p) for qq, a, b in plans[r].recvs if qq == q] for q in range(p)]
    return [dp.exchange_stats(plans[q], sends[q], offsets[q + 1] - offsets[q])
            for q in range(p)]


def test_cost_rule_stencil_is_p2p_and_dense_rows_on_many_ranks_allgather():
    n, p = 10_000, 8
    offsets = offsets_from_sizes([n // p] * p)
    # tridiagonal: each rank needs one entry of each neighbour
    tri = [np.arange(max(offsets[r] - 1, 0), min(offsets[r + 1] + 1, n)) for r in range(p)]
    assert dp.choose_exchange(_stats_of(tri, offsets), 1, 8) == "p2p"
    # every row references every column: p - 1 messages of (n - n_r) entries vs log2(p)
    dense = [np.arange(n) for _ in range(p)]
    st_dense = _stats_of(dense, offsets)
    assert dp.choose_exchange(st_dense, 1, 8) == "allgather"
    # with messages free, both move the same bytes: the tie goes to p2p
    assert dp.choose_exchange(st_dense, 1, 8, alpha=0.0) == "p2p"


def test_recv_plan_rejects_bad_ext():
    with pytest.raises(IndexError):
        dp.recv_plan(np.array([0, 5]), (0, 2, 5), 0)
    with pytest.raises(ValueError):
        dp.recv_plan(np.array([3, 1]), (0, 2, 5), 0)
    with pytest.raises(ValueError):
        dp.send_indices(np.array([0]), (0, 2, 5), 1)
    with pytest.raises(ValueError):
        dp.exchange_cost("alltoall", [(0, 0, 0, 0, 1), (0, 0, 0, 0, 1)], 1, 8)


@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 9), st.integers(0, 9),
       st.integers(0, 2 ** 31))
@settings(max_examples=60, deadline=None)
def test_block_of_entries_matches_brute_force(pr, pc, m, n, seed):
    rng = np.random.default_rng(seed)
    rs = rng.multinomial(m, [1 / pr] * pr)
    cs = rng.multinomial(n, [1 / pc] * pc)
    ro, co = offsets_from_sizes(rs), offsets_from_sizes(cs)
    k = 12 if m and n else 0
    rows, cols = rng.integers(0, max(m, 1), k), rng.integers(0, max(n, 1), k)
    got = dp.block_of_entries(rows, cols, ro, co, (pr, pc))
    got1 = dp.block_of_entries(rows, cols, ro, None, (pr,))
    for i in range(k):
        bi = next(b for b in range(pr) if ro[b] <= rows[i] < ro[b + 1])
        bj = next(b for b in range(pc) if co[b] <= cols[i] < co[b + 1])
        assert got[i] == bi * pc + bj
        assert got1[i] == bi
