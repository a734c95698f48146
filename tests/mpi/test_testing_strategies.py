"""disttensor.testing under MPI: dist_arrays' DistArray equals its NumPy twin on every rank
(every grid shape, uneven and empty blocks), and check_same_draw / check_draws warn on every
rank exactly when the ranks drew differently."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from disttensor.testing.profile import RankDivergenceWarning, check_draws, check_same_draw
from disttensor.testing.strategies import all_grid_dims, dist_arrays, shapes

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()


def _all_ranks_ok(ok: bool, msg: str) -> None:
    """Fail on every rank if ``ok`` is false on any (messages of the failing ranks)."""
    msgs = COMM.allgather(None if ok else msg)
    bad = {r: m for r, m in enumerate(msgs) if m is not None}
    assert not bad, f"failed on rank(s) {sorted(bad)}: {bad}"


def _matches_twin(x, a) -> str | None:
    """Why the DistArray ``x`` is not ``a`` (its shape, dtype, own block, whole), or None."""
    if not isinstance(x, dt.DistArray):
        return f"got {type(x).__name__}"
    if x.shape != a.shape or x.dtype != a.dtype:
        return f"{x.shape} {x.dtype} != {a.shape} {a.dtype}"
    if not np.array_equal(x.local, a[x.local_slices], equal_nan=a.dtype.kind in "fc"):
        return f"block {x.local_slices} differs"
    return None


_seen: set = set()


def _check_against_twin(xa) -> None:
    x, a = xa
    why = _matches_twin(x, a)
    whole = x.to_numpy()  # collective
    if why is None and not np.array_equal(whole, a, equal_nan=a.dtype.kind == "f"):
        why = "to_numpy() differs from the twin"
    _all_ranks_ok(why is None, str(why))
    d = x.distribution
    _seen.add(("grid", d.grid_dims))
    if any(0 in d.sizes(t) for t in d.split_tensor_axes) and x.size:
        _seen.add("empty block")
    if not all(d.is_balanced(t) for t in d.split_tensor_axes):
        _seen.add("uneven")


DTYPES = st.sampled_from(["float64", "int32", "bool"])


@pytest.mark.parametrize("dims", all_grid_dims(SIZE, 3), ids=str)
def test_dist_arrays_equal_their_twin_on_every_rank(dims):
    @settings(max_examples=12)
    @given(xa=dist_arrays(DTYPES, shapes(0, 3, 5), grid=dims))
    def on_grid(xa):
        _check_against_twin(xa)

    on_grid()


@settings(max_examples=15)
@given(xa=dist_arrays(DTYPES, shapes(0, 3, 5)))
def test_dist_arrays_on_a_drawn_grid_equal_their_twin(xa):
    _check_against_twin(xa)


def test_dist_arrays_covered_grids_and_uneven_and_empty_blocks():
    """Runs after the property tests above (file order): what their examples reached."""
    if not _seen:
        pytest.skip("needs the property tests above in the same session")
    want = {("grid", dims) for dims in all_grid_dims(SIZE, 3)}
    if SIZE > 1:
        want |= {"empty block", "uneven"}
    missing = want - _seen
    _all_ranks_ok(not missing, f"never drawn: {sorted(map(str, missing))}")


@settings(max_examples=10)
@given(xa=dist_arrays("float64", (5, 3), grid=(SIZE,), split=(0,), uneven=False,
                      empty=False, elements=st.floats(-1, 1)))
def test_dist_arrays_fixed_grid_balanced_nonempty(xa):
    x, a = xa
    why = _matches_twin(x, a)
    d = x.distribution
    if why is None and d.split != (0, None):
        why = f"split {d.split}"
    if why is None and SIZE <= 5 and (not d.is_balanced(0) or 0 in d.sizes(0)):
        why = f"sizes {d.sizes(0)}"
    _all_ranks_ok(why is None, str(why))


def test_check_same_draw_warns_on_every_rank_exactly_when_ranks_differ():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RankDivergenceWarning)
        same = check_same_draw((np.arange(4), "x", {"n": 3}))
    _all_ranks_ok(same is True, f"equal draws reported as different: {same}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        same = check_same_draw(np.full(3, COMM.rank))
    warned = [w for w in caught if issubclass(w.category, RankDivergenceWarning)]
    if SIZE == 1:
        _all_ranks_ok(same and not warned, "one rank cannot diverge")
    else:
        _all_ranks_ok(same is False and len(warned) == 1 and "agree" in str(warned[0].message),
                      f"rank-dependent draw: returned {same}, warnings {warned}")


_warned: list = []


def test_check_draws_flags_a_rank_dependent_data_draw_and_is_silent_otherwise():
    @settings(max_examples=3)
    @given(n=st.integers(0, 9), data=st.data())
    @check_draws
    def replicated(n, data):
        data.draw(st.lists(st.integers(0, n)))

    @settings(max_examples=2)
    @given(data=st.data())
    @check_draws
    def rank_dependent(data):
        data.draw(st.just(COMM.rank))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replicated()
        quiet = [w for w in caught if issubclass(w.category, RankDivergenceWarning)]
        rank_dependent()
        loud = [w for w in caught if issubclass(w.category, RankDivergenceWarning)]
    _all_ranks_ok(not quiet, f"warned on same draws: {quiet}")
    want = SIZE > 1
    _all_ranks_ok(bool(loud) == want and all("data.draw" in str(w.message) for w in loud),
                  f"rank-dependent draw on {SIZE} rank(s): {[str(w.message) for w in loud]}")


@pytest.mark.parametrize("rank_dependent_arg", [False, True])
def test_check_draws_compares_the_given_arguments(rank_dependent_arg):
    value = COMM.rank if rank_dependent_arg else 7

    @settings(max_examples=1)
    @given(k=st.just(value))
    @check_draws
    def t(k):
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t()
    n = sum(issubclass(w.category, RankDivergenceWarning) for w in caught)
    want = rank_dependent_arg and SIZE > 1
    _all_ranks_ok((n > 0) == want, f"warnings {n}, expected some: {want}")
