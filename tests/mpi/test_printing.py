"""Printing a DistArray (disttensor.core.printing): ``str``/``print`` show NumPy's text once per
job (rank 0) with NumPy's summarisation, gathering only the shown elements; ``repr`` never
communicates.  Against NumPy on random shapes, 1-D and 2-D grids, uneven and empty blocks,
1-4 ranks, under several print options."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import COMM, SIZE, different_calls, examples, grid
from conftest import assert_all_ranks, assert_raises_all
from disttensor.core.printing import array_repr, array_str
from disttensor.testing.strategies import layouts, shapes

RANK = COMM.Get_rank()

OPTIONS = [{}, {"threshold": 10, "edgeitems": 2}, {"precision": 3, "linewidth": 40},
           {"threshold": 5, "edgeitems": 1, "suppress": True}]


def _values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4)
    return np.asarray(a.astype(dtype) if np.dtype(dtype).kind != "b" else a > 0)


@settings(max_examples=examples(25))
@given(shape=shapes(0, 3, 9), dtype=st.sampled_from(["float64", "int32", "bool", "complex64"]),
       opts=st.sampled_from(OPTIONS), seed=st.integers(0, 2**16), data=st.data())
def test_str_is_numpys_text_on_rank_0_and_empty_elsewhere(shape, dtype, opts, seed, data):
    a = _values(shape, dtype, seed)
    dims, split, sizes = data.draw(layouts(a.shape, SIZE, 2))
    x = dt.from_global(a, grid=grid(dims), split=split, sizes=sizes)
    with np.printoptions(**opts):
        got, want = str(x), str(a)
        everywhere = array_str(x)
        rep = array_repr(x, root=SIZE - 1)
        want_rep = "DistArray(" + np.array_repr(a)[len("array("):-1].replace(
            "\n      ", "\n          ") + f", split={x.split}, grid={x.grid.dims})"
    ok = (got == want if RANK == 0 or a.ndim == 0 else got == "") and everywhere == want \
        and (rep == want_rep if RANK == SIZE - 1 else rep is None)
    assert_all_ranks(COMM, ok, f"{opts} {dims} {split} {sizes}:\n{got!r}\n!= NumPy's\n{want!r}"
                     f"\n(array_str {everywhere!r}, array_repr {rep!r} vs {want_rep!r})")


@pytest.mark.parametrize("dims,split", [((SIZE,), (0, None, None)), ((1, SIZE), (None, 1, 0)),
                                        ((SIZE, 1), (None, 0, None))])
def test_a_large_array_prints_summarised_and_gathers_only_the_shown_items(monkeypatch, dims,
                                                                         split):
    a = np.arange(60 * 70 * 8, dtype=np.float64).reshape(60, 70, 8) / 7
    x = dt.from_global(a, grid=grid(dims), split=split)
    # far below the array's 269 kB: only the (2*3+1)^3 shown items may travel
    monkeypatch.setenv("DISTTENSOR_GATHER_LIMIT", str(7**3 * 8))
    got = str(x)
    assert_all_ranks(COMM, got == (str(a) if RANK == 0 else ""), f"{got!r}\n!=\n{str(a)!r}")
    assert_raises_all(COMM, ValueError, "DISTTENSOR_GATHER_LIMIT", x.to_numpy)
    with np.printoptions(threshold=a.size):  # everything shown: everything gathered
        assert_raises_all(COMM, ValueError, r"str: printing gathers 268800 bytes on rank 0",
                          lambda: str(x))


def test_print_shows_the_values_once(capsys):
    a = np.arange(12).reshape(3, 4)
    print(dt.from_global(a, grid=grid((SIZE,)), split=(0, None),
                         sizes=[[3] + [0] * (SIZE - 1), None]))
    out = capsys.readouterr().out
    assert_all_ranks(COMM, out == (str(a) + "\n" if RANK == 0 else "\n"), repr(out))


@pytest.mark.parametrize("dims", [(SIZE,), (1, SIZE)])
def test_repr_never_communicates(dims):
    a = np.arange(10.0) / 4
    x = dt.from_global(a, grid=grid(dims), split=(len(dims) - 1,))
    s = x.sum()
    # one rank alone (as pytest's assertion report, a debugger or an error message would)
    text = repr(x) if RANK == SIZE - 1 else None
    scalar = (repr(s), str(s), f"{s:.3f}", float(s)) if RANK == 0 else None
    total = x.sum()  # the ranks are still in step
    lo, hi = x.local_slices[0].start, x.local_slices[0].stop
    block = np.array2string(a[lo:hi], separator=" ")
    if SIZE == 1:
        want = "DistArray(" + np.array_repr(a)[6:-1] + f", split={x.split}, grid={dims})"
    else:
        want = (f"DistArray(shape=(10,), dtype=float64, split=({len(dims) - 1},), grid={dims}, "
                f"device='cpu'; rank {SIZE - 1} holds [{lo}:{hi}]: {block})")
    ok = float(total) == a.sum() and (text == want if RANK == SIZE - 1 else True) and \
        (scalar == ("DistArray(11.25, split=(), grid=%s)" % (dims,), "11.25", "11.250", 11.25)
         if RANK == 0 else True)
    assert_all_ranks(COMM, ok, f"repr {text!r} (want {want!r}), 0-d {scalar}")


@pytest.mark.skipif(SIZE == 1, reason="one rank cannot diverge")
def test_str_on_one_rank_only_is_an_error_on_every_rank_not_a_hang():
    x = dt.from_global(np.arange(6.0))
    with different_calls("array_str", "to_numpy"):
        if RANK == 0:
            str(x)
        else:
            x.to_numpy()
    assert_all_ranks(COMM, float(x.sum()) == 15.0)


@pytest.mark.parametrize("dims,split", [((SIZE,), (0, None)), ((1, SIZE), (None, 1))])
def test_numpys_printing_functions_give_the_text_on_every_rank(dims, split):
    a = np.arange(40 * 50, dtype=np.float64).reshape(40, 50) / 3
    x = dt.from_global(a, grid=grid(dims), split=split)
    cases = {
        "array2string": (lambda v: np.array2string(v, precision=2, separator=", ")),
        "array2string all": (lambda v: np.array2string(v, threshold=a.size)),
        "array2string edge 1": (lambda v: np.array2string(v, threshold=5, edgeitems=1)),
        "array_str": (lambda v: np.array_str(v, precision=3)),
        "array_repr": (lambda v: np.array_repr(v, max_line_width=60)),
    }
    bad = []
    for what, fn in cases.items():
        got, want = fn(x), fn(a)
        if what == "array_repr":
            want = "DistArray(" + want[len("array("):-1].replace("\n      ", "\n" + " " * 10) \
                + f", split={x.split}, grid={dims})"
        if got != want:
            bad.append(f"{what}:\n{got}\n!=\n{want}")
    assert_all_ranks(COMM, not bad, "\n".join(bad))
