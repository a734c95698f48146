"""PyTorch's edges of the autograd and nn layers under MPI (issue 19):

1. the reducer of DistributedDataParallel leaves ``grad`` ``None`` for parameters frozen after
   wrapping or unused on every rank (decided by flags riding on the bucket all-reduce), so
   AdamW does not move them and a wrapped run equals an unwrapped one; a parameter used on
   some ranks only gets the summed gradient everywhere;
2. a parameter whose dtype differs from the input's raises outside autocast (on every rank)
   and is cast inside :func:`disttensor.nn.amp.autocast`;
3. a NumPy array given to a layer raises ``TypeError`` naming what is expected;
4. module hooks (forward pre/post, full backward pre/post: order, replacement, removal, a
   wrong shape), tensor hooks and ``retain_grad`` against NumPy gradients on sample and
   spatial grids with uneven and empty blocks;
5. :class:`disttensor.autograd.Function` against NumPy gradients.

Tensor reductions, clamp and where: ``test_autograd_reductions.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

import disttensor as dt
from disttensor import nn
from disttensor.autograd import Function, Tensor
from disttensor.nn import functional as F

from checks import COMM, SIZE, expect, grid
from conftest import assert_raises_all
from gradchecks import close, guarded, layouts_2d, tensor_on, value_of

RANK = COMM.Get_rank()


# -- 1. the reducer: None gradients -----------------------------------------------------------
class _Net(nn.Module):
    def __init__(self, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.conv = nn.Conv1d(2, 3, 3, padding=1, dtype="float64", rng=rng)
        self.fc = nn.Linear(15, 2, dtype="float64", rng=rng)
        self.unused = nn.Linear(2, 2, dtype="float64", rng=rng)

    def forward(self, x):
        return self.fc(F.flatten(F.relu(self.conv(x))))


def _train(g, split, wrap, steps=3):
    net = _Net(7)
    model = nn.DistributedDataParallel(net, g, bucket_bytes=256) if wrap else net
    net.conv.bias.requires_grad_(False)  # frozen AFTER wrapping
    opt = nn.optim.AdamW(net.parameters(), lr=0.05, weight_decay=0.1)
    rng = np.random.default_rng(3)
    for _ in range(steps):
        x = rng.standard_normal((3, 2, 5))
        y = rng.standard_normal((3, 2))
        xt = Tensor(dt.from_global(x, grid=g, split=split))
        yt = Tensor(dt.from_global(y, grid=g, split=(split[0], None)))
        opt.zero_grad()
        F.mse_loss(model(xt), yt).backward()
        expect(net.unused.weight.grad is None and net.unused.bias.grad is None,
               "a parameter unused on every rank got a gradient")
        expect(net.conv.bias.grad is None, "a frozen parameter got a gradient")
        opt.step()
    if wrap:
        model.reducer.release()
    return net


@pytest.mark.parametrize("spatial", [False, True])
@guarded
def test_ddp_keeps_none_for_frozen_and_unused(spatial):
    g = grid((1, SIZE) if spatial else (SIZE, 1))
    split = (None, None, 1) if spatial else (0, None, None)
    ref = _Net(7)
    wrapped = _train(g, split, True)
    plain = _train(g, split, False)
    for (name, p), (_, q), (_, r) in zip(wrapped.named_parameters(), plain.named_parameters(),
                                         ref.named_parameters()):
        close(p.data, q.data, f"wrapped vs unwrapped {name}", rtol=1e-12, atol=1e-14)
        if name.startswith("unused") or name == "conv.bias":
            expect(np.array_equal(p.data, r.data), f"{name} moved under DDP")


class _LocalUse(Function):
    """``x + w`` on this rank's data, with a gradient for ``w`` that needs no communication
    (ones): a parameter a program can use on some ranks only."""
    @staticmethod
    def forward(ctx, x, w):
        return x.data

    @staticmethod
    def backward(ctx, g):
        return g, np.ones(2)


@guarded
def test_ddp_parameter_used_on_some_ranks_gets_the_sum():
    g = grid((SIZE,))
    m = nn.Linear(2, 2, dtype="float64", rng=np.random.default_rng(0))
    m.register_parameter("extra", nn.Parameter(np.zeros(2)))
    ddp = nn.DistributedDataParallel(m, g)
    x = Tensor(dt.from_global(np.ones((SIZE, 2)), grid=g, split=(0, None)))
    out = ddp(x)
    if RANK == 0:  # only rank 0's graph uses `extra` (its gradient: ones, a full gradient)
        out = _LocalUse.apply(out, m.extra)
    out.sum().backward()
    ddp.reducer.release()
    expect(m.extra.grad is not None, "used on rank 0: every rank must get the gradient")
    if m.extra.grad is not None:
        close(m.extra.grad, np.ones(2), "the summed gradient of a parameter used on rank 0")


# -- 2. and 3. dtype mismatch and NumPy inputs --------------------------------------------------
@guarded
def test_dtype_mismatch_raises_outside_autocast():
    g = grid((SIZE,))
    lin = nn.Linear(4, 3, dtype="float64", rng=np.random.default_rng(0))
    conv = nn.Conv1d(2, 2, 3, dtype="float64", rng=np.random.default_rng(0))
    x32 = Tensor(dt.from_global(np.ones((5, 4), np.float32), grid=g, split=(0, None)))
    c32 = Tensor(dt.from_global(np.ones((2, 2, 6), np.float32), grid=g, split=(None, None, 0)))
    assert_raises_all(COMM, RuntimeError, r"linear\(\): expected input and weight to have the "
                      r"same dtype, but got input float32 and weight float64", lambda: lin(x32))
    assert_raises_all(COMM, RuntimeError, "conv.*same dtype", lambda: conv(c32))
    lin.float()
    x16 = Tensor(dt.from_global(np.ones((5, 4), np.float16), grid=g, split=(0, None)))
    assert_raises_all(COMM, RuntimeError, "float16 and weight float32", lambda: lin(x16))
    with nn.amp.autocast():
        xt = Tensor(dt.from_global(np.ones((5, 4), np.float16), grid=g, split=(0, None)),
                    requires_grad=True)
        y = lin(xt)
        y.sum().backward()
    expect(y.data.dtype == np.float16, f"autocast output dtype {y.data.dtype}")
    expect(lin.weight.grad is not None and lin.weight.grad.dtype == np.float32,
           "autocast: the float32 master weight gets a float32 gradient")


@pytest.mark.skipif(SIZE < 2, reason="needs ranks that differ")
def test_dtype_that_differs_between_ranks_raises_on_every_rank():
    """Rank 0's layer is float64, the others' float32: rank 0 passes the rule and goes on into
    the op, the others fail it; the agreement makes every rank raise.  A dense layer moves no
    data, so rank 0 defers its agreement to the next one over the grid (here an explicit
    ``settle``, in a model the next op's): the failing ranks agree at once and wait there."""
    from disttensor.core.agreement import ArgumentMismatchError, settle
    g = grid((SIZE,))
    lin = nn.Linear(4, 3, dtype="float64" if RANK == 0 else "float32",
                    rng=np.random.default_rng(0))
    x = Tensor(dt.from_global(np.ones((5, 4)), grid=g, split=(0, None)))

    def call():
        lin(x)
        settle(g.cart)
    assert_raises_all(COMM, ArgumentMismatchError, "linear", call)


def test_numpy_input_raises_type_error():
    lin = nn.Linear(4, 3)
    assert_raises_all(COMM, TypeError, r"linear\(\): argument 'input' must be Tensor, not "
                      r"numpy.ndarray", lambda: lin(np.ones((2, 4), np.float32)))
    conv = nn.Conv3d(1, 1, 1)
    assert_raises_all(COMM, TypeError, "must be Tensor, not numpy.ndarray",
                      lambda: conv(np.ones((1, 1, 2, 2, 2), np.float32)))
    assert_raises_all(COMM, TypeError, r"relu\(\): argument 'input' must be Tensor, not list",
                      lambda: F.relu([1.0]))


# -- 4. hooks ---------------------------------------------------------------------------------
def _conv_reference(x, w, b):
    """NumPy Conv1d (padding 1, kernel 3) and its input/weight gradients for output grad."""
    n, c, length = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    cols = np.stack([xp[:, :, k:k + length] for k in range(3)], axis=-1)  # n c l k
    y = np.einsum("nclk,ock->nol", cols, w) + b[None, :, None]

    def grads(gy):
        gw = np.einsum("nclk,nol->ock", cols, gy)
        gcols = np.einsum("nol,ock->nclk", gy, w)
        gxp = np.zeros_like(xp)
        for k in range(3):
            gxp[:, :, k:k + length] += gcols[..., k]
        return gxp[:, :, 1:-1], gw
    return y, grads


@pytest.mark.parametrize("spatial", [False, True])
@guarded
def test_module_hooks_order_replacement_removal(spatial):
    g = grid((1, SIZE) if spatial else (SIZE, 1))
    split = (None, None, 1) if spatial else (0, None, None)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 5))
    r = rng.standard_normal((3, 2, 5))
    conv = nn.Conv1d(2, 2, 3, padding=1, dtype="float64", rng=rng)
    w, b = conv.weight.data.copy(), conv.bias.data.copy()
    y_ref, grads_ref = _conv_reference(x, w, b)
    calls = []
    h1 = conv.register_forward_pre_hook(lambda m, a: calls.append("pre1"))
    conv.register_forward_pre_hook(lambda m, a: calls.append("pre0"), prepend=True)
    # a pre-hook with kwargs replacing the input by 2x
    conv.register_forward_pre_hook(lambda m, a, kw: ((a[0] * 2.0,), kw), with_kwargs=True)
    conv.register_forward_hook(lambda m, a, out: out * 3.0)  # replaces the output
    seen = {}

    def bw_pre(m, grad_output):
        seen["go"] = value_of(grad_output[0])
        return (grad_output[0] * 0.5,)

    def bw(m, grad_input, grad_output):
        seen["gi"] = value_of(grad_input[0])
        seen["go_post"] = value_of(grad_output[0])
        calls.append("bw")
        return (grad_input[0] * 10.0,)
    conv.register_full_backward_pre_hook(bw_pre)
    conv.register_full_backward_hook(bw)
    xt = Tensor(dt.from_global(x, grid=g, split=split), requires_grad=True)
    out = conv(xt)
    y_want, grads2 = _conv_reference(2 * x, w, b)
    close(value_of(out), 3 * y_want, "forward with replaced input and output")
    (out * Tensor(dt.from_global(r, grid=g, split=split))).sum().backward()
    # as PyTorch, grad_output is the gradient of the output the forward hooks returned (r);
    # the pre-hook halves it, and the forward hook's x3 makes 1.5 r at the module's output
    gx_mod, gw = grads2(1.5 * r)
    close(seen.get("go"), r, "grad_output seen by the backward pre-hook")
    close(seen.get("go_post"), 0.5 * r, "grad_output seen by the backward hook")
    close(seen.get("gi"), gx_mod, "grad_input of the module (its input is 2 x)")
    close(value_of(xt.grad), 10.0 * 2.0 * gx_mod, "x.grad with the replaced grad_input")
    close(conv.weight.grad, gw, "weight gradient with the replaced grad_output")
    expect(calls == ["pre0", "pre1", "bw"], f"hook order {calls}")
    # removal: the handle and the context manager
    h1.remove()
    with conv.register_forward_hook(lambda m, a, o: calls.append("ctx")):
        conv(xt)
    conv(xt)
    expect(calls.count("ctx") == 1, "a hook removed by its context manager ran again")
    expect(calls.count("pre1") == 1, "a removed hook ran again")
    del y_ref, grads_ref


def test_backward_hook_wrong_shape_raises_on_every_rank():
    g = grid((SIZE,))
    lin = nn.Linear(3, 2, dtype="float64", rng=np.random.default_rng(0))
    lin.register_full_backward_hook(lambda m, gi, go: (dt.zeros((4, 4), grid=g),))
    xt = Tensor(dt.from_global(np.ones((4, 3)), grid=g, split=(0, None)), requires_grad=True)
    y = lin(xt)
    assert_raises_all(COMM, RuntimeError, r"shape \(4, 4\) for inputs 0, which has shape "
                      r"\(4, 3\)", lambda: y.sum().backward())
    t = Tensor(dt.from_global(np.ones((4, 3)), grid=g, split=(0, None)), requires_grad=True)
    u = t * 2.0
    u.register_hook(lambda gr: dt.zeros((2,), grid=g))
    assert_raises_all(COMM, RuntimeError, "has changed the size", lambda: u.sum().backward())


@guarded
def test_tensor_hooks_and_retain_grad():
    for layout in layouts_2d((3, 4)):
        rng = np.random.default_rng(11)
        a, wv, r = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal(
            (3, 4))
        x = tensor_on(a, layout, True)
        w = Tensor(wv.copy(), requires_grad=True)
        y = x * w
        y.retain_grad()
        order = []
        y.register_hook(lambda gr: order.append("h1"))
        y.register_hook(lambda gr: gr * 2.0)
        w.register_hook(lambda gr: (order.append("w"), gr + 1.0)[1])
        z = y.exp()
        (z * Tensor(tensor_on(r, layout).data)).sum().backward()
        gy = r * np.exp(a * wv)
        expect(y.retains_grad and not x.retains_grad, "retains_grad")
        close(value_of(y.grad), 2.0 * gy, f"retained y.grad {layout}")  # after the hooks
        close(value_of(x.grad), 2.0 * gy * wv, f"x.grad through the hooked y {layout}")
        close(w.grad, (2.0 * gy * a).sum(0) + 1.0, f"leaf hook replaces w's gradient {layout}")
        expect(order == ["h1", "w"], f"hook order {order}")
        expect(z.grad is None, "a non-leaf without retain_grad keeps grad None")


# -- 5. custom functions ----------------------------------------------------------------------
class _ScaledCube(Function):
    @staticmethod
    def forward(ctx, x, w, scale):
        ctx.save_for_backward(x, w)
        ctx.scale = scale
        return np.multiply(np.power(x.data, 3), w.data) * scale

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g * 3 * np.power(x.data, 2) * w.data * ctx.scale if ctx.needs_input_grad[0] \
            else None
        gw = None
        if ctx.needs_input_grad[1]:
            gw = np.asarray(dt.sum(g * np.power(x.data, 3) * ctx.scale, axis=0).to_numpy())
        return gx, gw, None


class _SplitSigns(Function):
    """Two outputs: the positive and the negative part."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.maximum(x.data, 0), np.minimum(x.data, 0)

    @staticmethod
    def backward(ctx, gp, gn):
        (x,) = ctx.saved_tensors
        return dt.where(x.data > 0, gp, gn)


class _WrongCount(Function):
    @staticmethod
    def forward(ctx, x):
        return x.data * 2

    @staticmethod
    def backward(ctx, g):
        return g, g


@guarded
def test_function_against_numpy():
    for layout in layouts_2d((3, 4)):
        rng = np.random.default_rng(2)
        a, wv, r = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal(
            (3, 4))
        x, w = tensor_on(a, layout, True), Tensor(wv.copy(), requires_grad=True)
        y = _ScaledCube.apply(x, w, 0.5)
        close(value_of(y), a ** 3 * wv * 0.5, f"Function forward {layout}")
        (y * Tensor(tensor_on(r, layout).data)).sum().backward()
        close(value_of(x.grad), r * 3 * a ** 2 * wv * 0.5, f"Function dx {layout}")
        close(w.grad, (r * a ** 3 * 0.5).sum(0), f"Function dw {layout}")
        x2 = tensor_on(a, layout, True)
        p, n = _SplitSigns.apply(x2)
        (p * 2.0 + n * 3.0).sum().backward()
        close(value_of(x2.grad), np.where(a > 0, 2.0, 3.0), f"two-output Function {layout}")
    x = tensor_on(np.ones((3, 4)), layouts_2d((3, 4))[0], True)
    y = _WrongCount.apply(x)
    assert_raises_all(COMM, RuntimeError, r"incorrect number of gradients \(expected 1, got 2\)",
                      lambda: y.sum().backward())
