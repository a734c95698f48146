"""Pruning and sparse layers under MPI: masks identical on every rank (and equal to a serial
NumPy reference), rank-dependent amounts and differing replicas refused on every rank, sparse
layers in a data-parallel model and on spatial grids (uneven and empty blocks) equal to the
dense ones, and ``python -m disttensor.train --prune-to``."""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import nn, train
from disttensor.autograd import Tensor
from disttensor.core.agreement import ArgumentMismatchError
from disttensor.io.synthetic import generate_synthetic
from disttensor.nn import functional as F
from disttensor.nn import prune
from disttensor.nn.models import CosmoFlow
from disttensor.nn.sparse_layers import SparseConv3d, SparseLinear
from disttensor.nn.sparse_convert import sparsify
from conftest import assert_all_ranks, assert_raises_all

SIZE = MPI.COMM_WORLD.Get_size()


def same_everywhere(comm, a) -> bool:
    return all(np.array_equal(a, b) for b in comm.allgather(np.asarray(a)))


def small_model():
    return CosmoFlow(input_size=8, in_channels=2, widths=(3, 4), dense=(5,), outputs=3,
                     dtype="float64", rng=np.random.default_rng(1))


def test_masks_identical_and_as_the_reference(comm):
    m = small_model()
    lin, conv0, conv1 = m.head[1], m.features[0], m.features[3]
    w = lin.weight.data.copy()
    prune.l1_unstructured(lin, "weight", 0.6)
    prune.random_unstructured(conv0, "weight", 0.3, rng=np.random.default_rng(4))
    prune.ln_structured(conv1, "weight", 0.5, 2, 0)
    prune.global_unstructured([(lin, "weight"), (m.head[3], "weight")], prune.L1Unstructured,
                              amount=0.2)
    sched = prune.GradualPruning(m, 0.8, 0, 2, 1)
    before = [int((prune.mask_of(a, n) == 0).sum()) if prune.mask_of(a, n) is not None
              else 0 for a, n in sched.pairs]
    for _ in range(3):
        sched.step()
    masks = [prune.mask_of(a, n) for a, n in prune.pruned_parameters(m)]
    assert_all_ranks(comm, all(same_everywhere(comm, k) for k in masks), "masks differ")
    ref = np.ones(w.size)
    ref[np.argsort(np.abs(w).ravel(), kind="stable")[:round(0.6 * w.size)]] = 0
    m2 = small_model()
    prune.l1_unstructured(m2.head[1], "weight", 0.6)
    assert_all_ranks(comm, np.array_equal(prune.mask_of(m2.head[1], "weight").ravel(), ref),
                     "l1 mask differs from the NumPy reference")
    expect = [max(round(0.8 * a.weight.data.size), b) for (a, _), b in zip(sched.pairs, before)]
    got = [int((prune.mask_of(a, n) == 0).sum()) for a, n in sched.pairs]
    assert_all_ranks(comm, got == expect, f"{got} pruned, schedule wants {expect}")


@pytest.mark.skipif(SIZE == 1, reason="needs ranks that can differ")
def test_rank_dependent_input_raises_everywhere(comm):
    m = small_model()
    lin = m.head[1]
    assert_raises_all(comm, ArgumentMismatchError, "", lambda: prune.l1_unstructured(
        lin, "weight", 0.5 if comm.rank == 0 else 0.25))
    assert_raises_all(comm, ArgumentMismatchError, "", lambda: prune.l1_unstructured(
        lin, "weight", 0.5 if comm.rank == 0 else 1.5))
    assert_raises_all(comm, ValueError, "range", lambda: prune.l1_unstructured(
        lin, "weight", 1.5))
    assert_raises_all(comm, ValueError, "does not fit", lambda: prune.custom_from_mask(
        lin, "weight", np.ones((2, 2))))
    assert_all_ranks(comm, not prune.is_pruned(m), "a failed call left a mask")
    if comm.rank == 1:
        lin.weight.data[0, 0] += 10.0  # replicas that differ prune differently
    assert_raises_all(comm, ArgumentMismatchError, "", lambda: prune.l1_unstructured(
        lin, "weight", 0.5))
    sched = prune.GradualPruning(m.head, 0.9 if comm.rank else 0.8, 0, 0, 1)
    assert_raises_all(comm, ArgumentMismatchError, "", sched.step)


@pytest.mark.parametrize("ddp", [True, False])
def test_sparse_dense_head_data_parallel_equals_dense(comm, ddp):
    """A pruned MLP and its sparsified twin, data parallel over all ranks with 3 samples
    (uneven and empty blocks), with DistributedDataParallel's bucketed reduction or the ops'
    own all-reduce: outputs, gradients and 2 SGD steps agree."""
    rng = np.random.default_rng(0)
    dense = nn.Sequential(nn.Flatten(), nn.Linear(12, 8, dtype="float64", rng=rng), nn.ReLU(),
                          nn.Linear(8, 3, dtype="float64", rng=rng))
    prune.l1_unstructured(dense[1], "weight", 0.7)
    prune.l1_unstructured(dense[3], "weight", 0.5)
    sparse = copy.deepcopy(dense)
    sparsify(sparse, min_sparsity=0.4, measure=False)
    assert_all_ranks(comm, isinstance(sparse[1], SparseLinear) and
                     isinstance(sparse[3], SparseLinear), "not converted")
    g = dt.ProcessGrid((SIZE,))
    x = rng.standard_normal((3, 2, 6))
    y = rng.standard_normal((3, 3))
    w1, b1 = dense[1].weight.data.copy(), dense[1].bias.data.copy()
    w3, b3 = dense[3].weight.data.copy(), dense[3].bias.data.copy()
    want = np.maximum(x.reshape(3, 12) @ w1.T + b1, 0) @ w3.T + b3
    outs, nets = [], []
    for model in (dense, sparse):
        net = nn.DistributedDataParallel(model, g, bucket_bytes=256) if ddp else model
        opt = nn.optim.SGD(list(model.parameters()), lr=0.1, momentum=0.9)
        try:
            for step in range(2):
                opt.zero_grad()
                out = net(Tensor(dt.from_global(x, grid=g, split=(0, None, None))))
                if step == 0:
                    outs.append(out.data.to_numpy())
                loss = F.mse_loss(out, Tensor(dt.from_global(y, grid=g, split=(0, None))))
                loss.backward()
                if step == 0:
                    grads = [np.array(p.grad) for p in model.parameters()]
                opt.step()
        finally:
            if ddp:
                net.reducer.release()
        nets.append(grads)
    assert_all_ranks(comm, np.allclose(outs[0], want, rtol=1e-12, atol=1e-12) and
                     np.allclose(outs[1], want, rtol=1e-12, atol=1e-12), "forward differs")
    for i, (d, s) in enumerate(((dense[1], sparse[1]), (dense[3], sparse[3]))):
        r, c = s.weight_indices
        gd, gs = nets[0][2 * i], nets[1][2 * i]
        assert_all_ranks(comm, np.allclose(gd[r, c], gs, rtol=1e-10, atol=1e-12),
                         f"weight gradient of layer {i} differs")
        assert_all_ranks(comm, np.allclose(d.weight.data[r, c], s.weight_values.data,
                                           rtol=1e-10, atol=1e-12) and
                         np.allclose(d.bias.data, s.bias.data, rtol=1e-10, atol=1e-12),
                         f"layer {i} differs after 2 steps")
        assert_all_ranks(comm, np.count_nonzero(d.weight.data) <= s.nnz, "revived weights")


def _conv_grid():
    return {1: (1, 1, 1, 1), 2: (1, 2, 1, 1), 3: (1, 1, 3, 1), 4: (2, 2, 1, 1)}[SIZE]


@pytest.mark.parametrize("k,pad", [(1, 0), (3, 1)])
def test_sparse_conv_on_spatial_grids_equals_dense(comm, k, pad):
    rng = np.random.default_rng(k)
    conv = nn.Conv3d(3, 4, k, padding=pad, dtype="float64", rng=rng)
    prune.l1_unstructured(conv, "weight", 0.6)
    sp = SparseConv3d.from_dense(conv)
    g = dt.ProcessGrid(_conv_grid())
    x = rng.standard_normal((3, 3, 3, 5, 4))   # 3 samples, depth 3: uneven / empty blocks
    res = []
    for layer in (conv, sp):
        xt = Tensor(dt.from_global(x, grid=g, split=(0, None, 1, 2, 3)), requires_grad=True)
        out = layer(xt)
        gy = dt.from_global(np.cos(out.data.to_numpy()), grid=g, split=out.data.split,
                            sizes=out.data.distribution.split_sizes)
        out.backward(gy)
        pg = layer.weight.grad if layer is conv else layer.weight_values.grad
        res.append((out.data.to_numpy(), xt.grad.to_numpy(), np.array(pg),
                    np.array(layer.bias.grad)))
    r, c = sp.weight_indices
    (yd, dxd, dwd, dbd), (ys, dxs, dvs, dbs) = res
    ok = [np.allclose(ys, yd, rtol=1e-12, atol=1e-12), np.allclose(dxs, dxd, atol=1e-12),
          np.allclose(dvs, dwd.reshape(4, -1)[r, c], atol=1e-11),
          np.allclose(dbs, dbd, atol=1e-11)]
    assert_all_ranks(comm, all(ok), f"forward, dx, dw, db agree: {ok}")


def test_train_cli_prune_to(comm, tmp_path):
    root = comm.bcast(str(tmp_path) if comm.rank == 0 else None)
    tr, va = os.path.join(root, "train"), os.path.join(root, "val")
    generate_synthetic(tr, 8, size=8, channels=4, seed=0, comm=comm)
    generate_synthetic(va, 4, size=8, channels=4, seed=1, comm=comm)
    argv = ["cosmoflow", "--widths", "2,3", "--dense", "6", "--quiet", "--no-prefetch",
            "--data", tr, "--val", va, "--out", os.path.join(root, "out"), "--batch-size",
            "3" if SIZE == 3 else "4", "--grid", f"{SIZE}x1x1x1", "--epochs", "1",
            "--no-checkpoint", "--prune-to", "0.75", "--prune-start", "0", "--prune-end", "1",
            "--prune-frequency", "1"]
    res = train.run(argv)
    sizes = [3 * 2 ** 3 * 6, 6 * 3]  # the head: 3 channels x 2^3 -> 6 -> 3 targets
    want = round(0.75 * sum(sizes)) / sum(sizes)  # --prune-scope global (default)
    p = res.pruning
    assert_all_ranks(comm, res.steps == 2 and p.get("sparsity") == pytest.approx(want),
                     f"{res.steps} steps, pruning summary {p}")
    assert_all_ranks(comm, p["dense_s"] > 0 and p["sparse_s"] > 0 and
                     same_everywhere(comm, [p["dense_s"], p["sparse_s"]]), f"{p}")
    if SIZE <= 2:  # (the time budget of 4 oversubscribed ranks; resume is per-rank logic)
        # stopped after step 1 and resumed: the masks load (registered before the checkpoint
        # is read) and the schedule continues: the uninterrupted curve and sparsity
        ck = [a for a in argv if a != "--no-checkpoint"]
        ck[ck.index("--out") + 1] = os.path.join(root, "ck")
        part = train.run(ck + ["--max-steps", "1"])
        rest = train.run(ck + ["--resume"])
        assert_all_ranks(comm, part.steps == 1 and np.allclose(rest.losses, res.losses,
                                                               rtol=1e-6)
                         and rest.pruning["sparsity"] == p["sparsity"],
                         f"resumed {rest.losses} {rest.pruning} vs {res.losses} {p}")
    assert_raises_all(comm, ValueError, "prune-to", lambda: train.run(
        argv[:-8] + ["--prune-to", "1.5"]))


@pytest.mark.parametrize("layers", ["conv", "all"])
def test_train_cli_prune_layers(comm, tmp_path, monkeypatch, capsys, layers):
    """``--prune-to 0.5 --prune-layers conv`` (gradual, global scope: steps 0-2) and ``all``
    (one-shot at step 1, per layer): the run's conv weights (and for ``all`` the dense head's
    too) end exactly half zero, the zeros are the masks' and held through the steps after the
    last pruning (Adam would revive them otherwise) while the kept weights go on training,
    the layers not named stay dense, and the summary reports the sparsity."""
    from disttensor.nn.layers import Linear, _ConvNd
    from disttensor.train import loop
    root = comm.bcast(str(tmp_path) if comm.rank == 0 else None)
    tr, va = os.path.join(root, "train"), os.path.join(root, "val")
    generate_synthetic(tr, 8, size=8, channels=4, seed=0, comm=comm)
    generate_synthetic(va, 4, size=8, channels=4, seed=1, comm=comm)
    sched = ["--prune-start", "0", "--prune-end", "2", "--prune-frequency", "1"] \
        if layers == "conv" else ["--prune-schedule", "oneshot", "--prune-start", "1",
                                  "--prune-scope", "layer"]
    last_prune = 3 if layers == "conv" else 2      # steps done when the last pruning ran
    argv = ["cosmoflow", "--widths", "2,3", "--dense", "6", "--no-prefetch", "--data", tr,
            "--val", va, "--out", os.path.join(root, "out"), "--batch-size",
            "3" if SIZE == 3 else "4", "--grid", f"{SIZE}x1x1x1", "--epochs", "3",
            "--no-checkpoint", "--prune-to", "0.5", "--prune-layers", layers, *sched]
    seen = {}
    make = loop.make_pruner

    def capture(args, model, *a, **kw):   # the run's model, as the pruner gets it
        seen["model"] = model
        return make(args, model, *a, **kw)
    monkeypatch.setattr(loop, "make_pruner", capture)

    def weights(kind):
        return [np.array(m.weight.data, copy=True) for m in seen["model"].modules()
                if isinstance(m, kind)]

    def snapshot(step):
        if step == last_prune:
            seen["after_pruning"] = weights(_ConvNd) + weights(Linear)
    res = train.run(argv, on_step=snapshot)
    out = capsys.readouterr().out
    convs, denses = weights(_ConvNd), weights(Linear)
    pruned = convs + denses if layers == "all" else convs
    assert_all_ranks(comm, res.steps == 6 and len(convs) == 2 and len(denses) == 2,
                     f"{res.steps} steps, {len(convs)} conv and {len(denses)} dense layers")
    sizes = [w.size for w in pruned]
    zeros = [int((w == 0).sum()) for w in pruned]
    if layers == "all":   # per layer: each at round(0.5 * size)
        ok = zeros == [round(0.5 * s) for s in sizes]
    else:                 # global over the conv weights
        ok = sum(zeros) == round(0.5 * sum(sizes))
    want = round(0.5 * sum(sizes)) / sum(sizes) if layers == "conv" else \
        sum(round(0.5 * s) for s in sizes) / sum(sizes)
    assert_all_ranks(comm, ok and res.pruning["sparsity"] == pytest.approx(want),
                     f"--prune-layers {layers}: zeros {zeros} of {sizes}, summary "
                     f"{res.pruning}")
    mods = [m for m in seen["model"].modules()
            if isinstance(m, (_ConvNd, Linear) if layers == "all" else _ConvNd)]
    masks = [np.asarray(prune.mask_of(m, "weight")) for m in mods]
    assert_all_ranks(comm, all(np.array_equal(w == 0, k == 0) for w, k in zip(pruned, masks)),
                     "the zero weights are not exactly the masks' zeros")
    if layers == "conv":
        assert_all_ranks(comm, all(prune.mask_of(m, "weight") is None and (w != 0).all()
                                   for m, w in zip([m for m in seen["model"].modules()
                                                    if isinstance(m, Linear)], denses)),
                         "--prune-layers conv pruned the dense head")
    # held for the steps after the last pruning, while the kept weights moved
    before = seen["after_pruning"][:len(pruned)]
    assert_all_ranks(comm, all(np.array_equal(b == 0, w == 0) for b, w in zip(before, pruned)),
                     "pruned weights changed after the last pruning step")
    moved = [float(np.abs(w - b)[b != 0].max()) for b, w in zip(before, pruned)]
    assert_all_ranks(comm, min(moved) > 0, f"kept weights did not train: {moved}")
    line = f"pruned: final sparsity {want:.1%} of the pruned layers' weights"
    assert_all_ranks(comm, comm.rank != 0 or (line in out and "50.0%" in line),
                     f"summary line {line!r} not in rank 0's output:\n{out[-600:]}")
