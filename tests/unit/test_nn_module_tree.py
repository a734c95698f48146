"""PyTorch's Module API on disttensor modules (no MPI communication): traversal
(``apply``, ``named_children``, ``named_modules`` with ``memo``/``prefix``/
``remove_duplicate``, ``parameters(recurse=)``), ``get_submodule``/``get_parameter``/
``get_buffer`` and their errors, the containers ``ModuleDict``/``ParameterList``/
``ParameterDict`` (registration, ``state_dict`` names, ``to``), dtype casts (``double``,
``float``, ``half``, ``to(dtype)``), ``numel``, forward hooks on replicated values and
:class:`~disttensor.autograd.hooks.RemovableHandle`."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor import nn
from disttensor.autograd import Tensor
from disttensor.nn import ModuleDict, ParameterDict, ParameterList


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2, rng=np.random.default_rng(0))
        self.bn = nn.BatchNorm1d(2)


def make():
    shared = Block()
    m = nn.Sequential(shared, nn.ReLU(), shared)
    return m, shared


def test_named_modules_dedup_prefix_memo():
    m, shared = make()
    names = [n for n, _ in m.named_modules()]
    assert names == ["", "0", "0.lin", "0.bn", "1"]
    all_names = [n for n, _ in m.named_modules(remove_duplicate=False)]
    assert all_names == ["", "0", "0.lin", "0.bn", "1", "2", "2.lin", "2.bn"]
    assert [n for n, _ in m.named_modules(prefix="net")][:2] == ["net", "net.0"]
    memo = {id(shared)}
    assert [n for n, _ in m.named_modules(memo)] == ["", "1"]
    assert [n for n, _ in m.named_children()] == ["0", "1"]  # the shared child once
    assert [type(c).__name__ for c in m.children()] == ["Block", "ReLU"]


def test_parameters_recurse_and_state_dict_of_shared_modules():
    m, shared = make()
    assert len(list(m.parameters())) == 4  # lin.weight, lin.bias, bn.weight, bn.bias
    assert list(m.parameters(recurse=False)) == []
    assert [n for n, _ in shared.named_parameters(recurse=False)] == []
    assert [n for n, _ in shared.lin.named_parameters(prefix="x")] == ["x.weight", "x.bias"]
    # state_dict keeps both names of a shared module, as PyTorch
    keys = list(m.state_dict())
    assert "0.lin.weight" in keys and "2.lin.weight" in keys
    assert [n for n, _ in m.named_buffers()] == ["0.bn.running_mean", "0.bn.running_var",
                                                 "0.bn.num_batches_tracked"]


def test_apply_order_and_return():
    m, _ = make()
    seen = []
    assert m.apply(lambda mod: seen.append(type(mod).__name__)) is m
    assert seen == ["Linear", "BatchNorm1d", "Block", "ReLU", "Sequential"]


def test_get_submodule_parameter_buffer():
    m, shared = make()
    assert m.get_submodule("") is m
    assert m.get_submodule("0.lin") is shared.lin
    assert m.get_parameter("0.lin.bias") is shared.lin.bias
    assert m.get_buffer("2.bn.running_mean") is shared.bn.running_mean
    with pytest.raises(AttributeError, match="Block has no attribute `conv`"):
        m.get_submodule("0.conv")
    with pytest.raises(AttributeError, match="`weight` is not an nn.Module"):
        m.get_submodule("0.lin.weight")
    with pytest.raises(AttributeError, match="Linear has no attribute `gamma`"):
        m.get_parameter("0.lin.gamma")
    with pytest.raises(AttributeError, match="`running_mean` is not an nn.Parameter"):
        m.get_parameter("0.bn.running_mean")


def test_containers():
    d = ModuleDict({"a": nn.Linear(2, 2), "b": nn.ReLU()})
    d["c"] = nn.Tanh()
    assert list(d) == ["a", "b", "c"] and "b" in d and len(d) == 3
    assert isinstance(d.pop("b"), nn.ReLU) and list(d.keys()) == ["a", "c"]
    assert [n for n, _ in d.named_parameters()] == ["a.weight", "a.bias"]
    with pytest.raises(TypeError, match="must be Modules"):
        d["x"] = 3
    pl = ParameterList([np.zeros(2), nn.Parameter(np.ones(3))])
    pl.append(Tensor(np.full(4, 2.0)))
    assert len(pl) == 3 and all(isinstance(p, nn.Parameter) for p in pl)
    assert pl[-1].shape == (4,) and len(pl[1:]) == 2 and pl[1:][0] is pl[1]
    with pytest.raises(IndexError):
        pl[3]
    pd = ParameterDict({"w": np.zeros((2, 2))})
    pd.update([("b", np.zeros(2))])
    holder = nn.Module()
    holder.plist, holder.pdict, holder.mdict = pl, pd, d
    keys = list(holder.state_dict())
    assert keys[:3] == ["plist.0", "plist.1", "plist.2"]
    assert "pdict.w" in keys and "pdict.b" in keys and "mdict.a.weight" in keys
    holder.double()
    assert all(p.dtype == np.float64 for p in holder.parameters())
    assert pd.get("zz") is None and set(pd.keys()) == {"w", "b"}


def test_dtype_casts_and_numel():
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    assert m.double() is m
    assert all(p.dtype == np.float64 for p in m.parameters())
    assert m[1].num_batches_tracked.dtype.kind == "i"  # integer buffers are not cast
    m.float()
    assert all(p.dtype == np.float32 for p in m.parameters())
    m.half()
    assert all(p.dtype == np.float16 for p in m.parameters())
    m.to("float64")  # PyTorch's m.to(torch.float64)
    assert all(p.dtype == np.float64 for p in m.parameters())
    m.to(dtype=np.float32)
    assert all(p.dtype == np.float32 for p in m.parameters())
    with pytest.raises(TypeError, match="floating point or complex"):
        m.to(dtype=np.int32)
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(TypeError, match="ml_dtypes"):
            m.bfloat16()
    assert m[0].weight.numel() == 6 and m[0].weight.size() == (2, 3)
    assert m[0].weight.dim() == 2 and m[0].weight.size(-1) == 3


def test_forward_hooks_kwargs_prepend_and_handles():
    class Affine(nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    m = Affine()
    log = []
    h_pre = m.register_forward_pre_hook(lambda mod, args: (log.append("pre"), None)[1])
    m.register_forward_pre_hook(lambda mod, args, kw: ((args[0] + 1,), {"scale": 10.0}),
                                with_kwargs=True)
    m.register_forward_hook(lambda mod, args, kw, out: log.append(("kw", kw)) or out * 2,
                            with_kwargs=True)
    m.register_forward_hook(lambda mod, args, out: log.append("first"), prepend=True)
    out = m(Tensor(np.ones(2)), scale=3.0)
    np.testing.assert_array_equal(out.data, (1 + 1) * 10.0 * 2 * np.ones(2))
    assert log == ["pre", "first", ("kw", {"scale": 10.0})]
    h_pre.remove()
    h_pre.remove()  # idempotent
    log.clear()
    m(Tensor(np.ones(2)))
    assert "pre" not in log
    with pytest.raises(RuntimeError, match="forward pre-hook must return None or a tuple"):
        bad = Affine()
        bad.register_forward_pre_hook(lambda mod, a, kw: 3, with_kwargs=True)
        bad(Tensor(np.ones(2)))
    with pytest.raises(TypeError, match="callable"):
        m.register_forward_hook(3)


def test_always_call_forward_hook_runs_when_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    m = Boom()
    ran = []
    m.register_forward_hook(lambda mod, a, o: ran.append(o), always_call=True)
    m.register_forward_hook(lambda mod, a, o: ran.append("never"))
    with pytest.raises(ValueError, match="boom"):
        m(Tensor(np.ones(1)))
    assert ran == [None]


def test_tensor_hook_on_replicated_leaf_and_retain_grad_errors():
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = w.register_hook(lambda g: g * 3)
    (w * w).sum().backward()
    np.testing.assert_allclose(w.grad, 3 * 2 * np.array([1.0, 2.0]))
    h.remove()
    w.grad = None
    (w * w).sum().backward()
    np.testing.assert_allclose(w.grad, 2 * np.array([1.0, 2.0]))
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        Tensor(np.ones(2)).register_hook(lambda g: g)
    w.retain_grad()  # a no-op on leaves
    assert not w.retains_grad
