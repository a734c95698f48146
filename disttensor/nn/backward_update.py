"""Weight update inside backward: each parameter is updated as soon as its gradient is final.

The ordinary step keeps every gradient until the end of backward (``.grad`` of the whole model,
plus, with data parallelism, the reducer's bucket buffers holding a second copy), then updates
all parameters::

    opt.zero_grad(); loss.backward(); opt.step()

With :class:`BackwardUpdate` the optimizer updates each parameter inside backward, the moment
its gradient is complete, and the gradient is dropped right after (``.grad`` stays ``None``):
the gradients held at once are one parameter's (no reducer) or the buckets in flight (with a
:class:`~disttensor.nn.parallel.GradientReducer`), not the whole model's (the NTU thesis of
seed 003: "updating each layer's weights as soon as its gradient is complete removes the full
gradient buffer").  The loop becomes::

    upd = BackwardUpdate(opt, ddp)        # once; ddp: a DistributedDataParallel (or None)
    for x, y in data:
        loss = F.mse_loss(ddp(Tensor(x)), Tensor(y))
        loss.backward()                    # updates the parameters
        sched.step()                       # schedules work as before

(``opt.zero_grad()`` and ``opt.step()`` may stay in the loop: with no ``.grad`` left, ``step``
has nothing to do.)

When an update runs
-------------------
* **No reducer**: in the parameter's gradient-ready hook
  (:meth:`~disttensor.autograd.Tensor.register_grad_ready_hook`), which backward calls once the
  gradient of the pass is summed over every use of the parameter.  Every op using the
  parameter has run its backward by then, so updating its values in place cannot change this
  pass's other gradients.  Each backward pass is one step.  On several ranks without a reducer
  the ops all-reduce each parameter gradient themselves, so the hook sees the full gradient.
* **With a reducer** (:class:`~disttensor.nn.parallel.GradientReducer`, or anything with a
  ``reducer`` attribute holding one: :class:`~disttensor.nn.DistributedDataParallel`, a
  pipeline): when the all-reduce of the parameter's bucket has completed
  (:meth:`~disttensor.nn.parallel.GradientReducer.on_bucket_done`: polled as later buckets
  start, the rest at the end of backward).  With ``reducer.accumulate(passes)`` (pipelined
  micro-batches) buckets complete only in the last pass, so each parameter is updated once per
  step, with the gradient summed over the micro-batches.

Results
-------
The update is the optimizer's own (:meth:`~disttensor.nn.optim.Optimizer.step_parameter`)
with the current step's gradient (not a stale one), and the optimizers' bookkeeping is per
parameter (Adam's step counter is each parameter's ``state["step"]``), so each update
advancing it once per step is the same bookkeeping.  The results are bit-identical to the
ordinary step, for every optimizer, option and schedule: the same gradient reaches the same
per-parameter formula; only the order in which parameters are updated differs, and they do
not interact.  A ``.grad`` that holds a gradient from before the pass (no ``zero_grad``) is
added in, as the ordinary step would.

What it cannot do
-----------------
Anything that needs *all* gradients before *any* update: gradient clipping by the global norm
(``clip_grad_norm``) and loss scaling that skips a step when any gradient overflows
(``grad_scaler``, an enabled :class:`~disttensor.nn.amp.GradScaler`).  Passing either raises
``ValueError`` on every rank, naming it (``clip_grad_value_`` is element-wise and could run
per parameter; it is not wired in).  Gradient accumulation over several backward passes needs
a reducer with ``accumulate(passes)`` (one on a one-rank grid is fine); without a reducer every
pass updates.  A graph that reads a parameter's values in backward after its gradient is final
(only possible through a detached view of the parameter) would read the updated values.
Callbacks run inside backward, at times that differ between ranks; the update is local (the
parameters are replicated and the gradients already summed), so no rank waits on another.
"""
from __future__ import annotations

from mpi4py import MPI

from ..core.comm import collective
from .optim import Optimizer
from .parallel import GradientReducer

__all__ = ["BackwardUpdate", "gradient_bytes"]


def _reducer_of(obj):
    if obj is None or isinstance(obj, GradientReducer):
        return obj
    r = getattr(obj, "reducer", None)
    return r if isinstance(r, GradientReducer) else obj


def gradient_bytes(params, reducer: GradientReducer | None = None) -> int:
    """Bytes of gradients held now: the ``.grad`` arrays of ``params`` plus the bucket buffers
    ``reducer`` has allocated (local, no communication)."""
    n = sum(p.grad.nbytes for p in params if getattr(p, "grad", None) is not None)
    if reducer is not None:
        n += sum(b.buffer.nbytes for b in reducer.buckets if b.buffer is not None)
    return n


class BackwardUpdate:
    """Update the parameters of ``optimizer`` inside backward, as each gradient is final
    (module docstring), and free the gradient right after.

    ``reducer``: ``None`` (every leaf's gradient-ready hook updates it), a
    :class:`~disttensor.nn.parallel.GradientReducer`, or an object with a ``reducer``
    attribute holding one (a :class:`~disttensor.nn.DistributedDataParallel`, a pipeline):
    updates then run when each bucket's all-reduce has completed.  ``comm``: the communicator
    the construction is collective over (default: the reducer's grid, else
    ``MPI.COMM_WORLD``).  ``clip_grad_norm`` and ``grad_scaler`` name options of the training
    loop that cannot be combined with updates inside backward: a number for the first, or an
    enabled :class:`~disttensor.nn.amp.GradScaler` for the second, raises ``ValueError``.

    Collective construction (over ``comm``): bad arguments raise the same exception on every
    rank.  Other errors: ``TypeError`` for an ``optimizer`` that is not an
    :class:`~disttensor.nn.optim.Optimizer` or a ``reducer`` that holds no
    :class:`~disttensor.nn.parallel.GradientReducer`; ``ValueError`` when the optimizer
    already has a live ``BackwardUpdate``, has parameters the reducer does not reduce, or
    (no reducer) has parameters that a reducer reduces (their hooks would see per-rank
    shares, not gradients).

    ``track_memory=True`` records in ``peak_grad_bytes`` the most gradient bytes held at once at
    the update points (the gradients being applied, ``.grad`` arrays of the optimizer's
    parameters and the reducer's allocated bucket buffers; see :func:`gradient_bytes`).
    ``updates`` counts the parameter updates made.  :meth:`remove` unregisters the hooks
    (back to the ordinary step).
    """

    def __init__(self, optimizer: Optimizer, reducer=None, *, comm: MPI.Comm | None = None,
                 clip_grad_norm: float | None = None, grad_scaler=None,
                 track_memory: bool = False):
        reducer = _reducer_of(reducer)
        if comm is None:
            comm = reducer.grid.cart if isinstance(reducer, GradientReducer) else MPI.COMM_WORLD
        amp = grad_scaler is not None and bool(getattr(grad_scaler, "is_enabled",
                                                       lambda: True)())
        with collective(comm, "BackwardUpdate", clip_grad_norm=clip_grad_norm, grad_scaler=amp,
                        reducer=reducer is not None):
            if not isinstance(optimizer, Optimizer):
                raise TypeError(f"BackwardUpdate needs a disttensor.nn.optim.Optimizer, got "
                                f"{type(optimizer).__name__}")
            if reducer is not None and not isinstance(reducer, GradientReducer):
                raise TypeError(f"reducer must be a GradientReducer or hold one in .reducer "
                                f"(DistributedDataParallel), got {type(reducer).__name__}")
            if clip_grad_norm is not None:
                raise ValueError(
                    f"clip_grad_norm={clip_grad_norm!r}: gradient clipping by the global norm "
                    "needs every gradient before any update, so it cannot run with the weight "
                    "update inside backward; drop one of the two")
            if amp:
                raise ValueError(
                    "grad_scaler: AMP loss scaling checks every gradient for inf/NaN and skips "
                    "the whole step on an overflow, so it needs every gradient before any "
                    "update and cannot run with the weight update inside backward; drop one "
                    "of the two")
            other = getattr(optimizer, "_backward_update", None)
            if other is not None and not other._removed:
                raise ValueError("the optimizer already updates inside backward (another "
                                 "BackwardUpdate): call its remove() first, or every "
                                 "parameter would be updated twice per step")
            params = [p for g in optimizer.param_groups for p in g["params"]
                      if getattr(p, "requires_grad", True)]
            if reducer is not None:
                reduced = {id(p) for p in reducer.params}
                missing = [i for i, p in enumerate(params) if id(p) not in reduced]
                if missing:
                    raise ValueError(
                        f"{len(missing)} of the optimizer's {len(params)} parameters (indices "
                        f"{missing[:8]}) are not reduced by the reducer: their updates would "
                        "never run; give the optimizer the reducer's parameters")
            else:
                deferred = [i for i, p in enumerate(params)
                            if getattr(p, "deferred_reduction", None) is not None]
                if deferred:
                    raise ValueError(
                        f"{len(deferred)} of the optimizer's parameters (indices "
                        f"{deferred[:8]}) are reduced by a GradientReducer "
                        "(DistributedDataParallel): pass it as reducer=")
                not_leaf = [i for i, p in enumerate(params)
                            if not hasattr(p, "register_grad_ready_hook")]
                if not_leaf:
                    raise TypeError(f"parameters {not_leaf[:8]} have no gradient-ready hook "
                                    "(not disttensor.nn.Parameter / autograd leaves)")
        self.optimizer = optimizer
        self.reducer = reducer
        self.params = params
        self._mine = {id(p) for p in params}
        self.updates = 0
        self.track_memory = bool(track_memory)
        self.peak_grad_bytes = 0
        self._removed = False
        optimizer._backward_update = self
        if reducer is not None:
            reducer.on_bucket_done(self._bucket_done)
        else:
            for p in params:
                p.register_grad_ready_hook(self._leaf_ready)

    # -- hooks ---------------------------------------------------------------------------------
    def _apply(self, p, grad) -> None:
        self.optimizer.step_parameter(p, grad)
        p.grad = None
        self.updates += 1

    def _track(self, held: int) -> None:
        now = held + gradient_bytes(self.params, self.reducer)
        if now > self.peak_grad_bytes:
            self.peak_grad_bytes = now

    def _leaf_ready(self, p, g) -> bool:
        if g is None:  # no gradient reached it in this pass: as the ordinary step, no update
            return False
        grad = g if p.grad is None else p.grad + g
        if self.track_memory:
            self._track(grad.nbytes)
        self._apply(p, grad)
        return True

    def _bucket_done(self, params, grads) -> None:
        if self.track_memory:
            # views of the bucket's buffer (counted with the buffers) hold no memory of their own
            self._track(sum(g.nbytes for g in grads if g is not None and g.base is None))
        for i, (p, g) in enumerate(zip(params, grads)):
            if g is not None and id(p) in self._mine:
                self._apply(p, g)
                grads[i] = None

    def remove(self) -> None:
        """Unregister the hooks: later backward passes keep gradients in ``.grad`` again."""
        if self._removed:
            return
        self._removed = True
        if getattr(self.optimizer, "_backward_update", None) is self:
            self.optimizer._backward_update = None
        if self.reducer is not None:
            self.reducer.remove_bucket_done(self._bucket_done)
        else:
            for p in self.params:
                p._ready_hooks = [h for h in p._ready_hooks
                                  if getattr(h, "__self__", None) is not self]
