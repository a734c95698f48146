"""Pipeline partitioning on process grids: profiles agree on every rank, profiling leaves the
model as it was, automatic partitions are identical on every rank and cover the model (the
stages applied one after another give the one-rank model's output), bad arguments raise on
every rank; and VGG3D (the parameter-heavy bench model) against itself on one rank.

Samples are split over the depth axis of a ``(1, SIZE, 1, 1)`` grid (halos inside the
profiled layers); the references run on a one-rank grid over ``COMM_SELF``.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor.autograd import Tensor, no_grad
from disttensor.nn import Linear, sequential_layers
from disttensor.nn import functional as F
from disttensor.nn.models import CosmoFlow, VGG3D
from disttensor.nn.partition import auto_partition, partition_layers, profile_layers

from checks import COMM, SIZE, expect, grid, mismatch
from conftest import assert_raises_all
from gradchecks import close, guarded, rel_err, self_grid

TOL = 1e-10


def cosmoflow(seed=1):
    return CosmoFlow(input_size=8, in_channels=2, widths=(3, 4), dense=(5,), outputs=3,
                     dtype="float64", rng=np.random.default_rng(seed))


def vgg(seed=1, batch_norm=True, dropout=0.25):
    return VGG3D(input_size=8, in_channels=2, widths=(2, 3), convs_per_stage=(2, 1),
                 dense=(16, 8), outputs=3, dropout=dropout, batch_norm=batch_norm,
                 dtype="float64", rng=np.random.default_rng(seed))


MODELS = {"cosmoflow": cosmoflow, "vgg3d": vgg}


def sample(n=2, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 2, 8, 8, 8))


def on(g, x):
    return dt.from_global(x, grid=g, split=(0, None, 1, 2, 3))


def run_layers(layers, ranges, x):
    """Apply the stages one after another (no grad); the output as a global array."""
    with no_grad():
        t = Tensor(x)
        for a, b in ranges:
            for layer in layers[a:b]:
                t = layer(t)
    return t.numpy()


def snapshot(m):
    return ({n: np.array(b) for n, b in m.named_buffers()},
            {n: (None if p.grad is None else np.array(p.grad)) for n, p in m.named_parameters()})


@pytest.mark.parametrize("name", sorted(MODELS))
@guarded
def test_profiles_agree_and_leave_the_model_alone(name):
    m = MODELS[name]()
    layers = sequential_layers(m)
    first = next(iter(m.parameters()))
    first.grad = np.full(first.shape, 0.5)     # a gradient accumulated before: kept
    before = snapshot(m)
    x = on(grid((1, SIZE, 1, 1)), sample())
    prof = profile_layers(layers, x, repeats=2)
    everyone = COMM.allgather(prof)
    expect(all(p == prof for p in everyone), f"{name}: profiles differ between ranks")
    expect(len(prof) == len(layers), f"{name}: {len(prof)} profiles for {len(layers)} layers")
    expect(all(p.forward_s > 0 and p.backward_s > 0 for p in prof), f"{name}: zero times")
    # profiling changed nothing: buffers (batch-norm statistics, dropout counters), gradients
    bufs, grads = snapshot(m)
    for n, b in before[0].items():
        expect(np.array_equal(bufs[n], b), f"{name}: buffer {n} changed by profiling")
    for n, g in before[1].items():
        same = (g is None and grads[n] is None) or (
            g is not None and grads[n] is not None and np.array_equal(g, grads[n]))
        expect(same, f"{name}: gradient of {n} changed by profiling")
    # byte counts: parameters, and the largest output block of the layers run on the grid
    # (inference mode: leaves the running statistics alone)
    m.eval()
    with no_grad():
        t = Tensor(x)
        for i, layer in enumerate(layers):
            inb = t.data.local.nbytes
            t = layer(t)
            outb = COMM.allreduce(t.data.local.nbytes, op=MPI.MAX)
            inb = COMM.allreduce(inb, op=MPI.MAX)
            pb = sum(p.data.nbytes for p in layer.parameters())
            expect(prof[i].param_bytes == pb, f"{name} layer {i}: param bytes")
            expect(prof[i].output_bytes == outb,
                   f"{name} layer {i}: output bytes {prof[i].output_bytes} != {outb}")
            expect(prof[i].activation_bytes <= inb + outb and
                   prof[i].activation_bytes >= outb, f"{name} layer {i}: activation bytes")
    # and the model still computes what a fresh one does (inference uses the running stats)
    ref = MODELS[name]().eval()
    with no_grad():
        want = ref(Tensor(on(self_grid(), sample()))).numpy()
        got = m(Tensor(x)).numpy()
    expect(rel_err(got, want) <= TOL, f"{name}: output after profiling differs")


@pytest.mark.parametrize("name", sorted(MODELS))
@guarded
def test_auto_partition_same_on_every_rank_and_covers_the_model(name):
    m = MODELS[name]()
    m.eval()       # compare stage outputs with inference (dropout off, running statistics)
    layers = sequential_layers(m)
    x = on(grid((1, SIZE, 1, 1)), sample())
    ref = MODELS[name]().eval()
    with no_grad():
        want = ref(Tensor(on(self_grid(), sample()))).numpy()
    for stages, schedule in [(1, "gpipe"), (2, "1f1b"), (3, "gpipe"), (len(layers), "1f1b")]:
        ranges = auto_partition(layers, stages, x, chunks=2, schedule=schedule, comm=COMM)
        everyone = COMM.allgather(ranges)
        expect(all(r == ranges for r in everyone), f"{name}: partitions differ: {everyone}")
        expect(len(ranges) == stages and ranges[0][0] == 0 and ranges[-1][1] == len(layers)
               and all(a < b for a, b in ranges)
               and all(ranges[k][1] == ranges[k + 1][0] for k in range(stages - 1)),
               f"{name}: {ranges} is not a cover of {len(layers)} layers by {stages} stages")
        got = run_layers(layers, ranges, x)
        expect(rel_err(got, want) <= TOL, f"{name} {ranges}: stages' output differs")
    # a NumPy sample: every rank profiles alone, the maximum over COMM agrees the partition
    r = auto_partition(layers, 2, sample(1), chunks=4, comm=COMM)
    everyone = COMM.allgather(r)
    expect(all(e == r for e in everyone), f"{name}: NumPy-sample partitions differ")


@guarded
def test_memory_limit_respected_with_measured_profiles():
    m = vgg(batch_norm=False, dropout=0.0)
    layers = sequential_layers(m)
    x = on(grid((1, SIZE, 1, 1)), sample())
    prof = profile_layers(layers, x, repeats=1, warmup=0)
    free = partition_layers(prof, 3, 4)
    # the dense layers hold nearly all parameters: a limit below the unconstrained plan's
    # largest stage forces another split, which must meet it
    least = None
    try:
        partition_layers(prof, 3, 4, memory_limit=0)
    except ValueError as e:
        least = float(str(e).split("smallest feasible limit is ")[1].split(" bytes")[0])
    expect(least is not None and least > 0, "no smallest feasible limit named")
    plan = partition_layers(prof, 3, 4, memory_limit=least * 1.0000001)
    expect(max(plan.stage_memory) <= least * 1.0000001, f"limit not met: {plan.report()}")
    expect(max(plan.stage_times) >= max(free.stage_times) - 1e-15,
           "a constrained plan beat the unconstrained optimum")


@guarded
def test_bad_arguments_raise_on_every_rank():
    layers = sequential_layers(cosmoflow())
    x = on(grid((1, SIZE, 1, 1)), sample())
    n = len(layers)
    assert_raises_all(COMM, ValueError, f"{n + 1} stages for {n} layers",
                      lambda: auto_partition(layers, n + 1, x, chunks=2, comm=COMM))
    assert_raises_all(COMM, ValueError, "stages must be an integer >= 1",
                      lambda: auto_partition(layers, 0, x, chunks=2, comm=COMM))
    assert_raises_all(COMM, ValueError, "chunks must be an integer >= 1",
                      lambda: auto_partition(layers, 2, x, chunks=0, comm=COMM))
    assert_raises_all(COMM, ValueError, "schedule must be one of",
                      lambda: auto_partition(layers, 2, x, chunks=2, schedule="x", comm=COMM))
    assert_raises_all(COMM, ValueError, "smallest feasible limit is",
                      lambda: auto_partition(layers, 2, x, chunks=2, memory_limit=1,
                                             comm=COMM))
    assert_raises_all(COMM, ValueError, "no layers", lambda: profile_layers([], x))
    assert_raises_all(COMM, ValueError, "no sample and channel axes",
                      lambda: profile_layers(layers, np.zeros(3), comm=COMM))
    if SIZE > 1:
        with mismatch("auto_partition", "stages"):
            auto_partition(layers, 2 + (COMM.rank == SIZE - 1), x, chunks=2, comm=COMM)


@pytest.mark.parametrize("batch_norm", [False, True])
@guarded
def test_vgg3d_matches_one_rank(batch_norm):
    def step(g):
        m = vgg(batch_norm=batch_norm, dropout=0.0)
        y = np.random.default_rng(5).standard_normal((2, 3))
        loss = F.mse_loss(m(Tensor(on(g, sample()))),
                          Tensor(dt.from_global(y, grid=g, split=(0, None))))
        loss.backward()
        return loss.item(), {n: np.array(p.grad) for n, p in m.named_parameters()}
    want_loss, want = step(self_grid())
    got_loss, got = step(grid((1, SIZE, 1, 1)))
    close(got_loss, want_loss, "VGG3D loss", rtol=TOL, atol=0)
    for n, g in want.items():
        expect(rel_err(got[n], g) <= TOL, f"VGG3D gradient of {n}: {rel_err(got[n], g):.3g}")


@guarded
def test_vgg3d_layout():
    m = VGG3D(input_size=16, in_channels=1, widths=(4, 8), convs_per_stage=(1, 2),
              dense=(256, 256), outputs=4, dtype="float64", rng=np.random.default_rng(0))
    layers = sequential_layers(m)
    # conv+relu per conv, a pool per stage, flatten, (linear+relu) per dense, last linear
    expect(len(layers) == 2 * 3 + 2 + 1 + 2 * 2 + 1, f"{len(layers)} layers")
    dense = sum(p.data.size for layer in layers if isinstance(layer, Linear)
                for p in layer.parameters())
    expect(dense > 0.9 * m.num_parameters(), f"dense layers hold {dense} of "
                                             f"{m.num_parameters()} parameters")
    expect(layers[-1].weight.shape == (4, 256) and layers[-5].weight.shape == (256, 512),
           "dense shapes")
    for kwargs, match in [(dict(input_size=3, widths=(2, 2), convs_per_stage=1), "too small"),
                          (dict(widths=(2, 2), convs_per_stage=(1,)), "one count")]:
        with pytest.raises(ValueError, match=match):
            VGG3D(**kwargs)
