"""One-call checkpoints of custom loops (:func:`disttensor.nn.save_training_state` /
:func:`~disttensor.nn.load_training_state`): a run interrupted after 2 of 4 steps and resumed into
freshly built objects (another seed, the scheduler built before or after loading) continues
exactly as the uninterrupted run (parameters bit-identical, the learning rate restored),
with a DistributedDataParallel model on a spatial grid (uneven blocks);
``extra`` round trip (JSON values and arrays); errors on every rank."""
from __future__ import annotations

import numpy as np

import disttensor as dt
from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import functional as F

from checks import COMM, SIZE, expect, grid
from conftest import assert_raises_all
from gradchecks import guarded

STEPS, CUT = 4, 2


def build(seed, g):
    rng = np.random.default_rng(seed)
    net = nn.Sequential(nn.Conv1d(2, 2, 3, padding=1, dtype="float64", rng=rng), nn.ReLU(),
                        nn.Flatten(), nn.Linear(14, 2, dtype="float64", rng=rng))
    ddp = nn.DistributedDataParallel(net, g, bucket_bytes=512)
    opt = nn.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.05)
    return net, ddp, opt


def run_steps(ddp, opt, sched, g, split, first, last):
    rng = np.random.default_rng(99)
    batches = [(rng.standard_normal((4, 2, 7)), rng.standard_normal((4, 2)))
               for _ in range(STEPS)]
    for x, y in batches[first:last]:
        opt.zero_grad()
        out = ddp(Tensor(dt.from_global(x, grid=g, split=split)))
        F.mse_loss(out, Tensor(dt.from_global(y, grid=g, split=(split[0], None)))).backward()
        opt.step()
        sched.step()


@guarded
def test_resume_equals_uninterrupted(shared_tmp_path):
    """A spatial grid (7 positions: uneven blocks); the resumed run's scheduler is built
    before the optimizer's state is loaded and again after it (the issue's order)."""
    g = grid((1, SIZE))
    split = (None, None, 1)
    path = str(shared_tmp_path / "state.h5")
    net, ddp, opt = build(1, g)
    sched = nn.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    run_steps(ddp, opt, sched, g, split, 0, STEPS)
    want = {k: v.copy() for k, v in net.state_dict().items()}
    want_lr = opt.param_groups[0]["lr"]
    ddp.reducer.release()

    net, ddp, opt = build(1, g)
    sched = nn.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    run_steps(ddp, opt, sched, g, split, 0, CUT)
    saved_lr = opt.param_groups[0]["lr"]
    nn.save_training_state(path, model=ddp, optimizer=opt, scheduler=sched, step=CUT,
                           extra={"epoch": 1, "note": "x", "hist": np.arange(3.0)})
    ddp.reducer.release()

    net2, ddp2, opt2 = build(2, g)  # other weights: everything must come from the file
    sched2 = nn.lr_scheduler.CosineAnnealingLR(opt2, T_max=STEPS)  # built before loading
    state = nn.load_training_state(path, model=ddp2, optimizer=opt2)
    expect(opt2.param_groups[0]["lr"] == saved_lr, "the optimizer's state restores the lr")
    sched2 = nn.lr_scheduler.CosineAnnealingLR(opt2, T_max=STEPS)  # built after: resets lr
    state = nn.load_training_state(path, model=ddp2, optimizer=opt2, scheduler=sched2)
    expect(opt2.param_groups[0]["lr"] == saved_lr,
           f"learning rate after load {opt2.param_groups[0]['lr']} != saved {saved_lr}")
    expect(state.step == CUT and state.extra["epoch"] == 1 and state.extra["note"] == "x",
           f"step/extra {state}")
    expect(np.array_equal(state.extra["hist"], np.arange(3.0)), "extra array")
    run_steps(ddp2, opt2, sched2, g, split, CUT, STEPS)
    ddp2.reducer.release()
    for k, v in net2.state_dict().items():
        expect(np.array_equal(v, want[k]), f"{k}: resumed differs from uninterrupted")
    expect(opt2.param_groups[0]["lr"] == want_lr, "final learning rate")


def test_training_state_errors(shared_tmp_path):
    g = grid((SIZE,))
    path = str(shared_tmp_path / "bare.h5")
    lin = nn.Linear(2, 2, rng=np.random.default_rng(0))
    opt = nn.optim.SGD(lin.parameters(), lr=0.1)
    nn.save_training_state(path, model=lin, step=5, grid=g)
    sched = nn.lr_scheduler.StepLR(opt, 2)
    assert_raises_all(COMM, ValueError, "holds no scheduler state",
                      lambda: nn.load_training_state(path, model=lin, scheduler=sched, grid=g))
    assert_raises_all(COMM, TypeError, "JSON",
                      lambda: nn.save_training_state(path, model=lin, extra={"f": object()},
                                                     grid=g))
    other = nn.Linear(3, 2, rng=np.random.default_rng(0))
    assert_raises_all(COMM, ValueError, "shape",
                      lambda: nn.load_training_state(path, model=other, grid=g))
    state = nn.load_training_state(path, model=lin, grid=g)
    assert state.step == 5 and state.extra == {}
