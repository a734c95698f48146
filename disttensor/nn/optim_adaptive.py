"""More optimizers with PyTorch's update formulas: :class:`RMSprop`, :class:`Adagrad`,
:class:`NAdam` and :class:`RAdam` (``torch.optim`` 2.13, single-tensor path).

They share :class:`disttensor.nn.optim.Optimizer`'s contract (module docstring of
:mod:`disttensor.nn.optim`): replicated parameters, updated in place, no communication; a
parameter whose ``grad`` is ``None`` is skipped (no weight decay, no moment update, its
``step`` does not advance), as in PyTorch; state dicts in the same layout (``step`` an int,
``mu_product`` a float, the rest arrays of the parameter's shape and dtype), so
:func:`~disttensor.nn.optim.flatten_state` stores them.  They are re-exported from
:mod:`disttensor.nn.optim` (``nn.optim.RMSprop`` as ``torch.optim.RMSprop``).

Differences from PyTorch: no ``foreach``/``fused``/``capturable``/``differentiable`` options
(one code path, the single-tensor formulas), no complex parameters, no sparse gradients;
``step`` is a Python int rather than a tensor.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.backend import array_module
from . import optim_compiled as _compiled
from .optim import Optimizer, _check_real
from .optim_scratch import _coefficients, _in_place_ok, _scratch

__all__ = ["RMSprop", "Adagrad", "NAdam", "RAdam"]


def _nonneg(g, *names):
    for name in names:
        g[name] = _check_real(name, g[name], message=f"Invalid {name} value: {{}}")


def _check_lr_eps(g):
    g["lr"] = _check_real("lr", g["lr"], message="Invalid learning rate: {}")
    g["eps"] = _check_real("eps", g["eps"], message="Invalid epsilon value: {}")


def _check_betas(g):
    betas = g["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair of floats, got {betas!r}")
    checked = []
    for i, b in enumerate(betas):
        b = _check_real(f"betas[{i}]", b, message=f"Invalid beta parameter at index {i}: {{}}")
        if not b < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {b}")
        checked.append(b)
    g["betas"] = tuple(checked)


def _lerp_(a, end, weight):
    """``a`` moved in place toward ``end`` by ``weight``, rounded as ``torch.lerp_``."""
    if weight < 0.5:
        a += weight * (end - a)
    else:
        a[...] = end - (end - a) * (1 - weight)


def _signed(grad, g):
    return -grad if g["maximize"] else grad


# -- the same updates with every temporary in the optimizer's scratch (NumPy parameters;
#    the same operations in the same order: the same bits; no array made in a steady step)
def _lerp_host(opt, a, end, weight):
    """:func:`_lerp_` through scratch."""
    work = _scratch(opt, "lerp", a)
    np.subtract(end, a, out=work)
    if weight < 0.5:
        (c,) = _coefficients(opt, "lerp", a.dtype, weight)
        a += np.multiply(work, c, out=work)
    else:
        (c,) = _coefficients(opt, "lerp", a.dtype, 1 - weight)
        np.subtract(end, np.multiply(work, c, out=work), out=a)


def _host_grad(opt, d, grad, g, wd: float):
    """The gradient negated (``maximize``) and with the L2 term ``wd * d`` added, in the
    ``"grad"`` scratch when either applies."""
    if g["maximize"]:
        grad = np.negative(grad, out=_scratch(opt, "grad", d))
    if wd != 0:
        work = _scratch(opt, "work", d)
        (c,) = _coefficients(opt, "wd", d.dtype, wd)
        np.multiply(d, c, out=work)
        grad = np.add(grad, work, out=_scratch(opt, "grad", d))
    return grad


def _decay_host(opt, d, g, wd: float) -> None:
    """``d *= 1 - lr * wd`` (decoupled weight decay)."""
    (c,) = _coefficients(opt, "decay", d.dtype, 1 - g["lr"] * wd)
    d *= c


def _second_moment_host(opt, v, grad, beta: float) -> None:
    """``v = beta * v + (1 - beta) * grad * grad``."""
    work = _scratch(opt, "work", v)
    c_b, c_1b = _coefficients(opt, "moment", v.dtype, beta, 1 - beta)
    v *= c_b
    np.multiply(grad, grad, out=work)
    v += np.multiply(work, c_1b, out=work)


class RMSprop(Optimizer):
    """RMSprop (``torch.optim.RMSprop``; defaults lr 1e-2, alpha 0.99, eps 1e-8).  With ``g``
    the gradient (negated when ``maximize``)::

        g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        a = alpha * a + (1 - alpha) * g ;  avg = sqrt(v - a * a)   (centered)
        avg = sqrt(v)                                              (otherwise)
        avg = avg + eps
        b = momentum * b + g / avg ;  p = p - lr * b               (momentum > 0)
        p = p - lr * g / avg                                       (otherwise)

    State: ``step``, ``square_avg``, ``momentum_buffer`` (momentum > 0), ``grad_avg``
    (centered)."""

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False, *,
                 maximize: bool = False):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize))

    def _check_group(self, g):
        _check_lr_eps(g)
        _nonneg(g, "momentum", "weight_decay", "alpha")
        g["centered"], g["maximize"] = bool(g["centered"]), bool(g["maximize"])

    def _update(self, p, grad, state, g):
        d = p.data
        xp = array_module(d)
        if not state:
            state["step"] = 0
            state["square_avg"] = xp.zeros_like(d)
        if g["momentum"] > 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = xp.zeros_like(d)
        if g["centered"] and "grad_avg" not in state:
            state["grad_avg"] = xp.zeros_like(d)
        if _compiled.rmsprop_step(d, grad, state["square_avg"], state.get("grad_avg")
                                  if g["centered"] else None, state.get("momentum_buffer")
                                  if g["momentum"] > 0 else None, g["lr"], g["alpha"],
                                  g["eps"], g["weight_decay"], g["momentum"], g["maximize"]):
            state["step"] += 1                  # (one compiled pass)
            return
        if _in_place_ok(d, grad):
            state["step"] += 1
            self._update_host(d, grad, state, g)
            return
        grad = _signed(grad, g)
        state["step"] += 1
        alpha = g["alpha"]
        if g["weight_decay"] != 0:
            grad = grad + g["weight_decay"] * d
        v = state["square_avg"]
        v *= alpha
        v += (1 - alpha) * (grad * grad)
        if g["centered"]:
            a = state["grad_avg"]
            _lerp_(a, grad, 1 - alpha)
            avg = xp.sqrt(v - a * a)
        else:
            avg = xp.sqrt(v)
        avg += g["eps"]
        if g["momentum"] > 0:
            buf = state["momentum_buffer"]
            buf *= g["momentum"]
            buf += grad / avg
            d -= g["lr"] * buf
        else:
            d -= g["lr"] * (grad / avg)

    def _update_host(self, d, grad, state, g):
        alpha = g["alpha"]
        grad = _host_grad(self, d, grad, g, g["weight_decay"])
        v = state["square_avg"]
        _second_moment_host(self, v, grad, alpha)
        work, avg = _scratch(self, "work", d), _scratch(self, "denom", d)
        if g["centered"]:
            a = state["grad_avg"]
            _lerp_host(self, a, grad, 1 - alpha)
            np.sqrt(np.subtract(v, np.multiply(a, a, out=work), out=avg), out=avg)
        else:
            np.sqrt(v, out=avg)
        c_eps, c_lr = _coefficients(self, "rmsprop", d.dtype, g["eps"], g["lr"])
        avg += c_eps
        if g["momentum"] > 0:
            buf = state["momentum_buffer"]
            buf *= _coefficients(self, "momentum", d.dtype, g["momentum"])[0]
            buf += np.divide(grad, avg, out=work)
            d -= np.multiply(buf, c_lr, out=work)
        else:
            np.divide(grad, avg, out=work)
            d -= np.multiply(work, c_lr, out=work)


class Adagrad(Optimizer):
    """Adagrad (``torch.optim.Adagrad``; defaults lr 1e-2, lr_decay 0, eps 1e-10).  With ``g``
    the gradient (negated when ``maximize``) and ``t`` the parameter's step::

        g = g + weight_decay * p
        clr = lr / (1 + (t - 1) * lr_decay)
        s = s + g * g                     (s starts at initial_accumulator_value)
        p = p - clr * g / (sqrt(s) + eps)

    State: ``step`` and ``sum``, created for every parameter when it joins the optimizer (as
    PyTorch does, so they are in the state dict before the first step)."""

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, *, maximize: bool = False):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      maximize=maximize))

    def add_param_group(self, param_group) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            xp = array_module(p.data)
            self.state[p] = {"step": 0,
                             "sum": xp.full_like(p.data, group["initial_accumulator_value"])}

    def _check_group(self, g):
        _check_lr_eps(g)
        _nonneg(g, "lr_decay", "weight_decay", "initial_accumulator_value")
        g["maximize"] = bool(g["maximize"])

    def _update(self, p, grad, state, g):
        d = p.data
        if not state:
            state["step"] = 0
            state["sum"] = array_module(d).full_like(d, g["initial_accumulator_value"])
        state["step"] = t = state["step"] + 1
        clr = g["lr"] / (1 + (t - 1) * g["lr_decay"])
        if _compiled.adagrad_step(d, grad, state["sum"], clr, g["eps"], g["weight_decay"],
                                  g["maximize"]):
            return                              # (one compiled pass)
        if _in_place_ok(d, grad):
            grad = _host_grad(self, d, grad, g, g["weight_decay"])
            work, std = _scratch(self, "work", d), _scratch(self, "denom", d)
            s = state["sum"]
            s += np.multiply(grad, grad, out=work)
            c_eps, c_clr = _coefficients(self, "adagrad", d.dtype, g["eps"], clr)
            np.sqrt(s, out=std)
            std += c_eps
            np.divide(grad, std, out=work)
            d -= np.multiply(work, c_clr, out=work)
            return
        grad = _signed(grad, g)
        if g["weight_decay"] != 0:
            grad = grad + g["weight_decay"] * d
        s = state["sum"]
        s += grad * grad
        std = array_module(d).sqrt(s)
        std += g["eps"]
        d -= clr * (grad / std)


class NAdam(Optimizer):
    """NAdam (``torch.optim.NAdam``; defaults lr 2e-3, betas (0.9, 0.999), eps 1e-8,
    momentum_decay 4e-3).  With ``g`` the gradient (negated when ``maximize``), ``t`` the
    step, ``psi = momentum_decay``::

        p = p * (1 - lr * weight_decay)  (decoupled_weight_decay) | g = g + weight_decay * p
        mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * psi)),  mu_{t+1} likewise
        P_t = P_{t-1} * mu_t                                   (mu_product, P_0 = 1)
        m = beta1 * m + (1 - beta1) * g ;  v = beta2 * v + (1 - beta2) * g * g
        denom = sqrt(v / (1 - beta2 ** t)) + eps
        p = p - lr * (1 - mu_t) / (1 - P_t) * g / denom
              - lr * mu_{t+1} / (1 - P_t * mu_{t+1}) * m / denom

    State: ``step``, ``mu_product`` (a float), ``exp_avg``, ``exp_avg_sq``."""

    def __init__(self, params, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, maximize: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize))

    def _check_group(self, g):
        _check_lr_eps(g)
        _check_betas(g)
        _nonneg(g, "weight_decay", "momentum_decay")
        g["decoupled_weight_decay"] = bool(g["decoupled_weight_decay"])
        g["maximize"] = bool(g["maximize"])

    def _update(self, p, grad, state, g):
        d = p.data
        xp = array_module(d)
        if not state:
            state["step"] = 0
            state["mu_product"] = 1.0
            state["exp_avg"] = xp.zeros_like(d)
            state["exp_avg_sq"] = xp.zeros_like(d)
        host = _in_place_ok(d, grad)
        grad = grad if host else _signed(grad, g)
        lr, (beta1, beta2), wd, psi = g["lr"], g["betas"], g["weight_decay"], g["momentum_decay"]
        state["step"] = t = state["step"] + 1
        bias_correction2 = 1 - beta2 ** t
        if host:
            self._update_host(d, grad, state, g, t)
            return
        if wd != 0:
            if g["decoupled_weight_decay"]:
                d *= 1 - lr * wd
            else:
                grad = grad + wd * d
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (t * psi)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((t + 1) * psi)))
        state["mu_product"] = mu_product = float(state["mu_product"]) * mu
        m, v = state["exp_avg"], state["exp_avg_sq"]
        _lerp_(m, grad, 1 - beta1)
        v *= beta2
        v += (1 - beta2) * (grad * grad)
        denom = xp.sqrt(v / bias_correction2)
        denom += g["eps"]
        mu_product_next = mu_product * mu_next
        d += (-lr * (1.0 - mu) / (1.0 - mu_product)) * (grad / denom)
        d += ((-lr * mu_next) / (1.0 - mu_product_next)) * (m / denom)

    def _update_host(self, d, grad, state, g, t):
        lr, (beta1, beta2), wd, psi = g["lr"], g["betas"], g["weight_decay"], g["momentum_decay"]
        bias_correction2 = 1 - beta2 ** t
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (t * psi)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((t + 1) * psi)))
        state["mu_product"] = mu_product = float(state["mu_product"]) * mu
        m, v = state["exp_avg"], state["exp_avg_sq"]
        if _compiled.nadam_step(d, grad, m, v, lr, beta1, beta2, wd, g["decoupled_weight_decay"],
                                g["maximize"], bias_correction2, g["eps"],
                                -lr * (1.0 - mu) / (1.0 - mu_product),
                                (-lr * mu_next) / (1.0 - mu_product * mu_next)):
            return                              # (one compiled pass)
        if wd != 0 and g["decoupled_weight_decay"]:
            _decay_host(self, d, g, wd)
            wd = 0.0
        grad = _host_grad(self, d, grad, g, wd)
        _lerp_host(self, m, grad, 1 - beta1)
        _second_moment_host(self, v, grad, beta2)
        mu_product_next = mu_product * mu_next
        c_bc2, c_eps, c_g, c_m = _coefficients(
            self, "nadam", d.dtype, bias_correction2, g["eps"], -lr * (1.0 - mu) / (1.0 - mu_product),
            (-lr * mu_next) / (1.0 - mu_product_next))
        work, denom = _scratch(self, "work", d), _scratch(self, "denom", d)
        np.sqrt(np.divide(v, c_bc2, out=denom), out=denom)
        denom += c_eps
        np.divide(grad, denom, out=work)
        d += np.multiply(work, c_g, out=work)
        np.divide(m, denom, out=work)
        d += np.multiply(work, c_m, out=work)


class RAdam(Optimizer):
    """RAdam (``torch.optim.RAdam``; defaults lr 1e-3, betas (0.9, 0.999), eps 1e-8).  With
    ``g`` the gradient (negated when ``maximize``) and ``t`` the step::

        p = p * (1 - lr * weight_decay)  (decoupled_weight_decay) | g = g + weight_decay * p
        m = beta1 * m + (1 - beta1) * g ;  v = beta2 * v + (1 - beta2) * g * g
        rho_inf = 2 / (1 - beta2) - 1 ;  rho_t = rho_inf - 2 t beta2**t / (1 - beta2**t)
        m_hat = m / (1 - beta1 ** t)
        rho_t > 5:  r = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
                    p = p - m_hat * lr * sqrt(1 - beta2 ** t) / (sqrt(v) + eps) * r
        otherwise:  p = p - m_hat * lr

    State: ``step``, ``exp_avg``, ``exp_avg_sq``."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0,
                 decoupled_weight_decay: bool = False, *, maximize: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize))

    def _check_group(self, g):
        _check_lr_eps(g)
        _check_betas(g)
        _nonneg(g, "weight_decay")
        g["decoupled_weight_decay"] = bool(g["decoupled_weight_decay"])
        g["maximize"] = bool(g["maximize"])

    def _update(self, p, grad, state, g):
        d = p.data
        xp = array_module(d)
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(d)
            state["exp_avg_sq"] = xp.zeros_like(d)
        host = _in_place_ok(d, grad)
        grad = grad if host else _signed(grad, g)
        lr, (beta1, beta2), wd = g["lr"], g["betas"], g["weight_decay"]
        state["step"] = t = state["step"] + 1
        if host:
            self._update_host(d, grad, state, g, t)
            return
        if wd != 0:
            if g["decoupled_weight_decay"]:
                d *= 1 - lr * wd
            else:
                grad = grad + wd * d
        m, v = state["exp_avg"], state["exp_avg_sq"]
        _lerp_(m, grad, 1 - beta1)
        v *= beta2
        v += (1 - beta2) * (grad * grad)
        bias_correction1 = 1 - beta1 ** t
        bias_correction2 = 1 - beta2 ** t
        m_hat = m / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * t * (beta2 ** t) / bias_correction2
        if rho_t > 5.0:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf
                             / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            root = xp.sqrt(v)
            root += g["eps"]
            d -= m_hat * lr * ((bias_correction2 ** 0.5) / root) * rect
        else:
            d -= m_hat * lr

    def _update_host(self, d, grad, state, g, t):
        lr, (beta1, beta2), wd = g["lr"], g["betas"], g["weight_decay"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        bias_correction1 = 1 - beta1 ** t
        bias_correction2 = 1 - beta2 ** t
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * t * (beta2 ** t) / bias_correction2
        rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf
                         / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) if rho_t > 5.0 else 0.0
        if _compiled.radam_step(d, grad, m, v, lr, beta1, beta2, wd, g["decoupled_weight_decay"],
                                g["maximize"], bias_correction1, g["eps"],
                                bias_correction2 ** 0.5, rect, rho_t > 5.0):
            return                              # (one compiled pass)
        if wd != 0 and g["decoupled_weight_decay"]:
            _decay_host(self, d, g, wd)
            wd = 0.0
        grad = _host_grad(self, d, grad, g, wd)
        _lerp_host(self, m, grad, 1 - beta1)
        _second_moment_host(self, v, grad, beta2)
        m_hat = _scratch(self, "m_hat", d)
        c_bc1, c_lr, c_eps, c_root, c_rect = _coefficients(
            self, "radam", d.dtype, bias_correction1, lr, g["eps"], bias_correction2 ** 0.5, rect)
        np.divide(m, c_bc1, out=m_hat)
        np.multiply(m_hat, c_lr, out=m_hat)
        if rho_t > 5.0:
            work, root = _scratch(self, "work", d), _scratch(self, "denom", d)
            np.sqrt(v, out=root)
            root += c_eps
            np.divide(c_root, root, out=root)
            np.multiply(m_hat, root, out=work)
            d -= np.multiply(work, c_rect, out=work)
        else:
            d -= m_hat
