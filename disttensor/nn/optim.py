"""Optimizers for :mod:`disttensor.nn`: :class:`SGD`, :class:`Adam` and :class:`AdamW`, with
PyTorch's update formulas, parameter groups and state dicts (:class:`RMSprop`,
:class:`Adagrad`, :class:`NAdam` and :class:`RAdam` live in :mod:`.optim_adaptive` and are
re-exported here).

Contract with the parameters
----------------------------
A parameter is any object with ``data`` (a NumPy or CuPy array, float32 or float64), ``grad``
(``None`` or an array of the same shape and dtype) and ``requires_grad``. Parameters are
replicated: ``data`` and ``grad`` hold the same values on every rank (gradients are already
all-reduced when ``step`` runs), so every rank makes the same update with no communication.
``step`` updates ``p.data`` in place and skips parameters whose ``grad`` is ``None``. The state
arrays (momentum buffers, moments) are created on the parameter's device with its dtype.

Checkpoints
-----------
``state_dict()`` has PyTorch's layout, with arrays and Python scalars only (no pickle needed)::

    {"state": {index: {name: array or Python number}},
     "param_groups": [{option: Python scalar or tuple, "params": [index, ...]}, ...]}

where ``index`` numbers the parameters in group order. :func:`flatten_state` turns it into the
``host`` arrays and ``scalars`` that :func:`disttensor.io.save_checkpoint` stores, and
:func:`unflatten_state` turns what :func:`disttensor.io.load_checkpoint` returns back into a
state dict for ``load_state_dict``::

    host, scalars = flatten_state(opt.state_dict())
    dt.io.save_checkpoint(path, arrays, host=host, scalars=scalars)
    _, host, scalars = dt.io.load_checkpoint(path)
    opt.load_state_dict(unflatten_state(host, scalars))
"""
from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, MutableMapping

import numpy as np

from ..core import profiler as _profiler
from ..core.backend import array_module, to_host
from . import optim_compiled as _compiled
from .optim_scratch import _coefficients, _in_place_ok, _scratch

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "NAdam", "RAdam",
           "flatten_state", "unflatten_state"]


class _Required:
    """Marker for an option with no default: every parameter group must give it."""

    def __repr__(self):
        return "<required parameter>"


required = _Required()


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray) or type(x).__module__.startswith("cupy")


def _is_parameter(x) -> bool:
    return hasattr(x, "data") and hasattr(x, "grad") and not _is_array(x)


class _ParamState(MutableMapping):
    """``{parameter: state dict}`` keyed by identity (parameters need not be hashable), creating
    an empty state on first access like PyTorch's ``defaultdict(dict)``."""

    def __init__(self):
        self._d: dict[int, tuple[object, dict]] = {}

    def __getitem__(self, p):
        if id(p) not in self._d:
            self._d[id(p)] = (p, {})
        return self._d[id(p)][1]

    def __setitem__(self, p, value):
        self._d[id(p)] = (p, value)

    def __delitem__(self, p):
        del self._d[id(p)]

    def __contains__(self, p):
        return id(p) in self._d

    def __iter__(self):
        return (p for p, _ in list(self._d.values()))

    def __len__(self):
        return len(self._d)


def _check_real(name: str, v, *, low: float | None = 0.0, message: str | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    v = float(v)
    if math.isnan(v) or (low is not None and v < low):
        raise ValueError(message.format(v) if message else f"Invalid {name} value: {v}")
    return v


def _python_scalar(v):
    """A NumPy scalar as the Python scalar it holds; tuples and lists element-wise."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (tuple, list)):
        return type(v)(_python_scalar(x) for x in v)
    return v


class Optimizer:
    """Base class: parameter groups, ``zero_grad``, ``step`` and state dicts as in PyTorch.

    ``params`` is an iterable of parameters, or of dicts each with ``"params"`` (an iterable of
    parameters) and per-group options overriding ``defaults``. Subclasses implement
    ``_check_group(group)`` (validate and normalise a group's options, ``ValueError`` for bad
    values) and ``_update(p, grad, state, group)`` (one parameter's in-place update).
    """

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self.state = _ParamState()
        self.param_groups: list[dict] = []
        if _is_parameter(params) or _is_array(params) or isinstance(params, (str, bytes)):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"parameters or dicts, but got {type(params).__name__}")
        if isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of parameters in sets will change between runs. "
                            "Please use a list instead.")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], Mapping):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params"]
        return "\n".join(lines + [")"])

    # -- groups ------------------------------------------------------------------------------
    def add_param_group(self, param_group: Mapping) -> None:
        """Add a group (a dict with ``"params"`` and options; missing options take the
        optimizer's defaults). ``ValueError`` if a parameter is already in another group."""
        if not isinstance(param_group, Mapping):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        if "params" not in group:
            raise ValueError("param_group must have a 'params' entry")
        params = group["params"]
        if _is_parameter(params):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of parameters in sets will change between runs. "
                            "Please use a list instead.")
        params = list(params)
        for p in params:
            if not _is_parameter(p):
                raise TypeError("optimizer can only optimize parameters (objects with .data "
                                f"and .grad), but one of the params is {type(p).__name__}")
            if not _is_array(p.data):
                raise TypeError(f"a parameter's data must be a NumPy or CuPy array, got "
                                f"{type(p.data).__name__}")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter group holds the same parameter twice")
        group["params"] = params
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError("parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            group.setdefault(name, default)
        self._check_group(group)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def _check_group(self, group: dict) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _check_group")

    # -- steps -------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients: ``p.grad = None`` (default), or fill them with zeros in place."""
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.fill(0)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` (called
        first, to recompute the loss and gradients) or ``None``."""
        loss = closure() if closure is not None else None
        prof = _profiler._active
        with (_profiler.NULL if prof is None else prof.op(f"{type(self).__name__}.step",
                                                          "update")):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._masked_update(p, p.grad, self.state[p], group)
        return loss

    def step_parameter(self, p, grad) -> None:
        """Update the one parameter ``p`` with the gradient ``grad`` now, exactly as
        :meth:`step` would (its group's current options, its state); ``p.grad`` is neither
        read nor changed.  For updates made inside backward, as each gradient is final
        (:class:`disttensor.nn.backward_update.BackwardUpdate`).  ``KeyError`` if ``p`` is in
        none of the groups."""
        self._masked_update(p, grad, self.state[p], self._group_of(p))

    def _masked_update(self, p, grad, state: dict, group: dict) -> None:
        """``_update``, holding a pruned parameter (:mod:`disttensor.nn.prune`) at zero where its
        mask is: the gradient is masked before the rule and the parameter after it."""
        ref = getattr(p, "_pruning", None)
        mask = None if ref is None else ref.mask()
        self._update(p, grad if mask is None else grad * mask, state, group)
        if mask is not None:
            p.data *= mask

    def _group_of(self, p) -> dict:
        key = tuple(id(g) for g in self.param_groups)
        cache = getattr(self, "_group_cache", None)
        if cache is None or cache[0] != key:
            cache = self._group_cache = (key, {id(q): g for g in self.param_groups
                                               for q in g["params"]})
        group = cache[1].get(id(p))
        if group is None or not any(q is p for q in group["params"]):
            raise KeyError("the parameter is in none of the optimizer's parameter groups")
        return group

    def _update(self, p, grad, state: dict, group: dict) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _update")

    # -- state dicts -------------------------------------------------------------------------
    def _indexed_params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict:
        """``{"state": {i: {name: array | number}}, "param_groups": [...]}`` (module docstring).

        The arrays are the optimizer's own (not copies): store or copy them before the next
        ``step``. Options are Python scalars (``betas`` a tuple)."""
        params = self._indexed_params()
        index = {id(p): i for i, p in enumerate(params)}
        groups = []
        for g in self.param_groups:
            packed = {k: _python_scalar(v) for k, v in g.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in g["params"]]
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items()
                 if id(p) in index and s}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore a :meth:`state_dict` (of an optimizer over parameters of the same shapes,
        grouped alike). Arrays are copied onto each parameter's device, in its dtype; the
        saved group options replace the current ones."""
        groups = state_dict["param_groups"]
        saved_state = state_dict["state"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for g, sg in zip(self.param_groups, groups):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        by_index = {}
        for g, sg in zip(self.param_groups, groups):
            for p, i in zip(g["params"], sg["params"]):
                by_index[int(i)] = p
        unknown = sorted(set(int(i) for i in saved_state) - set(by_index))
        if unknown:
            raise ValueError(f"loaded state dict has state for parameters {unknown} that no "
                             "parameter group lists")
        new_state = _ParamState()
        for i, s in saved_state.items():
            p = by_index[int(i)]
            xp = array_module(p.data)
            entry = {}
            for name, v in s.items():
                if _is_array(v):
                    if tuple(v.shape) != tuple(p.data.shape):
                        raise ValueError(f"state {name!r} of parameter {i} has shape "
                                         f"{tuple(v.shape)}, the parameter {p.data.shape}")
                    entry[name] = xp.array(v if xp is not np else to_host(v),
                                           dtype=p.data.dtype, copy=True)
                else:
                    entry[name] = _python_scalar(v)
            new_state[p] = entry
        new_groups = []
        for g, sg in zip(self.param_groups, groups):
            ng = {k: (tuple(v) if isinstance(v, list) else v) for k, v in sg.items()
                  if k != "params"}
            ng["params"] = g["params"]
            self._check_group(ng)
            new_groups.append(ng)
        self.state = new_state
        self.param_groups = new_groups


class SGD(Optimizer):
    """Stochastic gradient descent with momentum (PyTorch's ``torch.optim.SGD``).

    With ``g`` the gradient (negated when ``maximize``)::

        g = g + weight_decay * p
        b = g (first step)  |  b = momentum * b + (1 - dampening) * g   (momentum != 0)
        g = g + momentum * b (nesterov)  |  g = b
        p = p - lr * g

    State: ``momentum_buffer`` (only when ``momentum != 0``).
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def _check_group(self, g):
        g["lr"] = _check_real("lr", g["lr"], message="Invalid learning rate: {}")
        g["momentum"] = _check_real("momentum", g["momentum"])
        g["dampening"] = _check_real("dampening", g["dampening"], low=None)
        g["weight_decay"] = _check_real("weight_decay", g["weight_decay"])
        g["nesterov"], g["maximize"] = bool(g["nesterov"]), bool(g["maximize"])
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _update(self, p, grad, state, g):
        d = p.data
        momentum = g["momentum"]
        buf = state.get("momentum_buffer") if momentum != 0 else None
        first = momentum != 0 and buf is None and type(d) is np.ndarray
        buf = np.empty_like(d) if first else buf    # (kept if the compiled pass takes it)
        if _compiled.sgd_step(d, grad, buf, g["lr"], momentum, g["dampening"], g["nesterov"],
                              g["weight_decay"], g["maximize"], first):   # (one compiled pass)
            if first:
                state["momentum_buffer"] = buf
            return
        if _in_place_ok(d, grad):
            self._update_host(d, grad, state, g)
            return
        if g["maximize"]:
            grad = -grad
        if g["weight_decay"] != 0:
            grad = grad + g["weight_decay"] * d
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.copy()
            else:
                buf *= momentum
                buf += (1 - g["dampening"]) * grad
            grad = grad + momentum * buf if g["nesterov"] else buf
        d -= g["lr"] * grad

    def _update_host(self, d, grad, state, g):
        """The update above on NumPy arrays with every temporary in the optimizer's scratch
        buffers (the same operations in the same order: bit-identical results)."""
        work = _scratch(self, "work", d)
        momentum, wd = g["momentum"], g["weight_decay"]
        if momentum != 0:
            lr, damp, mom = _coefficients(self, "sgd", d.dtype, g["lr"], 1 - g["dampening"],
                                          momentum)
        else:
            (lr,) = _coefficients(self, "lr", d.dtype, g["lr"])
        if g["maximize"]:
            grad = np.negative(grad, out=_scratch(self, "grad", d))
        if wd != 0:
            np.multiply(d, _coefficients(self, "wd", d.dtype, wd)[0], out=work)
            grad = np.add(grad, work, out=_scratch(self, "grad", d))
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.copy()
            else:
                buf *= mom
                buf += np.multiply(grad, damp, out=work)
            if g["nesterov"]:
                np.multiply(buf, mom, out=work)
                grad = np.add(grad, work, out=_scratch(self, "grad", d))
            else:
                grad = buf
        d -= np.multiply(grad, lr, out=work)


class Adam(Optimizer):
    """Adam (PyTorch's ``torch.optim.Adam``), with per-parameter step counters.

    With ``g`` the gradient (negated when ``maximize``) and ``t`` the parameter's step::

        g = g + weight_decay * p                      (L2 penalty, added to the gradient)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        v_hat = max(v_hat, v) (amsgrad) | v
        denom = sqrt(v_hat) / sqrt(1 - beta2**t) + eps
        p = p - lr / (1 - beta1**t) * (m / denom)

    State: ``step`` (int), ``exp_avg``, ``exp_avg_sq`` and ``max_exp_avg_sq`` (amsgrad).
    """

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 maximize: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    def _check_group(self, g):
        g["lr"] = _check_real("lr", g["lr"], message="Invalid learning rate: {}")
        g["eps"] = _check_real("eps", g["eps"], message="Invalid epsilon value: {}")
        betas = g["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair of floats, got {betas!r}")
        checked = []
        for i, b in enumerate(betas):
            b = _check_real(f"betas[{i}]", b, message=f"Invalid beta parameter at index {i}: "
                            "{}")
            if not b < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")
            checked.append(b)
        g["betas"] = tuple(checked)
        g["weight_decay"] = _check_real("weight_decay", g["weight_decay"])
        g["amsgrad"], g["maximize"] = bool(g["amsgrad"]), bool(g["maximize"])

    def _update(self, p, grad, state, g):
        d = p.data
        xp = array_module(d)
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(d)
            state["exp_avg_sq"] = xp.zeros_like(d)
        if g["amsgrad"] and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = xp.zeros_like(d)
        state["step"] = state["step"] + 1
        lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
        t = state["step"]
        if _compiled.adam_step(d, grad, state["exp_avg"], state["exp_avg_sq"], t, lr, beta1,
                               beta2, eps, wd, self._decoupled, g["maximize"],
                               state["max_exp_avg_sq"] if g["amsgrad"] else None):
            return   # (one compiled pass)
        if _in_place_ok(d, grad):
            self._update_host(d, grad, state, g)
            return
        if g["maximize"]:
            grad = -grad
        if wd != 0:
            if self._decoupled:
                d *= 1 - lr * wd
            else:
                grad = grad + wd * d
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * (grad * grad)
        if g["amsgrad"]:
            v = xp.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
        denom = xp.sqrt(v)
        denom /= math.sqrt(1 - beta2 ** t)
        denom += eps
        step_size = lr / (1 - beta1 ** t)
        d -= step_size * (m / denom)

    def _update_host(self, d, grad, state, g):
        """The update above on NumPy arrays with every temporary in the optimizer's scratch
        buffers (the same operations in the same order: bit-identical results)."""
        lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
        t = state["step"]
        work = _scratch(self, "work", d)
        c_b1, c_1b1, c_b2, c_1b2, c_bc2, c_eps, c_step = _coefficients(
            self, "adam", d.dtype, beta1, 1 - beta1, beta2, 1 - beta2,
            math.sqrt(1 - beta2 ** t), eps, lr / (1 - beta1 ** t))
        if g["maximize"]:
            grad = np.negative(grad, out=_scratch(self, "grad", d))
        if wd != 0:
            if self._decoupled:
                d *= _coefficients(self, "decay", d.dtype, 1 - lr * wd)[0]
            else:
                g2 = _scratch(self, "grad", d)
                np.multiply(d, _coefficients(self, "wd", d.dtype, wd)[0], out=work)
                grad = np.add(grad, work, out=g2)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= c_b1
        m += np.multiply(grad, c_1b1, out=work)
        v *= c_b2
        np.multiply(grad, grad, out=work)
        v += np.multiply(work, c_1b2, out=work)
        if g["amsgrad"]:
            v = np.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
        denom = np.sqrt(v, out=_scratch(self, "denom", d))
        denom /= c_bc2
        denom += c_eps
        np.divide(m, denom, out=work)
        d -= np.multiply(work, c_step, out=work)


class AdamW(Adam):
    """AdamW (PyTorch's ``torch.optim.AdamW``): Adam with decoupled weight decay, applied
    first as ``p = p * (1 - lr * weight_decay)``; the gradient carries no L2 term. Default
    ``weight_decay`` is 1e-2 as in PyTorch."""

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize)


# -- checkpoint helpers --------------------------------------------------------------------
def _json_default(v):
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"optimizer option of type {type(v).__name__} cannot go in a checkpoint")


def flatten_state(state_dict: Mapping, prefix: str = "optim"):
    """``(host_arrays, scalars)`` holding an optimizer :meth:`~Optimizer.state_dict`, for
    :func:`disttensor.io.save_checkpoint` (``host=``, ``scalars=``).

    * ``host_arrays["<prefix>.state.<i>.<name>"]``: each state array, as a NumPy copy;
    * ``scalars["<prefix>.state.<i>.<name>"]``: each Python-number state entry (``step``);
    * ``scalars["<prefix>.param_groups"]``: the groups as a JSON string (tuples become lists
      and come back as tuples).

    Names contain no ``/``, so they are valid HDF5 dataset names; several optimizers can share
    a checkpoint under different prefixes.
    """
    if not prefix or "/" in prefix:
        raise ValueError(f"prefix must be a non-empty name without '/', got {prefix!r}")
    host, scalars = {}, {}
    for i, entries in state_dict["state"].items():
        for name, v in entries.items():
            if "." in name or "/" in name:
                raise ValueError(f"state name {name!r} contains '.' or '/'")
            key = f"{prefix}.state.{int(i)}.{name}"
            if _is_array(v):
                host[key] = v.get() if array_module(v) is not np else np.array(v, copy=True)
            else:
                v = _python_scalar(v)
                if not isinstance(v, (bool, int, float, str)):
                    raise TypeError(f"state entry {key!r} is a {type(v).__name__}, neither an "
                                    "array nor a Python number")
                scalars[key] = v
    scalars[f"{prefix}.param_groups"] = json.dumps(list(state_dict["param_groups"]),
                                                   sort_keys=True, default=_json_default)
    return host, scalars


def unflatten_state(host_arrays: Mapping, scalars: Mapping, prefix: str = "optim") -> dict:
    """The state dict that :func:`flatten_state` stored under ``prefix`` (other entries of
    ``host_arrays`` and ``scalars``, e.g. a model's, are ignored)."""
    gkey = f"{prefix}.param_groups"
    if gkey not in scalars:
        raise ValueError(f"no optimizer state under prefix {prefix!r} (scalar {gkey!r} missing)")
    groups = []
    for g in json.loads(scalars[gkey]):
        groups.append({k: (v if k == "params" or not isinstance(v, list) else tuple(v))
                       for k, v in g.items()})
    state: dict[int, dict] = {}
    head = f"{prefix}.state."
    for source in (host_arrays, scalars):
        for key, v in source.items():
            if not key.startswith(head):
                continue
            index, _, name = key[len(head):].partition(".")
            if not index.isdigit() or not name:
                raise ValueError(f"malformed optimizer state name {key!r}")
            state.setdefault(int(index), {})[name] = v
    return {"state": dict(sorted(state.items())), "param_groups": groups}


from .optim_adaptive import Adagrad, NAdam, RAdam, RMSprop  # noqa: E402  (they subclass Optimizer)
