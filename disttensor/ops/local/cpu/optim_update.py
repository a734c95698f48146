"""The optimizers' update of one host parameter in one compiled pass (per rank, no MPI).

:meth:`disttensor.nn.optim.Adam._update` on NumPy arrays is some twelve NumPy passes per
parameter (each about a microsecond of call overhead whatever the size, and each a trip
through memory), while every rank updates every replicated parameter in full.
:func:`adam_step` does the same update in one loop over the elements: the same operations in
the same order, each rounded to the parameter's dtype as NumPy rounds them (the scalars are
cast to that dtype first, as NumPy casts a Python float against a float32 array; no
fast-math, so no fused multiply-add and no reassociation), so the results are bit-identical
to the NumPy expressions (``tests/unit/test_optim_scratch.py``,
``tests/unit/test_optim_update.py``).  The loop is compiled with NumPy's error model
(a division by zero gives ``inf``/``nan`` as in NumPy instead of raising), which lets the
compiler vectorise it without changing any rounding: square roots and divisions are
correctly rounded in every lane.  Adam's step over the 360k float32 parameters of the 32^3
CosmoFlow takes 2.3-2.9x less time than NumPy's passes (``bench/optim_step_bench.py``).

It covers every option of :class:`~disttensor.nn.optim.Adam` and
:class:`~disttensor.nn.optim.AdamW` (``amsgrad``, ``maximize``, L2 or decoupled weight
decay) on float32 or float64 C-contiguous NumPy arrays of one shape and dtype; the caller
takes its NumPy path otherwise (CuPy arrays, ndarray subclasses, strided views).
:func:`sgd_step`, :func:`rmsprop_step`, :func:`adagrad_step`, :func:`nadam_step` and
:func:`radam_step` do the same for :class:`~disttensor.nn.optim.SGD`,
:class:`~disttensor.nn.optim.RMSprop`, :class:`~disttensor.nn.optim.Adagrad`,
:class:`~disttensor.nn.optim.NAdam` and :class:`~disttensor.nn.optim.RAdam` with all their
options (the per-step scalars, such as NAdam's momentum schedule, stay with the caller).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["adam_step", "sgd_step", "rmsprop_step", "adagrad_step", "nadam_step", "radam_step"]


@njit(cache=True, error_model="numpy")
def _adam(d, grad, m, v, vmax, coef, negate, l2, amsgrad):
    """Flat arrays; ``coef`` the scalars in the parameter's dtype, ``(decay, wd, beta1, c1,
    beta2, c2, bias2, eps, step_size)``.  Per element, in NumPy's order: ``g = -g``
    (``negate``); ``g = g + p*wd`` (``l2``); ``p = p*decay`` (when not 1); ``m = m*beta1 +
    g*c1``; ``v = v*beta2 + (g*g)*c2``; ``vmax = maximum(vmax, v)`` (``amsgrad``, NaN
    propagating as ``np.maximum``; ``vmax`` unread otherwise); ``p = p - (m / (sqrt(v_hat)
    / bias2 + eps)) * step_size`` with ``v_hat`` ``vmax`` or ``v``."""
    decay, wd, beta1, c1, beta2, c2 = coef[0], coef[1], coef[2], coef[3], coef[4], coef[5]
    bias2, eps, step_size = coef[6], coef[7], coef[8]
    if amsgrad:       # (two loops: the store into vmax is not made conditional per element)
        for i in range(d.size):
            p = d[i]
            g = grad[i]
            if negate:
                g = -g
            if l2:
                g = g + p * wd
            if decay != 1:
                p = p * decay
            mi = m[i] * beta1 + g * c1
            m[i] = mi
            vi = v[i] * beta2 + (g * g) * c2
            v[i] = vi
            vo = vmax[i]
            vh = vo if (vo >= vi or vo != vo) else vi
            vmax[i] = vh
            d[i] = p - (mi / (np.sqrt(vh) / bias2 + eps)) * step_size
    else:
        for i in range(d.size):
            p = d[i]
            g = grad[i]
            if negate:
                g = -g
            if l2:
                g = g + p * wd
            if decay != 1:
                p = p * decay
            mi = m[i] * beta1 + g * c1
            m[i] = mi
            vi = v[i] * beta2 + (g * g) * c2
            v[i] = vi
            d[i] = p - (mi / (np.sqrt(vi) / bias2 + eps)) * step_size


def _fits(a, dt, shape) -> bool:
    return type(a) is np.ndarray and a.dtype == dt and a.shape == shape and a.flags.c_contiguous


def adam_step(d, grad, m, v, t: int, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float = 0.0, decoupled: bool = False, maximize: bool = False,
              max_v=None) -> bool:
    """Adam's update of ``d`` (with its moments ``m``, ``v``, and ``max_v`` with
    ``amsgrad``: pass the ``max_exp_avg_sq`` array, ``None`` without) at step ``t`` in
    place, as :meth:`disttensor.nn.optim.Adam._update` computes it; ``weight_decay`` an L2
    term added to the gradient, or AdamW's decay ``p *= 1 - lr * weight_decay`` when
    ``decoupled``.  Returns False, touching nothing, where the arrays are not all
    C-contiguous, writeable NumPy float32 or float64 arrays (not subclasses) of one shape and
    dtype."""
    dt, shape = d.dtype, d.shape
    if not ((dt == np.float32 or dt == np.float64) and _fits(d, dt, shape)
            and d.flags.writeable and _fits(grad, dt, shape) and _fits(m, dt, shape)
            and _fits(v, dt, shape) and (max_v is None or _fits(max_v, dt, shape))):
        return False
    coef = _COEF[dt.itemsize == 4]    # (each rounded to the dtype as it is stored)
    decay = 1 - lr * weight_decay if decoupled and weight_decay != 0 else 1.0
    l2 = weight_decay != 0 and not decoupled
    coef[0], coef[1], coef[2], coef[3], coef[4] = decay, weight_decay, beta1, 1 - beta1, beta2
    coef[5], coef[6], coef[7], coef[8] = 1 - beta2, math.sqrt(1 - beta2 ** t), eps, \
        lr / (1 - beta1 ** t)
    flat_v = v.reshape(-1)
    _adam(d.reshape(-1), grad.reshape(-1), m.reshape(-1), flat_v,
          flat_v if max_v is None else max_v.reshape(-1), coef, bool(maximize), l2,
          max_v is not None)
    return True


@njit(cache=True, error_model="numpy")
def _sgd(d, grad, buf, coef, negate, l2, momentum, first, nesterov):
    """Flat arrays; ``coef`` the scalars in the parameter's dtype, ``(wd, lr, damp, mom)``
    (``damp`` is ``1 - dampening``).  Per element, in NumPy's order: ``g = -g``
    (``negate``); ``g = g + p*wd`` (``l2``); with ``momentum``: ``b = g`` (``first``) or
    ``b = b*mom + g*damp``, then ``g = g + b*mom`` (``nesterov``) or ``g = b`` (``buf``
    unread without ``momentum``); ``p = p - g*lr``."""
    wd, lr, damp, mom = coef[0], coef[1], coef[2], coef[3]
    if momentum:
        for i in range(d.size):
            p = d[i]
            g = grad[i]
            if negate:
                g = -g
            if l2:
                g = g + p * wd
            if first:
                b = g
            else:
                b = buf[i] * mom + g * damp
            buf[i] = b
            if nesterov:
                g = g + b * mom
            else:
                g = b
            d[i] = p - g * lr
    else:
        for i in range(d.size):
            p = d[i]
            g = grad[i]
            if negate:
                g = -g
            if l2:
                g = g + p * wd
            d[i] = p - g * lr


def sgd_step(d, grad, buf, lr: float, momentum: float, dampening: float, nesterov: bool,
             weight_decay: float, maximize: bool, first: bool) -> bool:
    """SGD's update of ``d`` in place, as :meth:`disttensor.nn.optim.SGD._update` computes
    it; ``buf`` the momentum buffer (``None`` when ``momentum`` is 0), filled with the
    gradient when ``first`` (its first step: the caller passes a new array) and updated
    otherwise.  Returns False, touching nothing, where the arrays are not all C-contiguous,
    writeable NumPy float32 or float64 arrays (not subclasses) of one shape and dtype."""
    dt, shape = d.dtype, d.shape
    if not ((dt == np.float32 or dt == np.float64) and _fits(d, dt, shape)
            and d.flags.writeable and _fits(grad, dt, shape)
            and (momentum == 0 or (buf is not None and _fits(buf, dt, shape)
                                   and buf.flags.writeable))):
        return False
    coef = _COEF[dt.itemsize == 4]
    coef[0], coef[1], coef[2], coef[3] = weight_decay, lr, 1 - dampening, momentum
    flat_d = d.reshape(-1)
    _sgd(flat_d, grad.reshape(-1), flat_d if momentum == 0 else buf.reshape(-1), coef,
         bool(maximize), weight_decay != 0, momentum != 0, bool(first), bool(nesterov))
    return True


@njit(cache=True, error_model="numpy")
def _rmsprop(d, grad, v, a, buf, coef, negate, l2, centered, lerp_low, momentum):
    """Flat arrays; ``coef`` ``(wd, alpha, 1 - alpha, w, eps, lr, mom)`` in the dtype, ``w``
    the lerp's coefficient (``1 - alpha`` when ``lerp_low``, else ``1 - (1 - alpha)``).  Per
    element, in NumPy's order: ``g = -g``; ``g = g + p*wd``; ``v = v*alpha + (g*g)*(1 -
    alpha)``; centered: ``a = a + (g - a)*w`` (``lerp_low``) or ``g - (g - a)*w``, ``r =
    sqrt(v - a*a)``, else ``r = sqrt(v)``; ``r = r + eps``; momentum: ``b = b*mom + g/r``,
    ``p = p - b*lr``; else ``p = p - (g/r)*lr`` (``a``, ``buf`` unread when not used)."""
    wd, alpha, c1a, w, eps, lr, mom = coef[0], coef[1], coef[2], coef[3], coef[4], coef[5], \
        coef[6]
    for i in range(d.size):
        p = d[i]
        g = grad[i]
        if negate:
            g = -g
        if l2:
            g = g + p * wd
        vi = v[i] * alpha + (g * g) * c1a
        v[i] = vi
        if centered:
            ai = a[i]
            if lerp_low:
                ai = ai + (g - ai) * w
            else:
                ai = g - (g - ai) * w
            a[i] = ai
            r = np.sqrt(vi - ai * ai)
        else:
            r = np.sqrt(vi)
        r = r + eps
        if momentum:
            b = buf[i] * mom + g / r
            buf[i] = b
            d[i] = p - b * lr
        else:
            d[i] = p - (g / r) * lr


def rmsprop_step(d, grad, v, a, buf, lr: float, alpha: float, eps: float, weight_decay: float,
                 momentum: float, maximize: bool) -> bool:
    """RMSprop's update of ``d`` in place, as :meth:`disttensor.nn.optim.RMSprop._update`
    computes it: ``v`` the ``square_avg``, ``a`` the ``grad_avg`` (``None`` unless centered),
    ``buf`` the momentum buffer (``None`` when ``momentum`` is 0).  Returns False, touching
    nothing, where the arrays are not all C-contiguous, writeable NumPy float32 or float64
    arrays (not subclasses) of one shape and dtype."""
    dt, shape = d.dtype, d.shape
    if not ((dt == np.float32 or dt == np.float64) and _fits(d, dt, shape)
            and d.flags.writeable and _fits(grad, dt, shape) and _fits(v, dt, shape)
            and (a is None or _fits(a, dt, shape))
            and (momentum <= 0 or (buf is not None and _fits(buf, dt, shape)))):
        return False
    coef = _COEF[dt.itemsize == 4]
    weight = 1 - alpha                       # (the lerp of torch.lerp_, as _lerp_host)
    coef[0], coef[1], coef[2], coef[3] = weight_decay, alpha, 1 - alpha, \
        weight if weight < 0.5 else 1 - weight
    coef[4], coef[5], coef[6] = eps, lr, momentum
    flat_v = v.reshape(-1)
    _rmsprop(d.reshape(-1), grad.reshape(-1), flat_v,
             flat_v if a is None else a.reshape(-1),
             flat_v if momentum <= 0 else buf.reshape(-1), coef, bool(maximize),
             weight_decay != 0, a is not None, weight < 0.5, momentum > 0)
    return True


@njit(cache=True, error_model="numpy")
def _adagrad(d, grad, s, coef, negate, l2):
    """Flat arrays; ``coef`` ``(wd, eps, clr)`` in the dtype.  Per element, in NumPy's
    order: ``g = -g``; ``g = g + p*wd``; ``s = s + g*g``; ``p = p - (g / (sqrt(s) + eps))
    * clr``."""
    wd, eps, clr = coef[0], coef[1], coef[2]
    for i in range(d.size):
        p = d[i]
        g = grad[i]
        if negate:
            g = -g
        if l2:
            g = g + p * wd
        si = s[i] + g * g
        s[i] = si
        d[i] = p - (g / (np.sqrt(si) + eps)) * clr


def adagrad_step(d, grad, s, clr: float, eps: float, weight_decay: float,
                 maximize: bool) -> bool:
    """Adagrad's update of ``d`` in place with its ``sum`` ``s`` and the step's rate ``clr``,
    as :meth:`disttensor.nn.optim.Adagrad._update` computes it.  Returns False, touching
    nothing, where the arrays are not all C-contiguous, writeable NumPy float32 or float64
    arrays (not subclasses) of one shape and dtype."""
    dt, shape = d.dtype, d.shape
    if not ((dt == np.float32 or dt == np.float64) and _fits(d, dt, shape)
            and d.flags.writeable and _fits(grad, dt, shape) and _fits(s, dt, shape)):
        return False
    coef = _COEF[dt.itemsize == 4]
    coef[0], coef[1], coef[2] = weight_decay, eps, clr
    _adagrad(d.reshape(-1), grad.reshape(-1), s.reshape(-1), coef, bool(maximize),
             weight_decay != 0)
    return True


@njit(cache=True, error_model="numpy")
def _nadam_radam(d, grad, m, v, coef, negate, l2, decoupled, lerp_low, radam, rect_on):
    """Flat arrays; ``coef`` ``(decay, wd, w, beta2, 1 - beta2, c0, c1, c2, c3, c4)`` in
    the dtype, ``w`` the lerp's coefficient as in :func:`_rmsprop`.  Per element, in NumPy's
    order: ``p = p*decay`` (``decoupled``); ``g = -g``; ``g = g + p*wd``; ``m`` lerped toward
    ``g``; ``v = v*beta2 + (g*g)*(1 - beta2)``.  NAdam (``c0..c3`` = ``bc2, eps, c_g,
    c_m``): ``r = sqrt(v / bc2) + eps``, ``p = p + (g/r)*c_g``, ``p = p + (m/r)*c_m``.
    RAdam (``c0..c4`` = ``bc1, lr, eps, sqrt(bc2), rect``): ``h = (m / bc1) * lr``; with
    ``rect_on`` ``r = sqrt(bc2) / (sqrt(v) + eps)``, ``p = p - (h*r)*rect``, else ``p = p -
    h``."""
    decay, wd, w, beta2, c1b = coef[0], coef[1], coef[2], coef[3], coef[4]
    c0, c1, c2, c3, c4 = coef[5], coef[6], coef[7], coef[8], coef[9]
    for i in range(d.size):
        p = d[i]
        if decoupled:
            p = p * decay
        g = grad[i]
        if negate:
            g = -g
        if l2:
            g = g + p * wd
        mi = m[i]
        if lerp_low:
            mi = mi + (g - mi) * w
        else:
            mi = g - (g - mi) * w
        m[i] = mi
        vi = v[i] * beta2 + (g * g) * c1b
        v[i] = vi
        if radam:
            h = (mi / c0) * c1
            if rect_on:
                r = c3 / (np.sqrt(vi) + c2)
                p = p - (h * r) * c4
            else:
                p = p - h
        else:
            r = np.sqrt(vi / c0) + c1
            p = p + (g / r) * c2
            p = p + (mi / r) * c3
        d[i] = p


def _nadam_radam_step(d, grad, m, v, lr, beta1, beta2, weight_decay, decoupled, maximize,
                      consts, radam, rect_on) -> bool:
    dt, shape = d.dtype, d.shape
    if not ((dt == np.float32 or dt == np.float64) and _fits(d, dt, shape)
            and d.flags.writeable and _fits(grad, dt, shape) and _fits(m, dt, shape)
            and _fits(v, dt, shape)):
        return False
    coef = _COEF[dt.itemsize == 4]
    decoupled = bool(decoupled) and weight_decay != 0
    weight = 1 - beta1                       # (the lerp of torch.lerp_, as _lerp_host)
    coef[0] = 1 - lr * weight_decay if decoupled else 1.0
    coef[1], coef[2] = weight_decay, weight if weight < 0.5 else 1 - weight
    coef[3], coef[4] = beta2, 1 - beta2
    for k, c in enumerate(consts):
        coef[5 + k] = c
    _nadam_radam(d.reshape(-1), grad.reshape(-1), m.reshape(-1), v.reshape(-1), coef,
                 bool(maximize), weight_decay != 0 and not decoupled, decoupled, weight < 0.5,
                 radam, rect_on)
    return True


def nadam_step(d, grad, m, v, lr: float, beta1: float, beta2: float, weight_decay: float,
               decoupled: bool, maximize: bool, bias_correction2: float, eps: float,
               c_g: float, c_m: float) -> bool:
    """NAdam's update of ``d`` (moments ``m``, ``v``) in place with the step's scalars
    ``c_g = -lr (1 - mu) / (1 - P_t)`` and ``c_m = -lr mu_next / (1 - P_t mu_next)``, as
    :meth:`disttensor.nn.optim.NAdam._update` computes it.  Returns False, touching nothing,
    where the arrays are not all C-contiguous, writeable NumPy float32 or float64 arrays (not
    subclasses) of one shape and dtype."""
    return _nadam_radam_step(d, grad, m, v, lr, beta1, beta2, weight_decay, decoupled,
                             maximize, (bias_correction2, eps, c_g, c_m, 0.0), False, False)


def radam_step(d, grad, m, v, lr: float, beta1: float, beta2: float, weight_decay: float,
               decoupled: bool, maximize: bool, bias_correction1: float, eps: float,
               root_bias_correction2: float, rect: float, rect_on: bool) -> bool:
    """RAdam's update of ``d`` (moments ``m``, ``v``) in place with the step's scalars
    (``rect_on``: ``rho_t > 5``), as :meth:`disttensor.nn.optim.RAdam._update` computes it.
    Returns False, touching nothing, where the arrays are not all C-contiguous, writeable
    NumPy float32 or float64 arrays (not subclasses) of one shape and dtype."""
    return _nadam_radam_step(d, grad, m, v, lr, beta1, beta2, weight_decay, decoupled,
                             maximize, (bias_correction1, lr, eps, root_bias_correction2,
                                        rect), True, bool(rect_on))


# the scalars of a call, in the parameter's dtype, stored into one kept array per dtype (a
# NumPy scalar made from a Python float allocates a buffer; a store into an array does not;
# like the optimizers themselves, not for two threads stepping at once)
_COEF = (np.empty(10, np.float64), np.empty(10, np.float32))
