"""A performance model of a training step per process grid, and :func:`plan_grid`.

Following Distconv (Dryden et al.) and Oyama et al., each layer's time under each candidate
decomposition ``(sample, d, h, w)`` is *predicted* from measurements, and the grid with the
smallest predicted step that fits in memory is chosen:

* :mod:`.timing` -- **compute** (measured): each layer's forward and backward on the slowest
  rank's local block, on one rank (:class:`LayerTimer`), and the optimizer step;
* :mod:`.links` -- **links** (measured): alpha-beta models of neighbour exchange and
  all-reduce, and the per-op overhead (:func:`measure_links`);
* :mod:`.geometry` -- what each layer does to the slowest block on a grid, and whether the
  grid can run the model at all (:func:`analyze_layers`, pure);
* :mod:`.prediction` -- the step time and memory of one grid from those (:func:`predict_grid`,
  :func:`estimate_memory`, pure);
* :mod:`.plan` -- the candidate grids and their ranking (:func:`enumerate_grids`,
  :func:`plan_grid`, collective; the result is the same on every rank).

Past one machine (nothing timed, no array of the model allocated):

* :mod:`.layerspec` -- pure layer descriptions (:func:`cosmoflow_layers`, the unrolled
  :func:`unet_layers`);
* :mod:`.machine` -- :class:`Machine` descriptions (compute rates, links inside and between
  nodes, memory): :data:`V100_EDR`, :data:`H100_NDR`, and :func:`measure_machine` (collective)
  for the machine it runs on;
* :mod:`.simulate` -- :func:`simulate` / :func:`simulate_grid` / :func:`speedup`: the same
  prediction (:func:`predict_grid`) from a description, for any device count (pure);
  ``python -m disttensor.plan`` prints the ranking.

Assumptions and limits: a model is modelled layer by layer through
:func:`~disttensor.nn.module.sequential_layers`; a layer that is not a convolution, pooling,
pointwise (activation, batch norm, dropout, identity), flatten or linear layer (e.g. the whole
U-Net, whose skip connections make it one layer) is timed whole on the local block (rounded
up to a multiple of ``2**levels`` for a model with ``levels``) and its communication
ignored, and must be the last layer.  Transfers of one rank are assumed not to
slow each other beyond the fitted model; compute is assumed independent of which spatial axis
is cut beyond the block shape (on cubic samples permutations of a split are taken as
equivalent, see :func:`enumerate_grids`).  The loss, the data and the work outside the
layers (autograd bookkeeping, reducer hooks) are not modelled (a few percent on small
models); timings taken while other processes load the machine carry their noise.
"""
from .geometry import InvalidGrid, LayerGeometry, analyze_layers, timing_layer
from .links import AlphaBeta, LinkModel, measure_links
from .plan import GridPlan, enumerate_grids, plan_grid
from .prediction import (OPTIMIZER_STATE, GridPrediction, LayerPrediction, allreduce_exposed,
                         buckets_of, estimate_memory, predict_grid)
from .timing import LayerTimer
from .layerspec import LayerSpec, cosmoflow_layers, unet_layers
from .machine import H100_NDR, MACHINES, V100_EDR, Machine, measure_machine
from .simulate import SimulatedPlan, simulate, simulate_grid, speedup

__all__ = ["AlphaBeta", "LinkModel", "LayerGeometry", "LayerPrediction", "GridPrediction",
           "InvalidGrid", "timing_layer", "GridPlan", "enumerate_grids", "analyze_layers",
           "allreduce_exposed", "buckets_of", "estimate_memory", "measure_links",
           "LayerTimer", "predict_grid", "plan_grid", "OPTIMIZER_STATE", "LayerSpec",
           "cosmoflow_layers", "unet_layers", "Machine", "MACHINES", "V100_EDR", "H100_NDR",
           "measure_machine", "SimulatedPlan", "simulate", "simulate_grid", "speedup"]
