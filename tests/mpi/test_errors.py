"""Bad input raises a clear exception on ALL ranks, and the ranks stay in step afterwards.

Every test expects the failure with ``pytest.raises`` on every rank (a rank that does not
raise fails the test, collectively through the conftest safety net) and then runs
:func:`in_step`: a few collectives with no barrier that would hang or mismatch if one rank
were still inside the failed operation.  Some cases fail on one rank only (a wrong local
shape, different arguments per rank); the library must still raise everywhere.
"""
from __future__ import annotations


import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from checks import different_calls, in_step, last_rank_only, mismatch  # noqa: F401
from conftest import assert_all_ranks
from disttensor.core import agreement

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()
RANK = COMM.Get_rank()


two_ranks = pytest.mark.skipif(SIZE == 1, reason="needs two ranks to differ")


# -- errors every rank detects from replicated metadata ------------------------------------------
def test_mismatched_shapes_in_binary_op():
    a = dt.zeros((4, 3))
    b = dt.zeros((5,))
    with pytest.raises(ValueError, match=r"could not be broadcast.*\(4, 3\).*\(5,\)"):
        a + b
    with pytest.raises(ValueError, match="broadcast"):
        a * np.ones(5)  # a NumPy operand, too
    in_step("binary")


def test_grid_size_differs_from_comm_size():
    with pytest.raises(ValueError, match=rf"hold {SIZE + 1} ranks but the communicator has {SIZE}"):
        dt.ProcessGrid((SIZE + 1,))
    with pytest.raises(ValueError, match="cannot be completed"):
        dt.ProcessGrid((SIZE + 1, 0))
    in_step("grid size")


def test_split_names_missing_grid_axis():
    grid = dt.get_default_grid()
    with pytest.raises(ValueError, match=r"names grid axis 1 .*only 1 axes"):
        dt.zeros((4, 4), grid=grid, split=(0, 1))
    with pytest.raises(ValueError, match="grid axis"):
        dt.from_global(np.zeros((4, 4)), grid=grid, split=(None, 3))
    with pytest.raises(ValueError, match="more than one tensor axis"):
        dt.zeros((4, 4), grid=grid, split=(0, 0))
    x = dt.zeros((4, 4))
    with pytest.raises(ValueError, match="grid axis"):
        x.redistribute(split=(None, 2))
    in_step("split")


def test_halo_wider_than_global_extent():
    x = dt.zeros((3, 5), halo=((4, 1), (0, 0)))
    with pytest.raises(ValueError, match=r"halo \(4, 1\) on axis 0 is wider than its global extent 3"):
        x.exchange_halo("zero")
    with pytest.raises(ValueError, match="wider than its global extent"):
        x.halo_exchange(("zero", "periodic"))
    with pytest.raises(ValueError, match="wider than its global extent"):
        x.reverse_exchange_halo()
    x.exchange_halo(("periodic", "zero"))  # legal when the axis wraps
    in_step("halo")


def test_inplace_dtype_mismatch():
    a = dt.zeros(5, dtype="int64")
    b = dt.ones(5, dtype="float64")
    with pytest.raises(TypeError, match=r"Cannot cast ufunc 'add' output from dtype\('float64'\)"):
        a += b
    with pytest.raises(TypeError, match="Cannot cast ufunc"):
        a *= 1.5
    np.testing.assert_array_equal(a.to_numpy(), np.zeros(5, dtype="int64"))  # unchanged
    in_step("inplace")


def test_out_of_range_integer_index():
    x = dt.arange(4)
    with pytest.raises(IndexError, match="index 10 is out of bounds for axis 0 with size 4"):
        x[10]
    with pytest.raises(IndexError, match="out of bounds"):
        x[-5]
    with pytest.raises(IndexError, match="out of bounds"):
        x[4] = 1
    y = dt.zeros((3, 2))
    with pytest.raises(IndexError, match="index 2 is out of bounds for axis 1 with size 2"):
        y[0, 2]
    in_step("index range")


def test_too_many_indices():
    x = dt.arange(4)
    with pytest.raises(IndexError, match="too many indices for array: array is 1-dimensional, but 2"):
        x[0, 0]
    with pytest.raises(IndexError, match="too many indices"):
        dt.zeros((2, 2))[:, :, 0]
    in_step("too many")


def test_other_collective_argument_errors():
    x = dt.zeros(4)
    with pytest.raises(ValueError, match=rf"root {SIZE} outside 0..{SIZE - 1}"):
        x.gather(root=SIZE)
    with pytest.raises(ValueError, match=r"ownership sizes .* summing to the extent 4"):
        dt.zeros(4, sizes=[(5,) + (0,) * (SIZE - 1)])
    with pytest.raises(ValueError, match="'zero' or 'periodic'"):
        dt.zeros(4, halo=1).exchange_halo("mirror")
    in_step("misc")


# -- errors only some ranks see ------------------------------------------------------------------
def test_from_local_blocks_that_do_not_fit():
    if SIZE > 1:
        # an unsplit axis with a different extent on one rank
        local = np.zeros((2, last_rank_only(4, 3)))
        with pytest.raises(ValueError, match=r"axis 1 is not split but the local extents differ"):
            dt.from_local(local)
        # a different number of axes on one rank: an argument the ranks agree on
        local = last_rank_only(np.zeros((2, 3, 1)), np.zeros((2, 3)))
        with mismatch("from_local", "ndim"):
            dt.from_local(local)
    # a block that does not match an explicit distribution on one rank only
    dist = dt.Distribution((2 * SIZE, 3), (SIZE,), (0, None))
    local = np.zeros(last_rank_only((3, 3), (2, 3)))
    with pytest.raises(ValueError, match=r"does not match the distribution's block \(2, 3\)"):
        dt.from_local(local, distribution=dist)
    in_step("from_local")


def test_from_local_replicas_disagree():
    """Split over grid axis 1 of a (2, p/2) grid: ranks along grid axis 0 hold the same block
    coordinate, so their extents along the split axis must agree."""
    if SIZE % 2:
        pytest.skip("needs an even number of ranks")
    grid = dt.ProcessGrid((2, SIZE // 2))
    try:
        local = np.zeros((last_rank_only(3, 2), 4))
        with pytest.raises(ValueError, match="hold different extents of tensor axis 0"):
            dt.from_local(local, grid=grid, split=(1, None))
    finally:
        grid.free()
    in_step("replicas")


def test_process_grid_dims_differ_between_ranks():
    if SIZE == 1:
        pytest.skip("needs two ranks to differ")
    with pytest.raises(ValueError, match="grid dims and periods differ between ranks"):
        dt.ProcessGrid(last_rank_only((1, SIZE), (SIZE, 1)))
    # a valid shape on most ranks but an invalid one on the last rank
    with pytest.raises(ValueError, match=r"hold .* ranks but the communicator has"):
        dt.ProcessGrid(last_rank_only((SIZE + 1,), (SIZE,)))
    with pytest.raises(ValueError, match="differ between ranks"):
        dt.ProcessGrid((SIZE,), periods=last_rank_only(True, False))
    in_step("grid dims")


@pytest.mark.parametrize("root", sorted({0, SIZE - 1}))
def test_from_global_root_passes_none(root):
    a = None if RANK == root else np.arange(6.0)  # the others' arrays are ignored
    with pytest.raises(ValueError, match="the root rank must pass the array"):
        dt.from_global(a, root=root)
    with pytest.raises(ValueError, match=rf"root {SIZE} outside"):
        dt.from_global(np.arange(6.0), root=SIZE)
    in_step("from_global root")


def test_from_global_arrays_differ_without_root():
    if SIZE == 1:
        pytest.skip("needs two ranks to differ")
    with pytest.raises(ValueError, match="differ between ranks"):
        dt.from_global(np.zeros(last_rank_only(4, 3)))
    in_step("from_global differ")


def test_halo_widths_differ_between_ranks():
    if SIZE == 1:
        pytest.skip("needs two ranks to differ")
    # the widths are agreed where the halo is made (creation, with_halo)...
    with mismatch("zeros", "halo"):
        dt.zeros((3 * SIZE, 4), halo=last_rank_only(2, 1))
    with mismatch("with_halo", "halo"):
        dt.zeros((3 * SIZE, 4)).with_halo(last_rank_only(((2, 1), 0), 1))
    # ... and again by the exchange (an array wrapped per rank without checks)
    d = dt.zeros((3 * SIZE, 4)).distribution
    h = last_rank_only(2, 1)
    x = dt.DistArray(np.zeros((3 + 2 * h, 4 + 2 * h)), d, dt.get_default_grid(), h)
    with pytest.raises(dt.ArgumentMismatchError, match="must be the same on every rank"):
        x.exchange_halo()
    y = dt.zeros((3 * SIZE, 4), halo=1)
    with pytest.raises(ValueError, match="must be the same on every rank"):
        y.exchange_halo(last_rank_only("periodic", "zero"))
    # one rank invalid (too wide for a non-periodic axis), the others fine: the mismatch is
    # reported, not the validation error of one rank
    with mismatch("zeros", "halo"):
        dt.zeros((2, 4), halo=((last_rank_only(3, 1), 0), (0, 0)))
    in_step("halo per rank")


def test_grids_over_different_communicators():
    if SIZE == 1:
        pytest.skip("needs two ranks")
    sub = COMM.Split(0, SIZE - 1 - RANK)  # same group, reversed order
    try:
        g = dt.ProcessGrid((SIZE,), comm=sub)
        x = dt.zeros(5)
        with pytest.raises(ValueError, match="different communicators"):
            x.redistribute(grid=g)
        g.free()
    finally:
        sub.Free()
    in_step("communicators")


# -- arguments that differ between ranks: every entry point agrees before data moves ----------
@two_ranks
def test_creation_arguments_differ():
    with mismatch("zeros", "shape"):
        dt.zeros(last_rank_only((4, 3), (4, 4)))
    with mismatch("ones", "dtype"):
        dt.ones(4, dtype=last_rank_only("float32", "float64"))
    with mismatch("empty", "split"):
        dt.empty((4, 4), split=last_rank_only(1, 0))
    with mismatch("zeros", "sizes"):
        dt.zeros(SIZE, sizes=[last_rank_only((SIZE,) + (0,) * (SIZE - 1), (1,) * SIZE)])
    with mismatch("full", "fill_value"):  # the dtype the fill value gives
        dt.full(4, last_rank_only(1, 1.0))
    with mismatch("arange", "stop"):
        dt.arange(last_rank_only(5, 6))
    with mismatch("linspace", "num"):
        dt.linspace(0, 1, last_rank_only(5, 6))
    x = dt.zeros(4)
    with mismatch("zeros_like", "dtype"):
        dt.zeros_like(x, dtype=last_rank_only("int32", None))
    with mismatch("full_like", "fill_value"):
        dt.full_like(x, last_rank_only(np.float32(1), np.float64(1)))
    # one rank invalid (a negative extent): the mismatch is reported on every rank
    with mismatch("zeros", "shape"):
        dt.zeros(last_rank_only(-1, 4))
    in_step("creation differ")


def test_creation_spellings_that_agree():
    """Two spellings of one argument are the same argument (no false mismatch)."""
    a = dt.zeros(last_rank_only(4, (4,)), dtype=last_rank_only("float64", None))
    b = dt.ones((4, 2), split=last_rank_only(0, (0, None)), halo=last_rank_only(1, ((1, 1), 1)))
    c = dt.zeros((4, 2), sizes=last_rank_only([None, None], (None, None)))
    assert a.shape == (4,) and b.halo == ((1, 1), (1, 1)) and c.shape == (4, 2)
    in_step("spellings")


@two_ranks
def test_from_global_and_from_local_arguments_differ():
    with mismatch("from_global", "root"):
        dt.from_global(np.arange(6.0), root=last_rank_only(1, 0))
    with mismatch("from_global", "split"):
        dt.from_global(np.zeros((4, 4)), split=last_rank_only((None, 0), (0, None)), root=0)
    with mismatch("from_global", "a"):
        dt.from_global(np.zeros(4, dtype=last_rank_only("float32", "float64")))
    grid = dt.get_default_grid()
    with mismatch("from_local", "split"):
        dt.from_local(np.zeros((2, 2)), split=last_rank_only((None, 0), (0, None)))
    with mismatch("from_local", "dtype"):
        dt.from_local(np.zeros(2, dtype=last_rank_only("float32", "float64")))
    dist = dt.Distribution((2 * SIZE,), (SIZE,), (0,))
    with mismatch("from_local", "distribution"):
        dt.from_local(np.zeros(2), grid=grid,
                      distribution=last_rank_only(dt.Distribution((2 * SIZE,), (SIZE,), (None,)),
                                                  dist))
    # the local blocks themselves are rank-local: different extents are fine
    y = dt.from_local(np.zeros(last_rank_only(3, 2)))
    assert y.shape == (2 * SIZE + 1,)
    in_step("from_* differ")


@two_ranks
def test_data_movement_arguments_differ():
    x = dt.zeros((2 * SIZE, 4))
    with mismatch("redistribute", "split"):
        x.redistribute(split=last_rank_only((None, 0), (0, None)))
    with mismatch("redistribute", "sizes"):
        x.redistribute(sizes=[last_rank_only((2 * SIZE,) + (0,) * (SIZE - 1), None), None])
    g = dt.ProcessGrid((SIZE, 1))
    try:
        with mismatch("redistribute", "grid"):
            x.redistribute(grid=last_rank_only(g, x.grid), split=(0, None))
    finally:
        g.free()
    y = x.redistribute(split=(None, 0))
    with mismatch("redistribute_adjoint", "like"):
        y.redistribute_adjoint(last_rank_only(y, x))
    with mismatch("gather", "root"):
        x.gather(root=last_rank_only(1, 0))
    with mismatch("astype", "dtype"):
        x.astype(last_rank_only("float32", "float64"))
    with mismatch("to_device", "device"):  # raised before any rank looks for a GPU
        x.to_device(last_rank_only("cuda", "cpu"))
    with mismatch("with_halo", "halo"):
        x.with_halo(last_rank_only(2, 1))
    with different_calls("copy", "to_numpy"):
        x.copy() if RANK == SIZE - 1 else x.to_numpy()
    in_step("movement differ")


@two_ranks
def test_indexing_arguments_differ():
    x = dt.arange(4 * SIZE, dtype="float64")
    with mismatch("getitem", "key"):
        x[last_rank_only(1, 0)]
    with mismatch("getitem", "key"):
        x[last_rank_only(slice(0, 3), slice(1, 3))]
    with mismatch("setitem", "key"):
        x[last_rank_only(1, 0)] = 5.0
    with mismatch("setitem", "value"):
        x[:2] = np.zeros(last_rank_only(1, 2))
    with mismatch("setitem", "value"):  # the scalar's type (its value is data)
        x[0] = last_rank_only(1, 1.0)
    with mismatch("flip", "axis"):
        dt.flip(dt.zeros((2, 2)), last_rank_only(1, 0))
    # a rank-dependent value is data: allowed (compared only under DISTTENSOR_DEBUG)
    if not agreement.DEBUG:
        x[0] = float(RANK)
        np.testing.assert_array_equal(x[1:].to_numpy(), np.arange(1.0, 4 * SIZE))
    in_step("indexing differ")


@two_ranks
def test_reduction_arguments_differ():
    x = dt.ones((2 * SIZE, 3))
    with mismatch("sum", "axis"):
        x.sum(axis=last_rank_only(1, 0))
    with mismatch("mean", "keepdims"):
        x.mean(axis=0, keepdims=last_rank_only(True, False))
    with mismatch("prod", "dtype"):
        x.prod(dtype=last_rank_only("float32", None))
    with mismatch("var", "ddof"):
        x.var(ddof=last_rank_only(1, 0))
    with mismatch("argmax", "axis"):
        x.argmax(axis=last_rank_only(None, 0))
    xt = x.T
    with mismatch("sum", "x"):  # different arrays
        last_rank_only(x, xt).sum()
    # one rank invalid: the mismatch is reported, not the AxisError of one rank
    with mismatch("max", "axis"):
        x.max(axis=last_rank_only(5, 0))
    # one rank skips a reduction: the ranks meet in the next collective call
    with different_calls("sum", "max"):
        x.max() if RANK == SIZE - 1 else x.sum()
    in_step("reduction differ")


@pytest.fixture
def eager_agreement():
    """Every call agreed at once (no deferred agreement of calls that move no data), so a
    rank-dependent argument raises at the call itself (tests/mpi/test_deferred_agreement.py
    checks the deferred default)."""
    with agreement.eager():
        yield


@two_ranks
def test_ufunc_arguments_differ(eager_agreement):
    a = dt.ones((2 * SIZE, 4))
    b = last_rank_only(a.redistribute(split=(None, 0)), dt.ones((2 * SIZE, 4)))
    with mismatch("add", "x2"):
        a + b
    with different_calls("add", "multiply"):
        a * a if RANK == SIZE - 1 else a + a
    with mismatch("multiply", "x2"):  # the scalar's type changes the result dtype
        a * last_rank_only(2, 2.0)
    with mismatch("add", "x2"):
        a + np.ones(last_rank_only(1, 4))
    with mismatch("subtract", "out"):
        np.subtract(a, a, out=last_rank_only(dt.zeros((2 * SIZE, 4), split=(None, 0)),
                                             dt.zeros((2 * SIZE, 4))))
    with mismatch("add", "dtype"):
        np.add(a, a, dtype=last_rank_only("float32", "float64"))
    # a rank-dependent scalar value is data: allowed (compared only under DISTTENSOR_DEBUG)
    if not agreement.DEBUG:
        c = a * float(RANK + 1)
        assert c.shape == a.shape
    in_step("ufunc differ")


@two_ranks
def test_manipulation_arguments_differ():
    x = dt.zeros((2 * SIZE, 3, 2))
    with mismatch("reshape", "shape"):
        x.reshape(last_rank_only((3, 2 * SIZE, 2), (2 * SIZE, 6)))
    with mismatch("transpose", "axes"):
        x.transpose(last_rank_only((1, 0, 2), (2, 1, 0)))
    with mismatch("moveaxis", "destination"):
        dt.moveaxis(x, 0, last_rank_only(1, 2))
    with mismatch("swapaxes", "axis2"):
        dt.swapaxes(x, 0, last_rank_only(1, 2))
    with mismatch("concatenate", "axis"):
        dt.concatenate([x, x], axis=last_rank_only(1, 0))
    with mismatch("concatenate", "arrays"):
        dt.concatenate([x] * last_rank_only(3, 2))
    with mismatch("where", "x"):
        dt.where(x > 0, last_rank_only(x, 1.0), 0.0)
    # one rank invalid (an impossible shape): the mismatch is reported
    with mismatch("reshape", "shape"):
        x.reshape(last_rank_only((5, 7), (-1,)))
    in_step("manipulation differ")


@two_ranks
def test_random_arguments_differ():
    with mismatch("Generator.random", "seed"):
        dt.random.default_rng(last_rank_only(1, 0)).random((4,))
    with mismatch("Generator.normal", "shape"):
        dt.random.default_rng(0).normal(shape=last_rank_only((5,), (4,)))
    with mismatch("Generator.uniform", "high"):
        dt.random.default_rng(0).uniform(0.0, last_rank_only(2.0, 1.0), shape=(4,))
    rng = dt.random.default_rng(0)
    if RANK == SIZE - 1:
        rng.counter += 1  # a rank that drew one array more before
    with mismatch("Generator.integers", "stream"):
        rng.integers(5, shape=(4,))
    in_step("random differ")


def test_validation_errors_with_agreed_arguments_still_raise_everywhere():
    """Arguments equal on every rank: the validation errors are raised, as before."""
    x = dt.zeros((2 * SIZE, 3))
    with pytest.raises(np.exceptions.AxisError):
        x.sum(axis=2)
    with pytest.raises(ValueError, match="cannot reshape"):
        x.reshape((7, 5))
    with pytest.raises(ValueError, match="repeated axis"):
        x.transpose((0, 0))
    with pytest.raises(IndexError, match="out of bounds for axis 0"):
        x[[0, 2 * SIZE]]
    with pytest.raises(ValueError, match="zero-size array"):
        dt.zeros((0, 3)).max()
    with pytest.raises(ZeroDivisionError):
        dt.arange(0, 4, 0)
    with pytest.raises(ValueError, match="high <= low"):
        dt.random.default_rng(0).integers(3, 3, shape=(2,))
    in_step("agreed validation")


def test_one_agreement_per_entry_point(monkeypatch):
    """Entry points that call others (mean -> sum, reshape -> redistribute, a ufunc aligning
    an operand, from_global -> with_halo) agree once; with agreement disabled, entry points
    that move no data make no message at all."""
    calls = []
    orig = agreement.status_allreduce

    def counting(comm, failed, dig):
        calls.append(dig is not None)
        return orig(comm, failed, dig)
    monkeypatch.setattr(agreement, "status_allreduce", counting)
    x = dt.ones((2 * SIZE, 3))
    y = x.redistribute(split=(None, 0))
    v = y[::-1, 1]
    expect = 1 if SIZE > 1 else 0
    for name, fn in [("mean", lambda: x.mean(axis=0)), ("std", lambda: x.std()),
                     ("reshape", lambda: x.reshape(3, 2 * SIZE)),
                     ("add", lambda: x + y),
                     ("getitem", lambda: x[-1, ::-1]),
                     ("setitem", lambda: x.__setitem__((slice(None), 0), v)),
                     ("from_global", lambda: dt.from_global(np.ones(4), halo=1)),
                     ("concatenate", lambda: dt.concatenate([x, y], axis=None)),
                     ("moveaxis", lambda: dt.moveaxis(x, 0, 1)),
                     ("arange", lambda: dt.arange(5))]:
        fn()  # warm (sub-communicators, caches)
        calls.clear()
        fn()
        assert_all_ranks(COMM, calls == [True] * expect,
                         f"{name}: agreement all-reduces {calls}, expected {expect}")
    calls.clear()
    with agreement.disabled():
        x.transpose()
        x.copy()
        x.astype("float32")
        x + 1.0
    assert_all_ranks(COMM, not calls, f"{len(calls)} all-reduces with agreement off")
    in_step("one agreement")
