"""More learning-rate schedules with PyTorch's semantics (``torch.optim.lr_scheduler`` 2.13):
:class:`ExponentialLR`, :class:`PolynomialLR`, :class:`ConstantLR`,
:class:`CosineAnnealingWarmRestarts`, :class:`OneCycleLR`, :class:`ReduceLROnPlateau`, and the
combinators :class:`SequentialLR` and :class:`ChainedScheduler`.  Re-exported from
:mod:`disttensor.nn.lr_scheduler`, whose conventions they follow (closed forms from the base
rates, flat state dicts of Python scalars, ``load_state_dict`` restoring the groups' rates).

State dicts add to the base layout: ``T_cur``/``T_i`` (warm restarts); ``best``,
``num_bad_epochs``, ``cooldown_counter`` (plateau); ``num_schedulers`` and each child's items
under ``scheduler.<k>.`` (the combinators).  Nothing here communicates: every rank steps its
replicated optimizer alike (a metric given to :meth:`ReduceLROnPlateau.step` must be the same
on every rank, e.g. a loss returned by the collective loss functions).
"""
from __future__ import annotations

import math
import numbers
from bisect import bisect_right
from collections.abc import Mapping, Sequence

from .lr_scheduler import LRScheduler, _positive_int, _real
from .optim import Optimizer

__all__ = ["ExponentialLR", "PolynomialLR", "ConstantLR", "CosineAnnealingWarmRestarts",
           "OneCycleLR", "ReduceLROnPlateau", "SequentialLR", "ChainedScheduler"]


class ExponentialLR(LRScheduler):
    """``lr = base_lr * gamma ** epoch``."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = _real("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return base_lr * self.gamma ** epoch


class PolynomialLR(LRScheduler):
    """``lr = base_lr * (1 - min(total_iters, epoch) / total_iters) ** power``."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0,
                 last_epoch: int = -1):
        self.total_iters = _positive_int("total_iters", total_iters)
        self.power = _real("power", power)
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return base_lr * (1.0 - min(self.total_iters, epoch) / self.total_iters) ** self.power


class ConstantLR(LRScheduler):
    """``lr = base_lr * factor`` for ``epoch < total_iters``, then ``base_lr``."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1):
        self.factor = _real("factor", factor)
        if not 0 <= self.factor <= 1:
            raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
        self.total_iters = _positive_int("total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return base_lr * (self.factor + (epoch >= self.total_iters) * (1 - self.factor))


class _Absolute:
    """Mixin of the schedules whose PyTorch ``get_lr`` is absolute (computed from the base
    rates and the scheduler's own state, not from the current rate): chained, they step."""

    def _chain_step(self):
        self.step()


class CosineAnnealingWarmRestarts(_Absolute, LRScheduler):
    """SGDR (PyTorch's ``CosineAnnealingWarmRestarts``)::

        lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2

    ``T_cur`` counts epochs since the last restart; a restart happens when it reaches ``T_i``,
    which then grows by ``T_mult`` (from ``T_0``).  ``step(epoch)`` takes a fractional epoch
    (``epoch + i / iters`` inside an epoch), computing ``T_cur`` and ``T_i`` from it as PyTorch
    does; ``step()`` advances one epoch."""

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1):
        if isinstance(T_0, bool) or not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if isinstance(T_mult, bool) or not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if isinstance(eta_min, bool) or not isinstance(eta_min, (float, int)):
            raise ValueError(f"Expected float or int eta_min, but got {eta_min} of type "
                             f"{type(eta_min)}")
        self.T_0 = self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = float(eta_min)
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return self.eta_min + (base_lr - self.eta_min) * (
            1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2

    def step(self, epoch: float | None = None) -> None:
        """Advance one epoch, or go to (fractional) ``epoch`` >= 0."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            epoch = _real("epoch", epoch)
            if epoch < 0:
                raise ValueError(f"Expected non-negative epoch, but got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log((epoch / self.T_0 * (self.T_mult - 1) + 1), self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        self._set_lrs(self.get_lr())

    def state_dict(self) -> dict:
        return {**super().state_dict(), "T_cur": self.T_cur, "T_i": self.T_i}

    def load_state_dict(self, state_dict: Mapping) -> None:
        super().load_state_dict(state_dict)
        self.T_cur, self.T_i = state_dict["T_cur"], int(state_dict["T_i"])


class OneCycleLR(_Absolute, LRScheduler):
    """The 1cycle policy (PyTorch's ``OneCycleLR``), per batch: from ``max_lr / div_factor``
    up to ``max_lr`` over the first ``pct_start`` of ``total_steps`` (or ``epochs *
    steps_per_epoch``), then down to ``initial_lr / final_div_factor``, annealed by cosine
    (``anneal_strategy='cos'``) or linearly; ``three_phase`` comes back to the initial rate
    symmetrically before the final annihilation.  With ``cycle_momentum`` the momentum (SGD,
    RMSprop) or ``betas[0]`` (Adam family) moves inversely between ``max_momentum`` and
    ``base_momentum``.  Writes ``initial_lr``, ``max_lr``, ``min_lr`` (and ``max_momentum``,
    ``base_momentum``) into the groups, as PyTorch does; stepping past ``total_steps`` raises
    ``ValueError``."""

    def __init__(self, optimizer: Optimizer, max_lr, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None,
                 pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum=0.85, max_momentum=0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        if total_steps is not None:
            self.total_steps = _positive_int("total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = (_positive_int("epochs", epochs)
                                * _positive_int("steps_per_epoch", steps_per_epoch))
        else:
            raise ValueError("You must define either total_steps OR (epochs AND "
                             "steps_per_epoch)")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError("anneal_strategy must be one of 'cos' or 'linear', instead got "
                             f"{anneal_strategy}")
        self.anneal_strategy = anneal_strategy
        n = self.total_steps
        if three_phase:
            self._phases = [(float(pct_start * n) - 1, "initial_lr", "max_lr",
                             "max_momentum", "base_momentum"),
                            (float(2 * pct_start * n) - 2, "max_lr", "initial_lr",
                             "base_momentum", "max_momentum"),
                            (n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            self._phases = [(float(pct_start * n) - 1, "initial_lr", "max_lr",
                             "max_momentum", "base_momentum"),
                            (n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        groups = optimizer.param_groups
        max_lrs = self._per_group("max_lr", max_lr, groups)
        if last_epoch == -1:
            for g, m in zip(groups, max_lrs):
                g["initial_lr"] = m / div_factor
                g["max_lr"] = m
                g["min_lr"] = g["initial_lr"] / final_div_factor
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with "
                                 "`cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            if last_epoch == -1:
                for g, hi, lo in zip(groups, self._per_group("max_momentum", max_momentum,
                                                             groups),
                                     self._per_group("base_momentum", base_momentum, groups)):
                    self._put_momentum(g, hi)
                    g["max_momentum"], g["base_momentum"] = hi, lo
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _per_group(name, value, groups):
        if isinstance(value, (list, tuple)):
            if len(value) != len(groups):
                raise ValueError(f"expected {len(groups)} values for {name}, got {len(value)}")
            return [_real(name, v) for v in value]
        return [_real(name, value)] * len(groups)

    def _put_momentum(self, g, m):
        if self.use_beta1:
            g["betas"] = (m, *g["betas"][1:])
        else:
            g["momentum"] = m

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase_values(self, g, step):
        start = 0.0
        for k, (end, lr0, lr1, m0, m1) in enumerate(self._phases):
            if step <= end or k == len(self._phases) - 1:
                pct = (step - start) / (end - start)
                return (self._anneal(g[lr0], g[lr1], pct),
                        self._anneal(g[m0], g[m1], pct) if self.cycle_momentum else None)
            start = end
        raise AssertionError("unreachable")

    def get_lr(self):
        if self.last_epoch > self.total_steps:
            raise ValueError(f"Tried to step {self.last_epoch} times. The specified number of "
                             f"total steps is {self.total_steps}")
        lrs = []
        for g in self.optimizer.param_groups:
            lr, m = self._phase_values(g, self.last_epoch)
            lrs.append(lr)
            if m is not None:
                self._put_momentum(g, m)
        return lrs

    def _lr(self, i, base_lr, epoch):
        return self._phase_values(self.optimizer.param_groups[i], epoch)[0]

    def load_state_dict(self, state_dict: Mapping) -> None:
        """As the base class, and the momentum (or beta1) of the restored step."""
        super().load_state_dict(state_dict)
        if self.cycle_momentum:
            for g in self.optimizer.param_groups:
                self._put_momentum(g, self._phase_values(g, self.last_epoch)[1])


class ReduceLROnPlateau(LRScheduler):
    """Reduce the rates by ``factor`` when a metric has stopped improving for more than
    ``patience`` epochs (PyTorch's ``ReduceLROnPlateau``): ``step(metric)`` once per epoch.

    Better means ``a < best * (1 - threshold)`` (mode 'min', threshold_mode 'rel'), ``a <
    best - threshold`` ('min', 'abs'), ``a > best * (1 + threshold)`` ('max', 'rel') or ``a >
    best + threshold`` ('max', 'abs').  After a reduction, ``cooldown`` epochs pass before bad
    epochs count again; a group's rate never goes below its ``min_lr`` and changes only by more
    than ``eps``.  Acts on the groups' current rates (not a closed form)."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1,
                 patience: int = 10, threshold: float = 1e-4, threshold_mode: str = "rel",
                 cooldown: int = 0, min_lr=0.0, eps: float = 1e-8):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.factor = _real("factor", factor)
        if self.factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        if mode not in ("min", "max"):
            raise ValueError(f"mode {mode} is unknown!")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"threshold mode {threshold_mode} is unknown!")
        for name, v in (("patience", patience), ("cooldown", cooldown)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        self.optimizer = optimizer
        n = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != n:
                raise ValueError(f"expected {n} min_lrs, got {len(min_lr)}")
            self.min_lrs = [_real("min_lr", v) for v in min_lr]
        else:
            self.min_lrs = [_real("min_lr", min_lr)] * n
        self.mode, self.threshold_mode = mode, threshold_mode
        self.threshold, self.eps = _real("threshold", threshold), _real("eps", eps)
        self.patience, self.cooldown = int(patience), int(cooldown)
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.last_epoch = 0
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self._last_lr = list(self.base_lrs)
        self.best, self.cooldown_counter, self.num_bad_epochs = self.mode_worse, 0, 0

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def is_better(self, a: float, best: float) -> bool:
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel"
                        else best - self.threshold)
        return a > (best * (self.threshold + 1.0) if self.threshold_mode == "rel"
                    else best + self.threshold)

    def step(self, metrics) -> None:  # noqa: D401 - PyTorch's signature
        """One epoch with the observed ``metrics`` (a number)."""
        current = float(metrics)
        self.last_epoch += 1
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g, low in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(g["lr"])
                new = max(old * self.factor, low)
                if old - new > self.eps:
                    g["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [float(g["lr"]) for g in self.optimizer.param_groups]

    def _chain_step(self):
        raise ValueError("ReduceLROnPlateau needs a metric: it cannot be chained")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "best": float(self.best),
                "num_bad_epochs": self.num_bad_epochs, "cooldown_counter": self.cooldown_counter}

    def load_state_dict(self, state_dict: Mapping) -> None:
        super().load_state_dict(state_dict)
        self.best = float(state_dict["best"])
        self.num_bad_epochs = int(state_dict["num_bad_epochs"])
        self.cooldown_counter = int(state_dict["cooldown_counter"])


def _check_children(kind, optimizer, schedulers):
    schedulers = list(schedulers)
    if not schedulers:
        raise ValueError(f"{kind} expects at least one scheduler, but got no scheduler.")
    for k, s in enumerate(schedulers):
        if not isinstance(s, LRScheduler):
            raise TypeError(f"{kind} at index {k} should be a scheduler, got "
                            f"{type(s).__name__}")
        if isinstance(s, ReduceLROnPlateau):
            raise ValueError(f"{kind} does not support `ReduceLROnPlateau` scheduler as it "
                             "requires additional kwargs to be specified when calling `step`, "
                             f"but got one at index {k} in the given schedulers sequence.")
        if s.optimizer is not optimizer:
            raise ValueError(f"{kind} expects all schedulers to belong to the same optimizer, "
                             f"but got scheduler {type(s).__name__} at index {k} with another")
    return schedulers


class _Composite(LRScheduler):
    """State dicts of the combinators: the base items, then each child's under
    ``scheduler.<k>.``."""

    def state_dict(self) -> dict:
        sd = {**super().state_dict(), "num_schedulers": len(self._schedulers)}
        for k, s in enumerate(self._schedulers):
            sd.update({f"scheduler.{k}.{key}": v for key, v in s.state_dict().items()})
        return sd

    def load_state_dict(self, state_dict: Mapping) -> None:
        if int(state_dict["num_schedulers"]) != len(self._schedulers):
            raise ValueError(f"the state dict is for {state_dict['num_schedulers']} "
                             f"schedulers, this one has {len(self._schedulers)}")
        for k, s in enumerate(self._schedulers):
            head = f"scheduler.{k}."
            s.load_state_dict({key[len(head):]: v for key, v in state_dict.items()
                               if key.startswith(head)})
        super().load_state_dict(state_dict)   # last: the combined rates go into the groups

    def _chain_step(self):
        self.step()


def _undo(s):
    """PyTorch's ``recursive_undo``: every (nested) scheduler one epoch back."""
    if isinstance(s, _Composite):
        for c in s._schedulers:
            _undo(c)
    else:
        s.last_epoch -= 1


class SequentialLR(_Composite):
    """Run ``schedulers[k]`` from epoch ``milestones[k - 1]`` on (PyTorch's
    ``SequentialLR``): each child starts at its own epoch 0 at its milestone, from the base
    rates (a warm-up ``LinearLR`` then a ``CosineAnnealingLR``, for example)."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int], last_epoch: int = -1):
        self._schedulers = _check_children("SequentialLR", optimizer, schedulers)
        milestones = list(milestones)
        if len(milestones) != len(self._schedulers) - 1:
            raise ValueError("Sequential Schedulers expects number of schedulers provided to "
                             "be one more than the number of milestone points, but got number "
                             f"of schedulers {len(self._schedulers)} and the number of "
                             f"milestones to be equal to {len(milestones)}")
        self._milestones = [int(m) for m in milestones]
        self.optimizer = optimizer
        self.last_epoch = int(last_epoch) + 1
        for g in optimizer.param_groups:
            g["lr"] = g["initial_lr"]
        self.base_lrs = [float(g["initial_lr"]) for g in optimizer.param_groups]
        for s in self._schedulers:
            _undo(s)
        first = self._schedulers[bisect_right(self._milestones, 0)]
        first.step()
        self._last_lr = first.get_last_lr()

    def step(self) -> None:
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        s = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            s.last_epoch = 0                  # PyTorch: the child's closed form at epoch 0
            s._set_lrs(s.get_lr())
        else:
            s.step()
        self._last_lr = s.get_last_lr()


class ChainedScheduler(_Composite):
    """Step every scheduler of ``schedulers`` at once (PyTorch's ``ChainedScheduler``): each
    applies PyTorch's recursive update to the rate the previous one left, so multiplicative
    schedules compose (``ConstantLR`` then ``ExponentialLR``: ``base * factor * gamma**e``)."""

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None):
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler expects at least one scheduler to be chained, "
                             "but got no scheduler.")
        optimizer = optimizer if optimizer is not None else schedulers[0].optimizer
        self._schedulers = _check_children("ChainedScheduler", optimizer, schedulers)
        self.optimizer = optimizer
        self.last_epoch = 0
        self.base_lrs = [float(g["initial_lr"]) for g in optimizer.param_groups]
        lrs = list(self.base_lrs)               # each child's construction, chained
        for s in self._schedulers:
            if not isinstance(s, (_Absolute, _Composite)) and s.last_epoch == 0:
                lrs = [s._chain_lr(i, lr, 0) for i, lr in enumerate(lrs)]
            elif isinstance(s, (_Absolute, _Composite)):
                lrs = s.get_last_lr()
        self._set_lrs(lrs)

    def step(self) -> None:
        self.last_epoch += 1
        for s in self._schedulers:
            s._chain_step()
        self._last_lr = [float(g["lr"]) for g in self.optimizer.param_groups]
