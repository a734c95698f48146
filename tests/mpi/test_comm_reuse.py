"""Reuse of communication state across calls: persistent requests of ``PieceExchange`` and
``HaloExchange`` (many exchanges, misuse that raises and leaves the object usable, freeing),
the pooled pack scratch and cached piece indices of redistribution (repeated calls, changed
arguments, adjoint), and the one-agreement-per-op rule of the window ops (a halo exchange
nested in a convolution adds no all-reduce; a top-level one still agrees).  Results are
checked against serial float64 NumPy references on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor.core import agreement
from disttensor.core.comm import PieceExchange, private_comm
from disttensor.ops import convolution as C
from disttensor.core.redistribute import (ScratchPool, redistribute_adjoint_blocks,
                                     redistribute_blocks, scratch_pool)
from conftest import assert_all_ranks, assert_allclose_all, assert_raises_all

COMM = MPI.COMM_WORLD
SIZE = COMM.size
RANK = COMM.rank


def _ring(persistent: bool, contiguous: bool):
    """An exchange sending this rank's block to the next rank of a ring (strided when not
    ``contiguous``) and receiving the previous rank's block."""
    pcomm = private_comm(COMM, "test-reuse")
    send = np.zeros((4, 6))
    recv = np.zeros((4, 6))
    sv = send if contiguous else send[:, ::2]
    rv = recv if contiguous else recv[:, 1::2]
    ex = PieceExchange(pcomm, [((RANK + 1) % SIZE, 3, sv)], [((RANK - 1) % SIZE, 3, rv)],
                       persistent=persistent)
    return ex, sv, rv


@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("contiguous", [True, False])
def test_piece_exchange_reused_across_calls(persistent, contiguous):
    ex, sv, rv = _ring(persistent, contiguous)
    assert ex.persistent == persistent
    prev = (RANK - 1) % SIZE
    ok = True
    for it in range(4):
        sv[...] = np.arange(sv.size, dtype=np.float64).reshape(sv.shape) * (RANK + 1) + it
        ex.run()
        want = np.arange(rv.size, dtype=np.float64).reshape(rv.shape) * (prev + 1) + it
        ok &= np.array_equal(rv, want)
    ex.free()
    assert_all_ranks(COMM, ok, "a reused exchange delivered wrong data")


def test_piece_exchange_misuse_raises_and_stays_usable():
    ex, sv, rv = _ring(True, False)
    prev = (RANK - 1) % SIZE
    sv[...] = RANK
    ex.start()
    with pytest.raises(RuntimeError, match="already in progress"):
        ex.start()           # the exchange in flight is left intact
    with pytest.raises(RuntimeError, match="in progress"):
        ex.free()
    ex.finish()
    ok = bool(np.all(rv == prev))
    with pytest.raises(RuntimeError, match="without a matching start"):
        ex.finish()
    sv[...] = RANK + 10
    ex.run()                 # reusable after the failed calls
    ok &= bool(np.all(rv == prev + 10))
    ex.free()
    ex.free()                # idempotent
    sv[...] = RANK + 20
    ex.run()                 # new persistent requests after free()
    ok &= bool(np.all(rv == prev + 20))
    assert_all_ranks(COMM, ok, "exchange wrong after a failed call")


def test_piece_exchange_after_a_failed_wait(monkeypatch):
    """A wait that raised (here: an exception injected where the wait starts, on every rank)
    drops the persistent requests; the next exchange makes new ones and is right."""
    import disttensor.core.comm as dcomm
    ex, sv, rv = _ring(True, True)
    prev = (RANK - 1) % SIZE
    calls = [0]

    class Boom:
        def __enter__(self):
            calls[0] += 1
            if calls[0] == 1:
                raise KeyboardInterrupt("injected")

        def __exit__(self, *a):
            return False
    monkeypatch.setattr(dcomm, "waiting", lambda comm, what: Boom())
    sv[...] = RANK
    ex.start()
    with pytest.raises(KeyboardInterrupt):
        ex.finish()
    assert ex._preqs is None and not ex._active
    COMM.Barrier()
    ok = True
    for it in range(3):
        sv[...] = 100 * it + RANK
        ex.run()
        ok &= bool(np.all(rv == 100 * it + prev))
    ex.free()
    assert_all_ranks(COMM, ok, "exchange wrong after a failed wait")


def test_halo_exchange_reused_and_after_misuse():
    grid = dt.ProcessGrid((SIZE,))
    n = 3 * SIZE
    g = np.arange(n * 5, dtype=np.float64).reshape(n, 5)
    x = dt.from_global(g, grid=grid, split=(0, None))
    x = x.with_halo([(1, 2), (0, 0)])
    h = x.halo_exchange("periodic")
    a, b = x.distribution.block_range(0, grid.coords[0])
    ok = True
    for it in range(3):
        x.local[...] = g[a:b] + it
        h.begin()
        with pytest.raises(RuntimeError, match="in progress"):
            h.begin()
        with pytest.raises(RuntimeError, match="in progress"):
            h.reverse_begin()
        h.end()
        with pytest.raises(RuntimeError, match="without a matching"):
            h.end()
        rows = np.arange(a - 1, b + 2) % n
        ok &= np.array_equal(x.buffer, g[rows] + it)
        x.buffer[...] = -7.0      # garbage in the halo: the next exchange must refill it
    # the adjoint on the same object, twice (its own persistent requests)
    for it in range(2):
        x.buffer[...] = 1.0
        h.reverse()
        cnt = np.zeros(n)
        for r in np.arange(a - 1, b + 2) % n:
            cnt[r] += 1
        # every owned row got itself plus the halo copies of it held by the ranks around
        ref = np.zeros(n)
        for r in range(SIZE):
            ra, rb = x.distribution.block_range(0, r)
            for q in np.arange(ra - 1, rb + 2) % n:
                ref[q] += 1
        ok &= np.array_equal(x.local[:, 0], ref[a:b])
        ok &= not np.any(x.buffer[:1]) and not np.any(x.buffer[1 + b - a:])
    h.free()
    assert_all_ranks(COMM, ok, "reused halo exchange wrong")
    grid.free()


def test_scratch_pool_reuse_and_limit():
    pool = ScratchPool(1000)
    a = pool.take(800, np.float64, (10, 10))
    assert a.shape == (10, 10) and a.dtype == np.float64
    base = a.base
    pool.give(a)
    b = pool.take(800, np.float32, (200,))
    assert b.base is base            # the same bytes, another dtype
    c = pool.take(800, np.float64, (100,))
    assert c.base is not base        # handed out once at a time
    pool.give(b)
    pool.give(c)                     # 1600 bytes > limit: the oldest is dropped
    assert pool._held <= 1000
    pool.give(np.empty(5000, dtype=np.uint8))   # larger than the limit: not kept
    assert pool._held <= 1000
    pool.clear()
    assert pool._held == 0


@pytest.mark.parametrize("dtype", ["float64", "float32", "int16"])
def test_redistribute_repeated_calls_and_changed_arguments(dtype):
    """Repeated redistributions reuse cached indices and pooled scratch: each call is right;
    a changed destination (another cached plan) is right too; the adjoint likewise."""
    grid = dt.ProcessGrid((SIZE,))
    shape = (2 * SIZE + 1, 3 * SIZE + 2, 5)
    rng = np.random.default_rng(0)            # the same on every rank: the global arrays
    zrng = np.random.default_rng(100 + RANK)  # rank-local draws (block shapes differ)
    ok = True
    for it in range(3):
        g = (rng.integers(-50, 50, shape)).astype(dtype)
        x = dt.from_global(g, grid=grid, split=(0, None, None))
        for dsplit in ((None, 0, None), (None, None, 0), (None, 0, None)):
            dst = dt.Distribution(shape, grid.dims, dsplit)
            y = redistribute_blocks(grid.cart, x.local, x.distribution, dst)
            ok &= np.array_equal(y, g[dst.rank_box(RANK).slices()])
            out = np.full_like(y, 99)
            redistribute_blocks(grid.cart, x.local, x.distribution, dst, out=out)
            ok &= np.array_equal(out, y)
            # adjoint: <R x, z> == <x, R* z> (float64 sums of exact integers)
            z = zrng.integers(-5, 5, y.shape).astype(dtype)
            back = redistribute_adjoint_blocks(grid.cart, z, x.distribution, dst)
            lhs = COMM.allreduce(float(np.sum(y.astype(np.float64) * z)))
            rhs = COMM.allreduce(float(np.sum(x.local.astype(np.float64) * back)))
            ok &= lhs == rhs
    assert_all_ranks(COMM, ok, "repeated redistribution wrong")
    assert scratch_pool._held <= scratch_pool.limit
    grid.free()


def test_redistribute_strided_source_view():
    """A non-contiguous source (the interior of a halo buffer) is packed through the pool."""
    grid = dt.ProcessGrid((SIZE,))
    shape = (2 * SIZE, 7, 3)
    g = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    x = dt.from_global(g, grid=grid, split=(0, None, None)).with_halo([(1, 1), (2, 0), (0, 1)])
    dst = dt.Distribution(shape, grid.dims, (None, 0, None))
    for _ in range(2):
        y = redistribute_blocks(grid.cart, x.local, x.distribution, dst)
        assert_allclose_all(COMM, y, g[dst.rank_box(RANK).slices()])
    grid.free()


def _count_allreduces(fn) -> int:
    n = [0]
    orig = agreement.status_allreduce

    def counting(*a, **k):
        n[0] += 1
        return orig(*a, **k)
    agreement.status_allreduce = counting
    try:
        fn()
    finally:
        agreement.status_allreduce = orig
    return n[0]


@pytest.mark.skipif(SIZE == 1, reason="agreement all-reduces only on several ranks")
def test_conv_agrees_once_per_call():
    """conv_forward: one agreement all-reduce (arguments + validation); kernel failures are
    agreed with the next agreement (none of their own); the halo buffer and the halo exchange
    inside add none.  conv_backward: one (its
    local kernels run inside the agreed block); the reverse exchange adds none."""
    grid = dt.ProcessGrid((SIZE,))
    rng = np.random.default_rng(3)
    xg = rng.standard_normal((1, 2, 2 * SIZE + 3, 5, 4))
    w = rng.standard_normal((3, 2, 3, 3, 3))
    x = dt.from_global(xg, grid=grid, split=(None, None, 0, None, None))
    out = {}

    def fwd():
        out["y"], out["saved"] = C.conv_forward(x, w, None, 1, 1)
    nf = _count_allreduces(fwd)
    nb = _count_allreduces(lambda: C.conv_backward(out["saved"], out["y"], need_dw=False))
    assert_all_ranks(COMM, (nf, nb) == (1, 1), f"all-reduces fwd {nf}, bwd {nb}")
    # a top-level halo exchange still agrees: a rank-dependent boundary raises everywhere
    xh = x.with_halo([(0, 0), (0, 0), (1, 1), (0, 0), (0, 0)])
    assert_raises_all(COMM, agreement.ArgumentMismatchError, "boundary",
                      lambda: xh.halo_exchange("zero" if RANK else "periodic"))
    grid.free()
