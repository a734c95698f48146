"""Distributed FFTs (disttensor.fft) against numpy.fft in float64.

Random shapes (1-D..4-D), every split of 1-D and 2-D grids with balanced, uneven and empty
blocks, axes subsets (also repeated and negative), ``s`` padding/cropping, the three norm
modes, float64/float32/complex/int inputs.  Tolerance: a pocketfft transform of length ``N``
(product over the axes) has ``||fft(x) - F x||_2 <= c log2(N) eps ||F x||_2``, so each element
is checked to ``atol = 10 log2(2N) eps ||want||_2`` with ``eps`` that of the result dtype
(float32 results against a float64 reference).  The redistributions in between are exact
copies (their adjoint is tested in test_redistribute.py; fft.py adds no other communication),
so shifts and frequencies are compared exactly.  Output layouts are checked against the
documented rule (:func:`disttensor.fft.plan_transposes`), round trips restore the input and,
for slabs and pencils, its layout.  Bad arguments raise on every rank.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import (SIZE, COMM, check_blocks as check, collective_checks, dist, examples, expect,
                    grid, last_rank_only, mismatch)
from conftest import assert_raises_all
from disttensor.fft import plan_transposes
from disttensor.testing.strategies import layouts

NORMS = [None, "backward", "ortho", "forward"]
# NumPy's references with s but no axes warn (deprecated spelling, still NumPy 2 semantics)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def tol(want, n_total, dtype):
    eps = np.finfo(np.dtype(dtype)).eps
    return 10 * math.log2(2 * max(n_total, 1)) * eps * max(np.linalg.norm(want), 1e-300)


def tol_io(want, arr, n_total, dtype):
    """Bound when the input is not the transform of the output (irfft of a non-Hermitian
    input, hfft): the unnormalized transform's error ``c log2(N) eps sqrt(N) ||in||``, which
    every norm mode only scales down."""
    return tol(want, n_total, dtype) + math.sqrt(max(n_total, 1)) * tol(arr, n_total, dtype)


def ref(fn, a, **kw):
    """NumPy's transform in float64/complex128, and NumPy's result dtype for ``a``."""
    hi = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
    return getattr(np.fft, fn)(hi, **kw), getattr(np.fft, fn)(a, **kw).dtype


@st.composite
def cases(draw, real_input=False, max_ndim=4):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=max_ndim)))
    nd = len(shape)
    layout = draw(layouts(shape, SIZE, 2))
    if draw(st.booleans()):
        axes = None
        k = nd
    else:
        k = draw(st.integers(1, nd))
        axes = draw(st.lists(st.integers(-nd, nd - 1), min_size=k, max_size=k,
                             unique_by=lambda a: a % nd))
    s = None
    if draw(st.booleans()):
        s = draw(st.lists(st.one_of(st.integers(1, 8), st.just(-1)), min_size=k, max_size=k))
        if axes is None and draw(st.booleans()):  # s alone: the last len(s) axes
            s = s[:draw(st.integers(1, k))]
    norm = draw(st.sampled_from(NORMS))
    dtype = draw(st.sampled_from(["float64", "float32", "int32"] if real_input else
                                 ["complex128", "float64", "float32", "complex64", "int64"]))
    return shape, layout, axes, s, norm, dtype


def _axes_ns(shape, s, axes, real_inverse=False):
    nd = len(shape)
    if axes is None:
        axes = list(range(nd)) if s is None else list(range(nd - len(s), nd))
    axes = [a % nd for a in axes]
    ns = [shape[a] for a in axes] if s is None else \
        [shape[a] if v == -1 else v for a, v in zip(axes, s)]
    if real_inverse and s is None:
        ns[-1] = 2 * (shape[axes[-1]] - 1)
    return axes, ns


def expected_split(x, kind, axes, ns):
    entries = list(zip(axes, ns))
    if kind in ("fft", "ifft"):
        phases = [(kind, entries)]
    elif kind == "rfft":
        phases = [("rfft", entries[-1:]), ("fft", entries[:-1])]
    else:
        phases = [("ifft", entries[:-1]), ("irfft", entries[-1:])]
    return plan_transposes(x.shape, x.grid.dims, x.split, phases)


def check_layout(y, x, kind, axes, ns, what):
    steps, split = expected_split(x, kind, axes, ns)
    expect(y.split == split, f"{what}: split {y.split}, the plan ends in {split}")
    expect(y.grid is x.grid, f"{what}: grid changed")


@settings(max_examples=examples(40))
@given(cases(), st.sampled_from(["fftn", "ifftn"]), st.integers(0, 2**31))
@collective_checks
def test_fftn_ifftn_match_numpy(case, fn, seed):
    shape, layout, axes, s, norm, dtype = case
    a = values(shape, dtype, seed)
    x = dist(a, layout)
    want, wdtype = ref(fn, a, s=s, axes=axes, norm=norm)
    got = getattr(dt.fft, fn)(x, s=s, axes=axes, norm=norm)
    ax, ns = _axes_ns(shape, s, axes)
    what = f"{fn} {shape} {layout} axes={axes} s={s} norm={norm} {dtype}"
    check(got, want.astype(wdtype), what, atol=tol(want, math.prod(ns), wdtype))
    check_layout(got, x, fn[:-1], ax, ns, what)
    # the input's layout on request
    back = getattr(dt.fft, fn)(x, s=s, axes=axes, norm=norm, out_split="input")
    expect(back.split == x.split, f"{what}: out_split='input' gave {back.split}")
    check(back, want.astype(wdtype), what + " out_split=input",
          atol=tol(want, math.prod(ns), wdtype))


@settings(max_examples=examples(30))
@given(cases(real_input=True), st.integers(0, 2**31))
@collective_checks
def test_rfftn_matches_numpy(case, seed):
    shape, layout, axes, s, norm, dtype = case
    a = values(shape, dtype, seed)
    x = dist(a, layout)
    want, wdtype = ref("rfftn", a, s=s, axes=axes, norm=norm)
    got = dt.fft.rfftn(x, s=s, axes=axes, norm=norm)
    ax, ns = _axes_ns(shape, s, axes)
    what = f"rfftn {shape} {layout} axes={axes} s={s} norm={norm} {dtype}"
    check(got, want.astype(wdtype), what, atol=tol(want, math.prod(ns), wdtype))
    check_layout(got, x, "rfft", ax, ns, what)


@settings(max_examples=examples(30))
@given(cases(), st.integers(0, 2**31))
@collective_checks
def test_irfftn_matches_numpy(case, seed):
    shape, layout, axes, s, norm, dtype = case
    ax, ns = _axes_ns(shape, s, axes, real_inverse=True)
    if ns[-1] < 1:  # default length 2 * (1 - 1) = 0: the error test covers it
        return
    a = values(shape, "complex128" if dtype in ("float64", "int64") else "complex64", seed)
    x = dist(a, layout)
    want, wdtype = ref("irfftn", a, s=s, axes=axes, norm=norm)
    got = dt.fft.irfftn(x, s=s, axes=axes, norm=norm)
    what = f"irfftn {shape} {layout} axes={axes} s={s} norm={norm}"
    # the input is not Hermitian: the bound is relative to the input's norm
    check(got, want.astype(wdtype), what, atol=tol_io(want, a, math.prod(ns), wdtype))
    check_layout(got, x, "irfft", ax, ns, what)


@settings(max_examples=examples(25))
@given(st.integers(2, 4), st.integers(0, 2**31), st.data())
@collective_checks
def test_round_trips_restore_values_and_layout(nd, seed, data):
    """Slab (1-D grid, axis 0 split) and pencil (2-D grid, axes 0 and 1 split), balanced: the
    inverse with the default layout comes back to the input's split; also rfftn/irfftn with
    odd and even last lengths."""
    pencil = nd >= 3 and SIZE % 2 == 0 and data.draw(st.booleans())
    dims = data.draw(st.sampled_from([(SIZE // 2, 2), (2, SIZE // 2)])) if pencil else (SIZE,)
    # axes at least as long as the grid axes (else the planner prefers other free axes)
    shape = tuple(data.draw(st.lists(st.integers(max(dims), 8), min_size=nd, max_size=nd)))
    split = (0, 1) + (None,) * (nd - 2) if len(dims) == 2 else (0,) + (None,) * (nd - 1)
    a = values(shape, "float64", seed)
    x = dist(a, (dims, split, None))
    y = dt.fft.fftn(x)
    n_moves = sum(1 for st_ in expected_split(x, "fft", list(range(nd)), list(shape))[0]
                  if st_[0] == "move")
    want_moves = sum(1 for t, g in enumerate(split) if g is not None and dims[g] > 1)
    expect(n_moves == want_moves, f"{shape} {dims} {split}: {n_moves} transposes, "
                                  f"want {want_moves}")
    z = dt.fft.ifftn(y)
    what = f"round trip {shape} grid {dims} split {split}"
    check(z, a.astype(np.complex128), what, atol=tol(a, a.size, np.float64))
    expect(z.split == x.split, f"{what}: ifftn(fftn(x)) split {z.split} != {x.split}")
    r = dt.fft.irfftn(dt.fft.rfftn(x), s=shape)
    check(r, a, what + " (real)", atol=tol(a, a.size, np.float64))
    expect(r.split == x.split, f"{what}: irfftn(rfftn(x)) split {r.split} != {x.split}")


@collective_checks
def test_one_and_two_dimensional_forms_and_numpy_dispatch():
    rng = np.random.default_rng(5)
    for dims, split in [((SIZE,), (0, None)), ((SIZE,), (None, 0)), ((1, SIZE), (0, 1))]:
        for shape in [(7, 6), (5, 9), (SIZE, 1)]:
            a = rng.standard_normal(shape)
            c = a + 1j * rng.standard_normal(shape)
            x, xc = dist(a, (dims, split, None)), dist(c, (dims, split, None))
            what = f"{shape} {dims} {split}"
            for name, arr, ax in [("fft", c, 0), ("ifft", c, -1), ("rfft", a, 0),
                                  ("irfft", c, 1), ("hfft", c, 0), ("ihfft", a, -1)]:
                for n in (None, 4, 5):
                    for norm in NORMS:
                        if name in ("irfft", "hfft") and n is None and arr.shape[ax] == 1:
                            continue
                        want = getattr(np.fft, name)(arr, n=n, axis=ax, norm=norm)
                        src = xc if arr is c else x
                        got = getattr(np.fft, name)(src, n, ax, norm)  # dispatch, positional
                        check(got, want, f"np.fft.{name} {what} n={n} {norm}",
                              atol=tol_io(want, arr, 16, np.float64))
            for name, arr in [("fft2", c), ("ifft2", c), ("rfft2", a), ("irfft2", c)]:
                for s in (None, (3, 4)):
                    if name == "irfft2" and s is None and shape[1] == 1:
                        continue
                    want = getattr(np.fft, name)(arr, s=s, norm="ortho")
                    src = xc if arr is c else x
                    got = getattr(dt.fft, name)(src, s=s, norm="ortho")
                    check(got, want, f"{name} {what} s={s}",
                          atol=tol_io(want, arr, 64, np.float64))
            for name in ("fftn", "ifftn"):
                got = getattr(np.fft, name)(xc, None, (1, 0))
                want = getattr(np.fft, name)(c, None, (1, 0))
                check(got, want, f"np.fft.{name} {what}", atol=tol(want, c.size, np.float64))
            for axes, s in [((1, 1), None), ((0, 0), (3, 5)), ((0, 1, 0), None)]:
                got = dt.fft.fftn(xc, s=s, axes=axes)  # repeated axes transform twice
                want = np.fft.fftn(c, s=s, axes=axes)
                check(got, want, f"repeated axes {axes} s={s} {what}",
                      atol=tol(want, 64, np.float64) * 8)
            got = np.fft.irfftn(np.fft.rfftn(x), shape)
            check(got, a, f"np.fft.irfftn(np.fft.rfftn) {what}", atol=tol(a, a.size, np.float64))


@settings(max_examples=examples(25))
@given(st.integers(1, 12), st.floats(0.1, 10.0), st.data())
@collective_checks
def test_fftfreq_rfftfreq_exact(n, d, data):
    for fn, m in (("fftfreq", n), ("rfftfreq", n // 2 + 1)):
        layout = data.draw(layouts((m,), SIZE, 2))
        dims, split, sizes = layout
        got = getattr(dt.fft, fn)(n, d, grid=grid(dims), split=split, sizes=sizes)
        check(got, getattr(np.fft, fn)(n, d), f"{fn}({n}, {d}) {layout}", layout=layout)


@settings(max_examples=examples(30))
@given(st.lists(st.integers(0, 7), min_size=1, max_size=3).map(tuple), st.data())
@collective_checks
def test_fftshift_ifftshift_exact(shape, data):
    layout = data.draw(layouts(shape, SIZE, 2))
    nd = len(shape)
    axes = data.draw(st.one_of(st.none(), st.integers(-nd, nd - 1),
                               st.lists(st.integers(0, nd - 1), max_size=nd).map(tuple)))
    a = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    x = dist(a, layout)
    for fn in ("fftshift", "ifftshift"):
        got = getattr(np.fft, fn)(x, axes)
        check(got, getattr(np.fft, fn)(a, axes), f"{fn} {shape} {layout} axes={axes}",
              layout=layout)


@collective_checks
def test_empty_blocks_and_zero_length_other_axes():
    """Every block but the last empty along the split axis; a zero-length axis that is not
    transformed (NumPy returns an empty complex array)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 6, 4))
    sizes = ([0] * (SIZE - 1) + [5], None, None)
    x = dist(a, ((SIZE,), (0, None, None), sizes))
    for fn in ("fftn", "rfftn"):
        want = getattr(np.fft, fn)(a)
        check(getattr(dt.fft, fn)(x), want, f"{fn} with empty blocks",
              atol=tol(want, a.size, np.float64))
        check(getattr(dt.fft, fn)(x, out_split="input"), want, f"{fn} out_split=input",
              atol=tol(want, a.size, np.float64), layout=((SIZE,), (0, None, None), sizes))
    want = np.fft.fftn(a)
    y = dt.fft.fftn(x, out_split=(None, None, 0))
    check(y, want, "out_split=(None, None, 0)", atol=tol(want, a.size, np.float64),
          layout=((SIZE,), (None, None, 0), None))
    # no free axis (every axis split): the last one is gathered, its grid axis replicated
    dims = (2, SIZE // 2) if SIZE % 2 == 0 else (1, SIZE)
    b = rng.standard_normal((6, 5)) + 1j * rng.standard_normal((6, 5))
    xb = dist(b, (dims, (0, 1), None))
    steps, split = plan_transposes(b.shape, dims, (0, 1), [("fft", [(0, 6), (1, 5)])])
    expect(min(dims) == 1 or ("move", 1, None) in steps, f"no gather in {steps}")
    for fn in ("fftn", "ifftn"):
        want = getattr(np.fft, fn)(b)
        check(getattr(dt.fft, fn)(xb), want, f"{fn} on {dims} split (0, 1)",
              atol=tol(want, b.size, np.float64), layout=(dims, split, None))
    z = np.zeros((0, 6))
    xz = dist(z, ((SIZE,), (None, 0), None))
    check(dt.fft.fftn(xz, axes=(1,)), np.fft.fftn(z, axes=(1,)), "zero-length other axis")


@collective_checks
def test_gaussian_random_field_matches_serial_and_has_the_spectrum():
    shape = (16, 12, 10)
    power = lambda k: k ** -2.0  # noqa: E731
    me = grid_self()
    w = dt.random.default_rng(7).normal(0.0, 1.0, shape, grid=me).local
    k = np.sqrt(np.fft.fftfreq(shape[0])[:, None, None] ** 2
                + np.fft.fftfreq(shape[1])[None, :, None] ** 2
                + np.fft.rfftfreq(shape[2])[None, None, :] ** 2)
    amp = np.zeros_like(k)
    amp[k > 0] = np.sqrt(power(k[k > 0]))
    serial = np.fft.irfftn(np.fft.rfftn(w) * amp, s=shape)
    pencil = (2, SIZE // 2) if SIZE % 2 == 0 else (SIZE,)
    for dims in sorted({(SIZE,), pencil}):
        split = (0, 1, None) if len(dims) == 2 else (0, None, None)
        f = dt.fft.gaussian_random_field(shape, power, grid=grid(dims), seed=7, split=split)
        check(f, serial, f"field on {dims}", atol=1e-12 * np.abs(serial).max(),
              layout=(dims, split, None))
        # E |rfftn(f)_k|^2 = N P(|k|): the mean ratio over ~1000 modes is 1 within a few %
        F = dt.fft.rfftn(f)
        kk = k[F.local_slices]
        m = kk > 0
        ratio = np.abs(F.local[m]) ** 2 / (math.prod(shape) * power(kk[m]))
        tot = COMM.allreduce(np.array([ratio.sum(), ratio.size]))
        mean = tot[0] / tot[1]
        expect(abs(mean - 1) < 0.1, f"spectrum ratio {mean} on {dims}")


_SELF = []


def grid_self():
    """A one-rank grid over COMM_SELF (serial references)."""
    if not _SELF:
        from mpi4py import MPI
        _SELF.append(dt.ProcessGrid((1,), comm=MPI.COMM_SELF))
    return _SELF[0]


def test_plan_is_minimal_for_slabs_and_pencils():
    """Pure planner: one transpose per split axis of more than one rank."""
    P = plan_transposes
    steps, split = P((8, 8, 8), (4,), (0, None, None), [("fft", [(0, 8), (1, 8), (2, 8)])])
    assert [s for s in steps if s[0] == "move"] == [("move", 0, 1)] and split == (None, 0, None)
    steps, split = P((8, 8, 8), (2, 2), (0, 1, None), [("fft", [(0, 8), (1, 8), (2, 8)])])
    assert [s for s in steps if s[0] == "move"] == [("move", 1, 2), ("move", 0, 1)]
    assert split == (None, 0, 1)
    steps, split = P((8, 8, 8), (2, 2), split, [("ifft", [(0, 8), (1, 8), (2, 8)])])
    assert split == (0, 1, None)
    # the free axis too short for the grid axis is avoided when another one is long enough
    steps, split = P((8, 2, 8), (4,), (0, None, None), [("fft", [(0, 8)])])
    assert split == (None, None, 0)
    # no free axis: gather
    steps, split = P((8,), (4,), (0,), [("fft", [(0, 8)])])
    assert steps[0] == ("move", 0, None) and split == (None,)
    # a grid axis of one rank needs no transpose
    steps, split = P((8, 8), (1, 4), (0, None), [("fft", [(0, 8), (1, 8)])])
    assert all(s[0] == "fft" for s in steps) and split == (0, None)


def test_bad_arguments_raise_on_every_rank():
    x = dt.from_global(np.ones((4, 6)), grid=grid((SIZE,)))
    xc = dt.fft.fftn(x)
    cases = [
        (ValueError, "out of bounds|out of range", lambda: dt.fft.fftn(x, axes=(0, 2))),
        (ValueError, "Shape and axes have different lengths",
         lambda: dt.fft.fftn(x, s=(4,), axes=(0, 1))),
        (ValueError, "Invalid norm value", lambda: dt.fft.ifftn(x, norm="unitary")),
        (ValueError, r"Invalid number of FFT data points \(0\)", lambda: dt.fft.fft(x, n=0)),
        (ValueError, r"Invalid number of FFT data points \(0\)",
         lambda: dt.fft.irfft(dt.from_global(np.ones((4, 1), complex), grid=grid((SIZE,))))),
        (ValueError, r"Invalid number of FFT data points \(0\)",
         lambda: dt.fft.fftn(dt.zeros((0, 3), grid=grid((SIZE,))))),
        (TypeError, "real input", lambda: dt.fft.rfftn(xc)),
        (ValueError, "out_split", lambda: dt.fft.fftn(x, out_split="output")),
        (ValueError, "grid axis", lambda: dt.fft.fftn(x, out_split=(3, None))),
        (TypeError, "out= is not supported", lambda: np.fft.fftn(x, out=np.empty((4, 6), complex))),
        (ValueError, "Invalid norm value", lambda: np.fft.hfft(xc, norm="bad")),
        (ValueError, "n must be positive", lambda: dt.fft.fftfreq(0)),
        (ValueError, "out of bounds|out of range", lambda: dt.fft.fftshift(x, axes=5)),
        (TypeError, "expected a DistArray", lambda: dt.fft.fftn(np.ones(3))),
    ]
    for exc, match, fn in cases:
        assert_raises_all(COMM, exc, match, fn)


@pytest.mark.skipif(SIZE == 1, reason="needs ranks that disagree")
def test_arguments_that_differ_between_ranks():
    x = dt.from_global(np.ones((4, 6)), grid=grid((SIZE,)))
    with mismatch("fftn", "norm"):
        dt.fft.fftn(x, norm=last_rank_only("ortho", None))
    with mismatch("rfftn", "axes"):
        dt.fft.rfftn(x, axes=last_rank_only((0,), (1,)))
