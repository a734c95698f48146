"""Halo exchange (forward, split phase, adjoint) against a serial NumPy reference.

For every drawn example (shape, grid, split, ownership sizes, per-axis ``(lo, hi)`` widths,
per-axis boundary, dtype) each rank's whole ``x.buffer`` after the exchange must equal the
slice ``[start - lo, stop + hi)`` of the globally padded array: zeros outside a non-periodic
boundary, modular indexing on a periodic axis (so a halo wider than the neighbour's block, or
even than the whole axis, reaches further ranks / wraps several times).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from conftest import assert_all_ranks, assert_allclose_all
from disttensor.testing.strategies import layouts

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()

_GRIDS: dict[tuple[int, ...], dt.ProcessGrid] = {}


def get_grid(dims) -> dt.ProcessGrid:
    """One ProcessGrid per shape for the whole session (every rank draws the same shapes in
    the same order, so the collective creation stays in step; no communicator leak)."""
    dims = tuple(dims)
    if dims not in _GRIDS:
        _GRIDS[dims] = dt.ProcessGrid(dims)
    return _GRIDS[dims]


DTYPES = ["float64", "float32", "int32", "int64", "float16", "complex128"]  # float16: exact below 2048


@st.composite
def halo_cases(draw, max_ndim: int = 3, max_extent: int = 9, max_width: int = 10):
    """(shape, grid dims, split, sizes, halo ((lo, hi) per axis), periodic flags, dtype)."""
    ndim = draw(st.integers(1, max_ndim))
    shape = tuple(draw(st.lists(st.integers(0, max_extent), min_size=ndim, max_size=ndim)))
    dims, split, sizes = draw(layouts(shape, SIZE, 3))
    periodic = tuple(draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim)))
    halo = []
    for n, per in zip(shape, periodic):
        cap = max_width if per else min(n, max_width)  # non-periodic: width <= extent
        halo.append((draw(st.integers(0, cap)), draw(st.integers(0, cap))))
    dtype = draw(st.sampled_from(DTYPES))
    return shape, dims, split, sizes, tuple(halo), periodic, dtype


def global_values(shape, dtype) -> np.ndarray:
    """Distinct, exactly representable values (so equality is exact)."""
    n = int(np.prod(shape))
    a = (np.arange(n, dtype=np.int64) * 7 + 3) % 1999 - 900
    return a.reshape(shape).astype(dtype)


def padded_slice(g: np.ndarray, box_start, box_stop, halo, periodic) -> np.ndarray:
    """Reference: the slice [start - lo, stop + hi) of the globally padded ``g``."""
    idx, masks = [], []
    for t, (a, b) in enumerate(zip(box_start, box_stop)):
        lo, hi = halo[t]
        n = g.shape[t]
        i = np.arange(a - lo, b + hi)
        if n == 0:
            idx.append(np.zeros(len(i), dtype=np.intp))
            masks.append(np.zeros(len(i), dtype=bool))
        elif periodic[t]:
            idx.append(i % n)
            masks.append(np.ones(len(i), dtype=bool))
        else:
            idx.append(np.clip(i, 0, n - 1))
            masks.append((i >= 0) & (i < n))
    if any(len(i) == 0 for i in idx):
        return np.zeros([len(i) for i in idx], dtype=g.dtype)
    if g.size == 0:
        return np.zeros([len(i) for i in idx], dtype=g.dtype)
    out = g[np.ix_(*idx)].copy()
    mask = np.ones(out.shape, dtype=bool)
    for t, m in enumerate(masks):
        shp = [1] * g.ndim
        shp[t] = len(m)
        mask &= m.reshape(shp)
    out[~mask] = 0
    return out


def boundary_arg(periodic):
    """Exercise every spelling: one string when uniform, else a per-axis tuple."""
    if all(periodic):
        return "periodic"
    if not any(periodic):
        return "zero"
    return tuple("periodic" if p else "zero" for p in periodic)


def make(case):
    shape, dims, split, sizes, halo, periodic, dtype = case
    grid = get_grid(dims)
    g = global_values(shape, dtype)
    x = dt.from_global(g, grid=grid, split=split, sizes=list(sizes)).with_halo(halo)
    return g, x


def expected_buffer(g, x, halo, periodic):
    box = x.distribution.block_box(x.grid.coords)
    return padded_slice(g, box.start, box.stop, halo, periodic)


def garbage(x):
    """Fill every halo cell with junk (NaN for floats)."""
    fill = np.nan if x.dtype.kind == "f" else -12345
    keep = x.local.copy()
    x.buffer[...] = fill
    x.local[...] = keep


# ---------------------------------------------------------------------------------------------
@given(case=halo_cases())
def test_exchange_matches_padded_global(case):
    shape, dims, split, sizes, halo, periodic, dtype = case
    g, x = make(case)
    assert_all_ranks(COMM, x.buffer.shape == tuple(lo + n + hi for (lo, hi), n in
                                                  zip(halo, x.local_shape)), "buffer shape")
    garbage(x)  # whatever is in the halo before the exchange must be overwritten
    out = x.exchange_halo(boundary_arg(periodic))
    assert out is x
    want = expected_buffer(g, x, halo, periodic)
    assert_allclose_all(COMM, x.buffer, want, rtol=0, equal_nan=False,
                        err_msg=f"case {case} rank {COMM.rank}")
    # interior untouched
    assert_allclose_all(COMM, x.local, g[x.local_slices], rtol=0, equal_nan=False)
    # idempotent: a second exchange changes nothing
    before = x.buffer.copy()
    x.exchange_halo(boundary_arg(periodic))
    assert_allclose_all(COMM, x.buffer, before, rtol=0, equal_nan=False, err_msg="re-run")


@given(case=halo_cases())
def test_split_phase_matches_padded_global(case):
    shape, dims, split, sizes, halo, periodic, dtype = case
    g, x = make(case)
    garbage(x)
    h = x.halo_exchange(boundary_arg(periodic))
    h.begin()
    interior_sum = x.local.astype(np.complex128).sum()  # work on the interior while messages fly
    h.end()
    want = expected_buffer(g, x, halo, periodic)
    assert_allclose_all(COMM, x.buffer, want, rtol=0, equal_nan=False, err_msg=f"case {case}")
    assert_all_ranks(COMM, interior_sum == g[x.local_slices].astype(np.complex128).sum(),
                     "interior changed")
    # the same HaloExchange object can be reused, and begin() twice is refused
    garbage(x)
    h.begin()
    with pytest.raises(RuntimeError):
        h.begin()
    h.end()
    with pytest.raises(RuntimeError):
        h.end()
    assert_allclose_all(COMM, x.buffer, want, rtol=0, equal_nan=False, err_msg="reuse")


def _inner(a, b) -> float:
    return float(np.sum(a.astype(np.float64) * b.astype(np.float64)))


@given(case=halo_cases(), seed=st.integers(0, 2**16))
def test_reverse_exchange_is_adjoint(case, seed):
    shape, dims, split, sizes, halo, periodic, _ = case
    grid = get_grid(dims)
    # rank-dependent data on purpose: replicas are separate inputs of H
    rng = np.random.default_rng([seed, COMM.rank])
    x = dt.zeros(shape, dtype="float64", grid=grid, split=split, sizes=list(sizes), halo=halo)
    x.local[...] = rng.standard_normal(x.local_shape)
    x0 = x.local.copy()
    y = dt.zeros(shape, dtype="float64", grid=grid, split=split, sizes=list(sizes), halo=halo)
    y.buffer[...] = rng.standard_normal(y.buffer.shape)
    y0 = y.buffer.copy()
    b = boundary_arg(periodic)
    x.exchange_halo(b)  # H x, in the buffer
    y.reverse_exchange_halo(b)  # H* y, in the owned block; halo zeroed
    lhs = COMM.allreduce(_inner(x.buffer, y0), op=MPI.SUM)
    rhs = COMM.allreduce(_inner(x0, y.local), op=MPI.SUM)
    scale = COMM.allreduce(float(np.abs(x.buffer).sum() * np.abs(y0).max(initial=0)
                                 + np.abs(x0).sum() * np.abs(y.local).max(initial=0)), op=MPI.SUM)
    assert_all_ranks(COMM, abs(lhs - rhs) <= 1e-12 * max(scale, 1.0),
                     f"<Hx,y>={lhs!r} != <x,H*y>={rhs!r} for {case}")
    # the halo of y is zero afterwards
    mask = np.ones(y.buffer.shape, dtype=bool)
    mask[tuple(slice(lo, lo + n) for (lo, _), n in zip(halo, y.local_shape))] = False
    assert_all_ranks(COMM, not np.any(y.buffer[mask]), "halo not zeroed by the reverse exchange")


@given(case=halo_cases(), seed=st.integers(0, 2**16))
def test_reverse_split_phase_equals_one_shot(case, seed):
    shape, dims, split, sizes, halo, periodic, _ = case
    grid = get_grid(dims)
    rng = np.random.default_rng([seed, COMM.rank])
    y = dt.zeros(shape, dtype="float64", grid=grid, split=split, sizes=list(sizes), halo=halo)
    y.buffer[...] = rng.standard_normal(y.buffer.shape)
    z = dt.zeros(shape, dtype="float64", grid=grid, split=split, sizes=list(sizes), halo=halo)
    z.buffer[...] = y.buffer
    b = boundary_arg(periodic)
    y.reverse_exchange_halo(b)
    h = z.halo_exchange(b)
    h.reverse_begin()
    h.reverse_end()
    assert_allclose_all(COMM, z.buffer, y.buffer, rtol=0, atol=0)


# -- fixed cases that must always be exercised -------------------------------------------------
def test_halo_reaching_past_the_neighbour():
    """Blocks of one cell, halo 3 each side: the halo spans the next three ranks."""
    n = 2 * SIZE + 1
    grid = get_grid((SIZE,))
    g = global_values((n, 3), "float64")
    for periodic in (False, True):
        for halo in (((3, 3), (0, 0)), ((0, 3), (1, 2)), ((3, 0), (2, 1))):
            x = dt.from_global(g, grid=grid, split=(0, None), sizes=[[1] * (SIZE - 1) + [n - SIZE + 1], None]
                               ).with_halo(halo)
            garbage(x)
            x.exchange_halo("periodic" if periodic else "zero")
            want = expected_buffer(g, x, halo, (periodic, periodic))
            assert_allclose_all(COMM, x.buffer, want, rtol=0, equal_nan=False,
                                err_msg=f"halo {halo} periodic {periodic}")


def test_periodic_wider_than_axis_wraps_repeatedly():
    grid = get_grid((SIZE,))
    g = global_values((3, 2), "float32")
    x = dt.from_global(g, grid=grid, split=(0,)).with_halo(((7, 5), (4, 0)))
    garbage(x)
    x.exchange_halo("periodic")
    assert_allclose_all(COMM, x.buffer, expected_buffer(g, x, ((7, 5), (4, 0)), (True, True)),
                        rtol=0, equal_nan=False)


def test_mixed_boundaries_2d_grid():
    dims = (2, SIZE // 2) if SIZE % 2 == 0 else (1, SIZE)
    grid = get_grid(dims)
    g = global_values((5, 7, 3), "float64")
    halo = ((2, 1), (1, 3), (1, 1))
    for periodic in itertools.product((False, True), repeat=3):
        x = dt.from_global(g, grid=grid, split=(0, 1, None)).with_halo(halo)
        garbage(x)
        x.exchange_halo(tuple("periodic" if p else "zero" for p in periodic))
        assert_allclose_all(COMM, x.buffer, expected_buffer(g, x, halo, periodic), rtol=0,
                            equal_nan=False, err_msg=f"periodic {periodic}")


def test_replicated_grid_axis():
    """Split over grid axis 1 only; ranks along grid axis 0 hold copies and exchange among
    themselves (each replica group independently)."""
    if SIZE % 2:
        pytest.skip("needs an even number of ranks")
    grid = get_grid((2, SIZE // 2))
    g = global_values((6, 4), "int64")
    x = dt.from_global(g, grid=grid, split=(1, None)).with_halo(((1, 2), (2, 1)))
    garbage(x)
    x.exchange_halo("periodic")
    assert_allclose_all(COMM, x.buffer, expected_buffer(g, x, ((1, 2), (2, 1)), (True, True)),
                        rtol=0)


def test_wider_than_extent_nonperiodic_raises_everywhere():
    grid = get_grid((SIZE,))
    x = dt.zeros((3, 4), grid=grid, split=(0,), halo=((4, 0), (1, 1)))
    with pytest.raises(ValueError, match="wider than its global extent"):
        x.exchange_halo("zero")
    x.exchange_halo(("periodic", "zero"))  # fine when that axis wraps
    assert COMM.allreduce(1) == SIZE


def test_bad_boundary_raises():
    grid = get_grid((SIZE,))
    x = dt.zeros((4,), grid=grid, halo=1)
    with pytest.raises(ValueError, match="'zero' or 'periodic'"):
        x.exchange_halo("reflect")
    with pytest.raises(ValueError, match="one entry per axis"):
        x.exchange_halo(("zero", "zero"))
    assert COMM.allreduce(1) == SIZE


def test_overlapping_split_phase_exchanges_and_other_traffic():
    """Two split-phase exchanges in flight at once on the same grid (ended in the reverse
    order), with a redistribution and a halo-free reduction in between: messages must never
    cross between them (private communicator, per-piece tags, MPI ordering)."""
    grid = get_grid((SIZE,))
    g1 = global_values((2 * SIZE + 1, 5), "float64")
    g2 = global_values((SIZE + 2, 4), "float32") + 0.5
    a = dt.from_global(g1, grid=grid, split=(0, None)).with_halo(((2, 1), (1, 1)))
    b = dt.from_global(g2, grid=grid, split=(0, None)).with_halo(((1, 3), (0, 2)))
    garbage(a)
    garbage(b)
    ha = a.halo_exchange("periodic")
    hb = b.halo_exchange(("zero", "periodic"))
    ha.begin()
    hb.begin()
    moved = dt.from_global(g1, grid=grid, split=(0, None)).redistribute(split=(None, 0))
    total = float(dt.from_global(g2, grid=grid).sum())
    hb.end()
    ha.end()
    assert_allclose_all(COMM, a.buffer, expected_buffer(g1, a, ((2, 1), (1, 1)), (True, True)),
                        rtol=0, equal_nan=False)
    assert_allclose_all(COMM, b.buffer, expected_buffer(g2, b, ((1, 3), (0, 2)), (False, True)),
                        rtol=0, equal_nan=False)
    assert_allclose_all(COMM, moved.to_numpy(), g1, rtol=0)
    assert_all_ranks(COMM, total == float(g2.astype(np.float64).sum()), f"sum {total}")


@pytest.mark.parametrize("mode", ["poll", "thread"])
def test_progress_while_split_phase_exchange_flies(mode):
    """``test()`` (MPI_Testall) driven by polling or by a progress thread between ``begin()``
    and ``end()`` (and between ``reverse_begin()`` and ``reverse_end()``), with uneven and
    empty blocks: the same halo as a plain exchange, and the reverse exchange still adds every
    halo cell into its owner (the dot-product identity <E x, y> == <x, E^T y>)."""
    from disttensor.core.progress import Progress, overlap_mode
    grid = get_grid((SIZE,))
    sizes = [0] + [3] * (SIZE - 1) if SIZE > 1 else [5]   # an empty block on rank 0
    g = global_values((sum(sizes), 4), "float64")
    x = dt.from_global(g, grid=grid, split=(0, None), sizes=(sizes, None)).with_halo(
        ((1, 2), (1, 0)))
    garbage(x)
    h = x.halo_exchange("periodic").begin()
    with Progress(h.test, overlap_mode("cpu", mode), interval=1e-5) as p:
        for _ in range(50):
            p.poll()
    h.end()
    assert_all_ranks(COMM, h.test(), "test() after end()")
    want = expected_buffer(g, x, ((1, 2), (1, 0)), (True, True))
    assert_allclose_all(COMM, x.buffer, want, rtol=0, equal_nan=False)
    # adjoint: <exchange(x), y>_buffer == <x, reverse(y)>_owned
    rng = np.random.default_rng(COMM.rank + 7)
    y = rng.standard_normal(x.buffer.shape)
    lhs = COMM.allreduce(float(np.vdot(x.buffer, y)))
    x.buffer[...] = y
    h.reverse_begin()
    with Progress(h.test, overlap_mode("cpu", mode), interval=1e-5) as p:
        while not p.poll() and mode == "poll":
            pass
    h.reverse_end()
    owned = dt.from_global(g, grid=grid, split=(0, None), sizes=(sizes, None))
    rhs = COMM.allreduce(float(np.vdot(owned.local, x.local)))
    assert_all_ranks(COMM, abs(lhs - rhs) <= 1e-9 * max(1.0, abs(lhs)), f"{lhs} vs {rhs}")
