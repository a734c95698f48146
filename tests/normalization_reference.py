"""Serial float64 NumPy re-implementations of group, instance and layer normalization
(forward and every gradient), written from the definitions, for the tests of
``disttensor.nn.normalization`` (tests/mpi/test_nn_normalization.py) and its kernels
(tests/unit/test_local_cpu_normalization.py)."""
from __future__ import annotations

import numpy as np


def _norm_rows(x2, eps):
    """``(xhat, invstd)`` of the rows of a 2-D array (biased variance)."""
    if x2.shape[1] == 0:
        return x2, np.ones((x2.shape[0], 1))
    mean = x2.mean(axis=1, keepdims=True)
    var = ((x2 - mean) ** 2).mean(axis=1, keepdims=True)
    invstd = 1.0 / np.sqrt(var + eps)
    return (x2 - mean) * invstd, invstd


def _rows_backward(dxhat2, xhat2, invstd):
    """Data gradient through ``xhat`` of each row given ``dL/dxhat``."""
    m = dxhat2.shape[1]
    if m == 0:
        return dxhat2
    return invstd * (dxhat2 - dxhat2.mean(axis=1, keepdims=True)
                     - xhat2 * (dxhat2 * xhat2).mean(axis=1, keepdims=True))


def group_norm(x, groups, weight=None, bias=None, eps=1e-5, dy=None):
    """``y`` of group norm of ``x`` ``(N, C, *S)``; with ``dy`` also ``(dx, dweight, dbias)``
    (``dweight``/``dbias`` per channel, computed even when ``weight``/``bias`` are None)."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[:2]
    shape = (1, c) + (1,) * (x.ndim - 2)
    w = np.ones(c) if weight is None else np.asarray(weight, dtype=np.float64)
    b = np.zeros(c) if bias is None else np.asarray(bias, dtype=np.float64)
    per_row = int(np.prod(x.shape[1:])) // groups
    xhat2, invstd = _norm_rows(x.reshape(n * groups, per_row), eps)
    xhat = xhat2.reshape(x.shape)
    y = xhat * w.reshape(shape) + b.reshape(shape)
    if dy is None:
        return y
    dy = np.asarray(dy, dtype=np.float64)
    dxhat2 = (dy * w.reshape(shape)).reshape(n * groups, per_row)
    dx = _rows_backward(dxhat2, xhat2, invstd).reshape(x.shape)
    axes = (0,) + tuple(range(2, x.ndim))
    return y, dx, (dy * xhat).sum(axis=axes), dy.sum(axis=axes)


def instance_norm_eval(x, running_mean, running_var, weight=None, bias=None, eps=1e-5,
                       dy=None):
    """Instance norm with running statistics (``use_input_stats=False``): ``y`` and with
    ``dy`` ``(dx, dweight, dbias)``."""
    x = np.asarray(x, dtype=np.float64)
    c = x.shape[1]
    shape = (1, c) + (1,) * (x.ndim - 2)
    w = np.ones(c) if weight is None else np.asarray(weight, dtype=np.float64)
    b = np.zeros(c) if bias is None else np.asarray(bias, dtype=np.float64)
    invstd = 1.0 / np.sqrt(np.asarray(running_var, dtype=np.float64) + eps)
    xhat = (x - np.reshape(running_mean, shape)) * invstd.reshape(shape)
    y = xhat * w.reshape(shape) + b.reshape(shape)
    if dy is None:
        return y
    dy = np.asarray(dy, dtype=np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    return y, dy * (w * invstd).reshape(shape), (dy * xhat).sum(axis=axes), dy.sum(axis=axes)


def instance_running_update(x, running_mean, running_var, momentum):
    """PyTorch's instance-norm running statistics after one training step: the batch's mean
    of the per-instance means and unbiased variances, blended by ``momentum``."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[:2]
    x3 = x.reshape(n, c, -1)
    mean = x3.mean(axis=2).mean(axis=0)
    var = x3.var(axis=2, ddof=1).mean(axis=0)
    return ((1 - momentum) * np.asarray(running_mean) + momentum * mean,
            (1 - momentum) * np.asarray(running_var) + momentum * var)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, dy=None):
    """``y`` of layer norm over the trailing ``normalized_shape`` axes; with ``dy`` also
    ``(dx, dweight, dbias)`` (of shape ``normalized_shape``)."""
    x = np.asarray(x, dtype=np.float64)
    ns = tuple(normalized_shape)
    first = x.ndim - len(ns)
    w = np.ones(ns) if weight is None else np.asarray(weight, dtype=np.float64)
    b = np.zeros(ns) if bias is None else np.asarray(bias, dtype=np.float64)
    rows, cols = int(np.prod(x.shape[:first])), int(np.prod(ns))
    xhat2, invstd = _norm_rows(x.reshape(rows, cols), eps)
    xhat = xhat2.reshape(x.shape)
    y = xhat * w + b
    if dy is None:
        return y
    dy = np.asarray(dy, dtype=np.float64)
    dx = _rows_backward((dy * w).reshape(rows, cols), xhat2, invstd).reshape(x.shape)
    lead = tuple(range(first))
    return y, dx, (dy * xhat).sum(axis=lead), dy.sum(axis=lead)
