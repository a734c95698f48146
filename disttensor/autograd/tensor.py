"""The define-by-run tape: :class:`Tensor`, graph nodes, and the backward engine.

A :class:`Tensor` wraps one value and remembers the :class:`Node` that made it:

* a :class:`~disttensor.DistArray` (activations: each rank holds its block),
* a NumPy/CuPy array (replicated values: parameters, buffers, identical on every rank),
* a Python float (losses: the same value on every rank).

Every differentiable function runs its forward eagerly and, when gradients are recorded
(:func:`is_grad_enabled`) and an input requires them, attaches a :class:`Node` holding a
closure that maps the output's gradient to the inputs' gradients.  The closure keeps what the
backward needs (the ops' ``saved`` state); :meth:`Tensor.backward` drops each closure once it
has run unless ``retain_graph=True``, so saved activations are freed as backward passes them.

Backward is collective whenever the graph holds collective ops (halo exchanges, all-reduces):
every rank runs the same nodes in the same order (ready nodes are taken newest first by their
creation number, which is the same on every rank for the same program).

Gradients of *leaves* (tensors created by the user with ``requires_grad=True``, e.g.
parameters) are summed over every use of the leaf and, once the last use has contributed, handed
to the leaf's gradient-ready hook (:meth:`Tensor.register_grad_ready_hook`) or added into
``.grad``.  A parameter whose gradient is *deferred* (``tensor.deferred_reduction`` set by a
data-parallel reducer) receives per-rank shares whose sum over the grid's ranks is the gradient
(see :func:`param_share`); the reducer's hook all-reduces them.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import numbers
import sys
import threading

import numpy as np

from ..core import buffer_pool as _pool, profiler as _profiler
from ..core.array import DistArray
from ..core.backend import array_module

__all__ = ["Tensor", "Node", "no_grad", "enable_grad", "is_grad_enabled", "make_result", "cancel_post_backward",
           "as_tensor", "param_share", "unwrap", "queue_post_backward"]

_state = threading.local()
_counter = itertools.count()


def is_grad_enabled() -> bool:
    """Whether differentiable functions record the graph (off inside :func:`no_grad`)."""
    return getattr(_state, "enabled", True)


@contextlib.contextmanager
def _grad_mode(enabled: bool):
    prev = is_grad_enabled()
    _state.enabled = enabled
    try:
        yield
    finally:
        _state.enabled = prev


def no_grad():
    """Context manager: functions run without recording the graph (inference, updates)."""
    return _grad_mode(False)


def enable_grad():
    """Context manager: record the graph again inside a :func:`no_grad` block."""
    return _grad_mode(True)


class Node:
    """One recorded function application: ``backward(grad_out) -> grads of parents``.

    ``parents`` are the input tensors (``None`` where an input needs no gradient);
    ``backward`` returns one gradient per parent (``None`` allowed).  ``seq`` orders nodes
    by creation (the same on every rank)."""

    __slots__ = ("parents", "backward", "name", "seq", "__weakref__")

    def __init__(self, parents, backward, name: str):
        self.parents = tuple(parents)
        self.backward = backward
        self.name = name
        self.seq = next(_counter)

    def __repr__(self) -> str:
        return f"<Node {self.name} #{self.seq}>"


class Tensor:
    """A value (DistArray, replicated array or float) with an optional gradient.

    ``data``: the value.  ``grad``: the accumulated gradient, shaped and distributed like
    ``data`` (``None`` until a backward reaches it).  ``requires_grad``: whether gradients
    flow to this tensor.  ``node``: the function that produced it (``None`` for leaves).
    """

    __array_priority__ = 1000  # NumPy scalars/arrays on the left defer to our operators

    def __init__(self, data, requires_grad: bool = False, name: str | None = None):
        if isinstance(data, Tensor):
            data = data.data
        self.data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self.node: Node | None = None
        self.name = name
        self._ready_hooks: list = []
        #: set by a data-parallel reducer to the grid it sums over: backward then hands this
        #: leaf per-rank shares of its gradient (see :func:`param_share`)
        self.deferred_reduction = None

    # -- introspection --------------------------------------------------------------------
    @property
    def is_leaf(self) -> bool:
        return self.node is None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.data)) if not isinstance(self.data, DistArray) \
            else self.data.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self):
        return np.dtype(type(self.data)) if isinstance(self.data, float) else self.data.dtype

    @property
    def device(self) -> str:
        if isinstance(self.data, DistArray):
            return self.data.device
        return "cpu" if array_module(self.data) is np else "cuda"

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        fn = f", node={self.node.name}" if self.node is not None else ""
        return f"Tensor({self.data!r}{grad}{fn})"

    def item(self) -> float:
        """The value of a one-element tensor as a Python number (same on every rank)."""
        d = self.data
        if isinstance(d, float):
            return d
        return d.item() if isinstance(d, DistArray) else array_module(d).asarray(d).item()

    def __float__(self) -> float:
        return float(self.item())

    def numpy(self):
        """The global value as a NumPy array (gathered on every rank for a DistArray)."""
        d = self.data
        if isinstance(d, DistArray):
            return d.to_numpy()
        if isinstance(d, float):
            return np.asarray(d)
        return d.get() if hasattr(d, "get") else np.asarray(d)

    def detach(self) -> "Tensor":
        """The same value, cut from the graph (no gradient flows through it)."""
        return Tensor(self.data)

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        if not self.is_leaf:
            raise RuntimeError("requires_grad can only be changed on leaf tensors")
        self.requires_grad = bool(flag)
        return self

    def register_grad_ready_hook(self, hook) -> None:
        """``hook(tensor, grad)`` runs when backward has summed every contribution to this
        leaf's gradient in the current pass.  A hook returning ``True`` takes the gradient
        (it must put it into ``.grad`` itself, e.g. after an all-reduce); otherwise the
        gradient is added into ``.grad``."""
        if not self.is_leaf:
            raise RuntimeError("gradient-ready hooks go on leaf tensors (parameters)")
        self._ready_hooks.append(hook)

    # -- backward -------------------------------------------------------------------------
    def backward(self, grad=None, retain_graph: bool = False) -> None:
        """Accumulate the gradient of this tensor into the ``.grad`` of every leaf that
        requires one (collective when the graph holds collective ops).  ``grad`` defaults to
        1 for a scalar (a loss); otherwise it must be shaped (and distributed) like ``data``."""
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad (no input "
                               "of the computation requires grad, or it ran under no_grad)")
        if grad is None:
            if self.shape not in ((), (1,)):
                raise RuntimeError(f"backward() without a gradient needs a scalar, got shape "
                                   f"{self.shape}")
            grad = 1.0 if isinstance(self.data, float) else _ones_like(self.data)
        elif isinstance(grad, Tensor):
            grad = grad.data
        run_backward(self, grad, retain_graph)

    # -- arithmetic (see disttensor.autograd.math) ------------------------------------------
    def __add__(self, o):
        return _math().add(self, o)

    def __radd__(self, o):
        return _math().add(o, self)

    def __sub__(self, o):
        return _math().subtract(self, o)

    def __rsub__(self, o):
        return _math().subtract(o, self)

    def __mul__(self, o):
        return _math().multiply(self, o)

    def __rmul__(self, o):
        return _math().multiply(o, self)

    def __truediv__(self, o):
        return _math().divide(self, o)

    def __rtruediv__(self, o):
        return _math().divide(o, self)

    def __neg__(self):
        return _math().negative(self)

    def __pow__(self, p):
        return _math().power(self, p)

    def __getitem__(self, key):
        return _math().getitem(self, key)

    def sum(self, dim=None, keepdim: bool = False, *, axis=None, keepdims=None):
        """Sum over ``dim`` (PyTorch's ``dim``/``keepdim`` or NumPy's ``axis``/``keepdims``)."""
        r = _red()
        return r.reduce_sum(self, *r.dim_args("sum", dim, keepdim, axis, keepdims))

    def mean(self, dim=None, keepdim: bool = False, *, axis=None, keepdims=None):
        r = _red()
        return r.reduce_mean(self, *r.dim_args("mean", dim, keepdim, axis, keepdims))

    # -- PyTorch's tensor methods (disttensor.autograd.reductions, .hooks) --------------------
    def max(self, dim=None, keepdim: bool = False):
        """``max()``: largest element; ``max(k)``: ``(values, indices)`` along ``k``."""
        return _red().max(self, dim, keepdim)

    def min(self, dim=None, keepdim: bool = False):
        return _red().min(self, dim, keepdim)

    def amax(self, dim=None, keepdim: bool = False):
        return _red().amax(self, dim, keepdim)

    def amin(self, dim=None, keepdim: bool = False):
        return _red().amin(self, dim, keepdim)

    def argmax(self, dim=None, keepdim: bool = False):
        return _red().argmax(self, dim, keepdim)

    def argmin(self, dim=None, keepdim: bool = False):
        return _red().argmin(self, dim, keepdim)

    def var(self, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
        return _red().var(self, dim, unbiased, keepdim, correction=correction)

    def std(self, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
        return _red().std(self, dim, unbiased, keepdim, correction=correction)

    def clamp(self, min=None, max=None):  # noqa: A002 - PyTorch's names
        return _red().clamp(self, min, max)

    clip = clamp

    def numel(self) -> int:
        """Number of elements (global for a DistArray)."""
        n = 1
        for k in self.shape:
            n *= int(k)
        return n

    def size(self, dim=None):
        """The shape, or its entry ``dim``."""
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.ndim

    def register_hook(self, hook):
        """``hook(grad) -> None | grad``, run when this tensor's gradient is complete (see
        :mod:`disttensor.autograd.hooks`); returns a removable handle."""
        from .hooks import register_tensor_hook
        return register_tensor_hook(self, hook)

    def retain_grad(self) -> None:
        """Keep this non-leaf's gradient in ``.grad`` at backward (no-op on leaves)."""
        from .hooks import retain_grad
        retain_grad(self)

    @property
    def retains_grad(self) -> bool:
        return bool(self.__dict__.get("_retains_grad", False)) and not self.is_leaf

    def reshape(self, *shape):
        return _math().reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes):
        if len(axes) == 1 and not isinstance(axes[0], numbers.Integral):
            axes = axes[0]  # t.transpose((1, 0)) or t.transpose(None); t.transpose(-1) is 1-d
        return _math().transpose(self, None if axes is None or not len(axes) else tuple(axes))

    @property
    def T(self):
        return _math().transpose(self, None)

    def exp(self):
        return _math().exp(self)

    def log(self):
        return _math().log(self)

    def sqrt(self):
        return _math().sqrt(self)

    def abs(self):
        return _math().absolute(self)

    def redistribute(self, **kwargs):
        return _math().redistribute(self, **kwargs)


def _math():
    from . import math
    return math


def _red():
    from . import reductions
    return reductions


def filled_like(d: DistArray, value) -> DistArray:
    """A DistArray distributed like ``d`` holding ``value`` everywhere (a new block: a 0-d
    ufunc result's block can be a NumPy scalar, which takes no item assignment)."""
    return DistArray(d.xp.full(np.shape(d.local), value, dtype=d.dtype), d.distribution, d.grid)


def _ones_like(d):
    return filled_like(d, 1) if isinstance(d, DistArray) else array_module(d).ones_like(d)


def unwrap(x):
    """The value of a tensor (anything else unchanged)."""
    return x.data if isinstance(x, Tensor) else x


def as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def make_result(data, inputs, backward, name: str) -> Tensor:
    """Wrap a forward result ``data`` computed from ``inputs`` (tensors or constants) and
    record ``backward(grad) -> tuple of grads, one per input`` when gradients are recorded and
    any tensor input requires them.  Gradients returned for inputs that are not tensors
    requiring grad are ignored."""
    prof = _profiler._active
    if prof is not None:  # the step profiler: the time since the last op is this op's
        prof.forward_op(name)
    out = Tensor(data)
    if not is_grad_enabled():
        return out
    parents = [x if isinstance(x, Tensor) and x.requires_grad else None for x in inputs]
    if any(p is not None for p in parents):
        out.requires_grad = True
        out.node = Node(parents, backward, name)
        _notify_recorded(out.node)
    return out


def _notify_recorded(node: Node) -> None:
    """Hand a newly recorded node to the observers of :mod:`disttensor.autograd.saved`."""
    observers = getattr(_state, "node_observers", None)
    if observers:
        for fn in tuple(observers):
            fn(node)


def param_share(t: Tensor | None, g, grid=None, partial_axes=None):
    """What backward contributes for the replicated leaf ``t`` given the gradient ``g``.

    ``g`` is either the full gradient, identical on every rank (``partial_axes`` ``None``),
    or this rank's partial sum over the axes ``partial_axes`` of ``grid``: summing it over
    those axes gives the gradient, and ranks that differ only along the other axes hold
    replicas of it.  Ops are called with ``reduce=not t.deferred_reduction``, so for an
    ordinary tensor ``g`` is already full and returned as it is.  When ``t`` has deferred
    reduction (``t.deferred_reduction`` is the grid whose communicator a data-parallel reducer
    sums over), the contribution is a *share*: summed over all the ranks it gives the
    gradient, so replicas (ranks whose coordinates outside ``partial_axes`` are not all 0)
    contribute zeros, and a full gradient is kept on the first rank only.
    """
    if t is None or t.deferred_reduction is None:
        return g
    grid = t.deferred_reduction if grid is None else grid
    if grid.size == 1:
        return g
    keep = () if partial_axes is None else tuple(partial_axes)
    if all(c == 0 for a, c in enumerate(grid.coords) if a not in keep):
        return g
    return _pool.zeros(g.shape, g.dtype) if type(g) is np.ndarray else \
        array_module(g).zeros_like(g)     # (NumPy: recycled, a steady step makes no array)


def _accumulate(acc, g):
    """``acc + g`` for gradients of one tensor (DistArray gradients are brought to ``acc``'s
    distribution first)."""
    if acc is None:
        return g
    if isinstance(acc, DistArray):
        if not isinstance(g, DistArray):
            raise TypeError("gradient kinds differ for one tensor")
        if g.distribution != acc.distribution or g.grid is not acc.grid:
            g = g.redistribute(grid=acc.grid, distribution=acc.distribution)
        return DistArray(acc.local + g.local, acc.distribution, acc.grid)
    return acc + g


def _refs(a) -> int:
    return sys.getrefcount(a)


def _base_refs(a) -> int:
    return sys.getrefcount(a.base)


def _calibrate() -> tuple[int, int]:
    probe = np.empty(4).reshape(2, 2)
    return _refs(probe), _base_refs(probe)


# what _refs reads for an array held by one local variable of its caller and nothing else,
# and what _base_refs reads for the base of such a view held by nothing but the view
# (measured, not assumed)
_SOLE, _SOLE_BASE = _calibrate()


def _owned_host(a, holders: int = 0) -> bool:
    """Whether ``a`` is a NumPy array whose memory nothing reaches but ``a`` itself, and that
    nothing references but one local variable of the caller and ``holders`` other known
    holders (the refcount rule of :mod:`disttensor.core.buffer_pool`): it owns its memory,
    or it is a view of an array that owns it and that nothing else references."""
    if type(a) is not np.ndarray or _refs(a) != _SOLE + 1 + holders:
        return False
    base = a.base
    if base is None:
        return True
    ok = type(base) is np.ndarray and base.base is None
    del base
    return ok and _base_refs(a) == _SOLE_BASE


def _add_into_grad(t: Tensor, g, owned: bool = False) -> None:
    """``t.grad = g`` (a copy, unless ``owned``: the array is the caller's alone) or
    ``t.grad + g``; a NumPy ``t.grad`` that nothing but ``t`` references takes the sum in place
    (the same arithmetic, no new array; a ``.grad`` the user holds is never changed)."""
    if t.grad is None:
        t.grad = g if owned else _pool.copy(g)   # (NumPy: into a recycled array)
        return
    acc = t.grad
    if (type(g) is np.ndarray and _owned_host(acc, holders=1) and acc.dtype == g.dtype
            and acc.shape == g.shape):
        acc += g
        return
    del acc
    t.grad = _accumulate(t.grad, g)


def queue_post_backward(key, callback) -> None:
    """Run ``callback()`` once at the end of the next backward pass (this thread); queued
    again under the same ``key`` it still runs once.  Data-parallel reducers queue their
    "wait for the all-reduces" step here from their forward."""
    q = getattr(_state, "post_backward", None)
    if q is None:
        q = _state.post_backward = {}
    q[key] = callback


def cancel_post_backward(key) -> None:
    """Drop the callback queued under ``key`` (a reducer released after a forward that no
    backward followed must not run at the next backward pass)."""
    q = getattr(_state, "post_backward", None)
    if q:
        q.pop(key, None)


def run_backward(root: Tensor, grad, retain_graph: bool = False) -> None:
    """Walk the graph from ``root`` in reverse creation order (see the module docstring),
    then run the callbacks of :func:`queue_post_backward`."""
    prof = _profiler._active
    if prof is not None:
        prof.step_boundary()
    try:
        _walk(root, grad, retain_graph)
    finally:
        q = getattr(_state, "post_backward", None)
        _state.post_backward = None
    if q:
        with (_profiler.NULL if prof is None else prof.op("grad sync", "backward")):
            for cb in q.values():
                cb()


def _walk(root: Tensor, grad, retain_graph: bool) -> None:
    if root.node is None:  # a leaf: its own gradient
        _finish_leaf(root, grad)
        return
    # consumers of each node / leaf inside the subgraph reachable from root
    pending: dict[int, int] = {}
    nodes: dict[int, Node] = {}
    stack = [root.node]
    nodes[id(root.node)] = root.node
    while stack:
        n = stack.pop()
        for p in n.parents:
            if p is None:
                continue
            key = id(p.node) if p.node is not None else id(p)
            pending[key] = pending.get(key, 0) + 1
            if p.node is not None and id(p.node) not in nodes:
                nodes[id(p.node)] = p.node
                stack.append(p.node)
    grads: dict[int, object] = {id(root.node): grad}
    ready = [(-root.node.seq, id(root.node))]
    while ready:
        _, key = heapq.heappop(ready)
        node = nodes[key]
        prof = _profiler._active
        if prof is None:
            _step(node, key, nodes, grads, pending, ready, retain_graph)
        else:
            with prof.op(node.name, "backward"):
                _step(node, key, nodes, grads, pending, ready, retain_graph)


def _step(node, key, nodes, grads, pending, ready, retain_graph) -> None:
    """Run one node of the backward walk: its gradient function, then hand the gradients
    to its parents (a parent whose consumers are all done becomes ready)."""
    g = grads.pop(key, None)
    if g is None:  # no consumer gave a gradient: nothing flows into this subgraph
        pgrads = (None,) * len(node.parents)
    else:
        if node.backward is None:
            raise RuntimeError(f"backward through {node.name} a second time: its saved "
                               "state was freed (pass retain_graph=True to the first "
                               "backward)")
        pgrads = node.backward(g)
        if not isinstance(pgrads, tuple):
            pgrads = (pgrads,)
        if len(pgrads) != len(node.parents):
            raise RuntimeError(f"{node.name} backward returned {len(pgrads)} gradients "
                               f"for {len(node.parents)} inputs")
    parents = node.parents
    del nodes[key]
    if not retain_graph:
        # the node is done: dropping its backward (saved state) and its parents (the
        # input tensors, hence their values) frees activations as backward passes them
        node.backward = None
        node.parents = ()
    pgrads = list(pgrads)   # emptied as it goes: a leaf's gradient then has no other holder
    for i, p in enumerate(parents):
        pg, pgrads[i] = pgrads[i], None
        if p is None:
            continue
        pkey = id(p.node) if p.node is not None else id(p)
        if pg is not None:
            grads[pkey] = _accumulate(grads.get(pkey), pg)
        pg = None
        pending[pkey] -= 1
        if pending[pkey]:
            continue
        if p.node is None:
            leaf_grad = grads.pop(pkey, None)
            owned = _owned_host(leaf_grad)  # (its own statement: no stack reference)
            _finish_leaf(p, leaf_grad, owned)
            leaf_grad = None
        else:
            heapq.heappush(ready, (-p.node.seq, pkey))


def _finish_leaf(t: Tensor, g, owned: bool = False) -> None:
    """Every contribution to leaf ``t`` in this pass is in (``g`` ``None``: none carried a
    gradient; hooks still hear of it, so a reducer waiting for ``t`` is never left waiting).
    The tensor's own gradient hooks (:meth:`Tensor.register_hook`) run first."""
    hooks = t.__dict__.get("_grad_hooks")
    if hooks and g is not None:
        from .hooks import run_tensor_hooks
        g = run_tensor_hooks(hooks.values(), g)
        owned = False                   # a hook may keep the array
    for hook in t._ready_hooks:
        if hook(t, g):
            return
    if g is not None:
        _add_into_grad(t, g, owned)
