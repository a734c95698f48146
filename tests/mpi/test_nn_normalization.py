"""Group, instance and layer normalization (``disttensor.nn.normalization``) under MPI.

Forward and every gradient (input, weight, bias) against the serial float64 NumPy
re-implementation of ``tests/normalization_reference.py`` on sample, spatial, uneven (empty
blocks), replicated and (4 ranks) hybrid sample x spatial and two-axis spatial layouts; the
same gradients with the parameters' sums deferred to a GradientReducer; central differences;
instance norm's running statistics and eval mode; PyTorch's state_dict keys; and the errors,
raised on every rank.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import disttensor as dt
from disttensor.autograd import Tensor
from disttensor.nn import GradientReducer
from disttensor.nn import normalization as N

from checks import SIZE, expect
from conftest import assert_raises_all
from gradchecks import close, directional_check, guarded, like, scatter
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import normalization_reference as ref  # noqa: E402

COMM = MPI.COMM_WORLD


def _layouts(shape):
    """name -> (dims, split, sizes) layouts of an ``(N, C, *S)`` array on SIZE ranks."""
    nd = len(shape)
    none = (None,) * nd
    out = {"sample": ((SIZE,), (0,) + none[1:], None),
           "replicated": ((SIZE,), none, None)}
    if nd > 2:
        out["spatial"] = ((SIZE,), tuple(0 if i == 2 else None for i in range(nd)), None)
        n = shape[-1]
        blocks = ([1, 0] + [0] * (SIZE - 2))[:SIZE] if SIZE > 1 else [0]
        blocks[-1] += n - sum(blocks)
        sizes = [None] * nd
        sizes[-1] = tuple(blocks)
        out["uneven"] = ((SIZE,), tuple(0 if i == nd - 1 else None for i in range(nd)),
                         tuple(sizes))
        if SIZE == 4:
            sizes = [None] * nd
            sizes[-1] = (n - 1, 1)
            out["hybrid"] = ((2, 2), tuple(0 if i == 0 else 1 if i == nd - 1 else None
                                           for i in range(nd)), tuple(sizes))
            if nd > 3:
                out["spatial2"] = ((2, 2), tuple(0 if i == 2 else 1 if i == 3 else None
                                                 for i in range(nd)), None)
    return out


def _rn(seed, shape, scale=1.0, shift=0.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale + shift


# name -> (x shape, kind, argument, affine)
CASES = {
    "group2d": ((3, 4, 5, 6), "group", 2, True),
    "group3d": ((2, 6, 3, 4, 5), "group", 3, True),
    "group1_noaffine": ((3, 4, 7), "group", 1, False),
    "group_nc": ((5, 6), "group", 3, True),
    "instance3d": ((2, 3, 4, 3, 5), "instance", None, True),
    "layer_last": ((3, 4, 5, 6), "layer", (6,), True),
    "layer_spatial": ((3, 4, 5, 6), "layer", (5, 6), True),
    "layer_all3d": ((2, 3, 4, 3, 5), "layer", (3, 4, 3, 5), True),
    "layer_noaffine": ((3, 2, 7), "layer", (2, 7), False),
}


def _pairs():
    """Two layouts per case (the test budget): the hybrid (4 ranks) or uneven one with empty
    blocks, and one of the others in turn, so every kind of layout is covered."""
    out = []
    for i, (name, (shape, *_r)) in enumerate(CASES.items()):
        lays = _layouts(shape)
        first = "hybrid" if "hybrid" in lays else "uneven" if "uneven" in lays else "sample"
        others = [lay for lay in ("spatial", "sample", "spatial2", "replicated")
                  if lay in lays and lay != first]
        out.append((name, first))
        if others:
            out.append((name, others[i % len(others)]))
    return out


PAIRS = _pairs()
PAIRS_FIRST = {name: (name, lay) for name, lay in reversed(PAIRS)}


def _build(kind, arg, ts):
    w, b = ts.get("w"), ts.get("b")
    if kind == "group":
        return N.group_norm(ts["x"], arg, w, b, eps=1e-5)
    if kind == "instance":
        return N.instance_norm(ts["x"], weight=w, bias=b, eps=1e-5)
    return N.layer_norm(ts["x"], arg, w, b, eps=1e-5)


def _reference(kind, arg, shape, v, dy):
    w, b = v.get("w"), v.get("b")
    if kind == "group":
        return ref.group_norm(v["x"], arg, w, b, 1e-5, dy)
    if kind == "instance":
        return ref.group_norm(v["x"], shape[1], w, b, 1e-5, dy)
    return ref.layer_norm(v["x"], arg, w, b, 1e-5, dy)


def _values(name):
    shape, kind, arg, affine = CASES[name]
    seed = zlib.crc32(name.encode())
    v = {"x": _rn(seed, shape, 2.0, 1.5)}
    if affine:
        pshape = (shape[1],) if kind in ("group", "instance") else tuple(arg)
        v["w"], v["b"] = _rn(seed + 1, pshape, 0.5, 1.0), _rn(seed + 2, pshape, 0.5)
    return shape, kind, arg, v


def _tensors(v, layout):
    ts = {"x": Tensor(scatter(v["x"], layout), requires_grad=True)}
    for p in ("w", "b"):
        if p in v:
            ts[p] = Tensor(np.array(v[p]), requires_grad=True)
    return ts


@pytest.mark.parametrize("name,lay", PAIRS, ids=[f"{n}-{lay}" for n, lay in PAIRS])
@guarded
def test_forward_and_gradients_match_numpy(name, lay):
    """Forward, dx, dweight and dbias against the float64 reference; then the same with the
    parameters' reduction deferred to a GradientReducer (per-rank shares)."""
    shape, kind, arg, v = _values(name)
    layout = _layouts(shape)[lay]
    dy = _rn(7, shape)
    want_y, want_dx, want_dw, want_db = _reference(kind, arg, shape, v, dy)
    what = f"{name} [{lay}: {layout}]"
    for deferred in (False, True) if (name, lay) == PAIRS_FIRST.get(name) else (False,):
        ts = _tensors(v, layout)
        params = [ts[p] for p in ("w", "b") if p in ts]
        reducer = None
        if deferred:
            if not params:
                break
            reducer = GradientReducer(params, ts["x"].data.grid, bucket_bytes=64)
            reducer.arm()
        try:
            y = _build(kind, arg, ts)
            expect(y.data.distribution == ts["x"].data.distribution,
                   f"{what}: output distributed {y.data.distribution}")
            expect(y.data.dtype == np.float64, f"{what}: output dtype {y.data.dtype}")
            close(y.data.to_numpy(), want_y, f"{what} forward", rtol=1e-11, atol=1e-12)
            y.backward(like(dy, y.data))
        finally:
            if reducer is not None:
                reducer.release()
        tag = f"{what}{' deferred' if deferred else ''}"
        expect(ts["x"].grad.distribution == ts["x"].data.distribution, f"{tag}: dx layout")
        close(ts["x"].grad.to_numpy(), want_dx, f"{tag}: dx", rtol=1e-10, atol=1e-11)
        for p, want in (("w", want_dw), ("b", want_db)):
            if p in ts:
                g = ts[p].grad
                expect(g is not None, f"{tag}: no gradient for {p}")
                if g is not None:
                    close(np.asarray(g), want, f"{tag}: d{p}", rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("name", ["group2d", "instance3d", "layer_spatial"])
@guarded
def test_finite_differences(name):
    """Central differences of ``sum(op(x, w, b) * r)`` along random directions."""
    shape, kind, arg, v = _values(name)
    lays = _layouts(shape)
    layout = lays.get("hybrid", lays.get("uneven"))
    r = _rn(11, shape)

    def loss(point):
        ts = {k: Tensor(scatter(a, layout) if k == "x" else np.array(a)) for k, a in
              point.items()}
        return float(np.sum(_build(kind, arg, ts).data.to_numpy() * r))

    ts = _tensors(v, layout)
    y = _build(kind, arg, ts)
    y.backward(like(r, y.data))
    grads = {"x": ts["x"].grad.to_numpy(), "w": np.asarray(ts["w"].grad),
             "b": np.asarray(ts["b"].grad)}
    directional_check(loss, v, grads, np.random.default_rng(3), name)


@guarded
def test_float32_input_gives_float32():
    shape, kind, arg, v = _values("group3d")
    layout = _layouts(shape)["spatial"]
    x = Tensor(scatter(v["x"].astype(np.float32), layout), requires_grad=True)
    y = N.group_norm(x, arg, Tensor(v["w"].astype(np.float32)),
                     Tensor(v["b"].astype(np.float32)))
    expect(y.data.dtype == np.float32, f"dtype {y.data.dtype}")
    want = ref.group_norm(v["x"].astype(np.float32), arg, v["w"].astype(np.float32),
                          v["b"].astype(np.float32))
    close(y.data.to_numpy(), want, "float32 group norm", rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("lay", ["sample", "hybrid" if SIZE == 4 else "uneven"])
@guarded
def test_instance_norm_running_stats_and_eval(lay):
    """InstanceNorm3d(track_running_stats=True): two training steps update running_mean/var
    as PyTorch does (batch mean of per-instance means and unbiased variances; the counter
    stays 0), eval mode normalizes with them (forward and gradients)."""
    shape = (3, 2, 4, 3, 5)
    layout = _layouts(shape)[lay]
    m = N.InstanceNorm3d(2, momentum=0.3, affine=True, track_running_stats=True,
                         dtype="float64")
    m.weight.data[...] = [1.5, -0.5]
    m.bias.data[...] = [0.2, 0.1]
    rm, rv = np.zeros(2), np.ones(2)
    for step in range(2):
        xv = _rn(step, shape, 3.0, 2.0)
        y = m(Tensor(scatter(xv, layout)))
        close(y.data.to_numpy(), ref.group_norm(xv, 2, m.weight.data, m.bias.data),
              f"training step {step}", rtol=1e-11, atol=1e-12)
        rm, rv = ref.instance_running_update(xv, rm, rv, 0.3)
        close(m.running_mean, rm, f"running_mean after step {step}", rtol=1e-12)
        close(m.running_var, rv, f"running_var after step {step}", rtol=1e-12)
    expect(int(m.num_batches_tracked) == 0, "num_batches_tracked moved")
    m.eval()
    xv, dy = _rn(5, shape), _rn(6, shape)
    x = Tensor(scatter(xv, layout), requires_grad=True)
    y = m(x)
    y.backward(like(dy, y.data))
    want = ref.instance_norm_eval(xv, rm, rv, m.weight.data, m.bias.data, 1e-5, dy)
    close(y.data.to_numpy(), want[0], "eval forward", rtol=1e-11, atol=1e-12)
    close(x.grad.to_numpy(), want[1], "eval dx", rtol=1e-11, atol=1e-12)
    close(m.weight.grad, want[2], "eval dweight", rtol=1e-10, atol=1e-11)
    close(m.bias.grad, want[3], "eval dbias", rtol=1e-10, atol=1e-11)


def test_state_dict_keys_are_pytorchs():
    """The keys of torch.nn's layers (as listed by PyTorch 2.13)."""
    keys = {
        N.GroupNorm(2, 4): ["weight", "bias"],
        N.GroupNorm(2, 4, affine=False): [],
        N.InstanceNorm3d(4): [],
        N.InstanceNorm2d(4, affine=True): ["weight", "bias"],
        N.InstanceNorm1d(4, affine=True, track_running_stats=True):
            ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"],
        N.LayerNorm((3, 4)): ["weight", "bias"],
        N.LayerNorm(4, bias=False): ["weight"],
        N.LayerNorm(4, elementwise_affine=False): [],
    }
    for m, want in keys.items():
        assert list(m.state_dict()) == want, (m, list(m.state_dict()))
    assert N.LayerNorm((3, 4)).weight.shape == (3, 4)


def _x(shape, split=None):
    g = dt.ProcessGrid((SIZE,))
    return Tensor(dt.from_global(np.ones(shape), grid=g, split=split))


def test_errors_raise_on_every_rank():
    sp = (None, None, 0, None)
    assert_raises_all(COMM, ValueError, "divisible by num_groups",
                      lambda: N.group_norm(_x((2, 6, 4, 3), sp), 4))
    assert_raises_all(COMM, ValueError, r"num_channels \(6\) must be divisible by num_groups "
                      r"\(4\)", lambda: N.GroupNorm(4, 6))
    assert_raises_all(COMM, ValueError, "Expected weight to be a vector of size equal to the "
                      "number of channels", lambda: N.group_norm(_x((2, 6, 4, 3), sp), 3,
                                                                  np.ones(4)))
    assert_raises_all(COMM, ValueError, r"Given normalized_shape=\[5\], expected input with "
                      r"shape \[\*, 5\], but got input of size\[2, 3, 4, 4\]",
                      lambda: N.layer_norm(_x((2, 3, 4, 4), sp), (5,)))
    assert_raises_all(COMM, ValueError, "Expected weight to be of same shape as "
                      "normalized_shape", lambda: N.layer_norm(_x((2, 3, 4, 4), sp), (4,),
                                                               np.ones(3)))
    assert_raises_all(COMM, ValueError, r"expected input's size at dim=1 to match "
                      r"num_features \(4\), but got: 3",
                      lambda: N.InstanceNorm3d(4)(_x((2, 3, 2, 2, 2))))
    assert_raises_all(COMM, ValueError, "Expected more than 1 spatial element when training",
                      lambda: N.instance_norm(_x((2, 3, 1, 1))))
    assert_raises_all(COMM, ValueError, "Expected more than 1 value per channel when "
                      r"training, got input size \[1, 2, 1\]",
                      lambda: N.group_norm(_x((1, 2, 1)), 2))
    assert_raises_all(COMM, ValueError, "Expected running_mean and running_var to be defined",
                      lambda: N.instance_norm(_x((2, 3, 4)), use_input_stats=False))
    assert_raises_all(COMM, TypeError, "must be Tensor, not numpy.ndarray",
                      lambda: N.layer_norm(np.ones((2, 3)), (3,)))
    # too few values is a training rule only: eval with running statistics takes one value
    y = N.instance_norm(_x((2, 3, 1)), np.zeros(3), np.ones(3), use_input_stats=False)
    assert y.shape == (2, 3, 1)
