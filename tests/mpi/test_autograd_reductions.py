"""PyTorch's tensor reductions and selections of :mod:`disttensor.autograd.reductions` under
MPI: ``sum``/``mean`` (``dim``, ``keepdim``), ``amax``, ``var``/``std`` (``correction``),
``max``/``min`` (whole tensor: ties share the gradient; ``dim=k``: ``(values, indices)`` and
the first extreme takes it), ``argmax``, ``clamp``/``clip`` (numbers and tensors, PyTorch's
rule for crossed bounds), ``where``: values and gradients against NumPy float64, on rows and
columns split over a 1-D grid, a 2-D grid, and blocks with an empty rank (uneven sizes).
"""
from __future__ import annotations

import numpy as np

import disttensor as dt
from disttensor import autograd as ag
from disttensor.autograd import Tensor

from checks import expect
from gradchecks import close, guarded, layouts_2d, tensor_on, value_of


def _expand(g, shape, dim, keepdim):
    g = np.asarray(g, dtype=np.float64)
    if dim is not None and not keepdim:
        g = np.expand_dims(g, dim)
    return np.broadcast_to(g, shape)


@guarded
def test_reductions_against_numpy():
    """Per layout and ``dim``: every reduction's value, and one backward of the weighted sum
    of all of them (so the summed NumPy gradients are checked at once)."""
    shape = (3, 4)
    for layout in layouts_2d(shape):
        rng = np.random.default_rng(4)
        a = rng.integers(0, 3, shape).astype(np.float64)  # ties
        for dim, keepdim in ((None, False), (0, False), (1, True)):
            k = f" dim={dim} keepdim={keepdim} {layout}"
            x = tensor_on(a, layout, True)
            loss, gref = 0.0, np.zeros(shape)
            for name in ("sum", "mean", "amax", "var", "std"):
                c = (0 if keepdim else 1) if name in ("var", "std") else 0
                kw = {"correction": c} if name in ("var", "std") else {}
                y = getattr(x, name)(dim=dim, keepdim=keepdim, **kw)
                want = {"sum": lambda: a.sum(dim, keepdims=keepdim),
                        "mean": lambda: a.mean(dim, keepdims=keepdim),
                        "amax": lambda: a.max(dim, keepdims=keepdim),
                        "var": lambda: a.var(dim, ddof=c, keepdims=keepdim),
                        "std": lambda: a.std(dim, ddof=c, keepdims=keepdim)}[name]()
                close(value_of(y), want, f"{name}{k}")
                r = rng.standard_normal(np.shape(want))
                rt = r.item() if np.ndim(want) == 0 else Tensor(
                    r if not isinstance(y.data, dt.DistArray) else
                    dt.from_global(r, grid=y.data.grid, split=y.data.split))
                loss = (y * rt).sum() + loss
                ge = _expand(r, shape, dim, keepdim)
                m = a.mean(dim, keepdims=True)
                n = a.size if dim is None else shape[dim]
                top = a == a.max(dim, keepdims=True)
                gref = gref + {"sum": lambda: ge, "mean": lambda: ge / n,
                               "amax": lambda: ge * top / top.sum(dim, keepdims=True),
                               "var": lambda: ge * 2 * (a - m) / (n - c),
                               "std": lambda: ge * (a - m) / ((n - c) * a.std(
                                   dim, ddof=c, keepdims=True))}[name]()
            loss.backward()
            close(value_of(x.grad), gref, f"d (sum mean amax var std){k}")
            # max/min: whole tensor (ties share) or along dim ((values, indices); the first
            # extreme takes the gradient); max + 2 min in one backward
            x = tensor_on(a, layout, True)
            if dim is None:
                vmax, vmin = x.max(), x.min()
                close([value_of(vmax), value_of(vmin)], [a.max(), a.min()], f"max() min(){k}")
                (vmax + vmin * 2.0).backward()
                hi, lo = a == a.max(), a == a.min()
                close(value_of(x.grad), hi / hi.sum() + 2 * lo / lo.sum(), f"d max/min ties{k}")
                continue
            (vmax, imax), (vmin, imin) = x.max(dim, keepdim=True), x.min(dim, keepdim=True)
            close(value_of(vmax), a.max(dim, keepdims=True), f"max(dim){k}")
            close(value_of(vmin), a.min(dim, keepdims=True), f"min(dim){k}")
            amx, amn = np.argmax(a, dim), np.argmin(a, dim)
            close(value_of(imax), np.expand_dims(amx, dim), f"max(dim) indices{k}")
            close(value_of(imin), np.expand_dims(amn, dim), f"min(dim) indices{k}")
            (vmax.sum() + vmin.sum() * 2.0).backward()
            onehot = np.zeros(shape)
            np.put_along_axis(onehot, np.expand_dims(amx, dim), 1.0, dim)
            two = np.zeros(shape)
            np.put_along_axis(two, np.expand_dims(amn, dim), 2.0, dim)
            close(value_of(x.grad), onehot + two, f"d max/min(dim): the first extreme{k}")
            close(value_of(x.argmax(dim)), amx, f"argmax(dim){k}")
        # clamp with numbers and tensors, where
        b = rng.standard_normal(shape)
        lo, hi = rng.standard_normal(shape) - 0.5, rng.standard_normal(shape) + 0.5
        x, tl, th = tensor_on(b, layout, True), tensor_on(lo, layout, True), tensor_on(hi, layout, True)
        y = x.clamp(tl, th)
        close(value_of(y), np.minimum(np.maximum(b, lo), hi), f"clamp(tensors) {layout}")
        y.sum().backward()
        close(value_of(x.grad), 1.0 * ((b >= lo) & (b <= hi)), f"d clamp / x {layout}")
        close(value_of(tl.grad), 1.0 * ((b < lo) & (lo < hi)), f"d clamp / min {layout}")
        close(value_of(th.grad), 1.0 * ((b > hi) | (hi < lo)), f"d clamp / max {layout}")
        x = tensor_on(b, layout, True)
        x.clip(min=-0.3).sum().backward()
        close(value_of(x.grad), 1.0 * (b >= -0.3), f"d clip(min=number) {layout}")
        x, z = tensor_on(b, layout, True), tensor_on(lo, layout, True)
        cond = tensor_on(b > 0, layout)
        y = ag.where(cond, x, z)
        close(value_of(y), np.where(b > 0, b, lo), f"where {layout}")
        (y * 2.0).sum().backward()
        close(value_of(x.grad), 2.0 * (b > 0), f"d where / x {layout}")
        close(value_of(z.grad), 2.0 * (b <= 0), f"d where / y {layout}")
    t = Tensor(np.zeros((2, 3, 4)))
    expect(t.numel() == 24 and t.size() == (2, 3, 4) and t.size(1) == 3 and t.dim() == 3,
           "numel/size/dim")
