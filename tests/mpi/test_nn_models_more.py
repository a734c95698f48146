"""The nnU-Net-style U-Net and the 3D ResNet on process grids against one rank.

As ``test_nn_models.py``: the reference is the same model (same seed, same weights) on a
``(1, 1, 1, 1)`` grid over ``MPI.COMM_SELF``; on sample, spatial, hybrid and uneven grids (an
empty block from 3 ranks on), plain and under :class:`~disttensor.nn.DistributedDataParallel`,
the loss, every parameter gradient (1e-10 of its largest entry) and the inference output after
the step equal the reference.  The nnU-Net trains with its deep-supervision Dice + cross-entropy
loss (three outputs); the ResNet with the mean squared error on regression targets, basic and
bottleneck blocks.  Also the deep-supervision weights and the models' input checks.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import disttensor as dt
from disttensor import nn
from disttensor.autograd import Tensor, no_grad
from disttensor.nn import DistributedDataParallel
from disttensor.nn import functional as F
from disttensor.nn.models import (DeepSupervisionLoss, NNUNet3D, ResNet3D,
                                  deep_supervision_weights)

from checks import COMM, SIZE, expect, grid
from conftest import assert_raises_all
from gradchecks import close, guarded, rel_err, self_grid

N = 4
TOL = 1e-10


def nnunet(seed=1):
    return NNUNet3D(in_channels=2, classes=3, features=(2, 3, 4), dtype="float64",
                    rng=np.random.default_rng(seed))


def resnet_basic(seed=1):
    return ResNet3D("basic", layers=(1, 1), widths=(2, 3), in_channels=2, outputs=3,
                    stem_kernel=3, stem_stride=1, stem_pool=False, dtype="float64",
                    rng=np.random.default_rng(seed))


def resnet_bottleneck(seed=1):
    return ResNet3D("bottleneck", layers=(1, 1), widths=(2, 2), in_channels=2, outputs=3,
                    stem_kernel=3, stem_stride=2, stem_pool=True, dtype="float64",
                    rng=np.random.default_rng(seed))


MODELS = {"nnunet": nnunet, "resnet-basic": resnet_basic,
          "resnet-bottleneck": resnet_bottleneck}
SPATIAL = (8, 8, 8)


def batch(model):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 2, *SPATIAL))
    if model == "nnunet":
        return x, rng.integers(0, 3, (N, *SPATIAL))
    return x, rng.standard_normal((N, 3)) * 0.5


def distribute(model, x, y, g, sizes=None):
    xd = dt.from_global(x, grid=g, split=(0, None, 1, 2, 3),
                        sizes=None if sizes is None else list(sizes))
    if model == "nnunet":
        yd = dt.from_global(y, grid=g, split=(0, 1, 2, 3),
                            sizes=None if sizes is None else [sizes[0], *sizes[2:]])
    else:
        yd = dt.from_global(y, grid=g, split=(0, None),
                            sizes=None if sizes is None else [sizes[0], None])
    return Tensor(xd), Tensor(yd)


def loss_of(model, out, y):
    if model == "nnunet":
        return DeepSupervisionLoss()(out, y)
    return F.mse_loss(out, y)


def train_pass(model, net, m, x, y):
    m.train()
    m.zero_grad()
    out = net(x)
    if model == "nnunet":
        expect(isinstance(out, list) and len(out) == 2,
               f"nnU-Net training outputs: {type(out).__name__}")
    loss = loss_of(model, out, y)
    loss.backward()
    grads = {n: (None if p.grad is None else np.array(p.grad)) for n, p in m.named_parameters()}
    m.eval()
    with no_grad():
        pred = m(x).numpy()
    m.train()
    return loss.item(), grads, pred


_REFERENCE: dict = {}


def reference(model):
    if model not in _REFERENCE:
        m = MODELS[model]()
        x, y = batch(model)
        _REFERENCE[model] = train_pass(model, m, m, *distribute(model, x, y, self_grid()))
    return _REFERENCE[model]


def _configs():
    n = SIZE
    if n == 1:
        return {"one": ((1, 1, 1, 1), None)}
    out = {f"sample{n}": ((n, 1, 1, 1), None) if N % n == 0 else None,
           f"depth{n}": ((1, n, 1, 1), None)}
    d = {2: (6, 2), 3: (1, 0, 7), 4: (3, 0, 4, 1)}[n]
    out[f"depth{n}-uneven"] = ((1, n, 1, 1), (None, None, d, None, None))
    if n == 4:
        out["depth2-height2"] = ((1, 2, 2, 1), None)
        out["sample2-width2"] = ((2, 1, 1, 2), None)
    return {k: v for k, v in out.items() if v is not None}


CONFIGS = _configs()
CASES = [(m, c) for c in CONFIGS for m in MODELS]


@pytest.mark.parametrize("model,cid", CASES, ids=[f"{m}-{c}" for m, c in CASES])
@guarded
def test_model_matches_one_rank(model, cid):
    dims, sizes = CONFIGS[cid]
    rloss, rgrads, rpred = reference(model)
    x, y = batch(model)
    g = grid(dims)
    xt, yt = distribute(model, x, y, g, sizes)
    for mode in ("plain", "ddp"):
        m = MODELS[model]()
        net = m if mode == "plain" else DistributedDataParallel(m, g, bucket_bytes=512)
        try:
            loss, grads, pred = train_pass(model, net, m, xt, yt)
        finally:
            if mode != "plain":
                net.reducer.release()
        what = f"{model} on {dims} sizes={sizes} [{mode}]"
        close(loss, rloss, f"{what}: loss", rtol=TOL, atol=0)
        expect(sorted(grads) == sorted(rgrads), f"{what}: parameter names")
        # relative to each gradient's largest entry, but at least 1e-3 of the largest of all:
        # a batch norm's shift in front of other batch norms has a gradient that is zero up to
        # rounding (the later normalizations remove any constant), compared by that scale
        scale = max(float(np.max(np.abs(rg))) for rg in rgrads.values() if rg is not None)
        for name, rg in rgrads.items():
            if rg is None or grads[name] is None:  # the nnU-Net's lowest head (weight 0)
                expect(rg is None and grads[name] is None, f"{what}: gradient of {name}: "
                       f"{type(grads[name]).__name__}, one rank: {type(rg).__name__}")
                continue
            err = float(np.max(np.abs(grads[name] - rg), initial=0.0)) / \
                max(float(np.max(np.abs(rg), initial=0.0)), 1e-3 * scale)
            expect(err <= TOL, f"{what}: gradient of {name}: relative error {err:.3g}")
        err = rel_err(pred, rpred)
        expect(err <= TOL, f"{what}: inference output: relative error {err:.3g}")


def test_deep_supervision_weights():
    for n in range(1, 7):
        w = deep_supervision_weights(n)
        raw = [1 / 2 ** i for i in range(n)]
        if n > 1:
            raw[-1] = 0.0
        want = np.array(raw) / sum(raw)
        expect(np.allclose(w, want, rtol=0, atol=1e-15), f"weights({n}) = {w}")


@guarded
def test_deep_supervision_loss_is_the_weighted_sum():
    """The loss over two outputs is ``w0 * loss(full) + w1 * loss(half, labels[::2])``."""
    g = grid((1, SIZE, 1, 1)) if SIZE > 1 else self_grid()
    rng = np.random.default_rng(3)
    full, half = rng.standard_normal((2, 3, 8, 8, 8)), rng.standard_normal((2, 3, 4, 4, 4))
    lab = rng.integers(0, 3, (2, 8, 8, 8))
    fd = dt.from_global(full, grid=g, split=(0, None, 1, 2, 3))
    hd = dt.from_global(half, grid=g, split=(0, None, 1, 2, 3))
    ld = dt.from_global(lab, grid=g, split=(0, 1, 2, 3))
    sub = dt.from_global(np.ascontiguousarray(lab[:, ::2, ::2, ::2]), grid=g,
                         split=(0, 1, 2, 3))
    crit = nn.DiceCELoss(include_background=False, softmax=True)
    got = DeepSupervisionLoss(crit, weights=[0.75, 0.25])([Tensor(fd), Tensor(hd)],
                                                          Tensor(ld)).item()
    want = 0.75 * crit(Tensor(fd), Tensor(ld)).item() + \
        0.25 * crit(Tensor(hd), Tensor(sub)).item()
    close(got, want, "deep supervision loss", rtol=1e-13, atol=0)


@guarded
def test_nnunet_eval_returns_the_full_resolution_logits():
    m = nnunet()
    x, _ = batch("nnunet")
    xt = Tensor(dt.from_global(x, grid=self_grid(), split=(0, None, 1, 2, 3)))
    m.eval()
    with no_grad():
        out = m(xt)
    expect(tuple(out.shape) == (N, 3, *SPATIAL), f"eval output shape {out.shape}")


def test_models_refuse_wrong_input():
    g = self_grid()
    bad = Tensor(dt.from_global(np.zeros((1, 2, 6, 8, 8)), grid=g, split=(0, None, 1, 2, 3)))
    assert_raises_all(COMM, ValueError, "divisible by 4", lambda: nnunet()(bad))
    wrong_c = Tensor(dt.from_global(np.zeros((1, 1, 8, 8, 8)), grid=g,
                                    split=(0, None, 1, 2, 3)))
    assert_raises_all(COMM, ValueError, re.escape("expects (N, 2"),
                      lambda: resnet_basic()(wrong_c))
    assert_raises_all(COMM, ValueError, "basic' or 'bottleneck", lambda: ResNet3D("wide"))
    assert_raises_all(COMM, ValueError, "at least two", lambda: NNUNet3D(features=(4,)))
