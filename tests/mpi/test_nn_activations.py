"""GELU (exact, tanh), SiLU, Softplus, Mish, Hardswish, Hardsigmoid and PReLU
(``disttensor.nn.activation``, ops ``disttensor.ops.activations_more``) under MPI.

Forward and gradients against float64 NumPy re-implementations of PyTorch's formulas on sample,
spatial, uneven (empty blocks), replicated and (4 ranks) hybrid sample x spatial layouts;
PReLU's weight gradient summed over the ranks (and deferred to a GradientReducer); central
differences; the modules; bad input and arguments that differ between ranks raising on every
rank.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import disttensor as dt
from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import GradientReducer
from disttensor.nn import activation as A
from disttensor.ops import activations_more as ops_am

from checks import SIZE, expect, in_step, last_rank_only, mismatch
from conftest import assert_raises_all
from gradchecks import close, directional_check, guarded, like, scatter
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from activation_reference import prelu_reference, reference  # noqa: E402

COMM = MPI.COMM_WORLD
SHAPE = (3, 4, 5, 6)


def _layouts():
    """name -> (dims, split, sizes) layouts of a SHAPE array on SIZE ranks."""
    out = {"sample": ((SIZE,), (0, None, None, None), None),
           "spatial": ((SIZE,), (None, None, 0, None), None),
           "replicated": ((SIZE,), (None,) * 4, None)}
    blocks = ([1, 0] + [0] * (SIZE - 2))[:SIZE] if SIZE > 1 else [0]
    blocks[-1] += SHAPE[-1] - sum(blocks)
    out["uneven"] = ((SIZE,), (None, None, None, 0), (None, None, None, tuple(blocks)))
    if SIZE == 4:
        out["hybrid"] = ((2, 2), (0, None, None, 1), (None, None, None, (5, 1)))
    return out


LAYOUTS = _layouts()
EVEN = "hybrid" if "hybrid" in LAYOUTS else "uneven"


def _x(seed):
    x = np.random.default_rng(seed).standard_normal(SHAPE) * 3
    x.reshape(-1)[:6] = (0.0, -3.0, 3.0, 30.0, -30.0, 1e-3)   # kinks, thresholds, tails
    return x


def _build(name, x, beta=1.0, threshold=20.0):
    if name == "gelu":
        return A.gelu(x)
    if name == "gelu_tanh":
        return A.gelu(x, approximate="tanh")
    if name == "softplus":
        return A.softplus(x, beta, threshold)
    return getattr(A, name)(x)


CASES = [("gelu", {}), ("gelu_tanh", {}), ("silu", {}), ("softplus", {}),
         ("softplus", dict(beta=2.0, threshold=3.0)), ("mish", {}), ("hardswish", {}),
         ("hardsigmoid", {})]
# every case on the layout with empty blocks (4 ranks: hybrid), every other one on a plain
# layout too (the test budget)
PAIRS = [(i, EVEN) for i in range(len(CASES))] + [
    (i, ("sample", "spatial", "replicated")[(i // 2) % 3]) for i in range(1, len(CASES), 2)]


@pytest.mark.parametrize("case,lay", PAIRS,
                         ids=[f"{CASES[i][0]}{CASES[i][1] or ''}-{lay}" for i, lay in PAIRS])
@guarded
def test_forward_and_gradient_match_numpy(case, lay):
    name, kw = CASES[case]
    layout = LAYOUTS[lay]
    x, dy = _x(case), np.random.default_rng(100 + case).standard_normal(SHAPE)
    want_y, want_d = reference(name, x, **kw)
    t = Tensor(scatter(x, layout), requires_grad=True)
    y = _build(name, t, **kw)
    what = f"{name}{kw} [{lay}]"
    expect(y.data.distribution == t.data.distribution, f"{what}: output layout")
    close(y.data.to_numpy(), want_y, f"{what} forward", rtol=1e-13, atol=1e-15)
    y.backward(like(dy, y.data))
    expect(t.grad.distribution == t.data.distribution, f"{what}: dx layout")
    close(t.grad.to_numpy(), dy * want_d, f"{what} dx", rtol=1e-12, atol=1e-14)


@guarded
def test_float32_stays_float32():
    x = Tensor(scatter(_x(1).astype(np.float32), LAYOUTS["spatial"]), requires_grad=True)
    y = A.mish(x)
    expect(y.data.dtype == np.float32, f"dtype {y.data.dtype}")
    close(y.data.to_numpy(), reference("mish", _x(1).astype(np.float32).astype(np.float64))[0],
          "mish float32", rtol=1e-6, atol=1e-6)
    y.backward(like(np.ones(SHAPE), y.data))
    expect(x.grad.dtype == np.float32, f"grad dtype {x.grad.dtype}")


@pytest.mark.parametrize("nw", [1, SHAPE[1]])
@pytest.mark.parametrize("lay", sorted({EVEN, "sample", "spatial"}))
@guarded
def test_prelu(nw, lay):
    layout = LAYOUTS[lay]
    x, dy = _x(7), np.random.default_rng(8).standard_normal(SHAPE)
    w0 = np.random.default_rng(9).uniform(-0.5, 0.5, nw)
    want_y, want_dx, want_dw = prelu_reference(x, w0, dy)
    for deferred in (False, True) if lay in (EVEN, "sample") else (False,):
        t = Tensor(scatter(x, layout), requires_grad=True)
        w = nn.Parameter(w0.copy())
        reducer = None
        if deferred:
            reducer = GradientReducer([w], t.data.grid, bucket_bytes=64)
            reducer.arm()
        try:
            y = A.prelu(t, w)
            tag = f"prelu({nw}) [{lay}]{' deferred' if deferred else ''}"
            close(y.data.to_numpy(), want_y, f"{tag} forward", rtol=1e-15, atol=0)
            y.backward(like(dy, y.data))
        finally:
            if reducer is not None:
                reducer.release()
        close(t.grad.to_numpy(), want_dx, f"{tag} dx", rtol=1e-15, atol=0)
        expect(w.grad is not None, f"{tag}: no weight gradient")
        if w.grad is not None:
            close(np.asarray(w.grad), want_dw, f"{tag} dw", rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["gelu", "softplus", "prelu"])
@guarded
def test_finite_differences(name):
    """Central differences of ``sum(f(x) * r)`` (kinks avoided: |x| >= 0.05 and away from
    hardswish's +-3)."""
    layout = LAYOUTS[EVEN]
    x = np.random.default_rng(12).standard_normal(SHAPE) * 2
    x = np.where(np.abs(x) < 0.05, 0.3, x)
    r = np.random.default_rng(13).standard_normal(SHAPE)
    w0 = np.array([0.2, -0.3, 0.1, 0.4])

    def run(point, grad=False):
        t = Tensor(scatter(point["x"], layout), requires_grad=grad)
        if name == "prelu":
            w = nn.Parameter(np.array(point["w"])) if grad else Tensor(np.array(point["w"]))
            return t, w, A.prelu(t, w)
        return t, None, _build(name, t, beta=1.5, threshold=4.0)

    def loss(point):
        return float(np.sum(run(point)[2].data.to_numpy() * r))

    point = {"x": x, "w": w0} if name == "prelu" else {"x": x}
    t, w, y = run(point, grad=True)
    y.backward(like(r, y.data))
    grads = {"x": t.grad.to_numpy()}
    if w is not None:
        grads["w"] = np.asarray(w.grad)
    directional_check(loss, point, grads, np.random.default_rng(14), name)


@guarded
def test_modules():
    from disttensor.nn import functional as F
    expect(F.gelu is A.gelu and F.prelu is A.prelu, "F.* re-exports")
    x = _x(3)
    t = Tensor(scatter(x, LAYOUTS["sample"]), requires_grad=False)
    for module, name, kw in [(nn.GELU(), "gelu", {}), (nn.GELU("tanh"), "gelu_tanh", {}),
                             (nn.SiLU(), "silu", {}), (nn.Mish(), "mish", {}),
                             (nn.Softplus(beta=0.5, threshold=2.0), "softplus",
                              dict(beta=0.5, threshold=2.0)),
                             (nn.Hardswish(), "hardswish", {}),
                             (nn.Hardsigmoid(), "hardsigmoid", {})]:
        close(module(t).data.to_numpy(), reference(name, x, **kw)[0], repr(module),
              rtol=1e-13, atol=1e-15)
    p = nn.PReLU(SHAPE[1], init=0.1, dtype="float64")
    expect(list(p.state_dict()) == ["weight"], f"state_dict keys {list(p.state_dict())}")
    expect(np.array_equal(p.weight.data, np.full(SHAPE[1], 0.1)), "PReLU init")
    close(p(t).data.to_numpy(), prelu_reference(x, np.full(SHAPE[1], 0.1), x)[0], "PReLU",
          rtol=1e-15, atol=0)
    expect(nn.PReLU().weight.shape == (1,) and float(nn.PReLU().weight.data[0]) == 0.25,
           "PReLU defaults")
    expect(repr(nn.GELU("tanh")) == "GELU(approximate='tanh')", repr(nn.GELU("tanh")))


def test_errors(comm):
    x = Tensor(scatter(_x(4), LAYOUTS["spatial"]))
    assert_raises_all(comm, ValueError, "Mismatch of parameter numbers and input channel",
                      lambda: A.prelu(x, nn.Parameter(np.ones(3))))
    assert_raises_all(comm, ValueError, "approximate argument must be either none or tanh",
                      lambda: A.gelu(x, approximate="fast"))
    assert_raises_all(comm, TypeError, "must be a Tensor holding a DistArray",
                      lambda: A.silu(np.ones(SHAPE)))
    split_c = Tensor(scatter(_x(4), ((SIZE,), (None, 0, None, None), None)))
    if SIZE > 1:
        assert_raises_all(comm, ValueError, "channel axis",
                          lambda: A.prelu(split_c, nn.Parameter(np.ones(SHAPE[1]))))
    in_step("errors")


@pytest.mark.skipif(SIZE == 1, reason="needs ranks that disagree")
def test_arguments_differ_between_ranks():
    x = scatter(_x(5), LAYOUTS["sample"])
    with mismatch("pointwise_activation_forward", "beta"):
        ops_am.softplus(x, beta=last_rank_only(2.0, 1.0))
    in_step("softplus beta")
    with mismatch("pointwise_activation_forward", "name"):
        ops_am.gelu(x, approximate=last_rank_only("tanh", "none"))
    in_step("gelu approximate")
    with mismatch("prelu_forward", "weight"):
        ops_am.prelu(x, np.ones(last_rank_only(1, SHAPE[1])))
    in_step("prelu weight")
    dt.zeros(3)  # nothing left pending
