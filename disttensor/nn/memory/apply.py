"""Applying a :class:`~.planner.MemoryPlan`: :func:`apply_plan` wraps the layers in a
:class:`PlannedModel` whose forward runs each segment of ``recompute`` layers as one
:func:`~.recompute.checkpoint` and moves each ``offload`` layer's saved arrays to host memory,
prefetching them back in backward (:class:`~disttensor.autograd.saved.OffloadGroup`; on CPU
offload is simulated: bytes are counted, nothing moves).

Collective when the layers are.
"""
from __future__ import annotations

from ...autograd.saved import OffloadGroup, record_nodes, run_before_backward
from ...autograd.tensor import as_tensor, is_grad_enabled
from ..module import Module, ModuleList, Sequential
from .planner import MemoryPlan
from .profiling import _exclude_ids, _layer_list
from .recompute import checkpoint

__all__ = ["PlannedModel", "apply_plan"]


class PlannedModel(Module):
    """``layers`` applied in order with a :class:`MemoryPlan` (see :func:`apply_plan`).

    Parameters are those of the layers (named ``layers.<i>.<name>``).  ``offload_stats``
    holds, for the last forward, the bytes moved to the host (``offloaded_bytes``, GPU) and
    the bytes whose move was simulated (``simulated_bytes``, CPU)."""

    def __init__(self, layers, plan, copy_host: bool = False):
        super().__init__()
        self.copy_host = bool(copy_host)
        plan = plan if isinstance(plan, MemoryPlan) else MemoryPlan(tuple(plan))
        layers = list(layers)
        if len(plan.choices) != len(layers):
            raise ValueError(f"apply_plan: the plan has {len(plan.choices)} choices for "
                             f"{len(layers)} layers")
        self.layers = ModuleList(layers)
        self.plan = plan
        self.offload_stats = {"offloaded_bytes": 0, "simulated_bytes": 0}
        segs = {j: Sequential(*layers[j:k]) for j, k in plan.segments}
        object.__setattr__(self, "_segments", segs)

    def forward(self, x):
        layers, choices = list(self.layers), self.plan.choices
        exclude = _exclude_ids(layers) if "offload" in choices else ()
        stats = {"offloaded_bytes": 0, "simulated_bytes": 0}
        h = as_tensor(x)
        pending = None  # the offload group of the previous layer (prefetch in our backward)
        i, n = 0, len(layers)
        while i < n:
            if choices[i] == "recompute":
                seg = self._segments[i]
                j = i + len(seg)
                with record_nodes() as nodes:
                    h = checkpoint(seg, h)
            else:
                j = i + 1
                with record_nodes() as nodes:
                    h = layers[i](h)
            live = [nd for nd in nodes if nd.backward is not None]
            if pending is not None and live:
                run_before_backward(max(live, key=lambda nd: nd.seq), pending.prefetch)
            pending = None
            if choices[i] == "offload" and is_grad_enabled():
                grp = OffloadGroup(live, exclude, self.copy_host).offload()
                stats["offloaded_bytes"] += grp.offloaded_bytes
                stats["simulated_bytes"] += grp.simulated_bytes
                pending = grp
            i = j
        self.offload_stats = stats
        return h


def apply_plan(layers, plan, *, copy_host: bool = False) -> PlannedModel:
    """A model computing what ``layers`` (modules in forward order, or a model, expanded by
    :func:`~disttensor.nn.sequential_layers`) compute, with ``plan`` (a :class:`MemoryPlan`
    or a sequence of choices) applied in its forward: each segment of ``'recompute'`` layers
    (``plan.segments``) is one :func:`checkpoint`; each ``'offload'`` layer's saved arrays go
    to host memory after its forward and are prefetched back when the next layer's backward starts
    (simulated, counted only, for NumPy blocks); ``'keep'`` layers run as they are.  The
    layers (and their parameters) are shared with the original model, not copied; a
    model's own input checks (e.g. CosmoFlow's sample shape) are not run.  ``copy_host``:
    offload NumPy blocks by copying them out and back like device arrays (relieves nothing;
    exercises the offload path on CPU).  Collective when the layers are."""
    return PlannedModel(_layer_list(layers), plan, copy_host)
