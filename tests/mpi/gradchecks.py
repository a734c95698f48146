"""Helpers of the MPI tests of the autograd layer, the nn functional ops and the models
(``test_autograd.py``, ``test_nn_models.py``, ``test_nn_train_step.py``): scatter of global
arrays into layouts, a guard that turns a rank-local exception into a job abort instead of a
hang, finite-difference directional-derivative checks, and the one-rank reference (the same
model on a ``(1, 1, 1, 1)`` grid over ``MPI.COMM_SELF``, built from the same seed).

Every helper is collective when it touches DistArrays: all ranks call it with the same
arguments in the same order (every rank draws the same random numbers: the generators are
seeded by the test, never by the rank).
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np
from mpi4py import MPI

import disttensor as dt
from disttensor.autograd import Tensor, no_grad

from checks import COMM, SIZE, collective_checks, expect, grid
from pytest_disttensor import abort_job

# -- a rank-local exception must not hang the job ----------------------------------------------
_GUARD = COMM.Dup() if SIZE > 1 else None  # collective at import: every rank imports this
_GUARD_TIMEOUT = float(os.environ.get("DISTTENSOR_SYNC_TIMEOUT", "120"))


def guarded(fn):
    """:func:`checks.collective_checks`, and: when the body raises, wait (up to
    ``DISTTENSOR_SYNC_TIMEOUT`` s) for every rank to raise too.  An exception raised by an op
    on some ranks only (say in a local kernel, while ranks owning nothing went on into the op's
    halo exchange) would otherwise leave those ranks in the collective while hypothesis runs
    (and shrinks) further examples on the others, and the job would hang until the outer
    timeout; here the rank that raised alone prints its traceback and aborts the job.  Shared
    by the ops, autograd and nn tests."""
    body = collective_checks(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return body(*args, **kwargs)
        except Exception as e:
            if _GUARD is None:
                raise
            req = _GUARD.Ibarrier()
            t0, delay = time.monotonic(), 1e-4
            while not req.Test():
                if time.monotonic() - t0 > _GUARD_TIMEOUT:
                    import traceback
                    abort_job(f"{fn.__name__}: raised on this rank while some other rank "
                              "did not (it waits in a collective):\n"
                              + "".join(traceback.format_exception(e))[-4000:])
                time.sleep(delay)
                delay = min(2 * delay, 0.02)
            raise
    return wrapper


# -- layouts -----------------------------------------------------------------------------------
def scatter(a, layout, g: dt.ProcessGrid | None = None) -> dt.DistArray:
    """The global array ``a`` distributed as ``layout = (dims, split, sizes)`` (``sizes``
    ``None`` or per-axis ``None``/explicit sizes) on the cached grid of ``dims`` (or ``g``)."""
    dims, split, sizes = layout
    return dt.from_global(np.array(a, order="C"), grid=grid(dims) if g is None else g,
                          split=split, sizes=None if sizes is None else list(sizes))


def like(a, y: dt.DistArray) -> dt.DistArray:
    """``a`` distributed like ``y`` (an output gradient)."""
    a = np.array(a, dtype=y.dtype, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
    return dt.from_global(a, grid=y.grid, split=y.split,
                          sizes=y.distribution.split_sizes)


def value_of(t):
    """The global value of a tensor's data: a DistArray gathered, a replicated array or a
    number as NumPy."""
    d = t.data if isinstance(t, Tensor) else t
    if isinstance(d, dt.DistArray):
        return d.to_numpy()
    return np.asarray(d)


def rel_err(got, want) -> float:
    """``max|got - want| / max|want|`` (0 for two empty arrays; inf for a shape mismatch)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    scale = np.abs(want).max()
    diff = np.abs(got - want).max()
    if scale == 0:
        return float(diff)
    return float(diff / scale)


def close(got, want, what: str, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    """Record (for the collective settle) unless ``got`` matches ``want``."""
    try:
        got, want = np.asarray(got), np.asarray(want)
        assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    except Exception as e:  # noqa: BLE001 - reported collectively
        expect(False, f"{what}: {type(e).__name__}: {str(e).strip()[:500]}")


# -- finite differences ------------------------------------------------------------------------
FD_EPS = 1e-6
FD_RTOL = 1e-6


def directional_check(loss, point, grads, rng, what: str, ndir: int = 2,
                      eps: float = FD_EPS, rtol: float = FD_RTOL, joint: bool = True) -> None:
    """Check gradients ``grads`` (``{name: global NumPy array}``) of the scalar function
    ``loss(point)`` (``point``: ``{name: global float64 array}``; collective, the same value on
    every rank) at ``point`` by central differences along random directions: ``ndir`` per input
    (only that input moves) and, with ``joint``, one moving all inputs at once.  A derivative
    ``d`` computed as ``<grad, v>`` must equal the difference quotient to ``rtol * (|d| +
    |loss| + ||grad|| ||v|| 1e-3) + 1e-12``; rounding leaves about ``1e-16 |loss| / eps``."""
    base = float(loss(point))
    dirs = []
    for name in grads:
        for _ in range(ndir):
            dirs.append({name: rng.standard_normal(np.shape(point[name]))})
    if joint and len(grads) > 1:
        dirs.append({name: rng.standard_normal(np.shape(point[name])) for name in grads})
    for v in dirs:
        plus = {k: (a + eps * v[k] if k in v else a) for k, a in point.items()}
        minus = {k: (a - eps * v[k] if k in v else a) for k, a in point.items()}
        num = (float(loss(plus)) - float(loss(minus))) / (2 * eps)
        ana = float(sum(np.sum(np.asarray(grads[k], dtype=np.float64) * v[k]) for k in v))
        scale = sum(float(np.linalg.norm(grads[k])) * float(np.linalg.norm(v[k])) for k in v)
        tol = rtol * (abs(ana) + abs(base) + 1e-3 * scale) + 1e-12
        expect(abs(num - ana) <= tol,
               f"{what}: directional derivative along {sorted(v)}: analytic {ana!r} vs "
               f"central difference {num!r} (|diff| {abs(num - ana):.3g} > tol {tol:.3g})")


# -- the one-rank reference --------------------------------------------------------------------
_SELF_GRID: dt.ProcessGrid | None = None


def self_grid() -> dt.ProcessGrid:
    """A ``(1, 1, 1, 1)`` grid over ``MPI.COMM_SELF``: every rank runs the whole problem."""
    global _SELF_GRID
    if _SELF_GRID is None:
        _SELF_GRID = dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF)
    return _SELF_GRID


def grid_available(dims) -> bool:
    return int(np.prod(dims)) == SIZE


def evaluate(fn):
    """``fn()`` without recording a graph."""
    with no_grad():
        return fn()


def layouts_2d(shape):
    """Two layouts of a 2-D array: rows split unevenly with empty blocks (all rows on rank 1;
    rows split evenly on one rank), and a 2-D grid on 4 ranks, else columns split."""
    rows = ((SIZE,), (0, None), [0, shape[0]] + [0] * (SIZE - 2) if SIZE >= 2 else None)
    other = ((2, 2), (0, 1), None) if SIZE == 4 else ((SIZE,), (None, 0), None)
    return [rows, other]


def tensor_on(a, layout, requires_grad=False) -> Tensor:
    """A Tensor of the 2-D ``a`` laid out by ``layout`` (one of :func:`layouts_2d`)."""
    dims, split, sizes = layout
    return Tensor(dt.from_global(np.array(a), grid=grid(dims), split=split,
                                 sizes=None if sizes is None else [sizes, None]),
                  requires_grad=requires_grad)
