"""Gradient hooks: :class:`RemovableHandle`, tensor hooks (``Tensor.register_hook``,
``Tensor.retain_grad``) and the identity "bundle" functions behind modules' full backward
hooks.

Tensor hooks follow PyTorch: ``hook(grad) -> None | new grad`` runs when the tensor's gradient
of the current backward pass is complete, in registration order, and what it returns replaces
the gradient flowing on (a gradient of another shape raises ``RuntimeError``).  On a leaf the
hooks run before the gradient is accumulated into ``.grad``; on a non-leaf before it enters
the backward of the function that made the tensor.  ``retain_grad()`` keeps a non-leaf's
gradient in ``.grad`` (accumulated over passes, after its other hooks, as PyTorch).  Under a
data-parallel reducer (``deferred_reduction``) a parameter's hooks see this rank's *share* of
its gradient (the per-rank contribution the reducer sums), not the summed gradient.  Hooks run
on every rank; the checks read only global metadata (shapes), so deterministic hooks raise
alike on every rank.

Bundles: :func:`bundle` makes one graph node over several tensors and returns one identity
tensor per input; backward gives that node all of their gradients at once (a
:class:`GradBundle`), which is what a module's ``register_full_backward_hook`` needs
(``grad_input`` as one tuple) and ``register_full_backward_pre_hook`` (``grad_output``).
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict

import numpy as np

from ..core.array import DistArray
from .tensor import Tensor, make_result

__all__ = ["RemovableHandle", "register_tensor_hook", "retain_grad", "run_tensor_hooks",
           "GradBundle", "bundle", "grad_shape"]

_ids = itertools.count()


class RemovableHandle:
    """What ``register_*hook`` returns: :meth:`remove` unregisters the hook (idempotent);
    usable as a context manager (removed on exit), as PyTorch's
    ``torch.utils.hooks.RemovableHandle``."""

    def __init__(self, hooks_dict, *extra_dicts):
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = next(_ids)
        self.extra_dict_refs = tuple(weakref.ref(d) for d in extra_dicts)

    def remove(self) -> None:
        for ref in (self.hooks_dict_ref,) + self.extra_dict_refs:
            d = ref()
            if d is not None:
                d.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class _HookDict(OrderedDict):
    """An ordered dict that weak references can point at (handles hold weak references)."""


def hook_dict() -> OrderedDict:
    return _HookDict()


def add_hook(hooks: OrderedDict, hook, prepend: bool = False, *extra) -> RemovableHandle:
    """Register ``hook`` in ``hooks`` (first with ``prepend``); ``TypeError`` unless callable."""
    if not callable(hook):
        raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
    handle = RemovableHandle(hooks, *extra)
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def grad_shape(g):
    """The global shape of a gradient (DistArray, array or number)."""
    if isinstance(g, DistArray):
        return g.shape
    return tuple(np.shape(g))


def run_tensor_hooks(hooks, g, what: str = "tensor"):
    """Apply ``hooks`` (callables ``hook(grad) -> None | grad``) in order to gradient ``g``."""
    for hook in list(hooks):
        out = hook(g)
        if out is None:
            continue
        out = out.data if isinstance(out, Tensor) else out
        if grad_shape(out) != grad_shape(g):
            raise RuntimeError(f"hook {getattr(hook, '__name__', hook)!r} has changed the size "
                               f"of the {what}'s gradient: it returned shape "
                               f"{grad_shape(out)}, the gradient has shape {grad_shape(g)}")
        g = out
    return g


def _add(a, b):
    if a is None:
        return b.copy() if hasattr(b, "copy") else b
    if isinstance(a, DistArray):
        if b.distribution != a.distribution or b.grid is not a.grid:
            b = b.redistribute(grid=a.grid, distribution=a.distribution)
        return DistArray(a.local + b.local, a.distribution, a.grid)
    return a + b


def _wrap_node(t: Tensor) -> None:
    """Make ``t.node``'s backward run ``t``'s gradient hooks (and retain its gradient) first."""
    if t.__dict__.get("_node_hooked"):
        return
    t._node_hooked = True
    hooks = t.__dict__.setdefault("_grad_hooks", hook_dict())
    ref = weakref.ref(t)
    node = t.node
    inner = node.backward

    def backward(g):
        g = run_tensor_hooks(hooks.values(), g)
        tt = ref()
        if tt is not None and tt.__dict__.get("_retains_grad"):
            tt.grad = _add(tt.grad, g)
        return inner(g)
    if inner is not None:
        node.backward = backward


def register_tensor_hook(t: Tensor, hook) -> RemovableHandle:
    """``Tensor.register_hook`` (module docstring)."""
    if not t.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    hooks = t.__dict__.setdefault("_grad_hooks", hook_dict())
    handle = add_hook(hooks, hook)
    if not t.is_leaf:
        _wrap_node(t)
    return handle


def retain_grad(t: Tensor) -> None:
    """``Tensor.retain_grad``: keep a non-leaf's gradient in ``.grad`` (no-op on leaves)."""
    if not t.requires_grad:
        raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
    if t.is_leaf:
        return
    t._retains_grad = True
    _wrap_node(t)


class GradBundle:
    """The gradients of a :func:`bundle`'s members (``None`` where none arrived); adding two
    adds slot by slot (the engine sums a node's incoming gradients with ``+``)."""
    __slots__ = ("grads",)

    def __init__(self, grads):
        self.grads = list(grads)

    def __add__(self, other: "GradBundle") -> "GradBundle":
        return GradBundle([b if a is None else a if b is None else _add(a, b)
                           for a, b in zip(self.grads, other.grads)])

    def copy(self) -> "GradBundle":
        return GradBundle(self.grads)


def bundle(tensors, on_grads, name: str = "bundle"):
    """Identity tensors for ``tensors`` (Tensors or other values) sharing one graph node.

    Returns a list like ``tensors`` where each Tensor that requires grad is replaced by a new
    tensor of the same value.  In backward, once every gradient of those replacements is in,
    ``on_grads(grads)`` runs with the list of gradients (``None`` for members that are not
    differentiable or got none) and returns the list to pass on to the originals (or ``None``:
    unchanged)."""
    tensors = list(tensors)
    idx = [i for i, t in enumerate(tensors) if isinstance(t, Tensor) and t.requires_grad]
    if not idx:
        return tensors
    members = [tensors[i] for i in idx]

    def backward(gb):
        full = [None] * len(tensors)
        for i, g in zip(idx, gb.grads):
            full[i] = g
        out = on_grads(full)
        out = full if out is None else list(out)
        return tuple(out[i] for i in idx)
    hub = make_result(tuple(t.data for t in members), members, backward, name)
    if not hub.requires_grad:  # under no_grad: nothing is recorded
        return tensors
    out = list(tensors)
    for k, i in enumerate(idx):
        def pick(g, k=k):
            grads = [None] * len(idx)
            grads[k] = g
            return (GradBundle(grads),)
        out[i] = make_result(tensors[i].data, (hub,), pick, f"{name}[{k}]")
    return out
