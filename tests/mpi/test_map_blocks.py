"""dt.map_blocks and dt.apply_along_axis (also through np.apply_along_axis) against NumPy
float64 on random shapes and layouts (1-3-D grids, uneven and empty blocks): blocks aligned
by the library's rule, result layouts inferred or declared (chunks=, drop_axis=, new_axis=),
block_info/block_id, and bad input -- results whose shapes or dtypes differ by rank, a function
failing on one rank, arguments that differ between ranks -- raising on every rank."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import (SIZE, check_blocks as check, collective_checks, dist, examples, expect,
                    grid, last_rank_only, mismatch, settle)
from conftest import assert_raises_all
from mpi4py import MPI
from disttensor.testing.strategies import layouts, shapes

COMM = MPI.COMM_WORLD


@st.composite
def case(draw, min_ndim=1, max_ndim=3, min_side=0):
    shape = draw(shapes(min_ndim, max_ndim, 6, min_side=min_side))
    return shape, draw(layouts(shape, SIZE)), draw(st.integers(0, 2**16))


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


@settings(max_examples=examples(6))
@given(case(), case(), st.data())
@collective_checks
def test_map_blocks_elementwise_aligned_and_block_info(c1, c2, data):
    shape, layout, seed = c1
    a = rand(shape, seed)
    x = dist(a, layout)
    check(dt.map_blocks(lambda b, s, k=0: b * s + k, x, 2.0, k=1.0), a * 2.0 + 1.0, "scale",
          layout=layout)
    # a second operand in another layout (redistributed to x's), one broadcast along axis 0
    _, layout2, seed2 = c2
    if len(c2[0]) and c2[0] == shape:
        b = rand(shape, seed2)
        y = dist(b, layout2)
        check(dt.map_blocks(np.add, x, y), a + b, "two layouts", layout=layout)
    row = a[:1] * 3.0
    if shape[0]:
        check(dt.map_blocks(np.multiply, x, dt.from_global(row)), a * row, "broadcast")

    def where_am_i(blk, block_info=None, block_id=None):
        loc = block_info[0]["array-location"]
        assert block_info[0]["shape"] == shape
        assert tuple(block_id) == block_info[0]["chunk-location"]
        assert tuple(b - a for a, b in loc) == blk.shape
        idx = np.indices(blk.shape, dtype=float)
        return sum((i + lo) * 10.0 ** t for t, (i, (lo, _)) in enumerate(zip(idx, loc))) \
            if blk.ndim else np.zeros(())
    want = sum(i * 10.0 ** t for t, i in enumerate(np.indices(shape, dtype=float)))
    check(dt.map_blocks(where_am_i, x), np.asarray(want, dtype=float), "block_info",
          layout=layout)
    # the result never aliases the input
    z = dt.map_blocks(lambda blk: blk, x)
    z.local[...] = 7.0
    expect(np.array_equal(x.local, a[x.local_slices]), "map_blocks result aliases its input")


@settings(max_examples=examples(7))
@given(case(min_ndim=2, min_side=1), st.data())
@collective_checks
def test_drop_new_axis_and_chunks(c, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    nd = len(shape)
    t = data.draw(st.integers(0, nd - 1))
    check(dt.map_blocks(lambda b: b.sum(axis=t), x, drop_axis=t), a.sum(axis=t), "drop_axis",
          rtol=1e-12, atol=1e-12)
    k = data.draw(st.integers(0, nd))
    got = dt.map_blocks(lambda b: np.stack([b, -b], axis=k), x, new_axis=k)
    check(got, np.stack([a, -a], axis=k), "new_axis")
    expect(got.split[k] is None, "a new axis is whole on every rank")
    d = x.distribution
    chunks = tuple(d.sizes(i) if g is not None else n for i, (g, n) in
                   enumerate(zip(d.split, shape)))
    check(dt.map_blocks(np.negative, x, chunks=chunks, dtype=np.float32),
          (-a).astype(np.float32), "declared chunks", layout=layout)

    def with_out_info(b, block_info=None):
        info = block_info[None]
        assert info["chunk-shape"] == b.shape and info["dtype"] == np.float64
        return b + 1
    check(dt.map_blocks(with_out_info, x, chunks=chunks, dtype=np.float64), a + 1, "info[None]")
    if any(g is not None and x.grid.dims[g] > 1 for g in d.split):
        wrong = tuple(n for n in shape)   # every block the whole extent: not what comes back
        assert_raises_all(COMM, ValueError, "declared chunks",
                          lambda: dt.map_blocks(np.negative, x, chunks=wrong))


def test_map_blocks_bad_input_raises_on_every_rank(comm):
    a = np.arange(24.0).reshape(6, 4)
    x = dt.from_global(a)
    assert_raises_all(comm, TypeError, "at least one DistArray",
                      lambda: dt.map_blocks(np.negative, a))
    assert_raises_all(comm, TypeError, "fn must be callable",
                      lambda: dt.map_blocks(3, x))
    assert_raises_all(comm, ValueError, "axes",
                      lambda: dt.map_blocks(lambda b: b.sum(axis=1), x))
    assert_raises_all(comm, TypeError, "positionally",
                      lambda: dt.map_blocks(np.add, x, x2=x))
    assert_raises_all(comm, ValueError, "chunks",
                      lambda: dt.map_blocks(np.negative, x, chunks=(6,)))

    def fails_on_last_rank(b):
        if COMM.rank == SIZE - 1:
            raise ZeroDivisionError("only here")
        return b
    assert_raises_all(comm, ZeroDivisionError, "only here",
                      lambda: dt.map_blocks(fails_on_last_rank, x))
    if SIZE > 1:
        assert_raises_all(comm, ValueError, "axis 1 is whole on every rank but its extent",
                          lambda: dt.map_blocks(lambda b: b[:, :COMM.rank + 1], x))
        assert_raises_all(comm, ValueError, "different dtypes",
                          lambda: dt.map_blocks(lambda b: b.astype(last_rank_only(
                              np.float32, np.float64)), x))
        y = dt.map_blocks(lambda b: b.astype(last_rank_only(np.float32, np.float64)), x,
                          dtype=np.float64)
        check(y, a, "dtype= casts")
        with mismatch("map_blocks", "dtype"):
            dt.map_blocks(np.negative, x, dtype=last_rank_only(np.float32, np.float64))
    check(dt.map_blocks(np.negative, x), -a, "still usable")
    settle()


FUNCS = {
    "cumsum": np.cumsum,                          # keeps the length
    "sum": np.sum,                                # a scalar: the axis goes
    "head2": lambda v: v[:2] * 2.0,               # a shorter vector
    "outer2": lambda v: np.outer(v[:2], v[-2:]),  # a 2-D result
    "count": lambda v: int((v > 0).sum()),        # an integer result
}


@settings(max_examples=examples(10))
@given(case(min_side=1), st.sampled_from(sorted(FUNCS)), st.data())
@collective_checks
def test_apply_along_axis_matches_numpy(c, name, data):
    shape, layout, seed = c
    a = rand(shape, seed)
    x = dist(a, layout)
    ax = data.draw(st.integers(-len(shape), len(shape) - 1))
    fn = FUNCS[name]
    if name in ("head2", "outer2") and shape[ax] < 2:
        return
    want = np.apply_along_axis(fn, ax, a)
    got = dt.apply_along_axis(fn, ax, x)
    check(got, want, f"apply_along_axis {name} axis {ax}", rtol=1e-12, atol=1e-12)
    if name == "cumsum":
        expect(got.distribution == x.distribution, "a length-keeping func1d keeps the layout")
    check(np.apply_along_axis(fn, ax, x), want, "through np.apply_along_axis", rtol=1e-12,
          atol=1e-12)


def test_apply_along_axis_keeps_an_uneven_layout(comm):
    a = rand((3 * SIZE + 1, 2), 5)
    sizes = [1] * SIZE
    sizes[-1] += a.shape[0] - SIZE
    x = dt.from_global(a, grid=grid((SIZE,)), split=(0, None), sizes=[sizes, None])
    got = dt.apply_along_axis(np.cumsum, 0, x)
    check(got, np.cumsum(a, axis=0), "cumsum along the split axis", rtol=1e-12,
          layout=((SIZE,), (0, None), [sizes, None]))
    settle()


def test_apply_along_axis_bad_input(comm):
    x = dt.from_global(np.ones((4, 3)))
    assert_raises_all(comm, np.exceptions.AxisError, "out of bounds",
                      lambda: dt.apply_along_axis(np.sum, 2, x))
    assert_raises_all(comm, ValueError, "iteration dimensions are 0",
                      lambda: dt.apply_along_axis(np.sum, 1, dt.from_global(np.ones((0, 3)))))
    assert_raises_all(comm, TypeError, "arr must be a DistArray",
                      lambda: dt.apply_along_axis(np.sum, 0, np.ones(3)))
    if SIZE > 1:
        assert_raises_all(comm, ValueError, "different shapes on different ranks",
                          lambda: dt.apply_along_axis(lambda v: v[:COMM.rank + 1], 1, x))
        with mismatch("apply_along_axis", "axis"):
            dt.apply_along_axis(np.sum, last_rank_only(0, 1), x)
    settle()
