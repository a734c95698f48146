"""Optimizer steps on real distributed gradients: 10 steps of SGD (momentum, weight decay)
and Adam on a small CosmoFlow wrapped in :class:`~disttensor.nn.DistributedDataParallel`
(small buckets) on sample, spatial, hybrid and uneven grids give, step by step, the same loss
and, at the end, the same parameters (to 1e-10 of each parameter's largest entry) and
optimizer state as the same steps on one rank (the model on a ``(1, 1, 1, 1)`` grid over
``MPI.COMM_SELF``, built from the same seed, fed the same batches).
"""
from __future__ import annotations

import numpy as np
import pytest

import disttensor as dt
from disttensor.autograd import Tensor
from disttensor.nn import DistributedDataParallel
from disttensor.nn import functional as F
from disttensor.nn.models import CosmoFlow
from disttensor.nn.optim import SGD, Adam

from checks import SIZE, expect, grid
from gradchecks import close, guarded, rel_err, self_grid

N = 4
STEPS = 10
TOL = 1e-10

OPTIMIZERS = {
    "sgd": lambda params: SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda params: Adam(params, lr=0.01, betas=(0.9, 0.99), weight_decay=1e-3),
}


def model(input_size=8):
    return CosmoFlow(input_size=input_size, in_channels=2, widths=(3, 4), dense=(5,),
                     outputs=3, dtype="float64", rng=np.random.default_rng(1))


def batches(spatial):
    """The global batch of each step (a different one every step)."""
    rng = np.random.default_rng(123)
    return [(rng.standard_normal((N, 2, *spatial)), rng.standard_normal((N, 3)) * 0.5)
            for _ in range(STEPS)]


def train(opt_name, spatial, g, sizes=None, wrap=True, overlap=True):
    """``STEPS`` optimizer steps; returns the losses, the final parameters and optimizer
    state by parameter name."""
    m = model(spatial)
    net = DistributedDataParallel(m, g, bucket_bytes=512, overlap=overlap) if wrap else m
    opt = OPTIMIZERS[opt_name](list(m.parameters()))
    losses = []
    try:
        for x, y in batches(spatial):
            xt = Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3),
                                       sizes=None if sizes is None else list(sizes)))
            yt = Tensor(dt.from_global(y, grid=g, split=(0, None),
                                       sizes=None if sizes is None else [sizes[0], None]))
            opt.zero_grad()
            loss = F.mse_loss(net(xt), yt)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        if wrap:
            net.reducer.release()
    names = {id(p): n for n, p in m.named_parameters()}
    state = {names[id(p)]: {k: np.array(v) for k, v in s.items()}
             for p, s in opt.state.items()}
    return losses, {n: np.array(p.data) for n, p in m.named_parameters()}, state


_REFERENCE: dict = {}


def reference(opt_name, spatial):
    key = (opt_name, tuple(spatial))
    if key not in _REFERENCE:
        _REFERENCE[key] = train(opt_name, spatial, self_grid(), wrap=False)
    return _REFERENCE[key]


def _configs():
    """id -> (grid dims, spatial size, explicit sizes of x or None)."""
    n = SIZE
    if n == 1:
        return {"one": ((1, 1, 1, 1), (8, 8, 8), None)}
    out = {f"sample{n}": ((n, 1, 1, 1), (8, 8, 8), None),
           f"depth{n}": ((1, n, 1, 1), (8, 8, 8), None),
           f"height{n}": ((1, 1, n, 1), (8, 8, 8), None),
           f"depth{n}-uneven": ((1, n, 1, 1), (8, 8, 8),
                                (None, None, {2: (6, 2), 3: (1, 0, 7), 4: (3, 0, 4, 1)}[n],
                                 None, None)),
           f"depth{n}-tiny": ((1, n, 1, 1), (6, 8, 8), None)}
    if n == 4:
        out["depth2-height2"] = ((1, 2, 2, 1), (8, 8, 8), None)
        out["sample2-depth2"] = ((2, 2, 1, 1), (8, 8, 8), None)
        out["sample2-height2"] = ((2, 1, 2, 1), (8, 8, 8), None)
    return out


CONFIGS = _configs()


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("cid", sorted(CONFIGS))
@guarded
def test_steps_match_one_rank(cid, opt_name):
    dims, spatial, sizes = CONFIGS[cid]
    rlosses, rparams, rstate = reference(opt_name, spatial)
    losses, params, state = train(opt_name, spatial, grid(dims), sizes,
                                  overlap=opt_name == "sgd")
    what = f"{opt_name} on {dims} sizes={sizes}"
    close(losses, rlosses, f"{what}: losses per step", rtol=TOL, atol=0)
    initial = {n: p.data for n, p in model(spatial).named_parameters()}
    for name, rp in rparams.items():
        err = rel_err(params[name], rp)
        expect(err <= TOL, f"{what}: {name} after {STEPS} steps: relative error {err:.3g}")
        # the steps did something (a test of nothing would pass too)
        expect(rel_err(rp, initial[name]) > 1e-3, f"{what}: {name} barely moved")
    expect(sorted(state) == sorted(rstate), f"{what}: optimizer state for {sorted(state)}")
    for name, rs in rstate.items():
        for k, v in rs.items():
            got = state.get(name, {}).get(k)
            err = float("inf") if got is None else rel_err(got, v)
            expect(err <= TOL, f"{what}: optimizer state {k} of {name}: relative error "
                               f"{err:.3g}")
