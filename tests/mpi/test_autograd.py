"""The autograd layer under MPI: every differentiable function of
:mod:`disttensor.autograd.math` and of :mod:`disttensor.nn.functional`, and the backward
engine (gradient accumulation, ``no_grad``, ``detach``, ``retain_graph``, grad-ready hooks).

1. ``autograd.math`` on random layouts of :mod:`strategies` (uneven and empty blocks, operands
   on grids of different shapes): forward against NumPy, each input's gradient against the
   analytic NumPy gradient of ``sum(f(x) * r)`` (and distributed exactly like its input, or
   a replicated NumPy array for a replicated input), plus central differences of that loss
   along random directions (float64).
2. The engine: a tensor used several times (``x * x + x``, a skip connection), ``no_grad``,
   ``detach``, ``retain_graph``, errors, and grad-ready hooks (once per leaf per backward).
3. Every op of ``nn.functional``: gradients with respect to the input and the parameters by
   central differences along random directions, on a sample split, a spatial split and an
   uneven (empty blocks) or hybrid sample x spatial layout; again with the parameters' sums
   deferred to a :class:`~disttensor.nn.GradientReducer` (per-rank shares, bucketed
   all-reduce), which must give the same gradients.

Every rank draws the same examples and makes the same collective calls; checks are recorded
locally and settled with one collective assertion per example (:mod:`checks`).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from disttensor import autograd as ag
from disttensor.autograd import Function, Tensor, enable_grad, is_grad_enabled, no_grad
from disttensor.nn import GradientReducer
from disttensor.nn import functional as F

from checks import COMM, SIZE, examples, expect, grid
from conftest import assert_raises_all
from gradchecks import close, directional_check, guarded, like, scatter, value_of
from disttensor.testing.strategies import layouts

RTOL = 1e-12
ATOL = 1e-12


# -- the generic check -------------------------------------------------------------------------
# An input is (kind, global value, layout, requires_grad):
#   "dist"  a Tensor holding a DistArray scattered as layout
#   "rep"   a Tensor holding a replicated NumPy array
#   "num"   a Python number (never differentiated)
#   "raw"   a plain DistArray (labels), never differentiated


def make_inputs(inputs, point=None, requires=True):
    out = {}
    for name, (kind, value, layout, req) in inputs.items():
        v = point[name] if point is not None and name in point else value
        if kind == "dist":
            out[name] = Tensor(scatter(v, layout), requires_grad=req and requires)
        elif kind == "rep":
            out[name] = Tensor(np.array(v, dtype=np.float64), requires_grad=req and requires)
        elif kind == "raw":
            out[name] = scatter(v, layout)
        else:
            out[name] = v
    return out


def output_gradient(y, rng):
    """A random gradient for the output ``y`` (distributed like it) and its global value."""
    shape = np.shape(value_of(y)) if not isinstance(y.data, dt.DistArray) else y.shape
    if isinstance(y.data, dt.DistArray):
        r = rng.standard_normal(shape)
        return like(r, y.data), r
    if isinstance(y.data, float):
        r = float(rng.standard_normal())
        return r, r
    r = rng.standard_normal(shape)
    return r.copy(), r


def check_function(build, inputs, what, seed, want_y=None, want_grads=None, ndir=2,
                   rtol=RTOL, atol=ATOL, fd_rtol=1e-6):
    """Run ``y = build(tensors)``, backward a random ``r`` (distributed like ``y``), check
    the forward against ``want_y``, each gradient's kind and layout, its value against
    ``want_grads(r)`` (``{name: global array}``, when given) and against central differences
    of ``sum(build(.) * r)``.  Returns ``(tensors, {name: gathered gradient}, y, r)``."""
    rng = np.random.default_rng(seed)
    ts = make_inputs(inputs)
    y = build(ts)
    expect(isinstance(y, Tensor), f"{what}: returned {type(y).__name__}, not a Tensor")
    yv = value_of(y)
    if want_y is not None:
        close(yv, want_y, f"{what} forward", rtol=rtol, atol=atol)
    any_dist = any(k == "dist" for k, *_ in inputs.values())
    if any_dist:
        expect(isinstance(y.data, (dt.DistArray, float)),
               f"{what}: output of DistArray inputs is a {type(y.data).__name__}")
    expect(y.requires_grad and y.node is not None, f"{what}: output not recorded")
    g_out, r = output_gradient(y, rng)
    y.backward(g_out)
    want = want_grads(r) if want_grads is not None else {}
    grads = {}
    for name, (kind, value, layout, req) in inputs.items():
        if kind in ("num", "raw"):
            continue
        t = ts[name]
        if not req:
            expect(t.grad is None, f"{what}: {name} does not require grad but got one")
            continue
        g = t.grad
        if g is None:
            expect(False, f"{what}: no gradient for {name}")
            continue
        if kind == "dist":
            ok = isinstance(g, dt.DistArray)
            expect(ok and g.distribution == t.data.distribution
                   and g.grid.dims == t.data.grid.dims,
                   f"{what}: gradient of {name} is "
                   f"{g.distribution if ok else type(g).__name__}, not distributed like its "
                   f"input {t.data.distribution}")
            if not ok:
                continue
            expect(tuple(g.local.shape) == g.distribution.block_shape(g.grid.coords),
                   f"{what}: gradient of {name}: local block {g.local.shape}")
            gv = g.to_numpy()
        else:
            expect(isinstance(g, np.ndarray) and g.shape == np.shape(value)
                   and g.dtype == np.float64,
                   f"{what}: gradient of replicated {name} is {type(g).__name__} "
                   f"{getattr(g, 'shape', None)} {getattr(g, 'dtype', None)}")
            gv = np.asarray(g)
        if name in want:
            close(gv, want[name], f"{what} gradient of {name}", rtol=1e-10, atol=1e-11)
        grads[name] = gv

    def loss(point):
        with no_grad():
            out = build(make_inputs(inputs, point, requires=False))
        return float(np.sum(value_of(out) * r))

    point = {name: np.asarray(inputs[name][1], dtype=np.float64) for name in grads}
    if grads:
        directional_check(loss, point, grads, rng, what, ndir=ndir, rtol=fd_rtol)
    return ts, grads, y, r


def unbroadcast(g, shape):
    """NumPy: sum ``g`` down to ``shape`` (the adjoint of broadcasting)."""
    g = np.asarray(g)
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape) if axes else g.reshape(shape)


def away_from_zero(rng, shape, low=0.5, high=2.0):
    return rng.uniform(low, high, size=shape) * rng.choice([-1.0, 1.0], size=shape)


# == 1. autograd.math ==========================================================================
BINARY = {"add": (ag.add, np.add, lambda a, b: a + b),
          "subtract": (ag.subtract, np.subtract, lambda a, b: a - b),
          "multiply": (ag.multiply, np.multiply, lambda a, b: a * b),
          "divide": (ag.divide, np.true_divide, lambda a, b: a / b)}


@st.composite
def binary_cases(draw):
    nd = draw(st.integers(1, 3))
    full = [draw(st.integers(0, 5)) for _ in range(nd)]
    ashape, bshape = [], []
    for n in full:
        k = draw(st.sampled_from(["both", "both", "a1", "b1"]))
        ashape.append(1 if k == "a1" else n)
        bshape.append(1 if k == "b1" else n)
    drop = draw(st.integers(0, nd - 1))
    if draw(st.booleans()):
        ashape = ashape[drop:]
    else:
        bshape = bshape[drop:]
    akind = draw(st.sampled_from(["dist", "dist", "rep"]))
    bkind = draw(st.sampled_from(["dist", "rep", "num"] if akind == "dist" else ["dist"]))
    if bkind == "num":
        bshape = []
    alay = draw(layouts(tuple(ashape), SIZE)) if akind == "dist" else None
    blay = draw(layouts(tuple(bshape), SIZE)) if bkind == "dist" else None
    breq = bkind != "num" and draw(st.booleans())
    return dict(op=draw(st.sampled_from(sorted(BINARY))), ashape=tuple(ashape),
                bshape=tuple(bshape), akind=akind, bkind=bkind, alay=alay, blay=blay,
                breq=breq, swap=draw(st.booleans()),
                style=draw(st.sampled_from(["function", "operator"])),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=examples(25))
@given(binary_cases())
@guarded
def test_binary_broadcasting(case):
    """add/subtract/multiply/divide between DistArrays of different layouts and grids,
    DistArrays and replicated arrays, and Python scalars on either side; broadcast axes are
    summed out of the gradient and each gradient has its input's layout."""
    rng = np.random.default_rng(case["seed"])
    op = case["op"]
    fn, npfn, operator = BINARY[op]
    a = rng.standard_normal(case["ashape"])
    if case["bkind"] == "num":
        b = float(away_from_zero(rng, ()))
    else:
        b = away_from_zero(rng, case["bshape"]) if op == "divide" else \
            rng.standard_normal(case["bshape"])
    if op == "divide" and case["swap"]:  # a is the denominator
        a = away_from_zero(rng, case["ashape"])
    inputs = {"a": (case["akind"], a, case["alay"], True),
              "b": (case["bkind"], b, case["blay"], case["breq"])}
    swap = case["swap"]

    def build(ts):
        left, right = (ts["b"], ts["a"]) if swap else (ts["a"], ts["b"])
        return operator(left, right) if case["style"] == "operator" else fn(left, right)

    left, right = (b, a) if swap else (a, b)
    want_y = npfn(left, right)

    def want_grads(r):
        if op == "add":
            gl, gr = r, r
        elif op == "subtract":
            gl, gr = r, -r
        elif op == "multiply":
            gl, gr = r * right, r * left
        else:
            gl, gr = r / right, -r * left / np.square(right)
        ga, gb = (gr, gl) if swap else (gl, gr)
        out = {"a": unbroadcast(ga, np.shape(a))}
        if case["bkind"] != "num":
            out["b"] = unbroadcast(gb, np.shape(b))
        return out

    check_function(build, inputs, f"{op} {case}", case["seed"], want_y, want_grads)


UNARY = {
    "negative": (ag.negative, lambda t: -t, np.negative, lambda x: -np.ones_like(x), "any"),
    "exp": (ag.exp, lambda t: t.exp(), np.exp, np.exp, "any"),
    "log": (ag.log, lambda t: t.log(), np.log, lambda x: 1 / x, "positive"),
    "sqrt": (ag.sqrt, lambda t: t.sqrt(), np.sqrt, lambda x: 0.5 / np.sqrt(x), "positive"),
    "absolute": (ag.absolute, lambda t: t.abs(), np.absolute, np.sign, "nonzero"),
}
POWERS = {2: "any", 3: "any", -1: "nonzero", 0.5: "positive", 1.5: "positive", -2.5: "positive"}


@st.composite
def unary_cases(draw):
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
    kind = draw(st.sampled_from(["dist", "dist", "rep"]))
    name = draw(st.sampled_from(sorted(UNARY) + ["power"]))
    p = draw(st.sampled_from(sorted(POWERS))) if name == "power" else None
    return dict(shape=shape, kind=kind, name=name, p=p,
                layout=draw(layouts(shape, SIZE)) if kind == "dist" else None,
                style=draw(st.sampled_from(["function", "method"])),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=examples(20))
@given(unary_cases())
@guarded
def test_unary(case):
    """negative, exp, log, sqrt, absolute and power (constant exponents) of distributed and
    replicated tensors."""
    rng = np.random.default_rng(case["seed"])
    name, p = case["name"], case["p"]
    if name == "power":
        domain = POWERS[p]

        def fn(t):
            return ag.power(t, p) if case["style"] == "function" else t ** p
        npfn, dfn = (lambda x: np.power(x, p)), (lambda x: p * np.power(x, p - 1))
    else:
        f, method, npfn, dfn, domain = UNARY[name]
        fn = f if case["style"] == "function" else method
    shape = case["shape"]
    x = {"any": lambda: rng.standard_normal(shape),
         "positive": lambda: rng.uniform(0.5, 2.0, size=shape),
         "nonzero": lambda: away_from_zero(rng, shape, 0.3, 2.0)}[domain]()
    inputs = {"x": (case["kind"], x, case["layout"], True)}
    check_function(lambda ts: fn(ts["x"]), inputs, f"{name} {case}", case["seed"], npfn(x),
                   lambda r: {"x": r * dfn(x)})


@guarded
def test_transpose_spellings():
    """``t.transpose()``, ``t.transpose(None)``, ``t.transpose((1, 0))``, ``t.transpose(1, 0)``
    and, for a 1-d tensor, ``t.transpose(-1)`` (NumPy's spellings)."""
    rng = np.random.default_rng(3)
    for shape, spellings in (((4, 3), [(), (None,), ((1, 0),), (1, 0), (-1, -2)]),
                             ((5,), [(), (0,), (-1,), ((0,),)])):
        xg = rng.standard_normal(shape)
        for args in spellings:
            x = Tensor(scatter(xg, ((SIZE,), (0,) + (None,) * (len(shape) - 1), None)),
                       requires_grad=True)
            y = x.transpose(*args)
            close(y.numpy(), xg.T, f"transpose{args} forward")
            r = rng.standard_normal(xg.T.shape)
            y.backward(like(r, y.data))
            close(x.grad.to_numpy(), r.T, f"transpose{args} gradient")


@guarded
def test_zero_dim_results():
    """Integer indexing down to a 0-d DistArray, arithmetic on it and backward() with the
    default gradient of 1."""
    rng = np.random.default_rng(4)
    xg = rng.standard_normal((4, 3))
    x = Tensor(scatter(xg, ((SIZE,), (0, None), None)), requires_grad=True)
    y = x[3, 2] * 3.0 + x[0, -1] * x[0, -1] + (x * 2)[1][0]
    expect(y.shape == (), f"shape {y.shape}")
    close(float(y.item()), xg[3, 2] * 3 + xg[0, -1] ** 2 + 2 * xg[1, 0], "0-d forward")
    y.backward()
    want = np.zeros_like(xg)
    want[3, 2] = 3
    want[0, -1] = 2 * xg[0, -1]
    want[1, 0] = 2
    close(x.grad.to_numpy(), want, "0-d backward")


def test_power_rejects_tensor_exponent():
    x = Tensor(dt.from_global(np.ones((3, 2)), grid=grid((SIZE,))), requires_grad=True)
    assert_raises_all(COMM, TypeError, "exponent", lambda: ag.power(x, Tensor(np.ones(()))))


@st.composite
def reduction_cases(draw):
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
    nd = len(shape)
    axis = draw(st.one_of(
        st.none(),
        st.integers(-nd, nd - 1),
        st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True).map(tuple)))
    kind = draw(st.sampled_from(["dist", "dist", "rep"]))
    if draw(st.booleans()):  # mean of an empty selection is NaN: keep sides >= 1 then
        name = "mean"
        shape = tuple(max(n, 1) for n in shape)
    else:
        name = "sum"
    return dict(shape=shape, axis=axis, keepdims=draw(st.booleans()), kind=kind, name=name,
                layout=draw(layouts(shape, SIZE)) if kind == "dist" else None,
                style=draw(st.sampled_from(["function", "method"])),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=examples(20))
@given(reduction_cases())
@guarded
def test_reductions(case):
    """sum and mean over no axis (a Python float, the same on every rank), one axis
    (negative too) or several, with and without keepdims."""
    rng = np.random.default_rng(case["seed"])
    shape, axis, keep, name = case["shape"], case["axis"], case["keepdims"], case["name"]
    x = rng.standard_normal(shape)
    npfn = np.sum if name == "sum" else np.mean

    def build(ts):
        t = ts["x"]
        if case["style"] == "method":
            return getattr(t, name)(axis=axis, keepdims=keep)
        return getattr(ag, name)(t, axis, keep)

    nd = len(shape)
    axes = tuple(range(nd)) if axis is None else \
        tuple(sorted(a % nd for a in ((axis,) if isinstance(axis, int) else axis)))
    count = int(np.prod([shape[a] for a in axes])) if axes else 1

    def want_grads(r):
        kshape = tuple(1 if i in axes else n for i, n in enumerate(shape))
        g = np.broadcast_to(np.reshape(r, kshape), shape)
        return {"x": g / count if name == "mean" else g.copy()}

    what = f"{name} {case}"
    ts, _, y, _ = check_function(build, {"x": (case["kind"], x, case["layout"], True)}, what,
                                 case["seed"], npfn(x, axis=axis, keepdims=keep), want_grads)
    if axis is None and not keep:
        expect(isinstance(y.data, float), f"{what}: full reduction gave {type(y.data).__name__}"
                                          ", not a Python float")
        vals = COMM.allgather(y.data)
        expect(all(v == vals[0] for v in vals), f"{what}: full reduction differs by rank {vals}")


def reshape_targets(shape):
    a, b, c = shape
    return [(a * b, c), (a, b * c), (-1,), (a * b * c,), (1, a, b * c), (c, a, b), (a, b, c, 1),
            (a * b, 1, c)]


@st.composite
def reshape_cases(draw):
    shape = tuple(draw(st.integers(1, 4)) for _ in range(3))
    target = draw(st.sampled_from(reshape_targets(shape)))
    kind = draw(st.sampled_from(["dist", "dist", "rep"]))
    return dict(shape=shape, target=target, kind=kind,
                layout=draw(layouts(shape, SIZE)) if kind == "dist" else None,
                style=draw(st.sampled_from(["function", "method", "method-args"])),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=examples(15))
@given(reshape_cases())
@guarded
def test_reshape(case):
    """reshape merging and splitting axes (locally or with a redistribution); the gradient
    comes back in the input's distribution."""
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["shape"])
    target = case["target"]

    def build(ts):
        if case["style"] == "function":
            return ag.reshape(ts["x"], target)
        if case["style"] == "method":
            return ts["x"].reshape(target)
        return ts["x"].reshape(*target)

    check_function(build, {"x": (case["kind"], x, case["layout"], True)}, f"reshape {case}",
                   case["seed"], x.reshape(target), lambda r: {"x": r.reshape(x.shape)})


@st.composite
def transpose_cases(draw):
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(0, 4)) for _ in range(nd))
    axes = draw(st.one_of(st.none(), st.permutations(range(nd)).map(tuple)))
    if axes is not None and draw(st.booleans()):
        axes = tuple(a - nd for a in axes)  # negative axes
    kind = draw(st.sampled_from(["dist", "dist", "rep"]))
    return dict(shape=shape, axes=axes, kind=kind,
                layout=draw(layouts(shape, SIZE)) if kind == "dist" else None,
                style=draw(st.sampled_from(["function", "method", "T"])),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=examples(15))
@given(transpose_cases())
@guarded
def test_transpose(case):
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["shape"])
    axes = case["axes"]
    style = "function" if case["style"] == "T" and axes is not None else case["style"]

    def build(ts):
        if style == "T":
            return ts["x"].T
        if style == "method":
            return ts["x"].transpose(*axes) if axes is not None else ts["x"].transpose()
        return ag.transpose(ts["x"], axes)

    inv = np.argsort([a % x.ndim for a in axes]) if axes is not None else None
    check_function(build, {"x": (case["kind"], x, case["layout"], True)},
                   f"transpose {case}", case["seed"], np.transpose(x, axes),
                   lambda r: {"x": np.transpose(r, inv)})


@st.composite
def index_keys(draw, shape):
    nkey = draw(st.integers(1, len(shape)))
    key = []
    for n in shape[:nkey]:
        if n and draw(st.integers(0, 3)) == 0:
            key.append(draw(st.integers(-n, n - 1)))
        else:
            step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
            start = draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            stop = draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            key.append(slice(start, stop, step))
    if draw(st.booleans()) and nkey < len(shape):
        key.append(Ellipsis)
    return tuple(key)


@st.composite
def getitem_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    key = draw(index_keys(shape))
    kind = draw(st.sampled_from(["dist", "dist", "rep"]))
    return dict(shape=shape, key=key, kind=kind,
                layout=draw(layouts(shape, SIZE)) if kind == "dist" else None,
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=examples(20))
@given(getitem_cases())
@guarded
def test_getitem(case):
    """Indexing with slices (steps, negative steps, out-of-range bounds), integers and
    Ellipsis: the gradient is the output gradient at the selected cells, zero elsewhere."""
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["shape"])
    key = case["key"]

    def want_grads(r):
        g = np.zeros_like(x)
        g[key] = r
        return {"x": g}

    check_function(lambda ts: ts["x"][key], {"x": (case["kind"], x, case["layout"], True)},
                   f"getitem {case}", case["seed"], x[key], want_grads)


@st.composite
def concat_cases(draw):
    nd = draw(st.integers(1, 3))
    base = [draw(st.integers(1, 4)) for _ in range(nd)]
    axis = draw(st.integers(-nd, nd - 1))
    k = draw(st.integers(1, 3))
    shapes = []
    for _ in range(k):
        s = list(base)
        s[axis % nd] = draw(st.integers(0, 4))
        shapes.append(tuple(s))
    lays = [draw(layouts(s, SIZE)) for s in shapes]
    reqs = [draw(st.booleans()) for _ in range(k)]
    reqs[0] = True
    return dict(shapes=shapes, axis=axis, layouts=lays, reqs=reqs,
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=examples(15))
@given(concat_cases())
@guarded
def test_concatenate(case):
    """concatenate of DistArray tensors on different layouts/grids; each gradient is the
    matching slab of the output gradient, in its operand's distribution."""
    rng = np.random.default_rng(case["seed"])
    xs = [rng.standard_normal(s) for s in case["shapes"]]
    names = [f"x{i}" for i in range(len(xs))]
    inputs = {n: ("dist", x, lay, req)
              for n, x, lay, req in zip(names, xs, case["layouts"], case["reqs"])}
    axis = case["axis"]

    def want_grads(r):
        out, start = {}, 0
        ax = axis % r.ndim
        for n, x in zip(names, xs):
            sl = (slice(None),) * ax + (slice(start, start + x.shape[ax]),)
            out[n] = r[sl]
            start += x.shape[ax]
        return out

    check_function(lambda ts: ag.concatenate([ts[n] for n in names], axis=axis), inputs,
                   f"concatenate {case}", case["seed"], np.concatenate(xs, axis=axis),
                   want_grads)


@st.composite
def redistribute_cases(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    return dict(shape=shape, src=draw(layouts(shape, SIZE)), dst=draw(layouts(shape, SIZE)),
                style=draw(st.sampled_from(["function", "method"])),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=examples(15))
@given(redistribute_cases())
@guarded
def test_redistribute(case):
    """redistribute to any layout (another grid shape too): values unchanged, the gradient
    comes back in the source distribution, and the output has the requested one."""
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["shape"])
    dims, split, sizes = case["dst"]
    kw = dict(grid=grid(dims), split=split, sizes=None if sizes is None else list(sizes))

    def build(ts):
        if case["style"] == "function":
            return ag.redistribute(ts["x"], **kw)
        return ts["x"].redistribute(**kw)

    what = f"redistribute {case}"
    _, _, y, _ = check_function(build, {"x": ("dist", x, case["src"], True)}, what,
                                case["seed"], x, lambda r: {"x": r})
    want = dt.Distribution(x.shape, dims, split, kw["sizes"])
    expect(y.data.distribution == want, f"{what}: output {y.data.distribution} != {want}")


@guarded
def test_math_chain_mixed_kinds():
    """A chain mixing every kind: ``mean(exp(a * w - b / 2) ** 2, axis=0)[::2].sum() +
    (w * w).sum()`` with a distributed, w replicated, b distributed on another grid."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((5, 4, 3)) * 0.5
    w = rng.standard_normal((4, 1)) * 0.5
    b = rng.standard_normal((5, 1, 3))
    la = ((SIZE,), (0, None, None), None)
    lb = ((1, SIZE), (None, None, 1), None)
    inputs = {"a": ("dist", a, la, True), "w": ("rep", w, None, True),
              "b": ("dist", b, lb, True)}

    def build(ts):
        h = ag.exp(ts["a"] * ts["w"] - ts["b"] / 2) ** 2
        return ag.mean(h, axis=0)[::2].sum() + (ts["w"] * ts["w"]).sum()

    def fnp(a, w, b):
        return (np.exp(a * w - b / 2) ** 2).mean(axis=0)[::2].sum() + (w * w).sum()

    def want_grads(r):
        e2 = np.exp(a * w - b / 2) ** 2
        sel = np.zeros((4, 3))
        sel[::2] = 1
        dh = np.broadcast_to(sel / 5, a.shape) * 2 * e2 * r
        return {"a": dh * w, "w": (dh * a).sum(axis=(0, 2)).reshape(4, 1) + 2 * w * r,
                "b": (-dh / 2).sum(axis=1, keepdims=True)}

    check_function(build, inputs, "chain", 12, fnp(a, w, b), want_grads)


# == 2. the engine =============================================================================
def _x(shape=(5, 4), seed=0, layout=None):
    rng = np.random.default_rng(seed)
    xg = rng.standard_normal(shape)
    layout = ((SIZE,), (0,) + (None,) * (len(shape) - 1), None) if layout is None else layout
    return xg, Tensor(scatter(xg, layout), requires_grad=True)


@guarded
def test_tensor_used_twice_accumulates():
    """``x * x + x``: the contributions of the three uses add up (2x + 1); a skip connection
    ``h = a(x); out = b(h) + h`` sums the gradient of a non-leaf from two consumers."""
    xg, _ = _x()
    lay = ((SIZE,), (0, None), (tuple([1] + [0] * (SIZE - 2) + [4]) if SIZE > 1 else None,
                                None))
    inputs = {"x": ("dist", xg, lay, True)}
    check_function(lambda ts: ts["x"] * ts["x"] + ts["x"], inputs, "x*x+x", 1, xg * xg + xg,
                   lambda r: {"x": r * (2 * xg + 1)})
    w = np.random.default_rng(2).standard_normal(4)
    inputs = {"x": ("dist", xg, lay, True), "w": ("rep", w, None, True)}

    def skip(ts):
        h = ts["x"] * ts["w"]
        return ag.exp(h) * 0.5 + h

    def want(r):
        dh = r * (0.5 * np.exp(xg * w) + 1)
        return {"x": dh * w, "w": (dh * xg).sum(axis=0)}

    check_function(skip, inputs, "skip connection", 3, 0.5 * np.exp(xg * w) + xg * w, want)


@guarded
def test_no_grad_and_detach():
    xg, x = _x()
    expect(is_grad_enabled(), "gradients not recorded by default")
    with no_grad():
        expect(not is_grad_enabled(), "no_grad did not switch recording off")
        y = x * 2 + 1
        with enable_grad():
            expect(is_grad_enabled(), "enable_grad inside no_grad")
            z = x * 3
    expect(is_grad_enabled(), "no_grad did not restore recording")
    expect(not y.requires_grad and y.node is None, "no_grad recorded a node")
    expect(z.requires_grad and z.node is not None, "enable_grad did not record")
    close(y.numpy(), xg * 2 + 1, "no_grad forward")
    assert_raises_all(COMM, RuntimeError, "does not require grad", lambda: y.sum().backward())
    # detach: the same data, cut from the graph
    d = x.detach()
    expect(d.data is x.data and not d.requires_grad and d.is_leaf, "detach")
    loss = (x * d).sum()  # d is a constant: gradient x, not 2x
    loss.backward()
    close(x.grad.to_numpy(), xg, "gradient through a detached factor")
    expect(d.grad is None, "a detached tensor received a gradient")


@guarded
def test_retain_graph():
    xg, x = _x()
    w = Tensor(np.random.default_rng(5).standard_normal(4), requires_grad=True)
    loss = ((x * w).exp() * x).sum()
    loss.backward(retain_graph=True)
    gx1, gw1 = x.grad.to_numpy(), w.grad.copy()
    loss.backward()  # the graph was kept: the gradients double
    close(x.grad.to_numpy(), 2 * gx1, "x.grad after a second backward with retain_graph")
    close(w.grad, 2 * gw1, "w.grad after a second backward with retain_graph")
    assert_raises_all(COMM, RuntimeError, "retain_graph", lambda: loss.backward())
    e = np.exp(xg * w.data)
    close(gx1, e * (1 + xg * w.data), "x.grad")
    close(gw1, (e * xg * xg).sum(axis=0), "w.grad")
    # without retain_graph the first backward frees the graph
    x.grad = None
    loss2 = (x * x).sum()
    loss2.backward()
    assert_raises_all(COMM, RuntimeError, "retain_graph", lambda: loss2.backward())
    close(x.grad.to_numpy(), 2 * xg, "x.grad after the failed second backward")


@guarded
def test_backward_errors():
    _, x = _x()
    y = x * 2
    assert_raises_all(COMM, RuntimeError, "scalar", lambda: y.backward())
    assert_raises_all(COMM, RuntimeError, "does not require grad",
                      lambda: Tensor(x.data).backward())
    assert_raises_all(COMM, RuntimeError, "leaf", lambda: y.requires_grad_(False))
    assert_raises_all(COMM, RuntimeError, "leaf",
                      lambda: y.register_grad_ready_hook(lambda t, g: None))
    expect(x.grad is None, "a failed backward left a gradient")


class _Doubled(Function):
    """``2 * t`` whose backward gives ``t`` no gradient (a consumer that receives none)."""
    @staticmethod
    def forward(ctx, t):
        return t.data * 2.0

    @staticmethod
    def backward(ctx, g):
        return None


@guarded
def test_grad_ready_hooks():
    """A hook runs once per backward per leaf, after every contribution is in: for a leaf
    used three times, and for a leaf whose only consumer receives no gradient (the hook hears
    ``None`` and ``.grad`` stays ``None``).  A hook returning True takes the gradient."""
    rng = np.random.default_rng(7)
    xg = rng.standard_normal((5, 4))
    wv = rng.standard_normal(4)
    tg = rng.standard_normal((5, 4))
    lay = ((SIZE,), (0, None), None)
    calls = []

    def hook(name):
        return lambda t, g: calls.append((name, None if g is None else value_of(g)))

    for rnd in range(2):
        calls.clear()
        x = Tensor(scatter(xg, lay), requires_grad=True)
        w = Tensor(wv.copy(), requires_grad=True)
        t = Tensor(scatter(tg, lay), requires_grad=True)
        for name, leaf in (("x", x), ("w", w), ("t", t)):
            leaf.register_grad_ready_hook(hook(name))
        taken = []
        if rnd == 1:  # a second hook on w that takes the gradient
            w.register_grad_ready_hook(lambda tt, g: taken.append(g.copy()) or True)
        z = x * w * w + w  # w used three times
        loss = F.mse_loss(z, _Doubled.apply(t))  # t's only consumer hands back no gradient
        loss.backward()
        names = sorted(n for n, _ in calls)
        expect(names == ["t", "w", "x"], f"round {rnd}: hooks ran for {names}")
        byname = dict(calls)
        zg = xg * wv * wv + wv
        dz = 2 * (zg - 2 * tg) / zg.size
        close(byname.get("x"), dz * wv * wv, f"round {rnd}: x hook gradient")
        close(byname.get("w"), (dz * (2 * xg * wv + 1)).sum(axis=0),
              f"round {rnd}: w hook gradient")
        expect(byname.get("t", 0) is None, f"round {rnd}: t's hook got {byname.get('t', 0)}")
        expect(t.grad is None, f"round {rnd}: t got a gradient")
        close(x.grad.to_numpy(), dz * wv * wv, f"round {rnd}: x.grad")
        if rnd == 0:
            close(w.grad, (dz * (2 * xg * wv + 1)).sum(axis=0), "w.grad")
        else:
            expect(w.grad is None and len(taken) == 1,
                   f"a hook returning True: w.grad {w.grad}, hook calls {len(taken)}")


@guarded
def test_backward_from_leaf_and_replicated_graph():
    """backward() on a leaf hands the gradient to the leaf; a graph of replicated values only
    (no DistArray) differentiates without communication and gives the same everywhere."""
    xg, x = _x()
    g = like(np.full(xg.shape, 3.0), x.data)
    x.backward(g)
    close(x.grad.to_numpy(), np.full(xg.shape, 3.0), "leaf backward")
    w = Tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    loss = (w.exp() * w).sum() / 3 + w[1]
    loss.backward()
    want = (np.exp(w.data) * (1 + w.data)) / 3
    want[1] += 1
    close(w.grad, want, "replicated graph gradient")
    vals = COMM.allgather(w.grad.tobytes())
    expect(all(v == vals[0] for v in vals), "replicated gradient differs between ranks")


# == 3. nn.functional: finite differences, input and parameters ==============================
def layout_kinds():
    return ["sample", "spatial", "mixed"]


def nc_layout(shape, kind):
    """A layout of an ``(N, C, *S)`` array (or ``(N, F)``): ``sample`` (N over all ranks),
    ``spatial`` (the first spatial axis over all ranks; for 2-d arrays: replicated),
    ``mixed`` (4 ranks: N over 2 and the last spatial axis over 2 with uneven sizes; else the
    last axis over all ranks with uneven sizes and, from 3 ranks, an empty block)."""
    nd = len(shape)
    none = (None,) * nd
    if kind == "sample":
        return (SIZE,), (0,) + none[1:], None
    if kind == "spatial":
        if nd == 2:
            return (SIZE,), none, None
        return (SIZE,), tuple(0 if i == 2 else None for i in range(nd)), None
    t = nd - 1 if nd > 2 else 0
    n = shape[t]
    if SIZE == 4 and nd > 2:
        sizes = [None] * nd
        sizes[t] = (n - 1, 1)
        return (2, 2), tuple(0 if i == 0 else 1 if i == t else None for i in range(nd)), \
            tuple(sizes)
    if SIZE == 1:
        return (1,), tuple(0 if i == t else None for i in range(nd)), None
    blocks = [1, 0] + [0] * (SIZE - 2) if SIZE > 2 else [1, 0]
    blocks[-1] += n - sum(blocks)
    sizes = [None] * nd
    sizes[t] = tuple(blocks)
    return (SIZE,), tuple(0 if i == t else None for i in range(nd)), tuple(sizes)


def _rn(seed, shape, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


def _ops():
    """name -> (inputs(kind) -> inputs dict, build(ts) -> Tensor).  Parameters are
    replicated tensors requiring grad; data are distributed tensors."""
    cases = {}

    def add(name, x_shape, params, build, extra=None, x_fn=None):
        def inputs(kind, x_shape=x_shape, params=params, extra=extra, x_fn=x_fn):
            xv = x_fn(x_shape) if x_fn else _rn(zlib.crc32(name.encode()), x_shape)
            out = {"x": ("dist", xv, nc_layout(x_shape, kind), True)}
            for i, (p, shape) in enumerate(params.items()):
                out[p] = ("rep", _rn(100 + i, shape, 0.5), None, True)
            if extra:
                out.update(extra(kind))
            return out
        cases[name] = (inputs, build)

    add("conv1d_stride_dilation", (2, 2, 11), {"w": (3, 2, 3), "b": (3,)},
        lambda t: F.conv1d(t["x"], t["w"], t["b"], stride=2, padding=2, dilation=2))
    add("conv2d_groups_same", (2, 4, 6, 5), {"w": (4, 2, 3, 3), "b": (4,)},
        lambda t: F.conv2d(t["x"], t["w"], t["b"], padding="same", dilation=(2, 1), groups=2))
    add("conv2d_circular_asym", (2, 2, 5, 6), {"w": (3, 2, 3, 2)},
        lambda t: F.conv(t["x"], t["w"], None, padding=((1, 1), (1, 0)),
                         padding_mode="circular"))
    add("conv3d_stride", (2, 2, 5, 6, 4), {"w": (3, 2, 3, 3, 3), "b": (3,)},
        lambda t: F.conv3d(t["x"], t["w"], t["b"], stride=(1, 2, 1), padding=1))
    add("conv_transpose3d", (2, 3, 3, 4, 3), {"w": (3, 2, 2, 2, 2), "b": (2,)},
        lambda t: F.conv_transpose3d(t["x"], t["w"], t["b"], stride=2))
    add("conv_transpose1d_groups", (2, 2, 5), {"w": (2, 2, 3), "b": (4,)},
        lambda t: F.conv_transpose1d(t["x"], t["w"], t["b"], stride=2, padding=1,
                                     output_padding=1, groups=2))
    add("conv_transpose2d_dilation", (2, 2, 4, 3), {"w": (2, 3, 3, 2)},
        lambda t: F.conv_transpose2d(t["x"], t["w"], None, stride=(2, 1), padding=(1, 0),
                                     dilation=(1, 2)))
    add("max_pool3d", (2, 2, 6, 6, 4), {}, lambda t: F.max_pool3d(t["x"], 2))
    add("max_pool1d_stride_pad", (2, 2, 9), {}, lambda t: F.max_pool1d(t["x"], 3, 2, 1))
    add("avg_pool2d", (2, 2, 7, 6), {},
        lambda t: F.avg_pool2d(t["x"], 3, 2, 1, count_include_pad=False))
    add("avg_pool3d_include_pad", (2, 2, 4, 5, 4), {},
        lambda t: F.avg_pool3d(t["x"], (2, 3, 2), (2, 1, 2), (0, 1, 0)))
    add("upsample_nearest2d", (2, 2, 3, 4), {}, lambda t: F.upsample(t["x"], scale_factor=2))
    add("upsample_linear3d", (2, 2, 3, 3, 2), {},
        lambda t: F.interpolate(t["x"], scale_factor=(2, 1, 3), mode="trilinear"))
    add("upsample_linear1d", (2, 2, 5), {},
        lambda t: F.upsample(t["x"], scale_factor=3, mode="linear"))
    for stats in ("global", "local"):
        add(f"batch_norm_{stats}", (3, 2, 5, 4), {"gamma": (2,), "beta": (2,)},
            lambda t, stats=stats: F.batch_norm(t["x"], None, None, t["gamma"], t["beta"],
                                                training=True, stats=stats))
    add("batch_norm_eval", (3, 2, 4, 2, 3), {"gamma": (2,), "beta": (2,)},
        lambda t: F.batch_norm(t["x"], np.array([0.3, -0.2]), np.array([1.5, 0.7]),
                               t["gamma"], t["beta"], training=False))
    for name, fn in (("relu", F.relu), ("leaky_relu", lambda x: F.leaky_relu(x, 0.2)),
                     ("elu", lambda x: F.elu(x, 1.3)), ("sigmoid", F.sigmoid),
                     ("tanh", F.tanh), ("scaled_tanh", lambda x: F.scaled_tanh(x, 1.2)),
                     ("softmax", F.softmax), ("log_softmax", F.log_softmax),
                     ("dropout", lambda x: F.dropout(x, 0.3, True, 7))):
        add(name, (2, 3, 5, 4), {}, lambda t, fn=fn: fn(t["x"]))
    add("dropout_eval", (2, 3, 5), {}, lambda t: F.dropout(t["x"], 0.3, False, 7))

    def second(kind):  # the other operand of cat, on another layout
        kinds = layout_kinds()
        other = kinds[(kinds.index(kind) + 1) % len(kinds)]
        shape = (2, 3, 6, 5)
        return {"x2": ("dist", _rn(5, shape), nc_layout(shape, other), True)}
    add("cat", (2, 2, 6, 5), {}, lambda t: F.cat([t["x"], t["x2"]]), extra=second)
    add("flatten", (2, 3, 4, 3), {}, lambda t: F.flatten(t["x"]))
    add("linear", (3, 6), {"w": (4, 6), "b": (4,)}, lambda t: F.linear(t["x"], t["w"], t["b"]))
    add("flatten_linear", (2, 2, 4, 3), {"w": (3, 24)},
        lambda t: F.linear(F.flatten(t["x"]), t["w"]))

    def target(kind):  # on the prediction's grid (ops.mse_forward needs that), other split
        shape = (2, 3, 5, 4)
        dims = nc_layout(shape, kind)[0]
        split = (None, None, 0, None) if len(dims) == 1 else (1, None, 0, None)
        return {"t": ("dist", _rn(9, shape), (dims, split, None), False)}
    add("mse_loss", (2, 3, 5, 4), {}, lambda t: F.mse_loss(t["x"], t["t"]), extra=target)

    def labels(kind):
        shape = (2, 3, 5, 4)
        lay = nc_layout(shape, kind)
        dims, split, sizes = lay
        keep = [0, 2, 3]
        lab_lay = (dims, tuple(split[i] for i in keep),
                   None if sizes is None else tuple(sizes[i] for i in keep))
        lab = np.random.default_rng(10).integers(0, 3, (2, 5, 4))
        return {"labels": ("raw", lab, lab_lay, False)}
    add("cross_entropy", (2, 3, 5, 4), {}, lambda t: F.cross_entropy(t["x"], t["labels"]),
        extra=labels)
    # a composite: conv -> batch norm -> leaky relu -> max pool -> conv transpose -> cat skip
    add("unet_level", (2, 2, 4, 4, 4),
        {"w1": (3, 2, 3, 3, 3), "gamma": (3,), "beta": (3,), "wt": (3, 2, 2, 2, 2)},
        lambda t: F.cat([F.conv_transpose(F.max_pool(F.leaky_relu(F.batch_norm(
            F.conv(t["x"], t["w1"], None, padding=1), None, None, t["gamma"], t["beta"],
            training=True), 0.1), 2), t["wt"], None, stride=2), t["x"]]))
    return cases


OPS = _ops()


@pytest.mark.parametrize("kind", layout_kinds())
@pytest.mark.parametrize("name", sorted(OPS))
@guarded
def test_functional_gradients(name, kind):
    """Central differences along random directions of ``sum(op(x, params) * r)`` for the input
    and each parameter (and all at once); then the same backward with the parameters' sums
    deferred to a GradientReducer (per-rank shares, small buckets) gives the same gradients."""
    make, build = OPS[name]
    inputs = make(kind)
    what = f"{name} [{kind}: {inputs['x'][2]}]"
    ts, grads, y, r = check_function(build, inputs, what, seed=zlib.crc32(name.encode()),
                                     ndir=2)
    params = [p for p, (k, *_rest) in inputs.items() if k == "rep"]
    if not params:
        return
    # the same gradients through deferred reduction: all parameters, and (mixed) only the
    # first one, the others reduced by the op itself
    for deferred in ([params, params[:1]] if len(params) > 1 else [params]):
        check_deferred(build, inputs, r, grads, params, deferred, what,
                       overlap=bool(len(name) % 2))


def check_deferred(build, inputs, r, grads, params, deferred, what, overlap):
    ts = make_inputs(inputs)
    reducer = GradientReducer([ts[p] for p in deferred], ts["x"].data.grid, bucket_bytes=64,
                              overlap=overlap)
    what = f"{what}, deferred {deferred}"
    try:
        reducer.arm()
        y = build(ts)
        y.backward(like(r, y.data) if isinstance(y.data, dt.DistArray) else r)
        for p in params:
            g = ts[p].grad
            expect(g is not None, f"{what}: no gradient for {p}")
            if g is not None:
                close(g, grads[p], f"{what}: gradient of {p}", rtol=1e-12, atol=1e-13)
        close(ts["x"].grad.to_numpy(), grads["x"], f"{what}: dx", rtol=0, atol=0)
    finally:
        reducer.release()
