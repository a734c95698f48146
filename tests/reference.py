"""Serial float64 NumPy reference of CNN ops, with PyTorch semantics.

This module is the ground truth the test suite compares distributed and kernel implementations
against, so it is written to be obviously correct rather than fast: every op is a plain loop
over kernel (or window) offsets, vectorised with NumPy over the batch, channel and output axes.
Backward passes are written out directly (scatter loops for input gradients, correlations for
weight gradients); none of them reuses a forward op with flipped kernels, so each is an
independent check of the other.

Layout is (N, C, *spatial) with 1, 2 or 3 spatial axes (``x.ndim - 2``). Every function takes
and returns float64 arrays. Per-axis arguments (stride, dilation, kernel, scale, ...) accept an
int or one value per spatial axis. ``padding`` accepts an int, a tuple of ints (symmetric, one
per axis) or a tuple of ``(lo, hi)`` pairs (asymmetric, one per axis).
"""
from __future__ import annotations

import itertools

import numpy as np

__all__ = [
    "conv", "conv_backward", "conv_transpose", "conv_transpose_backward",
    "pool", "pool_backward", "upsample", "upsample_backward",
    "batch_norm_train", "batch_norm_train_backward", "batch_norm_eval",
    "activation", "activation_backward", "softmax", "softmax_backward",
    "cross_entropy", "cross_entropy_backward", "mse", "mse_backward",
    "dense", "dense_backward", "numerical_gradient",
]


# --------------------------------------------------------------------------------------------
# argument helpers
# --------------------------------------------------------------------------------------------

def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _per_axis(v, nd, name):
    """An int or a length-nd sequence of ints -> tuple of nd ints."""
    if np.ndim(v) == 0:
        return (int(v),) * nd
    t = tuple(int(e) for e in v)
    if len(t) != nd:
        raise ValueError(f"{name}={v!r} needs one value per spatial axis ({nd})")
    return t


def _pads(padding, nd):
    """int | tuple of ints | tuple of (lo, hi) pairs -> tuple of nd (lo, hi) pairs."""
    if np.ndim(padding) == 0:
        p = int(padding)
        return ((p, p),) * nd
    items = list(padding)
    if len(items) != nd:
        raise ValueError(f"padding={padding!r} needs one entry per spatial axis ({nd})")
    out = []
    for e in items:
        if np.ndim(e) == 0:
            out.append((int(e), int(e)))
        else:
            lo, hi = e
            out.append((int(lo), int(hi)))
    return tuple(out)


def _strided(start, count, step):
    """Slice picking `count` cells start, start+step, ..."""
    return slice(start, start + step * (count - 1) + 1, step)


def _window_slices(offset, stride, dilation, out_shape):
    """Per spatial axis, the slice of the (padded) input that kernel offset `offset` touches
    for all outputs: cells o*stride + offset*dilation, o = 0 .. out-1."""
    return tuple(_strided(k * d, o, s) for k, s, d, o in zip(offset, stride, dilation, out_shape))


def _out_extent(n, lo, hi, k, s, d):
    return (n + lo + hi - d * (k - 1) - 1) // s + 1


def _channel_products(a, b):
    """(N, A, *S), (N, B, *S) -> (A, B): sum over batch and spatial cells of a[:, i] * b[:, j]."""
    axes = (0,) + tuple(range(2, a.ndim))
    return np.tensordot(a, b, axes=(axes, axes))


def _spatial_sum(a):
    """Sum over every axis but 1 (the channel axis)."""
    return a.sum(axis=(0,) + tuple(range(2, a.ndim)))


# --------------------------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------------------------

def _conv_geometry(x_shape, w_shape, stride, padding, dilation, groups):
    nd = len(x_shape) - 2
    if len(w_shape) != nd + 2:
        raise ValueError(f"weight rank {len(w_shape)} does not match input rank {len(x_shape)}")
    stride = _per_axis(stride, nd, "stride")
    dilation = _per_axis(dilation, nd, "dilation")
    pads = _pads(padding, nd)
    cin, cout = x_shape[1], w_shape[0]
    if cin % groups or cout % groups or w_shape[1] != cin // groups:
        raise ValueError(f"channels: x {x_shape}, w {w_shape}, groups {groups}")
    ksize = tuple(w_shape[2:])
    out = tuple(_out_extent(n, lo, hi, k, s, d)
                for n, (lo, hi), k, s, d in zip(x_shape[2:], pads, ksize, stride, dilation))
    if any(o <= 0 for o in out):
        raise ValueError(f"empty output {out}")
    return nd, stride, dilation, pads, ksize, out


def conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Cross-correlation as torch.nn.functional.conv{1,2,3}d (zero padding).

    x (N, Cin, *S), w (Cout, Cin//groups, *K), b (Cout,) or None -> y (N, Cout, *O)."""
    x, w = _f64(x), _f64(w)
    nd, stride, dilation, pads, ksize, out = _conv_geometry(
        x.shape, w.shape, stride, padding, dilation, groups)
    n, cin = x.shape[:2]
    cout = w.shape[0]
    cin_g, cout_g = cin // groups, cout // groups
    xp = np.pad(x, ((0, 0), (0, 0)) + pads)
    y = np.zeros((n, cout) + out)
    for k in itertools.product(*(range(kk) for kk in ksize)):
        cells = _window_slices(k, stride, dilation, out)       # input cells o*stride + k*dil
        for g in range(groups):
            ci = slice(g * cin_g, (g + 1) * cin_g)
            co = slice(g * cout_g, (g + 1) * cout_g)
            wk = w[(co, slice(None)) + k]                      # (cout_g, cin_g)
            y[:, co] += np.einsum("nc...,oc->no...", xp[(slice(None), ci) + cells], wk)
    if b is not None:
        y += _f64(b).reshape((1, cout) + (1,) * nd)
    return y


def conv_backward(x, w, dy, stride=1, padding=0, dilation=1, groups=1):
    """Gradients (dx, dw, db) of sum(conv(x, w, b) * dy) with respect to x, w and b."""
    x, w, dy = _f64(x), _f64(w), _f64(dy)
    nd, stride, dilation, pads, ksize, out = _conv_geometry(
        x.shape, w.shape, stride, padding, dilation, groups)
    n, cin = x.shape[:2]
    cout = w.shape[0]
    if dy.shape != (n, cout) + out:
        raise ValueError(f"dy shape {dy.shape} != output shape {(n, cout) + out}")
    cin_g, cout_g = cin // groups, cout // groups
    xp = np.pad(x, ((0, 0), (0, 0)) + pads)
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    for k in itertools.product(*(range(kk) for kk in ksize)):
        cells = _window_slices(k, stride, dilation, out)       # input cells o*stride + k*dil
        for g in range(groups):
            ci = slice(g * cin_g, (g + 1) * cin_g)
            co = slice(g * cout_g, (g + 1) * cout_g)
            wk = w[(co, slice(None)) + k]                      # (cout_g, cin_g)
            # dx: every output o scatters dy[o] * w[k] back onto input cell o*stride + k*dil
            dxp[(slice(None), ci) + cells] += np.einsum("no...,oc->nc...", dy[:, co], wk)
            # dw[k]: correlation of the input cells under offset k with dy
            dw[(co, slice(None)) + k] = _channel_products(dy[:, co], xp[(slice(None), ci) + cells])
    crop = (slice(None), slice(None)) + tuple(slice(lo, lo + s) for (lo, _), s in zip(pads, x.shape[2:]))
    dx = dxp[crop].copy()
    db = _spatial_sum(dy)
    return dx, dw, db


def _conv_transpose_geometry(y_shape, w_shape, stride, padding, output_padding, dilation, groups):
    nd = len(y_shape) - 2
    if len(w_shape) != nd + 2:
        raise ValueError(f"weight rank {len(w_shape)} does not match input rank {len(y_shape)}")
    stride = _per_axis(stride, nd, "stride")
    dilation = _per_axis(dilation, nd, "dilation")
    opad = _per_axis(output_padding, nd, "output_padding")
    pads = _pads(padding, nd)
    cin = y_shape[1]
    if w_shape[0] != cin or cin % groups:
        raise ValueError(f"channels: y {y_shape}, w {w_shape}, groups {groups}")
    cout = w_shape[1] * groups
    ksize = tuple(w_shape[2:])
    # full: extent of the uncropped scatter; out: extent kept after cropping lo from the start
    full = tuple((m - 1) * s + d * (k - 1) + 1
                 for m, k, s, d in zip(y_shape[2:], ksize, stride, dilation))
    out = tuple(f - lo - hi + op for f, (lo, hi), op in zip(full, pads, opad))
    if any(o <= 0 for o in out):
        raise ValueError(f"empty output {out}")
    # buffer: big enough for the scatter and for the cropped window (output_padding may reach
    # past the scatter's end when hi < output_padding; those cells stay zero)
    buf = tuple(max(f, lo + o) for f, (lo, _), o in zip(full, pads, out))
    return nd, stride, dilation, pads, ksize, cout, out, buf


def conv_transpose(y, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """Transposed convolution as torch.nn.functional.conv_transpose{1,2,3}d.

    y (N, Cin, *M), w (Cin, Cout//groups, *K), b (Cout,) or None -> x (N, Cout, *O) with
    O = (M-1)*stride - lo - hi + dilation*(K-1) + 1 + output_padding per axis. Explicit scatter:
    buffer[o*stride + k*dilation] += y[o] * w[k], then crop lo from the start, keep O cells."""
    y, w = _f64(y), _f64(w)
    nd, stride, dilation, pads, ksize, cout, out, buf = _conv_transpose_geometry(
        y.shape, w.shape, stride, padding, output_padding, dilation, groups)
    n, cin = y.shape[:2]
    m = y.shape[2:]
    cin_g, cout_g = cin // groups, cout // groups
    xb = np.zeros((n, cout) + buf)
    for k in itertools.product(*(range(kk) for kk in ksize)):
        cells = _window_slices(k, stride, dilation, m)         # output cells o*stride + k*dil
        for g in range(groups):
            ci = slice(g * cin_g, (g + 1) * cin_g)
            co = slice(g * cout_g, (g + 1) * cout_g)
            wk = w[(ci, slice(None)) + k]                      # (cin_g, cout_g)
            xb[(slice(None), co) + cells] += np.einsum("ni...,io->no...", y[:, ci], wk)
    crop = (slice(None), slice(None)) + tuple(slice(lo, lo + o) for (lo, _), o in zip(pads, out))
    x = xb[crop].copy()
    if b is not None:
        x += _f64(b).reshape((1, cout) + (1,) * nd)
    return x


def conv_transpose_backward(y, w, dx, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """Gradients (dy, dw, db) of sum(conv_transpose(y, w, b) * dx) w.r.t. y, w and b."""
    y, w, dx = _f64(y), _f64(w), _f64(dx)
    nd, stride, dilation, pads, ksize, cout, out, buf = _conv_transpose_geometry(
        y.shape, w.shape, stride, padding, output_padding, dilation, groups)
    n, cin = y.shape[:2]
    m = y.shape[2:]
    if dx.shape != (n, cout) + out:
        raise ValueError(f"dx shape {dx.shape} != output shape {(n, cout) + out}")
    cin_g, cout_g = cin // groups, cout // groups
    # place dx where the forward's crop took the output from; cropped-away cells get zero grad
    dxb = np.zeros((n, cout) + buf)
    dxb[(slice(None), slice(None)) + tuple(slice(lo, lo + o) for (lo, _), o in zip(pads, out))] = dx
    dy = np.zeros_like(y)
    dw = np.zeros_like(w)
    for k in itertools.product(*(range(kk) for kk in ksize)):
        cells = _window_slices(k, stride, dilation, m)         # output cells o*stride + k*dil
        for g in range(groups):
            ci = slice(g * cin_g, (g + 1) * cin_g)
            co = slice(g * cout_g, (g + 1) * cout_g)
            wk = w[(ci, slice(None)) + k]                      # (cin_g, cout_g)
            g_at = dxb[(slice(None), co) + cells]              # (N, cout_g, *M)
            dy[:, ci] += np.einsum("no...,io->ni...", g_at, wk)
            dw[(ci, slice(None)) + k] = _channel_products(y[:, ci], g_at)
    db = _spatial_sum(dx)
    return dy, dw, db


# --------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------

def _pool_geometry(x_shape, kernel, stride, padding):
    nd = len(x_shape) - 2
    kernel = _per_axis(kernel, nd, "kernel")
    stride = kernel if stride is None else _per_axis(stride, nd, "stride")
    pads = _pads(padding, nd)
    out = tuple(_out_extent(n, lo, hi, k, s, 1)
                for n, (lo, hi), k, s in zip(x_shape[2:], pads, kernel, stride))
    if any(o <= 0 for o in out):
        raise ValueError(f"empty output {out}")
    return nd, kernel, stride, pads, out


def _max_pool_choice(x, kernel, stride, pads, out):
    """Max over each window and which window offset (row-major index) holds it.

    Only real (non-padding) cells compete, as in torch; the first real cell of the window
    starts as the best, a later cell replaces it only when strictly greater, and a NaN beats
    any non-NaN (the first NaN of the window wins). idx is -1 for an all-padding window.

    Note: torch's scalar CPU/CUDA loops test ``val > maxval || isnan(val)``, so there every NaN
    overwrites and the *last* NaN of a window takes the gradient; this reference follows the
    project's choice (first NaN). The forward value (NaN) is the same either way."""
    xp = np.pad(x, ((0, 0), (0, 0)) + pads)
    real = np.pad(np.ones(x.shape, bool), ((0, 0), (0, 0)) + pads, constant_values=False)
    best = np.full(x.shape[:2] + out, -np.inf)
    idx = np.full(x.shape[:2] + out, -1, dtype=np.int64)
    for t, k in enumerate(itertools.product(*(range(kk) for kk in kernel))):
        win = (slice(None), slice(None)) + _window_slices(k, stride, (1,) * len(k), out)
        v, ok = xp[win], real[win]
        beats = (v > best) | (np.isnan(v) & ~np.isnan(best))
        take = ok & ((idx < 0) | beats)
        best = np.where(take, v, best)
        idx = np.where(take, t, idx)
    return best, idx


def pool(x, mode, kernel, stride=None, padding=0, count_include_pad=True):
    """max_pool / avg_pool as torch (ceil_mode=False, dilation 1). stride None -> kernel.

    'avg' with count_include_pad=True divides by prod(kernel), else by the number of
    non-padding cells in the window."""
    x = _f64(x)
    nd, kernel, stride, pads, out = _pool_geometry(x.shape, kernel, stride, padding)
    if mode == "max":
        y, _ = _max_pool_choice(x, kernel, stride, pads, out)
        return y
    if mode != "avg":
        raise ValueError(f"unknown pool mode {mode!r}")
    xp = np.pad(x, ((0, 0), (0, 0)) + pads)
    real = np.pad(np.ones(x.shape[2:]), pads)
    total = np.zeros(x.shape[:2] + out)
    count = np.zeros(out)
    for k in itertools.product(*(range(kk) for kk in kernel)):
        sl = _window_slices(k, stride, (1,) * nd, out)
        total += xp[(slice(None), slice(None)) + sl]
        count += real[sl]
    divisor = float(np.prod(kernel)) if count_include_pad else count
    return total / divisor


def pool_backward(x, dy, mode, kernel, stride=None, padding=0, count_include_pad=True):
    """Gradient of sum(pool(x) * dy) w.r.t. x. Max routes each output's gradient to the first
    maximal real cell of its window (row-major window order; first NaN wins); overlapping
    windows add."""
    x, dy = _f64(x), _f64(dy)
    nd, kernel, stride, pads, out = _pool_geometry(x.shape, kernel, stride, padding)
    if dy.shape != x.shape[:2] + out:
        raise ValueError(f"dy shape {dy.shape} != output shape {x.shape[:2] + out}")
    dxp = np.zeros(x.shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[2:], pads)))
    offsets = list(itertools.product(*(range(kk) for kk in kernel)))
    if mode == "max":
        _, idx = _max_pool_choice(x, kernel, stride, pads, out)
        for t, k in enumerate(offsets):
            win = (slice(None), slice(None)) + _window_slices(k, stride, (1,) * nd, out)
            dxp[win] += np.where(idx == t, dy, 0.0)
    elif mode == "avg":
        if count_include_pad:
            g = dy / float(np.prod(kernel))
        else:
            real = np.pad(np.ones(x.shape[2:]), pads)
            count = np.zeros(out)
            for k in offsets:
                count += real[_window_slices(k, stride, (1,) * nd, out)]
            g = dy / count
        for k in offsets:
            win = (slice(None), slice(None)) + _window_slices(k, stride, (1,) * nd, out)
            dxp[win] += g
    else:
        raise ValueError(f"unknown pool mode {mode!r}")
    crop = (slice(None), slice(None)) + tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, x.shape[2:]))
    return dxp[crop].copy()


# --------------------------------------------------------------------------------------------
# upsampling
# --------------------------------------------------------------------------------------------

def _linear_taps(n, scale):
    """torch align_corners=False source taps for an axis of n cells upsampled by `scale`:
    out o reads (1-lam)*in[i0] + lam*in[i1]."""
    o = np.arange(n * scale)
    src = np.maximum((o + 0.5) / scale - 0.5, 0.0)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, n - 1)
    lam = src - i0
    return i0, i1, lam


def _bshape(lam, axis, ndim):
    shape = [1] * ndim
    shape[axis] = lam.size
    return lam.reshape(shape)


def upsample(x, scale, mode):
    """Integer-factor upsampling of the spatial axes. 'nearest': out o takes in o//scale.
    'linear': (bi/tri)linear with align_corners=False as torch, separable per axis."""
    x = _f64(x)
    nd = x.ndim - 2
    scale = _per_axis(scale, nd, "scale")
    y = x
    for a, s in enumerate(scale):
        axis = a + 2
        n = y.shape[axis]
        if mode == "nearest":
            y = np.take(y, np.arange(n * s) // s, axis=axis)
        elif mode == "linear":
            i0, i1, lam = _linear_taps(n, s)
            lam = _bshape(lam, axis, y.ndim)
            y = (1.0 - lam) * np.take(y, i0, axis=axis) + lam * np.take(y, i1, axis=axis)
        else:
            raise ValueError(f"unknown upsample mode {mode!r}")
    return y


def upsample_backward(dy, in_shape, scale, mode):
    """Adjoint of upsample: gradient of sum(upsample(x) * dy) w.r.t. x of shape in_shape."""
    dy = _f64(dy)
    in_shape = tuple(in_shape)
    nd = len(in_shape) - 2
    scale = _per_axis(scale, nd, "scale")
    expect = in_shape[:2] + tuple(n * s for n, s in zip(in_shape[2:], scale))
    if dy.shape != expect:
        raise ValueError(f"dy shape {dy.shape} != upsampled shape {expect}")
    g = dy
    for a in reversed(range(nd)):
        axis, s, n = a + 2, scale[a], in_shape[a + 2]
        shape = list(g.shape)
        shape[axis] = n
        acc = np.zeros(shape)
        # move the axis to the front so np.add.at scatters along it
        acc_f = np.moveaxis(acc, axis, 0)
        g_f = np.moveaxis(g, axis, 0)
        if mode == "nearest":
            np.add.at(acc_f, np.arange(n * s) // s, g_f)
        elif mode == "linear":
            i0, i1, lam = _linear_taps(n, s)
            lam = lam.reshape((-1,) + (1,) * (g_f.ndim - 1))
            np.add.at(acc_f, i0, (1.0 - lam) * g_f)
            np.add.at(acc_f, i1, lam * g_f)
        else:
            raise ValueError(f"unknown upsample mode {mode!r}")
        g = acc
    return g


# --------------------------------------------------------------------------------------------
# batch norm
# --------------------------------------------------------------------------------------------

def _chan(v, ndim):
    """(C,) -> (1, C, 1, ...) for broadcasting against (N, C, *S)."""
    return _f64(v).reshape((1, -1) + (1,) * (ndim - 2))


def _stat_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def batch_norm_train(x, gamma, beta, eps=1e-5):
    """Training-mode batch norm, statistics per channel over N and the spatial axes.

    Returns (y, mean, var_biased, var_unbiased); y = (x-mean)/sqrt(var_biased+eps)*gamma+beta."""
    x = _f64(x)
    axes = _stat_axes(x)
    count = x.size // x.shape[1]
    mean = x.mean(axis=axes)
    var_b = ((x - _chan(mean, x.ndim)) ** 2).mean(axis=axes)
    var_u = var_b * count / (count - 1) if count > 1 else np.full_like(var_b, np.nan)
    xhat = (x - _chan(mean, x.ndim)) / np.sqrt(_chan(var_b, x.ndim) + eps)
    y = xhat * _chan(gamma, x.ndim) + _chan(beta, x.ndim)
    return y, mean, var_b, var_u


def batch_norm_train_backward(x, gamma, dy, eps=1e-5):
    """Gradients (dx, dgamma, dbeta) of sum(batch_norm_train(x, gamma, beta)[0] * dy)."""
    x, dy = _f64(x), _f64(dy)
    axes = _stat_axes(x)
    m = x.size // x.shape[1]
    mean = x.mean(axis=axes)
    var_b = ((x - _chan(mean, x.ndim)) ** 2).mean(axis=axes)
    invstd = 1.0 / np.sqrt(var_b + eps)
    xhat = (x - _chan(mean, x.ndim)) * _chan(invstd, x.ndim)
    dbeta = dy.sum(axis=axes)
    dgamma = (dy * xhat).sum(axis=axes)
    # d/dx of xhat through mean and variance:
    # dx = gamma*invstd/m * (m*dy - sum(dy) - xhat*sum(dy*xhat))
    dx = (_chan(_f64(gamma) * invstd, x.ndim) / m) * (
        m * dy - _chan(dbeta, x.ndim) - xhat * _chan(dgamma, x.ndim))
    return dx, dgamma, dbeta


def batch_norm_eval(x, running_mean, running_var, gamma, beta, eps=1e-5):
    """Inference-mode batch norm with the given running statistics."""
    x = _f64(x)
    return ((x - _chan(running_mean, x.ndim)) / np.sqrt(_chan(running_var, x.ndim) + eps)
            * _chan(gamma, x.ndim) + _chan(beta, x.ndim))


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------

_ALPHA_DEFAULT = {"leaky_relu": 0.01, "elu": 1.0}


def _sigmoid(x):
    # exp of a non-positive number only: no overflow
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def activation(name, x, alpha=None):
    """relu, leaky_relu (alpha 0.01), elu (alpha 1.0), sigmoid, tanh; elementwise."""
    x = _f64(x)
    if alpha is None:
        alpha = _ALPHA_DEFAULT.get(name)
    if name == "relu":
        return np.where(x > 0, x, 0.0)
    if name == "leaky_relu":
        return np.where(x > 0, x, alpha * x)
    if name == "elu":
        return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0)))
    if name == "sigmoid":
        return _sigmoid(x)
    if name == "tanh":
        return np.tanh(x)
    raise ValueError(f"unknown activation {name!r}")


def activation_backward(name, x, dy, alpha=None):
    """dy * activation'(x), torch conventions at 0: relu' = (x>0), leaky_relu' = 1 if x>0 else
    alpha, elu' = 1 if x>0 else alpha*exp(x)."""
    x, dy = _f64(x), _f64(dy)
    if alpha is None:
        alpha = _ALPHA_DEFAULT.get(name)
    if name == "relu":
        return np.where(x > 0, dy, 0.0)
    if name == "leaky_relu":
        return np.where(x > 0, dy, alpha * dy)
    if name == "elu":
        return np.where(x > 0, dy, alpha * np.exp(np.minimum(x, 0.0)) * dy)
    if name == "sigmoid":
        s = _sigmoid(x)
        return dy * s * (1.0 - s)
    if name == "tanh":
        t = np.tanh(x)
        return dy * (1.0 - t * t)
    raise ValueError(f"unknown activation {name!r}")


# --------------------------------------------------------------------------------------------
# softmax and losses
# --------------------------------------------------------------------------------------------

def softmax(x, axis=1):
    x = _f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_backward(y, dy, axis=1):
    """Gradient w.r.t. the softmax input, given the softmax output y and upstream dy."""
    y, dy = _f64(y), _f64(dy)
    return y * (dy - (y * dy).sum(axis=axis, keepdims=True))


def _log_softmax(z, axis=1):
    shifted = z - z.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _check_labels(logits, labels):
    labels = np.asarray(labels)
    if labels.shape != (logits.shape[0],) + logits.shape[2:]:
        raise ValueError(f"labels shape {labels.shape} does not match logits {logits.shape}")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= logits.shape[1]):
        raise ValueError("labels out of range [0, C)")
    return labels


def cross_entropy(logits, labels):
    """Mean over the N*prod(S) voxels of -log softmax(logits, axis=1)[label]."""
    z = _f64(logits)
    labels = _check_labels(z, labels)
    lsm = _log_softmax(z, axis=1)
    picked = np.take_along_axis(lsm, labels[:, None], axis=1)
    return float(-picked.mean())


def cross_entropy_backward(logits, labels):
    """d cross_entropy / d logits = (softmax(logits) - onehot(labels)) / (N*prod(S))."""
    z = _f64(logits)
    labels = _check_labels(z, labels)
    g = softmax(z, axis=1)
    onehot = np.zeros_like(g)
    np.put_along_axis(onehot, labels[:, None], 1.0, axis=1)
    return (g - onehot) / labels.size


def mse(x, t):
    """Mean of (x - t)**2 over all elements."""
    d = _f64(x) - _f64(t)
    return float((d * d).mean())


def mse_backward(x, t):
    x = _f64(x)
    return 2.0 * (x - _f64(t)) / x.size


# --------------------------------------------------------------------------------------------
# dense
# --------------------------------------------------------------------------------------------

def dense(x, w, b=None):
    """x (N, F), w (Fout, F), b (Fout,) or None -> x @ w.T + b."""
    x, w = _f64(x), _f64(w)
    y = x @ w.T
    if b is not None:
        y = y + _f64(b)
    return y


def dense_backward(x, w, dy):
    """Gradients (dx, dw, db) of sum(dense(x, w, b) * dy)."""
    x, w, dy = _f64(x), _f64(w), _f64(dy)
    return dy @ w, dy.T @ x, dy.sum(axis=0)


# --------------------------------------------------------------------------------------------
# finite differences
# --------------------------------------------------------------------------------------------

def numerical_gradient(f, x, eps=1e-6):
    """Central differences of the scalar function f at every element of x (x is not touched)."""
    x = np.array(x, dtype=np.float64, copy=True)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        fp = float(f(x.copy()))
        x[i] = old - eps
        fm = float(f(x.copy()))
        x[i] = old
        g[i] = (fp - fm) / (2.0 * eps)
    return g
