"""Training steps with op outputs from the host buffer pool (disttensor.core.buffer_pool:
every size pooled by size class, or, at the default threshold, every output of this small
model from the recycler of exact shapes) give bit-for-bit the losses and parameters of the
same steps without the pool, on one rank and on a depth split of all the ranks; an activation
output the user holds (a pooled array) keeps its values while later steps reuse the pool; the
losses follow a float64 one-rank reference of the same model (the pool adds nothing to the
arithmetic)."""
from __future__ import annotations

import numpy as np
import pytest

import disttensor as dt
from disttensor.autograd import Tensor
from disttensor.core import buffer_pool
from disttensor.nn import DistributedDataParallel
from disttensor.nn import functional as F
from disttensor.nn.models import CosmoFlow
from disttensor.nn.optim import Adam

from checks import SIZE, expect, grid
from gradchecks import guarded, self_grid

STEPS = 2


def train(g, pooled: bool, dtype="float32", hold=False, min_bytes=1):
    """``STEPS`` Adam steps; the losses, the final parameters and (``hold``) the first step's
    forward output as returned, with a copy taken at once."""
    m = CosmoFlow(input_size=8, in_channels=2, widths=(3, 4), dense=(5,), outputs=3,
                  dtype=dtype, rng=np.random.default_rng(1))
    net = DistributedDataParallel(m, g) if g.size > 1 else m
    opt = Adam(list(m.parameters()), lr=0.01)
    rng = np.random.default_rng(7)
    saved = (buffer_pool.POOL.enabled, buffer_pool.POOL.min_bytes)
    buffer_pool.POOL.enabled, buffer_pool.POOL.min_bytes = pooled, min_bytes
    losses, held = [], None
    try:
        for step in range(STEPS):
            x = rng.standard_normal((2, 2, 8, 8, 8)).astype(dtype)
            y = (rng.standard_normal((2, 3)) * 0.5).astype(dtype)
            xt = Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)))
            yt = Tensor(dt.from_global(y, grid=g, split=(0, None)))
            opt.zero_grad()
            out = net(xt)
            if hold and step == 0:      # an activation output (a pooled array), held
                act = F.leaky_relu(xt, 0.3)
                held = (act, act.data.to_numpy())
            loss = F.mse_loss(out, yt)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        buffer_pool.POOL.enabled, buffer_pool.POOL.min_bytes = saved
        if g.size > 1:
            net.reducer.release()
    return losses, [np.array(p.data) for p in m.parameters()], held


GRIDS = {"one": None, **({f"depth{SIZE}": (1, SIZE, 1, 1)} if SIZE > 1 else {})}


@pytest.mark.parametrize("route", ["classes", "recycler"])
@pytest.mark.parametrize("gid", sorted(GRIDS))
@guarded
def test_pool_steps_bit_identical(gid, route):
    g = self_grid() if GRIDS[gid] is None else grid(GRIDS[gid])
    hits = buffer_pool.POOL.hits
    buffer_pool.SMALL.clear()
    lp, pp, held = train(g, pooled=True, hold=True,
                         min_bytes=1 if route == "classes" else 1 << 30)
    if route == "classes":
        expect(buffer_pool.POOL.hits > hits, f"{gid}: the pool served no request")
    else:
        expect(buffer_pool.SMALL.held_bytes() > 0, f"{gid}: the recycler kept nothing")
    lo, po, _ = train(g, pooled=False)
    expect(lp == lo, f"{gid}: losses with the pool {lp} differ from without {lo}")
    for i, (a, b) in enumerate(zip(pp, po)):
        expect(a.tobytes() == b.tobytes(), f"{gid}: parameter {i} differs with the pool")
    act, copy = held
    expect(act.data.local.base is not None, f"{gid}: the activation is not a pooled array")
    expect(np.array_equal(act.data.to_numpy(), copy),
           f"{gid}: the held first-step activation changed during later steps")
    ref, _, _ = train(self_grid(), pooled=False, dtype="float64")
    expect(np.allclose(lp, ref, rtol=1e-4, atol=1e-6),
           f"{gid}: float32 losses {lp} far from the float64 reference {ref}")
