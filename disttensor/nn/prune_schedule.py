"""Gradual magnitude pruning on the cubic schedule of Zhu & Gupta ("To prune, or not to
prune", 2017): over ``n`` pruning steps ``t = t0, t0 + dt, ..., t0 + n*dt`` the sparsity rises

    s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt)) ** 3

from ``s_i`` (initial) to ``s_f`` (final), fast at first and slowly at the end, while training
goes on between the steps and the optimizer keeps the masks (:mod:`disttensor.nn.prune`).
"""
from __future__ import annotations

import numbers

import numpy as np

from .layers import Linear, _ConvNd
from .module import Module
from .prune import (L1Unstructured, RandomUnstructured, _parameter, compute_agreed,
                    _default_mask, _install, _scores, sparsity)

__all__ = ["GradualPruning", "gradual_sparsity", "prunable_weights"]


def gradual_sparsity(step: int, final_sparsity: float, start_step: int, end_step: int,
                     frequency: int, initial_sparsity: float = 0.0) -> float | None:
    """Zhu & Gupta's target sparsity at training step ``step`` if it is a pruning step
    (``start_step + k * frequency <= end_step``), else ``None``.  ``n = (end_step -
    start_step) // frequency`` pruning intervals; with ``n == 0`` the one pruning step
    ``start_step`` goes straight to ``final_sparsity``."""
    if step < start_step or (step - start_step) % frequency:
        return None
    n = (end_step - start_step) // frequency
    k = (step - start_step) // frequency
    if k > n:
        return None
    if n == 0:
        return float(final_sparsity)
    return float(final_sparsity + (initial_sparsity - final_sparsity) * (1 - k / n) ** 3)


def prunable_weights(model: Module, kinds=(Linear, _ConvNd)) -> list[tuple[Module, str]]:
    """``(module, 'weight')`` for every submodule of ``model`` that is an instance of one of
    ``kinds`` (default: Linear and every convolution), in model order."""
    return [(m, "weight") for m in model.modules() if isinstance(m, tuple(kinds))]


def _fraction(name, v) -> float:
    if not isinstance(v, numbers.Real) or isinstance(v, bool) or not 0.0 <= float(v) <= 1.0:
        raise ValueError(f"{name} must be a sparsity in [0, 1], got {v!r}")
    return float(v)


class GradualPruning:
    """Prune ``params`` (a model: its Linear and convolution weights; or ``(module, name)``
    pairs) to ``final_sparsity`` on Zhu & Gupta's schedule.

    Call :meth:`step` once per training step, after ``optimizer.step()``; the ``k``-th call
    (from 0) is schedule step ``t = k``.  At each pruning step every parameter
    (``scope='layer'``) or all together (``scope='global'``) is pruned by ``method``
    (``'l1'`` magnitude or ``'random'``) until ``round(s_t * size)`` entries are pruned
    (entries once pruned stay pruned).  Collective over ``comm`` at the pruning steps (every
    rank must call :meth:`step` alike).  ``state_dict``/``load_state_dict`` keep the counter.
    """

    def __init__(self, params, final_sparsity: float, start_step: int, end_step: int,
                 frequency: int, initial_sparsity: float = 0.0, method: str = "l1",
                 scope: str = "layer", *, rng=None, comm=None):
        self.pairs = prunable_weights(params) if isinstance(params, Module) else list(params)
        for m, n in self.pairs:
            _parameter(m, n)
        self.final_sparsity = _fraction("final_sparsity", final_sparsity)
        self.initial_sparsity = _fraction("initial_sparsity", initial_sparsity)
        if int(frequency) < 1:
            raise ValueError(f"frequency must be >= 1, got {frequency}")
        if int(start_step) < 0 or int(end_step) < int(start_step):
            raise ValueError(f"need 0 <= start_step <= end_step, got {start_step}, {end_step}")
        if method not in ("l1", "random"):
            raise ValueError(f"method must be 'l1' or 'random', got {method!r}")
        if scope not in ("layer", "global"):
            raise ValueError(f"scope must be 'layer' or 'global', got {scope!r}")
        self.start_step, self.end_step = int(start_step), int(end_step)
        self.frequency, self.method, self.scope = int(frequency), method, scope
        self.rng, self.comm = rng, comm
        self.last_step = -1

    def sparsity_at(self, step: int) -> float | None:
        """The target sparsity at schedule step ``step`` (``None``: no pruning then)."""
        return gradual_sparsity(step, self.final_sparsity, self.start_step, self.end_step,
                                self.frequency, self.initial_sparsity)

    def sparsity(self) -> float:
        """The fraction of pruned entries over the scheduled parameters now."""
        return sparsity(self.pairs)

    def _method(self, count: int):
        return L1Unstructured(count) if self.method == "l1" else \
            RandomUnstructured(count, self.rng)

    def _masks(self, target: float) -> list:
        scores = [_scores(m, n, None) for m, n in self.pairs]
        defaults = [_default_mask(m, n) for m, n in self.pairs]
        if self.scope == "layer":
            return [self._method(max(round(target * d.size) - int(d.size - d.sum()), 0))
                    .compute_mask(s, d) for s, d in zip(scores, defaults)]
        flat = np.concatenate([d.ravel() for d in defaults])
        extra = max(round(target * flat.size) - int(flat.size - flat.sum()), 0)
        mask = self._method(extra).compute_mask(np.concatenate([s.ravel() for s in scores]),
                                                flat)
        cuts = np.cumsum([d.size for d in defaults])[:-1]
        return [f.reshape(d.shape) for f, d in zip(np.split(mask, cuts), defaults)]

    def step(self) -> float | None:
        """Advance the schedule by one training step; prune if it is a pruning step.
        Returns the target sparsity applied, or ``None``."""
        self.last_step += 1
        target = self.sparsity_at(self.last_step)
        if target is None:
            return None
        masks = compute_agreed(self.comm, "prune.GradualPruning.step",
                               lambda: self._masks(target), step=self.last_step,
                               target=("float", repr(target)),
                               names=[n for _, n in self.pairs])
        for (m, n), mask in zip(self.pairs, masks):
            _install(m, n, mask)
        return target

    def state_dict(self) -> dict:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = int(state["last_step"])
