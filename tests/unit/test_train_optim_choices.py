"""The training CLI's optimizer and schedule choices added for issue 19 (RMSprop, Adagrad,
NAdam, RAdam; onecycle, poly) build what they name (no MPI: the builders do not
communicate)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from disttensor.nn import lr_scheduler as S
from disttensor.nn import optim
from disttensor.train.arguments import parse_args
from disttensor.train.builders import build_optimizer, build_schedule

from .test_nn_optim import make_params


def _args(*extra):
    return parse_args(["cosmoflow", "--data", "unused", "--epochs", "3", "--lr", "0.2",
                       "--weight-decay", "0.01", *extra])


@pytest.mark.parametrize("name, cls", [("rmsprop", optim.RMSprop), ("adagrad", optim.Adagrad),
                                       ("nadam", optim.NAdam), ("radam", optim.RAdam)])
def test_new_optimizers(name, cls):
    opt = build_optimizer(_args("--optimizer", name), make_params(0))
    assert type(opt) is cls
    assert opt.param_groups[0]["lr"] == 0.2 and opt.param_groups[0]["weight_decay"] == 0.01


def test_poly_schedule_is_nnunets():
    opt = build_optimizer(_args("--schedule", "poly"), make_params(0))
    s = build_schedule(_args("--schedule", "poly"), opt, steps_per_epoch=4)
    assert isinstance(s, S.PolynomialLR)
    for step in range(13):
        assert s.get_last_lr()[0] == pytest.approx(0.2 * (1 - min(step, 12) / 12) ** 0.9,
                                                   rel=1e-13, abs=1e-18)
        s.step()


@pytest.mark.parametrize("warmup, pct", [("0", 0.3), ("1", 1 / 3)])
def test_onecycle_schedule(warmup, pct):
    args = _args("--schedule", "onecycle", "--optimizer", "sgd", "--warmup-epochs", warmup)
    opt = build_optimizer(args, make_params(0))
    s = build_schedule(args, opt, steps_per_epoch=4)
    assert isinstance(s, S.OneCycleLR) and s.total_steps == 12
    lrs = [s.get_last_lr()[0]]
    for _ in range(12):
        s.step()
        lrs.append(s.get_last_lr()[0])
    assert lrs[0] == pytest.approx(0.2 / 25) and 0.19 < max(lrs) <= 0.2
    assert int(np.argmax(lrs)) == math.ceil(pct * 12 - 1)   # the warm-up's length
    assert opt.param_groups[0]["momentum"] != 0.9      # cycled
