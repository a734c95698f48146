"""SparseLinear / SparseConv3d on one process against dense NumPy float64 references (forward,
data, weight-value and bias gradients) and finite differences; sparsify / densify and the
state dict keys."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import prune
from disttensor.nn.sparse_layers import SparseConv3d, SparseLinear, densify
from disttensor.nn.sparse_convert import sparsify

GRID = None


def grid():
    global GRID
    if GRID is None:
        GRID = dt.ProcessGrid((1, 1, 1, 1), comm=MPI.COMM_SELF)
    return GRID


def dist(a):
    split = (0, None) if a.ndim == 2 else (0, None, 1, 2, 3)
    g = grid() if a.ndim == 5 else dt.ProcessGrid((1,), comm=MPI.COMM_SELF)
    return dt.from_global(np.ascontiguousarray(a), grid=g, split=split)


def pruned_linear(fin, fout, density, seed, bias=True):
    rng = np.random.default_rng(seed)
    lin = nn.Linear(fin, fout, bias=bias, dtype="float64", rng=rng)
    prune.custom_from_mask(lin, "weight", rng.random((fout, fin)) < density,
                           comm=MPI.COMM_SELF)
    return lin


def run(layer, x, g):
    """Forward of ``layer`` on ``x`` and backward of ``sum(y * g)``: (y, dx, dvalues, db)."""
    xt = Tensor(dist(x), requires_grad=True)
    y = layer(xt)
    y.backward(dist(g.astype(x.dtype)))
    return (y.data.to_numpy(), xt.grad.to_numpy(), layer.weight_values.grad,
            None if layer.bias is None else layer.bias.grad)


@pytest.mark.parametrize("fin,fout,n,density", [(13, 7, 5, 0.3), (1, 9, 3, 0.5),
                                                (40, 3, 1, 0.05), (6, 6, 4, 1.0),
                                                (8, 5, 3, 0.0)])
def test_sparse_linear_against_dense(fin, fout, n, density):
    lin = pruned_linear(fin, fout, density, fin * fout)
    w, b = lin.weight.data.copy(), lin.bias.data.copy()
    sp = SparseLinear.from_dense(lin)
    rng = np.random.default_rng(1)
    x, g = rng.normal(size=(n, fin)), rng.normal(size=(n, fout))
    y, dx, dv, db = run(sp, x, g)
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, g @ w, rtol=1e-12, atol=1e-12)
    rows, cols = sp.weight_indices
    np.testing.assert_allclose(dv, (g.T @ x)[rows, cols], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, g.sum(axis=0), rtol=1e-12, atol=1e-12)
    assert sp.nnz == np.count_nonzero(prune.mask_of(lin, "weight"))


def test_sparse_linear_finite_differences():
    sp = SparseLinear.from_dense(pruned_linear(9, 4, 0.4, 3))
    rng = np.random.default_rng(2)
    x, g = rng.normal(size=(3, 9)), rng.normal(size=(3, 4))
    _, dx, dv, _ = run(sp, x, g)

    def loss(values, xx):
        sp.weight_values.data[...] = values
        with dt.autograd.no_grad():
            return float((sp(Tensor(dist(xx))).data.to_numpy() * g).sum())
    v0 = sp.weight_values.data.copy()
    eps = 1e-6
    for _ in range(3):
        d = rng.normal(size=v0.shape)
        num = (loss(v0 + eps * d, x) - loss(v0 - eps * d, x)) / (2 * eps)
        assert num == pytest.approx(float(dv @ d), rel=1e-6, abs=1e-9)
        e = rng.normal(size=x.shape)
        num = (loss(v0, x + eps * e) - loss(v0, x - eps * e)) / (2 * eps)
        assert num == pytest.approx(float((dx * e).sum()), rel=1e-6, abs=1e-9)


def ref_conv(x, w, b, stride, pad, dil):
    """Dense float64 3-D convolution and the adjoints of ``sum(y * g)``: returns ``(y, back)``
    with ``back(g) -> (dx, dw, db)``."""
    k = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0)) + ((pad, pad),) * 3)
    out = tuple((n + 2 * pad - dil * (kk - 1) - 1) // stride + 1
                for n, kk in zip(x.shape[2:], k))

    def win(i, j, l):
        return (slice(None), slice(None)) + tuple(
            slice(o * dil, o * dil + stride * (m - 1) + 1, stride)
            for o, m in zip((i, j, l), out))
    offs = [(i, j, l) for i in range(k[0]) for j in range(k[1]) for l in range(k[2])]
    y = np.zeros((x.shape[0], w.shape[0]) + out)
    for o in offs:
        y += np.einsum("oc,ncdhw->nodhw", w[(slice(None), slice(None)) + o], xp[win(*o)])
    y += b.reshape(1, -1, 1, 1, 1)

    def back(g):
        dxp = np.zeros_like(xp)
        dw = np.zeros_like(w)
        for o in offs:
            dxp[win(*o)] += np.einsum("oc,nodhw->ncdhw", w[(slice(None), slice(None)) + o], g)
            dw[(slice(None), slice(None)) + o] = np.einsum("nodhw,ncdhw->oc", g, xp[win(*o)])
        dx = dxp[(slice(None), slice(None)) + (slice(pad, pad + x.shape[2]),
                                                 slice(pad, pad + x.shape[3]),
                                                 slice(pad, pad + x.shape[4]))]
        return dx, dw, g.sum(axis=(0, 2, 3, 4))
    return y, back


@pytest.mark.parametrize("k,stride,pad,dil", [(1, 1, 0, 1), (3, 1, 1, 1), (3, 2, 1, 1),
                                              (2, 1, 0, 2), (1, 2, 0, 1)])
def test_sparse_conv3d_against_dense(k, stride, pad, dil):
    rng = np.random.default_rng(k * 10 + stride)
    conv = nn.Conv3d(3, 4, k, stride=stride, padding=pad, dilation=dil, dtype="float64",
                     rng=rng)
    prune.l1_unstructured(conv, "weight", 0.6, comm=MPI.COMM_SELF)
    w, b = conv.weight.data.copy(), conv.bias.data.copy()
    sp = SparseConv3d.from_dense(conv)
    x = rng.normal(size=(2, 3, 5, 6, 4))
    want, back = ref_conv(x, w, b, stride, pad, dil)
    g = rng.normal(size=want.shape)
    y, dx, dv, db = run(sp, x, g)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    # the library's dense convolution agrees too
    np.testing.assert_allclose(conv(Tensor(dist(x))).data.to_numpy(), want, rtol=1e-12,
                               atol=1e-12)
    rdx, rdw, rdb = back(g)
    np.testing.assert_allclose(dx, rdx, rtol=1e-12, atol=1e-12)
    rows, cols = sp.weight_indices
    np.testing.assert_allclose(dv, rdw.reshape(4, -1)[rows, cols], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, rdb, rtol=1e-12, atol=1e-12)


def test_state_dicts_sparsify_and_densify():
    model = nn.Sequential(nn.Flatten(), pruned_linear(12, 8, 0.1, 0), nn.ReLU(),
                          pruned_linear(8, 3, 0.8, 1))
    dense_state = {k: np.array(v, copy=True) for k, v in model.state_dict().items()}
    x = np.random.default_rng(0).normal(size=(4, 12))
    want = model(Tensor(dist(x))).data.to_numpy()
    report = sparsify(model, min_sparsity=0.5, measure=False, comm=MPI.COMM_SELF)
    assert [(e["name"], e["converted"]) for e in report] == [("1", True)]
    assert isinstance(model[1], SparseLinear) and isinstance(model[3], nn.Linear)
    keys = list(model.state_dict())
    assert keys[:3] == ["1.weight_values", "1.bias", "1.weight_indices"]
    np.testing.assert_allclose(model(Tensor(dist(x))).data.to_numpy(), want, rtol=1e-12)
    # the sparse state round-trips into a sparse layer of another structure (rebuilt)
    other = SparseLinear.from_dense(pruned_linear(12, 8, 0.1, 0))
    other_state = {k[2:]: v for k, v in model.state_dict().items() if k.startswith("1.")}
    twin = SparseLinear.from_dense(pruned_linear(12, 8, 0.1, 5))
    twin_nnz = twin.nnz
    if twin_nnz == other.nnz:
        twin.load_state_dict(other_state)
        twin.refresh_structure()
        np.testing.assert_array_equal(twin.dense_weight(), other.dense_weight())
    assert densify(model) == ["1"]
    back = model.state_dict()
    assert list(back) == list(dense_state)
    for k in dense_state:
        np.testing.assert_array_equal(back[k], dense_state[k])
    # measured: every candidate gets both times
    report = sparsify(model, min_sparsity=0.0, measure=True, batch=8, repeats=2,
                      comm=MPI.COMM_SELF)
    assert len(report) == 2 and all(e["dense_s"] > 0 and e["sparse_s"] > 0 for e in report)
    assert [isinstance(model[i], SparseLinear) for i in (1, 3)] == \
        [e["converted"] for e in report]


def test_sparse_layer_errors():
    with pytest.raises(TypeError):
        SparseLinear(np.ones((3, 3)))
    conv = nn.Conv3d(4, 4, 3, groups=2)
    with pytest.raises(ValueError, match="groups=1"):
        SparseConv3d.from_dense(conv)
    sp = SparseLinear.from_dense(pruned_linear(5, 4, 0.5, 0))
    with pytest.raises(ValueError, match="expects"):
        sp(Tensor(dist(np.ones((2, 6)))))
    with pytest.raises(ValueError):
        sparsify(nn.Sequential(), min_sparsity=1.5)


def test_sparsify_measures_convolutions_on_example_shapes():
    conv = nn.Conv3d(2, 4, 3, padding=1, dtype="float64", rng=np.random.default_rng(0))
    prune.l1_unstructured(conv, "weight", 0.95, comm=MPI.COMM_SELF)
    model = nn.Sequential(conv, nn.ReLU())
    x = np.random.default_rng(1).normal(size=(2, 2, 4, 4, 4))
    want = model(Tensor(dist(x))).data.to_numpy()
    report = sparsify(model, 0.9, example=Tensor(dist(x)), repeats=2, comm=MPI.COMM_SELF)
    assert len(report) == 1 and report[0]["dense_s"] > 0 and report[0]["sparse_s"] > 0
    assert isinstance(model[0], SparseConv3d) == report[0]["converted"]
    assert "forward" not in conv.__dict__  # the shape probe is gone
    np.testing.assert_allclose(model(Tensor(dist(x))).data.to_numpy(), want, rtol=1e-10,
                               atol=1e-12)
