"""CPU local kernels of the losses (one rank, no MPI; NumPy + Numba): cross-entropy and
negative log-likelihood over the channel axis (class labels or class probabilities, class
weights, ``ignore_index``, label smoothing), the elementwise losses (MSE, L1, smooth L1,
Huber, binary cross-entropy with and without logits) and the per-class sums of the soft Dice
loss, each forward beside its backward.

Layout ``(N, C, *spatial)`` viewed as ``(N, C, S)``; class labels ``(N, *spatial)`` viewed as
``(N, S)`` int64.  Data inputs are float32 or float64; per-voxel / per-element losses and all
sums are float64 (summed by the caller: the distributed ops add the local sums with one
all-reduce); gradients have the input's dtype.  Per-class weights arrive as float64 ``(C,)``
arrays.  A backward's incoming gradient is ``gscale * gvox[v]`` per voxel (``reduction=
'none'``: ``gvox`` float64 of the per-voxel loss's shape) or ``gscale`` alone (``gvox`` of
size 0).  The caller checks label ranges (labels outside ``[0, C)`` that are not the ignore
index never reach these kernels).

Every kernel is one fused pass over its input (the log-sum-exp is recomputed in backward
instead of keeping the softmax): ``@njit(parallel=True, cache=True)`` loops over ``(n, block of
positions)`` tasks, ``fastmath`` off; empty inputs are fine.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ....core import buffer_pool as _pool

__all__ = ["class_ce_forward", "class_ce_backward", "prob_ce_forward", "prob_ce_backward",
           "POINTWISE_LOSSES", "pointwise_loss_forward", "pointwise_loss_backward",
           "dice_sums", "dice_backward", "DICE_ACTIVATIONS"]

POINTWISE_LOSSES = ("mse", "l1", "smooth_l1", "huber", "bce_with_logits", "bce")
DICE_ACTIVATIONS = ("none", "softmax", "sigmoid")
_SBLOCK = 512       # spatial positions per task
_BLOCK = 16384      # elements per task of the elementwise kernels


def _data(name, a):
    a = np.ascontiguousarray(a)
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError(f"{name} must be float32 or float64, got {a.dtype}")
    return a


def _ncs(a):
    n, c = a.shape[:2]
    return a.reshape(n, c, math.prod(a.shape[2:]))


def _labels(lab, n, s):
    return np.ascontiguousarray(lab, dtype=np.int64).reshape(n, s)


def _gvox(gvox, shape):
    if gvox is None:
        return np.zeros((0, 0))
    return np.ascontiguousarray(gvox, dtype=np.float64).reshape(shape)


# -- cross-entropy / nll with class labels ----------------------------------------------------
@njit(inline="always")
def _lse(x, n, s0, L, C, m, tot):
    """Per position of the block: max over channels (m) and log(sum exp(x - m)) (tot)."""
    for j in range(L):
        m[j] = -np.inf
        tot[j] = 0.0
    for c in range(C):
        for j in range(L):
            v = np.float64(x[n, c, s0 + j])
            if v > m[j] or v != v:
                m[j] = v
    for c in range(C):
        for j in range(L):
            tot[j] += math.exp(np.float64(x[n, c, s0 + j]) - m[j])
    for j in range(L):
        tot[j] = m[j] + math.log(tot[j])


@njit(inline="always")
def _softmax_block(x, n, s0, L, C, m, tot, e):
    """e[c, j]: the channel softmax of the block's positions (one exp per element)."""
    for j in range(L):
        m[j] = -np.inf
        tot[j] = 0.0
    for c in range(C):
        for j in range(L):
            v = np.float64(x[n, c, s0 + j])
            if v > m[j] or v != v:
                m[j] = v
    for c in range(C):
        for j in range(L):
            ev = math.exp(np.float64(x[n, c, s0 + j]) - m[j])
            e[c, j] = ev
            tot[j] += ev
    for c in range(C):
        for j in range(L):
            e[c, j] /= tot[j]


@njit(parallel=True, cache=True)
def _class_fwd(x, lab, w, ignore, eps, log_input, loss, den, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    for t in prange(N * nb):
        n = t // nb
        s0 = (t - n * nb) * block
        L = min(S, s0 + block) - s0
        m = np.empty(L)
        lse = np.zeros(L)
        if not log_input:
            _lse(x, n, s0, L, C, m, lse)
        for j in range(L):
            y = lab[n, s0 + j]
            if y == ignore or y < 0 or y >= C:   # out of range: counted by the caller
                loss[n, s0 + j] = 0.0
                den[n, s0 + j] = 0.0
                continue
            wy = w[y]
            v = -wy * (np.float64(x[n, y, s0 + j]) - lse[j])
            if eps != 0.0:
                sm = 0.0
                for c in range(C):
                    sm -= w[c] * (np.float64(x[n, c, s0 + j]) - lse[j])
                v = (1.0 - eps) * v + eps / C * sm
            loss[n, s0 + j] = v
            den[n, s0 + j] = wy


@njit(parallel=True, cache=True)
def _class_bwd(x, lab, w, ignore, eps, log_input, gvox, gscale, dx, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    wsum = 0.0
    for c in range(C):
        wsum += w[c]
    per_voxel = gvox.shape[0] > 0
    for t in prange(N * nb):
        n = t // nb
        s0 = (t - n * nb) * block
        L = min(S, s0 + block) - s0
        m = np.empty(L)
        tot = np.zeros(L)
        e = np.empty((C, L))
        if not log_input:
            _softmax_block(x, n, s0, L, C, m, tot, e)
        for j in range(L):
            y = lab[n, s0 + j]
            g = gscale * gvox[n, s0 + j] if per_voxel else gscale
            if y == ignore or y < 0 or y >= C:   # out of range: counted by the caller
                for c in range(C):
                    dx[n, c, s0 + j] = 0.0
                continue
            wy = w[y]
            if log_input:
                for c in range(C):
                    dx[n, c, s0 + j] = 0.0
                dx[n, y, s0 + j] = -g * wy
                continue
            a = (1.0 - eps) * wy + eps / C * wsum
            for c in range(C):
                p = e[c, j]
                b = eps / C * w[c]
                if c == y:
                    b += (1.0 - eps) * wy
                dx[n, c, s0 + j] = g * (a * p - b)


def class_ce_forward(x, labels, weight, ignore_index, label_smoothing=0.0, log_input=False):
    """Per voxel of ``x`` ``(N, C, *S)`` and integer ``labels`` ``(N, *S)``: the loss
    ``(1-eps) * w[y] * -logp[y] + eps/C * sum_c w[c] * -logp[c]`` (``logp`` the channel
    log-softmax of ``x``, or ``x`` itself when ``log_input``: NLL) and the denominator term
    ``w[y]``; both 0 where ``y == ignore_index``.  Returns float64 ``(loss, den)`` of shape
    ``(N, *S)``."""
    x = _data("x", x)
    x3 = _ncs(x)
    N, C, S = x3.shape
    loss = np.empty((N, S))
    den = np.empty((N, S))
    _class_fwd(x3, _labels(labels, N, S), np.ascontiguousarray(weight, dtype=np.float64),
               int(ignore_index), float(label_smoothing), bool(log_input), loss, den, _SBLOCK)
    shape = (N,) + x.shape[2:]
    return loss.reshape(shape), den.reshape(shape)


def class_ce_backward(x, labels, weight, ignore_index, label_smoothing=0.0, log_input=False,
                      gvox=None, gscale=1.0):
    """d loss / d x of :func:`class_ce_forward` times the incoming per-voxel gradient
    ``gscale * gvox`` (``x.dtype``; 0 on ignored voxels)."""
    x = _data("x", x)
    x3 = _ncs(x)
    N, C, S = x3.shape
    dx = np.empty(x.shape, dtype=x.dtype)
    _class_bwd(x3, _labels(labels, N, S), np.ascontiguousarray(weight, dtype=np.float64),
               int(ignore_index), float(label_smoothing), bool(log_input),
               _gvox(gvox, (N, S)), float(gscale), dx.reshape(x3.shape), _SBLOCK)
    return dx


# -- cross-entropy with class probabilities --------------------------------------------------
@njit(parallel=True, cache=True)
def _prob_fwd(x, tg, w, eps, loss, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    for t in prange(N * nb):
        n = t // nb
        s0 = (t - n * nb) * block
        L = min(S, s0 + block) - s0
        m = np.empty(L)
        lse = np.zeros(L)
        _lse(x, n, s0, L, C, m, lse)
        for j in range(L):
            v = 0.0
            for c in range(C):
                tc = (1.0 - eps) * np.float64(tg[n, c, s0 + j]) + eps / C
                v -= w[c] * tc * (np.float64(x[n, c, s0 + j]) - lse[j])
            loss[n, s0 + j] = v


@njit(parallel=True, cache=True)
def _prob_bwd(x, tg, w, eps, gvox, gscale, dx, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    per_voxel = gvox.shape[0] > 0
    for t in prange(N * nb):
        n = t // nb
        s0 = (t - n * nb) * block
        L = min(S, s0 + block) - s0
        m = np.empty(L)
        tot = np.zeros(L)
        e = np.empty((C, L))
        _softmax_block(x, n, s0, L, C, m, tot, e)
        for j in range(L):
            g = gscale * gvox[n, s0 + j] if per_voxel else gscale
            wt = 0.0
            for c in range(C):
                wt += w[c] * ((1.0 - eps) * np.float64(tg[n, c, s0 + j]) + eps / C)
            for c in range(C):
                tc = (1.0 - eps) * np.float64(tg[n, c, s0 + j]) + eps / C
                p = e[c, j]
                dx[n, c, s0 + j] = g * (p * wt - w[c] * tc)


def prob_ce_forward(x, target, weight, label_smoothing=0.0):
    """Per voxel ``-sum_c w[c] * t'[c] * logp[c]``, ``t' = (1-eps) * target + eps/C``
    (float64 ``(N, *S)``; ``target`` of ``x``'s shape, any float dtype)."""
    x = _data("x", x)
    x3 = _ncs(x)
    N, C, S = x3.shape
    loss = np.empty((N, S))
    _prob_fwd(x3, _ncs(np.ascontiguousarray(target)), np.ascontiguousarray(weight, np.float64),
              float(label_smoothing), loss, _SBLOCK)
    return loss.reshape((N,) + x.shape[2:])


def prob_ce_backward(x, target, weight, label_smoothing=0.0, gvox=None, gscale=1.0):
    """``g * (softmax(x)[c] * sum_k w[k] t'[k] - w[c] t'[c])`` (``x.dtype``)."""
    x = _data("x", x)
    x3 = _ncs(x)
    N, C, S = x3.shape
    dx = np.empty(x.shape, dtype=x.dtype)
    _prob_bwd(x3, _ncs(np.ascontiguousarray(target)), np.ascontiguousarray(weight, np.float64),
              float(label_smoothing), _gvox(gvox, (N, S)), float(gscale), dx.reshape(x3.shape),
              _SBLOCK)
    return dx


# -- elementwise losses ------------------------------------------------------------------------
@njit(inline="always")
def _pw_value(op, d, x, t, param, pw):
    """The loss of one element (``d = x - t``) and its derivative in ``x`` (before weight)."""
    if op == 0:                                   # mse
        return d * d, 2.0 * d
    if op == 1:                                   # l1
        s = 1.0 if d > 0 else (-1.0 if d < 0 else (0.0 if d == 0 else d))
        return abs(d), s
    if op == 2 or op == 3:                        # smooth_l1 (beta), huber (delta)
        a = abs(d)
        s = 1.0 if d > 0 else (-1.0 if d < 0 else (0.0 if d == 0 else d))
        if a < param:
            if op == 2:
                return 0.5 * d * d / param, d / param
            return 0.5 * d * d, d
        if op == 2:
            return a - 0.5 * param, s
        return param * (a - 0.5 * param), param * s
    if op == 4:                                   # bce with logits (pos_weight pw)
        lw = 1.0 + (pw - 1.0) * t
        sp = math.log1p(math.exp(-abs(x))) + max(-x, 0.0)      # softplus(-x), stable
        sig = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
        return (1.0 - t) * x + lw * sp, lw * sig - pw * t
    # bce on probabilities: logs clamped at -100, PyTorch's gradient with eps 1e-12
    lx = max(math.log(x), -100.0) if x > 0 else -100.0
    l1x = max(math.log1p(-x), -100.0) if x < 1 else -100.0
    return -(t * lx + (1.0 - t) * l1x), (x - t) / max((1.0 - x) * x, 1e-12)


@njit(parallel=True, cache=True)
def _pw_fwd(op, x, t, param, w, pw, out, block):
    n = x.size
    has_w = w.size > 0
    has_pw = pw.size > 0
    for b in prange((n + block - 1) // block):
        for i in range(b * block, min(n, (b + 1) * block)):
            xi = np.float64(x[i])
            ti = np.float64(t[i])
            v, _ = _pw_value(op, xi - ti, xi, ti, param, pw[i] if has_pw else 1.0)
            out[i] = v * w[i] if has_w else v


@njit(parallel=True, cache=True)
def _pw_bwd(op, x, t, param, w, pw, gvox, gscale, dx, block):
    n = x.size
    has_w = w.size > 0
    has_pw = pw.size > 0
    per = gvox.size > 0
    for b in prange((n + block - 1) // block):
        for i in range(b * block, min(n, (b + 1) * block)):
            xi = np.float64(x[i])
            ti = np.float64(t[i])
            _, d = _pw_value(op, xi - ti, xi, ti, param, pw[i] if has_pw else 1.0)
            g = gscale * gvox[i] if per else gscale
            if has_w:
                g *= w[i]
            dx[i] = d * g


def _op_code(name):
    try:
        return POINTWISE_LOSSES.index(name)
    except ValueError:
        raise ValueError(f"unknown elementwise loss {name!r}; known: {POINTWISE_LOSSES}") \
            from None


_ABSENT = np.zeros(0)   # an optional operand left out (the kernels read none of it)


def _flat_opt(a, size):
    if a is None:
        return _ABSENT
    a = np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
    if a.size != size:
        raise ValueError(f"weight arrays must have {size} elements, got {a.size}")
    return a


def pointwise_loss_forward(name, x, target, param=1.0, weight=None, pos_weight=None):
    """Per-element loss ``name`` (:data:`POINTWISE_LOSSES`) of ``x`` against ``target`` (same
    shape, any float dtype), times ``weight`` (an array of ``x``'s shape or None);
    ``param``: smooth_l1's beta (``beta == 0`` is L1) or huber's delta; ``pos_weight``: the
    positive-class weight of BCE with logits, expanded to ``x``'s shape.  Float64."""
    x = _data("x", x)
    t = np.ascontiguousarray(target)
    if t.shape != x.shape:
        raise ValueError(f"target shape {t.shape} != input shape {x.shape}")
    op = _op_code(name)
    if op == 2 and float(param) == 0.0:
        op = 1
    out = _pool.empty(x.shape, np.float64)          # (recycled when steady)
    _pw_fwd(op, x.reshape(-1), t.reshape(-1), float(param), _flat_opt(weight, x.size),
            _flat_opt(pos_weight, x.size), out.reshape(-1), _BLOCK)
    return out


def pointwise_loss_backward(name, x, target, param=1.0, weight=None, pos_weight=None,
                            gvox=None, gscale=1.0):
    """d loss / d x of :func:`pointwise_loss_forward` times ``gscale * gvox`` (``x.dtype``)."""
    x = _data("x", x)
    t = np.ascontiguousarray(target)
    op = _op_code(name)
    if op == 2 and float(param) == 0.0:
        op = 1
    dx = _pool.empty(x.shape, x.dtype)          # (recycled when steady)
    _pw_bwd(op, x.reshape(-1), t.reshape(-1), float(param), _flat_opt(weight, x.size),
            _flat_opt(pos_weight, x.size), _flat_opt(gvox, x.size) if gvox is not None
            else _ABSENT, float(gscale), dx.reshape(-1), _BLOCK)
    return dx


# -- soft Dice ---------------------------------------------------------------------------------
@njit(inline="always")
def _activate(x, n, s0, L, C, act, p, m, tot):
    """p[c, j]: the activation (none / softmax / sigmoid) of the block's positions."""
    if act == 1:
        _softmax_block(x, n, s0, L, C, m, tot, p)
        return
    for c in range(C):
        for j in range(L):
            v = np.float64(x[n, c, s0 + j])
            if act == 0:
                p[c, j] = v
            elif v >= 0:
                p[c, j] = 1.0 / (1.0 + math.exp(-v))
            else:
                ev = math.exp(v)
                p[c, j] = ev / (1.0 + ev)


@njit(inline="always")
def _target(tg, lab, use_lab, n, c, s):
    if use_lab:
        return 1.0 if lab[n, s] == c else 0.0
    return np.float64(tg[n, c, s])


@njit(parallel=True, cache=True)
def _dice_sums(x, tg, lab, use_lab, act, squared, part, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    for t in prange(N * nb):
        n = t // nb
        s0 = (t - n * nb) * block
        L = min(S, s0 + block) - s0
        p = np.empty((C, L))
        m = np.empty(L)
        tot = np.zeros(L)
        _activate(x, n, s0, L, C, act, p, m, tot)
        for c in range(C):
            i_s = 0.0
            p_s = 0.0
            g_s = 0.0
            for j in range(L):
                tv = _target(tg, lab, use_lab, n, c, s0 + j)
                pv = p[c, j]
                i_s += pv * tv
                p_s += pv * pv if squared else pv
                g_s += tv * tv if squared else tv
            part[t, c, 0] = i_s
            part[t, c, 1] = p_s
            part[t, c, 2] = g_s


@njit(parallel=True, cache=True)
def _dice_bwd(x, tg, lab, use_lab, act, squared, alpha, beta, dx, block):
    N, C, S = x.shape
    nb = (S + block - 1) // block
    for t in prange(N * nb):
        n = t // nb
        s0 = (t - n * nb) * block
        L = min(S, s0 + block) - s0
        p = np.empty((C, L))
        dp = np.empty((C, L))
        m = np.empty(L)
        tot = np.zeros(L)
        _activate(x, n, s0, L, C, act, p, m, tot)
        for c in range(C):
            a = alpha[n, c]
            b = beta[n, c]
            for j in range(L):
                tv = _target(tg, lab, use_lab, n, c, s0 + j)
                dp[c, j] = a * tv + b * (2.0 * p[c, j] if squared else 1.0)
        if act == 1:
            for j in range(L):
                m[j] = 0.0
            for c in range(C):
                for j in range(L):
                    m[j] += dp[c, j] * p[c, j]
            for c in range(C):
                for j in range(L):
                    dx[n, c, s0 + j] = p[c, j] * (dp[c, j] - m[j])
        else:
            for c in range(C):
                for j in range(L):
                    g = dp[c, j]
                    if act == 2:
                        g *= p[c, j] * (1.0 - p[c, j])
                    dx[n, c, s0 + j] = g


def _dice_target(x3, target):
    """``(tg, lab, use_lab)``: a float target of ``x``'s shape or integer labels ``(N, *S)``."""
    N, C, S = x3.shape
    if np.issubdtype(np.asarray(target).dtype, np.integer):
        return np.zeros((0, 0, 0)), _labels(target, N, S), True
    return _ncs(np.ascontiguousarray(target)), np.zeros((0, 0), np.int64), False


def dice_sums(x, target, activation="softmax", squared=False):
    """Per sample and class, over this block's positions: ``[sum p*t, sum p (or p^2), sum t
    (or t^2)]`` with ``p`` the activation (:data:`DICE_ACTIVATIONS`) of ``x`` ``(N, C, *S)``
    and ``t`` the float target of ``x``'s shape or the one-hot of integer labels ``(N, *S)``.
    Float64 ``(N, C, 3)``."""
    x = _data("x", x)
    x3 = _ncs(x)
    N, C, S = x3.shape
    nb = (S + _SBLOCK - 1) // _SBLOCK
    part = np.zeros((N * nb, C, 3))
    tg, lab, use_lab = _dice_target(x3, target)
    _dice_sums(x3, tg, lab, use_lab, DICE_ACTIVATIONS.index(activation), bool(squared), part,
               _SBLOCK)
    return part.reshape(N, nb, C, 3).sum(axis=1)


def dice_backward(x, target, alpha, beta, activation="softmax", squared=False):
    """Gradient in ``x`` given float64 ``(N, C)`` coefficients: with ``p`` and ``t`` as in
    :func:`dice_sums`, ``dL/dp = alpha*t + beta*dP/dp`` (``dP/dp = 1``, or ``2p`` when
    ``squared``), taken back through the activation (``x.dtype``)."""
    x = _data("x", x)
    x3 = _ncs(x)
    N, C, S = x3.shape
    tg, lab, use_lab = _dice_target(x3, target)
    dx = np.empty(x.shape, dtype=x.dtype)
    _dice_bwd(x3, tg, lab, use_lab, DICE_ACTIVATIONS.index(activation), bool(squared),
              np.ascontiguousarray(alpha, np.float64).reshape(N, C),
              np.ascontiguousarray(beta, np.float64).reshape(N, C), dx.reshape(x3.shape),
              _SBLOCK)
    return dx
