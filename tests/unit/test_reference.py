"""Self-checks of the serial NumPy reference (tests/reference.py) that the suite uses as ground
truth: every backward against central differences, forwards against brute-force loops written
per output cell, conv_transpose against the adjoint identity, and small hand-computed cases."""
from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402

RTOL, ATOL = 1e-6, 1e-7          # for central differences (eps 1e-6, float64)


def rng(seed=0):
    return np.random.default_rng(seed)


def close(a, b, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def pairs(padding, nd):
    if np.ndim(padding) == 0:
        return [(padding, padding)] * nd
    return [(p, p) if np.ndim(p) == 0 else tuple(p) for p in padding]


def per_axis(v, nd):
    return (v,) * nd if np.ndim(v) == 0 else tuple(v)


# --------------------------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------------------------

# (x shape, w shape, stride, padding, dilation, groups)
CONV_CASES = [
    ((2, 3, 7), (4, 3, 3), 1, 1, 1, 1),
    ((1, 2, 9), (2, 2, 2), 2, ((1, 0),), 2, 1),                       # even kernel, asym pad
    ((2, 4, 6), (2, 2, 4), 3, ((2, 3),), 1, 2),                       # groups, hi > lo
    ((1, 4, 6, 5), (4, 2, 3, 2), (2, 1), ((0, 2), (1, 1)), (1, 2), 2),
    ((2, 2, 5, 5), (3, 2, 4, 4), 1, 2, 1, 1),                         # even 4x4, pad 2
    ((1, 2, 5, 4, 6), (2, 1, 3, 2, 3), (1, 2, 2), ((1, 0), (0, 1), (2, 1)), (2, 1, 1), 2),
    ((1, 3, 4, 4, 4), (6, 1, 2, 2, 2), 2, 0, 1, 3),                   # depthwise x2
    ((1, 2, 3, 3, 3), (2, 2, 3, 3, 3), 1, (1, 0, 2), 1, 1),           # per-axis symmetric pads
]


def conv_brute(x, w, b, stride, padding, dilation, groups):
    """One output cell at a time, bounds checked explicitly (no padded copy)."""
    nd = x.ndim - 2
    s, d, p = per_axis(stride, nd), per_axis(dilation, nd), pairs(padding, nd)
    n, cin = x.shape[:2]
    cout, cin_g = w.shape[:2]
    cout_g = cout // groups
    K = w.shape[2:]
    O = tuple((x.shape[2 + a] + p[a][0] + p[a][1] - d[a] * (K[a] - 1) - 1) // s[a] + 1
              for a in range(nd))
    y = np.zeros((n, cout) + O)
    for bi, co in itertools.product(range(n), range(cout)):
        g = co // cout_g
        for o in np.ndindex(*O):
            acc = 0.0 if b is None else b[co]
            for c in range(cin_g):
                for k in np.ndindex(*K):
                    i = tuple(o[a] * s[a] + k[a] * d[a] - p[a][0] for a in range(nd))
                    if all(0 <= i[a] < x.shape[2 + a] for a in range(nd)):
                        acc += x[(bi, g * cin_g + c) + i] * w[(co, c) + k]
            y[(bi, co) + o] = acc
    return y


def transpose_output_padding(x_shape, w_shape, stride, padding, dilation):
    """output_padding that makes conv_transpose map conv's output shape back to x_shape."""
    nd = len(x_shape) - 2
    s, d, p = per_axis(stride, nd), per_axis(dilation, nd), pairs(padding, nd)
    return tuple((x_shape[2 + a] + p[a][0] + p[a][1] - d[a] * (w_shape[2 + a] - 1) - 1) % s[a]
                 for a in range(nd))


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_forward_matches_brute_force(case):
    xs, ws, stride, padding, dilation, groups = case
    r = rng(1)
    x, w, b = r.standard_normal(xs), r.standard_normal(ws), r.standard_normal(ws[0])
    y = ref.conv(x, w, b, stride, padding, dilation, groups)
    close(y, conv_brute(x, w, b, stride, padding, dilation, groups), 1e-12, 1e-12)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_backward_numerical(case):
    xs, ws, stride, padding, dilation, groups = case
    r = rng(2)
    x, w, b = r.standard_normal(xs), r.standard_normal(ws), r.standard_normal(ws[0])
    dy = r.standard_normal(ref.conv(x, w, b, stride, padding, dilation, groups).shape)
    dx, dw, db = ref.conv_backward(x, w, dy, stride, padding, dilation, groups)
    f = lambda x_, w_, b_: np.sum(ref.conv(x_, w_, b_, stride, padding, dilation, groups) * dy)
    close(dx, ref.numerical_gradient(lambda v: f(v, w, b), x))
    close(dw, ref.numerical_gradient(lambda v: f(x, v, b), w))
    close(db, ref.numerical_gradient(lambda v: f(x, w, v), b))


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_transpose_is_adjoint_of_conv(case):
    xs, ws, stride, padding, dilation, groups = case
    r = rng(3)
    x, w = r.standard_normal(xs), r.standard_normal(ws)
    y = ref.conv(x, w, None, stride, padding, dilation, groups)
    dy = r.standard_normal(y.shape)
    op = transpose_output_padding(xs, ws, stride, padding, dilation)
    xt = ref.conv_transpose(dy, w, None, stride, padding, op, dilation, groups)
    assert xt.shape == x.shape
    assert math.isclose(np.vdot(y, dy), np.vdot(x, xt), rel_tol=1e-11, abs_tol=1e-11)
    # the two independently written input gradients agree: conv's dx is conv_transpose(dy)
    dx, _, _ = ref.conv_backward(x, w, dy, stride, padding, dilation, groups)
    close(dx, xt, 1e-12, 1e-12)
    # and conv_transpose's input gradient is conv
    dyt, _, _ = ref.conv_transpose_backward(dy, w, x, stride, padding, op, dilation, groups)
    close(dyt, y, 1e-12, 1e-12)


# (y shape, w shape, stride, padding, output_padding, dilation, groups)
CONVT_CASES = [
    ((2, 3, 4), (3, 2, 3), 2, 1, 1, 1, 1),
    ((1, 2, 5), (2, 3, 2), 3, ((0, 2),), 2, 1, 1),
    ((1, 2, 4), (2, 1, 3), 2, ((1, 0),), 1, 1, 1),                  # output_padding > hi
    ((1, 4, 3, 4), (4, 1, 3, 2), (2, 1), ((1, 0), (0, 1)), (1, 0), (1, 2), 2),
    ((1, 2, 3, 2, 3), (2, 2, 2, 3, 2), (2, 1, 2), 0, (1, 0, 0), (1, 2, 1), 1),
]


@pytest.mark.parametrize("case", CONVT_CASES)
def test_conv_transpose_backward_numerical(case):
    ys, ws, stride, padding, opad, dilation, groups = case
    r = rng(4)
    y, w = r.standard_normal(ys), r.standard_normal(ws)
    b = r.standard_normal(ws[1] * groups)
    args = (stride, padding, opad, dilation, groups)
    x = ref.conv_transpose(y, w, b, *args)
    nd = len(ys) - 2
    p, s, d, op = pairs(padding, nd), per_axis(stride, nd), per_axis(dilation, nd), per_axis(opad, nd)
    expect = tuple((ys[2 + a] - 1) * s[a] - p[a][0] - p[a][1] + d[a] * (ws[2 + a] - 1) + 1 + op[a]
                   for a in range(nd))
    assert x.shape == (ys[0], ws[1] * groups) + expect
    dx = r.standard_normal(x.shape)
    dy, dw, db = ref.conv_transpose_backward(y, w, dx, *args)
    f = lambda y_, w_, b_: np.sum(ref.conv_transpose(y_, w_, b_, *args) * dx)
    close(dy, ref.numerical_gradient(lambda v: f(v, w, b), y))
    close(dw, ref.numerical_gradient(lambda v: f(y, v, b), w))
    close(db, ref.numerical_gradient(lambda v: f(y, w, v), b))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_conv_adjoint_random(data):
    nd = data.draw(st.integers(1, 3))
    groups = data.draw(st.integers(1, 2))
    cin_g, cout_g = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    K = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    s = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    d = tuple(data.draw(st.integers(1, 2)) for _ in range(nd))
    p = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in range(nd))
    S = tuple(max(d[a] * (K[a] - 1) + 1 - p[a][0] - p[a][1], 1) + data.draw(st.integers(0, 4))
              for a in range(nd))
    xs, ws = (2, cin_g * groups) + S, (cout_g * groups, cin_g) + K
    r = rng(data.draw(st.integers(0, 2**16)))
    x, w = r.standard_normal(xs), r.standard_normal(ws)
    y = ref.conv(x, w, None, s, p, d, groups)
    dy = r.standard_normal(y.shape)
    op = transpose_output_padding(xs, ws, s, p, d)
    xt = ref.conv_transpose(dy, w, None, s, p, op, d, groups)
    assert xt.shape == xs
    assert math.isclose(np.vdot(y, dy), np.vdot(x, xt), rel_tol=1e-10, abs_tol=1e-10)
    close(y, conv_brute(x, w, None, s, p, d, groups), 1e-12, 1e-12)


def test_conv_identity_1x1():
    x = rng(5).standard_normal((2, 3, 4, 5))
    w = np.eye(3)[:, :, None, None]
    close(ref.conv(x, w), x, 0, 0)


def test_conv_ones_kernel_neighbour_sums():
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    y = ref.conv(x, np.ones((1, 1, 3)), padding=1)
    close(y, [[[3.0, 6.0, 9.0, 7.0]]], 0, 0)
    y = ref.conv(x, np.ones((1, 1, 3)), np.array([10.0]), padding=((0, 1),), stride=2)
    close(y, [[[16.0, 17.0]]], 0, 0)


def test_conv_transpose_hand():
    y = np.array([[[1.0, 2.0]]])
    close(ref.conv_transpose(y, np.ones((1, 1, 3)), stride=2), [[[1.0, 1.0, 3.0, 2.0, 2.0]]], 0, 0)
    close(ref.conv_transpose(y, np.ones((1, 1, 3)), stride=2, padding=1, output_padding=1),
          [[[1.0, 3.0, 2.0, 2.0]]], 0, 0)
    close(ref.conv_transpose(y, np.ones((1, 1, 3)), stride=2, padding=((0, 2),)),
          [[[1.0, 1.0, 3.0]]], 0, 0)


# --------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------

# (x shape, kernel, stride, padding)
POOL_CASES = [
    ((2, 2, 9), 3, 2, 1),
    ((1, 2, 8), 2, None, 0),
    ((1, 1, 7), 3, 1, ((1, 0),)),
    ((1, 2, 6, 7), (2, 3), (1, 2), ((1, 0), (1, 1))),
    ((1, 1, 5, 4, 6), 2, None, 0),
    ((1, 2, 4, 5, 3), 3, (1, 2, 1), 1),
]


def pool_brute(x, mode, kernel, stride, padding, count_include_pad):
    nd = x.ndim - 2
    k = per_axis(kernel, nd)
    s = k if stride is None else per_axis(stride, nd)
    p = pairs(padding, nd)
    O = tuple((x.shape[2 + a] + p[a][0] + p[a][1] - k[a]) // s[a] + 1 for a in range(nd))
    y = np.zeros(x.shape[:2] + O)
    for bc in np.ndindex(*x.shape[:2]):
        for o in np.ndindex(*O):
            vals = []
            for kk in np.ndindex(*k):
                i = tuple(o[a] * s[a] + kk[a] - p[a][0] for a in range(nd))
                if all(0 <= i[a] < x.shape[2 + a] for a in range(nd)):
                    vals.append(x[bc + i])
            if mode == "max":
                y[bc + o] = max(vals)
            else:
                y[bc + o] = sum(vals) / (np.prod(k) if count_include_pad else len(vals))
    return y


def no_ties(shape, seed):
    return rng(seed).permutation(int(np.prod(shape))).reshape(shape) * 0.1 - 1.0


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("mode,cip", [("max", True), ("avg", True), ("avg", False)])
def test_pool_forward_matches_brute_force(case, mode, cip):
    xs, kernel, stride, padding = case
    x = no_ties(xs, 6)
    close(ref.pool(x, mode, kernel, stride, padding, cip),
          pool_brute(x, mode, kernel, stride, padding, cip), 1e-13, 1e-13)


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("mode,cip", [("max", True), ("avg", True), ("avg", False)])
def test_pool_backward_numerical(case, mode, cip):
    xs, kernel, stride, padding = case
    x = no_ties(xs, 7)
    dy = rng(8).standard_normal(ref.pool(x, mode, kernel, stride, padding, cip).shape)
    dx = ref.pool_backward(x, dy, mode, kernel, stride, padding, cip)
    f = lambda v: np.sum(ref.pool(v, mode, kernel, stride, padding, cip) * dy)
    close(dx, ref.numerical_gradient(f, x))


def test_avg_pool_ramp():
    x = np.arange(8.0)[None, None]
    close(ref.pool(x, "avg", 2), [[[0.5, 2.5, 4.5, 6.5]]], 0, 0)
    x = np.arange(4.0)[None, None]
    close(ref.pool(x, "avg", 3, 1, 1, True), [[[1 / 3, 1.0, 2.0, 5 / 3]]], 1e-15, 0)
    close(ref.pool(x, "avg", 3, 1, 1, False), [[[0.5, 1.0, 2.0, 2.5]]], 1e-15, 0)


def test_max_pool_ties_nan_and_overlap():
    # ties: the first maximal element of the window (row-major) takes the gradient
    x = np.array([[[[1.0, 3.0], [3.0, 2.0]]]])
    close(ref.pool_backward(x, np.ones((1, 1, 1, 1)), "max", 2), [[[[0, 1.0], [0, 0]]]], 0, 0)
    # NaN counts as the maximum; the first NaN wins
    x = np.array([[[1.0, np.nan, 5.0, np.nan]]])
    y = ref.pool(x, "max", 4)
    assert np.isnan(y).all()
    close(ref.pool_backward(x, np.array([[[2.0]]]), "max", 4), [[[0, 2.0, 0, 0]]], 0, 0)
    # overlapping windows add their gradients; padding never wins (even against -inf)
    x = np.array([[[0.0, 5.0, 1.0, -np.inf]]])
    close(ref.pool_backward(x, np.array([[[1.0, 2.0, 4.0]]]), "max", 3, 1, ((1, 0),)),
          [[[0, 7.0, 0, 0]]], 0, 0)
    x = np.array([[[-np.inf, -np.inf, 2.0]]])
    close(ref.pool(x, "max", 2, 1, 1), [[[-np.inf, -np.inf, 2.0, 2.0]]], 0, 0)
    close(ref.pool_backward(x, np.array([[[1.0, 2.0, 4.0, 8.0]]]), "max", 2, 1, 1),
          [[[3.0, 0, 12.0]]], 0, 0)


# --------------------------------------------------------------------------------------------
# upsampling
# --------------------------------------------------------------------------------------------

def test_upsample_hand():
    x = np.array([[[1.0, 2.0]]])
    close(ref.upsample(x, 3, "nearest"), [[[1, 1, 1, 2, 2, 2.0]]], 0, 0)
    close(ref.upsample(np.array([[[0.0, 1.0]]]), 2, "linear"), [[[0, 0.25, 0.75, 1.0]]], 0, 0)
    # 2-D bilinear is the outer product of the 1-D weights
    x = np.array([[[[0.0, 1.0], [2.0, 3.0]]]])
    y = ref.upsample(x, 2, "linear")
    r, c = np.array([0, 0.25, 0.75, 1.0]), np.array([0, 0.25, 0.75, 1.0])
    close(y[0, 0], 2 * r[:, None] + c[None, :], 1e-15, 1e-15)
    close(ref.upsample(np.arange(4.0).reshape(1, 1, 2, 2), (1, 2), "nearest")[0, 0],
          [[0, 0, 1, 1], [2, 2, 3, 3.0]], 0, 0)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("shape,scale", [((2, 2, 5), 3), ((1, 2, 3, 4), (2, 3)),
                                         ((1, 1, 3, 2, 4), (2, 1, 3))])
def test_upsample_backward(mode, shape, scale):
    r = rng(9)
    x = r.standard_normal(shape)
    y = ref.upsample(x, scale, mode)
    dy = r.standard_normal(y.shape)
    dx = ref.upsample_backward(dy, shape, scale, mode)
    close(dx, ref.numerical_gradient(lambda v: np.sum(ref.upsample(v, scale, mode) * dy), x))
    assert math.isclose(np.vdot(y, dy), np.vdot(x, dx), rel_tol=1e-12)


# --------------------------------------------------------------------------------------------
# batch norm
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3, 5), (2, 2, 3, 4), (2, 3, 2, 3, 2)])
def test_batch_norm_train(shape):
    r = rng(10)
    x = r.standard_normal(shape) * 3 + 1
    gamma, beta = r.standard_normal(shape[1]), r.standard_normal(shape[1])
    axes = (0,) + tuple(range(2, len(shape)))
    y0, mean, vb, vu = ref.batch_norm_train(x, np.ones(shape[1]), np.zeros(shape[1]))
    close(y0.mean(axis=axes), 0, 0, 1e-12)
    close(y0.var(axis=axes), vb / (vb + 1e-5), 1e-12, 0)
    close(y0.var(axis=axes), 1, 0, 1e-4)
    close(mean, x.mean(axis=axes), 1e-13, 0)
    close(vb, x.var(axis=axes), 1e-13, 0)
    close(vu, x.var(axis=axes, ddof=1), 1e-13, 0)
    y, _, _, _ = ref.batch_norm_train(x, gamma, beta)
    c = (1, -1) + (1,) * (len(shape) - 2)
    close(y, y0 * gamma.reshape(c) + beta.reshape(c), 1e-13, 1e-13)
    # eval with the batch's own statistics reproduces the training output
    close(ref.batch_norm_eval(x, mean, vb, gamma, beta), y, 1e-13, 1e-13)

    dy = r.standard_normal(shape)
    dx, dg, db = ref.batch_norm_train_backward(x, gamma, dy)
    f = lambda x_, g_, b_: np.sum(ref.batch_norm_train(x_, g_, b_)[0] * dy)
    close(dx, ref.numerical_gradient(lambda v: f(v, gamma, beta), x), 1e-5, 1e-6)
    close(dg, ref.numerical_gradient(lambda v: f(x, v, beta), gamma))
    close(db, ref.numerical_gradient(lambda v: f(x, gamma, v), beta))


def test_batch_norm_eval_hand():
    x = np.array([[[1.0, 3.0], [0.0, 4.0]]])
    y = ref.batch_norm_eval(x, [1.0, 2.0], [4.0, 1.0], [2.0, 1.0], [0.5, -1.0], eps=0.0)
    close(y, [[[0.5, 2.5], [-3.0, 1.0]]], 1e-15, 0)


# --------------------------------------------------------------------------------------------
# activations, softmax, losses, dense
# --------------------------------------------------------------------------------------------

ACTS = [("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("elu", None),
        ("elu", 0.7), ("sigmoid", None), ("tanh", None)]


@pytest.mark.parametrize("name,alpha", ACTS)
def test_activation_backward_numerical(name, alpha):
    r = rng(11)
    x = r.standard_normal((2, 3, 4, 5))
    x[np.abs(x) < 1e-3] = 0.5          # stay away from the kinks
    dy = r.standard_normal(x.shape)
    dx = ref.activation_backward(name, x, dy, alpha)
    f = lambda v: np.sum(ref.activation(name, v, alpha) * dy)
    close(dx, ref.numerical_gradient(f, x))


def test_activation_values_and_kinks():
    x = np.array([-2.0, 0.0, 3.0])
    one = np.ones(3)
    close(ref.activation("relu", x), [0, 0, 3.0], 0, 0)
    close(ref.activation("leaky_relu", x), [-0.02, 0, 3.0], 1e-15, 0)
    close(ref.activation("elu", x, 0.5), [0.5 * (np.exp(-2) - 1), 0, 3.0], 1e-15, 0)
    close(ref.activation("sigmoid", np.array([0.0, -800.0, 800.0])), [0.5, 0, 1.0], 0, 0)
    close(ref.activation("tanh", x), np.tanh(x), 0, 0)
    # torch conventions at 0
    close(ref.activation_backward("relu", x, one), [0, 0, 1.0], 0, 0)
    close(ref.activation_backward("leaky_relu", x, one), [0.01, 0.01, 1.0], 0, 0)
    close(ref.activation_backward("elu", x, one, 0.5), [0.5 * np.exp(-2), 0.5, 1.0], 1e-15, 0)


def test_softmax():
    r = rng(12)
    x = r.standard_normal((2, 4, 3, 3)) * 5
    y = ref.softmax(x)
    close(y.sum(axis=1), 1, 0, 1e-14)
    assert (y > 0).all()
    close(ref.softmax(x + 1000.0), y, 1e-12, 1e-15)           # shift invariant, no overflow
    close(ref.softmax(x, axis=-1).sum(axis=-1), 1, 0, 1e-14)
    for axis in (1, -1):
        dy = r.standard_normal(x.shape)
        dx = ref.softmax_backward(ref.softmax(x, axis), dy, axis)
        f = lambda v: np.sum(ref.softmax(v, axis) * dy)
        close(dx, ref.numerical_gradient(f, x))


@pytest.mark.parametrize("shape", [(5, 3), (2, 4, 3), (2, 3, 2, 3), (1, 2, 2, 3, 2)])
def test_cross_entropy(shape):
    r = rng(13)
    n, c, sp = shape[0], shape[1], shape[2:]
    labels = r.integers(0, c, (n,) + sp)
    assert math.isclose(ref.cross_entropy(np.zeros(shape), labels), math.log(c), rel_tol=1e-14)
    assert math.isclose(ref.cross_entropy(np.full(shape, 7.0), labels), math.log(c), rel_tol=1e-14)
    z = r.standard_normal(shape) * 3
    brute = 0.0
    for i in np.ndindex(*labels.shape):
        col = z[(i[0], slice(None)) + i[1:]]
        brute -= math.log(math.exp(col[labels[i]]) / sum(math.exp(v) for v in col))
    assert math.isclose(ref.cross_entropy(z, labels), brute / labels.size, rel_tol=1e-12)
    g = ref.cross_entropy_backward(z, labels)
    close(g, ref.numerical_gradient(lambda v: ref.cross_entropy(v, labels), z))
    # stable for huge logits
    big = np.zeros(shape)
    np.put_along_axis(big, labels[:, None], 1e4, axis=1)
    assert ref.cross_entropy(big, labels) == 0.0
    assert math.isclose(ref.cross_entropy(-big, labels), 1e4 + math.log(c - 1), rel_tol=1e-14)


def test_mse_and_dense():
    r = rng(14)
    x, t = r.standard_normal((3, 4, 5)), r.standard_normal((3, 4, 5))
    assert math.isclose(ref.mse(x, t), float(np.sum((x - t) ** 2)) / x.size, rel_tol=1e-14)
    assert ref.mse(x, x) == 0.0
    close(ref.mse_backward(x, t), ref.numerical_gradient(lambda v: ref.mse(v, t), x))

    x, w, b = r.standard_normal((4, 5)), r.standard_normal((3, 5)), r.standard_normal(3)
    y = ref.dense(x, w, b)
    close(y, [[sum(x[i, f] * w[o, f] for f in range(5)) + b[o] for o in range(3)]
              for i in range(4)], 1e-13, 1e-13)
    close(ref.dense(x, w), y - b, 1e-13, 1e-13)
    dy = r.standard_normal(y.shape)
    dx, dw, db = ref.dense_backward(x, w, dy)
    f = lambda x_, w_, b_: np.sum(ref.dense(x_, w_, b_) * dy)
    close(dx, ref.numerical_gradient(lambda v: f(v, w, b), x))
    close(dw, ref.numerical_gradient(lambda v: f(x, v, b), w))
    close(db, ref.numerical_gradient(lambda v: f(x, w, v), b))


def test_numerical_gradient_itself():
    x = np.array([[1.0, -2.0], [0.5, 3.0]])
    keep = x.copy()
    g = ref.numerical_gradient(lambda v: np.sum(v ** 3), x)
    close(g, 3 * x ** 2, 1e-8, 1e-8)
    np.testing.assert_array_equal(x, keep)


def test_float64_everywhere():
    x = np.ones((1, 2, 4, 4), np.float32)
    w = np.ones((2, 2, 3, 3), np.float32)
    assert ref.conv(x, w, padding=1).dtype == np.float64
    assert ref.pool(x, "max", 2).dtype == np.float64
    assert ref.upsample(x, 2, "linear").dtype == np.float64
    assert ref.conv_transpose(x, w).dtype == np.float64
    assert ref.batch_norm_train(x, np.ones(2), np.zeros(2))[0].dtype == np.float64
    assert ref.softmax(x).dtype == np.float64
