"""Training under a memory budget: keep, offload or recompute each layer's saved activations.

A training step keeps, from every layer's forward until its backward, what the layer's
backward needs (its *saved* state, measured by :mod:`disttensor.autograd.saved`).  For a
chain of layers (``disttensor.nn.sequential_layers(model)``) this package

* :func:`profile_memory` (:mod:`.profiling`) -- runs one training step and records per layer
  the saved bytes, the input and output bytes, the forward and backward times, and the
  host<->device bandwidth (measured with CuPy on a GPU; on CPU an *assumed* bandwidth, 12 GB/s
  PCIe by default, and reported as assumed);
* :func:`plan_memory` (:mod:`.planner`, pure) -- chooses for each layer ``keep`` /
  ``offload`` / ``recompute`` so that the modelled peak of saved bytes fits a budget at the
  least added time (an exact dynamic program over the layers with the memory discretised:
  pseudo-polynomial; the general problem of scheduling data movement is NP-complete); the
  cost and memory model is stated in :mod:`.planner`;
* :func:`apply_plan` (:mod:`.apply`) -- a model whose forward applies a plan: consecutive
  ``recompute`` layers run as one activation checkpoint (:func:`checkpoint`, :mod:`.recompute`),
  ``offload`` layers move their saved arrays to pinned host memory after their forward and
  prefetch them back while the backward of the next layer runs
  (:class:`~disttensor.autograd.saved.OffloadGroup`; on CPU offload is simulated: bytes are
  counted, nothing moves);
* :func:`measure_step_memory` (:mod:`.profiling`) -- the peak memory a step allocates
  (``tracemalloc``, to which NumPy reports its buffers, on CPU; the CuPy memory pool's used
  bytes on GPU).

Collective use: :func:`profile_memory` is collective over the input's grid and takes the
maximum of every figure over the ranks, so every rank plans alike; :func:`plan_memory` with
``comm`` validates collectively (a budget below the minimum raises the same ``ValueError`` on
every rank).  Recompute re-runs the same layers on every rank in the same order during
backward, so collective ops inside stay matched.
"""
from .apply import PlannedModel, apply_plan
from .planner import (ASSUMED_BANDWIDTH, CHOICES, LayerProfile, MemoryPlan, MemoryProfile,
                      evaluate_plan, min_peak, plan_memory)
from .profiling import measure_bandwidth, measure_step_memory, profile_memory
from .recompute import checkpoint

__all__ = ["checkpoint", "LayerProfile", "MemoryProfile", "profile_memory", "MemoryPlan",
           "plan_memory", "min_peak", "evaluate_plan", "apply_plan", "PlannedModel",
           "measure_step_memory", "measure_bandwidth", "ASSUMED_BANDWIDTH", "CHOICES"]
