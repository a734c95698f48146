"""Pipeline parallelism with data parallelism across groups (:class:`disttensor.nn.Pipeline`).

A small float64 CosmoFlow trained ``STEPS`` steps of SGD (momentum, weight decay) through a
pipeline (GPipe and 1F1B, 1 to 4 stages, 1 or 2 groups, a spatial split inside the stages,
uneven partitions, 1, 2 and 4 micro-batches) gives, step by step, the same loss, and at the
end the same gradients (of the last step) and parameters of every stage (and, gathered by
``full_state_dict``, of the whole model on every rank), as the same steps of the unpipelined
model on one rank (``MPI.COMM_SELF``), to 1e-10 relative; also with ``partition="auto"``, with
the weight update inside backward, and with the batch layout changing between steps.  Batch
norm uses micro-batch statistics (checked against one rank taking the micro-batches in turn).
The gradient reducer's multi-pass accumulation is checked on its own: no bucket starts before
the last pass, and the sums equal those of the passes one by one.  Bad configurations raise
the same exception on every rank.
"""
from __future__ import annotations

import numpy as np
import pytest

import disttensor as dt
from disttensor.autograd import Tensor
from disttensor.nn import GradientReducer, Pipeline, Sequential
from disttensor.nn import functional as F
from disttensor.nn.layers import Linear
from disttensor.nn.models import CosmoFlow
from disttensor.nn.optim import SGD
from disttensor.nn.pipeline import check_partition

from checks import COMM, SIZE, expect, grid
from conftest import assert_all_ranks, assert_raises_all
from gradchecks import close, guarded, rel_err, self_grid

B = 8
STEPS = 20
TOL = 1e-10
NLAYERS = 11  # sequential_layers of the model below


def model():
    return CosmoFlow(input_size=8, in_channels=2, widths=(3, 4), dense=(5,), outputs=3,
                     dtype="float64", rng=np.random.default_rng(1))


def batches():
    rng = np.random.default_rng(123)
    return [(rng.standard_normal((B, 2, 8, 8, 8)), rng.standard_normal((B, 3)) * 0.5)
            for _ in range(STEPS)]


def optimizer(params):
    return SGD(list(params), lr=0.05, momentum=0.9, weight_decay=1e-3)


_REFERENCE = None


def reference():
    """Losses per step, last-step gradients and final parameters of the plain model."""
    global _REFERENCE
    if _REFERENCE is None:
        g = self_grid()
        m = model()
        opt = optimizer(m.parameters())
        losses = []
        for x, y in batches():
            opt.zero_grad()
            loss = F.mse_loss(m(Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)))),
                              Tensor(dt.from_global(y, grid=g, split=(0, None))))
            loss.backward()
            grads = {n: np.array(p.grad) for n, p in m.named_parameters()}
            opt.step()
            losses.append(loss.item())
        _REFERENCE = (losses, grads, {n: np.array(p.data) for n, p in m.named_parameters()})
    return _REFERENCE


def train(dims, chunks, schedule, partition, stage_axis=1):
    """``STEPS`` pipelined steps; losses, and this stage's last gradients and final
    parameters by name."""
    m = model()
    pipe = Pipeline(m, grid(dims), chunks=chunks, partition=partition, schedule=schedule,
                    stage_axis=stage_axis, bucket_bytes=256)
    try:
        opt = optimizer(pipe.parameters())
        sg = pipe.stage_grid
        losses = []
        for x, y in batches():
            # x only where stage 0 reads it, y only on the last stage
            xd = dt.from_global(x, grid=sg, split=(0, None, 1, 2, 3)) if pipe.stage == 0 \
                else None
            yd = dt.from_global(y, grid=sg, split=(0, None)) \
                if pipe.stage == pipe.stages - 1 else None
            opt.zero_grad()
            losses.append(pipe.train_step(xd, yd, F.mse_loss))
            mine = {id(p) for p in pipe.parameters()}
            grads = {n: np.array(p.grad) for n, p in m.named_parameters() if id(p) in mine}
            opt.step()
        params = {n: np.array(p.data) for n, p in m.named_parameters() if id(p) in mine}
        stats = pipe.last_stats
        full = pipe.full_state_dict()
    finally:
        pipe.release()
    return losses, grads, params, stats, pipe, full


def _configs():
    """id -> (grid dims, chunks, schedule, partition, stage_axis)."""
    n = SIZE
    if n == 1:
        return {"one-gpipe-c2": ((1, 1, 1, 1, 1), 2, "gpipe", "params", 1),
                "one-1f1b-c1": ((1, 1, 1, 1, 1), 1, "1f1b", [(0, NLAYERS)], 1)}
    if n == 2:
        return {"s2-gpipe-c2": ((1, 2, 1, 1, 1), 2, "gpipe", "params", 1),
                "s2-1f1b-c4": ((1, 2, 1, 1, 1), 4, "1f1b", [(0, 3), (3, NLAYERS)], 1),
                "s2-gpipe-c1": ((1, 2, 1, 1, 1), 1, "gpipe", [(0, 8), (8, NLAYERS)], 1)}
    if n == 3:
        return {"s3-uneven-1f1b-c4": ((1, 3, 1, 1, 1), 4, "1f1b", [(0, 1), (1, 7), (7, 11)], 1),
                "s3-uneven-gpipe-c2": ((1, 3, 1, 1, 1), 2, "gpipe", [(0, 5), (5, 9), (9, 11)],
                                       1)}
    return {"s4-1f1b-c4": ((1, 4, 1, 1, 1), 4, "1f1b", [(0, 3), (3, 6), (6, 8), (8, 11)], 1),
            "s4-1f1b-c2": ((1, 4, 1, 1, 1), 2, "1f1b", [(0, 1), (1, 4), (4, 8), (8, 11)], 1),
            "g2s2-gpipe-c2": ((2, 2, 1, 1, 1), 2, "gpipe", "params", 1),
            "g2s2-1f1b-c4": ((2, 2, 1, 1, 1), 4, "1f1b", [(0, 4), (4, 11)], 1),
            "s2d2-1f1b-c2": ((1, 2, 2, 1, 1), 2, "1f1b", [(0, 5), (5, 11)], 1),
            "s2g2-axis0-gpipe-c4": ((2, 2, 1, 1, 1), 4, "gpipe", [(0, 6), (6, 11)], 0)}


CONFIGS = _configs()


@pytest.mark.parametrize("cid", sorted(CONFIGS))
@guarded
def test_pipeline_matches_one_rank(cid):
    dims, chunks, schedule, partition, axis = CONFIGS[cid]
    rlosses, rgrads, rparams = reference()
    losses, grads, params, stats, pipe, full = train(dims, chunks, schedule, partition, axis)
    what = f"{cid} (stage {pipe.stage}, partition {pipe.partition})"
    close(losses, rlosses, f"{what}: losses per step", rtol=TOL, atol=0)
    # every parameter belongs to exactly one stage (the names over all ranks of a group)
    owned = COMM.allgather((pipe.grid.coords[:axis] + pipe.grid.coords[axis + 1:],
                            sorted(params)))
    first_line = [names for coords, names in owned if coords == owned[0][0]]
    every = sorted(n for names in first_line for n in names)
    expect(every == sorted(rparams), f"{what}: stage parameters over the stages {every} != "
                                     f"{sorted(rparams)}")
    initial = {n: p.data for n, p in model().named_parameters()}
    for name in params:
        err = rel_err(grads[name], rgrads[name])
        expect(err <= TOL, f"{what}: gradient of {name} at the last step: relative error "
                           f"{err:.3g}")
        err = rel_err(params[name], rparams[name])
        expect(err <= TOL, f"{what}: {name} after {STEPS} steps: relative error {err:.3g}")
        expect(rel_err(rparams[name], initial[name]) > 1e-3, f"{what}: {name} barely moved")
    # the whole trained model on every rank, each entry from the stage that trained it
    expect(sorted(full) == sorted(rparams), f"{what}: full_state_dict names {sorted(full)}")
    for name, rp in rparams.items():
        err = rel_err(full.get(name, np.zeros(0)), rp)
        expect(err <= TOL, f"{what}: full_state_dict {name}: relative error {err:.3g}")
    expect(set(stats) >= {"forward_s", "backward_s", "wait_s", "wall_s", "bubble"}
           and 0 <= stats["bubble"] <= 1 and stats["forward_s"] > 0,
           f"{what}: last_stats {stats}")


@guarded
def test_stage_grid_coordinates_and_neighbours():
    dims = {1: (1, 1, 1, 1, 1), 2: (1, 2, 1, 1, 1), 3: (1, 3, 1, 1, 1),
            4: (2, 2, 1, 1, 1)}[SIZE]
    g = grid(dims)
    pipe = Pipeline(model(), g, chunks=1, partition="params")
    try:
        expect(pipe.stage_grid.dims == dims[:1] + dims[2:], f"stage grid {pipe.stage_grid}")
        expect(pipe.stage_grid.coords == g.coords[:1] + g.coords[2:],
               f"stage grid coords {pipe.stage_grid.coords} vs grid coords {g.coords}")
        expect(pipe.stage == g.coords[1] == pipe._p2p.rank, "stage index")
        # the neighbour of the same other coordinates, one stage on
        line = pipe._p2p.allgather(g.coords[:1] + g.coords[2:])
        expect(all(c == line[0] for c in line), f"pipeline line {line}")
    finally:
        pipe.release()


@guarded
def test_forward_evaluates_the_whole_batch_on_the_last_stage():
    dims = {1: (1, 1, 1, 1, 1), 2: (1, 2, 1, 1, 1), 3: (1, 3, 1, 1, 1),
            4: (2, 2, 1, 1, 1)}[SIZE]
    x, _ = batches()[0]
    m = model()
    pipe = Pipeline(m, grid(dims), chunks=2, partition="params")
    try:
        xd = dt.from_global(x, grid=pipe.stage_grid, split=(0, None, 1, 2, 3)) \
            if pipe.stage == 0 else None
        out = pipe(xd)
        g = self_grid()
        want = model()(Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)))).numpy()
        if pipe.stage == pipe.stages - 1:
            expect(out is not None and rel_err(out.numpy(), want) <= TOL,
                   f"last stage output differs: {None if out is None else out.numpy()}")
        else:
            expect(out is None, "stages before the last return None")
    finally:
        pipe.release()


# -- the reducer's multi-pass accumulation ------------------------------------------------------
@guarded
def test_reducer_accumulates_passes_and_starts_buckets_in_the_last():
    """Three backward passes of different batches with ``accumulate(3)``: after the first
    two, no bucket has started and no ``.grad`` is set; after the third, ``.grad`` is the
    sum of the three passes' gradients (plain model on one rank, one pass at a time)."""
    g = grid((SIZE, 1, 1, 1))
    data = batches()[:3]
    ref = model()
    for x, y in data:  # .grad accumulates over the passes
        sg = self_grid()
        F.mse_loss(ref(Tensor(dt.from_global(x[:SIZE], grid=sg, split=(0, None, 1, 2, 3)))),
                   Tensor(dt.from_global(y[:SIZE], grid=sg, split=(0, None)))).backward()
    m = model()
    red = GradientReducer(m.parameters(), g, bucket_bytes=256)
    try:
        red.accumulate(3)
        for k, (x, y) in enumerate(data):
            F.mse_loss(m(Tensor(dt.from_global(x[:SIZE], grid=g, split=(0, None, 1, 2, 3)))),
                       Tensor(dt.from_global(y[:SIZE], grid=g, split=(0, None)))).backward()
            if k < 2:
                expect(all(b.request is None for b in red.buckets),
                       f"a bucket started in pass {k}")
                expect(all(p.grad is None for p in m.parameters()), f".grad set in pass {k}")
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            err = rel_err(p.grad, q.grad)
            expect(err <= TOL, f"{name}: accumulated gradient relative error {err:.3g}")
        # the next step starts afresh
        expect(red._passes_done == 0 and not red._reported, "step state not reset")
    finally:
        red.release()


def test_reducer_accumulate_rejects_bad_passes():
    g = grid((SIZE, 1, 1, 1))
    red = GradientReducer(model().parameters(), g)
    try:
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="positive integer"):
                red.accumulate(bad)
    finally:
        red.release()


# -- bad input raises on every rank -------------------------------------------------------------
def _pipe_dims():
    return (1, SIZE, 1, 1, 1)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(chunks=0), ValueError, "chunks must be a positive integer"),
    (dict(chunks=2.0), ValueError, "chunks must be a positive integer"),
    (dict(schedule="interleaved"), ValueError, "schedule must be one of"),
    (dict(partition=[(0, NLAYERS)] * 2), ValueError, "ranges for|starts at"),
    (dict(partition="balanced"), ValueError, "'params' or 'auto'"),
    (dict(partition="auto"), ValueError, "needs sample="),
    (dict(stage_axis=7), ValueError, "stage_axis 7"),
])
def test_bad_configuration_raises_everywhere(kwargs, exc, match):
    args = dict(chunks=1, partition="params")
    args.update(kwargs)
    assert_raises_all(COMM, exc, match, lambda: Pipeline(model(), grid(_pipe_dims()), **args))


def test_partition_not_covering_raises_everywhere():
    n = SIZE
    bad = [(i, i + 1) for i in range(n)]  # leaves layers out
    assert_raises_all(COMM, ValueError, f"covers layers \\[0, {n}\\)",
                      lambda: Pipeline(model(), grid(_pipe_dims()), partition=bad))


@pytest.mark.skipif(SIZE < 2, reason="needs two stages")
def test_more_stages_than_layers_raises_everywhere():
    tiny = Sequential(Linear(3, 2, dtype="float64", rng=np.random.default_rng(0)))
    assert_raises_all(COMM, ValueError, "stages but the model has only 1 layers",
                      lambda: Pipeline(tiny, grid(_pipe_dims())))


@pytest.mark.skipif(SIZE < 2, reason="needs two ranks")
def test_rank_dependent_chunks_raise_everywhere():
    chunks = 4 if COMM.rank == SIZE - 1 else 2
    assert_raises_all(COMM, dt.ArgumentMismatchError, "Pipeline: arguments differ.*chunks",
                      lambda: Pipeline(model(), grid(_pipe_dims()), chunks=chunks))


def test_batch_not_divisible_raises_everywhere():
    pipe = Pipeline(model(), grid(_pipe_dims()), chunks=3)
    try:
        x, y = batches()[0]
        sg = pipe.stage_grid
        xd = dt.from_global(x, grid=sg, split=(0, None, 1, 2, 3))
        yd = dt.from_global(y, grid=sg, split=(0, None))
        assert_raises_all(COMM, ValueError, "divisible by 3",
                          lambda: pipe.train_step(xd, yd, F.mse_loss))
        assert_raises_all(COMM, TypeError, "x must be a DistArray",
                          lambda: pipe.train_step(None, yd, F.mse_loss))
        # targets of another batch size (checked on the last stage)
        pipe2 = Pipeline(model(), grid(_pipe_dims()), chunks=2)
        try:
            xs = dt.from_global(x, grid=pipe2.stage_grid, split=(0, None, 1, 2, 3))
            ys = dt.from_global(y[:4], grid=pipe2.stage_grid, split=(0, None))
            assert_raises_all(COMM, ValueError, "y holds 4 samples, x holds 8",
                              lambda: pipe2.train_step(xs, ys, F.mse_loss))
            # a good step afterwards still works (nothing was left half done)
            yd2 = dt.from_global(y, grid=pipe2.stage_grid, split=(0, None))
            loss = pipe2.train_step(xs, yd2, F.mse_loss)
            assert_all_ranks(COMM, np.isfinite(loss) and loss > 0, f"loss {loss}")
        finally:
            pipe2.release()
    finally:
        pipe.release()


@pytest.mark.skipif(SIZE != 4, reason="two groups need four ranks")
def test_unequal_group_blocks_raise_everywhere():
    pipe = Pipeline(model(), grid((2, 2, 1, 1, 1)), chunks=1)
    try:
        x, y = batches()[0]
        sg = pipe.stage_grid
        xd = dt.from_global(x, grid=sg, split=(0, None, 1, 2, 3), sizes=[(6, 2), None, None,
                                                                      None, None])
        yd = dt.from_global(y, grid=sg, split=(0, None))
        assert_raises_all(COMM, ValueError, "equal blocks",
                          lambda: pipe.train_step(xd, yd, F.mse_loss))
        # targets whole on every group: micro-batch j of y would hold other samples than x's
        xd = dt.from_global(x, grid=sg, split=(0, None, 1, 2, 3))
        yd = dt.from_global(y, grid=sg, split=(None, None))
        assert_raises_all(COMM, ValueError, "y must split its samples over the same grid axis",
                          lambda: pipe.train_step(xd, yd, F.mse_loss))
    finally:
        pipe.release()


# -- batch norm: micro-batch statistics ---------------------------------------------------------
def bn_model():
    from disttensor.nn.layers import BatchNorm3d, Conv3d, Flatten, LeakyReLU, MaxPool3d
    rng = np.random.default_rng(5)
    # no conv bias: batch norm cancels it (its gradient would be rounding noise)
    return Sequential(Conv3d(2, 3, 3, padding=1, bias=False, dtype="float64", rng=rng),
                      BatchNorm3d(3, dtype="float64"), LeakyReLU(0.3), MaxPool3d(2),
                      Flatten(), Linear(3 * 4 * 4 * 4, 3, dtype="float64", rng=rng))


BN_STEPS = 4


@guarded
def test_batch_norm_uses_micro_batch_statistics():
    """With batch norm each micro-batch is normalized with its own statistics (over all the
    groups) and the running statistics move once per micro-batch: the same as a one-rank run
    that takes the micro-batches one after another (micro-batch ``j`` holds samples
    ``g * B/G + j*b + i`` of every group ``g``), summing ``loss_j / chunks``."""
    dims = {1: (1, 1, 1, 1, 1), 2: (1, 2, 1, 1, 1), 3: (1, 3, 1, 1, 1),
            4: (2, 2, 1, 1, 1)}[SIZE]
    G, chunks = dims[0], 2
    b = B // (G * chunks)
    data = batches()[:BN_STEPS]
    # reference
    ref = bn_model()
    ropt = optimizer(ref.parameters())
    sg = self_grid()
    rlosses = []
    for x, y in data:
        ropt.zero_grad()
        total = 0.0
        for j in range(chunks):
            idx = [g * (B // G) + j * b + i for g in range(G) for i in range(b)]
            loss = F.mse_loss(ref(Tensor(dt.from_global(x[idx], grid=sg,
                                                        split=(0, None, 1, 2, 3)))),
                              Tensor(dt.from_global(y[idx], grid=sg, split=(0, None)))) \
                * (1.0 / chunks)
            loss.backward()
            total += loss.item()
        ropt.step()
        rlosses.append(total)
    m = bn_model()
    layers = 6
    partition = [(0, 2), (2, layers)] if dims[1] == 2 else \
        [(0, layers)] if dims[1] == 1 else [(0, 1), (1, 3), (3, layers)]
    pipe = Pipeline(m, grid(dims), chunks=chunks, partition=partition, schedule="1f1b")
    try:
        opt = optimizer(pipe.parameters())
        losses = []
        for x, y in data:
            opt.zero_grad()
            losses.append(pipe.train_step(
                dt.from_global(x, grid=pipe.stage_grid, split=(0, None, 1, 2, 3)),
                dt.from_global(y, grid=pipe.stage_grid, split=(0, None)), F.mse_loss))
            opt.step()
    finally:
        pipe.release()
    close(losses, rlosses, "losses per step", rtol=TOL, atol=0)
    want = dict(ref.state_dict())
    for name, v in pipe.stage_module.state_dict().items():
        # stage_module names its layers 0, 1, ...; map back by position in the model
        i, rest = name.split(".", 1)
        full = f"{pipe.partition[pipe.stage][0] + int(i)}.{rest}"
        err = rel_err(v, want[full])
        expect(err <= TOL, f"{full} ({name} on stage {pipe.stage}): relative error {err:.3g}")
        if rest == "num_batches_tracked":
            expect(int(v) == BN_STEPS * chunks, f"{full} = {v}, expected {BN_STEPS * chunks}")


# -- partition="auto" (disttensor.nn.partition) -------------------------------------------------
@guarded
def test_auto_partition_is_agreed_and_trains_like_one_rank():
    """``partition="auto"`` measures the layers on a micro-batch (a NumPy array laid out on
    the stage grid), every rank gets the same valid partition, and the steps still equal the
    one-rank steps (any valid partition computes the same thing)."""
    dims = {1: (1, 1, 1, 1, 1), 2: (1, 2, 1, 1, 1), 3: (1, 3, 1, 1, 1),
            4: (2, 2, 1, 1, 1)}[SIZE]
    steps = 3
    rlosses, _, _ = reference()
    chunks = 2
    micro = batches()[0][0][:B // chunks]
    m = model()
    pipe = Pipeline(m, grid(dims), chunks=chunks, partition="auto", sample=micro)
    try:
        everyone = COMM.allgather(pipe.partition)
        expect(all(p == everyone[0] for p in everyone), f"partitions differ: {everyone}")
        check_partition(pipe.partition, NLAYERS, dims[1])
        opt = optimizer(pipe.parameters()) if list(pipe.parameters()) else None
        losses = []
        for x, y in batches()[:steps]:
            if opt is not None:
                opt.zero_grad()
            losses.append(pipe.train_step(
                dt.from_global(x, grid=pipe.stage_grid, split=(0, None, 1, 2, 3)),
                dt.from_global(y, grid=pipe.stage_grid, split=(0, None)), F.mse_loss))
            if opt is not None:
                opt.step()
    finally:
        pipe.release()
    close(losses, rlosses[:steps], f"auto partition {pipe.partition}: losses", rtol=TOL,
          atol=0)


# -- activation headers: sent when the layout of x changes, reused otherwise --------------------
@guarded
def test_changing_batch_layout_between_steps():
    """Steps of 8, 8, 4, 8 samples: headers go with the activations of the first step and
    again whenever the layout of ``x`` changes (not on a repeat), and every step equals the
    one-rank step."""
    dims = {1: (1, 1, 1, 1, 1), 2: (1, 2, 1, 1, 1), 3: (1, 3, 1, 1, 1),
            4: (1, 2, 2, 1, 1)}[SIZE]
    chunks = 2
    data = batches()[:4]
    data[2] = (data[2][0][:4], data[2][1][:4])
    ref = model()
    ropt = optimizer(ref.parameters())
    sg = self_grid()
    rlosses = []
    for x, y in data:
        ropt.zero_grad()
        loss = F.mse_loss(ref(Tensor(dt.from_global(x, grid=sg, split=(0, None, 1, 2, 3)))),
                          Tensor(dt.from_global(y, grid=sg, split=(0, None))))
        loss.backward()
        ropt.step()
        rlosses.append(loss.item())
    partition = [(0, 2), (2, 5), (5, 11)] if dims[1] == 3 else "params"
    pipe = Pipeline(model(), grid(dims), chunks=chunks, partition=partition, schedule="1f1b")
    heads = []
    plain = pipe._send

    def counting(a, dest, kind, j, head):
        heads[-1] += bool(head)
        return plain(a, dest, kind, j, head)
    object.__setattr__(pipe, "_send", counting)
    try:
        opt = optimizer(pipe.parameters())
        losses = []
        for x, y in data:
            heads.append(0)
            opt.zero_grad()
            losses.append(pipe.train_step(
                dt.from_global(x, grid=pipe.stage_grid, split=(0, None, 1, 2, 3)),
                dt.from_global(y, grid=pipe.stage_grid, split=(0, None)), F.mse_loss))
            opt.step()
    finally:
        pipe.release()
    close(losses, rlosses, "losses per step", rtol=TOL, atol=0)
    sends = chunks if pipe.stage < pipe.stages - 1 else 0
    expect(heads == [sends, 0, sends, sends], f"headers sent per step {heads}")


# -- with the weight update inside backward (disttensor.nn.backward_update) ---------------------
@guarded
def test_pipeline_with_weight_update_inside_backward():
    """``BackwardUpdate(opt, pipe)``: each stage parameter is updated when its bucket's
    all-reduce completes in the last micro-batch's backward, once per step, with the gradient
    summed over the micro-batches: the same steps as the one-rank run, no ``.grad`` kept."""
    from disttensor.nn.backward_update import BackwardUpdate
    dims, chunks, schedule, partition = {
        1: ((1, 1, 1, 1, 1), 2, "gpipe", "params"),
        2: ((1, 2, 1, 1, 1), 4, "1f1b", [(0, 4), (4, 11)]),
        3: ((1, 3, 1, 1, 1), 2, "gpipe", [(0, 1), (1, 7), (7, 11)]),
        4: ((2, 2, 1, 1, 1), 2, "1f1b", [(0, 3), (3, 11)])}[SIZE]
    rlosses, _, rparams = reference()
    m = model()
    pipe = Pipeline(m, grid(dims), chunks=chunks, partition=partition, schedule=schedule,
                    bucket_bytes=256)
    try:
        opt = optimizer(pipe.parameters())
        upd = BackwardUpdate(opt, pipe)
        losses = []
        for x, y in batches():
            losses.append(pipe.train_step(
                dt.from_global(x, grid=pipe.stage_grid, split=(0, None, 1, 2, 3)),
                dt.from_global(y, grid=pipe.stage_grid, split=(0, None)), F.mse_loss))
            expect(all(p.grad is None for p in pipe.parameters()), ".grad kept")
        expect(upd.updates == STEPS * len(list(pipe.parameters())),
               f"{upd.updates} updates for {STEPS} steps")
        upd.remove()
    finally:
        pipe.release()
    close(losses, rlosses, f"{dims} {schedule}: losses per step", rtol=TOL, atol=0)
    mine = {id(p) for p in pipe.parameters()}
    for name, p in m.named_parameters():
        if id(p) in mine:
            err = rel_err(p.data, rparams[name])
            expect(err <= TOL, f"{name} after {STEPS} steps: relative error {err:.3g}")
