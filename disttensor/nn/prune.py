"""Pruning of replicated parameters, in the spirit of ``torch.nn.utils.prune``.

The functions have PyTorch's names and arguments (``l1_unstructured(module, name, amount)``,
``random_unstructured``, ``ln_structured(module, name, amount, n, dim)``,
``global_unstructured(parameters, pruning_method, amount=...)``, ``custom_from_mask``,
``identity``, ``remove``, ``is_pruned``) and PyTorch's rules for ``amount``: a float in
``[0, 1]`` is the fraction of the *still unpruned* entries (channels, for structured pruning) to
prune, ``round(amount * n)`` with Python's round (half to even); an int is their number.
Repeated pruning of one parameter therefore compounds, as with PyTorch's pruning containers.

Differences from PyTorch (its known pains, avoided):

* **No hidden copy.** PyTorch replaces ``weight`` by a parameter ``weight_orig`` and a buffer
  ``weight_mask`` and recomputes ``weight = weight_orig * weight_mask`` in a forward pre-hook
  (twice the memory, ``deepcopy`` and ``state_dict`` surprises).  Here the parameter stays
  ``weight`` and is kept **zero at the pruned positions**; the mask is a buffer
  ``<name>_mask`` (state_dict key ``weight_mask``, the parameter's dtype, 1 kept / 0 pruned).
  A pruned model's state dict is the unpruned one plus the ``*_mask`` keys (no ``*_orig``);
  loading it needs the masks registered first (prune with ``custom_from_mask`` or any amount).
  Pruned values are lost: ``remove`` cannot restore them (PyTorch's cannot either).
* **Masks kept through training by every optimizer.** :class:`disttensor.nn.optim.Optimizer`
  multiplies a pruned parameter's gradient by its mask before the update rule and the
  parameter by its mask after it (for ``step`` and the in-backward ``step_parameter``), so no
  rule (momentum, Adam's moments, decoupled weight decay) revives a pruned weight.  ``p.grad``
  itself is left as backward computed it (PyTorch's ``weight_orig.grad`` is zero there;
  gradient clipping here counts the pruned entries' gradients in the norm).
* **deepcopy-safe**: the mask is an ordinary buffer and the parameter refers to its module,
  both copied together.
* Ties between equal magnitudes are broken by position (the lower flat index is pruned first;
  ``torch.topk`` leaves the order unspecified).  A mask of the wrong shape is a ``ValueError``
  (PyTorch: ``AssertionError``).  Random pruning draws from a NumPy generator (``rng``;
  default that of :func:`disttensor.nn.init.manual_seed`), not torch's.

Collective: every pruning call agrees over ``comm`` (default ``MPI.COMM_WORLD``; the ranks
holding replicas of the model) on its arguments *and on the resulting masks*: a rank-dependent
amount, or replicas that differ and so would prune differently, raise
:class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank; bad input raises the
same error on every rank.  The gradual schedule of Zhu & Gupta is
:class:`~disttensor.nn.prune_schedule.GradualPruning`.
"""
from __future__ import annotations

import hashlib
import numbers
from collections.abc import Iterable

import numpy as np
from mpi4py import MPI

from ..core.backend import array_module, to_host
from ..core.entry import agreed, collective_entry
from . import init
from .module import Module

__all__ = ["BasePruningMethod", "Identity", "L1Unstructured", "RandomUnstructured",
           "LnStructured", "CustomFromMask", "identity", "l1_unstructured",
           "random_unstructured", "ln_structured", "global_unstructured", "custom_from_mask",
           "remove", "is_pruned", "mask_of", "pruned_parameters", "sparsity"]


# -- amounts (PyTorch's rules) ---------------------------------------------------------------
def _validate_amount_init(amount) -> None:
    if not isinstance(amount, numbers.Real) or isinstance(amount, bool):
        raise TypeError(f"Invalid type for amount: {amount}. Must be int or float.")
    if (isinstance(amount, numbers.Integral) and amount < 0) or (
            not isinstance(amount, numbers.Integral)
            and not 0.0 <= float(amount) <= 1.0):
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a "
                         "non-negative integer")


def _nparams_toprune(amount, size: int) -> int:
    """How many of ``size`` candidates ``amount`` prunes (PyTorch: an int as it is, a float
    ``round(amount * size)``, half to even); ``ValueError`` for an int above ``size``."""
    if isinstance(amount, numbers.Integral):
        if amount > size:
            raise ValueError(f"amount={amount} should be smaller than the number of parameters "
                             f"to prune={size}")
        return int(amount)
    return round(float(amount) * size)


# -- methods -----------------------------------------------------------------------------------
class BasePruningMethod:
    """A rule computing a mask: :meth:`compute_mask` ``(t, default_mask) -> mask`` on host
    float64 arrays, pruning among the entries (or channels) ``default_mask`` keeps."""
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _prune_smallest(self, scores: np.ndarray, default_mask: np.ndarray) -> np.ndarray:
        """Prune the ``amount`` candidates with the smallest ``scores`` (ties: lower index)."""
        mask = default_mask.copy()
        flat = mask.reshape(-1)
        cand = np.flatnonzero(flat)
        k = _nparams_toprune(self.amount, cand.size)
        if k:
            order = np.argsort(scores.reshape(-1)[cand], kind="stable")
            flat[cand[order[:k]]] = 0
        return mask


class Identity(BasePruningMethod):
    """Prunes nothing (a mask of ones)."""

    def compute_mask(self, t, default_mask):
        return default_mask.copy()


class L1Unstructured(BasePruningMethod):
    """Prune the ``amount`` entries of smallest absolute value."""

    def __init__(self, amount):
        _validate_amount_init(amount)
        self.amount = amount

    def compute_mask(self, t, default_mask):
        return self._prune_smallest(np.abs(t), default_mask)


class RandomUnstructured(BasePruningMethod):
    """Prune ``amount`` entries chosen uniformly at random (``rng``: a NumPy Generator)."""

    def __init__(self, amount, rng=None):
        _validate_amount_init(amount)
        self.amount, self.rng = amount, rng

    def compute_mask(self, t, default_mask):
        return self._prune_smallest(init.resolve_rng(self.rng).random(t.shape), default_mask)


def _channel_norms(t: np.ndarray, n, dim: int) -> np.ndarray:
    rows = np.moveaxis(t, dim, 0).reshape(t.shape[dim], -1)
    if n == "fro":
        n = 2
    if isinstance(n, str) or not isinstance(n, numbers.Real):
        raise ValueError(f"ln_structured: n must be a number, inf, -inf or 'fro', got {n!r}")
    return np.linalg.norm(rows, ord=float(n), axis=1) if rows.shape[1] else \
        np.zeros(rows.shape[0])


class LnStructured(BasePruningMethod):
    """Prune the ``amount`` channels along ``dim`` (of those with any entry left) of smallest
    L``n`` norm (ties: the lower index is pruned first)."""
    PRUNING_TYPE = "structured"

    def __init__(self, amount, n, dim: int = -1):
        _validate_amount_init(amount)
        self.amount, self.n, self.dim = amount, n, dim

    def compute_mask(self, t, default_mask):
        if t.ndim <= 1:
            raise ValueError("Structured pruning can only be applied to multidimensional "
                             f"tensors. Found tensor of shape {t.shape} with {t.ndim} dims")
        if not -t.ndim <= self.dim < t.ndim:
            raise IndexError(f"dim {self.dim} is out of range for a tensor with {t.ndim} dims")
        dim = self.dim % t.ndim
        others = tuple(a for a in range(t.ndim) if a != dim)
        alive = np.flatnonzero(default_mask.sum(axis=others) != 0)
        norms = _channel_norms(np.take(t, alive, axis=dim), self.n, dim)
        k = _nparams_toprune(self.amount, alive.size)
        mask = default_mask.copy()
        if k:
            pruned = alive[np.argsort(norms, kind="stable")[:k]]
            index = [slice(None)] * t.ndim
            index[dim] = pruned
            mask[tuple(index)] = 0
        return mask


class CustomFromMask(BasePruningMethod):
    """Prune where ``mask`` is zero (combined with the mask already there)."""

    def __init__(self, mask):
        self.mask = np.asarray(to_host(mask), dtype=np.float64)

    def compute_mask(self, t, default_mask):
        if self.mask.shape != default_mask.shape:
            raise ValueError(f"custom_from_mask: mask of shape {self.mask.shape} does not fit "
                             f"the parameter of shape {default_mask.shape}")
        return default_mask * (self.mask != 0)


# -- masks on modules ------------------------------------------------------------------------
class _MaskOf:
    """What a pruned parameter carries (``p._pruning``): its module and name, so the
    optimizer finds the current mask buffer (moved by ``Module.to``, copied by deepcopy)."""

    def __init__(self, module: Module, name: str):
        self.module, self.name = module, name

    def mask(self):
        return self.module._buffers.get(self.name + "_mask")


def _parameter(module: Module, name: str):
    if not isinstance(module, Module):
        raise TypeError(f"expected a Module, got {type(module).__name__}")
    p = module._parameters.get(name)
    if p is None:
        raise AttributeError(f"{type(module).__name__!r} has no parameter {name!r}")
    return p


def mask_of(module: Module, name: str):
    """The mask buffer of ``module``'s parameter ``name``, or ``None`` if it is unpruned."""
    p = _parameter(module, name)
    return p._pruning.mask() if getattr(p, "_pruning", None) is not None else None


def _default_mask(module, name) -> np.ndarray:
    m = mask_of(module, name)
    p = _parameter(module, name)
    return np.ones(p.shape) if m is None else np.asarray(to_host(m), dtype=np.float64)


def _scores(module, name, importance_scores) -> np.ndarray:
    p = _parameter(module, name)
    s = p.data if importance_scores is None else importance_scores
    s = np.asarray(to_host(getattr(s, "data", s)), dtype=np.float64)
    if s.shape != tuple(p.shape):
        raise ValueError(f"importance_scores should have the same shape as parameter {name} "
                         f"of {type(module).__name__}: {s.shape} != {tuple(p.shape)}")
    return s


def _install(module, name, mask: np.ndarray) -> None:
    p = _parameter(module, name)
    xp = array_module(p.data)
    m = np.asarray(mask, dtype=p.data.dtype)
    m = m if xp is np else xp.asarray(m)
    module.register_buffer(name + "_mask", m)
    p.data *= m
    p._pruning = _MaskOf(module, name)


def _digest(masks) -> str:
    h = hashlib.blake2b(digest_size=16)
    for m in masks:
        h.update(np.packbits(m.reshape(-1) != 0).tobytes())
    return h.hexdigest()


def compute_agreed(comm, call: str, compute, **args):
    """``compute()`` (a list of host masks) on every rank, agreed over ``comm``: its error,
    ``args`` and a digest of the masks must agree (else the error, or ArgumentMismatchError,
    on every rank)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    masks, err = None, None
    try:
        masks = compute()
    except Exception as e:  # noqa: BLE001 - raised on every rank by agreed below
        err = e
    with agreed(comm, call, masks=None if err else _digest(masks), **args):
        if err is not None:
            raise err
    return masks


def _prune_one(call, module, name, method_factory, importance_scores, comm, **args):
    def compute():
        method = method_factory()
        return [method.compute_mask(_scores(module, name, importance_scores),
                                    _default_mask(module, name))]
    mask, = compute_agreed(comm, call, compute, name=name, **args)
    _install(module, name, mask)
    return module


def _amount_key(amount):
    return ("float", repr(float(amount))) if isinstance(amount, float) else amount


@collective_entry
def identity(module: Module, name: str, *, comm=None) -> Module:
    """Register a mask of ones (a pruned parameter with nothing pruned yet)."""
    return _prune_one("prune.identity", module, name, Identity, None, comm)


@collective_entry
def l1_unstructured(module: Module, name: str, amount, importance_scores=None, *,
                    comm=None) -> Module:
    """Prune ``amount`` entries of ``module.<name>`` of smallest ``|importance_scores|``
    (default the parameter).  Collective over ``comm``; returns ``module``."""
    return _prune_one("prune.l1_unstructured", module, name, lambda: L1Unstructured(amount),
                      importance_scores, comm, amount=_amount_key(amount))


@collective_entry
def random_unstructured(module: Module, name: str, amount, *, rng=None, comm=None) -> Module:
    """Prune ``amount`` random entries (``rng`` must draw alike on every rank: the default,
    :func:`disttensor.nn.init.manual_seed`'s generator, does)."""
    return _prune_one("prune.random_unstructured", module, name,
                      lambda: RandomUnstructured(amount, rng), None, comm,
                      amount=_amount_key(amount))


@collective_entry
def ln_structured(module: Module, name: str, amount, n, dim: int, importance_scores=None, *,
                  comm=None) -> Module:
    """Prune ``amount`` channels along ``dim`` (``dim=0``: a convolution's filters / a
    Linear's output rows) of smallest L``n`` norm (``n``: a number, ``inf``, ``-inf``,
    ``'fro'``)."""
    return _prune_one("prune.ln_structured", module, name, lambda: LnStructured(amount, n, dim),
                      importance_scores, comm, amount=_amount_key(amount), n=repr(n), dim=dim)


@collective_entry
def custom_from_mask(module: Module, name: str, mask, *, comm=None) -> Module:
    """Prune where ``mask`` (the parameter's shape) is zero."""
    return _prune_one("prune.custom_from_mask", module, name, lambda: CustomFromMask(mask),
                      None, comm)


@collective_entry
def global_unstructured(parameters, pruning_method, importance_scores=None, *, comm=None,
                        **kwargs) -> None:
    """Prune the ``(module, name)`` pairs of ``parameters`` together: ``pruning_method``
    (an unstructured class, e.g. :class:`L1Unstructured`, built with ``**kwargs`` such as
    ``amount``) ranks all their unpruned entries at once.  ``importance_scores``: ``{(module,
    name): array}`` (default the parameters)."""
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    pairs = list(parameters)
    scores_of = importance_scores or {}

    def compute():
        if getattr(pruning_method, "PRUNING_TYPE", None) != "unstructured":
            raise TypeError('Only "unstructured" PRUNING_TYPE supported for the '
                            f"`pruning_method`. Found method {pruning_method}")
        method = pruning_method(**kwargs)
        scores = [_scores(m, n, scores_of.get((m, n))) for m, n in pairs]
        defaults = [_default_mask(m, n) for m, n in pairs]
        if not pairs:
            return []
        flat = method.compute_mask(np.concatenate([s.ravel() for s in scores]),
                                   np.concatenate([d.ravel() for d in defaults]))
        cuts = np.cumsum([d.size for d in defaults])[:-1]
        return [f.reshape(d.shape) for f, d in zip(np.split(flat, cuts), defaults)]
    masks = compute_agreed(comm, "prune.global_unstructured", compute,
                           names=[n for _, n in pairs],
                           method=getattr(pruning_method, "__name__", repr(pruning_method)),
                           kwargs={k: _amount_key(v) if k == "amount" else repr(v)
                                   for k, v in kwargs.items() if k != "rng"})
    for (m, n), mask in zip(pairs, masks):
        _install(m, n, mask)


def remove(module: Module, name: str) -> Module:
    """Make the pruning of ``module.<name>`` permanent: drop its mask (the parameter keeps
    its zeros; the optimizer no longer holds them at zero).  Local (no communication)."""
    p = _parameter(module, name)
    if getattr(p, "_pruning", None) is None:
        raise ValueError(f"Parameter '{name}' of module {type(module).__name__} has to be "
                         "pruned before pruning can be removed")
    del module._buffers[name + "_mask"]
    del p._pruning
    return module


def pruned_parameters(module: Module) -> list[tuple[Module, str]]:
    """The ``(module, name)`` pairs of the pruned parameters under ``module``."""
    return [(m, n) for m in module.modules() for n, p in m._parameters.items()
            if p is not None and getattr(p, "_pruning", None) is not None]


def is_pruned(module: Module) -> bool:
    """Whether any parameter of ``module`` or its submodules is pruned."""
    return bool(pruned_parameters(module))


def sparsity(parameters) -> float:
    """Fraction of pruned entries over ``parameters`` (``(module, name)`` pairs, or a module:
    its pruned parameters); 0.0 for none."""
    pairs = pruned_parameters(parameters) if isinstance(parameters, Module) \
        else list(parameters)
    total = zeros = 0
    for m, n in pairs:
        mask = mask_of(m, n)
        size = int(np.prod(_parameter(m, n).shape))
        total += size
        zeros += 0 if mask is None else size - int(array_module(mask).count_nonzero(mask))
    return zeros / total if total else 0.0


from .prune_schedule import GradualPruning, gradual_sparsity, prunable_weights  # noqa: E402

__all__ += ["GradualPruning", "gradual_sparsity", "prunable_weights"]
