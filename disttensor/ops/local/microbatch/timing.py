"""The planner's times: measured on the call's own data (benchmark mode) or modelled
(heuristic mode), for the candidates ``{(algorithm, micro_batch): workspace}``.

:func:`candidates` lists what the algorithms support with their workspaces;
:func:`measure_times` times them round-robin within a budget; :func:`model_times` asks their
cost models; :func:`rotating_slices` feeds timing runs different samples.  Per rank, no MPI:
ranks may time (and so choose) differently.  A candidate that fails is dropped with a
:class:`RuntimeWarning`, issued once per process and cause (:func:`warn_once`).
"""
from __future__ import annotations

import math
import os
import time

from ....core.warn import warn
from . import settings
from .cpu_algorithms import Im2colTiled
from .problem import ConvProblem

__all__ = ["candidates", "model_times", "measure_times", "rotating_slices", "warn_once",
           "tuning_clock"]


def tuning_clock():
    """The clock the CPU tuner reads (:func:`~.settings.tune_clock`): ``time.process_time``
    for ``cpu``, and for ``auto`` where the kernels run on one thread (Numba's thread count
    is 1 and ``OPENBLAS_NUM_THREADS``, else ``OMP_NUM_THREADS``, is ``1``), else
    ``time.perf_counter``.  On a shared machine a candidate's wall time counts whatever ran on
    its core meanwhile, so one timed call (online tuning times each candidate once or twice)
    can rank a slower algorithm first; the CPU time of a one-thread kernel counts its own work
    only."""
    mode = settings.tune_clock()
    if mode == "auto":
        import numba
        blas = os.environ.get("OPENBLAS_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
        mode = "cpu" if numba.get_num_threads() == 1 and blas == "1" else "wall"
    return time.process_time if mode == "cpu" else time.perf_counter


def candidates(problem: ConvProblem, algos: dict, sizes) -> dict:
    """``{(name, b): workspace}`` for the algorithms supporting micro-batch ``b``; of
    algorithms of the same class with the same workspace only the first is kept (e.g. the
    tiled kernel whose tile bound already gives one plane)."""
    out, seen = {}, set()
    for b in sizes:
        pb = problem.with_batch(b)
        for name, a in algos.items():
            try:
                if not a.supports(*pb.args()):
                    continue
                ws = int(a.workspace_bytes(*pb.args()))
            except Exception as err:  # noqa: BLE001 - an algorithm that cannot say: skip it
                warn_once(("candidate", name, type(err).__name__),
                           f"conv algorithm {name!r} failed to describe itself "
                           f"({type(err).__name__}: {err}); it is skipped")
                continue
            dup = (type(a), ws, b)
            if isinstance(a, Im2colTiled) and dup in seen:
                continue
            seen.add(dup)
            out[(name, b)] = ws
    return out


def model_times(problem: ConvProblem, algos: dict, cands: dict) -> dict:
    """Heuristic mode: each candidate's ``estimate_seconds`` (algorithms without a cost model
    are left out)."""
    out = {}
    for (name, b) in cands:
        est = getattr(algos[name], "estimate_seconds", None)
        if est is not None:
            out[(name, b)] = float(est(problem.with_batch(b)))
    return out


def measure_times(problem: ConvProblem, cands: dict, algos: dict, runner, sync=None,
                  budget_s: float | None = None, reps: int | None = None,
                  always=None) -> dict:
    """Benchmark mode: time the candidates ``{(name, b): workspace}`` with
    ``runner(algorithm, b)``, which runs an algorithm on ``b`` samples; returns
    ``{(name, b): seconds per call}``.

    Each candidate gets a warm-up and ``reps`` timed runs (default
    ``DISTTENSOR_CONV_TUNE_REPS``), the minimum kept.  A timed run of size ``b`` is ``N // b``
    calls (over different samples, the runner's business) divided by their number, so every
    candidate is timed over a whole mini-batch of work: timing one short call would favour
    small micro-batches on a loaded machine (the minimum of short runs finds quiet moments
    more easily).  The repetitions go round the candidates (smallest sizes first), so a drift
    of the machine's load hits all of them alike.  The first round over the smallest size and
    over ``always`` (default: the whole-batch candidates, the undivided baseline) is always
    completed; everything else only while ``budget_s`` lasts (default
    ``DISTTENSOR_CONV_TUNE_BUDGET_S``).  ``sync`` (e.g. a stream synchronize) runs before a
    clock is read; without ``sync`` (the CPU) the clock is :func:`tuning_clock`'s, with it
    the wall clock.  A candidate that raises is dropped with a warning."""
    budget = settings.budget_s() if budget_s is None else float(budget_s)
    reps = settings.reps() if reps is None else max(1, int(reps))
    t_start = time.perf_counter()
    clock = time.perf_counter if sync else tuning_clock()   # a device queue: wall time
    order = sorted(cands, key=lambda k: (k[1], k[0]))
    smallest = min((b for _, b in order), default=0)
    if always is None:
        always = {k for k in order if k[1] == problem.batch}
    always = set(always)
    out: dict = {}
    failed: set = set()

    def over():
        return time.perf_counter() - t_start > budget

    for rep in range(reps):
        for key in order:
            name, b = key
            if key in failed or (rep > 0 and key not in out):
                continue
            if over() and (rep > 0 or (b != smallest and key not in always)):
                if rep > 0:
                    break
                continue
            try:
                if rep == 0:
                    runner(algos[name], b)
                    if sync:
                        sync()
                calls = max(1, problem.batch // b)
                t0 = clock()
                for _ in range(calls):
                    runner(algos[name], b)
                if sync:
                    sync()
                dt = (clock() - t0) / calls
            except Exception as err:  # noqa: BLE001 - a failing candidate is not a candidate
                warn_once(("run", name, type(err).__name__),
                           f"conv algorithm {name!r} failed while being timed "
                           f"({type(err).__name__}: {err}); it is skipped")
                failed.add(key)
                out.pop(key, None)
                continue
            out[key] = min(out.get(key, math.inf), dt)
    return out


def rotating_slices(n: int):
    """``take(b)``: successive slices ``[o, o + b)`` cycling through ``range(n)``, so repeated
    timing runs of a micro-batch read different samples (timing the first ``b`` samples over
    and over would measure them from cache and favour small micro-batches)."""
    state = [0]

    def take(b):
        o = state[0] if state[0] + b <= n else 0
        state[0] = o + b
        return slice(o, o + b)
    return take


_warned: set = set()


def warn_once(key, msg):
    """Issue ``msg`` as a :class:`RuntimeWarning` unless ``key`` was warned about before."""
    if key not in _warned:
        _warned.add(key)
        warn(msg, RuntimeWarning, rank_local=True)
