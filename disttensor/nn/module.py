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


class Module:
    """Base class of layers and models: holds parameters, buffers and child modules as
    attributes (registered by assignment, in order), ``training`` mode, and ``forward``."""

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
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator["Module"]:
        for m in self._modules.values():
            if m is not None:
                yield m

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        seen = set()
        for mname, m in self.named_modules(prefix):
            for name, p in m._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mname}.{name}" if mname else name), p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, object]]:
        for mname, m in self.named_modules(prefix):
            for name, b in m._buffers.items():
                if b is not None:
                    yield (f"{mname}.{name}" if mname else name), b

    def buffers(self) -> Iterator[object]:
        for _, b in self.named_buffers():
            yield b

    def num_parameters(self) -> int:
        return int(sum(p.data.size for p in self.parameters()))

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
        for mname, m in self.named_modules():
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
        floating ones to ``dtype``; in place, returns ``self``."""
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

    # -- call -----------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")


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

