"""One-call checkpoints for custom training loops: model, optimizer, scheduler, loss scaler,
step and extra values in one atomic file.

::

    dt.nn.save_training_state("run/state.h5", model=net, optimizer=opt, scheduler=sched,
                              step=step, extra={"epoch": epoch, "best": best})
    ...
    state = dt.nn.load_training_state("run/state.h5", model=net, optimizer=opt,
                                      scheduler=sched)
    step, epoch = state.step, state.extra["epoch"]

Both are collective over ``grid`` (default: the grid of a
:class:`~disttensor.nn.DistributedDataParallel` model, else the default grid) and built on
:func:`disttensor.io.save_checkpoint` / :func:`~disttensor.io.load_checkpoint`: the file is
written to a temporary file renamed into place only after every rank succeeded, so a crash
never loses the previous checkpoint; the arguments are agreed across ranks first.  Layout:
``model/<name>`` (the state dict, PyTorch's names; a DDP wrapper is looked through),
``optimizer/...`` and ``optimizer.`` scalars (:func:`disttensor.nn.optim.flatten_state`),
scalars ``scheduler`` and ``scaler`` (JSON of their state dicts), ``step``, and ``extra``
(JSON; NumPy arrays in ``extra`` are stored as ``extra/<key>`` arrays).

Loading restores, in this order, the model (checked bit-identical on every rank), the
optimizer, the scheduler and the scaler, and then sets every parameter group's learning
rate to the one the scheduler had set when the state was saved, so the resumed run continues
with the saved learning rate whatever order the objects were built and loaded in.
Scheduler state uses the schedulers' own ``state_dict``; a scheduler given to
:func:`load_training_state` but absent from the file raises ``ValueError``.
"""
from __future__ import annotations

import json
from collections import namedtuple

import numpy as np

from ..core.backend import array_module
from ..core.comm import collective
from ..core.grid import get_default_grid
from ..io import load_checkpoint, save_checkpoint
from .optim import flatten_state, unflatten_state
from .parallel import DistributedDataParallel, check_replicas

__all__ = ["save_training_state", "load_training_state", "TrainingState"]

#: what :func:`load_training_state` returns
TrainingState = namedtuple("TrainingState", ["step", "extra"])


def _grid(model, grid):
    if grid is not None:
        return grid
    if isinstance(model, DistributedDataParallel):
        return model.grid
    return get_default_grid()


def _host(v):
    return v.get() if array_module(v) is not np else np.asarray(v)


def save_training_state(path, *, model, optimizer=None, scheduler=None, scaler=None,
                        step: int = 0, extra: dict | None = None, grid=None) -> None:
    """Write ``model``'s parameters and buffers, the state of ``optimizer``, ``scheduler``
    and ``scaler`` (each optional), ``step`` and ``extra`` (a dict of JSON values and NumPy
    arrays) to ``path`` atomically (module docstring).  Collective over ``grid``; every rank
    must pass the same values (``ValueError`` on every rank otherwise)."""
    g = _grid(model, grid)
    extra = dict(extra or {})
    with collective(g.cart):
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        arrays_extra = {k: v for k, v in extra.items() if isinstance(v, np.ndarray)}
        plain = {k: v for k, v in extra.items() if k not in arrays_extra}
        try:
            extra_json = json.dumps(plain, sort_keys=True)
        except TypeError as e:
            raise TypeError(f"extra must hold JSON values or NumPy arrays: {e}") from None
        bad = [k for k in extra if not isinstance(k, str) or "/" in k]
        if bad:
            raise ValueError(f"extra keys must be strings without '/', got {bad}")
    host = {f"model/{k}": _host(v) for k, v in model.state_dict().items()}
    host.update({f"extra/{k}": v for k, v in arrays_extra.items()})
    scalars = {"step": int(step), "extra": extra_json,
               "extra_arrays": json.dumps(sorted(arrays_extra))}
    if optimizer is not None:
        oh, osc = flatten_state(optimizer.state_dict())
        host.update({f"optimizer/{k}": v for k, v in oh.items()})
        scalars.update({f"optimizer.{k}": v for k, v in osc.items()})
    if scheduler is not None:
        scalars["scheduler"] = json.dumps(scheduler.state_dict(), sort_keys=True)
    if scaler is not None:
        scalars["scaler"] = json.dumps(scaler.state_dict(), sort_keys=True)
    save_checkpoint(path, host=host, scalars=scalars, grid=g)


def load_training_state(path, *, model, optimizer=None, scheduler=None, scaler=None,
                        grid=None, strict: bool = True) -> TrainingState:
    """Load what :func:`save_training_state` wrote into ``model`` (and ``optimizer``,
    ``scheduler``, ``scaler`` when given); returns ``TrainingState(step, extra)``.  The
    learning rate of every group is the saved one afterwards (module docstring).  Collective
    over ``grid``; errors (a missing file, another model's state) raise on every rank."""
    g = _grid(model, grid)
    _, host, scalars = load_checkpoint(path, grid=g)
    with collective(g.cart):
        if "step" not in scalars or "extra" not in scalars:
            raise ValueError(f"{path!r} is not a file of save_training_state")
        for name, obj in (("scheduler", scheduler), ("scaler", scaler)):
            if obj is not None and name not in scalars:
                raise ValueError(f"{path!r} holds no {name} state (it was saved without one)")
        if optimizer is not None and "optimizer.optim.param_groups" not in scalars:
            raise ValueError(f"{path!r} holds no optimizer state (it was saved without one)")
    # the same file on every rank: a mismatch (KeyError, ValueError) raises alike everywhere
    state = {k[len("model/"):]: v for k, v in host.items() if k.startswith("model/")}
    model.load_state_dict(state, strict=strict)
    check_replicas(model, g.cart, f"model loaded from {path!r}")
    if optimizer is not None:
        optimizer.load_state_dict(unflatten_state(
            {k[len("optimizer/"):]: v for k, v in host.items() if k.startswith("optimizer/")},
            {k[len("optimizer."):]: v for k, v in scalars.items()
             if k.startswith("optimizer.")}))
    if scheduler is not None:
        scheduler_json = scalars["scheduler"]
        scheduler.load_state_dict(json.loads(scheduler_json))
        _restore_lr(scheduler, scheduler_json)
    if scaler is not None:
        scaler.load_state_dict(json.loads(scalars["scaler"]))
    extra = json.loads(scalars["extra"])
    for k in json.loads(scalars.get("extra_arrays", "[]")):
        extra[k] = host[f"extra/{k}"]
    return TrainingState(int(scalars["step"]), extra)


def _restore_lr(scheduler, scheduler_json: str) -> None:
    """Set the optimizer's group learning rates to the scheduler's last ones (saved)."""
    last = getattr(scheduler, "get_last_lr", None)
    lrs = list(last()) if callable(last) else []
    if not lrs:
        sd = json.loads(scheduler_json)
        lrs = list(sd.get("_last_lr", []))
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = float(lr)
