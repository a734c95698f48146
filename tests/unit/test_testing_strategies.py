"""disttensor.testing.strategies and .profile without MPI: the strategies cover every grid
factorization, uneven and empty blocks; they draw the same sequence in two fresh processes
(whatever else those imported); impossible layouts raise at definition."""
from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import disttensor as dt
from disttensor.testing import profile
from disttensor.testing import strategies as dts

ROOT = Path(__file__).resolve().parents[2]


def _brute_force_factorizations(n: int, max_ndim: int) -> set[tuple[int, ...]]:
    return {dims for k in range(1, max_ndim + 1)
            for dims in itertools.product(range(1, n + 1), repeat=k) if math.prod(dims) == n}


# -- grids -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n, max_ndim", [(1, 1), (1, 3), (4, 2), (6, 3), (12, 3), (7, 2)])
def test_all_grid_dims_are_exactly_the_ordered_factorizations(n, max_ndim):
    got = dts.all_grid_dims(n, max_ndim)
    assert len(got) == len(set(got))
    assert set(got) == _brute_force_factorizations(n, max_ndim)
    assert [len(d) for d in got] == sorted(len(d) for d in got)  # shortest first


def test_grids_12_3_draws_every_factorization():
    want = _brute_force_factorizations(12, 3)
    assert len(want) == 1 + 6 + 18  # (12,); ordered pairs; ordered triples
    for dims in want:
        assert find(dts.grids(12, 3), lambda d, dims=dims: d == dims) == dims
    assert find(dts.grids(12, 3), lambda d: True) == (12,)  # shrinks to the 1-D grid


# -- splits and sizes ------------------------------------------------------------------------
@given(ndim=st.integers(0, 4), grid_ndim=st.integers(0, 4), data=st.data())
def test_splits_use_each_grid_axis_at_most_once_and_cover(ndim, grid_ndim, data):
    split = data.draw(dts.splits(ndim, grid_ndim))
    used = [g for g in split if g is not None]
    assert len(split) == ndim and len(used) == len(set(used))
    assert all(0 <= g < grid_ndim for g in used)
    if grid_ndim <= ndim:
        grid = (1,) * grid_ndim if grid_ndim else 0  # a dims tuple, or the number of grid axes
        covered = data.draw(dts.splits(ndim, grid, cover=True))
        assert sorted(g for g in covered if g is not None) == list(range(grid_ndim))


@given(n=st.integers(0, 12), p=st.integers(1, 6), empty=st.booleans(), data=st.data())
def test_explicit_sizes_are_compositions(n, p, empty, data):
    if not empty and n < p:
        with pytest.raises(ValueError, match="non-empty"):
            dts.explicit_sizes(n, p, empty=empty)
        return
    sizes = data.draw(dts.explicit_sizes(n, p, empty=empty))
    assert len(sizes) == p and sum(sizes) == n and min(sizes) >= (0 if empty else 1)


def test_explicit_sizes_reach_empty_and_uneven_blocks():
    assert 0 in find(dts.explicit_sizes(5, 3), lambda s: 0 in s)
    s = find(dts.explicit_sizes(9, 3, empty=False), lambda s: max(s) - min(s) >= 3)
    assert min(s) >= 1 and max(s) - min(s) >= 3


def _has_empty_block(d: dt.Distribution) -> bool:
    return any(0 in d.sizes(t) for t in d.split_tensor_axes)


def _is_uneven(d: dt.Distribution) -> bool:
    return not all(d.is_balanced(t) for t in d.split_tensor_axes)


def test_distributions_reach_empty_and_uneven_blocks_on_every_grid_shape():
    for dims in dts.all_grid_dims(4, 2):
        d = find(dts.distributions(dts.shapes(1, 3), dims), _has_empty_block)
        assert isinstance(d, dt.Distribution) and d.grid_dims == dims and _has_empty_block(d)
        d = find(dts.distributions((6, 6), dims), lambda d: _is_uneven(d) and not
                 _has_empty_block(d))
        assert _is_uneven(d)


@settings(suppress_health_check=list(HealthCheck))
@given(data=st.data(), dims=dts.grids(6, 3), uneven=st.booleans(), empty=st.booleans())
def test_distributions_respect_uneven_and_empty(data, dims, uneven, empty):
    d = data.draw(dts.distributions(dts.shapes(0, 4, 8), dims, uneven=uneven, empty=empty))
    assert d.grid_dims == dims
    if not uneven:
        assert not _is_uneven(d), d
    if not empty:
        assert not _has_empty_block(d), d


# -- layouts ---------------------------------------------------------------------------------
@given(data=st.data(), shape=dts.shapes(0, 4, 6), nranks=st.integers(1, 8))
def test_layouts_are_valid_and_unpack_like_the_old_tuples(data, shape, nranks):
    layout = data.draw(dts.layouts(shape, nranks))
    assert isinstance(layout, dts.Layout)
    dims, split, sizes = layout
    assert math.prod(dims) == nranks and 1 <= len(dims) <= 3
    d = layout.distribution(shape)
    assert d == dt.Distribution(shape, dims, split, sizes) and d.shape == shape


def test_layouts_with_a_shape_strategy_draw_the_shape_too():
    shape, layout = find(dts.layouts(dts.shapes(2, 2), 4),
                         lambda sl: len(sl[1].dims) == 2 and _has_empty_block(
                             sl[1].distribution(sl[0])))
    assert len(shape) == 2 and _has_empty_block(layout.distribution(shape))
    shape, layout = find(dts.layouts(None, 3), lambda sl: True)
    assert isinstance(layout, dts.Layout) and math.prod(layout.dims) == 3


# -- dist_arrays on one rank -----------------------------------------------------------------
@settings(max_examples=15, suppress_health_check=list(HealthCheck))
@given(xa=dts.dist_arrays(st.sampled_from(["float64", "int32"]), dts.shapes(0, 3, 4)))
def test_dist_arrays_match_their_twin_on_one_rank(xa):
    x, a = xa
    assert isinstance(x, dt.DistArray) and isinstance(a, np.ndarray)
    assert x.shape == a.shape and x.dtype == a.dtype
    np.testing.assert_array_equal(x.to_numpy(), a)


def test_dist_arrays_elements_and_fixed_split():
    x, a = find(dts.dist_arrays("int64", (4, 2), grid=(1,), split=(0,),
                                elements=st.integers(5, 9)), lambda xa: True)
    assert x.distribution.split == (0, None) and a.min() >= 5 and a.max() <= 9


# -- bad input raises at definition ----------------------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: dts.grids(0, 2), "nranks"),
    (lambda: dts.grids(4, 0), "max_ndim"),
    (lambda: dts.all_grid_dims(-1, 2), "nranks"),
    (lambda: dts.splits(2, 3, cover=True), "cannot cover"),
    (lambda: dts.splits(-1, 2), "ndim"),
    (lambda: dts.explicit_sizes(-1, 2), "n must be"),
    (lambda: dts.explicit_sizes(3, 0), "p must be"),
    (lambda: dts.explicit_sizes(2, 3, empty=False), "non-empty"),
    (lambda: dts.shapes(3, 2), "max_ndim"),
    (lambda: dts.shapes(min_side=-1), "min_side"),
    (lambda: dts.layouts((2, -1), 2), "extent"),
    (lambda: dts.layouts((2,), 0), "nranks"),
    (lambda: dts.distributions((2, -3), (2,)), "extent"),
    (lambda: dts.distributions((2,), (2, 0)), "grid dims"),
    (lambda: dts.distributions((2,), 4), "dims tuple"),
    (lambda: dts.split_sizes((2, 3), (2, 2), (0, 0)), "more than one"),
    (lambda: dts.split_sizes((1,), (2,), (0,), empty=False), "empty blocks"),
    (lambda: dts.dist_arrays("f8", (2, 3), grid=(2, 5)), "COMM_WORLD"),
    (lambda: dts.dist_arrays("f8", (2, 3), grid=(1,), split=(1,)), "grid axis 1"),
    (lambda: dts.dist_arrays("f8", (2,), split=(0, None, None)), "more entries"),
    (lambda: dts.dist_arrays("f8", (-2,)), "extent"),
])
def test_impossible_layouts_raise_at_definition(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# -- profile ---------------------------------------------------------------------------------
def test_profile_is_registered_with_the_mpi_settings():
    s = settings.get_profile(profile.PROFILE)
    assert s.derandomize and s.database is None and s.deadline is None
    assert set(s.suppress_health_check) == set(HealthCheck) and not s.print_blob
    assert s.max_examples == int(os.environ.get("DISTTENSOR_HYPOTHESIS_EXAMPLES", "25"))


def test_draw_digest_is_a_function_of_the_value():
    a = np.arange(6.0).reshape(2, 3)
    assert profile.draw_digest((a, [1, "x"], {"k": None})) == \
        profile.draw_digest((a.copy(), [1, "x"], {"k": None}))
    assert profile.draw_digest(a) != profile.draw_digest(a.astype(np.float32))
    assert profile.draw_digest(a) != profile.draw_digest(a.reshape(3, 2))
    b = a.copy()
    b[1, 2] = -1
    assert profile.draw_digest(a) != profile.draw_digest(b)
    assert profile.draw_digest(object()) == profile.draw_digest(object())  # addresses ignored
    assert profile.check_same_draw(a) is True  # one rank: nothing to compare


_DRAWS = """
import sys
from hypothesis import given, settings, strategies as st
from disttensor.testing import strategies as dts
from disttensor.testing.profile import draw_digest, load_mpi_profile
load_mpi_profile()
if sys.argv[1] == "more-modules":  # a rank that imported more of disttensor than another
    import disttensor.fft, disttensor.linalg, disttensor.nn  # noqa: F401
out = []

@settings(max_examples=60)
@given(dts.layouts(dts.shapes(), 6), dts.distributions(dts.shapes(0, 3), (2, 3)),
       st.integers(), st.floats())
def draws(layout, dist, i, f):
    out.append((layout, dist, i, f))

draws()
print(len(out), draw_digest(out))
"""


def test_two_fresh_processes_draw_the_same_sequence():
    def run(arg):
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(_DRAWS), arg], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    first, second = run("plain"), run("more-modules")
    assert first[0] == "60" and first == second
