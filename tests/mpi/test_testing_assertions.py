"""disttensor.testing.assertions under MPI: each assertion passes on correct input and, when
the input is broken on ONE rank only, fails on EVERY rank with the SAME message, which names
the failing rank and (for arrays) the worst element's global index.  Layouts cover uneven
blocks (5 rows on 2-4 ranks), an explicit zero-size block, and replicated grid axes."""
from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor.core.distribution import Distribution
from disttensor.testing.assertions import (assert_adjoint, assert_all_ranks, assert_allclose,
                                           assert_array_equal, assert_raises_collectively,
                                           assert_same_on_all_ranks)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
SHAPE = (5, 3)
_GRIDS: dict = {}


def grid(dims) -> dt.ProcessGrid:
    dims = tuple(dims)
    if dims not in _GRIDS:
        _GRIDS[dims] = dt.ProcessGrid(dims)
    return _GRIDS[dims]


def _zero_block_sizes(n: int, p: int) -> list[int]:
    """``n`` rows on ``p`` ranks, rank 1 owning none (when there is a rank 1)."""
    if p == 1:
        return [n]
    rest = list(dt.core.distribution.balanced_sizes(n, p - 1))
    return rest[:1] + [0] + rest[1:]


# (grid dims, split, sizes): uneven balanced, explicit with a zero block, a replicated axis
LAYOUTS = [((SIZE,), (0,), None),
           ((SIZE,), (0,), [_zero_block_sizes(SHAPE[0], SIZE), None]),
           ((1, SIZE), (0, None), None),
           ((SIZE, 1), (None, 0), None)]
if SIZE == 4:
    LAYOUTS.append(((2, 2), (1, None), None))  # columns over grid axis 0, replicas along 1


def glob(shape=SHAPE, dtype=np.float64) -> np.ndarray:
    return (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 1.5 - 4).astype(dtype)


def dist(a, layout) -> dt.DistArray:
    dims, split, sizes = layout
    return dt.from_global(a, grid=grid(dims), split=split, sizes=sizes)


def collective_failure(fn) -> str:
    """``fn()`` must raise AssertionError on every rank with the same message (checked with
    an all-gather, so the outcome is the same on every rank); returns the message."""
    try:
        fn()
        msg = None
    except AssertionError as e:
        msg = str(e)
    everyone = COMM.allgather(msg)
    passed = [r for r, m in enumerate(everyone) if m is None]
    assert not passed, f"no AssertionError on ranks {passed}"
    assert all(m == everyone[0] for m in everyone), f"messages differ between ranks: {everyone}"
    return everyone[0]


def last_nonempty_rank(d: Distribution) -> int:
    return max(r for r in range(SIZE) if d.rank_box(r).size > 0)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_allclose_and_array_equal_pass(layout):
    g = glob()
    x = dist(g, layout)
    assert_allclose(x, g)
    assert_array_equal(x, g, strict=True)
    assert_allclose(g, x)  # a global array first: the DistArray's layout still decides
    assert_allclose(x, g + 1e-9, rtol=0, atol=1e-8)
    for other in LAYOUTS:  # another layout: redistributed before comparing
        assert_array_equal(x, dist(g, other))
    assert_allclose(dist(np.full(SHAPE, 2.0), layout), 2.0)  # a scalar broadcasts
    assert_array_equal(x.local, g[x.local_slices])  # plain per-rank arrays
    nan = g.copy()
    nan[0, 0] = np.nan
    assert_allclose(dist(nan, layout), nan)  # NaNs in the same places are equal
    assert_array_equal(dist(nan, layout), nan)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_one_rank_mismatch_fails_everywhere_with_global_index(layout):
    g = glob()
    x = dist(g, layout)
    owner = last_nonempty_rank(x.distribution)
    box = x.distribution.rank_box(owner)
    index = tuple(hi - 1 for hi in box.stop)  # the owner's last element, in global coordinates
    if RANK == owner:
        x.local[(-1,) * x.ndim] += 0.5  # only this replica is wrong
    want = (rf"Mismatched elements: 1 / 15 .*on rank {owner}\n"
            rf"Max absolute difference among violations: 0.5 at global index "
            rf"\({index[0]}, {index[1]}\) on rank {owner}")
    for check in (lambda: assert_allclose(x, g, err_msg="the note"),
                  lambda: assert_array_equal(x, g),
                  lambda: assert_allclose(x, dist(g, LAYOUTS[0]))):
        msg = collective_failure(check)
        assert re.search(want, msg), msg
    # only the owner's block is named
    msg = collective_failure(lambda: assert_allclose(x, g, err_msg="the note"))
    assert "\nthe note\n" in msg, msg
    assert re.search(rf"^rank {owner}: 1 mismatched in its block", msg, re.M), msg
    assert len(re.findall(r"^rank \d+: ", msg, re.M)) == 1, msg
    if all(x.grid.dims[a] == 1 for a in x.distribution.replicated_grid_axes):
        # x moved to another layout: the element is found where that layout keeps it
        y = dist(g, LAYOUTS[-1])
        holders = [r for r in range(SIZE) if y.distribution.rank_box(r).intersect(
            type(box)(index, tuple(i + 1 for i in index)))]
        msg = collective_failure(lambda: assert_allclose(y, x))
        assert re.search(rf"Mismatched elements: 1 / 15 .*on rank{'s' * (len(holders) > 1)} "
                         rf"{re.escape(str(holders[0] if len(holders) == 1 else holders))}\n"
                         rf".*at global index \({index[0]}, {index[1]}\)", msg), msg


def test_every_element_wrong_counts_each_global_element_once():
    layout = LAYOUTS[-1]  # replicated on 2-4 ranks when SIZE == 4, else split columns
    g = glob()
    msg = collective_failure(lambda: assert_allclose(dist(g, layout), g + 1))
    assert "Mismatched elements: 15 / 15 (100%)" in msg, msg


def test_shape_and_dtype_mismatch_fail_everywhere():
    g = glob()
    x = dist(g, LAYOUTS[1])
    msg = collective_failure(lambda: assert_allclose(x, g[:4]))
    assert "(shapes (5, 3), (4, 3) mismatch)" in msg, msg
    msg = collective_failure(lambda: assert_array_equal(x, g.astype(np.float32), strict=True))
    assert "(dtypes float64, float32 mismatch)" in msg, msg
    collective_failure(lambda: assert_array_equal(x, 0.0, strict=True))  # no broadcast
    with pytest.raises(ValueError, match="rtol"):
        assert_allclose(x, g, rtol=-1)


def test_plain_arrays_differ_on_one_rank():
    g = glob()
    a = g.copy()
    if RANK == SIZE - 1:
        a[2, 1] = 100.0
    assert_allclose(g, g)
    msg = collective_failure(lambda: assert_allclose(a, g))
    assert re.search(rf"1 / 15 on rank {SIZE - 1}\n.*at index \(2, 1\) on rank {SIZE - 1} "
                     r"\(actual 100.0, desired 6.5\)", msg), msg


def test_assert_all_ranks():
    assert_all_ranks(True, "unused")
    msg = collective_failure(lambda: assert_all_ranks(RANK != SIZE - 1, f"bad {RANK}"))
    assert msg == f"failed on rank {SIZE - 1} of {SIZE}\nrank {SIZE - 1}: bad {SIZE - 1}"
    msg = collective_failure(lambda: assert_all_ranks(False, "same", comm=COMM))
    ranks = f"ranks {list(range(SIZE))}" if SIZE > 1 else "rank 0"
    assert msg == f"failed on {ranks} of {SIZE}\n{ranks}: same"


def test_assert_same_on_all_ranks():
    x = dist(glob(), LAYOUTS[1])
    value = (1, "a", np.arange(4.0), {"k": (2, np.float32(3))}, x, np.array([np.nan]))
    assert_same_on_all_ranks(value)
    assert_same_on_all_ranks(x.shape, comm=COMM)
    if SIZE == 1:
        return
    odd = np.arange(4.0)
    if RANK == SIZE - 1:
        odd[3] = -1.0
    msg = collective_failure(lambda: assert_same_on_all_ranks(odd, err_msg="odd"))
    assert msg.startswith(f"value differs between ranks (2 distinct values on {SIZE} ranks)")
    assert f"\nrank {SIZE - 1}: array([ 0.,  1.,  2., -1.])" in msg, msg
    assert "odd" in msg
    # metadata of DistArrays: the same global array in another layout on one rank
    balanced = dist(glob(), LAYOUTS[0])
    msg = collective_failure(lambda: assert_same_on_all_ranks(x if RANK == SIZE - 1 else balanced))
    sizes = re.escape(str(x.distribution.sizes(0))[1:-1])
    assert re.search(rf"\nrank {SIZE - 1}: DistArray\(.*sizes=\(\({sizes}", msg), msg
    msg = collective_failure(lambda: assert_same_on_all_ranks(1 if RANK else np.int64(1)))
    assert "rank 0: np.int64(1)" in msg, msg


def test_assert_raises_collectively():
    assert_raises_collectively(ValueError, int, "x", match="invalid literal")
    assert_raises_collectively((KeyError, ValueError), int, "x")
    with assert_raises_collectively(ZeroDivisionError, match="division") as ctx:
        1 / 0
    assert isinstance(ctx.value, ZeroDivisionError)

    def raises_on_rank0():
        if RANK == 0:
            raise ValueError("rank 0 only")

    if SIZE > 1:
        msg = collective_failure(lambda: assert_raises_collectively(ValueError, raises_on_rank0))
        others = f"ranks {list(range(1, SIZE))}" if SIZE > 2 else "rank 1"
        assert msg == (f"expected ValueError on every rank; failed on {others} of {SIZE}\n"
                       f"{others}: did not raise"), msg

    def wrong_on_last():
        raise (TypeError if RANK == SIZE - 1 else ValueError)("boom")

    msg = collective_failure(lambda: assert_raises_collectively(ValueError, wrong_on_last))
    assert f"rank {SIZE - 1}: raised TypeError: boom" in msg, msg
    msg = collective_failure(lambda: assert_raises_collectively(ValueError, int, "x",
                                                                match="^nothing"))
    assert "does not match '^nothing'" in msg

    def context_form():
        with assert_raises_collectively(ValueError):
            raises_on_rank0()
    if SIZE > 1:
        collective_failure(context_form)
    with pytest.raises(TypeError, match="exception class"):
        assert_raises_collectively(3, int, "x")


# -- adjoints --------------------------------------------------------------------------------
def _halo_pair(layout, periodic: bool, broken_rank: int | None = None):
    """H: owned block -> buffer after a halo exchange (width 1 along axis 0); H*: the reverse
    exchange.  ``broken_rank`` skips the accumulation of the halo on that rank only."""
    dims, split, sizes = layout
    halo = [(1, 1), (0, 0)]
    boundary = "periodic" if periodic else "zero"

    def forward(x):
        h = x.with_halo(halo)
        h.exchange_halo(boundary)
        return h.buffer.copy()

    def adjoint(buf):
        y = dt.zeros(SHAPE, grid=grid(dims), split=split, sizes=sizes, halo=halo)
        y.buffer[...] = buf
        before = y.local.copy()
        y.reverse_exchange_halo(boundary)
        if RANK == broken_rank:
            y.local[...] = before  # the halo sums went nowhere on this rank
        return y
    return forward, adjoint


@pytest.mark.parametrize("layout", LAYOUTS[:2], ids=str)
def test_adjoint_of_the_halo_exchange(layout):
    rng = np.random.default_rng([7, RANK])  # replicas are independent inputs: per-rank data
    x = dist(glob(), layout)
    x.local[...] = rng.standard_normal(x.local_shape)
    f, f_adj = _halo_pair(layout, periodic=True)
    y = rng.standard_normal(f(x).shape)
    assert_adjoint(f, f_adj, x, y, inner="blocks")
    broken = last_nonempty_rank(x.distribution)
    f, f_adj = _halo_pair(layout, periodic=True, broken_rank=broken)
    msg = collective_failure(lambda: assert_adjoint(f, f_adj, x, y, inner="blocks"))
    assert msg.startswith("adjoint test failed: <f(x), y> != <x, f_adjoint(y)>"), msg
    assert re.search(r"<f\(x\), y> = -?\d.*\n<x, f_adjoint\(y\)> = -?\d", msg), msg


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_adjoint_global_inner_product(layout):
    rng = np.random.default_rng(3)  # the same global arrays on every rank
    x = dist(rng.standard_normal(SHAPE), layout)
    y = dist(rng.standard_normal(SHAPE), layout)
    # a shift along axis 0 (crossing block boundaries) and its adjoint, the opposite shift
    assert_adjoint(lambda v: dt.roll(v, 1, axis=0), lambda v: dt.roll(v, -1, axis=0), x, y)
    # moving data between layouts is the identity on global arrays (replicas counted once)
    other = LAYOUTS[(LAYOUTS.index(layout) + 1) % len(LAYOUTS)]
    assert_adjoint(lambda v: dist(v.to_numpy(), other), lambda v: dist(v.to_numpy(), layout),
                   x, y)
    # replicated plain values: a sum and its adjoint, broadcasting
    assert_adjoint(lambda v: np.array([float(dt.sum(v))]),
                   lambda s: dist(np.full(SHAPE, s[0]), layout), x, np.array([0.7]))
    msg = collective_failure(lambda: assert_adjoint(
        lambda v: dt.roll(v, 1, axis=0), lambda v: dt.roll(v, 1, axis=0), x, y, err_msg="dir"))
    assert "\ndir\n" in msg and "inner='global'" in msg, msg


def test_adjoint_of_redistribute_blocks():
    src, dst = LAYOUTS[1], LAYOUTS[-1]
    rng = np.random.default_rng([11, RANK])
    x = dist(glob(), src)
    x.local[...] = rng.standard_normal(x.local_shape)
    y = dist(glob(), dst)
    y.local[...] = rng.standard_normal(y.local_shape)

    def forward(v):
        return v.redistribute(grid=grid(dst[0]), split=dst[1], sizes=dst[2])

    assert_adjoint(forward, lambda w: w.redistribute_adjoint(x), x, y, inner="blocks")

    def broken(w):
        out = w.redistribute_adjoint(x)
        if RANK == SIZE - 1:
            out.local[...] *= 2
        return out

    if x.distribution.rank_box(SIZE - 1).size:
        collective_failure(lambda: assert_adjoint(forward, broken, x, y, inner="blocks"))


def test_adjoint_reports_an_exception_on_one_rank():
    x = dist(glob(), LAYOUTS[0])

    def fails_on_last(v):
        if RANK == SIZE - 1:
            raise RuntimeError("adjoint bug")
        return v

    msg = collective_failure(lambda: assert_adjoint(lambda v: v, fails_on_last, x, x))
    assert f"rank {SIZE - 1}: f_adjoint raised RuntimeError: adjoint bug" in msg, msg
    with pytest.raises(ValueError, match="inner must be"):
        assert_adjoint(lambda v: v, lambda v: v, x, x, inner="local")
