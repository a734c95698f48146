"""Training command line (``python -m disttensor.train``); see :mod:`disttensor.train.loop`."""
from .loop import (CHECKPOINT, METRICS, TrainResult, build_model, build_optimizer, build_schedule,
                   choose_grid, main, parse_args, run)

__all__ = ["main", "run", "parse_args", "choose_grid", "TrainResult"]
