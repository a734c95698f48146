"""Recompute: :func:`checkpoint` runs a module without keeping its saved state and re-runs it
in backward (activation checkpointing), putting the module's buffers (running statistics,
dropout counters) back so the result is the plain model's.

Collective exactly when the module's forward is: every rank recomputes the same layers in the
same order during backward, so collective ops inside stay matched.
"""
from __future__ import annotations

import weakref

from ...autograd.saved import backward_subgraph, record_node
from ...autograd.tensor import Node, Tensor, as_tensor, enable_grad, is_grad_enabled, no_grad

__all__ = ["checkpoint"]


# -- buffers (running statistics, dropout counters) -------------------------------------------
def _buffer_slots(module) -> list:
    """``(buffers dict, name)`` of every buffer of ``module`` (or of a list of modules)."""
    mods = module if isinstance(module, (list, tuple)) else [module]
    out, seen = [], set()
    for top in mods:
        for m in top.modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            for name, b in m._buffers.items():
                if b is not None:
                    out.append((m._buffers, name))
    return out


def _snapshot(slots) -> list:
    return [d[name].copy() for d, name in slots]


def _restore(slots, values) -> None:
    for (d, name), v in zip(slots, values):
        cur = d[name]
        if getattr(cur, "shape", None) == v.shape:
            cur[...] = v
        else:
            d[name] = v.copy()


# -- recompute ---------------------------------------------------------------------------------
def checkpoint(module, x) -> Tensor:
    """``module(x)`` recomputed in backward instead of keeping its saved state (activation
    checkpointing).

    The forward runs under :func:`~disttensor.autograd.no_grad` and keeps only the input ``x``;
    the backward re-runs ``module(x)`` with gradients recorded and backpropagates the incoming
    gradient through it: the parameters' gradients go to them as in an ordinary backward
    (gradient-ready hooks, data-parallel reducers included), the input's gradient goes on to
    the rest of the graph.  ``module``: a :class:`~disttensor.nn.Module` (a
    :class:`~disttensor.nn.Sequential` for a run of layers).

    Buffers are handled so that the result is the plain model's: every buffer of ``module``
    (dropout counters, batch-norm running statistics and batch counts) is set back to its value
    before the first forward while the recomputation runs, then to its value after it, so
    dropout draws the same mask again and running statistics are updated once.  The module's
    ``training`` mode must not change between forward and backward.  After the recomputation
    the output tensor's ``data`` is the recomputed array (equal values; the first forward's
    copy is then freed unless referenced elsewhere).  A parameter used both inside and
    outside the checkpoint (or in two checkpoints) gets its gradient in two parts, each
    announced to its gradient-ready hooks: correct in ``.grad``, but a data-parallel reducer
    expects one announcement per pass, so do not share weights across checkpoints under
    :class:`~disttensor.nn.DistributedDataParallel`.  Collective exactly when
    ``module``'s forward is (every rank recomputes the same layers in the same order)."""
    xt = as_tensor(x)
    if not is_grad_enabled():
        return module(xt)
    slots = _buffer_slots(module)
    before = _snapshot(slots)
    with no_grad():
        y = module(xt)
    if not isinstance(y, Tensor):
        raise TypeError(f"checkpoint: the module returned {type(y).__name__}, not a Tensor")
    needs_params = any(p.requires_grad for p in module.parameters())
    if not xt.requires_grad and not needs_params:
        return y

    def backward(g):
        after = _snapshot(slots)
        _restore(slots, before)
        try:
            xd = Tensor(xt.data, requires_grad=xt.requires_grad)
            got = []
            if xd.requires_grad:
                xd.register_grad_ready_hook(lambda t, gx: got.append(gx) or gx is not None)
            with enable_grad():
                y2 = module(xd)
        finally:
            _restore(slots, after)
        res = ref()
        if res is not None:  # drop the first forward's copy: the recomputed one is equal
            res.data = y2.data
        del res
        backward_subgraph(y2, g)
        return (got[0] if got else None,)

    out = Tensor(y.data)
    ref = weakref.ref(out)
    out.requires_grad = True
    out.node = Node((xt if xt.requires_grad else None,), backward, "checkpoint")
    record_node(out.node)
    return out
