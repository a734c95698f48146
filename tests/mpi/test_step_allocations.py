"""A steady training step asks NumPy for (almost) no memory: a CosmoFlow step (convolutions,
LeakyReLU, max pooling, dense layers, MSE, Adam or SGD with momentum, through
DistributedDataParallel) on one rank, on a depth split and on a sample split of all the ranks
allocates fewer than 100 NumPy data buffers and 8 KiB in all (what remains: 0-d arrays of
loss and agreement scalars, and on a depth split the reverse halo exchange's output) (counted by
disttensor.testing.allocations; the same step allocated 360-430 buffers and 190-250 KiB before
outputs, gradients and update temporaries were reused), with losses that follow a float64
reference of the same model; the sums of a gradient the caller hands over
(comm.allreduce_owned, in place) equal allreduce's bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor.autograd import Tensor
from disttensor.core.comm import allreduce, allreduce_owned
from disttensor.nn import DistributedDataParallel
from disttensor.nn import functional as F
from disttensor.nn.models import CosmoFlow
from disttensor.nn.optim import SGD, Adam
from disttensor.testing.allocations import numpy_allocations

from checks import SIZE, expect, grid
from gradchecks import guarded, self_grid

COMM = MPI.COMM_WORLD
MAX_COUNT, MAX_BYTES = 100, 8192
# a multiple of 4 * SIZE: both max pools' windows stay inside the blocks of the depth split
# (a pooling whose windows straddle blocks still takes fresh halo buffers at every step)
EDGE = max(8, 4 * SIZE)
GRIDS = {"one": None, **({"depth": (1, SIZE, 1, 1), "samples": (SIZE, 1, 1, 1)}
                         if SIZE > 1 else {})}


def steps(g, opt_name: str, dtype="float32", n=4):
    """``n`` steps of a small CosmoFlow on ``g``; the losses and the NumPy allocations of the
    last step on this rank."""
    m = CosmoFlow(input_size=EDGE, in_channels=2, widths=(2, 2), dense=(16, 8), outputs=2,
                  dtype=dtype, rng=np.random.default_rng(3))
    net = DistributedDataParallel(m, g)
    opt = Adam(m.parameters(), lr=1e-3) if opt_name == "adam" else \
        SGD(m.parameters(), lr=1e-2, momentum=0.9)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 2, EDGE, EDGE, EDGE)).astype(dtype)
    y = (rng.standard_normal((4, 2)) * 0.5).astype(dtype)
    xt = Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)))
    yt = Tensor(dt.from_global(y, grid=g, split=(0, None)))
    losses = []
    try:
        for i in range(n):
            with numpy_allocations() as seen:
                loss = F.mse_loss(net(xt), yt)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                del loss
    finally:
        net.reducer.release()
    return losses, seen


@pytest.mark.parametrize("opt_name", ["adam", "sgd"])
@pytest.mark.parametrize("gid", sorted(GRIDS))
@guarded
def test_steady_step_allocates_almost_nothing(gid, opt_name):
    g = self_grid() if GRIDS[gid] is None else grid(GRIDS[gid])
    losses, seen = steps(g, opt_name)
    count = COMM.allreduce(seen.count, op=MPI.MAX)
    nbytes = COMM.allreduce(seen.nbytes, op=MPI.MAX)
    expect(count < MAX_COUNT and nbytes < MAX_BYTES,
           f"{gid}/{opt_name}: a steady step allocated {count} NumPy buffers, {nbytes} bytes")
    ref, _ = steps(self_grid(), opt_name, dtype="float64")
    expect(np.allclose(losses, ref, rtol=1e-4, atol=1e-6),
           f"{gid}/{opt_name}: losses {losses} far from the float64 reference {ref}")


def test_the_count_sees_a_step_that_allocates():
    """The counter is live here: the same step's first call (state, scratch, kept arrays made)
    allocates far more than the bound."""
    with numpy_allocations() as seen:
        steps(self_grid(), "adam", n=1)
    expect(seen.count > MAX_COUNT and seen.nbytes > MAX_BYTES, f"first step: {seen}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_allreduce_owned_matches_allreduce(dtype):
    rng = np.random.default_rng(COMM.rank + 11)
    a = (rng.standard_normal((37, 5)) * 10 ** rng.uniform(-3, 3, (37, 5))).astype(dtype)
    want = allreduce(COMM, a, "sum")
    mine = a.copy()
    got = allreduce_owned(COMM, mine, "sum")
    expect(got is mine, "the owned array is not reduced in place")
    expect(got.dtype == want.dtype and got.tobytes() == want.tobytes(),
           "allreduce_owned differs from allreduce")
    strided = a[:, ::2]                               # not contiguous: allreduce's path
    got = allreduce_owned(COMM, strided, "sum")
    expect(got.tobytes() == allreduce(COMM, a[:, ::2], "sum").tobytes(),
           "allreduce_owned of a strided array differs")
    ref = np.sum(COMM.allgather(a.astype(np.float64)), axis=0)
    expect(np.allclose(want, ref, rtol=1e-5 if dtype == np.float32 else 1e-12),
           "allreduce differs from the float64 sum")
