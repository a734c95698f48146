"""The losses of ``disttensor.nn`` (``nn/losses.py`` over ``ops/losses_*.py``) against NumPy
float64 re-implementations of PyTorch's (and, for Dice, MONAI's) documented formulas: forward
and input gradient, every reduction, on sample, spatial and hybrid grids with uneven and empty
blocks, 1-4 ranks.  Reference gradients are central differences of the NumPy references (so
no formula of the backward is shared with the code under test); one directional
finite-difference check runs on the distributed loss itself.  Errors are raised on every rank
(collective assertions)."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor.autograd import Tensor
from disttensor.nn import functional as F
from disttensor import nn

from checks import SIZE, expect, grid
from conftest import assert_raises_all
from gradchecks import close, directional_check, guarded

COMM = MPI.COMM_WORLD
SHAPE = (3, 4, 5, 2)                 # (N, C, H, W): uneven blocks on 2-4 ranks
C = SHAPE[1]


# -- layouts: (grid dims, split of the (N, C, H, W) input, sizes) ------------------------------
def _layouts():
    out = {"sample": ((SIZE, 1), (0, None, 1, None), None),
           "spatial": ((1, SIZE), (0, None, 1, None), None)}
    if SIZE == 4:
        out["hybrid"] = ((2, 2), (0, None, 1, None), None)
    if SIZE > 1:   # an empty block in H (and in N with 4 ranks)
        h = [0] + [SHAPE[2] // (SIZE - 1) + (i < SHAPE[2] % (SIZE - 1)) for i in range(SIZE - 1)]
        out["empty"] = ((1, SIZE), (0, None, 1, None), (None, None, h, None))
    return out


LAYOUTS = _layouts()


def put(a, layout, channel=True):
    """The global array ``a`` in ``layout`` (without the channel axis: ``channel=False``)."""
    dims, split, sizes = layout
    if not channel:
        split = split[:1] + split[2:]
        sizes = None if sizes is None else sizes[:1] + sizes[2:]
    return dt.from_global(np.ascontiguousarray(a), grid=grid(dims), split=split,
                          sizes=None if sizes is None else list(sizes))


def put_dist(shape, layout):
    dims, split, sizes = layout
    return dt.Distribution(shape, dims, split, None if sizes is None else list(sizes))


# -- NumPy float64 references (PyTorch's / MONAI's documented formulas) ------------------------
def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def reduce(v, reduction, den=None):
    if reduction == "none":
        return v
    if reduction == "sum":
        return v.sum()
    d = v.size if den is None else den
    return v.sum() / d if d else np.nan


def ref_class_loss(x, y, weight=None, ignore_index=-100, reduction="mean", eps=0.0,
                   log_input=False):
    """PyTorch's cross_entropy / nll_loss with class-index targets."""
    lp = x if log_input else log_softmax(x)
    c = x.shape[1]
    w = np.ones(c) if weight is None else np.asarray(weight, np.float64)
    keep = y != ignore_index
    ys = np.where(keep, y, 0)
    picked = np.take_along_axis(lp, ys[:, None], axis=1)[:, 0]
    wy = w[ys] * keep
    nll = -wy * picked
    smooth = -(lp * w.reshape((1, c) + (1,) * (x.ndim - 2))).sum(axis=1) * keep
    if reduction == "none":
        return (1 - eps) * nll + eps / c * smooth
    den = wy.sum()
    return (1 - eps) * reduce(nll, reduction, den) + eps / c * reduce(smooth, reduction, den)


def ref_prob_loss(x, t, weight=None, reduction="mean", eps=0.0):
    c = x.shape[1]
    w = np.ones(c) if weight is None else np.asarray(weight, np.float64)
    t = (1 - eps) * t + eps / c
    v = -(w.reshape((1, c) + (1,) * (x.ndim - 2)) * t * log_softmax(x)).sum(axis=1)
    return reduce(v, reduction)


def ref_pointwise(name, x, t, reduction, param=1.0, weight=None, pos_weight=None):
    d = x - t
    if name == "mse":
        v = d * d
    elif name == "l1":
        v = np.abs(d)
    elif name == "smooth_l1" and param == 0:
        v = np.abs(d)
    elif name == "smooth_l1":
        v = np.where(np.abs(d) < param, 0.5 * d * d / param, np.abs(d) - 0.5 * param)
    elif name == "huber":
        v = np.where(np.abs(d) < param, 0.5 * d * d, param * (np.abs(d) - 0.5 * param))
    elif name == "bce_with_logits":
        pw = 1.0 if pos_weight is None else pos_weight
        logsig = -np.logaddexp(0, -x)
        log1msig = -np.logaddexp(0, x)
        v = -(pw * t * logsig + (1 - t) * log1msig)
    else:
        v = -(t * np.maximum(np.log(x), -100) + (1 - t) * np.maximum(np.log(1 - x), -100))
    if weight is not None:
        v = v * weight
    return reduce(v, reduction)


def ref_dice(x, target, activation, include_background=True, squared=False, jaccard=False,
             reduction="mean", snr=1e-5, sdr=1e-5, batch=False, weight=None):
    """MONAI's DiceLoss (activation, one-hot of integer labels, sums, f, weights)."""
    if activation == "softmax":
        p = np.exp(log_softmax(x))
    elif activation == "sigmoid":
        p = 1 / (1 + np.exp(-x))
    else:
        p = x
    c = x.shape[1]
    if np.issubdtype(target.dtype, np.integer):
        t = (target[:, None] == np.arange(c).reshape((1, c) + (1,) * (x.ndim - 2))) * 1.0
    else:
        t = target
    if not include_background and c > 1:
        p, t = p[:, 1:], t[:, 1:]
    axes = tuple(range(2, x.ndim)) if not batch else (0,) + tuple(range(2, x.ndim))
    inter = (p * t).sum(axes)
    ground = (t * t if squared else t).sum(axes)
    pred = (p * p if squared else p).sum(axes)
    den = ground + pred
    if jaccard:
        den = 2 * (den - inter)
    f = 1 - (2 * inter + snr) / (den + sdr)
    if weight is not None and p.shape[1] != 1:
        f = f * np.asarray(weight)
    return reduce(f, reduction)


def fd_grad(fn, x, gout=None, h=1e-5):
    """Central-difference gradient of ``sum(gout * fn(x))`` (``fn(x)`` if ``gout`` is None);
    collective: each rank differences every SIZE-th element, one all-reduce joins them."""
    def scalar(v):
        r = fn(v)
        return float(np.sum(np.asarray(r) * gout)) if gout is not None else float(r)
    g = np.zeros_like(x)
    flat, gf = x.reshape(-1), g.reshape(-1)
    for i in range(COMM.Get_rank(), flat.size, SIZE):
        old = flat[i]
        flat[i] = old + h
        up = scalar(x)
        flat[i] = old - h
        down = scalar(x)
        flat[i] = old
        gf[i] = (up - down) / (2 * h)
    return COMM.allreduce(g, op=MPI.SUM)


# -- data ------------------------------------------------------------------------------------
RNG = np.random.default_rng(19)
X = RNG.standard_normal(SHAPE) * 1.5
LABELS = RNG.integers(0, C, SHAPE[:1] + SHAPE[2:])
LABELS_IGN = LABELS.copy()
LABELS_IGN[0, :2] = -100
PROBS = RNG.dirichlet(np.ones(C), SHAPE[:1] + SHAPE[2:]).transpose(0, 3, 1, 2).copy()
W = RNG.uniform(0.3, 2.0, C)
T = RNG.standard_normal(SHAPE)
T01 = RNG.uniform(0, 1, SHAPE)
XP01 = RNG.uniform(0.05, 0.95, SHAPE)
BW = RNG.uniform(0.5, 1.5, (C, 1, 1))
REDUCTIONS = ("mean", "sum", "none")


def block(d: dt.DistArray, full):
    """This rank's block of ``d`` and the matching block of the global reference ``full``
    (compared locally: no gather; the collective settle reports)."""
    return d.local, np.asarray(full)[d.local_slices]


def run(loss_fn, x, layout, reduction, gout):
    """Our loss (a float, a replicated array, or the per-voxel DistArray) and input gradient
    (a DistArray) for ``x`` in ``layout``."""
    xt = Tensor(put(x, layout), requires_grad=True)
    out = loss_fn(xt)
    if reduction == "none" and isinstance(out.data, dt.DistArray):
        out.backward(dt.from_global(gout, grid=out.data.grid, split=out.data.split,
                                    sizes=out.data.distribution.split_sizes))
    else:
        out.backward(gout if reduction == "none" else None)
    return out.data, xt.grad


def check_against(ref_fn, our_fn, x, what, rtol=1e-11, grad_rtol=2e-6):
    """Every reduction, each on another layout (the cases rotate through all of them): forward
    vs ``ref_fn(x, reduction)`` and the gradient vs central differences of it."""
    names = sorted(LAYOUTS)
    start = sum(map(ord, what))
    for i, reduction in enumerate(REDUCTIONS):
        want = np.asarray(ref_fn(x, reduction))
        gout = RNG.uniform(0.5, 1.5, want.shape) if reduction == "none" else None
        gwant = fd_grad(lambda v: ref_fn(v, reduction), x.copy(), gout)
        # central differences (h = 1e-5) of a float64 sum: rounding ~1e-11 * sum |terms|
        gatol = 1e-10 * (1.0 + float(np.abs(want).sum()) * (1 if gout is None else 2))
        lname = names[(start + i) % len(names)]
        layout = LAYOUTS[lname]
        got, g = run(lambda xt: our_fn(xt, layout, reduction), x, layout, reduction, gout)
        tag = f"{what} {reduction} {lname}"
        expect(g.shape == x.shape and g.distribution == put_dist(x.shape, layout),
               f"{tag}: gradient shape/layout {g.shape} {g.split}")
        if isinstance(got, dt.DistArray):
            got, want = block(got, want)
        close(np.asarray(got, np.float64), want, f"{tag}: loss", rtol=rtol, atol=1e-13)
        close(*block(g, gwant), f"{tag}: gradient", rtol=grad_rtol, atol=gatol)


# -- cross-entropy / nll -------------------------------------------------------------------------
CE_CASES = [("labels", LABELS, {}), ("weight+ignore", LABELS_IGN, dict(weight=W)),
            ("weight+smoothing+ignore=-4", LABELS_IGN,
             dict(weight=W, label_smoothing=0.3, ignore_index=-4)),
            ("ignore=1 (a class)", LABELS, dict(weight=W, ignore_index=1))]


@pytest.mark.parametrize("name,labels,opts", CE_CASES, ids=[c[0] for c in CE_CASES])
@guarded
def test_cross_entropy_labels(name, labels, opts):
    if opts.get("ignore_index") == -4:
        labels = np.where(labels == -100, -4, labels)
    ref_opts = dict(weight=opts.get("weight"), ignore_index=opts.get("ignore_index", -100),
                    eps=opts.get("label_smoothing", 0.0))
    check_against(lambda v, r: ref_class_loss(v, labels, reduction=r, **ref_opts),
                  lambda xt, lay, r: F.cross_entropy(xt, put(labels, lay, channel=False),
                                                     reduction=r, **opts),
                  X, f"cross_entropy {name}")


@guarded
def test_cross_entropy_probabilities_and_nll():
    opts = dict(weight=W, label_smoothing=0.2)
    check_against(lambda v, r: ref_prob_loss(v, PROBS, W, r, 0.2),
                  lambda xt, lay, r: F.cross_entropy(xt, put(PROBS, lay), reduction=r, **opts),
                  X, "cross_entropy probabilities")
    lp = log_softmax(X)
    check_against(lambda v, r: ref_class_loss(v, LABELS_IGN, W, -100, r, log_input=True),
                  lambda xt, lay, r: F.nll_loss(xt, put(LABELS_IGN, lay, channel=False),
                                                weight=W, reduction=r),
                  lp, "nll_loss")


@guarded
def test_cross_entropy_without_spatial_axes_and_all_ignored():
    """(N, C) logits; a mean over only ignored labels is NaN with a zero gradient (PyTorch)."""
    x2 = RNG.standard_normal((5, 3))
    y2 = np.array([0, 2, 1, 1, 0])
    xd = Tensor(dt.from_global(x2, grid=grid((SIZE,)), split=(0, None)), requires_grad=True)
    yd = dt.from_global(y2, grid=grid((SIZE,)), split=(0,))
    loss = F.cross_entropy(xd, yd, weight=W[:3], label_smoothing=0.1)
    close(loss.data, ref_class_loss(x2, y2, W[:3], eps=0.1), "(N, C) loss")
    loss.backward()
    close(xd.grad.to_numpy(), fd_grad(lambda v: ref_class_loss(v, y2, W[:3], eps=0.1), x2),
          "(N, C) gradient", rtol=1e-6, atol=1e-8)
    yi = dt.from_global(np.full(5, -100), grid=grid((SIZE,)), split=(0,))
    xd.grad = None
    loss = F.cross_entropy(xd, yi, label_smoothing=0.1)
    expect(np.isnan(loss.data), f"all ignored: mean {loss.data} is not NaN")
    loss.backward()
    close(xd.grad.to_numpy(), np.zeros_like(x2), "all ignored: gradient")


# -- elementwise losses ------------------------------------------------------------------------
PW_CASES = [("mse", X, T, {}, {}), ("l1", X, T, {}, {}),
            ("smooth_l1", X, T, dict(param=0.5), dict(beta=0.5)),
            ("huber", X, T, dict(param=0.7), dict(delta=0.7)),
            ("bce_with_logits", X * 4, T01, dict(weight=BW, pos_weight=BW * 2),
             dict(weight=BW, pos_weight=BW * 2)),
            ("bce", XP01, T01, dict(weight=BW), dict(weight=BW))]
PW_FN = {"mse": "mse_loss", "l1": "l1_loss", "smooth_l1": "smooth_l1_loss",
         "huber": "huber_loss", "bce_with_logits": "binary_cross_entropy_with_logits",
         "bce": "binary_cross_entropy"}


@pytest.mark.parametrize("case", PW_CASES, ids=lambda c: f"{c[0]}-{sorted(c[4])}-{c[3]}"
                         if not c[0].startswith("bce") else f"{c[0]}-weights")
@guarded
def test_pointwise_losses(case):
    name, x, t, ref_opts, opts = case
    fn = getattr(F, PW_FN[name])
    check_against(lambda v, r: ref_pointwise(name, v, t, r, **ref_opts),
                  lambda xt, lay, r: fn(xt, put(t, lay), reduction=r, **opts), x, name)


@guarded
def test_target_gradient_of_difference_losses():
    """PyTorch differentiates mse/l1/smooth_l1/huber in the target too: ``-dx``."""
    layout = LAYOUTS["spatial"]
    xt = Tensor(put(X, layout), requires_grad=True)
    tt = Tensor(put(T, layout), requires_grad=True)
    F.huber_loss(xt, tt, delta=0.5).backward()
    g = fd_grad(lambda v: ref_pointwise("huber", X, v, "mean", 0.5), T.copy())
    close(tt.grad.to_numpy(), g, "huber target gradient", rtol=2e-6, atol=1e-9)


# -- Dice, DiceCE, one_hot -----------------------------------------------------------------------
DICE_CASES = [dict(activation="softmax"),
              dict(activation="softmax", include_background=False, batch=True, snr=1.0,
                   sdr=1.0),
              dict(activation="sigmoid", squared=True, jaccard=True, weight=[1.0, 2.0, 0.5,
                                                                             0.25]),
              dict(activation=None, target="float", squared=True)]


def _dice_kw(case):
    kw = dict(softmax=case["activation"] == "softmax", sigmoid=case["activation"] == "sigmoid",
              include_background=case.get("include_background", True),
              squared_pred=case.get("squared", False), jaccard=case.get("jaccard", False),
              smooth_nr=case.get("snr", 1e-5), smooth_dr=case.get("sdr", 1e-5),
              batch=case.get("batch", False), weight=case.get("weight"))
    ref = dict(activation=case["activation"], include_background=kw["include_background"],
               squared=kw["squared_pred"], jaccard=kw["jaccard"], snr=kw["smooth_nr"],
               sdr=kw["smooth_dr"], batch=kw["batch"], weight=kw["weight"])
    return kw, ref


@pytest.mark.parametrize("case", DICE_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in
                                                                  c.items()))
@guarded
def test_dice_loss(case):
    kw, ref = _dice_kw(case)
    if case.get("target") == "float":
        x, target = np.exp(log_softmax(X)), T01

        def ours(xt, lay, r):
            return F.dice_loss(xt, put(target, lay), reduction=r, **kw)
    else:
        x, target = X, LABELS

        def ours(xt, lay, r):   # labels as (N, 1, *S) in one of the layouts
            lab = put(target, lay, channel=False) if lay is not LAYOUTS["sample"] else \
                put(target[:, None], lay)
            return F.dice_loss(xt, lab, reduction=r, **kw)
    check_against(lambda v, r: ref_dice(v, target, reduction=r, **ref), ours, x,
                  f"dice {case}")


@guarded
def test_dice_ce_loss_and_modules():
    """DiceCELoss = lambda_dice * Dice + lambda_ce * CE (MONAI); the module classes give their
    functions' values; a directional finite-difference check of the distributed loss."""
    lay = LAYOUTS["hybrid" if "hybrid" in LAYOUTS else "spatial"]
    loss_mod = nn.DiceCELoss(softmax=True, include_background=False, smooth_nr=1.0,
                             smooth_dr=1.0, weight=W, lambda_dice=0.7, lambda_ce=1.3,
                             label_smoothing=0.1)

    def ref(v):
        return 0.7 * ref_dice(v, LABELS, "softmax", False, snr=1.0, sdr=1.0) + \
            1.3 * ref_class_loss(v, LABELS, W, eps=0.1)
    xt = Tensor(put(X, lay), requires_grad=True)
    loss = loss_mod(xt, put(LABELS, lay, channel=False))
    close(loss.data, ref(X), "DiceCELoss")
    loss.backward()
    grad = xt.grad.to_numpy()
    close(grad, fd_grad(ref, X.copy()), "DiceCELoss gradient", rtol=2e-6, atol=1e-9)
    labels = put(LABELS, lay, channel=False)

    def dist_loss(p):
        return loss_mod(Tensor(put(p["x"], lay)), labels).data
    directional_check(dist_loss, {"x": X}, {"x": grad}, np.random.default_rng(3),
                      "DiceCELoss directional")
    xd, td, t01 = Tensor(put(X, lay)), put(T, lay), put(T01, lay)
    mods = [(nn.CrossEntropyLoss(weight=W, ignore_index=-4, reduction="sum",
                                 label_smoothing=0.2),
             ref_class_loss(X, LABELS, W, -4, "sum", 0.2)),
            (nn.NLLLoss(reduction="sum"), ref_class_loss(X, LABELS, None, -100, "sum",
                                                         log_input=True)),
            (nn.DiceLoss(sigmoid=True, batch=True), ref_dice(X, LABELS, "sigmoid",
                                                             batch=True))]
    for m, want in mods:
        close(m(xd, labels).data, want, type(m).__name__)
    for cls, name, kw, param in [(nn.MSELoss, "mse", {}, 1.0), (nn.L1Loss, "l1", {}, 1.0),
                                 (nn.SmoothL1Loss, "smooth_l1", dict(beta=0.3), 0.3),
                                 (nn.HuberLoss, "huber", dict(delta=0.3), 0.3)]:
        got = cls(reduction="sum", **kw)(xd, td).data
        close(got, ref_pointwise(name, X, T, "sum", param), cls.__name__)
    got = nn.BCEWithLogitsLoss(pos_weight=BW)(xd, t01).data
    close(got, ref_pointwise("bce_with_logits", X, T01, "mean", pos_weight=BW), "BCEWithLogits")
    got = nn.BCELoss(weight=BW)(Tensor(put(XP01, lay)), t01).data
    close(got, ref_pointwise("bce", XP01, T01, "mean", weight=BW), "BCELoss")
    expect(set(nn.CrossEntropyLoss(weight=W).state_dict()) == {"weight"},
           "CrossEntropyLoss(weight=...) state_dict keys")


@guarded
def test_dice_ce_is_one_agreement_and_float_targets(counted):
    """DiceCE agrees once (one op; its sums ride on one all-reduce); with a float target the
    cross-entropy term takes it as class probabilities."""
    lay = LAYOUTS["spatial"]
    xt = Tensor(put(X, lay), requires_grad=True)
    target = put(PROBS, lay)
    del counted[:]
    loss = F.dice_ce_loss(xt, target, softmax=True, batch=True, reduction="sum")
    if SIZE > 1:
        expect(counted == ["dice_ce_forward"], f"agreements {counted}")

    def ref(v):
        return ref_dice(v, PROBS, "softmax", batch=True, reduction="sum") + \
            ref_prob_loss(v, PROBS, reduction="sum")
    close(loss.data, ref(X), "DiceCE float target")
    loss.backward()
    close(xt.grad.to_numpy(), fd_grad(ref, X.copy()), "DiceCE float target gradient",
          rtol=2e-6, atol=1e-8)


@guarded
def test_one_hot():
    for k, lname in ((-1, "spatial"), (6, sorted(LAYOUTS)[-1])):
        layout = LAYOUTS[lname]
        lab = put(LABELS, layout, channel=False)
        if True:
            got = F.one_hot(Tensor(lab), k)
            kk = LABELS.max() + 1 if k == -1 else k
            want = (LABELS[..., None] == np.arange(kk)).astype(np.int64)
            g = got.data.to_numpy()
            expect(g.dtype == np.int64 and g.shape == want.shape and (g == want).all(),
                   f"one_hot {lname} num_classes={k}: {g.dtype} {g.shape}")


# -- errors (every rank) ----------------------------------------------------------------------
def test_float_labels_raise():
    """Issue 19's silent bug 4: float labels of the label shape (PyTorch: dtype error)."""
    lay = LAYOUTS["spatial"]
    x = Tensor(put(X, lay), requires_grad=True)
    flab = put(LABELS.astype(np.float64), lay, channel=False)
    assert_raises_all(COMM, TypeError, "integer dtype", lambda: F.cross_entropy(x, flab))
    assert_raises_all(COMM, TypeError, "integer dtype", lambda: nn.CrossEntropyLoss()(x, flab))
    assert_raises_all(COMM, TypeError, "integer dtype", lambda: F.nll_loss(x, flab))


@guarded
def test_non_int_ignore_index_raises():
    """``ignore_index`` must be an int (PyTorch: TypeError); 1.5 must not be truncated to
    class 1 and silently drop that class's voxels."""
    lay = LAYOUTS["spatial"]
    x = Tensor(put(X, lay), requires_grad=True)
    lab = put(LABELS, lay, channel=False)
    logp = F.log_softmax(x, dim=1)
    cases = [
        ("cross_entropy", lambda: F.cross_entropy(x, lab, ignore_index=1.5)),
        ("nll_loss", lambda: F.nll_loss(logp, lab, ignore_index=1.5)),
        ("cross_entropy", lambda: nn.CrossEntropyLoss(ignore_index=1.5)(x, lab)),
        ("nll_loss", lambda: nn.NLLLoss(ignore_index=1.5)(logp, lab)),
        ("cross_entropy", lambda: F.cross_entropy(x, lab, ignore_index="1")),
    ]
    for what, fn in cases:
        assert_raises_all(COMM, TypeError, f"{what}: ignore_index must be an int, got", fn)
    # an int of another spelling is accepted and means that class
    got = F.nll_loss(logp, lab, ignore_index=np.int64(1)).item()
    want = F.nll_loss(logp, lab, ignore_index=1).item()
    expect(got == want, f"ignore_index=np.int64(1): {got} vs {want}")
    expect(want != F.nll_loss(logp, lab).item(), "ignore_index=1 left class 1 in the loss")


def test_loss_errors():
    lay = LAYOUTS["spatial"]
    x = Tensor(put(X, lay), requires_grad=True)
    lab = put(LABELS, lay, channel=False)
    bad = LABELS.copy()
    bad[1, 2, 0] = C
    badlab = put(bad, lay, channel=False)
    t = put(T, lay)
    cases = [
        (ValueError, "not a valid value for reduction",
         lambda: F.cross_entropy(x, lab, reduction="avg")),
        (ValueError, "not a valid value for reduction", lambda: F.mse_loss(x, t, reduction="")),
        (ValueError, "not a valid value for reduction",
         lambda: F.dice_loss(x, lab, reduction="mean_batch")),
        (ValueError, r"1 target labels outside \[0, 4\)", lambda: F.cross_entropy(x, badlab)),
        (ValueError, r"labels outside \[0, 4\)", lambda: F.dice_loss(x, badlab, softmax=True)),
        (ValueError, "weight must be a 1-D array of 4",
         lambda: F.cross_entropy(x, lab, weight=np.ones(3))),
        (ValueError, "fits neither", lambda: F.cross_entropy(x, put(LABELS[:, :4], lay,
                                                                    channel=False))),
        (ValueError, "must equal the input shape", lambda: F.l1_loss(x, put(T[:2], lay))),
        (ValueError, "label_smoothing must be between",
         lambda: F.cross_entropy(x, lab, label_smoothing=1.5)),
        (ValueError, "between 0 and 1", lambda: F.binary_cross_entropy(x, put(T01, lay))),
        (ValueError, "does not broadcast",
         lambda: F.binary_cross_entropy_with_logits(x, put(T01, lay), pos_weight=np.ones(4))),
        (ValueError, "non-negative", lambda: F.one_hot(put(LABELS - 1, lay, channel=False))),
        (ValueError, "smaller than num_classes", lambda: F.one_hot(lab, 2)),
        (TypeError, "index tensor", lambda: F.one_hot(put(T, lay))),
        (ValueError, "reduction must be 'mean' or 'sum'",
         lambda: nn.DiceCELoss(reduction="none")),
    ]
    for exc, match, fn in cases:
        assert_raises_all(COMM, exc, match, fn)
