"""Elementwise ufuncs and operators on DistArrays against NumPy: unary and binary ufuncs,
broadcasting between DistArrays of different shapes, distributions and grids (the alignment
rule of :mod:`disttensor.core.array`), NumPy arrays and Python scalars on either side, dtype
promotion, in-place operators, ``out=``/``where=``, multi-output ufuncs, ``astype``/``copy``
and ``where``.

Each check compares every rank's local block with the matching block of the NumPy result and
reduces the verdict over all ranks; where NumPy raises, every rank must raise the same kind of
exception.
"""
from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import disttensor as dt
from checks import SIZE, examples, dist, expect, collective_checks, check_blocks
from disttensor.testing.strategies import layouts, shapes


def outcome(fn):
    """``(result, None)`` or ``(None, exception)``; floating-point warnings silenced."""
    try:
        with np.errstate(all="ignore"):
            return fn(), None
    except Exception as e:  # noqa: BLE001
        return None, e


_KINDS = (OverflowError, ZeroDivisionError, ValueError, TypeError, ArithmeticError)


def same_error(err, derr, got=None) -> tuple[bool, str]:
    kind = next((k for k in _KINDS if isinstance(err, k)), Exception)
    return isinstance(derr, kind), (f"NumPy raised {type(err).__name__}: {err}; got "
                                    + (f"{type(derr).__name__}: {derr}" if derr else f"{got!r}"))


def check(x, expected, *, rtol=0.0, mask=None, what=""):
    """:func:`checks.check_blocks` with this module's tolerance convention (``atol = rtol``)."""
    check_blocks(x, expected, what, rtol=rtol, atol=rtol, mask=mask)


def compare(f_np, f_dt, what="", **kw):
    """Run the NumPy and the distributed version; both raise the same kind of exception, or
    the results agree (:func:`check`).  Returns the distributed result (or None)."""
    want, err = outcome(f_np)
    got, derr = outcome(f_dt)
    if err is not None:
        ok, msg = same_error(err, derr, got)
        expect(ok, f"{what}: {msg}")
        return None
    if derr is not None:
        expect(False, f"{what}: NumPy passed, got {type(derr).__name__}: {derr}")
        return None
    if isinstance(want, tuple):
        if not (isinstance(got, tuple) and len(got) == len(want)):
            expect(False, f"{what}: got {got!r}")
            return None
        for g, w in zip(got, want):
            check(g, w, what=what, **kw)
    else:
        check(got, want, what=what, **kw)
    return got


def values(shape, dtype, seed, *, nonzero=False, positive=False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        a = np.array(rng.random(shape) < 0.5)
        return np.ones(shape, bool) if nonzero else a
    if dtype.kind in "iu":
        lo = 0 if (dtype.kind == "u" or positive) else -9
        a = np.array(rng.integers(lo, 10, size=shape), dtype=dtype)
    else:
        a = np.array(rng.normal(size=shape) * 3, dtype=dtype)
        if positive:
            a = np.array(np.abs(a), dtype=dtype)
        if dtype.kind == "f" and a.size and not nonzero:
            a.flat[0] = 0.0   # a zero, for division and sign edge cases
    if nonzero:
        a[a == 0] = 1
    return a


def rtol_of(dtype) -> float:
    return {"f": {2: 4e-3, 4: 3e-6, 8: 1e-13}}.get(np.dtype(dtype).kind, {}).get(
        np.dtype(dtype).itemsize, 1e-13)


seeds = st.integers(0, 2**32 - 1)


@st.composite
def broadcastable(draw, shape):
    """A shape that broadcasts to ``shape``: leading axes dropped, some extents set to 1."""
    k = draw(st.integers(0, len(shape)))
    return tuple(1 if draw(st.booleans()) else n for n in shape[k:])


# -- unary -----------------------------------------------------------------------------------
FLOAT_UNARY = [np.negative, np.positive, np.absolute, np.exp, np.sin, np.tanh, np.floor,
               np.ceil, np.rint, np.sign, np.square, np.isnan, np.isfinite, np.signbit,
               np.reciprocal, np.expm1, np.arctan]
POSITIVE_UNARY = [np.sqrt, np.log, np.log1p, np.log10, np.cbrt]


@settings(max_examples=examples(25))
@given(shape=shapes(0, 4, 5), dtype=st.sampled_from(["float64", "float32", "float16", "int32",
                                                      "int64", "uint8", "bool"]),
       seed=seeds, data=st.data())
@collective_checks
def test_unary(shape, dtype, seed, data):
    layout = data.draw(layouts(shape, SIZE))
    a = values(shape, dtype, seed)
    x = dist(a, layout)
    kind = np.dtype(dtype).kind
    r = rtol_of(dtype)
    if kind == "f":
        for f in FLOAT_UNARY:
            compare(lambda: f(a), lambda: f(x), rtol=r, what=f.__name__)
        p = np.abs(a) + np.asarray(0.5, a.dtype)
        xp = abs(x) + np.asarray(0.5, a.dtype)
        for f in POSITIVE_UNARY:
            compare(lambda: f(p), lambda: f(xp), rtol=r, what=f.__name__)
    elif kind == "b":
        for f in (np.logical_not, np.invert, np.negative, np.absolute):
            compare(lambda: f(a), lambda: f(x), what=f.__name__)
    else:
        for f in (np.negative, np.absolute, np.square, np.sign, np.invert, np.logical_not):
            compare(lambda: f(a), lambda: f(x), what=f.__name__)
    # operators and dt.* aliases
    compare(lambda: -a, lambda: -x, what="-x")
    compare(lambda: abs(a), lambda: abs(x), what="abs(x)")
    compare(lambda: +a, lambda: +x, what="+x")
    compare(lambda: ~a, lambda: ~x, what="~x")
    compare(lambda: np.abs(a), lambda: dt.abs(x), what="dt.abs")


# -- binary, same shape --------------------------------------------------------------------------
ARITH = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
         operator.mod, operator.pow]
COMPARE = [operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne]
BITWISE = [operator.and_, operator.or_, operator.xor]
UFUNCS2 = [np.maximum, np.minimum, np.fmax, np.arctan2, np.hypot, np.copysign,
           np.logical_and, np.logical_xor]


@settings(max_examples=examples(25))
@given(shape=shapes(0, 4, 5), dtype=st.sampled_from(["float64", "float32", "int64", "int32",
                                                      "uint8", "bool"]),
       seed=seeds, data=st.data())
@collective_checks
def test_binary_same_shape_different_layouts(shape, dtype, seed, data):
    la, lb = data.draw(layouts(shape, SIZE)), data.draw(layouts(shape, SIZE))
    kind = np.dtype(dtype).kind
    a = values(shape, dtype, seed)
    b = values(shape, dtype, seed + 1, nonzero=True, positive=kind in "iub")
    if kind in "iu":
        b = np.minimum(b, 3).astype(dtype)    # small exponents, no overflow in **
    x, y = dist(a, la), dist(b, lb)
    ops = ARITH + COMPARE + (BITWISE if kind in "iub" else []) + UFUNCS2
    if kind == "b":
        ops = [operator.add, operator.mul, operator.sub] + COMPARE + BITWISE
    for op in ops:
        r = compare(lambda: op(a, b), lambda: op(x, y), what=op.__name__,
                    rtol=rtol_of(dtype) if op in (operator.pow, np.arctan2, np.hypot) else 0.0)
        if r is not None:   # the result takes the layout of the first operand
            expect(r.distribution == x.distribution and r.grid is x.grid,
                   f"{op.__name__}: result distribution {r.distribution}")


# -- broadcasting, mixed operand kinds -------------------------------------------------------------
OPERAND_KINDS = ["dist", "dist", "numpy", "scalar", "list"]
BROADCAST_OPS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.lt,
                 operator.ge, np.maximum, np.arctan2, operator.floordiv, operator.pow]


@settings(max_examples=examples(40))
@given(shape=shapes(0, 4, 4), kinds=st.tuples(st.sampled_from(OPERAND_KINDS),
                                              st.sampled_from(OPERAND_KINDS)),
       op=st.sampled_from(BROADCAST_OPS), seed=seeds, data=st.data())
@collective_checks
def test_broadcasting_mixed_operands(shape, kinds, op, seed, data):
    if "dist" not in kinds:
        kinds = ("dist", kinds[1])
    operands, arrays = [], []
    for i, kind in enumerate(kinds):
        if kind == "scalar":
            v = data.draw(st.sampled_from([2, -1.5, 0.5, 3]))
            operands.append(v)
            arrays.append(v)
            continue
        s = data.draw(broadcastable(shape))
        a = values(s, "float64", seed + i, positive=op is operator.pow)
        arrays.append(a)
        operands.append(dist(a, data.draw(layouts(s, SIZE))) if kind == "dist"
                        else a.tolist() if kind == "list" and s and 0 not in s else a)
    r = compare(lambda: op(*arrays), lambda: op(*operands), what=f"{op.__name__}{kinds}",
                rtol=1e-13 if op in (np.arctan2, operator.pow) else 0.0)
    if r is not None:
        full = [o for o in operands if isinstance(o, dt.DistArray) and o.shape == r.shape]
        if full:   # alignment rule: the first DistArray operand of the result's shape
            expect(r.distribution == full[0].distribution,
                   f"layout {r.distribution}, first full operand {full[0].distribution}")


@settings(max_examples=examples(25))
@given(shape=shapes(1, 4, 4), seed=seeds, data=st.data())
@collective_checks
def test_broadcasting_between_distarrays_on_different_grids(shape, seed, data):
    """Neither operand has the full shape; operands on grids of different shapes."""
    sa, sb = data.draw(broadcastable(shape)), data.draw(broadcastable(shape))
    c = values(data.draw(broadcastable(shape)), "int32", seed + 2)
    a, b = values(sa, "float64", seed), values(sb, "float32", seed + 1)
    x, y = dist(a, data.draw(layouts(sa, SIZE))), dist(b, data.draw(layouts(sb, SIZE)))
    z = dist(c, data.draw(layouts(c.shape, SIZE)))
    compare(lambda: a + b, lambda: x + y)
    compare(lambda: b * c - a, lambda: y * z - x)
    compare(lambda: np.maximum(c, b), lambda: np.maximum(z, y))
    compare(lambda: (a < b) ^ (c > 0), lambda: (x < y) ^ (z > 0))


# -- dtype promotion -------------------------------------------------------------------------------
PROMOTION_CASES = [
    ("int32", "float32"), ("int32", "int64"), ("uint8", "int8"), ("int8", "float16"),
    ("float16", "float32"), ("float16", "float16"), ("bool", "int32"), ("bool", "bool"),
    ("uint8", 7), ("uint8", 300), ("int8", -3), ("float16", 2.5), ("float32", 1.5),
    ("int32", 2.5), ("bool", True), ("bool", 1), ("uint8", np.float64(2.0)),
    ("float32", np.float64(1.0)), ("int64", 1 + 2j), ("float32", "complex64"),
]


@settings(max_examples=examples(30))
@given(case=st.sampled_from(PROMOTION_CASES), swap=st.booleans(), as_numpy=st.booleans(),
       op=st.sampled_from([operator.add, operator.mul, operator.truediv, operator.floordiv,
                           operator.and_, operator.or_, operator.lt, operator.sub,
                           np.maximum, operator.pow]),
       shape=shapes(0, 3, 4), seed=seeds, data=st.data())
@collective_checks
def test_dtype_promotion(case, swap, as_numpy, op, shape, seed, data):
    da, other = case
    a = values(shape, da, seed, positive=True, nonzero=True)
    x = dist(a, data.draw(layouts(shape, SIZE)))
    if isinstance(other, str):
        b = values(shape, other, seed + 1, positive=True, nonzero=True)
        y = b if as_numpy else dist(b, data.draw(layouts(shape, SIZE)))
    else:
        b = y = other
    args_np, args_dt = ((b, a), (y, x)) if swap else ((a, b), (x, y))
    compare(lambda: op(*args_np), lambda: op(*args_dt),
            rtol=1e-6 if op is operator.pow else 0.0)


# -- in-place --------------------------------------------------------------------------------------
INPLACE = [operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
           operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor]


@settings(max_examples=examples(40))
@given(shape=shapes(0, 4, 4), dx=st.sampled_from(["float64", "float32", "int64", "int32"]),
       dy=st.sampled_from(["float64", "int32", "int8", "bool"]),
       kind=st.sampled_from(["dist", "dist", "numpy", "scalar"]), op=st.sampled_from(INPLACE),
       seed=seeds, data=st.data())
@collective_checks
def test_inplace(shape, dx, dy, kind, op, seed, data):
    a = values(shape, dx, seed)
    x = dist(a, data.draw(layouts(shape, SIZE)))
    before_dist, before_local = x.distribution, x.local
    if kind == "scalar":
        b = y = data.draw(st.sampled_from([2, 3, 1.5, True]))
    else:
        s = data.draw(broadcastable(shape))
        b = values(s, dy, seed + 1, nonzero=True, positive=True)
        if np.dtype(dy).kind in "iu":
            b = np.minimum(b, 3).astype(dy)
        y = b if kind == "numpy" else dist(b, data.draw(layouts(s, SIZE)))
    want, err = outcome(lambda: op(a.copy(), b))
    got, derr = outcome(lambda: op(x, y))
    if err is not None:
        kinds = next(k for k in _KINDS + (Exception,) if isinstance(err, k))
        expect(isinstance(derr, kinds), f"NumPy raised {err!r}, got {derr!r}")
        return
    expect(derr is None and got is x and x.distribution == before_dist
           and x.local is before_local,
           f"in-place op gave {got!r} / {derr!r} (must update x itself)")
    check(x, want, rtol=1e-6 if op is operator.ipow else 0.0)


# -- out= and where= --------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:'where' used without 'out'")
@settings(max_examples=examples(30))
@given(shape=shapes(0, 4, 4), seed=seeds, mask_kind=st.sampled_from(["dist", "numpy", "none"]),
       data=st.data())
@collective_checks
def test_out_and_where(shape, seed, mask_kind, data):
    a, b, c = (values(shape, "float64", seed + k) for k in range(3))
    lo = data.draw(layouts(shape, SIZE))
    x, y = dist(a, data.draw(layouts(shape, SIZE))), dist(b, data.draw(layouts(shape, SIZE)))
    out = dist(c, lo)
    o_local, o_dist = out.local, out.distribution
    ms = data.draw(broadcastable(shape))
    m = np.random.default_rng(seed).random(ms) < 0.5
    mask = {"dist": lambda: dist(m, data.draw(layouts(ms, SIZE))), "numpy": lambda: m,
            "none": lambda: True}[mask_kind]()
    want = c.copy()
    np.add(a, b, out=want, where=m if mask_kind != "none" else True)
    r = np.add(x, y, out=out, where=mask)
    expect(r is out and out.local is o_local and out.distribution == o_dist,
           "out= must be returned and written in place")
    check(out, want)
    # out= positional and as a 1-tuple, scalar operand: the layout of out wins
    out2 = dist(np.zeros(shape), data.draw(layouts(shape, SIZE)))
    r2 = np.multiply(x, 2.5, out2)
    check(r2, a * 2.5)
    r2b = np.subtract(2.5, x, out=(out2,))
    check(out2, 2.5 - a)
    expect(r2 is out2 and r2b is out2, "out= not returned")
    # where= without out=: only the selected elements are defined
    if mask_kind != "none":
        r3 = np.subtract(x, b, where=mask)
        check(r3, a - b, mask=np.broadcast_to(m, shape))
    # dtype= and casting=
    compare(lambda: np.add(a, b, dtype="float32"), lambda: np.add(x, y, dtype="float32"))


# -- multi-output ufuncs -----------------------------------------------------------------------------
@settings(max_examples=examples(25))
@given(shape=shapes(0, 4, 4), dtype=st.sampled_from(["float64", "int32", "float32"]),
       seed=seeds, data=st.data())
@collective_checks
def test_multi_output(shape, dtype, seed, data):
    a = values(shape, dtype, seed)
    sb = data.draw(broadcastable(shape))
    b = values(sb, dtype, seed + 1, nonzero=True)
    x = dist(a, data.draw(layouts(shape, SIZE)))
    y = dist(b, data.draw(layouts(sb, SIZE)))
    compare(lambda: np.divmod(a, b), lambda: np.divmod(x, y))
    compare(lambda: divmod(a, 3), lambda: divmod(x, 3))
    compare(lambda: np.divmod(b, a + (a == 0)), lambda: np.divmod(y, x + (x == 0)))
    if np.dtype(dtype).kind == "f":
        compare(lambda: np.modf(a), lambda: np.modf(x))
        compare(lambda: np.frexp(a), lambda: np.frexp(x))
        lo = data.draw(layouts(shape, SIZE))
        o1, o2 = dist(np.zeros(shape, dtype), lo), dist(np.zeros(shape, dtype), lo)
        r = np.modf(x, out=(o1, o2))
        expect(isinstance(r, tuple) and r[0] is o1 and r[1] is o2, "modf out=")
        want = np.modf(a)
        check(o1, want[0])
        check(o2, want[1])


# -- astype, copy ---------------------------------------------------------------------------------------
@settings(max_examples=examples(25))
@given(shape=shapes(0, 4, 5), src=st.sampled_from(["float64", "float32", "int32", "bool", "uint8"]),
       dst=st.sampled_from(["float64", "float32", "float16", "int64", "int8", "bool", "complex64"]),
       seed=seeds, data=st.data())
@collective_checks
def test_astype_and_copy(shape, src, dst, seed, data):
    a = values(shape, src, seed)
    layout = data.draw(layouts(shape, SIZE))
    x = dist(a, layout)
    y = x.astype(dst)
    check(y, a.astype(dst))
    check(dt.astype(x, dst), a.astype(dst))
    expect(y.distribution == x.distribution, "astype keeps the distribution")
    same = x.astype(src, copy=False)
    expect(same is x, "astype(same dtype, copy=False) returns the array itself")
    for c in (x.copy(), np.copy(x)):
        check(c, a)
        expect(c.distribution == x.distribution
               and not np.shares_memory(c.local, x.local), "copy shares memory")
        c.local[...] = 1            # writing the copy leaves the original alone
        check(x, a)


# -- where --------------------------------------------------------------------------------------------
@settings(max_examples=examples(30))
@given(shape=shapes(0, 4, 4),
       kinds=st.tuples(*[st.sampled_from(["dist", "numpy", "scalar", "list"])] * 3),
       seed=seeds, data=st.data())
@collective_checks
def test_where(shape, kinds, seed, data):
    if "dist" not in kinds:
        kinds = ("dist",) + kinds[1:]
    arrays, operands = [], []
    for i, kind in enumerate(kinds):
        if kind == "scalar":
            v = [True, 7, -2.5][i]
            arrays.append(v)
            operands.append(v)
            continue
        s = data.draw(broadcastable(shape))
        a = values(s, ["bool", "int32", "float32"][i], seed + i)
        operands.append(dist(a, data.draw(layouts(s, SIZE))) if kind == "dist"
                        else a.tolist() if kind == "list" and s and 0 not in s else a)
        arrays.append(operands[-1] if kind == "list" else a)   # NumPy's rule for lists too
    compare(lambda: np.where(*arrays), lambda: dt.where(*operands))
    compare(lambda: np.where(*arrays), lambda: np.where(*operands))


# -- collective errors of data-dependent ufunc failures ---------------------------------------------
@settings(max_examples=examples(10))
@given(n=st.integers(1, 9), at=st.integers(0, 8))
@collective_checks
def test_integer_power_with_a_negative_exponent_raises_on_every_rank(n, at):
    """Only the rank owning the negative exponent sees it; all ranks must raise."""
    e = np.full(n, 2)
    e[at % n] = -1
    x = dist(np.arange(n), ((SIZE,), (0,), (None,)))
    y = dist(e, ((SIZE,), (0,), (None,)))
    got, err = outcome(lambda: x ** y)
    expect(isinstance(err, ValueError), f"got {got!r} / {err!r}")
    got, err = outcome(lambda: np.power(x, e))
    expect(isinstance(err, ValueError), f"got {got!r} / {err!r}")
    check(x ** np.abs(e), np.arange(n) ** np.abs(e))     # the grid is still usable
