"""Memory plans on real training: recompute (activation checkpoints) and offload (simulated on
CPU) give the plain model's losses, gradients, parameters and buffers (1e-10); the saved-state
accounting counts what a closure keeps alive; pack/unpack hooks restore the saved state; the
profile is the same on every rank and a budget below the minimum raises on every rank; and
recomputing lowers the peak memory a step really allocates (tracemalloc).
"""
from __future__ import annotations

import numpy as np
import pytest

import disttensor as dt
from disttensor.core.array import DistArray
from disttensor.autograd import Tensor, make_result
from disttensor.autograd.saved import (record_nodes, saved_arrays, saved_bytes,
                                       saved_tensors_hooks)
from disttensor.nn import (BatchNorm3d, Conv3d, DistributedDataParallel, Flatten, LeakyReLU,
                           Linear, MaxPool3d, Sequential, sequential_layers)
from disttensor.nn import functional as F
from disttensor.nn.memory import (MemoryPlan, apply_plan, checkpoint, measure_step_memory,
                                  min_peak, plan_memory, profile_memory)
from disttensor.nn.models import CosmoFlow
from disttensor.nn.optim import SGD

from checks import COMM, SIZE, expect, grid, last_rank_only, mismatch
from gradchecks import close, guarded, rel_err, self_grid

N = 4
STEPS = 3
TOL = 1e-10


def cosmoflow(dropout=0.0):
    return CosmoFlow(input_size=8, in_channels=2, widths=(3, 4), dense=(5,), outputs=3,
                     dropout=dropout, dtype="float64", rng=np.random.default_rng(1))


def bn_net():
    rng = np.random.default_rng(2)
    kw = dict(dtype="float64", rng=rng)
    return Sequential(Conv3d(2, 3, 3, padding=1, **kw), BatchNorm3d(3, dtype="float64"),
                      LeakyReLU(0.1), MaxPool3d(2), Conv3d(3, 4, 3, padding=1, **kw),
                      BatchNorm3d(4, dtype="float64"), LeakyReLU(0.1), MaxPool3d(2), Flatten(),
                      Linear(4 * 2 * 2 * 2, 3, **kw))


def _configs():
    if SIZE == 1:
        return {"one": (1, 1, 1, 1)}
    out = {f"sample{SIZE}": (SIZE, 1, 1, 1), f"depth{SIZE}": (1, SIZE, 1, 1)}
    if SIZE == 4:
        out["sample2-depth2"] = (2, 2, 1, 1)
    return out


CONFIGS = _configs()

# plans over CosmoFlow(dropout) layers: conv lrelu pool conv lrelu pool | flatten linear
# lrelu dropout linear tanh
COSMO_PLANS = {
    "stages": MemoryPlan(("recompute",) * 12, segments=[(0, 3), (3, 6), (6, 12)]),
    "mixed": MemoryPlan(("keep", "recompute", "recompute", "recompute", "offload", "keep",
                         "offload", "recompute", "recompute", "recompute", "keep",
                         "offload")),
    "offload": MemoryPlan(("offload",) * 12),
    "one-checkpoint": MemoryPlan(("recompute",) * 12),
}
BN_PLANS = {
    "stages": MemoryPlan(("recompute",) * 10, segments=[(0, 4), (4, 8), (8, 10)]),
    "mixed": MemoryPlan(("keep", "recompute", "recompute", "offload", "recompute", "keep",
                         "recompute", "recompute", "keep", "offload")),
}


def batches(spatial=(8, 8, 8)):
    rng = np.random.default_rng(123)
    return [(rng.standard_normal((N, 2, *spatial)), rng.standard_normal((N, 3)) * 0.5)
            for _ in range(STEPS)]


def train(make, g, plan=None, ddp=False, copy_host=False):
    """``STEPS`` SGD steps; the losses, the gradients of the last step, the parameters and
    buffers after the steps, and the simulated offload bytes of the last forward."""
    m = make()
    net = apply_plan(m, plan, copy_host=copy_host) if plan is not None else m
    top = DistributedDataParallel(net, g, bucket_bytes=512) if ddp else net
    opt = SGD(list(m.parameters()), lr=0.05, momentum=0.9)
    losses = []
    try:
        for x, y in batches():
            xt = Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)))
            yt = Tensor(dt.from_global(y, grid=g, split=(0, None)))
            opt.zero_grad()
            loss = F.mse_loss(top(xt), yt)
            loss.backward()
            grads = {n: np.array(p.grad) for n, p in m.named_parameters()}
            opt.step()
            losses.append(loss.item())
    finally:
        if ddp:
            top.reducer.release()
    params = {n: np.array(p.data) for n, p in m.named_parameters()}
    buffers = {n: np.array(b) for n, b in m.named_buffers()}
    stats = getattr(net, "offload_stats", {})
    return losses, grads, params, buffers, stats


def compare(got, want, what):
    losses, grads, params, buffers, _ = got
    rlosses, rgrads, rparams, rbuffers, _ = want
    close(losses, rlosses, f"{what}: losses", rtol=TOL, atol=0)
    for name, rg in rgrads.items():
        err = rel_err(grads[name], rg)
        expect(err <= TOL, f"{what}: gradient of {name}: relative error {err:.3g}")
        if name.endswith("weight"):  # (a conv bias before batch norm has none)
            expect(rel_err(rg, 0 * rg) > 1e-3, f"{what}: gradient of {name} is zero")
    for name, rp in rparams.items():
        err = rel_err(params[name], rp)
        expect(err <= TOL, f"{what}: {name} after {STEPS} steps: relative error {err:.3g}")
    expect(sorted(buffers) == sorted(rbuffers), f"{what}: buffers {sorted(buffers)}")
    for name, rb in rbuffers.items():
        err = rel_err(buffers[name], rb)
        expect(err <= TOL, f"{what}: buffer {name}: relative error {err:.3g} "
                           f"({buffers[name]!r} vs {rb!r})")


_PLAIN: dict = {}


def plain(kind, cid):
    key = (kind, cid)
    if key not in _PLAIN:
        make = (lambda: cosmoflow(0.3)) if kind == "cosmo" else bn_net
        _PLAIN[key] = train(make, grid(CONFIGS[cid]))
    return _PLAIN[key]


@pytest.mark.parametrize("pid", sorted(COSMO_PLANS))
@pytest.mark.parametrize("cid", sorted(CONFIGS))
@guarded
def test_cosmoflow_plans_match_plain(cid, pid):
    """CosmoFlow with dropout (the mask must replay identically when recomputed)."""
    g = grid(CONFIGS[cid])
    got = train(lambda: cosmoflow(0.3), g, COSMO_PLANS[pid])
    compare(got, plain("cosmo", cid), f"{pid} on {CONFIGS[cid]}")
    plan = COSMO_PLANS[pid]
    if "offload" in plan.choices:
        expect(got[4]["simulated_bytes"] > 0, f"{pid}: no simulated offload counted")
    # the dropout counter moved once per step, as in the plain model
    expect(int(got[3]["head.3.rng_counter"]) == STEPS, f"{pid}: dropout counter "
                                                       f"{got[3]['head.3.rng_counter']}")


@pytest.mark.parametrize("pid", ["mixed", "offload"])
@pytest.mark.parametrize("cid", sorted(CONFIGS))
@guarded
def test_offload_moves_and_restores(cid, pid):
    """The offload path proper on CPU (``copy_host``: saved NumPy blocks are copied out, the
    closures' references replaced, and put back before backward): same training."""
    g = grid(CONFIGS[cid])
    got = train(lambda: cosmoflow(0.3), g, COSMO_PLANS[pid], copy_host=True)
    compare(got, plain("cosmo", cid), f"copied offload {pid} on {CONFIGS[cid]}")
    expect(got[4]["offloaded_bytes"] > 0 and got[4]["simulated_bytes"] == 0,
           f"{pid}: offload stats {got[4]}")
    # after the forward, an offloaded layer's nodes hold no arrays
    m = cosmoflow()
    layers = sequential_layers(m)
    x, y = _xy(g, 8, 2)
    pm = apply_plan(layers, MemoryPlan(("offload",) * len(layers)), copy_host=True)
    with record_nodes() as nodes:
        out = pm(x)
    params = {id(p.data) for p in m.parameters()}
    expect(saved_bytes(nodes, exclude=params) == 0, "offloaded arrays still referenced")
    loss = F.mse_loss(out, y)
    loss.backward()
    want = {n: np.array(p.grad) for n, p in m.named_parameters()}
    m.zero_grad()
    F.mse_loss(m(x), y).backward()
    for n, p in m.named_parameters():
        expect(rel_err(want[n], p.grad) <= TOL, f"gradient of {n} after offload")


@pytest.mark.parametrize("pid", sorted(BN_PLANS))
@pytest.mark.parametrize("cid", sorted(CONFIGS))
@guarded
def test_batchnorm_stats_updated_once(cid, pid):
    """Recomputing batch norm must not update the running statistics a second time."""
    got = train(bn_net, grid(CONFIGS[cid]), BN_PLANS[pid])
    want = plain("bn", cid)
    compare(got, want, f"bn {pid} on {CONFIGS[cid]}")
    expect(int(got[3]["1.num_batches_tracked"]) == STEPS, "batches tracked counted twice")


@pytest.mark.parametrize("cid", sorted(CONFIGS))
@guarded
def test_checkpoint_under_data_parallel(cid):
    """Checkpoints inside DistributedDataParallel: parameter gradients come out of the
    recomputation's backward as shares into the buckets."""
    g = grid(CONFIGS[cid])
    got = train(lambda: cosmoflow(0.3), g, COSMO_PLANS["stages"], ddp=True)
    compare(got, plain("cosmo", cid), f"ddp stages on {CONFIGS[cid]}")


@guarded
def test_checkpoint_matches_one_rank_reference():
    """The planned model on the world's grid equals the plain model on one rank."""
    dims = list(CONFIGS.values())[-1]
    got = train(lambda: cosmoflow(0.3), grid(dims), COSMO_PLANS["mixed"])
    want = train(lambda: cosmoflow(0.3), self_grid())
    compare(got, want, f"mixed on {dims} vs one rank")


@guarded
def test_checkpoint_of_input_gradient():
    """checkpoint passes the gradient of its input on (a checkpoint in the middle)."""
    g = grid(list(CONFIGS.values())[-1])
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N, 2, 8, 8, 8))
    m = cosmoflow()
    feats, head = m.features, m.head
    outs = []
    for use in (False, True):
        xt = Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)), requires_grad=True)
        h = checkpoint(feats, xt) if use else feats(xt)
        loss = F.mse_loss(head(h), Tensor(dt.from_global(np.ones((N, 3)), grid=g,
                                                         split=(0, None))))
        m.zero_grad()
        loss.backward()
        outs.append((loss.item(), xt.grad.to_numpy(), np.array(feats[0].weight.grad)))
    close(outs[1][0], outs[0][0], "loss", rtol=TOL, atol=0)
    expect(rel_err(outs[1][1], outs[0][1]) <= TOL, "input gradient through a checkpoint")
    expect(rel_err(outs[1][2], outs[0][2]) <= TOL, "weight gradient through a checkpoint")


@guarded
def test_saved_bytes_accounting():
    """The bytes a closure keeps alive: a view counts as its whole buffer, a shared buffer
    once, a DistArray as its buffer (halo included), excluded arrays not at all; pack/unpack
    hooks move the saved arrays and put them back before backward."""
    g = grid(list(CONFIGS.values())[-1])
    x = dt.from_global(np.arange(N * 6.0).reshape(N, 6), grid=g, split=(0, None))
    big = np.ones((10, 10))                       # 800 bytes, kept through a view
    other = np.ones(5, dtype=np.float32)          # 20 bytes
    param = np.ones(7)                            # excluded
    saved = {"view": big[2:4], "again": big, "pair": (other, param), "x": x}

    def backward(gr):
        s = saved
        return (DistArray(gr.local * s["view"].sum() / 40.0, gr.distribution, gr.grid),)
    t = Tensor(x, requires_grad=True)
    with record_nodes() as nodes:
        y = make_result(x, (t,), backward, "test")
    expect(len(nodes) == 1 and nodes[0] is y.node, "record_nodes missed the node")
    want = 800 + 20 + x.buffer.nbytes
    got = saved_bytes(nodes, exclude={id(param)})
    expect(got == want, f"saved bytes {got}, expected {want}")
    expect(len(saved_arrays(nodes, exclude={id(param)})) == 3, "distinct arrays")
    expect(saved_bytes(nodes) == want + 56, "parameter counted when not excluded")
    seen: set = set()
    saved_bytes(nodes, seen=seen)
    expect(saved_bytes(nodes, seen=seen) == 0, "shared allocations counted twice")

    # pack to copies (and drop the originals' references), unpack back
    packed, unpacked = [], []

    def pack(a):
        packed.append(a.nbytes)
        return ("host", a.copy())

    def unpack(p):
        unpacked.append(p[1].nbytes)
        return p[1]
    t2 = Tensor(x, requires_grad=True)
    with saved_tensors_hooks(pack, unpack, exclude={id(param)}):
        y2 = make_result(x, (t2,), backward, "test")
    expect(saved_bytes([y2.node], exclude={id(param)}) == 0,
           "packed arrays still reachable from the closure")
    y2.backward(dt.from_global(np.ones((N, 6)), grid=g, split=(0, None)))
    expect(sorted(packed) == sorted(unpacked) and len(packed) == 4,
           f"pack {packed} / unpack {unpacked}")
    expect(rel_err(t2.grad.to_numpy(), np.full((N, 6), 0.5)) == 0, "values after unpack")


def _xy(g, size, channels, n=N):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((n, channels, size, size, size))
    y = rng.standard_normal((n, 3)) * 0.5
    return (Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3))),
            Tensor(dt.from_global(y, grid=g, split=(0, None))))


@pytest.mark.parametrize("cid", sorted(CONFIGS))
@guarded
def test_profile_agrees_and_budget_errors_are_collective(cid):
    g = grid(CONFIGS[cid])
    m = cosmoflow()
    layers = sequential_layers(m)
    x, y = _xy(g, 8, 2)
    w0 = np.array(layers[0].weight.data)
    prof = profile_memory(layers, x, y, F.mse_loss)
    expect(all(p.grad is None for p in m.parameters()), "profile left gradients")
    expect(np.array_equal(w0, layers[0].weight.data), "profile changed a weight")
    figures = [(lp.saved_bytes, lp.input_bytes, lp.forward_time, lp.backward_time)
               for lp in prof.layers]
    every = COMM.allgather(figures)
    expect(all(f == figures for f in every), "profiles differ between ranks")
    expect(prof.layers[0].saved_bytes > 0 and prof.keep_all_peak > 0, "nothing saved")
    expect(prof.bandwidth_assumed and "assumed" in prof.report(), "CPU bandwidth not assumed")
    least = max(lp.saved_bytes for lp in prof.layers)
    with pytest.raises(ValueError, match="below the smallest peak"):
        plan_memory(prof, least - 1, comm=g.cart)
    plan = plan_memory(prof, least, comm=g.cart)
    expect(plan.peak <= least, f"plan peak {plan.peak} over budget {least}")
    if SIZE > 1:
        with mismatch("plan_memory", "budget_bytes"):
            plan_memory(prof, last_rank_only(least + 1, least), comm=g.cart)
    # the planned model still trains like the plain one (one step)
    pm = apply_plan(layers, plan)
    l1 = F.mse_loss(pm(x), y)
    l0 = F.mse_loss(m(x), y)
    close([l1.item()], [l0.item()], "planned loss", rtol=TOL, atol=0)


def test_recompute_lowers_tracked_peak():
    """Per rank on a one-rank grid: a 16^3 CosmoFlow step whose stages hold activations of
    equal size (channels x8 per pooling) allocates strictly less at its peak under stage
    checkpoints than keeping everything, and so does the planner's plan at the least budget
    it accepts without offload (offload is only simulated on CPU).  (With MLPerf's widths the
    first stage dominates the peak and recompute barely helps: see bench/memory_plan_bench.py.)"""
    g = self_grid()
    model = CosmoFlow(input_size=16, in_channels=2, widths=(2, 16, 128), dense=(8,),
                      outputs=3, dtype="float64", rng=np.random.default_rng(3))
    layers = sequential_layers(model)
    x, y = _xy(g, 16, 2, n=2)
    n = len(layers)

    def step(net):
        def run():
            loss = F.mse_loss(net(x), y)
            loss.backward()
        return run
    step(model)()  # warm up (compilation, caches)
    keep = measure_step_memory(step(model))
    stages = MemoryPlan(("recompute",) * n, segments=[(0, 3), (3, 6), (6, n)])
    rec = measure_step_memory(step(apply_plan(layers, stages)))
    prof = profile_memory(layers, x, y, F.mse_loss)
    budget = min_peak(prof, allow_offload=False)
    plan = plan_memory(prof, budget, allow_offload=False)
    planned = measure_step_memory(step(apply_plan(layers, plan)))
    print(f"\n[memory] 16^3 CosmoFlow widths (2, 16, 128), tracked peak: keep-all "
          f"{keep / 1e6:.2f} MB, stage checkpoints {rec / 1e6:.2f} MB ({rec / keep:.2f}x), "
          f"plan at {budget / prof.keep_all_peak:.0%} of the saved bytes {planned / 1e6:.2f} MB "
          f"({planned / keep:.2f}x; predicted saved peak {plan.peak / 1e6:.2f} MB of "
          f"{prof.keep_all_peak / 1e6:.2f})")
    assert budget < prof.keep_all_peak and "recompute" in plan.choices
    assert rec < keep, (rec, keep)
    assert planned < keep, (planned, keep, plan.report())
