"""A performance model of a training step per process grid, and :func:`plan_grid`."""
from .plan import (OPTIMIZER_STATE, AlphaBeta, GridPlan, GridPrediction, InvalidGrid,
                   LayerGeometry, LayerPrediction, LayerTimer, LinkModel, allreduce_exposed,
                   analyze_layers, buckets_of, enumerate_grids, estimate_memory,
                   measure_links, plan_grid, predict_grid, timing_layer)

__all__ = ["AlphaBeta", "LinkModel", "LayerGeometry", "LayerPrediction", "GridPrediction",
           "InvalidGrid", "timing_layer", "GridPlan", "enumerate_grids", "analyze_layers",
           "allreduce_exposed", "buckets_of", "estimate_memory", "measure_links",
           "LayerTimer", "predict_grid", "plan_grid", "OPTIMIZER_STATE"]
