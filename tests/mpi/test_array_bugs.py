"""The array bugs of issue 25, each against NumPy: ``arange``'s dtype from mixed arguments, an
allocation that fails on one rank only, Python scalar conversions and ``format`` of 0-d
arrays, and ``DISTTENSOR_GATHER_LIMIT`` on ``to_numpy``/``gather``.  1-D and 2-D grids,
uneven and empty blocks, 1-4 ranks.  (Printing: tests/mpi/test_printing.py.)"""
from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import COMM, SIZE, collective_checks, examples, expect, grid
from checks import check_blocks as check
from conftest import assert_all_ranks, assert_raises_all
from disttensor.testing.strategies import layouts

RANK = COMM.Get_rank()


def layout_kw(layout) -> dict:
    dims, split, sizes = layout
    return dict(grid=grid(dims), split=split, sizes=sizes)


# -- arange: NumPy's dtype from every argument ---------------------------------------------------
_NUMBERS = st.sampled_from([0, 1, 3, -2, 5.0, 0.1, -1.5, 2.5, True, np.float32(1.5),
                            np.int8(2), np.float16(3)])


@settings(max_examples=examples(20))
@given(args=st.one_of(st.tuples(_NUMBERS), st.tuples(_NUMBERS, _NUMBERS),
                      st.tuples(_NUMBERS, _NUMBERS, _NUMBERS.filter(lambda s: s != 0))),
       data=st.data())
@collective_checks
def test_arange_takes_numpys_dtype_and_values_from_mixed_arguments(args, data):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        want = np.arange(*args)
    layout = data.draw(layouts(want.shape, SIZE, 2))
    check(dt.arange(*args, **layout_kw(layout)), want, f"arange{args}", layout=layout)


@pytest.mark.parametrize("args", [(5.0,), (0, 5.0), (0, 5, 1.0), (0, 1, 0.1), (1, 0, -0.1),
                                  (0.5, 7), (np.float32(0), 3), (-3, 4, 0.7), (0j, 3),
                                  (np.complex64(0), 4 + 4j, 1 + 1j)])
@pytest.mark.parametrize("dims", [(SIZE,), (1, SIZE)])
def test_arange_float_ranges_equal_numpys(args, dims):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        want = np.arange(*args)
        x = dt.arange(*args, grid=grid(dims), split=None if len(dims) == 1 else (1,),
                      sizes=None)
    got = x.to_numpy()
    assert_all_ranks(COMM, got.dtype == want.dtype and got.shape == want.shape
                     and np.array_equal(got, want),
                     f"arange{args}: {got.dtype} {got!r} != {want.dtype} {want!r}")


# -- an allocation that fails on one rank raises MemoryError on every rank ----------------------
BIG = 10**15  # 8 PB of float64: beyond any address space, so it fails under any overcommit


def _huge_on_last(n_small: int = 3):
    """Ownership sizes along one axis that give the last coordinate BIG elements."""
    sizes = [n_small] * (SIZE - 1) + [BIG]
    return sum(sizes), sizes


def _creations(dims):
    """Creation calls whose block on the last rank is BIG elements (the others: 3)."""
    n, sizes = _huge_on_last()
    g = grid(dims)
    if len(dims) == 1:
        kw = dict(grid=g, split=(0,), sizes=[sizes])
        kw2 = dict(grid=g, split=(0, None), sizes=[sizes, None])
    else:  # (1, SIZE): tensor axis 0 over grid axis 1
        kw = dict(grid=g, split=(1,), sizes=[sizes])
        kw2 = dict(grid=g, split=(1, None), sizes=[sizes, None])
    return {
        "zeros": lambda: dt.zeros(n, **kw),
        "empty": lambda: dt.empty(n, **kw),
        "ones": lambda: dt.ones(n, dtype=np.int64, **kw),
        "full": lambda: dt.full((n, 1), 2.5, **kw2),
        "arange": lambda: dt.arange(n, **kw),
        "arange_float": lambda: dt.arange(0.0, n, **kw),
        "linspace": lambda: dt.linspace(0, 1, n, **kw),
        "eye": lambda: dt.eye(n, 2, **kw2),
        "with_halo": lambda: dt.zeros((n, 2), halo=1, **kw2),
    }


@pytest.mark.parametrize("call,dims", [(c, (SIZE,)) for c in (
    "zeros", "empty", "ones", "full", "arange", "arange_float", "linspace", "eye", "with_halo")]
    + [(c, (1, SIZE)) for c in ("zeros", "full", "eye", "with_halo")])
def test_allocation_failing_on_one_rank_raises_memoryerror_on_every_rank(call, dims):
    name = call.split("_")[0] if call != "with_halo" else "zeros"
    assert_raises_all(COMM, MemoryError,
                      rf"^{name}: rank {SIZE - 1} cannot allocate its block of shape "
                      rf"\({str(BIG)[:12]}\d*,( \d+)?\) and dtype \w+ \(\d+\.\d PiB, "
                      rf"\d+ bytes\)",
                      _creations(dims)[call])
    # the ranks are still in step: the next collective call works
    total = dt.ones(7, grid=grid(dims)).sum()
    assert_all_ranks(COMM, float(total) == 7.0, f"the next call gave {total!r}")


def test_from_global_and_like_allocate_through_the_guard():
    a = np.arange(12.0).reshape(4, 3)
    for root in (None, 0):
        x = dt.from_global(a if root is None or RANK == root else None, root=root,
                           sizes=[[4] + [0] * (SIZE - 1), None] if SIZE > 1 else None)
        check(x, a, f"from_global root={root}")
        check(dt.full_like(x, 7, dtype=np.int32), np.full_like(a, 7, dtype=np.int32),
              "full_like")
    halo = dt.from_global(a, halo=1)
    expect(halo.halo == ((1, 1), (1, 1)), f"halo {halo.halo}")
    check(halo, a, "from_global with halo")
    from checks import settle
    settle()


# -- Python scalar conversions, bool and format: NumPy's results and messages --------------------
def _outcome(fn, value):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ("ok", fn(value))
        except Exception as e:  # noqa: BLE001 - compared with NumPy's
            return (type(e).__name__, str(e))


_CONVERSIONS = {
    "bool": bool, "int": int, "float": float, "complex": complex, "index": operator.index,
    "item": lambda v: v.item(),
    "format .2f": lambda v: format(v, ".2f"), "format e": lambda v: format(v, "e"),
    "f-string >10.3g": lambda v: f"{v:>10.3g}", "format x": lambda v: format(v, "x"),
}


@pytest.mark.parametrize("shape,dtype", [((), "float64"), ((), "int64"), ((), "complex128"),
                                         ((), "bool"), ((), "float32"), ((1,), "float64"),
                                         ((1, 1), "int64"), ((3,), "float64"), ((0,), "int64"),
                                         ((2, 3), "bool"), ((1,), "complex128")])
def test_scalar_conversions_and_format_follow_numpy(shape, dtype):
    a = (np.arange(int(np.prod(shape))) * 1.75 + 2).reshape(shape).astype(dtype)
    x = dt.from_global(a)
    bad = []
    for what, fn in _CONVERSIONS.items():
        got, want = _outcome(fn, x), _outcome(fn, a)
        if want[0] == "TypeError" and "numpy.ndarray.__format__" in want[1]:
            want = ("TypeError", want[1].replace("numpy.ndarray", "DistArray"))
        if got != want:
            bad.append(f"{what}: {got} != NumPy's {want}")
    assert_all_ranks(COMM, not bad, f"shape {shape} {dtype}: " + "; ".join(bad))


def test_format_of_a_reduction_result():
    a = np.arange(11) * 0.25  # sums exactly in any order
    x = dt.from_global(a)
    s, want = x.sum(), a.sum()
    got = (f"{s:.2f}", format(s, "e"), f"{s}", str(s), format(x.mean(), "+.3e"))
    ref = (f"{want:.2f}", format(want, "e"), f"{np.asarray(want)}", str(np.asarray(want)),
           format(a.mean(), "+.3e"))
    assert_all_ranks(COMM, got == ref, f"{got} != {ref}")


# -- DISTTENSOR_GATHER_LIMIT on to_numpy and gather ----------------------------------------------
@pytest.mark.parametrize("dims", [(SIZE,), (1, SIZE)])
def test_gather_limit_holds_for_to_numpy_and_gather(monkeypatch, dims):
    a = np.arange(60.0).reshape(6, 10)
    x = dt.from_global(a, grid=grid(dims))
    monkeypatch.setenv("DISTTENSOR_GATHER_LIMIT", str(a.nbytes - 1))
    for fn in (x.to_numpy, lambda: np.asarray(x), x.gather):
        assert_raises_all(COMM, ValueError, rf": gathering the array puts {a.nbytes} bytes on "
                          rf".*DISTTENSOR_GATHER_LIMIT={a.nbytes - 1} bytes", fn)
    monkeypatch.setenv("DISTTENSOR_GATHER_LIMIT", str(a.nbytes))
    got, root = x.to_numpy(), x.gather(root=SIZE - 1)
    ok = np.array_equal(got, a) and (np.array_equal(root, a) if RANK == SIZE - 1 else
                                     root is None)
    assert_all_ranks(COMM, ok, "under the limit the gathers must work")


# -- library warnings: once per job, at the user's line --------------------------------------
def test_a_library_warning_shows_once_per_job_at_the_users_line():
    x = dt.from_global(np.ones((3, 1)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = __import__("inspect").currentframe().f_lineno + 1
        dt.cov(x)  # ddof >= the number of observations: NumPy's RuntimeWarning
    seen = [(w.filename, w.lineno, str(w.message)) for w in caught
            if issubclass(w.category, RuntimeWarning)]
    want = [(__file__, line, "Degrees of freedom <= 0 for slice")] if RANK == 0 else []
    assert_all_ranks(COMM, seen == want, f"warnings {seen}, expected {want}")
