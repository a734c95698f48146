"""Training command line: CosmoFlow or a 3D U-Net, spatially partitioned, data parallel.

Run under MPI::

    mpiexec -n 4 python -m disttensor.train cosmoflow --data DIR --grid 2x2x1x1 --epochs 5

The ranks form a 4-D grid ``(sample, depth, height, width)``: the global batch is dealt over the
sample axis, and every sample is cut into blocks over the three spatial axes (each rank reads
only its block from the files, see :class:`disttensor.io.SampleDataset`).  Without ``--grid``
the grid is the one whose step the performance model predicts fastest
(:func:`disttensor.nn.perfmodel.plan_grid`: measured layer times per local block and a
measured latency/bandwidth model of halo exchange and all-reduce); rank 0 prints the
ranking.  Parameters are replicated; their gradients are summed over all ranks in buckets
overlapped with backward (:class:`disttensor.nn.DistributedDataParallel`).  With batch norm
in its default global mode the run computes the same thing on any grid as on one rank.

Each epoch trains over the shuffled training samples (a progress line with the loss and
samples/s on rank 0 when it writes to a terminal), validates (CosmoFlow: MSE and MAE; U-Net:
Dice and accuracy), appends a row to ``OUT/metrics.csv`` and writes ``OUT/checkpoint.h5``
atomically; SIGTERM (or SIGINT) checkpoints at the next step and exits.  ``--resume`` continues
from ``OUT/checkpoint.h5`` exactly where it stopped (same batches, same loss curve).  The last
line compares the validation error with a trivial predictor (the mean training target; the
majority class).

Data: ``--data DIR`` is a directory of per-sample files or one stacked file as written by
``python -m disttensor.io.synthetic`` (``--task segmentation`` for the U-Net).  Validation
uses ``--val`` if given, else the last ``--val-fraction`` of the files of ``--data``.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .. import nn
from ..autograd import Tensor, no_grad
from ..core.agreement import agree
from ..core.comm import collective
from ..core.grid import ProcessGrid
from ..io import SampleDataset, load_checkpoint, save_checkpoint
from ..nn import functional as F
from ..nn.models import CosmoFlow, UNet3D
from ..nn.optim import flatten_state, unflatten_state
from ..nn.parallel import check_replicas
from ..ops._spatial import param_comm

__all__ = ["main", "run", "parse_args", "choose_grid", "TrainResult"]

CHECKPOINT = "checkpoint.h5"
METRICS = "metrics.csv"


# -- arguments -------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m disttensor.train",
                                description="Train CosmoFlow or a 3D U-Net on distributed, "
                                            "spatially partitioned samples.")
    p.add_argument("model", choices=("cosmoflow", "unet3d"))
    p.add_argument("--data", required=True, help="training samples (directory or file)")
    p.add_argument("--val", default=None, help="validation samples (default: the last "
                   "--val-fraction of the training files)")
    p.add_argument("--val-fraction", type=float, default=0.125)
    p.add_argument("--out", default="runs/train", help="metrics.csv and checkpoint.h5 go here")
    p.add_argument("--grid", default=None, help="SxDxHxW ranks, e.g. 2x2x1x1 (default: the "
                   "grid with the fastest step predicted by nn.perfmodel.plan_grid)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--batch-size", type=int, default=8, help="global batch (samples)")
    p.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--schedule", choices=("constant", "cosine", "step", "cosmoflow", "hybrid"),
                   default="constant", help="learning-rate schedule per step; hybrid: "
                   "GroPipe's mix of cosine and linear decay (--cosine-weight)")
    p.add_argument("--cosine-weight", type=float, default=0.5,
                   help="weight of the cosine part of --schedule hybrid (1: cosine, 0: linear)")
    p.add_argument("--warmup-epochs", type=int, default=0)
    p.add_argument("--clip-grad", type=float, default=None, help="clip by global norm")
    p.add_argument("--widths", default=None, help="CosmoFlow conv widths, e.g. 8,16,32")
    p.add_argument("--dense", default="128,64", help="CosmoFlow dense sizes")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--unet-widths", default=None,
                   help="U-Net encoder widths per level then bottom, e.g. 8,16:16,32:32,64")
    p.add_argument("--bn-stats", choices=("global", "local"), default="global")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--amp", action="store_true", help="float16 activations with float32 "
                   "master weights and dynamic loss scaling (GPU only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--no-overlap", action="store_true",
                   help="all-reduce each layer's gradients as backward reaches it (blocking)")
    p.add_argument("--no-prefetch", action="store_true")
    p.add_argument("--stages", type=int, default=1, help="pipeline stages: the model is cut "
                   "by layers into this many stages, each on its own ranks (a --grid per "
                   "stage; the job runs on stages x grid ranks); CosmoFlow only")
    p.add_argument("--micro-batches", type=int, default=None, help="micro-batches per global "
                   "batch in the pipeline (default: --stages)")
    p.add_argument("--pipeline-schedule", choices=("gpipe", "1f1b"), default="1f1b")
    p.add_argument("--partition", default="params", help="pipeline stages: 'params' "
                   "(balanced parameter counts), 'auto' (measured layer times, dynamic "
                   "programming) or layer ranges like 0:6,6:11")
    p.add_argument("--update-in-backward", action="store_true", help="update each parameter "
                   "as soon as its gradient is final (after its all-reduce bucket), freeing the "
                   "gradient; not with --clip-grad or --amp")
    p.add_argument("--memory-budget", type=float, default=None, help="fraction (0, 1] of the "
                   "unconstrained saved-activation peak: a planner chooses per layer to keep, "
                   "offload or recompute activations to fit it (profiled on the first batch)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.h5")
    p.add_argument("--no-checkpoint", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())


def choose_grid(nranks: int, batch: int, spatial: tuple[int, int, int]) -> tuple[int, ...]:
    """Default grid ``(sample, d, h, w)``: as many ranks on the sample axis as divide both the
    rank count and the global batch (data parallelism needs no halo), the rest cut the
    samples spatially along depth, then height (``MPI.Compute_dims`` balance)."""
    s = math.gcd(nranks, batch)
    rest = nranks // s
    if rest == 1:
        return (s, 1, 1, 1)
    d, h = MPI.Compute_dims(rest, 2)
    return (s, d, h, 1)


def _plan_grid(args, comm, sample_shape, probe, segmentation, progress, nranks: int,
               batch: int) -> tuple[int, ...]:
    """No ``--grid``: rank the grids of ``nranks`` ranks by the step time the performance
    model predicts for a batch of ``batch`` samples (:func:`disttensor.nn.perfmodel.plan_grid`,
    quick mode, collective over ``comm``) and take the fastest; the ranked table goes to
    rank 0's output.  With pipeline stages, the per-stage grid is planned for the whole model
    on one micro-batch (a proxy: every stage runs on the same grid).  A model the planner
    cannot handle falls back to :func:`choose_grid` (on every rank alike: planning errors are
    collective)."""
    if segmentation:
        args.classes = _num_classes(probe, comm)
    with collective(comm):
        model = build_model(args, sample_shape, np.random.default_rng(args.seed))
    t0 = time.perf_counter()
    try:
        plan = nn.perfmodel.plan_grid(model, sample_shape, batch, nranks, comm=comm,
                                      optimizer=args.optimizer,
                                      bucket_bytes=int(args.bucket_mb * 2 ** 20),
                                      overlap=not args.no_overlap, quick=True,
                                      dtype="float16" if args.amp else args.dtype)
    except ValueError as e:
        dims = choose_grid(nranks, args.batch_size, sample_shape[1:])
        progress.say(f"grid planning failed ({e}); default grid {dims}")
        return dims
    progress.say(plan.report(top=5) + f"\nchosen grid (sample, d, h, w) = {plan.best.grid} "
                 f"(planned in {time.perf_counter() - t0:.1f} s; --grid overrides)")
    return plan.best.grid


def _parse_partition(text: str):
    """``--partition``: 'params', 'auto' or ``a:b,b:c,...`` layer ranges."""
    if text in ("params", "auto"):
        return text
    try:
        return [tuple(int(v) for v in part.split(":")) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--partition {text!r}: expected 'params', 'auto' or layer ranges "
                         "like 0:6,6:11") from None


def _parse_grid(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(t) for t in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--grid {text!r}: expected four integers like 2x2x1x1") from None
    if len(dims) != 4 or min(dims) < 1:
        raise ValueError(f"--grid {text!r}: expected four positive integers SxDxHxW")
    return dims


# -- set-up ----------------------------------------------------------------------------------
def _split_files(data: str, val: str | None, fraction: float):
    if val is not None:
        return data, val
    if not os.path.isdir(data):
        raise ValueError(f"--data {data!r} is one file: give validation samples with --val")
    files = sorted(os.path.join(data, f) for f in os.listdir(data)
                   if f.lower().endswith((".h5", ".hdf5", ".hdf")) and not f.startswith("."))
    nval = max(1, int(round(len(files) * fraction)))
    if len(files) - nval < 1:
        raise ValueError(f"--data {data!r} holds {len(files)} sample files: too few to keep "
                         f"{nval} for validation")
    return files[:-nval], files[-nval:]


def build_model(args, input_shape, rng) -> nn.Module:
    """The model of ``args`` for samples of ``input_shape`` ``(C, D, H, W)``."""
    kw = dict(dtype=args.dtype, device=args.device, rng=rng)
    if args.model == "cosmoflow":
        widths = _ints(args.widths) if args.widths else (32, 64, 128, 256, 512)
        return CosmoFlow(input_size=input_shape[1:], in_channels=input_shape[0],
                         widths=widths, dense=_ints(args.dense), outputs=args.outputs,
                         dropout=args.dropout, seed=args.seed, **kw)
    if args.unet_widths:
        levels = [_ints(t) for t in args.unet_widths.split(":")]
        encoder, bottom = levels[:-1], levels[-1]
    else:
        encoder, bottom = ((32, 64), (64, 128), (128, 256)), (256, 512)
    return UNet3D(in_channels=input_shape[0], classes=args.classes, encoder=encoder,
                  bottom=bottom, bn_stats=args.bn_stats, input_size=input_shape[1:], **kw)


def build_optimizer(args, params):
    if args.optimizer == "sgd":
        return nn.optim.SGD(params, lr=args.lr, momentum=args.momentum,
                            weight_decay=args.weight_decay)
    cls = nn.optim.Adam if args.optimizer == "adam" else nn.optim.AdamW
    return cls(params, lr=args.lr, weight_decay=args.weight_decay)


def build_schedule(args, opt, steps_per_epoch: int):
    """A per-step schedule (epochs are converted to steps)."""
    warm = args.warmup_epochs * steps_per_epoch
    total = max(args.epochs * steps_per_epoch, 1)
    S = nn.lr_scheduler
    if args.schedule == "hybrid":
        return S.HybridCosineLinearLR(opt, total_steps=total, warmup_steps=min(warm, total - 1),
                                      cosine_weight=args.cosine_weight)
    if args.schedule == "cosmoflow":
        return S.CosmoFlowLR(opt, warmup_epochs=max(args.warmup_epochs, 1) * steps_per_epoch,
                             boundaries=(total // 2, 3 * total // 4))
    if args.schedule == "cosine":
        def f(step):
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(total - warm, 1)))
    elif args.schedule == "step":
        def f(step):
            if step < warm:
                return (step + 1) / warm
            return 0.1 ** (step // max(total // 3, 1))
    else:
        def f(step):
            return (step + 1) / warm if step < warm else 1.0
    return S.LambdaLR(opt, f)


# -- metrics ---------------------------------------------------------------------------------
def _target_mean(files, stacked: bool, yname: str, comm) -> np.ndarray:
    """Mean training target vector (rank 0 reads the small target datasets, broadcasts)."""
    def read():
        import h5py
        if stacked:
            with h5py.File(files[0], "r") as f:
                return np.asarray(f[yname][...], dtype=np.float64).mean(axis=0)
        acc = None
        for path in files:
            with h5py.File(path, "r") as f:
                v = np.asarray(f[yname][...], dtype=np.float64)
            acc = v if acc is None else acc + v
        return acc / len(files)
    with collective(comm):
        out = read() if comm.rank == 0 else None
    return comm.bcast(out, root=0)


def _segmentation_counts(logits, labels, classes: int) -> np.ndarray:
    """Per class: [true positives, predicted, actual] summed over the distributed batch."""
    from ..core.comm import allreduce
    pred = logits.local.argmax(axis=1)
    lab = labels.local.astype(np.int64, copy=False)
    xp = logits.xp
    out = xp.zeros((3, classes), dtype=xp.float64)
    for c in range(classes):
        p, t = pred == c, lab == c
        out[0, c] = (p & t).sum()
        out[1, c] = p.sum()
        out[2, c] = t.sum()
    res = allreduce(param_comm(logits), out, "sum")
    return res.get() if hasattr(res, "get") else res


def _dice(counts) -> tuple[float, float]:
    """Mean Dice over the foreground classes (1..C-1) and voxel accuracy."""
    tp, pred, act = counts
    fg = range(1, counts.shape[1])
    dice = [2 * tp[c] / (pred[c] + act[c]) if pred[c] + act[c] else 1.0 for c in fg]
    return float(np.mean(dice)) if dice else 1.0, float(tp.sum() / max(act.sum(), 1))


# -- the run ---------------------------------------------------------------------------------
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


class _Progress:
    """One progress line on rank 0 (rewritten in place on a terminal, quiet otherwise)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = enabled and sys.stdout.isatty()

    def update(self, text: str, final: bool = False):
        if not self.enabled:
            return
        if self.tty:
            sys.stdout.write("\r" + text.ljust(100) + ("\n" if final else ""))
            sys.stdout.flush()
        elif final:
            print(text, flush=True)

    def say(self, text: str):
        if self.enabled:
            print(text, flush=True)


class _StopFlag:
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


def _check_args(args, comm):
    """Validate what can be validated from the arguments alone (agreed by :func:`run`)."""
    with collective(comm):
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.amp and args.device != "cuda":
            raise ValueError("--amp (float16 activations) needs --device cuda: the CPU "
                             "kernels compute in float32 or float64")
        if args.epochs < 1:
            raise ValueError(f"--epochs must be >= 1, got {args.epochs}")
        if args.stages < 1:
            raise ValueError(f"--stages must be >= 1, got {args.stages}")
        if comm.size % args.stages:
            raise ValueError(f"--stages {args.stages} does not divide the {comm.size} ranks")
        if args.micro_batches is not None and args.micro_batches < 1:
            raise ValueError(f"--micro-batches must be >= 1, got {args.micro_batches}")
        if args.stages > 1:
            if args.model != "cosmoflow":
                raise ValueError("--stages > 1 cuts a sequential model into stages; the U-Net's "
                                 "skip connections make it one layer: use cosmoflow")
            for flag, on in (("--clip-grad", args.clip_grad), ("--amp", args.amp),
                             ("--memory-budget", args.memory_budget)):
                if on:
                    raise ValueError(f"{flag} is not supported with --stages > 1 (it needs "
                                     "every stage's gradients or activations at once)")
            _parse_partition(args.partition)
        if args.memory_budget is not None and not 0 < args.memory_budget <= 1:
            raise ValueError(f"--memory-budget is a fraction in (0, 1], got "
                             f"{args.memory_budget}")
        if args.update_in_backward and (args.clip_grad or args.amp):
            raise ValueError(f"--update-in-backward updates each parameter before the others' "
                             f"gradients exist, so it cannot run with "
                             f"{'--clip-grad' if args.clip_grad else '--amp'} (which needs "
                             "every gradient first)")
        per_stage = comm.size // args.stages
        if args.grid is not None:
            dims = _parse_grid(args.grid)
            if math.prod(dims) != per_stage:
                raise ValueError(f"--grid {args.grid} has {math.prod(dims)} ranks but the job "
                                 f"runs on {per_stage}" + (f" per stage ({comm.size} ranks / "
                                 f"{args.stages} stages)" if args.stages > 1 else ""))
            if args.batch_size % dims[0]:
                raise ValueError(f"the global batch {args.batch_size} is not divisible by the "
                                 f"{dims[0]} ranks of the grid's sample axis")
            chunks = _micro_batches(args)
            if args.stages > 1 and args.batch_size % (dims[0] * chunks):
                raise ValueError(f"the global batch {args.batch_size} does not split into "
                                 f"{chunks} micro-batches on each of the {dims[0]} ranks of "
                                 "the sample axis")


def _micro_batches(args) -> int:
    return args.micro_batches if args.micro_batches is not None else args.stages


def _checkpoint_state(model, opt, sched, result, epoch, step_in_epoch, config, scaler,
                      pipe=None):
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


def _restore(path, grid, model, opt, sched, result, config, scaler, pipe=None):
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


def run(argv=None, comm=None, on_step=None) -> TrainResult:
    """Parse ``argv`` and train (collective over ``comm``, default ``COMM_WORLD``).
    ``on_step(step)``, if given, runs on every rank after each training step."""
    comm = MPI.COMM_WORLD if comm is None else comm
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    # agreed before parsing: an option that makes argparse exit on one rank only would
    # leave the others waiting
    agree(comm, "disttensor.train", argv=argv)
    args = parse_args(argv)
    _check_args(args, comm)
    rank0 = comm.rank == 0
    progress = _Progress(rank0 and not args.quiet)
    with collective(comm):
        train_src, val_src = _split_files(args.data, args.val, args.val_fraction)
    segmentation = args.model == "unet3d"
    yname = "labels" if segmentation else "unitPar"

    # probe the data on a provisional grid to learn the sample shape
    probe = SampleDataset(train_src, ProcessGrid((comm.size,), comm=comm), split=(0,),
                          batch_size=1, prefetch=False, y_dataset=yname)
    sample_shape, n_train = probe.sample_shape, probe.num_samples
    args.outputs = probe.num_targets
    per_stage = comm.size // args.stages
    try:
        if args.grid:
            dims = _parse_grid(args.grid)
        elif args.stages == 1:
            dims = _plan_grid(args, comm, sample_shape, probe, segmentation, progress,
                              comm.size, args.batch_size)
        elif args.batch_size % _micro_batches(args) == 0:
            dims = _plan_grid(args, comm, sample_shape, probe, segmentation, progress,
                              per_stage, args.batch_size // _micro_batches(args))
        else:
            dims = choose_grid(per_stage, args.batch_size, sample_shape[1:])
    finally:
        probe.close()
    full = None
    if args.stages > 1:
        # (groups, stages, d, h, w); the ranks of one stage hold a (sample, d, h, w) grid
        full = ProcessGrid((dims[0], args.stages) + tuple(dims[1:]), comm=comm)
        grid = ProcessGrid(dims, comm=full.sub_comm([0, 2, 3, 4]))
    else:
        grid = ProcessGrid(dims, comm=comm)
    with collective(comm):
        if args.batch_size > n_train:
            raise ValueError(f"the global batch {args.batch_size} is larger than the "
                             f"{n_train} training samples")
    split = (0, None, 1, 2, 3)
    prefetch = not args.no_prefetch
    train_ds = SampleDataset(train_src, grid, split, batch_size=args.batch_size, shuffle=True,
                             seed=args.seed, prefetch=prefetch, drop_last=True,
                             y_dataset=yname, device=args.device)
    val_ds = SampleDataset(val_src, grid, split, batch_size=args.batch_size, shuffle=False,
                           seed=args.seed, prefetch=prefetch, y_dataset=yname,
                           device=args.device)
    try:
        if segmentation:
            args.classes = _num_classes(train_ds, comm)
        with collective(comm):
            if val_ds.sample_shape != sample_shape:
                raise ValueError(f"validation samples have shape {val_ds.sample_shape}, the "
                                 f"training samples {sample_shape}")
            model = build_model(args, sample_shape, nn.init.manual_seed(args.seed))
        return _train(args, comm, grid, train_ds, val_ds, model, progress, segmentation,
                      yname, sample_shape, on_step, full)
    finally:
        train_ds.close()
        val_ds.close()


def _num_classes(ds, comm) -> int:
    """Number of classes of a segmentation dataset (its ``classes`` attribute, else 1 + the
    largest label of the first sample)."""
    def read():
        import h5py
        with h5py.File(ds.files[0], "r") as f:
            c = f.attrs.get("classes", f[ds.y_dataset].attrs.get("classes"))
            if c is None:
                c = int(np.max(f[ds.y_dataset][...])) + 1
            return int(c)
    with collective(comm):
        out = read() if comm.rank == 0 else None
    return comm.bcast(out, root=0)


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


def _train(args, comm, grid, train_ds, val_ds, model, progress, segmentation, yname,
           sample_shape, on_step, full=None) -> TrainResult:
    loss_fn = F.cross_entropy if segmentation else F.mse_loss
    dtype = np.dtype("float16" if args.amp else args.dtype)
    bucket_bytes = int(args.bucket_mb * 2 ** 20)
    pipe = ddp = None
    if full is not None:
        chunks = _micro_batches(args)
        partition = _parse_partition(args.partition)
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
            start_epoch, skip = _restore(ckpt, ckpt_grid, model, opt, sched, result, config,
                                         scaler, pipe)
            progress.say(f"resumed from {ckpt}: epoch {start_epoch + 1}, step "
                         f"{result.steps}")
    if not segmentation:
        tmean = _target_mean(train_ds.files, train_ds.stacked, yname, comm)
    progress.say(f"disttensor.train {args.model}: {comm.size} ranks, grid "
                 f"(sample, d, h, w) = {grid.dims}"
                 f"{f' per stage x {pipe.stages} stages' if pipe is not None else ''}, "
                 f"{model.num_parameters():,} parameters, "
                 f"{train_ds.num_samples} training / {val_ds.num_samples} validation samples "
                 f"of shape {sample_shape}, global batch {args.batch_size}")
    stop = _StopFlag()
    stop.install()
    try:
        for epoch in range(start_epoch, args.epochs):
            model.train()
            t0, seen = time.perf_counter(), 0
            halt = signalled = False
            nbatches = len(train_ds)
            it = _batches(train_ds, epoch, skip)
            for k, (x, y) in enumerate(it, start=skip):
                x = x if x.dtype == dtype else x.astype(dtype)
                y = y if segmentation or y.dtype == dtype else y.astype(dtype)
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
                sched.step()
                result.steps += 1
                result.losses.append(lossv)
                seen += args.batch_size
                rate = seen / max(time.perf_counter() - t0, 1e-9)
                progress.update(f"epoch {epoch + 1}/{args.epochs} step {k + 1}/{nbatches}"
                                f" loss {lossv:.5f} {rate:.1f} samples/s")
                if on_step is not None:
                    on_step(result.steps)
                signalled = bool(comm.allreduce(stop.raised, op=MPI.LOR))
                halt = signalled or (args.max_steps is not None and
                                     result.steps >= args.max_steps)
                if halt and k + 1 < nbatches:  # stopping inside an epoch
                    if not args.no_checkpoint:
                        _save(ckpt, ckpt_grid, model, opt, sched, result, epoch, k + 1,
                              config, scaler, pipe)
                    progress.update(f"stopped at step {result.steps} ("
                                    f"{'signal' if signalled else '--max-steps'}); "
                                    f"checkpoint {ckpt}", final=True)
                    result.interrupted = signalled
                    return result
                if halt:
                    break
            skip = 0
            # rank 0's clock, so every rank records the same metrics (and checkpoint)
            elapsed = comm.bcast(time.perf_counter() - t0, root=0)
            metrics = _validate(model if pipe is None else pipe, val_ds, loss_fn,
                                segmentation, dtype, None if segmentation else tmean, args)
            if pipe is not None:  # computed on the last stage
                metrics = comm.bcast(metrics, root=full.rank_of(
                    (0, pipe.stages - 1) + (0,) * (full.ndim - 2)))
            metrics.update({"epoch": epoch + 1, "step": result.steps,
                            "train_loss": float(np.mean(result.losses[-max(seen //
                                                args.batch_size, 1):])),
                            "lr": sched.get_last_lr()[0],
                            "samples_per_s": seen / max(elapsed, 1e-9)})
            result.val.append(metrics)
            result.epochs_done = epoch + 1
            progress.update(_epoch_line(metrics, args, segmentation), final=True)
            if comm.rank == 0:
                _append_csv(os.path.join(out, METRICS), metrics)
            if not args.no_checkpoint:
                _save(ckpt, ckpt_grid, model, opt, sched, result, epoch + 1, 0, config, scaler,
                      pipe)
            if halt:
                result.interrupted = signalled
                break
    finally:
        stop.restore()
        if update is not None:
            update.remove()
        if pipe is not None:
            pipe.release()
        else:
            ddp.reducer.release()
    if result.val:
        last = result.val[-1]
        result.baseline = {k: last[k] for k in last if k.startswith("baseline_")}
        progress.say(_final_line(last, segmentation))
    return result


def _batches(ds, epoch, skip):
    if skip == 0:
        yield from ds.epoch(epoch)
        return
    for idx in ds.batch_indices(epoch)[skip:]:
        yield ds.read_batch(idx)


def _save(path, grid, model, opt, sched, result, epoch, step_in_epoch, config, scaler,
         pipe=None):
    host, scalars = _checkpoint_state(model, opt, sched, result, epoch, step_in_epoch, config,
                                      scaler, pipe)
    save_checkpoint(path, host=host, scalars=scalars, grid=grid)


def _validate(model, ds, loss_fn, segmentation, dtype, tmean, args) -> dict:
    """Validation metrics (collective).  ``model`` may be a :class:`~disttensor.nn.Pipeline`:
    its output exists on the last stage only, whose metrics are the result (the other stages
    return theirs unfilled; the caller broadcasts the last stage's)."""
    model.eval()
    total, n = 0.0, 0
    abs_err = base_abs = base_sq = 0.0
    counts = None
    with no_grad():
        for x, y in ds.epoch(0):
            xt = Tensor(x if x.dtype == dtype else x.astype(dtype))
            pred = model(xt)
            b = x.shape[0]
            if pred is None:  # an earlier pipeline stage
                continue
            total += loss_fn(pred, Tensor(y)).item() * b
            n += b
            if segmentation:
                c = _segmentation_counts(pred.data, y, args.classes)
                counts = c if counts is None else counts + c
            else:
                p, t = pred.data, y.astype(pred.dtype)
                abs_err += float(np.abs(p - t).mean()) * b
                tm = np.asarray(tmean, dtype=np.float64)
                base_abs += float(np.abs(t - tm).mean()) * b
                base_sq += float(((t - tm) ** 2).mean()) * b
    model.train()
    out = {"val_loss": total / max(n, 1)}
    if segmentation:
        dice, acc = _dice(counts)
        majority = counts[2].max() / max(counts[2].sum(), 1)
        out.update({"val_dice": dice, "val_accuracy": acc, "baseline_dice": 0.0,
                    "baseline_accuracy": float(majority)})
    else:
        out.update({"val_mae": abs_err / max(n, 1), "baseline_mae": base_abs / max(n, 1),
                    "baseline_mse": base_sq / max(n, 1)})
    return out


def _epoch_line(m, args, segmentation) -> str:
    head = f"epoch {m['epoch']}/{args.epochs} train loss {m['train_loss']:.5f} " \
           f"val loss {m['val_loss']:.5f}"
    if segmentation:
        return head + f" val Dice {m['val_dice']:.3f} accuracy {m['val_accuracy']:.3f} " \
                      f"({m['samples_per_s']:.1f} samples/s)"
    return head + f" val MAE {m['val_mae']:.4f} ({m['samples_per_s']:.1f} samples/s)"


def _final_line(m, segmentation) -> str:
    if segmentation:
        return (f"final: validation Dice {m['val_dice']:.3f} (predicting the majority class: "
                f"{m['baseline_dice']:.3f}), accuracy {m['val_accuracy']:.3f} (majority "
                f"class: {m['baseline_accuracy']:.3f})")
    ratio = m["baseline_mae"] / max(m["val_mae"], 1e-12)
    return (f"final: validation MAE {m['val_mae']:.4f} vs {m['baseline_mae']:.4f} for the "
            f"mean-target predictor ({ratio:.1f}x lower)")


def _append_csv(path, row: dict) -> None:
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def main(argv=None) -> int:
    result = run(argv)
    return 0 if result.epochs_done or result.interrupted or result.steps else 1


if __name__ == "__main__":
    sys.exit(main())
