"""Containers in PyTorch's style: :class:`ModuleDict`, :class:`ParameterList`,
:class:`ParameterDict` (``Sequential`` and ``ModuleList`` live in :mod:`.module`).

Their members are registered like attributes, so ``parameters()``, ``state_dict()`` (names
``<container>.<key>``), ``to()`` and the optimizers see them.  A tensor or array put into a
parameter container becomes a :class:`~disttensor.nn.Parameter` (as PyTorch 2.x).
"""
from __future__ import annotations

from collections.abc import Mapping

from ..autograd.tensor import Tensor
from .module import Module, Parameter

__all__ = ["ModuleDict", "ParameterList", "ParameterDict"]


def _key(key) -> str:
    if not isinstance(key, str):
        raise TypeError(f"keys must be strings, got {type(key).__name__}")
    return key


def _pairs(items):
    if isinstance(items, Mapping):
        return list(items.items())
    out = []
    for j, kv in enumerate(items):
        if not isinstance(kv, (tuple, list)) or len(kv) != 2:
            raise ValueError(f"update sequence element #{j} is not a (key, value) pair")
        out.append(tuple(kv))
    return out


class ModuleDict(Module):
    """Child modules by name (insertion order), e.g. ``ModuleDict({'enc': ..., 'dec': ...})``;
    ``d['enc']``, ``d['x'] = m``, ``del d['x']``, ``in``, ``len``, iteration over the keys,
    ``keys``/``values``/``items``/``update``/``pop``/``clear``."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"ModuleDict values must be Modules, got {type(module).__name__}")
        self.add_module(_key(key), module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules) -> None:
        for k, m in _pairs(modules):
            self[k] = m

    def pop(self, key: str) -> Module:
        m = self._modules[key]
        del self[key]
        return m

    def clear(self) -> None:
        self._modules.clear()

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward(): call its members")


def _as_parameter(value):
    if isinstance(value, Parameter) or value is None:
        return value
    if isinstance(value, Tensor):
        return Parameter(value.data, requires_grad=True)
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return Parameter(value)
    raise TypeError(f"a parameter container holds Parameters, tensors or arrays, got "
                    f"{type(value).__name__}")


class ParameterList(Module):
    """Parameters by position (names ``0``, ``1``, ...): ``append``, ``extend``, indexing
    (a slice gives a new ParameterList of the same parameters), assignment, ``len``,
    iteration."""

    def __init__(self, values=None):
        super().__init__()
        if values is not None:
            self.extend(values)

    def _index(self, i: int) -> str:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range")
        return str(i % n)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ParameterList(list(self._parameters.values())[i])
        return self._parameters[self._index(i)]

    def __setitem__(self, i: int, value) -> None:
        self.register_parameter(self._index(i), _as_parameter(value))

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())

    def append(self, value) -> "ParameterList":
        self.register_parameter(str(len(self)), _as_parameter(value))
        return self

    def extend(self, values) -> "ParameterList":
        for v in values:
            self.append(v)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"  ({k}): {p!r}" for k, p in self._parameters.items())

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ParameterList has no forward()")


class ParameterDict(Module):
    """Parameters by name (insertion order): ``d['w']``, ``d['w'] = p``, ``del``, ``in``,
    ``len``, iteration over the keys, ``keys``/``values``/``items``/``update``/``pop``/
    ``get``/``clear``."""

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str):
        return self._parameters[key]

    def __setitem__(self, key: str, value) -> None:
        self.register_parameter(_key(key), _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._parameters[key]

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters)

    def __contains__(self, key) -> bool:
        return key in self._parameters

    def keys(self):
        return self._parameters.keys()

    def values(self):
        return self._parameters.values()

    def items(self):
        return self._parameters.items()

    def get(self, key: str, default=None):
        return self._parameters.get(key, default)

    def update(self, parameters) -> None:
        for k, v in _pairs(parameters):
            self[k] = v

    def pop(self, key: str):
        p = self._parameters[key]
        del self[key]
        return p

    def clear(self) -> None:
        self._parameters.clear()

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ParameterDict has no forward()")
