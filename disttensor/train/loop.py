"""The training loop: epochs of steps over the shuffled training batches, validation after
each epoch, checkpoints, stopping on a signal or ``--max-steps``.

:func:`train_epochs` wraps the model for the run: data parallel
(:class:`~disttensor.nn.DistributedDataParallel`: gradients summed over all ranks in buckets
overlapped with backward), optionally with a memory plan (``--memory-budget``), or a pipeline
of stages (:class:`~disttensor.nn.Pipeline`); builds the optimizer, schedule and loss scaler
(``--amp``: float16 activations, float32 master weights, dynamic loss scaling), resumes from
``OUT/checkpoint.h5`` with ``--resume``, and then runs the epochs.  After each epoch it
validates, appends a row to ``OUT/metrics.csv`` and writes the checkpoint (and, through
:class:`~disttensor.train.watch.Watch`, the TensorBoard scalars, ``OUT/best.h5``, the MLPerf
events and the ``--target-mae`` stop); SIGTERM or SIGINT checkpoints at the next step and
returns.  Everything is collective over the run's
communicator, and the :class:`TrainResult` is the same on every rank.
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .. import nn
from ..autograd import Tensor
from .arguments import micro_batches, parse_partition
from .builders import build_loss, build_optimizer, build_schedule
from .checkpoints import CHECKPOINT, restore, save_state
from .data import batches, target_mean
from .metrics import METRICS, append_csv, epoch_line, final_line, validate
from .profiling import StepProfiler
from .pruning import head_inference_times, make_pruner, pruning_line
from .watch import Watch

__all__ = ["TrainResult", "train_epochs"]


@dataclass
class TrainResult:
    """What a run did (the same on every rank)."""
    losses: list = field(default_factory=list)       # training loss per step
    val: list = field(default_factory=list)          # validation metrics per epoch (dicts)
    baseline: dict = field(default_factory=dict)     # the trivial predictor's metrics
    steps: int = 0
    epochs_done: int = 0
    interrupted: bool = False
    grid: tuple = ()
    pruning: dict = field(default_factory=dict)     # --prune-to: sparsity, head times
    best_epoch: int = 0                              # best validation metric (OUT/best.h5)
    time_to_train: float | None = None               # seconds to --target-mae (None: not)


class _StopFlag:
    """``raised`` once SIGTERM or SIGINT arrived (between :meth:`install` and
    :meth:`restore`, which puts the previous handlers back)."""

    def __init__(self):
        self.raised = False
        self.old = {}

    def install(self):
        def handler(signum, frame):
            self.raised = True
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self.old[s] = signal.signal(s, handler)
            except ValueError:  # not the main thread
                pass

    def restore(self):
        for s, h in self.old.items():
            signal.signal(s, h)


def _plan_memory(args, model, train_ds, loss_fn, dtype, segmentation, comm, progress):
    """``--memory-budget``: profile one training step on the first batch, plan keep /
    offload / recompute per layer under the budget, and return the planned model (sharing
    ``model``'s layers)."""
    x, y = train_ds.read_batch(train_ds.batch_indices(0)[0])
    xt = Tensor(x if x.dtype == dtype else x.astype(dtype))
    yt = Tensor(y if segmentation or y.dtype == dtype else y.astype(dtype))
    prof = nn.memory.profile_memory(model, xt, yt, loss_fn, comm=comm)
    budget = int(args.memory_budget * prof.keep_all_peak)
    plan = nn.memory.plan_memory(prof, budget, comm=comm)
    progress.say(f"memory plan for {args.memory_budget:.0%} of the saved-activation peak "
                 f"({prof.keep_all_peak / 2 ** 20:.1f} MiB per rank):\n{plan.report()}")
    return nn.memory.apply_plan(model, plan)


def train_epochs(args, comm, grid, train_ds, val_ds, model, progress, segmentation, yname,
                 sample_shape, on_step, full=None) -> TrainResult:
    """Train ``model`` on ``train_ds``, validating on ``val_ds`` after each epoch, on the
    (per-stage) ``grid``; ``full``: the whole grid of a pipeline (``None``: data parallel).
    ``on_step(step)``, if given, runs on every rank after each step.  Collective over
    ``comm``."""
    loss_fn = build_loss(args)
    dtype = np.dtype("float16" if args.amp else args.dtype)
    bucket_bytes = int(args.bucket_mb * 2 ** 20)
    pipe = ddp = None
    if full is not None:
        chunks = micro_batches(args)
        partition = parse_partition(args.partition)
        sample = None
        if partition == "auto":  # one micro-batch of the first batch, for the layer costs
            x0, _ = train_ds.read_batch(train_ds.batch_indices(0)[0])
            sample = x0.to_numpy()[:args.batch_size // chunks].astype(dtype)
        pipe = nn.Pipeline(model, full, chunks=chunks, partition=partition,
                           schedule=args.pipeline_schedule, bucket_bytes=bucket_bytes,
                           overlap=not args.no_overlap, sample=sample)
        params = list(pipe.parameters())
        progress.say(f"pipeline: {pipe.stages} stages {pipe.partition} of "
                     f"{len(nn.sequential_layers(model))} layers, {chunks} micro-batches, "
                     f"{args.pipeline_schedule}")
    else:
        net = model
        if args.memory_budget is not None:
            net = _plan_memory(args, model, train_ds, loss_fn, dtype, segmentation, comm,
                               progress)
        ddp = nn.DistributedDataParallel(net, grid, bucket_bytes=bucket_bytes,
                                         overlap=not args.no_overlap)
        params = list(model.parameters())
    opt = build_optimizer(args, params)
    steps_per_epoch = len(train_ds)
    sched = build_schedule(args, opt, steps_per_epoch)
    pruner = make_pruner(args, model, comm, args.epochs * steps_per_epoch if args.max_steps
                         is None else args.max_steps, pipe is not None)
    scaler = nn.amp.GradScaler(enabled=args.amp)
    update = None
    if args.update_in_backward:
        update = nn.BackwardUpdate(opt, pipe if pipe is not None else ddp,
                                   clip_grad_norm=args.clip_grad or None, grad_scaler=scaler)
    config = json.dumps({"model": args.model, "sample_shape": list(sample_shape),
                         "parameters": [[n, list(p.shape)] for n, p in
                                        model.named_parameters()],
                         "dtype": args.dtype, "optimizer": args.optimizer,
                         **({"stages": pipe.stages, "partition": pipe.partition}
                            if pipe is not None else {})})
    ckpt_grid = full if full is not None else grid
    result = TrainResult(grid=grid.dims)
    out = args.out
    ckpt = os.path.join(out, CHECKPOINT)
    if comm.rank == 0:
        os.makedirs(out, exist_ok=True)
    comm.Barrier()
    start_epoch, skip = 0, 0
    if args.resume:
        exists = comm.bcast(os.path.exists(ckpt) if comm.rank == 0 else None, root=0)
        if exists:
            start_epoch, skip = restore(ckpt, ckpt_grid, model, opt, sched, result, config,
                                        scaler, pipe)
            progress.say(f"resumed from {ckpt}: epoch {start_epoch + 1}, step "
                         f"{result.steps}")
    if pruner is not None:
        pruner.last_step = result.steps - 1
    watch = Watch(args, comm, segmentation, progress)
    profiler = StepProfiler(args, comm, progress)
    if not segmentation:
        tmean = target_mean(train_ds.files, train_ds.stacked, yname, comm)
    progress.say(f"disttensor.train {args.model}: {comm.size} ranks, grid "
                 f"(sample, d, h, w) = {grid.dims}"
                 f"{f' per stage x {pipe.stages} stages' if pipe is not None else ''}, "
                 f"{model.num_parameters():,} parameters, "
                 f"{train_ds.num_samples} training / {val_ds.num_samples} validation samples "
                 f"of shape {sample_shape}, global batch {args.batch_size}")
    stop = _StopFlag()
    stop.install()
    finished = False
    try:
        watch.start(result, train_ds.num_samples, val_ds.num_samples, start_epoch or skip)
        for epoch in range(start_epoch, args.epochs):
            model.train()
            watch.epoch_start(epoch)
            t0, seen = time.perf_counter(), 0
            halt = signalled = False
            nbatches = len(train_ds)
            it = batches(train_ds, epoch, skip)
            for k, (x, y) in enumerate(it, start=skip):
                x = x if x.dtype == dtype else x.astype(dtype)
                y = y if segmentation or y.dtype == dtype else y.astype(dtype)
                profiler.before_step()
                opt.zero_grad()
                if pipe is not None:
                    lossv = pipe.train_step(x, y, loss_fn)
                else:
                    loss = loss_fn(ddp(Tensor(x)), Tensor(y))
                    loss.backward(scaler.scale(1.0) if args.amp else None)
                    lossv = float(loss.item())
                if update is None:  # else every parameter was updated inside backward
                    if args.amp:
                        scaler.unscale_(opt)
                    if args.clip_grad:
                        nn.utils.clip_grad_norm_(params, args.clip_grad)
                    scaler.step(opt)
                    scaler.update()
                lr_used = opt.param_groups[0]["lr"]
                sched.step()
                if pruner is not None:
                    pruner.step()
                result.steps += 1
                result.losses.append(lossv)
                seen += args.batch_size
                rate = seen / max(time.perf_counter() - t0, 1e-9)
                progress.step(f"epoch {epoch + 1}/{args.epochs} step {k + 1}/{nbatches}"
                              f" loss {lossv:.5f} {rate:.1f} samples/s",
                              f"epoch {epoch + 1}/{args.epochs}", k + 1, nbatches, lossv, rate)
                watch.step(result.steps, lossv, lr_used, rate)
                if on_step is not None:
                    on_step(result.steps)
                signalled = bool(comm.allreduce(stop.raised, op=MPI.LOR))
                halt = signalled or (args.max_steps is not None and
                                     result.steps >= args.max_steps)
                profiler.after_step()
                if halt and k + 1 < nbatches:  # stopping inside an epoch
                    profiler.finish()
                    if not args.no_checkpoint:
                        save_state(ckpt, ckpt_grid, model, opt, sched, result, epoch, k + 1,
                                   config, scaler, pipe)
                    progress.update(f"stopped at step {result.steps} ("
                                    f"{'signal' if signalled else '--max-steps'}); "
                                    f"checkpoint {ckpt}", final=True)
                    result.interrupted = signalled
                    return result
                if halt:
                    break
            skip = 0
            profiler.finish()  # not profiled across a validation
            # rank 0's clock, so every rank records the same metrics (and checkpoint)
            elapsed = comm.bcast(time.perf_counter() - t0, root=0)
            watch.eval_start(epoch)
            metrics = validate(model if pipe is None else pipe, val_ds, loss_fn,
                               segmentation, dtype, None if segmentation else tmean, args)
            if pipe is not None:  # computed on the last stage
                metrics = comm.bcast(metrics, root=full.rank_of(
                    (0, pipe.stages - 1) + (0,) * (full.ndim - 2)))
            metrics.update({"epoch": epoch + 1, "step": result.steps,
                            "train_loss": float(np.mean(result.losses[-max(seen //
                                                args.batch_size, 1):])),
                            "lr": sched.get_last_lr()[0],
                            "samples_per_s": seen / max(elapsed, 1e-9)})
            watch.epoch_metrics(metrics)  # elapsed_s (, target_reached)
            result.val.append(metrics)
            result.epochs_done = epoch + 1
            progress.update(epoch_line(metrics, args, segmentation), final=True)
            if comm.rank == 0:
                append_csv(os.path.join(out, METRICS), metrics)
            if not args.no_checkpoint:
                save_state(ckpt, ckpt_grid, model, opt, sched, result, epoch + 1, 0, config,
                           scaler, pipe)
            if watch.epoch_end(metrics, out, ckpt):  # best.h5; True: --target-mae reached
                break
            if halt:
                result.interrupted = signalled
                break
        finished = True
    finally:
        profiler.abandon()
        stop.restore()
        progress.close()
        watch.close(result, out, finished)
        if update is not None:
            update.remove()
        if pipe is not None:
            pipe.release()
        else:
            ddp.reducer.release()
    if result.val:
        last = result.val[-1]
        result.baseline = {k: last[k] for k in last if k.startswith("baseline_")}
        progress.say(final_line(last, segmentation))
    if watch.best is not None:
        result.best_epoch = int(watch.best["epoch"])
    if watch.reached is not None:
        result.time_to_train = float(watch.reached["elapsed_s"])
    if watch.summary():
        progress.say(watch.summary())
    if pruner is not None:
        result.pruning = {"sparsity": pruner.sparsity(),
                          **head_inference_times(model, args.batch_size, comm)}
        progress.say(pruning_line(result.pruning["sparsity"], result.pruning))
    return result
