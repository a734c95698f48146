"""The optimizers' compiled one-pass updates (:mod:`disttensor.ops.local.cpu.optim_update`),
imported at the first call: they compile with Numba, which ``import disttensor`` does not
load.  After the first call each name refers to the compiled module's function directly.
Local (no MPI); each returns False, touching nothing, where the arrays are not ones it takes
(the optimizer then runs its NumPy path)."""
from __future__ import annotations

__all__ = ["adam_step", "sgd_step", "rmsprop_step", "adagrad_step", "nadam_step",
           "radam_step"]


def adam_step(*args) -> bool:
    """:func:`disttensor.ops.local.cpu.optim_update.adam_step`."""
    global adam_step
    from ..ops.local.cpu.optim_update import adam_step
    return adam_step(*args)


def sgd_step(*args) -> bool:
    """:func:`disttensor.ops.local.cpu.optim_update.sgd_step`."""
    global sgd_step
    from ..ops.local.cpu.optim_update import sgd_step
    return sgd_step(*args)


def rmsprop_step(*args) -> bool:
    """:func:`disttensor.ops.local.cpu.optim_update.rmsprop_step`."""
    global rmsprop_step
    from ..ops.local.cpu.optim_update import rmsprop_step
    return rmsprop_step(*args)


def adagrad_step(*args) -> bool:
    """:func:`disttensor.ops.local.cpu.optim_update.adagrad_step`."""
    global adagrad_step
    from ..ops.local.cpu.optim_update import adagrad_step
    return adagrad_step(*args)


def nadam_step(*args) -> bool:
    """:func:`disttensor.ops.local.cpu.optim_update.nadam_step`."""
    global nadam_step
    from ..ops.local.cpu.optim_update import nadam_step
    return nadam_step(*args)


def radam_step(*args) -> bool:
    """:func:`disttensor.ops.local.cpu.optim_update.radam_step`."""
    global radam_step
    from ..ops.local.cpu.optim_update import radam_step
    return radam_step(*args)
