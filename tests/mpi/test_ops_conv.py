"""Distributed convolution and transposed convolution (``disttensor.ops``: ``conv_forward``,
``conv_backward``, ``conv_transpose_forward``, ``conv_transpose_backward``) against the
serial float64 reference of ``tests/reference.py``.

* Property tests: random 1-D/2-D/3-D convolutions (groups, even kernels, stride, dilation,
  int / ``'same'`` / ``'valid'`` / per-axis / asymmetric padding) on random layouts (sample
  axis and any subset of spatial axes split, channel axis never, balanced or explicit uneven
  and empty blocks, replicated grid axes): gathered forward output, gathered ``dx`` and the
  replicated ``dw``/``db`` equal the reference; the output ownership follows the documented
  centre rule; ``reduce=False`` leaves per-rank partial sums that add up to ``dw``/``db``.
  The same for transposed convolution (``output_padding < stride``).
* Adjoint (dot-product) identities of the distributed operators on uneven layouts.
* A finite-difference check of the distributed backward on a tiny split 2-D case.
* The CosmoFlow first layer in float32 at full size (1, 4, 64^3) against the float64
  reference.
* Errors that every rank raises (checks on replicated metadata only).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import disttensor as dt
from disttensor.ops import (conv_backward, conv_forward, conv_transpose_backward,
                            conv_transpose_forward)
from checks import COMM, SIZE, collective_checks, examples, expect, grid
from conftest import assert_all_ranks, assert_allclose_all, assert_raises_all
from disttensor.testing.strategies import grids, split_sizes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402
from disttensor.ops import convolution as _conv_module  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _overlap_every_block():
    """Overlap wherever a block has an interior: by default a CPU block overlaps only when
    its interior holds MIN_INTERIOR of its outputs, which the small arrays here rarely do."""
    old = _conv_module.MIN_INTERIOR
    _conv_module.MIN_INTERIOR = 0.0
    yield
    _conv_module.MIN_INTERIOR = old

RTOL = 1e-10
ATOL = 1e-10


# -- helpers -----------------------------------------------------------------------------------
def close(name: str, actual, desired, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Record (not raise) a mismatch; the test settles all records with one collective."""
    try:
        if actual is None or desired is None:
            if not (actual is None and desired is None):
                raise AssertionError(f"one is None: {actual is None}, {desired is None}")
            return
        actual, desired = np.asarray(actual), np.asarray(desired)
        if actual.shape != desired.shape:
            raise AssertionError(f"shape {actual.shape} != {desired.shape}")
        np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol)
    except AssertionError as e:
        expect(False, f"{name}: {str(e).strip()[:600]}")


def like(a: np.ndarray, d: dt.DistArray) -> dt.DistArray:
    """Scatter the global ``a`` with ``d``'s own distribution."""
    return dt.from_global(a, grid=d.grid, split=d.split, sizes=d.distribution.split_sizes)


def replicas(d: dt.DistArray) -> int:
    """Number of ranks holding each block (product of the grid axes nothing is split over)."""
    used = {g for g in d.split if g is not None}
    return int(np.prod([n for g, n in enumerate(d.grid.dims) if g not in used] or [1]))


def owner(offsets, i: int) -> int:
    """Block holding index ``i`` for block offsets ``(0, ..., n)`` (empty blocks skipped)."""
    for b in range(len(offsets) - 1):
        if offsets[b] <= i < offsets[b + 1]:
            return b
    raise AssertionError(f"{i} outside {offsets}")


def check_centre_rule(in_dist, out_dist, kernel, stride, dilation, pads, what: str) -> None:
    """The documented ownership: output ``o`` belongs to the block owning its centre input
    ``clamp(o*stride - lo + (dilation*(k-1))//2, 0, n-1)``; sample axis unchanged."""
    expect(out_dist.split == in_dist.split and out_dist.grid_dims == in_dist.grid_dims,
           f"{what}: output layout {out_dist} vs input {in_dist}")
    expect(out_dist.offsets[0] == in_dist.offsets[0], f"{what}: sample ownership changed")
    for i, (k, s, d, (lo, _)) in enumerate(zip(kernel, stride, dilation, pads)):
        t = 2 + i
        if in_dist.split[t] is None:
            continue
        n, xo, yo = in_dist.shape[t], in_dist.offsets[t], out_dist.offsets[t]
        for o in range(out_dist.shape[t]):
            c = min(max(o * s - lo + (d * (k - 1)) // 2, 0), n - 1)
            if owner(xo, c) != owner(yo, o):
                expect(False, f"{what}: axis {t} output {o} (centre {c}) owned by block "
                              f"{owner(yo, o)}, input offsets {xo}, output offsets {yo}")
                break


def as_arg(values: tuple, use_int: bool):
    """Per-axis tuple, or one int when all equal and ``use_int``."""
    return values[0] if use_int and len(set(values)) == 1 else values


@st.composite
def nc_layouts(draw, shape):
    """(grid dims, split, sizes) for an ``(N, C, *S)`` array on ``SIZE`` ranks: each grid axis
    goes to a spatial axis, the sample axis or nowhere (replication); the channel axis is never
    split; balanced or explicit (uneven, empty) sizes per split axis."""
    dims = draw(grids(SIZE, min(3, len(shape) - 1)))
    split = [None] * len(shape)
    for g in range(len(dims)):
        free = [t for t in range(2, len(shape)) if split[t] is None]  # spatial axes first
        free += [t for t in (0,) if split[t] is None] + [None]
        t = draw(st.sampled_from(free))
        if t is not None:
            split[t] = g
    sizes = draw(split_sizes(shape, dims, split))
    return dims, tuple(split), sizes


PAD_KINDS = ("pairs", "same", "int", "ints", "valid")


@st.composite
def geometry(draw, nd: int, allow_same: bool, max_pad: int = 3):
    """(kernel, stride, dilation, padding argument, (lo, hi) pairs) for ``nd`` axes;
    ``'same'`` comes with stride 1."""
    kind = draw(st.sampled_from([k for k in PAD_KINDS if allow_same or k != "same"]))
    kernel = tuple(draw(st.lists(st.integers(1, 4 if nd < 3 else 3), min_size=nd,
                                 max_size=nd)))
    if kind == "same":
        stride = (1,) * nd
    else:
        stride = tuple(draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd)))
    dilation = tuple(draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd)))
    if kind == "int":
        p = draw(st.integers(0, 2))
        arg, pads = p, ((p, p),) * nd
    elif kind == "valid":
        arg, pads = "valid", ((0, 0),) * nd
    elif kind == "ints":
        ps = tuple(draw(st.lists(st.integers(0, 2), min_size=nd, max_size=nd)))
        arg, pads = ps, tuple((p, p) for p in ps)
    elif kind == "pairs":
        pads = tuple((draw(st.integers(0, max_pad)), draw(st.integers(0, max_pad)))
                     for _ in range(nd))
        arg = pads
    else:
        pads = tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
                     for k, d in zip(kernel, dilation))
        arg = "same"
    return kernel, stride, dilation, arg, pads


@st.composite
def conv_cases(draw):
    nd = draw(st.integers(1, 3))
    kernel, stride, dilation, pad_arg, pads = draw(geometry(nd, allow_same=True))
    extra = (5, 4, 2)[nd - 1]
    spatial = []
    for k, d, (lo, hi) in zip(kernel, dilation, pads):
        low = max(1, d * (k - 1) + 1 - lo - hi)  # the padded input covers the kernel span
        spatial.append(low + draw(st.integers(0, extra)))
    n = draw(st.integers(0, 3))
    groups = draw(st.sampled_from([1, 2]))
    cin = groups * draw(st.integers(1, 4 // groups))
    cout = groups * draw(st.integers(1, 4 // groups))
    xshape = (n, cin) + tuple(spatial)
    layout = draw(nc_layouts(xshape))
    return dict(nd=nd, xshape=xshape, cout=cout, groups=groups, kernel=kernel, stride=stride,
                dilation=dilation, pad_arg=pad_arg, pads=pads, layout=layout,
                bias=draw(st.booleans()), int_args=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)),
                overlap=draw(st.sampled_from([False, True, "poll", "thread"])))


@st.composite
def conv_transpose_cases(draw):
    nd = draw(st.integers(1, 3))
    kernel, stride, dilation, pad_arg, pads = draw(geometry(nd, allow_same=False))
    opad = tuple(draw(st.integers(0, s - 1)) for s in stride)
    extra = (4, 3, 2)[nd - 1]
    spatial = []
    for k, s, d, (lo, hi), op in zip(kernel, stride, dilation, pads, opad):
        # output extent (m-1)*s - lo - hi + span + op must be >= 1
        need = 1 + lo + hi - (d * (k - 1) + 1) - op
        low = 1 + max(0, -(-need // s))
        spatial.append(low + draw(st.integers(0, extra)))
    n = draw(st.integers(0, 3))
    groups = draw(st.sampled_from([1, 2]))
    cin = groups * draw(st.integers(1, 4 // groups))
    cout = groups * draw(st.integers(1, 4 // groups))
    yshape = (n, cin) + tuple(spatial)
    layout = draw(nc_layouts(yshape))
    return dict(nd=nd, yshape=yshape, cout=cout, groups=groups, kernel=kernel, stride=stride,
                dilation=dilation, pad_arg=pad_arg, pads=pads, opad=opad, layout=layout,
                bias=draw(st.booleans()), int_args=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


# -- 1. convolution vs the reference -------------------------------------------------------------
def run_conv_case(c: dict) -> None:
    """Forward and backward of one convolution case against the reference (records checks)."""
    rng = np.random.default_rng(c["seed"])
    dims, split, sizes = c["layout"]
    g = c["groups"]
    x = rng.standard_normal(c["xshape"])
    w = rng.standard_normal((c["cout"], c["xshape"][1] // g) + c["kernel"])
    b = rng.standard_normal(c["cout"]) if c["bias"] else None
    xd = dt.from_global(x, grid=grid(dims), split=split, sizes=sizes)
    ia = c["int_args"]
    y, saved = conv_forward(xd, w, b, as_arg(c["stride"], ia), c["pad_arg"],
                            as_arg(c["dilation"], ia), g, overlap=c.get("overlap"))
    y_ref = ref.conv(x, w, b, c["stride"], c["pads"], c["dilation"], g)
    expect(y.dtype == np.float64, f"y dtype {y.dtype}")
    close("y", y.to_numpy(), y_ref)
    check_centre_rule(xd.distribution, y.distribution, c["kernel"], c["stride"], c["dilation"],
                      c["pads"], "conv")
    if y.shape != y_ref.shape:
        return  # recorded above; dy could not be built
    dy = rng.standard_normal(y_ref.shape)
    dyd = like(dy, y)
    dx, dw, db = conv_backward(saved, dyd)
    dx_ref, dw_ref, db_ref = ref.conv_backward(x, w, dy, c["stride"], c["pads"], c["dilation"], g)
    expect(dx.distribution == xd.distribution, f"dx {dx.distribution} != x {xd.distribution}")
    close("dx", dx.to_numpy(), dx_ref)
    close("dw", dw, dw_ref)
    close("db", db, db_ref if c["bias"] else None)
    # reduce=False: per-rank partial sums (replicas hold equal ones) adding up to dw / db
    dx2, dw_p, db_p = conv_backward(saved, dyd, need_dx=False, reduce=False)
    expect(dx2 is None, "dx computed although need_dx=False")
    reps = replicas(xd)
    close("dw partial sum", COMM.allreduce(np.asarray(dw_p), op=MPI.SUM) / reps, dw_ref)
    if c["bias"]:
        close("db partial sum", COMM.allreduce(np.asarray(db_p), op=MPI.SUM) / reps, db_ref)
    _, dw3, db3 = conv_backward(saved, dyd, need_dw=False)
    expect(dw3 is None and db3 is None, "dw/db computed although need_dw=False")


@settings(max_examples=examples(25))
@given(case=conv_cases())
@collective_checks
def test_conv_matches_reference(case):
    run_conv_case(case)


def _two_axes() -> tuple[int, int]:
    return (2, SIZE // 2) if SIZE % 2 == 0 else (1, SIZE)


def uneven(n: int, p: int) -> tuple[int, ...]:
    """Deterministic uneven sizes with an empty block when p >= 2 (weights 1, 0, 3, 2, ...)."""
    if p == 1:
        return (n,)
    wts = [(3 * i + 1) % 4 for i in range(p)]
    s = [n * q // sum(wts) for q in wts]
    s[wts.index(max(wts))] += n - sum(s)
    return tuple(s)


def _case(nd, shape, cout, groups, kernel, stride, dilation, pad_arg, pads, layout, **kw):
    return dict(nd=nd, cout=cout, groups=groups, kernel=kernel, stride=stride,
                dilation=dilation, pad_arg=pad_arg, pads=pads, layout=layout,
                bias=kw.pop("bias", True), int_args=kw.pop("int_args", False),
                seed=kw.pop("seed", 5), **{kw.pop("shape_key", "xshape"): shape}, **kw)


def fixed_conv_cases() -> dict:
    """Cases exercised at every rank count whatever hypothesis draws."""
    two = _two_axes()
    return {
        # 'same' with an even, dilated kernel, groups, one spatial axis split unevenly
        "same-even-kernel": _case(2, (2, 4, 7, 6), 2, 2, (4, 3), (1, 1), (2, 1), "same",
                                  ((3, 3), (1, 1)),
                                  ((SIZE,), (None, None, 0, None), [None, None, uneven(7, SIZE),
                                                                    None])),
        # asymmetric padding, strides 2 and 3, two spatial axes split
        "asym-strided-2d": _case(2, (1, 3, 9, 8), 4, 1, (3, 2), (2, 3), (1, 2),
                                 ((3, 0), (1, 2)), ((3, 0), (1, 2)),
                                 (two, (None, None, 0, 1), [None, None, None, uneven(8, two[1])])),
        # 3-D: samples and one spatial axis split, mixed per-axis geometry
        "asym-3d": _case(3, (3, 2, 7, 5, 6), 2, 2, (2, 3, 1), (3, 1, 2), (2, 1, 1),
                         ((0, 2), (1, 1), (2, 0)), ((0, 2), (1, 1), (2, 0)),
                         (two, (0, None, None, 1, None), [uneven(3, two[0]), None, None, None,
                                                          None])),
        # 1-D valid with a wide dilated window: outer blocks trimmed; split over the second
        # grid axis only, so the first one (2 ranks when SIZE is even) holds replicas whose
        # dw must not be counted twice
        "valid-1d-replicated": _case(1, (3, 1, 17), 3, 1, (4,), (3,), (2,), "valid", ((0, 0),),
                                     (two, (None, None, 1), [None, None, None])),
        # fewer cells than ranks, padding wider than the kernel (outputs read padding only)
        "pad-only-outputs": _case(1, (2, 2, 2), 2, 1, (1,), (1,), (1,), ((2, 1),),
                                  ((2, 1),), ((SIZE,), (None, None, 0), [None, None, None])),
        # all three spatial axes split on a 3-axis grid when it fits (replicated otherwise)
        "3d-all-split": _case(3, (1, 1, 5, 4, 6), 1, 1, (3, 3, 3), (1, 2, 1), (1, 1, 2), 1,
                              ((1, 1),) * 3,
                              ((1, 2, SIZE // 2) if SIZE % 2 == 0 else (SIZE, 1, 1),
                               (None, None, 0, 1, 2), [None] * 5), int_args=True),
    }


@pytest.mark.parametrize("name", list(fixed_conv_cases()))
@collective_checks
def test_conv_fixed_cases(name):
    run_conv_case(fixed_conv_cases()[name])


# -- 2. transposed convolution vs the reference --------------------------------------------------
def run_conv_transpose_case(c: dict) -> None:
    """Forward and backward of one transposed-convolution case against the reference."""
    rng = np.random.default_rng(c["seed"])
    dims, split, sizes = c["layout"]
    g = c["groups"]
    yin = rng.standard_normal(c["yshape"])
    w = rng.standard_normal((c["yshape"][1], c["cout"] // g) + c["kernel"])
    b = rng.standard_normal(c["cout"]) if c["bias"] else None
    yd = dt.from_global(yin, grid=grid(dims), split=split, sizes=sizes)
    ia = c["int_args"]
    xo, saved = conv_transpose_forward(yd, w, b, as_arg(c["stride"], ia), c["pad_arg"],
                                       as_arg(c["opad"], ia), as_arg(c["dilation"], ia), g)
    x_ref = ref.conv_transpose(yin, w, b, c["stride"], c["pads"], c["opad"], c["dilation"], g)
    close("x", xo.to_numpy(), x_ref)
    # the output's layout is one whose convolution outputs are the (possibly redistributed)
    # input's blocks
    check_centre_rule(xo.distribution, saved.y.distribution, c["kernel"], c["stride"],
                      c["dilation"], c["pads"], "conv_transpose")
    if xo.shape != x_ref.shape:
        return
    dx = rng.standard_normal(x_ref.shape)
    dxd = like(dx, xo)
    dy, dw, db = conv_transpose_backward(saved, dxd)
    dy_ref, dw_ref, db_ref = ref.conv_transpose_backward(yin, w, dx, c["stride"], c["pads"],
                                                         c["opad"], c["dilation"], g)
    close("dy", dy.to_numpy(), dy_ref)
    expect(dy.distribution == yd.distribution, f"dy {dy.distribution} != y {yd.distribution}")
    close("dw", dw, dw_ref)
    close("db", db, db_ref if c["bias"] else None)


@settings(max_examples=examples(25))
@given(case=conv_transpose_cases())
@collective_checks
def test_conv_transpose_matches_reference(case):
    run_conv_transpose_case(case)


def fixed_conv_transpose_cases() -> dict:
    two = _two_axes()
    return {
        # stride 2 with output padding, uneven split of the input: the output gets the split
        # whose convolution outputs are the input's blocks
        "stride2-outpad": _case(2, (2, 4, 5, 4), 2, 2, (3, 4), (2, 3), (1, 1), ((1, 0), (2, 1)),
                                ((1, 0), (2, 1)),
                                ((SIZE,), (None, None, 0, None), [None, None, uneven(5, SIZE),
                                                                  None]),
                                shape_key="yshape", opad=(1, 2)),
        # padding wider than the centre shift: no input split gives the input's blocks, so the
        # input is redistributed first
        "redistributed-input": _case(1, (1, 2, 6), 3, 1, (1,), (2,), (1,), ((3, 0),),
                                     ((3, 0),),
                                     ((SIZE,), (None, None, 0),
                                      [None, None, (1,) * (SIZE - 1) + (7 - SIZE,)]
                                      if SIZE > 1 else [None, None, None]),
                                     shape_key="yshape", opad=(1,)),
        # 3-D, two spatial axes split, dilation
        "3d-dilated": _case(3, (1, 2, 3, 4, 3), 2, 1, (2, 3, 2), (1, 2, 2), (2, 1, 1), 1,
                            ((1, 1),) * 3,
                            (two, (None, None, 1, 0, None), [None] * 5),
                            shape_key="yshape", opad=(0, 1, 0), int_args=True),
    }


@pytest.mark.parametrize("name", list(fixed_conv_transpose_cases()))
@collective_checks
def test_conv_transpose_fixed_cases(name):
    c = fixed_conv_transpose_cases()[name]
    run_conv_transpose_case(c)
    if name == "redistributed-input" and SIZE > 1:  # the case exercises what it claims
        d = dt.from_global(np.zeros(c["yshape"]), grid=grid(c["layout"][0]),
                           split=c["layout"][1], sizes=c["layout"][2])
        _, saved = conv_transpose_forward(d, np.zeros((2, 3, 1)), None, 2, c["pad_arg"], 1)
        expect(saved.y.distribution != d.distribution, "the input was not redistributed")


# -- 3. adjoint identities on uneven layouts -------------------------------------------------------
def _adjoint_layouts():
    """(x shape, grid dims, split, sizes) of a couple of uneven layouts at any rank count."""
    two = _two_axes()
    s2 = (9, 8)
    return [
        # 2-D, one spatial axis split unevenly (one empty block from 2 ranks on)
        ((2, 3, 11, 7), (SIZE,), (None, None, 0, None), [None, None, uneven(11, SIZE), None]),
        # 2-D, samples and the other spatial axis split, uneven
        ((3, 2) + s2, two, (0, None, None, 1),
         [uneven(3, two[0]), None, None, uneven(s2[1], two[1])]),
        # 3-D, two spatial axes split (balanced x uneven), replicated when a grid axis is 1
        ((1, 2, 6, 7, 5), two, (None, None, 1, 0, None),
         [None, None, uneven(6, two[1]), None, None]),
    ]


def _inner(a, b) -> float:
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


def test_conv_adjoint_uneven_layouts():
    rng = np.random.default_rng(7)
    geoms = [  # (kernel, stride, padding, dilation, groups, cout)
        (3, 2, ((1, 2),), 1, 1, 4),
        (4, 1, "same", 2, 1, 2),
        (2, 3, 1, 1, 1, 3),
    ]
    for shape, dims, split, sizes in _adjoint_layouts():
        nd = len(shape) - 2
        for k, s, p, d, g, cout in geoms:
            pad = p * nd if isinstance(p, tuple) else p
            x = rng.standard_normal(shape)
            w = rng.standard_normal((cout, shape[1] // g) + (k,) * nd)
            xd = dt.from_global(x, grid=grid(dims), split=split, sizes=sizes)
            y, saved = conv_forward(xd, w, None, s, pad, d, g)
            r = rng.standard_normal(y.shape)
            dx, _, _ = conv_backward(saved, like(r, y), need_dw=False)
            lhs, rhs = _inner(y.to_numpy(), r), _inner(x, dx.to_numpy())
            assert_all_ranks(COMM, abs(lhs - rhs) <= 1e-11 * max(1.0, abs(lhs)),
                             f"<conv x, r>={lhs!r} != <x, conv* r>={rhs!r} for {shape} "
                             f"{split} {sizes} k={k} s={s} p={pad} d={d}")
            # transposed conv is conv*: <convT(r), x> == <r, conv(x)> (distributed both ways),
            # and its backward is conv: <convT r, x> == <r, convT* x>
            out_pad = tuple((n + lo + hi - (d * (k - 1) + 1)) % s for n, (lo, hi) in
                            zip(shape[2:], _pairs(pad, nd, k, d)))
            rd = like(r, y)
            xt, tsaved = conv_transpose_forward(rd, w, None, s, _pairs(pad, nd, k, d), out_pad,
                                                d, g)
            assert_all_ranks(COMM, xt.shape == x.shape, f"convT shape {xt.shape} != {x.shape}")
            lhs_t = _inner(xt.to_numpy(), x)
            assert_all_ranks(COMM, abs(lhs_t - lhs) <= 1e-11 * max(1.0, abs(lhs)),
                             f"<convT r, x>={lhs_t!r} != <r, conv x>={lhs!r}")
            dr, _, _ = conv_transpose_backward(tsaved, like(x, xt), need_dw=False)
            rhs_t = _inner(r, dr.to_numpy())
            assert_all_ranks(COMM, abs(lhs_t - rhs_t) <= 1e-11 * max(1.0, abs(lhs)),
                             f"<convT r, x>={lhs_t!r} != <r, convT* x>={rhs_t!r}")


def _pairs(pad, nd, k, d):
    if pad == "same":
        t = d * (k - 1)
        return ((t // 2, t - t // 2),) * nd
    if isinstance(pad, int):
        return ((pad, pad),) * nd
    return tuple(pad)


# -- 4. finite differences through the distributed forward ----------------------------------------
def test_finite_difference_split_spatial():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 2, 5, 4))
    w = rng.standard_normal((3, 2, 3, 3))
    b = rng.standard_normal(3)
    pad = ((1, 0), (0, 2))
    g2 = grid((SIZE,))
    layout = dict(grid=g2, split=(None, None, 0, None))

    def forward(xa, wa, ba):
        return conv_forward(dt.from_global(xa, **layout), wa, ba, 2, pad)

    y, saved = forward(x, w, b)
    r = rng.standard_normal(y.shape)
    dx, dw, db = conv_backward(saved, like(r, y))

    def loss(xa, wa, ba):  # the same on every rank; every rank runs the same perturbations
        return float(np.sum(forward(xa, wa, ba)[0].to_numpy() * r))

    fd_x = ref.numerical_gradient(lambda a: loss(a, w, b), x)
    fd_w = ref.numerical_gradient(lambda a: loss(x, a, b), w)
    fd_b = ref.numerical_gradient(lambda a: loss(x, w, a), b)
    assert_allclose_all(COMM, dx.to_numpy(), fd_x, rtol=1e-6, atol=1e-8, err_msg="dx")
    assert_allclose_all(COMM, dw, fd_w, rtol=1e-6, atol=1e-8, err_msg="dw")
    assert_allclose_all(COMM, db, fd_b, rtol=1e-6, atol=1e-8, err_msg="db")


# -- 5. CosmoFlow's first layer in float32 ---------------------------------------------------------
def test_cosmoflow_first_layer_float32():
    if SIZE == 4:
        dims, split = (2, 2), (None, None, 0, 1, None)
    else:
        dims, split = (SIZE,), (None, None, 0, None, None)
    rng = np.random.default_rng(2024)
    x = rng.standard_normal((1, 4, 64, 64, 64)).astype(np.float32)
    w = (rng.standard_normal((32, 4, 3, 3, 3)) / np.sqrt(4 * 27)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    dy = rng.standard_normal((1, 32, 64, 64, 64)).astype(np.float32)
    xd = dt.from_global(x, grid=grid(dims), split=split)
    y, saved = conv_forward(xd, w, b, 1, "same")
    assert_all_ranks(COMM, y.dtype == np.float32 and y.shape == dy.shape,
                     f"y {y.dtype} {y.shape}")
    assert_all_ranks(COMM, y.distribution.offsets == xd.distribution.offsets[:1] + (
        (0, 32),) + xd.distribution.offsets[2:], "'same' must keep the input's ownership")
    dx, dw, db = conv_backward(saved, like(dy, y))
    assert_all_ranks(COMM, dx.dtype == np.float32 and dw.dtype == np.float32, "dtypes")
    yg, dxg = y.gather(0), dx.gather(0)
    # the float64 reference once, on rank 0 (5 s serial; the others wait in the broadcast)
    ok, msg = True, ""
    if COMM.rank == 0:
        y_ref = ref.conv(x, w, b, 1, 1)
        dx_ref, dw_ref, db_ref = ref.conv_backward(x, w, dy, 1, 1)
        errs = {"y": (yg, y_ref), "dx": (dxg, dx_ref)}
        for name, (a, e) in errs.items():
            rel = float(np.abs(a.astype(np.float64) - e).max() / np.abs(e).max())
            if not rel < 1e-5:
                ok, msg = False, f"{name}: relative error {rel:.3g}"
        refs = (dw_ref, db_ref)
    else:
        refs = None
    dw_ref, db_ref = COMM.bcast(refs, root=0)
    assert_all_ranks(COMM, ok, msg)
    for name, a, e, tol in (("dw", dw, dw_ref, 1e-4), ("db", db, db_ref, 1e-4)):
        rel = float(np.abs(np.asarray(a, np.float64) - e).max() / np.abs(e).max())
        assert_all_ranks(COMM, rel < tol, f"{name}: relative error {rel:.3g}")


# -- 6. errors on every rank -----------------------------------------------------------------------
def _wrapped_gradient(dxp, pads, spatial):
    """Fold the gradient of a wrap-padded array back onto the unpadded one."""
    dx = np.zeros(dxp.shape[:2] + tuple(spatial))
    idx = np.ix_(*[(np.arange(m) - lo) % n for m, (lo, _), n in zip(dxp.shape[2:], pads, spatial)])
    for pos in np.ndindex(*dxp.shape[2:]):
        dst = tuple(ix.ravel()[p] for ix, p in zip(idx, pos))
        dx[(slice(None), slice(None)) + dst] += dxp[(slice(None), slice(None)) + pos]
    return dx


@pytest.mark.parametrize("pad,stride", [("same", 1), ((((2, 1), (0, 3))), 2), (1, 1)])
@pytest.mark.parametrize("sizes_kind", ["balanced", "uneven"])
@collective_checks
def test_circular_padding_matches_wrapped_reference(pad, stride, sizes_kind):
    """padding_mode='circular' (periodic domains): equal to the reference conv of the input
    wrap-padded with numpy.pad(mode='wrap'); dx folds the padding's gradient back."""
    from disttensor.ops.window import normalize_padding
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 7, 6))
    w = rng.standard_normal((4, 3, 3, 4))
    sizes = (None, None, uneven(7, SIZE), None) if sizes_kind == "uneven" else None
    xd = dt.from_global(x, grid=grid((SIZE,)), split=(None, None, 0, None), sizes=sizes)
    y, saved = conv_forward(xd, w, None, stride, pad, padding_mode="circular")
    pads = normalize_padding(pad, 2, (3, 4), (1, 1))
    xp = np.pad(x, ((0, 0), (0, 0)) + pads, mode="wrap")
    yr = ref.conv(xp, w, None, stride, 0)
    close("circular y", y.to_numpy(), yr)
    dy = rng.standard_normal(yr.shape)
    dx, dw, _ = conv_backward(saved, like(dy, y))
    dxp, dwr, _ = ref.conv_backward(xp, w, dy, stride, 0)
    close("circular dx", dx.to_numpy(), _wrapped_gradient(dxp, pads, x.shape[2:]))
    close("circular dw", dw, dwr)


@pytest.mark.parametrize("pad,stride,mode", [("same", 1, "zeros"), (((2, 0), (1, 3)), 2, "zeros"),
                                             ("same", 1, "circular")])
@collective_checks
def test_overlap_equals_no_overlap(pad, stride, mode):
    """Interior computed during the exchange == the whole window after it, forward, dx and
    dw, on a 2-D split when there are 4 ranks (edges and corners in the shells), for every
    progress mode (none, test-polling between sample chunks, a progress thread); and the
    backward is the forward's adjoint there (<conv(x), dy> == <x, dx>: no bias)."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 3, 11, 9))
    w = rng.standard_normal((4, 3, 3, 4))
    dims, split = ((2, 2), (None, None, 0, 1)) if SIZE == 4 else ((SIZE,), (None, None, 0, None))
    xd = dt.from_global(x, grid=grid(dims), split=split,
                        sizes=(None, None, uneven(11, dims[0]), None))
    res = []
    for overlap in (False, True, "poll", "thread"):
        y, saved = conv_forward(xd, w, None, stride, pad, padding_mode=mode, overlap=overlap)
        dy = like(np.cos(np.arange(int(np.prod(y.shape)))).reshape(y.shape), y)
        dx, dw, _ = conv_backward(saved, dy)
        res.append((y.to_numpy(), dx.to_numpy(), dw))
        close(f"adjoint ({overlap})", np.vdot(y.to_numpy(), dy.to_numpy()),
              np.vdot(x, dx.to_numpy()), rtol=1e-10, atol=1e-10)
    for other in res[1:]:
        for name, a, b in zip(("y", "dx", "dw"), res[0], other):
            close(f"overlap {name}", a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("overlap", [False, True, "poll", "thread"])
@collective_checks
def test_windows_entirely_in_padding(overlap):
    """Outputs whose windows read only padding (k=1, stride 3, padding 2 on an extent of 2:
    hypothesis found the read window going negative) hold just the bias."""
    dims = (SIZE,)
    for sizes in (None, (None, None, uneven(2, SIZE), None)):
        c = dict(nd=2, xshape=(1, 2, 2, 3), cout=2, groups=1, kernel=(1, 1), stride=(3, 1),
                 dilation=(1, 1), pad_arg=(2, 0), pads=((2, 2), (0, 0)),
                 layout=(dims, (None, None, 0, None), sizes), bias=True, int_args=False, seed=3,
                 overlap=overlap)
        run_conv_case(c)


def test_errors_raised_on_every_rank():
    g1 = grid((SIZE,))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 9))
    xd = dt.from_global(x, grid=g1, split=(None, None, 0))
    w = rng.standard_normal((4, 4, 3))

    xc = dt.from_global(x, grid=g1, split=(None, 0, None))
    assert_raises_all(COMM, ValueError, "channel axis", lambda: conv_forward(xc, w))
    assert_raises_all(COMM, ValueError, "channel axis",
                      lambda: conv_transpose_forward(xc, w))
    assert_raises_all(COMM, ValueError, "does not fit",
                      lambda: conv_forward(xd, rng.standard_normal((4, 3, 3))))
    assert_raises_all(COMM, ValueError, "does not fit",
                      lambda: conv_transpose_forward(xd, rng.standard_normal((3, 2, 3))))
    # groups not dividing the input channels (3 % 2) / the output channels (3 % 2)
    x3 = dt.from_global(rng.standard_normal((2, 3, 9)), grid=g1, split=(None, None, 0))
    assert_raises_all(COMM, ValueError, "does not fit",
                      lambda: conv_forward(x3, rng.standard_normal((4, 1, 3)), groups=2))
    assert_raises_all(COMM, ValueError, "does not fit",
                      lambda: conv_forward(xd, rng.standard_normal((3, 2, 3)), groups=2))
    assert_raises_all(COMM, ValueError, "does not fit",
                      lambda: conv_transpose_forward(x3, rng.standard_normal((3, 1, 3)),
                                                     groups=2))
    assert_raises_all(COMM, ValueError, "groups",
                      lambda: conv_forward(xd, w, groups=0))
    x16 = dt.from_global(x.astype(np.float16), grid=g1, split=(None, None, 0))
    assert_raises_all(COMM, TypeError, "float32 or float64",
                      lambda: conv_forward(x16, w.astype(np.float16)))
    assert_raises_all(COMM, ValueError, "padding_mode",
                      lambda: conv_forward(xd, w, padding_mode="reflect"))
    assert_raises_all(COMM, ValueError, "circular padding",
                      lambda: conv_forward(xd, w, padding=10, padding_mode="circular"))
    # weight of the wrong rank
    assert_raises_all(COMM, ValueError, "spatial",
                      lambda: conv_forward(xd, rng.standard_normal((4, 4, 3, 3))))
    # dy with another distribution than y's (replicated instead of split; other sizes)
    y, saved = conv_forward(xd, w, None, 1, 1)
    dy = rng.standard_normal(y.shape)
    bad = dt.from_global(dy, grid=g1, split=(None, None, None))
    assert_raises_all(COMM, ValueError, "dy must be distributed like",
                      lambda: conv_backward(saved, bad))
    bad2 = dt.from_global(dy, grid=g1, split=(None, None, 0),
                          sizes=[None, None, (9,) + (0,) * (SIZE - 1)])
    if bad2.distribution != y.distribution:  # on one rank the only sizes are y's
        assert_raises_all(COMM, ValueError, "dy must be distributed like",
                          lambda: conv_backward(saved, bad2))
    bad3 = dt.from_global(rng.standard_normal((2, 4, 8)), grid=g1, split=(None, None, 0))
    assert_raises_all(COMM, ValueError, "dy must be distributed like",
                      lambda: conv_backward(saved, bad3))
    # a transposed convolution's state given to conv_backward and vice versa
    xt, tsaved = conv_transpose_forward(xd, w, None, 1, 1)
    assert_raises_all(COMM, ValueError, "conv_transpose_backward",
                      lambda: conv_backward(tsaved, like(rng.standard_normal(xt.shape), xt)))
    assert_raises_all(COMM, ValueError, "conv_backward",
                      lambda: conv_transpose_backward(saved, like(dy, y)))
    assert_raises_all(COMM, ValueError, "dx must be distributed like",
                      lambda: conv_transpose_backward(tsaved, bad))
    # output_padding >= stride
    assert_raises_all(COMM, ValueError, "output_padding",
                      lambda: conv_transpose_forward(xd, w, None, 2, 0, 2))
    assert_raises_all(COMM, ValueError, "output_padding",
                      lambda: conv_transpose_forward(xd, w, None, 1, 0, 1))
    # transposed output extent < 1
    assert_raises_all(COMM, ValueError, "no valid output extent",
                      lambda: conv_transpose_forward(xd, w, None, 1, 6))
    # input (plus padding) shorter than the kernel span
    xs = dt.from_global(rng.standard_normal((1, 4, 4)), grid=g1, split=(None, None, 0))
    assert_raises_all(COMM, ValueError, "shorter than the window span",
                      lambda: conv_forward(xs, rng.standard_normal((2, 4, 5))))
    assert_raises_all(COMM, ValueError, "shorter than the window span",
                      lambda: conv_forward(xs, w, None, 1, "valid", 3))
    assert_raises_all(COMM, ValueError, "shorter than the window span",
                      lambda: conv_forward(xs, rng.standard_normal((2, 4, 6)), None, 1,
                                           ((1, 0),)))
    # the ranks are still in step
    assert_all_ranks(COMM, COMM.allreduce(1) == SIZE, "out of step")
