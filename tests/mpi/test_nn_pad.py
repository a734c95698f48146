"""Padding (``disttensor.ops.pad``, ``nn.functional.pad`` and the ``nn.*Pad*d`` layers) on
``(N, C, *S)`` arrays of any sample x spatial grid with balanced, uneven and empty blocks:
constant (any value), reflect, replicate and circular, PyTorch's pad order (last axis first),
negative pads cropping; forward and gradient against the float64 NumPy re-implementation of
``tests/resampling_reference.py``, adjoint identities of the exchanges, the ownership rule
(pad cells on the first and last blocks), and bad input raising on every rank."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import resampling as R
from disttensor.ops.pad import pad_backward, pad_forward
from disttensor.testing import assert_adjoint, assert_raises_collectively

from checks import SIZE, examples, expect
from gradchecks import close, guarded, like, scatter
from test_nn_resampling import nc_layouts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import resampling_reference as ref  # noqa: E402


@st.composite
def pad_cases(draw):
    nd = draw(st.integers(1, 3))
    side = {1: 7, 2: 5, 3: 4}[nd]
    spatial = tuple(draw(st.integers(2, side)) for _ in range(nd))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) + spatial
    mode = draw(st.sampled_from(["constant", "reflect", "replicate", "circular"]))
    pads = []
    for n in spatial:
        lo = draw(st.integers(-1, n - 1))
        hi = draw(st.integers(-1, n - 1))
        kept = n + min(lo, 0) + min(hi, 0)
        limit = kept - 1 if mode == "reflect" else kept
        pads.append((min(lo, limit), min(hi, limit)))
    value = draw(st.sampled_from([None, 1.5])) if mode == "constant" else None
    return shape, mode, tuple(pads), value, draw(nc_layouts(shape)), \
        draw(st.integers(0, 2**32 - 1))


def torch_order(pads):
    out = []
    for lo, hi in reversed(pads):
        out += [lo, hi]
    return tuple(out)


@settings(max_examples=examples(20))
@given(pad_cases())
@guarded
def test_pad_forward_backward_adjoint(case):
    shape, mode, pads, value, layout, seed = case
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=shape)
    x = scatter(xg, layout)
    tp = torch_order(pads)
    y, saved = pad_forward(x, tp, mode, value)
    what = f"pad {mode} {tp} value={value} layout={layout}"
    yref = ref.pad(xg, pads, mode, 0.0 if value is None else value)
    close(y.to_numpy(), yref, f"{what} forward", atol=0)
    expect(y.local.shape == y.distribution.block_shape(y.grid.coords), f"{what}: block")
    for t in range(2, len(shape)):   # pad cells go to the first and the last block
        if x.split[t] is not None and len(x.distribution.sizes(t)) > 1:
            lo, hi = (max(p, 0) for p in pads[t - 2])
            got, was = y.distribution.sizes(t), x.distribution.restrict(
                t, max(-pads[t - 2][0], 0), shape[t] - max(-pads[t - 2][1], 0)).sizes(t)
            want = (was[0] + lo,) + was[1:-1] + (was[-1] + hi,)
            expect(got == want, f"{what}: sizes along {t}: {got} != {want}")
    dyg = rng.normal(size=yref.shape)
    dx = pad_backward(saved, like(dyg, y))
    expect(dx.distribution == x.distribution, f"{what}: dx distribution")
    close(dx.to_numpy(), ref.pad_backward(dyg, shape, pads, mode), f"{what} backward")
    assert_adjoint(lambda v: pad_forward(v, tp, mode)[0], lambda g: pad_backward(saved, g),
                   x, like(dyg, y), err_msg=what)


@guarded
def test_pad_layers_and_gradient():
    rng = np.random.default_rng(2)
    xg = rng.normal(size=(2, 2, 4, 3, 5))
    cases = ((nn.ReflectionPad3d((1, 2, 0, 1, 2, 1)), "reflect", 0.0),
             (nn.ReplicationPad3d(2), "replicate", 0.0),
             (nn.CircularPad3d((0, 1, 2, 0, 1, 1)), "circular", 0.0),
             (nn.ConstantPad3d((1, 0, 0, 2, 1, 1), -2.0), "constant", -2.0),
             (nn.ZeroPad3d(1), "constant", 0.0))
    for layer, mode, value in cases:
        x = Tensor(scatter(xg, ((SIZE,), (None, None, 0, None, None), None)),
                   requires_grad=True)
        y = layer(x)
        p = layer.padding
        pads = tuple((p[4 - 2 * i], p[5 - 2 * i]) for i in range(3))
        yref = ref.pad(xg, pads, mode, value)
        close(y.data.to_numpy(), yref, repr(layer), atol=0)
        w = rng.normal(size=yref.shape)
        nn.functional.mse_loss(y, Tensor(like(w, y.data))).backward()
        close(x.grad.to_numpy(), ref.pad_backward(2 * (yref - w) / w.size, xg.shape, pads, mode),
              f"{layer!r} gradient")
    for cls, nd in ((nn.ReflectionPad1d, 1), (nn.ReplicationPad2d, 2), (nn.ZeroPad2d, 2),
                    (nn.CircularPad1d, 1), (nn.ConstantPad2d, 2)):
        layer = cls(1, 0.5) if cls is nn.ConstantPad2d else cls(1)
        xs = rng.normal(size=(1, 2) + (4,) * nd)
        mode = {"Reflection": "reflect", "Replication": "replicate", "Zero": "constant",
                "Circular": "circular", "Constant": "constant"}[cls.__name__[:-5]]
        y = layer(Tensor(scatter(xs, ((SIZE,), (None, None, 0) + (None,) * (nd - 1), None))))
        close(y.data.to_numpy(), ref.pad(xs, ((1, 1),) * nd, mode,
                                         0.5 if cls is nn.ConstantPad2d else 0.0), repr(layer))


@guarded
def test_pad_bad_input():
    x = scatter(np.zeros((1, 2, 5, 4)), ((SIZE,), (None, None, 0, None), None))
    cases = [
        (ValueError, "less than the corresponding input dimension", ((5, 0, 0, 0), "reflect")),
        (ValueError, "wrapping around more than once", ((0, 0, 6, 0), "circular")),
        (ValueError, "divisible by 2", ((1, 1, 1), "constant")),
        (NotImplementedError, "Padding size 2 is not supported", ((1, 1), "reflect")),
        (NotImplementedError, "Unrecognised padding mode", ((1, 1, 1, 1), "zeros")),
        (TypeError, "tuple of ints", ((1.5, 1), "constant")),
        (ValueError, "crops more than", ((0, 0, -3, -3), "constant")),
    ]
    for exc, match, (p, mode) in cases:
        with assert_raises_collectively(exc, match=match):
            pad_forward(x, p, mode)
    with assert_raises_collectively(ValueError, match="doesn't take in value"):
        R.pad(Tensor(x), (1, 1, 1, 1), mode="reflect", value=1.0)
    with assert_raises_collectively(ValueError, match="expected 2D or 3D input"):
        nn.ReflectionPad1d(1)(Tensor(x))
