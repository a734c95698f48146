"""The weight update inside backward (:class:`disttensor.nn.BackwardUpdate`) on real
distributed gradients: 10 steps of a small float64 CosmoFlow (the model and batches of
test_nn_train_step.py) with the update inside backward give

* bit for bit the losses, final parameters and optimizer state of 10 ordinary steps
  (``zero_grad(); backward(); step()``) on the same grid, with
  :class:`~disttensor.nn.DistributedDataParallel` (small buckets, overlap on and off), for
  SGD (momentum, weight decay, Nesterov) and Adam/AdamW;
* the same to 1e-10 as the ordinary steps on one rank (``MPI.COMM_SELF``), so the result is
  the serial one;
* the same without a reducer (each leaf's gradient-ready hook updates it), on one rank and
  on a spatial grid where the ops sum each gradient themselves;
* the same with gradient accumulation over two micro-batch passes (``reducer.accumulate``,
  as the pipeline uses it): one update per step, with the summed gradient;

and that ``.grad`` is ``None`` after every step (no gradient kept), every parameter is
updated once per step, buckets are updated during backward (not only at its end), and the
options that need every gradient first (clipping by global norm, AMP loss scaling) raise on
every rank.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor.autograd import Tensor
from disttensor.nn import BackwardUpdate, DistributedDataParallel
from disttensor.nn import functional as F
from disttensor.nn.amp import GradScaler
from disttensor.nn.models import CosmoFlow
from disttensor.nn.optim import SGD, Adam, AdamW, NAdam

from checks import COMM, SIZE, expect, grid, last_rank_only, mismatch
from conftest import assert_raises_all
from gradchecks import close, guarded, rel_err, self_grid

N = 4
STEPS = 10
TOL = 1e-10

OPTIMIZERS = {
    "sgd": lambda params: SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda params: Adam(params, lr=0.01, betas=(0.9, 0.99), weight_decay=1e-3),
    "nesterov": lambda params: SGD(params, lr=0.05, momentum=0.8, weight_decay=1e-3,
                                   nesterov=True),
    "adamw": lambda params: AdamW(params, lr=0.01, weight_decay=1e-2, amsgrad=True),
    "nadam": lambda params: NAdam(params, lr=0.01, weight_decay=1e-2,
                                  decoupled_weight_decay=True),
}


def model(input_size=8):
    return CosmoFlow(input_size=input_size, in_channels=2, widths=(3, 4), dense=(5,),
                     outputs=3, dtype="float64", rng=np.random.default_rng(1))


def batches(spatial=(8, 8, 8)):
    rng = np.random.default_rng(123)
    return [(rng.standard_normal((N, 2, *spatial)), rng.standard_normal((N, 3)) * 0.5)
            for _ in range(STEPS)]


def train(opt_name, g, *, ddp=True, in_backward=False, overlap=True, passes=1, comm=None):
    """``STEPS`` steps on grid ``g``; returns ``(losses, params, state, info)``.

    ``ddp``: wrap the model in DistributedDataParallel (bucket_bytes=512); ``in_backward``:
    update with BackwardUpdate (the loop then calls no ``step``); ``passes``: micro-batch
    backward passes per step (``reducer.accumulate(passes)``, each over ``N / passes``
    samples with the loss scaled by ``1 / passes``)."""
    m = model()
    net = DistributedDataParallel(m, g, bucket_bytes=512, overlap=overlap) if ddp else m
    if passes > 1:
        net.reducer.accumulate(passes)
    opt = OPTIMIZERS[opt_name](list(m.parameters()))
    upd = BackwardUpdate(opt, net if ddp else None, comm=comm) if in_backward else None
    info = {"grads_kept": 0, "updates": [], "in_pass": 0}
    if ddp and in_backward:
        def during(params, grads):  # finish() disarms the reducer before delivering the rest
            info["in_pass"] += net.reducer.armed
        net.reducer.on_bucket_done(during)
    losses = []
    b = N // passes
    try:
        for x, y in batches():
            if not in_backward:
                opt.zero_grad()
            before = upd.updates if upd else 0
            total = 0.0
            for j in range(passes):
                xt = Tensor(dt.from_global(x[j * b:(j + 1) * b], grid=g,
                                           split=(0, None, 1, 2, 3)))
                yt = Tensor(dt.from_global(y[j * b:(j + 1) * b], grid=g, split=(0, None)))
                loss = F.mse_loss(net(xt), yt)
                if passes > 1:
                    loss = loss * (1.0 / passes)
                loss.backward()
                total += loss.item()
            if in_backward:
                info["updates"].append(upd.updates - before)
                info["grads_kept"] += sum(p.grad is not None for p in m.parameters())
            else:
                opt.step()
            losses.append(total)
    finally:
        if ddp:
            net.reducer.release()
    names = {id(p): n for n, p in m.named_parameters()}
    state = {names[id(p)]: {k: np.array(v) for k, v in s.items()}
             for p, s in opt.state.items()}
    info["nparams"] = len(list(m.parameters()))
    info["nbuckets"] = len(net.reducer.buckets) if ddp else 0
    return losses, {n: np.array(p.data) for n, p in m.named_parameters()}, state, info


_CACHE: dict = {}


def reference(opt_name):
    """The ordinary steps on one rank (COMM_SELF), no reducer."""
    key = ("ref", opt_name)
    if key not in _CACHE:
        _CACHE[key] = train(opt_name, self_grid(), ddp=False)
    return _CACHE[key]


def compare(what, got, want, rtol):
    """Losses, parameters and optimizer state of two runs; ``rtol`` 0 means bit for bit."""
    losses, params, state, _ = got
    rlosses, rparams, rstate, _ = want
    if rtol == 0:
        expect(losses == rlosses, f"{what}: losses differ: {losses} vs {rlosses}")
    else:
        close(losses, rlosses, f"{what}: losses per step", rtol=rtol, atol=0)
    initial = {n: p.data for n, p in model().named_parameters()}
    for name, rp in rparams.items():
        if rtol == 0:
            expect(np.array_equal(params[name], rp), f"{what}: {name} not bit-identical "
                                                     f"(rel err {rel_err(params[name], rp):.3g})")
        else:
            err = rel_err(params[name], rp)
            expect(err <= rtol, f"{what}: {name} after {STEPS} steps: relative error {err:.3g}")
        expect(rel_err(rp, initial[name]) > 1e-3, f"{what}: {name} barely moved")
    expect(sorted(state) == sorted(rstate), f"{what}: optimizer state for {sorted(state)}")
    for name, rs in rstate.items():
        expect(sorted(state.get(name, {})) == sorted(rs),
               f"{what}: state entries of {name}: {sorted(state.get(name, {}))} vs {sorted(rs)}")
        for k, v in rs.items():
            got_v = state.get(name, {}).get(k)
            if got_v is None:
                expect(False, f"{what}: optimizer state {k} of {name} missing")
            elif rtol == 0:
                expect(np.array_equal(got_v, v), f"{what}: optimizer state {k} of {name} "
                                                 "not bit-identical")
            else:
                err = rel_err(got_v, v)
                expect(err <= rtol, f"{what}: optimizer state {k} of {name}: relative error "
                                    f"{err:.3g}")


def check_in_backward_info(what, info):
    expect(info["grads_kept"] == 0, f"{what}: {info['grads_kept']} .grad arrays kept after "
                                    "the steps (the update inside backward frees them)")
    expect(info["updates"] == [info["nparams"]] * STEPS,
           f"{what}: parameter updates per step {info['updates']}, expected "
           f"{info['nparams']} (each parameter once per step)")


def _configs():
    """id -> grid dims."""
    if SIZE == 1:
        return {"one": (1, 1, 1, 1)}
    out = {f"sample{SIZE}": (SIZE, 1, 1, 1), f"depth{SIZE}": (1, SIZE, 1, 1)}
    if SIZE == 4:
        out["sample2-depth2"] = (2, 2, 1, 1)
    return out


CONFIGS = _configs()
RUNS = [("sgd", True), ("sgd", False), ("adam", True), ("adam", False)]


@pytest.mark.parametrize("opt_name, overlap", RUNS)
@pytest.mark.parametrize("cid", sorted(CONFIGS))
@guarded
def test_ddp_in_backward_equals_ordinary_steps(cid, opt_name, overlap):
    g = grid(CONFIGS[cid])
    what = f"{opt_name} on {CONFIGS[cid]} overlap={overlap}"
    ordinary = train(opt_name, g, overlap=overlap)
    inback = train(opt_name, g, overlap=overlap, in_backward=True)
    compare(f"{what}: in-backward vs ordinary (same grid)", inback, ordinary, rtol=0)
    compare(f"{what}: in-backward vs one rank", inback, reference(opt_name), rtol=TOL)
    info = inback[3]
    check_in_backward_info(what, info)
    expect(info["nbuckets"] > 3, f"{what}: only {info['nbuckets']} buckets (test needs several)")
    if SIZE == 1 and overlap:
        # on one rank a started bucket is complete at once: all but those finish() starts
        # (parameters backward reaches last) are updated inside the pass
        expect(info["in_pass"] >= STEPS * (info["nbuckets"] - 1),
               f"{what}: only {info['in_pass']} bucket deliveries during backward")
    if not overlap:
        expect(info["in_pass"] == 0, f"{what}: buckets delivered before finish() without "
                                     "overlap")


@pytest.mark.parametrize("opt_name", ["nesterov", "adamw", "nadam"])
@guarded
def test_ddp_in_backward_other_optimizers(opt_name):
    dims = CONFIGS[sorted(CONFIGS)[-1]]
    g = grid(dims)
    what = f"{opt_name} on {dims}"
    ordinary = train(opt_name, g)
    inback = train(opt_name, g, in_backward=True)
    compare(f"{what}: in-backward vs ordinary", inback, ordinary, rtol=0)
    compare(f"{what}: in-backward vs one rank", inback, reference(opt_name), rtol=TOL)
    check_in_backward_info(what, inback[3])


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@guarded
def test_without_reducer_one_rank(opt_name):
    """No DDP: the leaves' gradient-ready hooks update (every rank alone on COMM_SELF)."""
    inback = train(opt_name, self_grid(), ddp=False, in_backward=True, comm=MPI.COMM_SELF)
    compare(f"{opt_name} no reducer, one rank", inback, reference(opt_name), rtol=0)
    check_in_backward_info(f"{opt_name} no reducer, one rank", inback[3])


@pytest.mark.skipif(SIZE == 1, reason="a spatial grid needs several ranks")
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@guarded
def test_without_reducer_spatial_grid(opt_name):
    """No DDP on a depth-split grid: the ops all-reduce each gradient, the hook sees it whole."""
    g = grid((1, SIZE, 1, 1))
    ordinary = train(opt_name, g, ddp=False)
    inback = train(opt_name, g, ddp=False, in_backward=True, comm=g.cart)
    what = f"{opt_name} no reducer on {g.dims}"
    compare(f"{what}: vs ordinary", inback, ordinary, rtol=0)
    compare(f"{what}: vs one rank", inback, reference(opt_name), rtol=TOL)
    check_in_backward_info(what, inback[3])


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@guarded
def test_accumulated_micro_batches(opt_name):
    """Two micro-batch passes per step (reducer.accumulate(2), as the pipeline runs them):
    one update per parameter and step, with the gradient of the whole batch."""
    g = grid((1, SIZE, 1, 1))
    ordinary = train(opt_name, g, passes=2)
    inback = train(opt_name, g, passes=2, in_backward=True)
    what = f"{opt_name} accumulate(2) on {g.dims}"
    compare(f"{what}: vs ordinary", inback, ordinary, rtol=0)
    compare(f"{what}: vs one rank, whole batches", inback, reference(opt_name), rtol=TOL)
    check_in_backward_info(what, inback[3])


def _net_and_opt(g):
    m = model()
    net = DistributedDataParallel(m, g, bucket_bytes=512)
    return m, net, SGD(list(m.parameters()), lr=0.1)


def test_incompatible_options_raise_on_every_rank():
    g = grid((SIZE, 1, 1, 1))
    m, net, opt = _net_and_opt(g)
    try:
        assert_raises_all(COMM, ValueError, r"clip_grad_norm=1\.0: gradient clipping by the "
                          "global norm needs every gradient",
                          lambda: BackwardUpdate(opt, net, clip_grad_norm=1.0))
        assert_raises_all(COMM, ValueError, "grad_scaler: AMP loss scaling",
                          lambda: BackwardUpdate(opt, net, grad_scaler=GradScaler()))
        # a disabled scaler is a pass-through: accepted
        upd = BackwardUpdate(opt, net, grad_scaler=GradScaler(enabled=False))
        # a second one on the same optimizer would update every parameter twice
        assert_raises_all(COMM, ValueError, "already updates inside backward",
                          lambda: BackwardUpdate(opt, net))
        upd.remove()
        BackwardUpdate(opt, net).remove()  # accepted once the first is removed
        assert_raises_all(COMM, TypeError, "needs a disttensor.nn.optim.Optimizer",
                          lambda: BackwardUpdate(object(), net))
        # the parameters are reduced by DDP's reducer: without it the hooks would see shares
        assert_raises_all(COMM, ValueError, "pass it as reducer=",
                          lambda: BackwardUpdate(opt, None, comm=g.cart))
        # an optimizer over parameters the reducer does not reduce
        other = SGD(list(model().parameters()), lr=0.1)
        assert_raises_all(COMM, ValueError, "are not reduced by the reducer",
                          lambda: BackwardUpdate(other, net))
    finally:
        net.reducer.release()


@pytest.mark.skipif(SIZE == 1, reason="a rank-dependent argument needs several ranks")
def test_clipping_on_one_rank_only_raises_everywhere():
    g = grid((SIZE, 1, 1, 1))
    m, net, opt = _net_and_opt(g)
    try:
        with mismatch("BackwardUpdate", "clip_grad_norm"):
            BackwardUpdate(opt, net, clip_grad_norm=last_rank_only(1.0, None))
    finally:
        net.reducer.release()


def test_remove_restores_the_ordinary_step():
    """After remove(), backward keeps gradients in .grad again and updates nothing."""
    g = grid((SIZE, 1, 1, 1))
    m, net, opt = _net_and_opt(g)
    try:
        upd = BackwardUpdate(opt, net)
        x, y = batches()[0]
        xt = Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)))
        yt = Tensor(dt.from_global(y, grid=g, split=(0, None)))
        F.mse_loss(net(xt), yt).backward()
        expect(upd.updates == len(list(m.parameters())), f"{upd.updates} updates")
        expect(all(p.grad is None for p in m.parameters()), ".grad kept with the update on")
        upd.remove()
        before = [np.array(p.data) for p in m.parameters()]
        F.mse_loss(net(xt), yt).backward()
        expect(all(p.grad is not None for p in m.parameters()), ".grad missing after remove")
        expect(all(np.array_equal(a, p.data) for a, p in zip(before, m.parameters())),
               "parameters changed by a backward after remove()")
    finally:
        net.reducer.release()
    from checks import settle
    settle()


def train_pipeline(opt_name, dims, schedule, in_backward):
    """``STEPS`` pipelined steps (2 micro-batches) on a ``(groups, stages, 1, 1, 1)`` grid;
    returns losses, this stage's parameters and optimizer state by name, and info."""
    from disttensor.nn import Pipeline
    m = model()
    pipe = Pipeline(m, grid(dims), chunks=2, schedule=schedule, bucket_bytes=512)
    params = list(pipe.parameters())
    opt = OPTIMIZERS[opt_name](params)
    upd = BackwardUpdate(opt, pipe) if in_backward else None
    info = {"grads_kept": 0, "updates": [], "nparams": len(params)}
    losses = []
    try:
        for x, y in batches():
            xt = dt.from_global(x, grid=pipe.stage_grid, split=(0, None, 1, 2, 3))
            yt = dt.from_global(y, grid=pipe.stage_grid, split=(0, None))
            before = upd.updates if upd else 0
            if not in_backward:
                opt.zero_grad()
            losses.append(pipe.train_step(xt, yt, F.mse_loss))
            if in_backward:
                info["updates"].append(upd.updates - before)
                info["grads_kept"] += sum(p.grad is not None for p in params)
            else:
                opt.step()
    finally:
        pipe.release()
    mine = {id(p) for p in params}
    names = {id(p): n for n, p in m.named_parameters()}
    state = {names[id(p)]: {k: np.array(v) for k, v in s.items()}
             for p, s in opt.state.items()}
    return (losses, {n: np.array(p.data) for n, p in m.named_parameters() if id(p) in mine},
            state, info)


@pytest.mark.skipif(SIZE not in (2, 4), reason="pipelines of 2 stages (x 1 or 2 groups)")
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@guarded
def test_pipeline_in_backward(opt_name, schedule):
    """With a Pipeline (its stage reducer accumulates the micro-batches and completes buckets
    in the last one), the update inside backward gives the ordinary pipelined steps bit for
    bit, and the one-rank unpipelined steps to 1e-10."""
    dims = (SIZE // 2, 2, 1, 1, 1)
    what = f"{opt_name} pipeline {dims} {schedule}"
    ordinary = train_pipeline(opt_name, dims, schedule, False)
    inback = train_pipeline(opt_name, dims, schedule, True)
    compare(f"{what}: in-backward vs ordinary", inback, ordinary, rtol=0)
    rlosses, rparams, rstate, rinfo = reference(opt_name)
    ref = (rlosses, {n: v for n, v in rparams.items() if n in inback[1]},
           {n: v for n, v in rstate.items() if n in inback[1]}, rinfo)
    compare(f"{what}: in-backward vs one rank", inback, ref, rtol=TOL)
    check_in_backward_info(what, inback[3])


def test_step_parameter_is_the_step_of_one_parameter():
    """Optimizer.step_parameter(p, grad) updates p exactly as step() does with p.grad = grad
    (its group's options, its state), leaves .grad alone, and refuses a foreign parameter."""
    from disttensor.nn import Parameter
    rng = np.random.default_rng(5)
    for make in (OPTIMIZERS["nesterov"], OPTIMIZERS["adamw"]):
        a = [Parameter(rng.standard_normal((3, 4))), Parameter(rng.standard_normal(5))]
        b = [Parameter(p.data.copy()) for p in a]
        oa = make([{"params": [a[0]]}, {"params": [a[1]], "lr": 0.2}])
        ob = make([{"params": [b[0]]}, {"params": [b[1]], "lr": 0.2}])
        for _ in range(3):
            grads = [rng.standard_normal(p.data.shape) for p in a]
            for p, g in zip(a, grads):
                p.grad = g
            oa.step()
            for p, g in reversed(list(zip(b, grads))):
                ob.step_parameter(p, g)
                assert p.grad is None
        for p, q in zip(a, b):
            assert np.array_equal(p.data, q.data)
        with pytest.raises(KeyError, match="in none of the optimizer's parameter groups"):
            ob.step_parameter(Parameter(np.zeros(2)), np.zeros(2))
