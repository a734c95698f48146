"""Watching a training run: TensorBoard event files, MLPerf logging events, the best
checkpoint, the ``--target-mae`` stop with its time to train, and the curves at the end.

:class:`Watch` is created by :func:`~disttensor.train.loop.train_epochs` on every rank; only
rank 0 writes (event files, ``OUT/mlperf.log``, ``OUT/curves.png``, the copy to
``OUT/best.h5``).  The decisions (best epoch, target reached, elapsed time) are computed from
values that are already the same on every rank (the validation metrics and rank 0's clock,
broadcast), so every rank takes them alike.  Collective: :meth:`Watch.start` (rank 0's
event file and log opened, its error raised on every rank), :meth:`Watch.epoch_metrics` (one
small broadcast) and :meth:`Watch.epoch_end` (the best checkpoint's copy, its error raised on
every rank).

TensorBoard (``tensorboardX``, ``pip install 'disttensor[tensorboard]'``): ``--tensorboard
DIR``, default ``OUT/tensorboard`` when the package is installed, ``--no-tensorboard`` for
none.  Scalars: ``train/loss``, ``train/lr`` (the rate the step used) and
``train/samples_per_s`` per step (the step's global number), and ``epoch/<column>`` for every
column of the epoch's ``metrics.csv`` row (at the row's ``step``).

MLPerf logging (``mlperf-logging``, ``pip install 'disttensor[mlperf]'``): with ``--mllog`` or
``--preset mlperf-hpc`` where installed, the reference's events to ``OUT/mlperf.log``
(``:::MLLOG`` lines): submission and hyper-parameters (global batch, optimizer, the peak rate,
warm-up epochs and factor, decay boundaries and factor, sample counts, seed), ``init_*``,
``run_start``, ``epoch_start``/``epoch_stop``, ``eval_start``/``eval_stop``, ``eval_error``
(the validation MAE) per epoch, and ``run_stop`` (``success`` once the target MAE is reached;
``aborted`` when a target was set and not reached).
"""
from __future__ import annotations

import logging
import os
import shutil
import time

from ..core.comm import collective
from ..io._atomic import replace_atomically
from ..io._h5file import root_call
from .plots import CURVES, plot_curves
from .presets import lr_scale, parse_decay, peak_lr

__all__ = ["Watch", "BEST", "TENSORBOARD", "MLPERF_LOG", "is_better"]

BEST = "best.h5"
TENSORBOARD = "tensorboard"
MLPERF_LOG = "mlperf.log"


def is_better(metrics: dict, best: dict | None, segmentation: bool) -> bool:
    """Whether the epoch ``metrics`` beat ``best`` (validation MAE lower; Dice higher)."""
    if best is None:
        return True
    if segmentation:
        return metrics["val_dice"] > best["val_dice"]
    return metrics["val_mae"] < best["val_mae"]


def _tensorboard_dir(args):
    if args.no_tensorboard:
        return None
    if args.tensorboard is not None:
        return args.tensorboard
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return None
    return os.path.join(args.out, TENSORBOARD)


def _mllogger(args):
    """An :class:`mllog.MLLogger` writing to ``OUT/mlperf.log`` (its own logger: nothing to
    stdout), or ``None`` (not asked for, or ``'auto'`` without the package)."""
    if not args.mllog:
        return None, None
    try:
        from mlperf_logging.mllog.mllog import MLLogger
    except ImportError:
        return None, None
    logger = logging.getLogger(f"disttensor.train.mllog.{id(args)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(os.path.join(args.out, MLPERF_LOG))
    handler.setLevel(logging.INFO)
    logger.addHandler(handler)
    return MLLogger(logger=logger, default_stack_offset=2), handler


class Watch:
    """The watchers of one run (see the module docstring); ``rank0``: this rank writes."""

    def __init__(self, args, comm, segmentation: bool, progress):
        self.args, self.comm, self.segmentation = args, comm, segmentation
        self.progress = progress
        self.rank0 = comm.rank == 0
        self.writer = self.ml = self._handler = None
        self.tb_dir = _tensorboard_dir(args) if self.rank0 else None
        self.best = None          # the best epoch's metrics row so far
        self.reached = None       # the first row that reached --target-mae
        self.t0 = self.before = 0.0
        self.checkpoints = not args.no_checkpoint

    # -- the run ------------------------------------------------------------------------
    def start(self, result, n_train: int, n_val: int, resumed: bool):
        """At the start of the epochs (after a resume: ``result`` holds the earlier rows)."""
        for row in result.val:
            if is_better(row, self.best, self.segmentation):
                self.best = row
            if self.reached is None and self._reaches(row):
                self.reached = row
        self.before = float(result.val[-1].get("elapsed_s", 0.0)) if result.val else 0.0
        self.t0 = time.perf_counter()
        with collective(self.comm):  # an unwritable directory fails every rank
            if self.rank0:
                if self.tb_dir is not None:
                    from tensorboardX import SummaryWriter
                    # a session of its own (tensorboardX names files by the second: a
                    # resume within the same second would overwrite the first file)
                    self.writer = SummaryWriter(self.tb_dir,
                                                filename_suffix=f".{time.time_ns()}")
                self.ml, self._handler = _mllogger(self.args)
                if self.ml is not None:
                    self._mllog_start(n_train, n_val, resumed)
                elif self.args.mllog == "auto":  # the preset, without the package
                    self.progress.say("MLPerf logging skipped: mlperf-logging is not "
                                      "installed (pip install 'disttensor[mlperf]')")

    def _mllog_start(self, n_train, n_val, resumed):
        from mlperf_logging.mllog import constants as C
        a, ev = self.args, self.ml.event
        if not resumed:
            self.ml.event(key=C.CACHE_CLEAR, value=True)
            self.ml.start(key=C.INIT_START)
            ev(key=C.SUBMISSION_BENCHMARK, value=a.model)
            ev(key=C.GLOBAL_BATCH_SIZE, value=a.batch_size)
            ev(key=C.OPT_NAME, value=a.optimizer)
            ev(key=C.OPT_BASE_LR, value=peak_lr(a))
            ev(key=C.OPT_WEIGHT_DECAY, value=a.weight_decay)
            ev(key=C.OPT_LR_WARMUP_EPOCHS, value=a.warmup_epochs)
            ev(key=C.OPT_LR_WARMUP_FACTOR, value=lr_scale(a))
            if a.decay_epochs:
                bounds, factors = parse_decay(a.decay_epochs)
                ev(key=C.OPT_LR_DECAY_BOUNDARY_EPOCHS, value=sorted(bounds))
                ev(key=C.OPT_LR_DECAY_FACTOR, value=max(factors))
            ev(key=C.TRAIN_SAMPLES, value=n_train)
            ev(key=C.EVAL_SAMPLES, value=n_val)
            ev(key=C.SEED, value=a.seed)
            ev(key="number_of_ranks", value=self.comm.size)
            self.ml.end(key=C.INIT_STOP)
        self.ml.start(key=C.RUN_START)

    def step(self, step: int, loss: float, lr: float, rate: float):
        """After global step ``step`` (1-based) that used the rate ``lr``."""
        if self.writer is not None:
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/lr", lr, step)
            self.writer.add_scalar("train/samples_per_s", rate, step)

    def epoch_start(self, epoch: int):
        """Before the steps of ``epoch`` (0-based)."""
        if self.ml is not None:
            from mlperf_logging.mllog import constants as C
            self.ml.start(key=C.EPOCH_START, metadata={C.EPOCH_NUM: epoch + 1})

    def eval_start(self, epoch: int):
        if self.ml is not None:
            from mlperf_logging.mllog import constants as C
            self.ml.end(key=C.EPOCH_STOP, metadata={C.EPOCH_NUM: epoch + 1})
            self.ml.start(key=C.EVAL_START, metadata={C.EPOCH_NUM: epoch + 1})

    def _reaches(self, row) -> bool:
        t = self.args.target_mae
        return t is not None and "val_mae" in row and row["val_mae"] <= t

    def elapsed(self) -> float:
        """Seconds of training so far (earlier sessions of a resumed run included; rank 0's
        clock, broadcast: collective)."""
        return self.comm.bcast(self.before + time.perf_counter() - self.t0
                               if self.rank0 else None, root=0)

    def epoch_metrics(self, metrics: dict):
        """Add this watch's columns to the epoch's ``metrics`` row (collective):
        ``elapsed_s`` and, with ``--target-mae``, ``target_reached`` (0/1)."""
        metrics["elapsed_s"] = self.elapsed()
        if self.args.target_mae is not None:
            metrics["target_reached"] = int(self._reaches(metrics))

    def epoch_end(self, metrics: dict, out: str, ckpt: str) -> bool:
        """After the epoch's row is recorded and its checkpoint written: event scalars, the
        best checkpoint, the MLPerf events.  Returns whether the run stops now (the target
        MAE reached for the first time).  Collective."""
        if self.writer is not None:
            step = metrics["step"]
            for k, v in metrics.items():
                if k not in ("epoch", "step"):
                    self.writer.add_scalar(f"epoch/{k}", float(v), step)
            self.writer.flush()
        if is_better(metrics, self.best, self.segmentation):
            self.best = metrics
            if self.checkpoints:
                root_call(self.comm, lambda: _copy_atomically(ckpt, os.path.join(out, BEST)))
        stop = self.reached is None and self._reaches(metrics)
        if stop:
            self.reached = metrics
        if self.ml is not None:
            from mlperf_logging.mllog import constants as C
            meta = {C.EPOCH_NUM: metrics["epoch"]}
            if not self.segmentation:
                self.ml.event(key="eval_error", value=metrics["val_mae"], metadata=meta)
            self.ml.end(key=C.EVAL_STOP, metadata=meta)
        return stop

    def summary(self) -> str | None:
        """The line on the target MAE (``None`` without ``--target-mae``)."""
        t = self.args.target_mae
        if t is None:
            return None
        if self.reached is None:
            return f"target MAE {t} not reached"
        r = self.reached
        return (f"target MAE {t} reached at epoch {r['epoch']} (validation MAE "
                f"{r['val_mae']:.4f}): time to train {r['elapsed_s']:.1f} s")

    def close(self, result, out: str, finished: bool):
        """At the end of the run (``finished``: not stopped part-way): close the event file,
        ``run_stop``, draw the curves (rank 0)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.ml is not None:
            from mlperf_logging.mllog import constants as C
            if finished:
                ok = self.args.target_mae is None or self.reached is not None
                self.ml.end(key=C.RUN_STOP, metadata={
                    "status": C.SUCCESS if ok else C.ABORTED})
            self.ml.logger.removeHandler(self._handler)
            self._handler.close()
            self.ml = None
        if self.rank0 and finished and not self.args.no_plots and result.val:
            try:
                line = plot_curves(os.path.join(out, CURVES), result.losses, result.val,
                                   self.segmentation, self.args.target_mae)
            except Exception as e:  # a figure must not fail a finished run
                line = f"{CURVES} not written: {type(e).__name__}: {e}"
            self.progress.say(line)


def _copy_atomically(src: str, dst: str):
    """Copy ``src`` to ``dst`` through a temporary file renamed over it (one rank)."""
    directory, name = os.path.split(os.path.abspath(dst))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(src, tmp)
        replace_atomically(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
