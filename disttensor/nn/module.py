"""``Module``, ``Parameter``, ``Sequential`` and ``ModuleList`` in PyTorch's style.

Parameters and buffers are *replicated*: every rank holds the whole array (NumPy on CPU, CuPy
on GPU), identical everywhere; activations are DistArrays.  A module built with the same seed
(:func:`disttensor.nn.init.manual_seed` or an explicit ``rng``) has the same weights on every
rank and on any grid.  ``state_dict()`` uses PyTorch's dotted names (``features.0.weight``,
``bn.running_mean``), so weights move between disttensor and PyTorch by name.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

import numpy as np

from ..autograd.tensor import Tensor
from ..core.backend import array_module, to_host, xp_for
from .module_hooks import ModuleHooks

__all__ = ["Parameter", "Module", "Sequential", "ModuleList", "sequential_layers"]


class Parameter(Tensor):
    """A replicated learnable array (a leaf tensor with ``requires_grad=True``)."""

    def __init__(self, data, requires_grad: bool = True, name: str | None = None):
        if isinstance(data, Tensor):
            data = data.data
        if not hasattr(data, "dtype") or not hasattr(data, "shape"):
            data = np.asarray(data, dtype=np.float32)
        super().__init__(data, requires_grad=requires_grad, name=name)

    def __repr__(self) -> str:
        return f"Parameter(shape={self.shape}, dtype={self.data.dtype}, device={self.device})"


class Module(ModuleHooks):
    """Base class of layers and models: holds parameters, buffers and child modules as
    attributes (registered by assignment, in order), ``training`` mode, and ``forward``.

    PyTorch's API: traversal (``children``, ``named_children``, ``modules``,
    ``named_modules(memo, prefix, remove_duplicate)``, ``parameters(recurse)``,
    ``named_parameters(prefix, recurse, remove_duplicate)``, ``buffers``, ``apply``,
    ``get_submodule``, ``get_parameter``, ``get_buffer``), dtypes (``double``, ``float``,
    ``half``, ``bfloat16`` where NumPy has it, ``to(dtype)``), hooks
    (:mod:`disttensor.nn.module_hooks`), state dicts with PyTorch's names."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # -- registration ---------------------------------------------------------------------
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("call Module.__init__() before assigning attributes")
        if name in self._buffers and not isinstance(value, (Parameter, Module)):
            self._buffers[name] = value  # a registered buffer stays one (as in PyTorch)
            return
        for d in (self._parameters, self._buffers, self._modules):
            d.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name):
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            if key in d and name in d[key]:
                return d[key][name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def __delattr__(self, name):
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name: str, value) -> None:
        """A replicated non-learnable array saved in ``state_dict`` (e.g. running stats);
        ``None`` registers an empty slot."""
        self.__dict__.pop(name, None)
        self._buffers[name] = value

    def register_parameter(self, name: str, value: Parameter | None) -> None:
        if value is not None and not isinstance(value, Parameter):
            raise TypeError(f"{name} must be a Parameter or None")
        self.__dict__.pop(name, None)
        self._parameters[name] = value

    def add_module(self, name: str, module: "Module | None") -> None:
        self._modules[name] = module

    # -- traversal ------------------------------------------------------------------------
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        """``(name, module)`` for this module and every descendant, depth first; a module
        reached twice is given once unless ``remove_duplicate=False`` (PyTorch's order)."""
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name,
                                           remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """``(name, child)`` for each direct child (once each)."""
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self) -> Iterator["Module"]:
        for _, m in self.named_children():
            yield m

    def _named_members(self, slot: str, prefix: str, recurse: bool, remove_duplicate: bool):
        seen = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) \
            if recurse else [(prefix, self)]
        for mname, m in mods:
            for name, v in getattr(m, slot).items():
                if v is None or (remove_duplicate and id(v) in seen):
                    continue
                seen.add(id(v))
                yield (f"{mname}.{name}" if mname else name), v

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, object]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[object]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def num_parameters(self) -> int:
        return int(sum(p.data.size for p in self.parameters()))

    def apply(self, fn) -> "Module":
        """``fn(module)`` on every child (recursively), then on this module; returns self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def get_submodule(self, target: str) -> "Module":
        """The descendant named by the dotted path ``target`` (``''``: this module);
        ``AttributeError`` naming the missing piece, as PyTorch."""
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if item not in mod._modules or mod._modules[item] is None:
                if item in mod.__dict__ or item in mod._parameters or item in mod._buffers:
                    raise AttributeError(f"`{item}` is not an nn.Module")
                raise AttributeError(f"{type(mod).__name__} has no attribute `{item}`")
            mod = mod._modules[item]
        return mod

    def _get_member(self, target: str, slot: str, what: str):
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        members = getattr(mod, slot)
        if name not in members:
            if hasattr(mod, name) or name in mod._modules:
                raise AttributeError(f"`{name}` is not {what}")
            raise AttributeError(f"{type(mod).__name__} has no attribute `{name}`")
        return members[name]

    def get_parameter(self, target: str) -> Parameter:
        """The parameter named by the dotted path ``target`` (``'features.0.weight'``)."""
        return self._get_member(target, "_parameters", "an nn.Parameter")

    def get_buffer(self, target: str):
        """The buffer named by the dotted path ``target``."""
        return self._get_member(target, "_buffers", "a buffer")

    # -- modes ----------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad[...] = 0

    def requires_grad_(self, flag: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad = bool(flag)
        return self

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, object]":
        """Every parameter and buffer by dotted name (the arrays themselves, not copies)."""
        out = OrderedDict()
        for mname, m in self.named_modules(remove_duplicate=False):
            for name, p in m._parameters.items():
                if p is not None:
                    out[f"{mname}.{name}" if mname else name] = p.data
            for name, b in m._buffers.items():
                if b is not None:
                    out[f"{mname}.{name}" if mname else name] = b
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list, list]:
        """Copy arrays into the parameters and buffers of the same names (shapes must
        match; values are cast to each slot's dtype and device).  Returns ``(missing,
        unexpected)``; with ``strict`` either raises ``KeyError``.  Not collective: every rank
        must pass the same state (as :func:`disttensor.io.load_checkpoint` gives)."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys "
                           f"{unexpected}")
        for k, dst in own.items():
            if k not in state:
                continue
            src = state[k]
            src = src.data if isinstance(src, Tensor) else src
            if tuple(np.shape(src)) != tuple(dst.shape):
                raise ValueError(f"load_state_dict: {k} has shape {tuple(np.shape(src))}, the "
                                 f"model expects {tuple(dst.shape)}")
            xp = array_module(dst)
            dst[...] = xp.asarray(to_host(src) if xp is np else src, dtype=dst.dtype)
        return missing, unexpected

    def to(self, device: str | None = None, dtype=None) -> "Module":
        """Move parameters and buffers to ``device`` (``'cpu'``/``'cuda'``) and/or cast
        floating ones to ``dtype`` (a floating dtype; ``to('float64')`` alone casts, as
        PyTorch's ``to(torch.float64)``); in place, returns ``self``."""
        if device is not None and not str(device).startswith(("cpu", "cuda")):
            if dtype is not None:
                raise TypeError(f"to(): {device!r} is not a device")
            device, dtype = None, device
        if dtype is not None:
            dtype = _float_dtype(dtype)
        xp = xp_for(device) if device is not None else None

        def move(a):
            if xp is not None and array_module(a) is not xp:
                a = xp.asarray(to_host(a)) if xp is np else xp.asarray(a)
            if dtype is not None and np.dtype(a.dtype).kind == "f":
                a = a.astype(dtype)
            return a
        for m in self.modules():
            for p in m._parameters.values():
                if p is not None:
                    p.data = move(p.data)
                    p.grad = None if p.grad is None else move(p.grad)
            for name, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[name] = move(b)
        return self

    def double(self) -> "Module":
        """Cast floating parameters and buffers to float64 (in place; returns self)."""
        return self.to(dtype=np.float64)

    def float(self) -> "Module":  # noqa: A003 - PyTorch's name
        return self.to(dtype=np.float32)

    def half(self) -> "Module":
        return self.to(dtype=np.float16)

    def bfloat16(self) -> "Module":
        """float16's 8-bit-exponent sibling: needs NumPy's ``bfloat16`` from the ``ml_dtypes``
        package (``TypeError`` without it)."""
        return self.to(dtype="bfloat16")

    # -- call -----------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        if self._has_hooks():
            return self._call_hooked(args, kwargs)
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")


def _float_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy floating dtype (``TypeError`` otherwise, as PyTorch's
    ``Module.to``)."""
    if str(dtype) == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("bfloat16 needs the ml_dtypes package (NumPy has no bfloat16)") \
                from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"to(): {dtype!r} is neither a device nor a dtype") from None
    if dt.kind not in "fc":
        raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got "
                        f"desired dtype={dt}")
    return dt


class Sequential(Module):
    """Modules applied in order; indexable, iterable (``Sequential(a, b)`` or from an
    ordered dict of names)."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, m in modules[0].items():
                self.add_module(str(name), m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return Sequential(*mods[i])
        return mods[i]

    def append(self, m: Module) -> "Sequential":
        self.add_module(str(len(self)), m)
        return self

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(Module):
    """A list of modules registered as children (names ``0``, ``1``, ...)."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m: Module) -> "ModuleList":
        self.add_module(str(len(self._modules)), m)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        return list(self._modules.values())[i]


def sequential_layers(model: Module) -> list[Module]:
    """The layers of ``model`` in forward order, for cutting it into pipeline stages.

    A :class:`Sequential` is expanded recursively; a module defining ``pipeline_layers()``
    (e.g. :class:`~disttensor.nn.models.CosmoFlow`) gives its own list, which is expanded
    the same way; any other module is one layer.  ``model(x)`` must equal applying the
    returned layers one after another (the model's own input checks aside), so models with
    skip connections (U-Net) are single layers here."""
    if isinstance(model, Sequential):
        out = []
        for m in model:
            out.extend(sequential_layers(m))
        return out
    own = getattr(model, "pipeline_layers", None)
    if callable(own):
        out = []
        for m in own():
            out.extend(sequential_layers(m))
        return out
    return [model]

