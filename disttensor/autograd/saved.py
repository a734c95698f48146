"""What the recorded graph keeps alive for backward: measuring it, and moving it off the device.

Every differentiable function records a :class:`~disttensor.autograd.Node` whose ``backward``
closure holds the op's ``saved`` state (the ops' ``*Saved`` dataclasses, DistArrays, raw
NumPy/CuPy arrays, tuples of them).  This module finds those arrays by walking the closure's
cells (and, inside them, DistArrays, dataclass instances, tuples, lists, dicts and nested
closures; :class:`~disttensor.autograd.Tensor` objects are *not* entered: a captured tensor is
an input, whose value the closure captures separately when its backward needs it).  Nothing in
the ops changes: measurement and offload work on any function recorded through
:func:`~disttensor.autograd.make_result`.

* :func:`record_nodes` -- collect the nodes recorded inside a ``with`` block (all functions,
  also the nodes :func:`record_node` announces, e.g. activation checkpoints);
* :func:`saved_arrays` / :func:`saved_bytes` -- the distinct buffers a node (or a group of
  nodes) keeps alive, and their bytes: a view counts as the whole buffer it keeps alive (NumPy
  ``base`` chain, CuPy memory allocation), shared buffers count once, and ``exclude`` (ids of
  arrays, e.g. the parameters and buffers of a model, which live anyway) are left out;
* :func:`saved_tensors_hooks` -- ``pack(array) -> object`` runs on every saved array of the
  nodes recorded inside the block, ``unpack(object) -> array`` restores them right before the
  node's backward (PyTorch's ``torch.autograd.graph.saved_tensors_hooks``, applied to the
  closure's references);
* :class:`OffloadGroup` -- the saved arrays of a group of nodes (a layer) moved to host memory
  after its forward and brought back before its backward (:meth:`~OffloadGroup.prefetch` starts
  the copy early, asynchronously).  CuPy arrays go to pinned host memory on a side stream;
  NumPy arrays have no device memory to free, so on CPU offload is *simulated*: the group only
  counts the bytes it would move.

Packing replaces the *references* held by the closures (cells, dataclass fields, containers,
DistArray wrappers are rebuilt around the moved buffer): the objects themselves are never
mutated, so an activation that also flows on to the next layer is untouched, and its device
memory is freed once nothing else references it.  Arrays inside tuples held by a frozen or
foreign object are left where they are (they are counted as not moved).

:func:`backward_subgraph` runs the backward of a subgraph (used by activation checkpoints)
without running the end-of-backward callbacks of the outer pass.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import types

import numpy as np

from ..core.array import DistArray
from .tensor import Node, Tensor, _state, _walk

__all__ = ["record_nodes", "record_node", "observe_nodes", "Packed", "saved_arrays",
           "saved_bytes", "array_bytes", "saved_tensors_hooks", "OffloadGroup",
           "backward_subgraph", "run_before_backward"]

_MAX_DEPTH = 8


# -- observing recorded nodes ----------------------------------------------------------------
def record_node(node: Node) -> None:
    """Announce a node recorded outside :func:`~disttensor.autograd.make_result` to the
    observers of :func:`record_nodes` (``make_result`` announces its own)."""
    from .tensor import _notify_recorded
    _notify_recorded(node)


@contextlib.contextmanager
def observe_nodes(callback):
    """Call ``callback(node)`` for every node recorded in this thread inside the block
    (nested blocks all observe)."""
    obs = getattr(_state, "node_observers", None)
    if obs is None:
        obs = _state.node_observers = []
    obs.append(callback)
    try:
        yield
    finally:
        obs.remove(callback)


@contextlib.contextmanager
def record_nodes():
    """``with record_nodes() as nodes:`` -- ``nodes`` lists the nodes recorded inside the
    block, oldest first (local, not collective)."""
    nodes: list[Node] = []
    with observe_nodes(nodes.append):
        yield nodes


# -- finding saved arrays --------------------------------------------------------------------
def _is_cupy(a) -> bool:
    return type(a).__module__.startswith("cupy") and hasattr(a, "data") and hasattr(a, "shape")


def _is_array(a) -> bool:
    return isinstance(a, np.ndarray) or _is_cupy(a)


def _root(a):
    """``(key, bytes)`` of the allocation that array ``a`` keeps alive."""
    if isinstance(a, np.ndarray):
        r = a
        while isinstance(r.base, np.ndarray):
            r = r.base
        return id(r), int(r.nbytes)
    mem = getattr(a.data, "mem", None)
    if mem is not None:
        return id(mem), int(mem.size)
    return id(a), int(a.nbytes)


class Packed:
    """A saved array replaced by a pack hook: ``value`` is what the hook returned."""
    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value


class _PackedDist:
    """A DistArray whose buffer is :class:`Packed` (rebuilt when the buffer comes back)."""
    __slots__ = ("buffer", "distribution", "grid", "halo")

    def __init__(self, buffer, distribution, grid, halo):
        self.buffer, self.distribution, self.grid, self.halo = buffer, distribution, grid, halo


def _map(obj, fn, depth=0):
    """``obj`` with every saved array (or :class:`Packed` placeholder) ``a`` replaced by
    ``fn(a)`` (containers rebuilt only where something changed; closures' cells are rewritten
    in place)."""
    if depth > _MAX_DEPTH or obj is None or isinstance(obj, (Tensor, str, bytes, int, float,
                                                             bool, type, np.generic)):
        return obj
    if isinstance(obj, (DistArray, _PackedDist)):
        buf = obj.buffer
        nb = fn(buf)
        if nb is buf:
            return obj
        if isinstance(nb, Packed):
            return _PackedDist(nb, obj.distribution, obj.grid, obj.halo)
        return DistArray(nb, obj.distribution, obj.grid, obj.halo)
    if isinstance(obj, Packed) or _is_array(obj):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        items = [_map(v, fn, depth + 1) for v in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        if isinstance(obj, list):
            return items
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, dict):
        items = {k: _map(v, fn, depth + 1) for k, v in obj.items()}
        if all(items[k] is v for k, v in obj.items()):
            return obj
        return items
    if isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            nv = _map(v, fn, depth + 1)
            if nv is not v:
                cell.cell_contents = nv
        return obj
    if isinstance(obj, types.MethodType):
        _map(obj.__func__, fn, depth + 1)
        return obj
    if dataclasses.is_dataclass(obj):
        new = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name, None)
            nv = _map(v, fn, depth + 1)
            if nv is not v:
                new[f.name] = nv
        if not new:
            return obj
        out = copy.copy(obj)
        for k, v in new.items():
            object.__setattr__(out, k, v)
        return out
    return obj


def _visit(obj, fn) -> None:
    """Call ``fn(a)`` on every saved array reachable from ``obj`` (nothing is replaced)."""
    def f(a):
        fn(a)
        return a
    _map(obj, f)


def _backward_of(node):
    return node.backward if isinstance(node, Node) else node


def saved_arrays(nodes, exclude=()) -> list:
    """The distinct arrays (one per allocation) that the backward closures of ``nodes`` (a
    node, a closure, or an iterable of them) keep alive, leaving out arrays whose ``id`` is in
    ``exclude``.  Nodes whose backward already ran (freed) hold nothing."""
    if isinstance(nodes, (Node, types.FunctionType)):
        nodes = (nodes,)
    exclude = set(exclude)
    seen: dict = {}
    for n in nodes:
        bw = _backward_of(n)
        if bw is None:
            continue

        def add(a):
            if not _is_array(a) or id(a) in exclude:
                return
            key, _ = _root(a)
            seen.setdefault(key, a)
        _visit(bw, add)
    return list(seen.values())


def array_bytes(arrays, seen: set | None = None) -> int:
    """Bytes of the allocations behind ``arrays``, each counted once; with ``seen`` (a set of
    allocation keys, updated), allocations already in it count zero (attribute shared buffers
    to the first group that holds them)."""
    seen = set() if seen is None else seen
    total = 0
    for a in arrays:
        key, nb = _root(a)
        if key not in seen:
            seen.add(key)
            total += nb
    return total


def saved_bytes(nodes, exclude=(), seen: set | None = None) -> int:
    """Bytes that the backward closures of ``nodes`` keep alive (see :func:`saved_arrays`
    and :func:`array_bytes`; ``seen`` shares allocations across calls).  Local."""
    return array_bytes(saved_arrays(nodes, exclude), seen)


# -- pack / unpack hooks ---------------------------------------------------------------------
def run_before_backward(node: Node, before) -> None:
    """Make ``node``'s backward call ``before()`` first (once per backward run)."""
    inner = node.backward
    if inner is None:
        return

    def backward(g):
        before()
        return inner(g)
    node.backward = backward


def _pack_node(node: Node, pack, unpack, exclude) -> None:
    inner = node.backward
    if inner is None:
        return
    mine: set[int] = set()

    def do_pack(a):
        if not _is_array(a) or id(a) in exclude:
            return a
        p = pack(a)
        if p is a:
            return a
        box = Packed(p)
        mine.add(id(box))
        return box
    _map(inner, do_pack)
    if not mine:
        return

    def do_unpack(p):
        if isinstance(p, Packed) and id(p) in mine:
            return unpack(p.value)
        return p

    def backward(g):
        _map(inner, do_unpack)
        mine.clear()
        return inner(g)
    node.backward = backward


@contextlib.contextmanager
def saved_tensors_hooks(pack, unpack, exclude=()):
    """Apply ``pack(array) -> packed`` to each saved array of every node recorded inside the
    block (right after it is recorded; arrays with ``id`` in ``exclude`` are skipped), and
    ``unpack(packed) -> array`` right before that node's backward.  ``pack`` may return its
    argument unchanged (nothing to restore then).  Local (the hooks run on each rank's own
    blocks); the hooks must not change values, only where they live."""
    exclude = set(exclude)
    with observe_nodes(lambda node: _pack_node(node, pack, unpack, exclude)):
        yield


# -- offload ---------------------------------------------------------------------------------
class _Moved(Packed):
    """A saved CuPy array living in pinned host memory."""
    __slots__ = ("host", "event", "device", "keep")

    def __init__(self, host, event, keep):
        super().__init__()
        self.host, self.event, self.device, self.keep = host, event, None, keep


def _copy_to_host(src, host, stream) -> None:
    """Queue ``host[...] = src`` on ``stream`` without waiting (CuPy >= 13 waits unless told
    ``blocking=False``; older CuPy is asynchronous whenever a stream is given)."""
    try:
        src.get(stream=stream, out=host, blocking=False)
    except TypeError:
        src.get(stream=stream, out=host)


_INFLIGHT: list = []   # offload copies whose source may still be read by the side stream


def _reap(wait: bool = False) -> None:
    """Drop the device sources of finished offload copies (``wait``: wait for all)."""
    keep = []
    for m in _INFLIGHT:
        if wait:
            m.event.synchronize()
        if m.event.done:
            m.keep = None
        else:
            keep.append(m)
    _INFLIGHT[:] = keep


class OffloadGroup:
    """The saved arrays of ``nodes`` (the nodes one layer recorded) moved off the device.

    :meth:`offload` (call after the layer's forward) copies each saved CuPy array to pinned
    host memory on a side stream and drops the closures' references to the device copy, so
    the device memory is freed once nothing else holds it; :meth:`prefetch` starts the copies
    back (asynchronously, on the side stream); each node's backward first calls
    :meth:`restore`, which prefetches if that has not happened and makes the compute stream
    wait for the copies.  NumPy arrays are not moved: the group counts their bytes as
    ``simulated_bytes`` (CPU runs have no device memory to relieve), unless ``copy_host``:
    then they are copied out and back like device arrays (no memory is relieved; this runs
    the whole replace-and-restore path on CPU, for tests).  ``exclude``: ids of arrays never
    moved (parameters, buffers).  Local (each rank moves its own blocks)."""

    def __init__(self, nodes, exclude=(), copy_host: bool = False):
        self.nodes = [n for n in nodes if n.backward is not None]
        self.exclude = set(exclude)
        self.copy_host = bool(copy_host)
        self._done = None
        self.offloaded_bytes = 0     # device bytes copied to the host
        self.simulated_bytes = 0     # host (NumPy) bytes that would have moved
        self._moved: list[_Moved] = []
        self._state = "resident"
        self._stream = None

    def _side_stream(self):
        if self._stream is None:
            import cupy
            self._stream = cupy.cuda.Stream(non_blocking=True)
        return self._stream

    def offload(self) -> "OffloadGroup":
        if self._state != "resident":
            return self
        if _INFLIGHT:
            _reap()
        seen: set = set()
        moved_by_id: dict = {}

        def pack(a):
            if not _is_array(a) or id(a) in self.exclude:
                return a
            if id(a) in moved_by_id:  # the same array reached twice: one host copy
                return moved_by_id[id(a)]
            if isinstance(a, np.ndarray):
                if not self.copy_host:
                    self.simulated_bytes += array_bytes([a], seen)
                    return a
                m = _Moved(np.array(a, copy=True), None, None)
                self.offloaded_bytes += int(a.nbytes)
                self._moved.append(m)
                moved_by_id[id(a)] = m
                return m
            import cupy
            import cupyx
            s = self._side_stream()
            src = cupy.ascontiguousarray(a)
            ready = cupy.cuda.get_current_stream().record()
            s.wait_event(ready)
            host = cupyx.empty_pinned(src.shape, dtype=src.dtype)
            _copy_to_host(src, host, s)
            m = _Moved(host, s.record(), keep=(a, src))  # device copies alive until done
            self.offloaded_bytes += int(src.nbytes)
            self._moved.append(m)
            _INFLIGHT.append(m)
            moved_by_id[id(a)] = m
            return m

        for n in self.nodes:
            _map(n.backward, pack)
            run_before_backward(n, self.restore)
        self._state = "offloaded"
        return self

    def prefetch(self) -> None:
        """Start copying the offloaded arrays back to the device (asynchronous)."""
        if self._state != "offloaded":
            return
        self._state = "prefetching"
        for m in self._moved:
            if m.event is None:  # a NumPy array copied out (copy_host)
                m.device = m.host.copy()
        moved = [m for m in self._moved if m.event is not None]
        if not moved:
            return
        import cupy
        s = self._side_stream()
        _reap(wait=any(m.keep is not None for m in moved))
        for m in moved:  # allocated in the compute stream's order ...
            m.device = cupy.empty(m.host.shape, dtype=m.host.dtype)
        s.wait_event(cupy.cuda.get_current_stream().record())  # ... so copy after it
        for m in moved:
            m.device.set(m.host, stream=s)
        self._done = s.record()

    def restore(self) -> None:
        """Make the saved arrays usable on the device again (waits for the prefetch)."""
        if self._state == "restored" or self._state == "resident":
            return
        self.prefetch()
        if self._moved:
            if self._done is not None:
                import cupy
                cupy.cuda.get_current_stream().wait_event(self._done)

            def unpack(p):
                return p.device if isinstance(p, _Moved) else p
            for n in self.nodes:
                _map(n.backward, unpack)
            self._moved = []
        self._state = "restored"


# -- backward of a subgraph ------------------------------------------------------------------
def backward_subgraph(root: Tensor, grad) -> None:
    """Backpropagate ``grad`` from ``root`` through the graph that produced it, as
    :meth:`Tensor.backward` does, but without running (or dropping) the end-of-backward
    callbacks queued for the pass that is running now: for recomputation inside another
    backward.  Collective when the subgraph holds collective ops."""
    if root.requires_grad:
        _walk(root, grad, False)
