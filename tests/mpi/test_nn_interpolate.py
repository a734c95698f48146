"""Interpolation (``disttensor.ops.resample``, ``nn.functional.interpolate``/``upsample``,
``nn.Upsample``) on ``(N, C, *S)`` arrays of any sample x spatial grid with balanced, uneven
and empty blocks: nearest, nearest-exact, (bi/tri)linear with either ``align_corners``, area;
``size=`` and fractional per-axis ``scale_factor=`` (with ``recompute_scale_factor``), forward
and gradient against the float64 NumPy re-implementation of ``tests/resampling_reference.py``,
adjoint identities, integer factors keeping the input's blocks times the factor, and bad input
(PyTorch's checks) raising on every rank -- ``interpolate(x, 1.5)`` among them."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import resampling as R
from disttensor.ops.resample import interpolate_backward, interpolate_forward
from disttensor.testing import assert_adjoint, assert_raises_collectively

from checks import SIZE, examples, expect
from gradchecks import close, guarded, like, scatter
from test_nn_resampling import nc_layouts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import resampling_reference as ref  # noqa: E402

LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


@st.composite
def interp_cases(draw):
    nd = draw(st.integers(1, 3))
    side = {1: 8, 2: 5, 3: 4}[nd]
    spatial = tuple(draw(st.integers(1, side)) for _ in range(nd))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) + spatial
    mode = draw(st.sampled_from(["nearest", "nearest-exact", LINEAR[nd], "area"]))
    align = draw(st.sampled_from([None, False, True])) if mode == LINEAR[nd] else None
    recompute = None
    if draw(st.booleans()):
        size = tuple(draw(st.integers(1, 2 * n + 2)) for n in spatial)
        size = size if nd > 1 or draw(st.booleans()) else size[0]
        args = dict(size=size)
    else:
        sf = [draw(st.sampled_from([0.5, 0.75, 1.0, 1.3, 1.5, 2.1, 2.5, 3.0])) for _ in spatial]
        spatial_ok = all(math.floor(n * s) > 0 for n, s in zip(spatial, sf))
        if not spatial_ok:
            sf = [max(s, 1.0) for s in sf]
        scale = tuple(sf) if nd > 1 or draw(st.booleans()) else sf[0]
        recompute = draw(st.sampled_from([None, True]))
        args = dict(scale_factor=scale, recompute_scale_factor=recompute)
    return shape, mode, align, args, draw(nc_layouts(shape)), draw(st.integers(0, 2**32 - 1))


def _expected(shape, mode, align, args):
    nd = len(shape) - 2
    if "size" in args:
        s = args["size"]
        out = tuple(s) if isinstance(s, tuple) else (s,) * nd
        sfs = None
    else:
        s = args["scale_factor"]
        sfs = tuple(s) if isinstance(s, tuple) else (s,) * nd
        out = tuple(math.floor(n * f) for n, f in zip(shape[2:], sfs))
        sfs = None if args.get("recompute_scale_factor") else sfs
    base = "linear" if mode in LINEAR.values() else mode
    return base, out, sfs, bool(align)


@settings(max_examples=examples(15))
@given(interp_cases())
@guarded
def test_interpolate_forward_backward_adjoint(case):
    shape, mode, align, args, layout, seed = case
    rng = np.random.default_rng(seed)
    xg = rng.normal(size=shape)
    x = scatter(xg, layout)
    y, saved = interpolate_forward(x, mode=mode, align_corners=align, **args)
    base, out, sfs, ac = _expected(shape, mode, align, args)
    what = f"interpolate {mode} align={align} {args} layout={layout}"
    if base == "area":
        yref = ref.adaptive_avg(xg, out)
    else:
        yref = ref.interpolate(xg, out, base, sfs, ac)
    close(y.to_numpy(), yref, f"{what} forward")
    expect(y.local.shape == y.distribution.block_shape(y.grid.coords), f"{what}: block")
    dyg = rng.normal(size=yref.shape)
    dx = interpolate_backward(saved, like(dyg, y))
    expect(dx.distribution == x.distribution, f"{what}: dx distribution")
    dref = ref.adaptive_avg_backward(dyg, shape) if base == "area" else \
        ref.interpolate_backward(dyg, shape, base, sfs, ac)
    close(dx.to_numpy(), dref, f"{what} backward")
    assert_adjoint(lambda v: interpolate_forward(v, mode=mode, align_corners=align, **args)[0],
                   lambda g: interpolate_backward(saved, g), x, like(dyg, y), err_msg=what)


@settings(max_examples=examples(10))
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from(["nearest", "linear"]),
       st.data())
@guarded
def test_integer_factor_keeps_blocks_times_factor(nd, f, mode, data):
    shape = (2, 2) + (4,) * nd
    layout = data.draw(nc_layouts(shape))
    x = scatter(np.random.default_rng(f).normal(size=shape), layout)
    mode = LINEAR[nd] if mode == "linear" else mode
    y = R.interpolate(Tensor(x), scale_factor=f, mode=mode).data
    for t in range(2, 2 + nd):
        if x.split[t] is not None:
            want = tuple(v * f for v in x.distribution.sizes(t))
            expect(y.distribution.sizes(t) == want, f"axis {t}: {y.distribution.sizes(t)}")


@guarded
def test_silent_bug_fractional_scale_and_size_positional():
    """Issue 19 (5a): ``interpolate(x, 1.5)`` failed with "'float' object is not iterable".
    PyTorch reads the second argument as ``size`` (ints only): a clear TypeError on every
    rank; ``scale_factor=1.5`` resamples 5 -> 7 cells."""
    xg = np.random.default_rng(1).normal(size=(2, 3, 5))
    x = Tensor(scatter(xg, ((SIZE,), (None, None, 0), None)), requires_grad=True)
    with assert_raises_collectively(TypeError, match="output size must be ints"):
        nn.functional.interpolate(x, 1.5)
    y = nn.functional.interpolate(x, scale_factor=1.5, mode="linear")
    close(y.data.to_numpy(), ref.interpolate(xg, (7,), "linear", (1.5,)), "scale 1.5")
    y2 = nn.functional.interpolate(x, 7)   # size 7, nearest
    close(y2.data.to_numpy(), ref.interpolate(xg, (7,), "nearest"), "size 7")


@guarded
def test_upsample_layers_gradient():
    rng = np.random.default_rng(5)
    xg = rng.normal(size=(2, 2, 3, 4))
    for layer, mode, ac in ((nn.Upsample(size=(5, 6), mode="bilinear", align_corners=True),
                             "linear", True),
                            (nn.UpsamplingBilinear2d(scale_factor=2), "linear", True),
                            (nn.UpsamplingNearest2d(size=(7, 3)), "nearest", False)):
        x = Tensor(scatter(xg, ((SIZE,), (None, None, 0, None), None)), requires_grad=True)
        y = layer(x)
        out = y.data.shape[2:]
        sfs = (2.0, 2.0) if isinstance(layer, nn.UpsamplingBilinear2d) else None
        close(y.data.to_numpy(), ref.interpolate(xg, out, mode, sfs, ac), repr(layer))
        w = rng.normal(size=y.data.shape)
        loss = nn.functional.mse_loss(y, Tensor(like(w, y.data)))
        loss.backward()
        dy = 2 * (ref.interpolate(xg, out, mode, sfs, ac) - w) / w.size
        close(x.grad.to_numpy(), ref.interpolate_backward(dy, xg.shape, mode, sfs, ac),
              f"{layer!r} gradient")


@guarded
def test_interpolate_bad_input():
    x = scatter(np.zeros((1, 2, 5, 4)), ((SIZE,), (None, None, 0, None), None))
    cases = [
        (ValueError, "only one of size or scale_factor", dict(size=3, scale_factor=2)),
        (ValueError, "either size or scale_factor", {}),
        (ValueError, "same number of spatial dimensions", dict(size=(2, 3, 4))),
        (ValueError, "same number of spatial dimensions", dict(scale_factor=(2.0,))),
        (ValueError, "align_corners option can only be set",
         dict(size=3, mode="nearest", align_corners=True)),
        (NotImplementedError, "trilinear mode needs 5D input", dict(size=3, mode="trilinear")),
        (NotImplementedError, "not supported", dict(size=3, mode="bicubic")),
        (RuntimeError, "greater than 0", dict(scale_factor=0.1)),
        (ValueError, "Anti-alias", dict(size=3, mode="bilinear", antialias=True)),
    ]
    for exc, match, kw in cases:
        with assert_raises_collectively(exc, match=match):
            interpolate_forward(x, **kw)



@guarded
def test_nearest_scale_rules_by_rank():
    """PyTorch's 2-D nearest kernel copies an axis whose extent is unchanged and halves the
    index of a doubled one whatever the scale factor; its 1-D and 3-D kernels index with
    ``floor(o / scale)`` (``3 * 1.3 -> 3`` cells: 0, 0, 1)."""
    rng = np.random.default_rng(11)
    for shape, sf in (((2, 2, 3), 1.3), ((2, 2, 3, 3), (1.3, 2.1)), ((1, 2, 3, 2, 3), 1.3)):
        nd = len(shape) - 2
        xg = rng.normal(size=shape)
        x = scatter(xg, ((SIZE,), (None, None, 0) + (None,) * (nd - 1), None))
        y = R.interpolate(Tensor(x), scale_factor=sf).data
        sfs = sf if isinstance(sf, tuple) else (sf,) * nd
        out = tuple(math.floor(n * f) for n, f in zip(shape[2:], sfs))
        close(y.to_numpy(), ref.interpolate(xg, out, "nearest", sfs), f"nearest {shape} {sf}")
