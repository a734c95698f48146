"""``disttensor.autograd.Function`` on replicated values (no communication): the ctx API
(``save_for_backward``/``saved_tensors``, ``needs_input_grad``, ``mark_non_differentiable``,
``set_materialize_grads``), several outputs, constants among the arguments, ``no_grad``, and
the errors (wrong number of gradients, wrong shape, saved tensors after backward); gradients
against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.autograd import Function, Tensor, no_grad


class MulAdd(Function):
    """``x * w + c`` with ``c`` a constant."""
    @staticmethod
    def forward(ctx, x, w, c):
        ctx.save_for_backward(x, w)
        ctx.seen = ctx.needs_input_grad
        return x.data * w.data + c

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g * w.data if ctx.needs_input_grad[0] else None,
                g * x.data if ctx.needs_input_grad[1] else None, None)


class SortWithIndex(Function):
    """Two outputs: sorted values (differentiable) and the permutation (not)."""
    @staticmethod
    def forward(ctx, x):
        idx = np.argsort(x.data, kind="stable")
        ctx.idx = idx
        ctx.mark_non_differentiable(idx)
        ctx.set_materialize_grads(False)
        return x.data[idx], idx

    @staticmethod
    def backward(ctx, g_values, g_idx):
        assert g_idx is None  # not materialised
        out = np.zeros_like(g_values)
        out[ctx.idx] = g_values
        return out


def test_function_gradients_and_ctx():
    rng = np.random.default_rng(0)
    a, b, r = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4)
    x, w = Tensor(a.copy(), requires_grad=True), Tensor(b.copy())
    y = MulAdd.apply(x, w, 2.0)
    np.testing.assert_allclose(y.data, a * b + 2.0)
    assert y.requires_grad and y.node.name == "MulAdd"
    (y * Tensor(r)).sum().backward()
    np.testing.assert_allclose(x.grad, r * b)
    assert w.grad is None
    with no_grad():
        z = MulAdd.apply(x, w, 0.0)
    assert not z.requires_grad


def test_non_differentiable_output_and_unmaterialised_grads():
    a = np.array([3.0, 1.0, 2.0])
    x = Tensor(a.copy(), requires_grad=True)
    v, i = SortWithIndex.apply(x)
    assert v.requires_grad and not i.requires_grad
    np.testing.assert_array_equal(i.data, [1, 2, 0])
    (v * Tensor(np.array([1.0, 10.0, 100.0]))).sum().backward()
    np.testing.assert_allclose(x.grad, [100.0, 1.0, 10.0])


class TwoGrads(Function):
    @staticmethod
    def forward(ctx, x):
        return x.data * 2

    @staticmethod
    def backward(ctx, g):
        return g, g


class BadShape(Function):
    @staticmethod
    def forward(ctx, x):
        return x.data.sum()

    @staticmethod
    def backward(ctx, g):
        return np.ones(7)


def test_function_errors():
    x = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"incorrect number of gradients \(expected 1, got "
                                           r"2\)"):
        TwoGrads.apply(x).sum().backward()
    with pytest.raises(RuntimeError, match=r"invalid gradient at index 0 - got \[7\] but "
                                           r"expected shape compatible with \[3\]"):
        BadShape.apply(x).backward()

    class Keep(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            Keep.ctx = ctx
            return x.data * 1.0

        @staticmethod
        def backward(ctx, g):
            return g
    Keep.apply(x).sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        Keep.ctx.saved_tensors
    with pytest.raises(TypeError, match="can only save variables"):
        class SaveNumber(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(3)
                return x.data
        SaveNumber.apply(x)


def test_replicated_reductions_match_torch_spellings():
    """The reductions on replicated values (parameters): elementwise max/min share ties half
    and half, ``unbiased=False``, ``argmax`` of the flattened tensor, ``amax`` over a tuple."""
    from disttensor import autograd as ag
    a = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = Tensor(np.array([1.0, 3.0, 2.0]), requires_grad=True)
    ag.max(a, b).sum().backward()
    np.testing.assert_allclose(a.grad, [0.5, 0.0, 1.0])
    np.testing.assert_allclose(b.grad, [0.5, 1.0, 0.0])
    x = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]]), requires_grad=True)
    assert abs(x.var().data - np.var(x.data, ddof=1)) < 1e-15
    assert abs(x.std(unbiased=False).data - np.std(x.data)) < 1e-15
    assert x.argmax().data == 3 and x.argmax(1, keepdim=True).data.tolist() == [[1], [1]]
    assert x.amax(dim=(0, 1), keepdim=True).data.shape == (1, 1)
    with pytest.raises(TypeError, match="both 'dim' and 'axis'"):
        x.sum(0, axis=1)
    with pytest.raises(RuntimeError, match="at least one of 'min' or 'max'"):
        x.clamp()
