"""Checkpoints of a training run: ``OUT/checkpoint.h5`` written at the end of every epoch and
when a run stops part-way, read back by ``--resume``.

A checkpoint holds the model's parameters and buffers (the full model of a pipeline), the
optimizer state (per stage for a pipeline), the schedule, the loss scaler, the losses and
validation metrics so far, the epoch and the step in it to resume at, and the run's
configuration as JSON (a resume with another model or configuration is refused).  It is
written atomically and loads on any grid (:func:`disttensor.io.save_checkpoint`).  Both
:func:`save_state` and :func:`restore` are collective over the checkpoint's grid.
"""
from __future__ import annotations

import json

import numpy as np

from ..core.comm import collective
from ..io import load_checkpoint, save_checkpoint
from ..nn.optim import flatten_state, unflatten_state
from ..nn.parallel import check_replicas

__all__ = ["CHECKPOINT", "checkpoint_state", "save_state", "restore"]

CHECKPOINT = "checkpoint.h5"


def checkpoint_state(model, opt, sched, result, epoch, step_in_epoch, config, scaler,
                     pipe=None):
    """``(host arrays, scalars)`` of a checkpoint at ``step_in_epoch`` of ``epoch`` (with a
    pipeline of several stages every rank gathers every stage's optimizer state)."""
    state = model.state_dict() if pipe is None else pipe.full_state_dict()
    host = {f"model/{k}": (v.get() if hasattr(v, "get") else np.asarray(v))
            for k, v in state.items()}
    oh, osc = flatten_state(opt.state_dict())
    if pipe is not None and pipe.stages > 1:
        # each stage's optimizer holds its own parameters' state: every rank writes all
        parts = pipe.allgather_stages((oh, osc))
        oh = {f"stage{s}/{k}": v for s, (h, _) in enumerate(parts) for k, v in h.items()}
        osc = {f"stage{s}.{k}": v for s, (_, c) in enumerate(parts) for k, v in c.items()}
    host.update({f"optimizer/{k}": v for k, v in oh.items()})
    scalars = {f"optimizer.{k}": v for k, v in osc.items()}
    scalars.update({"epoch": epoch, "step_in_epoch": step_in_epoch, "step": result.steps,
                    "config": config, "schedule": json.dumps(sched.state_dict()),
                    "losses": json.dumps(result.losses), "val": json.dumps(result.val),
                    "scaler": json.dumps(scaler.state_dict())})
    return host, scalars


def save_state(path, grid, model, opt, sched, result, epoch, step_in_epoch, config, scaler,
               pipe=None):
    """Write the checkpoint :func:`checkpoint_state` to ``path`` (collective over ``grid``)."""
    host, scalars = checkpoint_state(model, opt, sched, result, epoch, step_in_epoch, config,
                                     scaler, pipe)
    save_checkpoint(path, host=host, scalars=scalars, grid=grid)


def restore(path, grid, model, opt, sched, result, config, scaler, pipe=None):
    """Load the checkpoint ``path`` into the model, optimizer, schedule, scaler and
    ``result`` (losses, metrics, steps); returns ``(epoch, step_in_epoch)`` to resume at.
    ``ValueError`` on every rank if it was written with another ``config``."""
    _, host, scalars = load_checkpoint(path, grid=grid)
    with collective(grid.cart):
        if scalars.get("config") != config:
            raise ValueError(f"checkpoint {path!r} was written by another model or "
                             f"configuration:\n  checkpoint: {scalars.get('config')}\n  "
                             f"this run:   {config}")
    model.load_state_dict({k[len("model/"):]: v for k, v in host.items()
                           if k.startswith("model/")})
    check_replicas(model, grid.cart, f"model loaded from {path!r}")
    ho, so = "optimizer/", "optimizer."
    if pipe is not None and pipe.stages > 1:
        ho, so = f"optimizer/stage{pipe.stage}/", f"optimizer.stage{pipe.stage}."
    opt.load_state_dict(unflatten_state(
        {k[len(ho):]: v for k, v in host.items() if k.startswith(ho)},
        {k[len(so):]: v for k, v in scalars.items() if k.startswith(so)}))
    sched.load_state_dict(json.loads(scalars["schedule"]))
    scaler.load_state_dict(json.loads(scalars["scaler"]))
    result.losses = json.loads(scalars["losses"])
    result.val = json.loads(scalars["val"])
    result.steps = int(scalars["step"])
    return int(scalars["epoch"]), int(scalars["step_in_epoch"])
