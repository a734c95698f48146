"""Training under a memory budget: keep, offload or recompute each layer's saved activations."""
from .planner import (ASSUMED_BANDWIDTH, CHOICES, LayerProfile, MemoryPlan, MemoryProfile,
                      PlannedModel, apply_plan, checkpoint, evaluate_plan, measure_bandwidth,
                      measure_step_memory, min_peak, plan_memory, profile_memory)

__all__ = ["checkpoint", "LayerProfile", "MemoryProfile", "profile_memory", "MemoryPlan",
           "plan_memory", "min_peak", "evaluate_plan", "apply_plan", "PlannedModel",
           "measure_step_memory", "measure_bandwidth", "ASSUMED_BANDWIDTH", "CHOICES"]
