"""Distributed CNN layers other than convolution against the serial float64 reference
(``tests/reference.py``): pooling, upsampling, batch norm, activations, channel softmax,
dropout, channel concatenation, flatten + dense, and the mse / cross-entropy losses, forward
and backward; finite-difference checks of a few backward passes; flatten's gather and its
backward checked adjoint (dot-product test); errors raised on every rank.

Layouts are ``(N, C, *spatial)`` arrays on ``COMM.size`` ranks with the channel axis (1) never
split and the sample axis and any subset of the spatial axes split over the grid axes, with
balanced or explicit uneven (empty blocks included) ownership.  The global float64 data are
scattered with ``dt.from_global``; output gradients ``dy`` are scattered with the output's own
distribution; gathered results (``to_numpy``) are compared with the reference.  Every rank
draws the same examples and makes the same collective calls; checks are recorded locally and
settled with one collective assertion per example (:mod:`checks`).
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from disttensor.ops import (ACTIVATIONS, activation_backward, activation_forward,
                           batch_norm_backward, batch_norm_forward, concat_channels,
                           concat_channels_backward, cross_entropy_backward,
                           cross_entropy_forward, dense_backward, dense_forward,
                           dropout_backward, dropout_forward, flatten_backward, flatten_forward,
                           mse_backward, mse_forward, pool_backward, pool_forward,
                           softmax_backward, softmax_forward, upsample_backward,
                           upsample_forward)

from checks import COMM, SIZE, examples, expect, grid
from gradchecks import guarded
from conftest import assert_allclose_all, assert_all_ranks, assert_raises_all
from disttensor.testing import assert_adjoint
from disttensor.testing.strategies import grids, split_sizes, splits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402

RTOL = 1e-10
ATOL = 1e-12
EPS = 1e-5


# -- layouts and scatter ---------------------------------------------------------------------
@st.composite
def nc_layouts(draw, shape, dims=None, max_grid_ndim: int = 3, need_split: bool = False):
    """``(dims, split, sizes)`` for an ``(N, C, *S)`` array: the channel axis never split,
    the others split over distinct grid axes or not, balanced or explicit sizes.
    ``need_split``: some axis is split over a grid axis with more than one rank (blocks
    differ), when there is more than one rank."""
    if dims is None:
        dims = draw(grids(SIZE, max_grid_ndim))
    rest = draw(splits(len(shape) - 1, len(dims)))
    split = (rest[0], None) + tuple(rest[1:])
    if need_split and SIZE > 1 and not any(g is not None and dims[g] > 1 for g in split):
        # put the biggest grid axis on a drawn non-channel axis (free it first if used)
        big = max(range(len(dims)), key=lambda g: dims[g])
        t = draw(st.sampled_from([0] + list(range(2, len(shape)))))
        split = tuple(None if g == big else g for g in split)
        split = split[:t] + (big,) + split[t + 1:]
    sizes = draw(split_sizes(shape, dims, split))
    return tuple(dims), split, tuple(sizes)


@st.composite
def any_layouts(draw, shape, dims):
    """A layout of any axes (no channel axis: labels ``(N, *S)``) on the grid ``dims``."""
    split = draw(splits(len(shape), len(dims)))
    sizes = draw(split_sizes(shape, dims, split))
    return tuple(dims), split, tuple(sizes)


def scatter(a, layout) -> dt.DistArray:
    dims, split, sizes = layout
    return dt.from_global(np.ascontiguousarray(a), grid=grid(dims), split=split,
                          sizes=list(sizes))


def like(a, y: dt.DistArray) -> dt.DistArray:
    """``a`` scattered with ``y``'s distribution (output gradients)."""
    return dt.from_global(np.ascontiguousarray(a), grid=y.grid, split=y.split,
                          sizes=y.distribution.split_sizes)


def close(actual, desired, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Record (not raise) whether ``actual`` matches ``desired`` (NaNs equal)."""
    try:
        actual = np.asarray(actual)
        desired = np.asarray(desired)
        assert actual.shape == desired.shape, f"shape {actual.shape} != {desired.shape}"
        np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, equal_nan=True)
    except Exception as e:  # noqa: BLE001 - AssertionError, or a TypeError from bad output
        expect(False, f"{what}: {type(e).__name__}: {str(e).strip()[:600]}")


def local_ok(x: dt.DistArray, what: str) -> None:
    """The block has the shape its distribution says."""
    expect(tuple(x.local.shape) == x.distribution.block_shape(x.grid.coords),
           f"{what}: local shape {x.local.shape} != block shape "
           f"{x.distribution.block_shape(x.grid.coords)}")


def gathered(x: dt.DistArray, desired, what: str, rtol: float = RTOL, atol: float = ATOL):
    local_ok(x, what)
    close(x.to_numpy(), desired, what, rtol, atol)


def distinct_blocks(d) -> list[tuple[slice, ...]]:
    """The distinct (non-replicated) non-empty blocks of distribution ``d``."""
    seen, out = set(), []
    for coords in itertools.product(*(range(n) for n in d.grid_dims)):
        sl = d.block_slices(coords)
        key = tuple((s.start, s.stop) for s in sl)
        if key in seen or any(s.stop <= s.start for s in sl):
            continue
        seen.add(key)
        out.append(sl)
    return out


def spell_padding(draw, pads):
    """The same padding as an int, a per-axis tuple of ints or (lo, hi) pairs."""
    if all(lo == hi for lo, hi in pads):
        if len({lo for lo, _ in pads}) == 1 and draw(st.booleans()):
            return pads[0][0]
        if draw(st.booleans()):
            return tuple(lo for lo, _ in pads)
    return tuple(pads)


def spell_per_axis(draw, values):
    if len(set(values)) == 1 and draw(st.booleans()):
        return values[0]
    return tuple(values)


# -- 1. pooling --------------------------------------------------------------------------------
@st.composite
def pool_cases(draw):
    nd = draw(st.integers(1, 3))
    max_side, max_k = {1: (9, 4), 2: (6, 4), 3: (4, 3)}[nd]
    kernel, stride, pads, spatial = [], [], [], []
    for _ in range(nd):
        k = draw(st.integers(1, max_k))
        s = draw(st.integers(1, 3))
        lo, hi = draw(st.integers(0, k // 2)), draw(st.integers(0, k // 2))
        n = draw(st.integers(max(1, k - lo - hi), max(max_side, k)))
        kernel.append(k)
        stride.append(s)
        pads.append((lo, hi))
        spatial.append(n)
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 2)), *spatial)
    mode = draw(st.sampled_from(["max", "avg"]))
    cip = draw(st.booleans())
    padding = spell_padding(draw, pads)
    kernel = spell_per_axis(draw, kernel)
    stride = None if (tuple(stride) == tuple(np.broadcast_to(kernel, nd)) and draw(st.booleans())) \
        else spell_per_axis(draw, stride)
    layout = draw(nc_layouts(shape))
    seed = draw(st.integers(0, 2**32 - 1))
    return shape, mode, kernel, stride, padding, cip, layout, seed


def pool_data(shape, mode, seed):
    rng = np.random.default_rng(seed)
    if mode == "max":  # no ties, negative values too (padding must act as -inf, not 0)
        size = int(np.prod(shape))
        x = (rng.permutation(size) - size / 2).reshape(shape).astype(np.float64)
    else:
        x = rng.normal(size=shape)
    return x, rng


def check_pool(shape, mode, kernel, stride, padding, cip, layout, seed):
    xg, rng = pool_data(shape, mode, seed)
    x = scatter(xg, layout)
    y, saved = pool_forward(x, mode, kernel, stride, padding, cip)
    what = f"{mode} pool k={kernel} s={stride} p={padding} cip={cip} layout={layout}"
    yref = ref.pool(xg, mode, kernel, stride, padding, cip)
    gathered(y, yref, f"{what} forward")
    expect(y.split == x.split and y.grid is x.grid, f"{what}: output split {y.split}")
    dyg = rng.normal(size=yref.shape)
    dx = pool_backward(saved, like(dyg, y))
    expect(dx.distribution == x.distribution, f"{what}: dx distribution {dx.distribution}")
    gathered(dx, ref.pool_backward(xg, dyg, mode, kernel, stride, padding, cip),
             f"{what} backward")


@settings(max_examples=examples(20))
@given(pool_cases())
@guarded
def test_pool_forward_backward(case):
    check_pool(*case)


@st.composite
def tiny_block_pool_cases(draw):
    """A spatial axis split into blocks of 0, 1 (and sometimes 2) cells: windows (and the
    halo) reach past the direct neighbour, some ranks own no output or no input."""
    nd = draw(st.integers(1, 2))
    k = draw(st.integers(2, 4))
    s = draw(st.integers(1, 3))
    lo, hi = draw(st.integers(0, k // 2)), draw(st.integers(0, k // 2))
    blocks = list(draw(st.lists(st.integers(0, 1), min_size=SIZE, max_size=SIZE)))
    if draw(st.booleans()):
        blocks[draw(st.integers(0, SIZE - 1))] = 2
    need = max(1, k - lo - hi)
    if sum(blocks) < need:
        blocks[draw(st.integers(0, SIZE - 1))] += need - sum(blocks)
    spatial = [sum(blocks)]
    pads = [(lo, hi)]
    kernel, stride = [k], [s]
    if nd == 2:
        spatial.append(draw(st.integers(2, 4)))
        pads.append((draw(st.integers(0, 1)), draw(st.integers(0, 1))))
        kernel.append(2)
        stride.append(draw(st.integers(1, 2)))
    shape = (draw(st.integers(1, 2)), 1, *spatial)
    split = (None, None, 0) + (None,) * (nd - 1)
    sizes = (None, None, tuple(blocks)) + (None,) * (nd - 1)
    mode = draw(st.sampled_from(["max", "avg"]))
    cip = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return shape, mode, tuple(kernel), tuple(stride), tuple(pads), cip, ((SIZE,), split, sizes), \
        seed


@settings(max_examples=examples(15))
@given(tiny_block_pool_cases())
@guarded
def test_pool_tiny_blocks(case):
    check_pool(*case)


# -- 2. upsampling ---------------------------------------------------------------------------
@st.composite
def upsample_cases(draw):
    nd = draw(st.integers(1, 3))
    max_side = {1: 6, 2: 4, 3: 3}[nd]
    spatial = [draw(st.integers(1, max_side)) for _ in range(nd)]
    scale = [draw(st.integers(1, 3)) for _ in range(nd)]
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 2)), *spatial)
    mode = draw(st.sampled_from(["nearest", "linear"]))
    return shape, spell_per_axis(draw, scale), mode, draw(nc_layouts(shape)), \
        draw(st.integers(0, 2**32 - 1))


@settings(max_examples=examples(20))
@given(upsample_cases())
@guarded
def test_upsample_forward_backward(case):
    shape, scale, mode, layout, seed = case
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=shape)
    x = scatter(xg, layout)
    y, saved = upsample_forward(x, scale, mode)
    what = f"upsample {mode} scale={scale} layout={layout}"
    yref = ref.upsample(xg, scale, mode)
    gathered(y, yref, f"{what} forward")
    f = np.broadcast_to(scale, (len(shape) - 2,))
    for t, g in enumerate(x.split):  # output blocks are the input blocks times the factor
        if g is not None:
            want = x.distribution.sizes(t) if t < 2 else \
                tuple(v * int(f[t - 2]) for v in x.distribution.sizes(t))
            expect(y.split[t] == g and y.distribution.sizes(t) == want,
                   f"{what}: output sizes along {t}: {y.distribution.sizes(t)} != {want}")
    dyg = rng.normal(size=yref.shape)
    dx = upsample_backward(saved, like(dyg, y))
    expect(dx.distribution == x.distribution, f"{what}: dx distribution {dx.distribution}")
    gathered(dx, ref.upsample_backward(dyg, shape, scale, mode), f"{what} backward")


# -- 3. batch norm ---------------------------------------------------------------------------
@st.composite
def bn_cases(draw, need_split=False):
    nd = draw(st.integers(1, 3))
    max_side = {1: 5, 2: 4, 3: 3}[nd]
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 3)),
             *[draw(st.integers(1, max_side)) for _ in range(nd)])
    layout = draw(nc_layouts(shape, need_split=need_split))
    momentum = draw(st.sampled_from([0.1, 0.25, 0.5]))
    return shape, layout, momentum, draw(st.integers(0, 2**32 - 1))


def one_value_per_channel(x, stats: str) -> bool:
    """Whether a set of training statistics would have one value per channel (PyTorch's
    ``N * prod(S) == 1``): the whole array (``'global'``) or any block (``'local'``)."""
    d = x.distribution
    shapes = [d.shape] if stats == "global" else \
        [d.block_shape(c) for c in itertools.product(*(range(n) for n in d.grid_dims))]
    return any(int(np.prod(s[:1] + s[2:])) == 1 for s in shapes)


def bn_data(shape, seed):
    rng = np.random.default_rng(seed)
    c = shape[1]
    xg = rng.normal(size=shape) * rng.uniform(0.5, 2.0) + rng.uniform(-1.0, 1.0)
    gamma = rng.normal(size=c)
    beta = rng.normal(size=c)
    rm0 = rng.normal(size=c)
    rv0 = rng.uniform(0.5, 2.0, size=c)
    return rng, xg, gamma, beta, rm0, rv0


@settings(max_examples=examples(20))
@given(bn_cases())
@guarded
def test_batch_norm_global(case):
    shape, layout, momentum, seed = case
    rng, xg, gamma, beta, rm0, rv0 = bn_data(shape, seed)
    x = scatter(xg, layout)
    what = f"batch_norm global shape={shape} layout={layout}"
    rm, rv = rm0.copy(), rv0.copy()
    if one_value_per_channel(x, "global"):
        assert_raises_all(COMM, ValueError, "Expected more than 1 value per channel",
                          lambda: batch_norm_forward(x, gamma, beta, rm, rv, True, momentum,
                                                     EPS, "global"))
        close(rm, rm0, f"{what}: running_mean untouched", rtol=0, atol=0)
        return
    y, saved = batch_norm_forward(x, gamma, beta, rm, rv, True, momentum, EPS, "global")
    yref, mean, _, var_u = ref.batch_norm_train(xg, gamma, beta, EPS)
    gathered(y, yref, f"{what} forward", atol=1e-10)
    # running statistics as PyTorch: unbiased variance, (1 - m) * old + m * batch, every rank
    close(rm, (1 - momentum) * rm0 + momentum * mean, f"{what} running_mean", atol=1e-12)
    close(rv, (1 - momentum) * rv0 + momentum * var_u, f"{what} running_var", atol=1e-12)
    dyg = rng.normal(size=shape)
    dx, dgamma, dbeta = batch_norm_backward(saved, like(dyg, y))
    rdx, rdgamma, rdbeta = ref.batch_norm_train_backward(xg, gamma, dyg, EPS)
    expect(dx.distribution == x.distribution, f"{what}: dx distribution {dx.distribution}")
    gathered(dx, rdx, f"{what} dx", rtol=1e-8, atol=1e-9)
    close(dgamma, rdgamma, f"{what} dgamma", rtol=1e-9, atol=1e-10)
    close(dbeta, rdbeta, f"{what} dbeta", rtol=1e-9, atol=1e-10)

    # inference mode: the running statistics, left untouched
    rm_e, rv_e = rm0.copy(), rv0.copy()
    ye, saved_e = batch_norm_forward(x, gamma, beta, rm_e, rv_e, False, momentum, EPS, "global")
    gathered(ye, ref.batch_norm_eval(xg, rm0, rv0, gamma, beta, EPS), f"{what} eval forward",
             atol=1e-10)
    close(rm_e, rm0, f"{what} eval running_mean untouched", rtol=0, atol=0)
    close(rv_e, rv0, f"{what} eval running_var untouched", rtol=0, atol=0)
    dxe, dge, dbe = batch_norm_backward(saved_e, like(dyg, ye))
    ch = (1, -1) + (1,) * (len(shape) - 2)
    inv = 1.0 / np.sqrt(rv0 + EPS)
    xhat = (xg - rm0.reshape(ch)) * inv.reshape(ch)
    axes = (0,) + tuple(range(2, len(shape)))
    gathered(dxe, dyg * (gamma * inv).reshape(ch), f"{what} eval dx", atol=1e-10)
    close(dge, (dyg * xhat).sum(axis=axes), f"{what} eval dgamma", rtol=1e-9, atol=1e-10)
    close(dbe, dyg.sum(axis=axes), f"{what} eval dbeta", rtol=1e-9, atol=1e-10)


@settings(max_examples=examples(15))
@given(bn_cases(need_split=True))
@guarded
def test_batch_norm_local_stats(case):
    """stats='local': every rank normalizes its own block with its own statistics (and
    updates its own running statistics); dgamma/dbeta are still summed over the distinct
    blocks."""
    shape, layout, momentum, seed = case
    rng, xg, gamma, beta, rm0, rv0 = bn_data(shape, seed)
    x = scatter(xg, layout)
    what = f"batch_norm local shape={shape} layout={layout}"
    rm, rv = rm0.copy(), rv0.copy()
    if one_value_per_channel(x, "local"):  # on every rank, whichever holds that block
        assert_raises_all(COMM, ValueError, "Expected more than 1 value per channel",
                          lambda: batch_norm_forward(x, gamma, beta, rm, rv, True, momentum,
                                                     EPS, "local"))
        return
    y, saved = batch_norm_forward(x, gamma, beta, rm, rv, True, momentum, EPS, "local")
    local_ok(y, what)
    xb = xg[x.local_slices]
    dyg = rng.normal(size=shape)
    dx, dgamma, dbeta = batch_norm_backward(saved, like(dyg, y))
    if xb.size:
        yb, mean, _, var_u = ref.batch_norm_train(xb, gamma, beta, EPS)
        close(y.local, yb, f"{what} forward block", atol=1e-10)
        close(rm, (1 - momentum) * rm0 + momentum * mean, f"{what} running_mean", atol=1e-12)
        close(rv, (1 - momentum) * rv0 + momentum * var_u, f"{what} running_var", atol=1e-12)
        rdx = ref.batch_norm_train_backward(xb, gamma, dyg[x.local_slices], EPS)[0]
        close(dx.local, rdx, f"{what} dx block", rtol=1e-8, atol=1e-9)
    else:
        expect(y.local.size == 0 and dx.local.size == 0, f"{what}: empty block not empty")
        close(rm, rm0, f"{what} running_mean of an empty block", rtol=0, atol=0)
        close(rv, rv0, f"{what} running_var of an empty block", rtol=0, atol=0)
    want_g = np.zeros(shape[1])
    want_b = np.zeros(shape[1])
    for sl in distinct_blocks(x.distribution):
        _, g, b = ref.batch_norm_train_backward(xg[sl], gamma, dyg[sl], EPS)
        want_g += g
        want_b += b
    close(dgamma, want_g, f"{what} dgamma", rtol=1e-9, atol=1e-10)
    close(dbeta, want_b, f"{what} dbeta", rtol=1e-9, atol=1e-10)


# -- 4. activations, softmax, dropout --------------------------------------------------------
@st.composite
def elementwise_cases(draw, min_nd=0):
    nd = draw(st.integers(min_nd, 2))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 4)),
             *[draw(st.integers(1, 4)) for _ in range(nd)])
    return shape, draw(nc_layouts(shape)), draw(st.integers(0, 2**32 - 1))


@settings(max_examples=examples(15))
@given(elementwise_cases(), st.sampled_from(ACTIVATIONS), st.sampled_from([None, 0.2, 1.5]))
@guarded
def test_activations(case, name, alpha):
    shape, layout, seed = case
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=shape) * 3
    xg[rng.random(shape) < 0.15] = 0.0  # the kinks: torch's conventions at 0
    if name not in ("leaky_relu", "elu"):
        alpha = None
    x = scatter(xg, layout)
    what = f"{name} alpha={alpha} layout={layout}"
    y = activation_forward(name, x, alpha)
    gathered(y, ref.activation(name, xg, alpha), f"{what} forward")
    dyg = rng.normal(size=shape)
    dx = activation_backward(name, like(dyg, y), x, y, alpha)
    expect(dx.distribution == x.distribution, f"{what}: dx distribution")
    gathered(dx, ref.activation_backward(name, xg, dyg, alpha), f"{what} backward")


@settings(max_examples=examples(15))
@given(elementwise_cases())
@guarded
def test_softmax(case):
    shape, layout, seed = case
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=shape) * 3
    x = scatter(xg, layout)
    what = f"softmax layout={layout}"
    y = softmax_forward(x)
    yref = ref.softmax(xg)
    gathered(y, yref, f"{what} forward")
    dyg = rng.normal(size=shape)
    dx = softmax_backward(like(dyg, y), y)
    gathered(dx, ref.softmax_backward(yref, dyg), f"{what} backward", atol=1e-12)


@st.composite
def dropout_cases(draw):
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(4, 16)),
             draw(st.integers(4, 16)))
    return shape, draw(nc_layouts(shape)), draw(st.floats(0.05, 0.9)), \
        draw(st.integers(0, 2**63 - 1)), draw(st.booleans())


@settings(max_examples=examples(15))
@given(dropout_cases())
@guarded
def test_dropout(case):
    shape, layout, p, seed, use_generator = case
    rng = np.random.default_rng(seed % 2**32)
    xg = rng.uniform(0.5, 1.5, size=shape) * rng.choice([-1.0, 1.0], size=shape)  # no zeros
    x = scatter(xg, layout)
    whole = dt.from_global(xg, grid=x.grid, split=(None,) * len(shape))  # 1-rank equivalent
    what = f"dropout p={p} seed={seed} gen={use_generator} layout={layout}"
    gen_a = dt.random.Generator(seed) if use_generator else seed
    gen_b = dt.random.Generator(seed) if use_generator else seed
    calls = 2 if use_generator else 1
    masks = []
    for call in range(calls):
        y, saved = dropout_forward(x, p, gen_a)
        y1, _ = dropout_forward(whole, p, gen_b)
        yg = y.to_numpy()
        local_ok(y, what)
        mask = yg != 0
        masks.append(mask)
        close(mask, y1.local != 0, f"{what} call {call}: mask differs from the unsplit layout's",
              rtol=0, atol=0)
        close(yg, np.where(mask, xg / (1 - p), 0.0), f"{what} call {call}: kept values",
              rtol=1e-14, atol=0)
        n = mask.size
        frac = mask.mean()
        tol = 5 * np.sqrt(p * (1 - p) / n) + 1e-12
        expect(abs(frac - (1 - p)) <= tol,
               f"{what} call {call}: kept fraction {frac} vs {1 - p} (n={n}, tol {tol:.3g})")
        dyg = rng.normal(size=shape)
        dx = dropout_backward(saved, like(dyg, y))
        expect(dx.distribution == x.distribution, f"{what}: dx distribution")
        gathered(dx, np.where(mask, dyg / (1 - p), 0.0), f"{what} call {call}: backward",
                 rtol=1e-14, atol=0)
    if calls == 2:
        expect(not np.array_equal(masks[0], masks[1]),
               f"{what}: a Generator gave the same mask on two calls")
    # identity when not training or p == 0
    for p_, training in ((p, False), (0.0, True)):
        y, saved = dropout_forward(x, p_, seed, training=training)
        gathered(y, xg, f"{what} identity p={p_} training={training}", rtol=0, atol=0)
        dyg = rng.normal(size=shape)
        gathered(dropout_backward(saved, like(dyg, y)), dyg,
                 f"{what} identity backward p={p_} training={training}", rtol=0, atol=0)


# -- 5. concat, flatten + dense, losses ------------------------------------------------------
@st.composite
def concat_cases(draw):
    nd = draw(st.integers(1, 3))
    max_side = {1: 6, 2: 4, 3: 3}[nd]
    rest = [draw(st.integers(1, max_side)) for _ in range(nd)]
    n = draw(st.integers(1, 4))
    chans = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    dims = draw(grids(SIZE, 3))
    layouts = [draw(nc_layouts((n, c, *rest), dims=dims)) for c in chans]
    return n, chans, rest, layouts, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=examples(15))
@given(concat_cases())
@guarded
def test_concat_channels(case):
    n, chans, rest, layouts, seed = case
    rng = np.random.default_rng(seed)
    xgs = [rng.normal(size=(n, c, *rest)) for c in chans]
    xs = [scatter(a, lay) for a, lay in zip(xgs, layouts)]
    what = f"concat chans={chans} layouts={layouts}"
    y, dists = concat_channels(xs)
    gathered(y, np.concatenate(xgs, axis=1), f"{what} forward", rtol=0, atol=0)
    d0 = xs[0].distribution
    expect(y.split == d0.split and all(y.distribution.sizes(t) == d0.sizes(t)
                                       for t, g in enumerate(d0.split) if g is not None),
           f"{what}: output distribution {y.distribution} is not the first operand's")
    dyg = rng.normal(size=y.shape)
    grads = concat_channels_backward(dists, like(dyg, y))
    expect(len(grads) == len(xs), f"{what}: {len(grads)} gradients for {len(xs)} operands")
    c0 = 0
    for i, (g, x, c) in enumerate(zip(grads, xs, chans)):
        expect(g.distribution == x.distribution and g.grid is x.grid,
               f"{what}: gradient {i} distribution {g.distribution} != {x.distribution}")
        gathered(g, dyg[:, c0:c0 + c], f"{what} gradient {i}", rtol=0, atol=0)
        c0 += c


@st.composite
def dense_cases(draw):
    nd = draw(st.integers(0, 2))
    shape = (draw(st.integers(1, 5)), draw(st.integers(1, 3)),
             *[draw(st.integers(1, 3)) for _ in range(nd)])
    return shape, draw(nc_layouts(shape)), draw(st.integers(1, 4)), draw(st.booleans()), \
        draw(st.integers(0, 2**32 - 1))


@settings(max_examples=examples(15))
@given(dense_cases())
@guarded
def test_flatten_dense(case):
    shape, layout, fout, bias, seed = case
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=shape)
    feat = int(np.prod(shape[1:]))
    w = rng.normal(size=(fout, feat))
    b = rng.normal(size=fout) if bias else None
    x = scatter(xg, layout)
    what = f"flatten+dense shape={shape} fout={fout} bias={bias} layout={layout}"
    xf, fsaved = flatten_forward(x)
    expect(xf.shape == (shape[0], feat) and xf.split[1] is None and xf.split[0] == x.split[0],
           f"{what}: flattened shape {xf.shape} split {xf.split}")
    gathered(xf, xg.reshape(shape[0], feat), f"{what} flatten", rtol=0, atol=0)
    y, dsaved = dense_forward(xf, w, b)
    gathered(y, ref.dense(xg.reshape(shape[0], feat), w, b), f"{what} dense forward")
    dyg = rng.normal(size=y.shape)
    dxf, dw, db = dense_backward(dsaved, like(dyg, y))
    rdx, rdw, rdb = ref.dense_backward(xg.reshape(shape[0], feat), w, dyg)
    close(dw, rdw, f"{what} dw", atol=1e-12)
    if bias:
        close(db, rdb, f"{what} db", atol=1e-12)
    else:
        expect(db is None, f"{what}: db {db} without a bias")
    dx = flatten_backward(fsaved, dxf)
    expect(dx.distribution == x.distribution, f"{what}: dx distribution {dx.distribution}")
    gathered(dx, rdx.reshape(shape), f"{what} dx", atol=1e-12)
    # the gather (the forward) and the slice of the replica (the backward) are adjoint
    assert_adjoint(lambda v: flatten_forward(v)[0], lambda g: flatten_backward(fsaved, g),
                   x, dxf, err_msg=f"{what} adjoint")


@st.composite
def loss_cases(draw):
    nd = draw(st.integers(0, 2))
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 4)),
             *[draw(st.integers(1, 4)) for _ in range(nd)])
    dims = draw(grids(SIZE, 3))
    x_layout = draw(nc_layouts(shape, dims=dims))
    t_layout = draw(nc_layouts(shape, dims=dims))
    lab_shape = (shape[0], *shape[2:])
    lab_layout = draw(st.one_of(
        st.just(None),  # the logits' own layout without the channel axis
        any_layouts(lab_shape, dims)))
    dloss = draw(st.sampled_from([1.0, 0.5, -2.0]))
    return shape, x_layout, t_layout, lab_layout, dloss, draw(st.integers(0, 2**32 - 1))


def label_layout_of(layout):
    dims, split, sizes = layout
    keep = [0] + list(range(2, len(split)))
    return dims, tuple(split[t] for t in keep), tuple(sizes[t] for t in keep)


@settings(max_examples=examples(15))
@given(loss_cases())
@guarded
def test_losses(case):
    shape, x_layout, t_layout, lab_layout, dloss, seed = case
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=shape)
    tg = rng.normal(size=shape)
    x, t = scatter(xg, x_layout), scatter(tg, t_layout)
    what = f"mse layouts={x_layout}, {t_layout}"
    loss, saved = mse_forward(x, t)
    close(loss, ref.mse(xg, tg), f"{what} loss")
    g = mse_backward(saved, dloss)
    expect(g.distribution == x.distribution, f"{what}: gradient distribution")
    gathered(g, dloss * ref.mse_backward(xg, tg), f"{what} gradient")

    lab_shape = (shape[0], *shape[2:])
    lg = rng.integers(0, shape[1], size=lab_shape).astype(np.int64)
    if lab_layout is None:
        lab_layout = label_layout_of(x_layout)
    labels = scatter(lg, lab_layout)
    what = f"cross_entropy shape={shape} layouts={x_layout}, {lab_layout}"
    loss, saved = cross_entropy_forward(x, labels)
    close(loss, ref.cross_entropy(xg, lg), f"{what} loss")
    g = cross_entropy_backward(saved, dloss)
    expect(g.distribution == x.distribution, f"{what}: gradient distribution")
    gathered(g, dloss * ref.cross_entropy_backward(xg, lg), f"{what} gradient")

    # one out-of-range label, owned by one rank only: every rank raises
    bad = lg.copy()
    idx = tuple(int(rng.integers(0, n)) for n in lab_shape)
    bad[idx] = shape[1] if rng.random() < 0.5 else -1
    bad_labels = scatter(bad, lab_layout)
    assert_raises_all(COMM, ValueError, "outside",
                      lambda: cross_entropy_forward(x, bad_labels))


# -- 6. finite differences -------------------------------------------------------------------
def fd_check(forward, backward, xg, layout, seed, what, rtol=1e-6, atol=1e-7):
    """``backward(x, saved, dy)`` (gathered) against central differences of
    ``sum(forward(x) * w)`` for a fixed random ``w``; every rank evaluates the same
    perturbations (the forward is collective)."""
    rng = np.random.default_rng(seed)
    x = scatter(xg, layout)
    y, saved = forward(x)
    w = rng.normal(size=y.shape)

    def f(a):
        return float((forward(scatter(a, layout))[0].to_numpy() * w).sum())

    num = ref.numerical_gradient(f, xg)
    dx = backward(saved, like(w, y))
    assert_allclose_all(COMM, dx.to_numpy(), num, rtol=rtol, atol=atol, err_msg=what)


def fd_layouts(shape, axes):
    """Layouts splitting the tensor axes ``axes`` (one at a time) over a 1-D grid of all
    ranks, balanced and with explicit uneven sizes (an empty block where there are enough
    ranks)."""
    out = []
    for t in axes:
        split = tuple(0 if i == t else None for i in range(len(shape)))
        out.append(((SIZE,), split, (None,) * len(shape)))
        n = shape[t]
        uneven = [0] * SIZE
        uneven[-1] = n  # everything on the last rank but...
        if SIZE > 1:
            uneven[0] = 1
            uneven[-1] = n - 1
        out.append(((SIZE,), split, tuple(tuple(uneven) if i == t else None
                                          for i in range(len(shape)))))
    return out


@guarded
def test_finite_differences_avg_pool():
    rng = np.random.default_rng(1)
    xg = rng.normal(size=(2, 1, 7))
    for layout in fd_layouts(xg.shape, (2, 0)):
        fd_check(lambda x: pool_forward(x, "avg", 3, 2, ((1, 0),), False),
                 pool_backward, xg, layout, 2, f"avg pool, layout {layout}")
    xg = rng.normal(size=(1, 1, 4, 3))
    for layout in fd_layouts(xg.shape, (2,)):
        fd_check(lambda x: pool_forward(x, "avg", (3, 2), (1, 2), ((1, 1), (0, 1)), True),
                 pool_backward, xg, layout, 3, f"avg pool 2-D, layout {layout}")


@guarded
def test_finite_differences_linear_upsample():
    rng = np.random.default_rng(4)
    xg = rng.normal(size=(1, 1, 4, 2))
    for layout in fd_layouts(xg.shape, (2, 3)):
        fd_check(lambda x: upsample_forward(x, (3, 2), "linear"),
                 upsample_backward, xg, layout, 5, f"linear upsample, layout {layout}")


@guarded
def test_finite_differences_batch_norm():
    rng = np.random.default_rng(6)
    xg = rng.normal(size=(3, 2, 3))
    gamma, beta = rng.normal(size=2), rng.normal(size=2)

    def forward(x):
        return batch_norm_forward(x, gamma, beta, None, None, True, 0.1, EPS, "global")

    def backward(saved, dy):
        return batch_norm_backward(saved, dy)[0]

    for layout in fd_layouts(xg.shape, (0, 2)):
        fd_check(forward, backward, xg, layout, 7, f"batch norm, layout {layout}",
                 rtol=1e-5, atol=1e-6)


# -- 7. errors on every rank -----------------------------------------------------------------
@guarded
def test_errors_every_rank():
    g1 = grid((SIZE,))
    xg = np.arange(2 * 3 * 8, dtype=np.float64).reshape(2, 3, 8)
    x = dt.from_global(xg, grid=g1, split=(None, None, 0))
    gamma, beta = np.ones(3), np.zeros(3)
    ve = ValueError
    assert_raises_all(COMM, ve, "at most half", lambda: pool_forward(x, "max", 3, 1, 2))
    assert_raises_all(COMM, ve, "at most half", lambda: pool_forward(x, "avg", 2, 1, ((0, 2),)))
    assert_raises_all(COMM, ve, "'max' or 'avg'", lambda: pool_forward(x, "min", 2))
    xc = dt.from_global(xg, grid=g1, split=(None, 0, None))  # channel axis split
    assert_raises_all(COMM, ve, "channel axis", lambda: pool_forward(xc, "max", 2))
    assert_raises_all(COMM, ve, "channel axis", lambda: upsample_forward(xc, 2, "linear"))
    assert_raises_all(COMM, ve, "channel axis",
                      lambda: batch_norm_forward(xc, gamma, beta))
    assert_raises_all(COMM, ve, "channel axis", lambda: softmax_forward(xc))
    assert_raises_all(COMM, ve, "unknown activation", lambda: activation_forward("gelu", x))
    assert_raises_all(COMM, ve, "running_mean and running_var",
                      lambda: batch_norm_forward(x, gamma, beta, None, None, training=False))
    assert_raises_all(COMM, ve, "running_mean and running_var",
                      lambda: batch_norm_forward(x, gamma, beta, np.zeros(3), None,
                                                 training=False))
    assert_raises_all(COMM, ve, "gamma must have shape",
                      lambda: batch_norm_forward(x, np.ones(4), beta))
    assert_raises_all(COMM, ve, "gamma must have shape",
                      lambda: batch_norm_forward(x, np.ones((3, 1)), beta))
    assert_raises_all(COMM, ve, "stats must be", lambda: batch_norm_forward(x, gamma, beta,
                                                                             stats="batch"))
    for p in (1.0, -0.1, 1.5):
        assert_raises_all(COMM, ve, "dropout probability", lambda p=p: dropout_forward(x, p, 0))
    assert_raises_all(COMM, ve, "scale factors", lambda: upsample_forward(x, 0, "nearest"))
    # nothing above left the ranks out of step
    assert_all_ranks(COMM, COMM.allreduce(1) == SIZE, "ranks out of step")


def test_concat_channels_across_grids():
    """Operands on different grids over the same ranks: the output takes the first one's
    grid and distribution, each gradient comes back on its operand's grid."""
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=(2, 2, 6, 5)), rng.normal(size=(2, 3, 6, 5))
    ga = grid((SIZE,))
    gb = grid((2, SIZE // 2)) if SIZE % 2 == 0 else grid((1, SIZE))
    xa = dt.from_global(a, grid=ga, split=(None, None, 0, None))
    xb = dt.from_global(b, grid=gb, split=(0, None, None, 1))
    y, layouts = concat_channels([xa, xb])
    assert_allclose_all(COMM, y.to_numpy(), np.concatenate([a, b], axis=1))
    dy = rng.normal(size=y.shape)
    ga_, gb_ = concat_channels_backward(layouts, like(dy, y))
    assert_all_ranks(COMM, ga_.grid is ga and gb_.grid is gb
                     and gb_.distribution == xb.distribution)
    assert_allclose_all(COMM, ga_.to_numpy(), dy[:, :2])
    assert_allclose_all(COMM, gb_.to_numpy(), dy[:, 2:])


@pytest.mark.skipif(SIZE < 2, reason="needs grids of two shapes")
@guarded
def test_loss_targets_on_another_grid():
    """A target (labels) on a grid of another shape over the same ranks is redistributed to
    the prediction's layout, for MSE and cross-entropy alike."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((SIZE, 3, 4, 5))
    t = rng.standard_normal(a.shape)
    lab = rng.integers(0, 3, (SIZE, 4, 5))
    g1, g2 = grid((SIZE, 1)), grid((1, SIZE))
    x = dt.from_global(a, grid=g1, split=(0, None, 1, None))
    loss, _ = mse_forward(x, dt.from_global(t, grid=g2, split=(None, None, None, 1)))
    close(loss, ((a - t) ** 2).mean(), "mse with the target on another grid")
    ce, _ = cross_entropy_forward(x, dt.from_global(lab, grid=g2, split=(None, 1, None)))
    close(ce, ref.cross_entropy(a, lab), "cross-entropy with labels on another grid")
