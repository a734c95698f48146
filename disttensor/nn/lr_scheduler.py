"""Learning-rate schedules in PyTorch's style, acting on an optimizer's parameter groups.

Each scheduler sets ``group["lr"]`` of every group of its optimizer. Construction records
``group["initial_lr"]`` (the base lr, kept across restarts as in PyTorch) and applies epoch 0;
each ``step()`` advances one epoch (or iteration: whatever unit the caller counts) and sets
the new rates; ``get_last_lr()`` returns them.

Every rate is computed in closed form from ``(base_lr, epoch)`` (PyTorch's
``_get_closed_form_lr`` where it has one), not by PyTorch's recursive updates of the current
``lr``: the values are exact to the formulas below, whatever the number of steps, and a
scheduler resumed from a state dict continues bit for bit. Standing alone, each one
overwrites ``group["lr"]``; under :class:`~.lr_scheduler_more.ChainedScheduler` each applies
PyTorch's recursive step to the current rate instead (``_chain_lr``), so chains compose as in
PyTorch.

``state_dict()`` is a flat dict of Python scalars, so its items can go straight into the
``scalars`` of :func:`disttensor.io.save_checkpoint`::

    {"last_epoch": int, "num_groups": int, "base_lr.<i>": float, "last_lr.<i>": float}

Hyper-parameters (step sizes, milestones, lambdas) are constructor arguments, not state: build
the scheduler with the same arguments, then ``load_state_dict``. ``load_state_dict`` also puts
the saved rates back into the optimizer's groups (``lr = last_lr``, ``initial_lr = base_lr``),
so a resume gives the saved rate whatever the order of ``opt.load_state_dict``, building the
scheduler and ``sched.load_state_dict`` (PyTorch's own ``load_state_dict`` leaves ``lr`` to the
optimizer; building a scheduler there keeps the group's current rate at epoch 0, ours sets the
closed form's rate, which the scheduler's state then overrides).

More schedulers (:class:`ExponentialLR`, :class:`PolynomialLR`, :class:`ConstantLR`,
:class:`CosineAnnealingWarmRestarts`, :class:`OneCycleLR`, :class:`ReduceLROnPlateau`,
:class:`SequentialLR`, :class:`ChainedScheduler`) live in :mod:`.lr_scheduler_more` and are
re-exported here.
"""
from __future__ import annotations

import math
import numbers
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence

from .optim import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "LinearLR", "StepLR", "MultiStepLR",
           "CosineAnnealingLR", "CosmoFlowLR", "HybridCosineLinearLR", "ExponentialLR",
           "PolynomialLR", "ConstantLR", "CosineAnnealingWarmRestarts", "OneCycleLR",
           "ReduceLROnPlateau", "SequentialLR", "ChainedScheduler"]


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def _real(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(float(v)):
        raise ValueError(f"{name} must be a real number, got {v!r}")
    return float(v)


class LRScheduler:
    """Base class. Subclasses define ``_lr(i, base_lr, epoch)``: the rate of group ``i`` at
    ``epoch`` (>= 0) given its base rate."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        if isinstance(last_epoch, bool) or not isinstance(last_epoch, numbers.Integral) \
                or last_epoch < -1:
            raise ValueError(f"last_epoch must be an integer >= -1, got {last_epoch!r}")
        self.optimizer = optimizer
        if last_epoch == -1:
            for g in optimizer.param_groups:
                g.setdefault("initial_lr", g["lr"])
        else:
            for i, g in enumerate(optimizer.param_groups):
                if "initial_lr" not in g:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] "
                                   "when resuming an optimizer")
        self.base_lrs = [float(g["initial_lr"]) for g in optimizer.param_groups]
        self.last_epoch = int(last_epoch)
        self._last_lr: list[float] = []
        self.step()

    def _lr(self, i: int, base_lr: float, epoch: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} must define _lr")

    def get_lr(self) -> list[float]:
        """The rates of the current epoch (``last_epoch``), one per group."""
        return [float(self._lr(i, b, self.last_epoch)) for i, b in enumerate(self.base_lrs)]

    def step(self) -> None:
        """Advance one epoch and set every group's ``lr``."""
        self.last_epoch += 1
        self._set_lrs(self.get_lr())

    def _set_lrs(self, lrs) -> None:
        lrs = [float(lr) for lr in lrs]
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
        self._last_lr = lrs

    def _chain_lr(self, i: int, lr: float, epoch: int) -> float:
        """PyTorch's recursive rate of group ``i`` at ``epoch`` from its current rate ``lr``
        (what ``get_lr`` computes there, used by :class:`ChainedScheduler`): for the
        multiplicative schedules ``lr * closed(epoch) / closed(epoch - 1)`` (epoch 0: the
        factor ``closed(0) / base_lr``)."""
        base = self.base_lrs[i]
        prev = base if epoch == 0 else self._lr(i, base, epoch - 1)
        cur = self._lr(i, base, epoch)
        return cur if prev == 0 else lr * (cur / prev)

    def _chain_step(self) -> None:
        """One step under :class:`ChainedScheduler`: PyTorch's recursive update of the
        groups' current rates."""
        self.last_epoch += 1
        self._set_lrs([self._chain_lr(i, g["lr"], self.last_epoch)
                       for i, g in enumerate(self.optimizer.param_groups)])

    def get_last_lr(self) -> list[float]:
        """The rates the last ``step`` (or the construction) set, one per group."""
        return list(self._last_lr)

    def state_dict(self) -> dict:
        """Flat dict of Python scalars (module docstring)."""
        sd = {"last_epoch": self.last_epoch, "num_groups": len(self.base_lrs)}
        for i, (b, lr) in enumerate(zip(self.base_lrs, self._last_lr)):
            sd[f"base_lr.{i}"] = b
            sd[f"last_lr.{i}"] = lr
        return sd

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore a :meth:`state_dict`, and the saved rates into the optimizer's groups
        (``lr = last_lr``, ``initial_lr = base_lr``), so that the order of the optimizer's and
        the scheduler's ``load_state_dict`` does not matter; the next ``step`` continues the
        schedule."""
        n = int(state_dict["num_groups"])
        if n != len(self.optimizer.param_groups):
            raise ValueError(f"the state dict is for {n} parameter groups, the optimizer has "
                             f"{len(self.optimizer.param_groups)}")
        self.last_epoch = int(state_dict["last_epoch"])
        self.base_lrs = [float(state_dict[f"base_lr.{i}"]) for i in range(n)]
        self._last_lr = [float(state_dict[f"last_lr.{i}"]) for i in range(n)]
        for g, base, lr in zip(self.optimizer.param_groups, self.base_lrs, self._last_lr):
            g["initial_lr"], g["lr"] = base, lr


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)``; ``lr_lambda`` is one function or a list with one
    per parameter group. Linear warm-up over ``w`` epochs, for example:
    ``LambdaLR(opt, lambda e: min(1.0, (e + 1) / w))``."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable | Sequence[Callable],
                 last_epoch: int = -1):
        n = len(optimizer.param_groups)
        if callable(lr_lambda):
            self.lr_lambdas = [lr_lambda] * n
        else:
            lr_lambda = list(lr_lambda)
            if len(lr_lambda) != n:
                raise ValueError(f"Expected {n} lr_lambdas, but got {len(lr_lambda)}")
            if not all(callable(f) for f in lr_lambda):
                raise TypeError("lr_lambda must be a callable or a list of callables")
            self.lr_lambdas = lr_lambda
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return base_lr * self.lr_lambdas[i](epoch)

    def _chain_lr(self, i, lr, epoch):
        return self._lr(i, self.base_lrs[i], epoch)  # PyTorch's LambdaLR is absolute


class LinearLR(LRScheduler):
    """PyTorch's ``LinearLR``: the factor goes linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` epochs, then stays::

        lr = base_lr * (start + (end - start) * min(total_iters, epoch) / total_iters)
    """

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1):
        start_factor, end_factor = _real("start_factor", start_factor), _real("end_factor",
                                                                                end_factor)
        if not 0 < start_factor <= 1:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and "
                             "less or equal to 1.")
        if not 0 <= end_factor <= 1:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor, self.end_factor = start_factor, end_factor
        self.total_iters = _positive_int("total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor)
                          * min(self.total_iters, epoch) / self.total_iters)


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1):
        self.step_size = _positive_int("step_size", step_size)
        self.gamma = _real("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """``lr = base_lr * gamma ** (number of milestones <= epoch)`` (a milestone listed twice
    counts twice, as in PyTorch)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1,
                 last_epoch: int = -1):
        ms = list(milestones)
        for m in ms:
            if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 0:
                raise ValueError(f"milestones must be non-negative integers, got {milestones!r}")
        self.milestones = sorted(int(m) for m in ms)
        self.gamma = _real("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return base_lr * self.gamma ** bisect_right(self.milestones, epoch)


class CosineAnnealingLR(LRScheduler):
    """PyTorch's closed form of ``CosineAnnealingLR``::

        lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2

    (past ``T_max`` the cosine goes on, rising again, as PyTorch's closed form does)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1):
        self.T_max = _positive_int("T_max", T_max)
        self.eta_min = _real("eta_min", eta_min)
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        return self.eta_min + (base_lr - self.eta_min) * (
            1 + math.cos(math.pi * epoch / self.T_max)) / 2

    def _chain_lr(self, i, lr, epoch):
        """PyTorch's recursive ``CosineAnnealingLR.get_lr``."""
        if epoch == 0:
            return lr
        T, eta = self.T_max, self.eta_min
        if (epoch - 1 - T) % (2 * T) == 0:
            return lr + (self.base_lrs[i] - eta) * (1 - math.cos(math.pi / T)) / 2
        return ((1 + math.cos(math.pi * epoch / T)) / (1 + math.cos(math.pi * (epoch - 1) / T))
                * (lr - eta) + eta)


class CosmoFlowLR(LRScheduler):
    """The learning-rate schedule of the MLPerf HPC CosmoFlow reference (``_lr_schedule`` in
    its ``utils/optimizers.py``), per epoch counted from 0.

    The group's ``lr`` is the peak rate (MLPerf's ``opt_base_learning_rate``: the reference's
    ``base_lr`` scaled to the global batch size); ``warmup_factor`` is the reference's scale
    factor (MLPerf's ``opt_learning_rate_warmup_factor``), so the warm-up starts from
    ``lr / warmup_factor``::

        epoch < warmup_epochs:  lr(epoch) = lr0 + epoch * (lr - lr0) / warmup_epochs,
                                with lr0 = lr / warmup_factor
        otherwise:              lr(epoch) = lr * factor of the latest boundary b with b < epoch
                                (1 before the first boundary)

    The decay factors multiply the peak rate and do not compound: with the defaults
    (boundaries 32 and 64, factors 0.25 and 0.125, the reference's ``cosmo.yaml``) the rate is
    ``lr`` up to epoch 32, ``0.25 * lr`` for epochs 33..64 and ``0.125 * lr`` from epoch 65,
    the reference's strict ``b < epoch`` comparison included (its Keras scheduler counts epochs
    from 0 as this one does). ``warmup_factor=1`` (the default: global batch size equal to the
    reference's base batch size) means no warm-up.
    """

    def __init__(self, optimizer: Optimizer, warmup_epochs: int = 4, warmup_factor: float = 1.0,
                 boundaries: Sequence[int] = (32, 64), factors: Sequence[float] = (0.25, 0.125),
                 last_epoch: int = -1):
        if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, numbers.Integral) \
                or warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be a non-negative integer, got "
                             f"{warmup_epochs!r}")
        self.warmup_epochs = int(warmup_epochs)
        self.warmup_factor = _real("warmup_factor", warmup_factor)
        if not self.warmup_factor > 0:
            raise ValueError(f"warmup_factor must be positive, got {warmup_factor!r}")
        boundaries, factors = list(boundaries), [_real("factors", f) for f in factors]
        if len(boundaries) != len(factors):
            raise ValueError(f"boundaries and factors must have the same length, got "
                             f"{len(boundaries)} and {len(factors)}")
        for b in boundaries:
            if isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 0:
                raise ValueError(f"boundaries must be non-negative integers, got {boundaries!r}")
        if len(set(boundaries)) != len(boundaries):
            raise ValueError(f"boundaries must be distinct, got {boundaries!r}")
        order = sorted(range(len(boundaries)), key=lambda k: boundaries[k])
        self.boundaries = [int(boundaries[k]) for k in order]
        self.factors = [factors[k] for k in order]
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        if epoch < self.warmup_epochs:
            lr0 = base_lr / self.warmup_factor
            return epoch * (base_lr - lr0) / self.warmup_epochs + lr0
        k = bisect_right(self.boundaries, epoch - 1)  # boundaries b < epoch
        return base_lr * (self.factors[k - 1] if k else 1.0)


class HybridCosineLinearLR(LRScheduler):
    """GroPipe's hybrid cosine + linear decay, after an optional linear warm-up.

    GroPipe (seed 004) names a "hybrid learning-rate decay mixing cosine and linear decay"
    without giving a formula; this is our reading: a weighted mix, with weight ``w =
    cosine_weight``, of a cosine decay and a linear decay, both from the base rate to
    ``eta_min`` over the ``T = total_steps - warmup_steps`` steps that follow the warm-up.
    With ``W = warmup_steps``, ``s = warmup_start_factor`` and ``e`` the scheduler's epoch
    (a step: call ``step()`` once per optimizer step)::

        e < W:   lr = base_lr * (s + (1 - s) * e / W)                    (linear warm-up)
        e >= W:  t = min(e - W, T)
                 lr = eta_min + (base_lr - eta_min)
                               * (w * (1 + cos(pi * t / T)) / 2 + (1 - w) * (1 - t / T))

    so ``lr = base_lr`` at ``e = W`` and ``lr = eta_min`` from ``e = total_steps`` on (the
    rate stays there, it does not rise again as :class:`CosineAnnealingLR`'s closed form
    does). ``w = 1`` is :class:`CosineAnnealingLR` (``T_max = T``) and ``w = 0`` a linear
    decay (:class:`LinearLR` from 1 to 0 when ``eta_min = 0``), for ``t`` in ``[0, T]``. At
    the middle of the decay, ``t = T / 2``, both parts give the same rate ``(base_lr +
    eta_min) / 2``, whatever ``w``; the cosine part decays more slowly before the middle and
    faster after it, so ``w`` trades a longer high-rate phase against a smoother end.

    Arguments (``ValueError`` on bad values): ``total_steps`` a positive integer, the length
    of the whole schedule including the warm-up; ``warmup_steps`` an integer in ``[0,
    total_steps)``; ``cosine_weight`` in ``[0, 1]``; ``eta_min`` a finite number ``>= 0``;
    ``warmup_start_factor`` in ``[0, 1]`` (0, the default, starts the warm-up from a zero rate
    as the usual transformer schedules do).
    """

    def __init__(self, optimizer: Optimizer, total_steps: int, warmup_steps: int = 0,
                 cosine_weight: float = 0.5, eta_min: float = 0.0,
                 warmup_start_factor: float = 0.0, last_epoch: int = -1):
        self.total_steps = _positive_int("total_steps", total_steps)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, numbers.Integral) \
                or not 0 <= warmup_steps < self.total_steps:
            raise ValueError(f"warmup_steps must be an integer in [0, total_steps = "
                             f"{self.total_steps}), got {warmup_steps!r}")
        self.warmup_steps = int(warmup_steps)
        self.cosine_weight = _real("cosine_weight", cosine_weight)
        if not 0.0 <= self.cosine_weight <= 1.0:
            raise ValueError(f"cosine_weight must be in [0, 1], got {cosine_weight!r}")
        self.eta_min = _real("eta_min", eta_min)
        if not 0.0 <= self.eta_min < math.inf:
            raise ValueError(f"eta_min must be a finite number >= 0, got {eta_min!r}")
        self.warmup_start_factor = _real("warmup_start_factor", warmup_start_factor)
        if not 0.0 <= self.warmup_start_factor <= 1.0:
            raise ValueError(f"warmup_start_factor must be in [0, 1], got "
                             f"{warmup_start_factor!r}")
        super().__init__(optimizer, last_epoch)

    def _lr(self, i, base_lr, epoch):
        w_steps = self.warmup_steps
        if epoch < w_steps:
            s = self.warmup_start_factor
            return base_lr * (s + (1 - s) * epoch / w_steps)
        T = self.total_steps - w_steps
        t = min(epoch - w_steps, T)
        w = self.cosine_weight
        return self.eta_min + (base_lr - self.eta_min) * (
            w * (1 + math.cos(math.pi * t / T)) / 2 + (1 - w) * (1 - t / T))


from .lr_scheduler_more import (ChainedScheduler, ConstantLR,  # noqa: E402  (subclasses)
                                CosineAnnealingWarmRestarts, ExponentialLR, OneCycleLR,
                                PolynomialLR, ReduceLROnPlateau, SequentialLR)
