"""Mixed precision: the :func:`autocast` context and dynamic loss scaling (PyTorch's
``torch.autocast`` and ``torch.amp.GradScaler``).

Outside :func:`autocast` a layer whose parameters have another dtype than its input raises
``RuntimeError`` as in PyTorch (:mod:`disttensor.nn.operand_checks`); inside it, parameters
(float32 master weights) are cast to the activations' dtype for each op (float16/bfloat16
activations) and their gradients cast back.  Unlike ``torch.autocast``, activations are not
cast: feed the dtype you want (``x.astype('float16')``).

Usage, one iteration::

    scaler = GradScaler()
    loss = model_loss(...)
    backward(scaler.scale(loss))       # gradients come out multiplied by the scale
    scaler.unscale_(opt)               # optional: to clip the true gradients
    clip_grad_norm_(params, 1.0)
    scaler.step(opt)                   # unscales if needed; skips the step on inf/NaN grads
    scaler.update()                    # backs off after a skip, grows after an interval

The inf/NaN check runs on each rank's own gradients, with no communication. That is correct
because parameter gradients are replicated: after the backward pass has all-reduced them every
rank holds the same arrays, finds the same answer, and skips or steps alike. (Calling
``unscale_``/``step`` on gradients that still differ between ranks would let the ranks diverge:
scale after the all-reduce.) Gradients may be NumPy or CuPy arrays; on the GPU the check costs
one device-to-host synchronisation per optimizer and iteration.

The scale is kept as a float32 value as in PyTorch (so growth stops where float32 would
overflow); with the default factors (2 and 0.5) every value is a power of two.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import threading

import numpy as np

from ..core.backend import array_module

__all__ = ["GradScaler", "autocast", "is_autocast_enabled"]

_autocast = threading.local()


def is_autocast_enabled() -> bool:
    """Whether this thread runs inside an enabled :func:`autocast` block."""
    return getattr(_autocast, "enabled", False)


@contextlib.contextmanager
def autocast(device_type: str | None = None, dtype=None, enabled: bool = True):
    """Context manager (``torch.autocast``'s arguments): layers inside accept parameters of
    another floating dtype than their input and compute in the input's dtype (module
    docstring).  ``device_type`` and ``dtype`` are accepted for PyTorch's spelling and not
    used (the activations' dtype decides).  Local (thread state, no communication): every
    rank must enter it alike.  ``enabled=False`` restores the strict rule inside."""
    prev = is_autocast_enabled()
    _autocast.enabled = bool(enabled)
    try:
        yield
    finally:
        _autocast.enabled = prev

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


def _f32(v: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(v))


class GradScaler:
    """Dynamic loss scaler with PyTorch's defaults and semantics.

    Parameters: ``init_scale`` (2**16), ``growth_factor`` (2, > 1), ``backoff_factor`` (0.5,
    in (0, 1)), ``growth_interval`` (2000 consecutive unskipped steps before the scale grows),
    ``enabled`` (when False every method is a pass-through: ``scale`` returns its argument,
    ``step`` just calls ``optimizer.step()``, ``update`` does nothing).
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        self._enabled = bool(enabled)
        init_scale = float(init_scale)
        if not (init_scale > 0 and math.isfinite(_f32(init_scale))):
            raise ValueError(f"init_scale must be a positive float32 number, got {init_scale}")
        self._set_factors(growth_factor, backoff_factor, growth_interval)
        self._scale = _f32(init_scale)
        self._growth_tracker = 0
        self._per_optimizer: dict[int, dict] = {}

    def _set_factors(self, growth_factor, backoff_factor, growth_interval):
        growth_factor, backoff_factor = float(growth_factor), float(backoff_factor)
        if not growth_factor > 1.0:
            raise ValueError("The growth factor must be > 1.0.")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError("The backoff factor must be in (0, 1).")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval,
                                                               numbers.Integral) \
                or growth_interval <= 0:
            raise ValueError(f"growth_interval must be a positive integer, got "
                             f"{growth_interval!r}")
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = int(growth_interval)

    # -- queries -----------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    # -- one iteration -----------------------------------------------------------------------
    def _state(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(id(optimizer),
                                              {"stage": _READY, "found_inf": False})

    def scale(self, loss_value):
        """``loss_value * scale``: a float for a Python or NumPy number, otherwise whatever
        the multiplication gives (an array, an autograd tensor). Disabled: ``loss_value``."""
        if not self._enabled:
            return loss_value
        if isinstance(loss_value, (numbers.Real, np.generic)) and not isinstance(loss_value,
                                                                                 bool):
            return float(loss_value) * self._scale
        return loss_value * self._scale

    def unscale_(self, optimizer) -> None:
        """Divide the gradients of ``optimizer``'s parameters by the scale, in place, and
        record whether any of them held an inf or NaN (checked before unscaling, as PyTorch
        does; the gradients are unscaled either way). At most once per optimizer between two
        :meth:`update` calls, and not after :meth:`step`."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = _f32(1.0 / self._scale)  # reciprocal in float64, rounded to float32
        flags = {}  # array module -> per-gradient "all finite" flags, synchronised once
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                xp = array_module(g)
                flags.setdefault(xp, []).append(xp.isfinite(g).all())
                g *= inv_scale
        found = False
        for xp, fs in flags.items():
            found = found or not bool(xp.stack(fs).all())
        state["found_inf"] = found
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """Unscale (unless :meth:`unscale_` was called) and run ``optimizer.step(*args,
        **kwargs)`` unless a gradient held an inf or NaN; returns what ``optimizer.step``
        returned, or ``None`` when the step was skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        retval = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return retval

    def update(self, new_scale: float | None = None) -> None:
        """End of the iteration: set the scale to ``new_scale`` if given; otherwise multiply it
        by ``backoff_factor`` if any optimizer found an inf/NaN this iteration (resetting the
        growth count), or count one more good step and multiply by ``growth_factor`` after
        ``growth_interval`` good steps in a row (unless that overflows float32)."""
        if not self._enabled:
            return
        if new_scale is not None:
            new_scale = float(new_scale)
            if not (new_scale > 0 and math.isfinite(_f32(new_scale))):
                raise ValueError(f"new_scale must be a positive float32 number, got "
                                 f"{new_scale}")
            self._scale = _f32(new_scale)
        else:
            checked = [s for s in self._per_optimizer.values() if s["stage"] != _READY]
            if not checked:
                raise RuntimeError("No inf checks were recorded prior to update.")
            if any(s["found_inf"] for s in checked):
                self._scale = _f32(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            else:
                successful = self._growth_tracker + 1
                if successful == self._growth_interval:
                    grown = _f32(self._scale * self._growth_factor)
                    if math.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
                else:
                    self._growth_tracker = successful
        self._per_optimizer = {}

    # -- state dicts -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"scale", "growth_factor", "backoff_factor", "growth_interval",
        "_growth_tracker"}`` as Python scalars (PyTorch's keys); ``{}`` when disabled."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._set_factors(state_dict["growth_factor"], state_dict["backoff_factor"],
                          state_dict["growth_interval"])
        scale = float(state_dict["scale"])
        if not (scale > 0 and math.isfinite(_f32(scale))):
            raise ValueError(f"scale must be a positive float32 number, got {scale}")
        self._scale = _f32(scale)
        self._growth_tracker = int(state_dict["_growth_tracker"])
