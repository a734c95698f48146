"""Micro-batched convolution under a workspace limit (mu-cuDNN, Oyama et al., 2018).

A layer's mini-batch of N samples is split into micro-batches ``b_1 + ... + b_k = N``, each run
by its own algorithm, so that algorithms whose workspace grows with the batch (one big GEMM
over packed columns, cuDNN's faster engines) still fit a workspace limit.  For one layer, pass
and limit the planner

1. lists the candidate micro-batch sizes of the *policy*: ``"powerOfTwo"`` (1, 2, 4, ... and
   N), ``"all"`` (1..N) or ``"undivided"`` (N only);
2. gets a time ``t(a, b)`` for every algorithm ``a`` that supports size ``b`` with
   ``workspace(a, b) <= limit``: measured on the call's own data (mode ``"benchmark"``,
   :func:`measure_times`: a warm-up and ``DISTTENSOR_CONV_TUNE_REPS`` timed runs round-robin
   over the candidates, the minimum, each run a whole mini-batch of work; the smallest size
   and the whole batch always, the rest while the layer's ``DISTTENSOR_CONV_TUNE_BUDGET_S``
   lasts) or from each algorithm's ``estimate_seconds`` cost model (mode ``"heuristic"``:
   deterministic, no timing; algorithms without one are left out);
3. divides N by dynamic programming: ``T(0) = 0``, ``T(n) = min over (a, b), b <= n, of
   T(n - b) + t(a, b)`` (time adds, the workspace is the largest of the parts; ties go to fewer
   micro-batches), see :func:`optimal_division`; a measured division must beat the
   undivided plan by ``DISTTENSOR_CONV_TUNE_MARGIN`` (default 3 %) to be taken
   (:func:`choose_division`: timing noise must not buy extra calls).

Filter gradients of the micro-batches are summed (the first writes the output, the others add
into it: cuDNN's beta = 1).  When no algorithm fits the limit the limit is raised to the
smallest workspace any algorithm needs for the smallest micro-batch; the plan's ``note`` says
so and a :class:`RuntimeWarning` is issued once per problem (the computation always runs).

Whole-network workspace division (mu-cuDNN's WD): :func:`pareto_set` gives each layer-pass's
Pareto-optimal (time, workspace) configurations, :func:`divide_workspace` chooses one per
layer-pass minimising the total time with the sum of workspaces within a total budget
(an exact multiple-choice knapsack over Pareto frontiers of partial sums), and
:func:`plan_network` applies WD or the per-layer limit policy WR (every layer-pass gets the
whole budget, workspace reused between layers) by installing per-problem limits
(:func:`set_limit_override`).

The CPU entry points :func:`conv_forward`, :func:`conv_backward_data` and
:func:`conv_backward_filter` (what ``kernels_for(numpy_array)`` returns) have exactly
:mod:`..cpu.conv_im2col`'s contracts and go through the planner (:mod:`.cpu_entry`);
:mod:`..gpu`'s do the same for CuPy arrays with cuDNN execution plans and im2col.
Configuration (:mod:`.settings`, read at each call):

* ``DISTTENSOR_CONV_TUNE``: ``benchmark`` (default: time the candidates on the first use of a
  shape, cache the choice on disk, :mod:`.plan_cache`), ``heuristic`` (cost models, no
  timing, nothing written) or ``off`` (today's single kernel, :mod:`..cpu.conv_im2col`'s
  tiles);
* ``DISTTENSOR_CONV_WORKSPACE_MB``: the per-layer workspace limit (default 64 MiB);
* ``DISTTENSOR_CONV_POLICY``: ``powerOfTwo`` (default), ``all`` or ``undivided``;
* ``DISTTENSOR_CONV_TUNE_BUDGET_S`` (default 2 s per layer-pass), ``DISTTENSOR_CONV_TUNE_REPS``
  (default 2), ``DISTTENSOR_CONV_TUNE_MARGIN`` (default 0.03).

The choice is made per process (no MPI in local kernels); processes sharing the plan-cache
directory settle on one plan per problem family, the first stored (:mod:`.sharing`), others
may run different algorithms, whose results agree to float rounding.

Modules: :mod:`.settings` (the environment), :mod:`.problem` (ConvProblem, Plan, Config),
:mod:`.division` (the pure dynamic programs and the workspace knapsack), :mod:`.timing`
(measured and modelled times), :mod:`.planner` (planning, running plans, the plan store,
:func:`plan_network`), :mod:`.plan_cache` (plans on disk), :mod:`.cpu_algorithms` (the CPU
algorithm registry) and :mod:`.cpu_entry` (the CPU entry points).
"""
from __future__ import annotations

from .cpu_algorithms import Im2colBatched, Im2colTiled, cpu_algorithms
from .cpu_entry import conv_backward_data, conv_backward_filter, conv_forward
from .division import (candidate_sizes, choose_division, divide_workspace, optimal_division,
                       pareto_front)
from .planner import (clear_limit_overrides, clear_plans, get_plan, last_plan, limit_for,
                      pareto_set, plan_network, plan_problem, run_pass, run_plan,
                      set_last_plan, set_limit_override)
from .problem import Config, ConvProblem, Plan
from .settings import (MODES, PASSES, POLICIES, UNDIVIDED_MARGIN, policy, tune_mode,
                       undivided_margin, workspace_limit)
from .timing import candidates, measure_times, model_times, rotating_slices

__all__ = [
    "PASSES", "POLICIES", "MODES", "ConvProblem", "Plan", "Config",
    "candidate_sizes", "optimal_division", "choose_division", "pareto_front", "divide_workspace",
    "cpu_algorithms", "candidates", "measure_times", "model_times", "plan_problem", "pareto_set",
    "plan_network", "run_plan", "run_pass", "get_plan", "set_limit_override",
    "clear_limit_overrides", "limit_for", "rotating_slices", "tune_mode", "workspace_limit",
    "policy", "undivided_margin", "UNDIVIDED_MARGIN", "conv_forward", "conv_backward_data",
    "conv_backward_filter", "last_plan", "set_last_plan", "clear_plans", "Im2colTiled",
    "Im2colBatched",
]
