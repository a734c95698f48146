"""Hybrid sample x spatial data parallelism: replicated parameters, bucketed gradient sums.

Every rank of a grid ``(sample, d, h, w)`` holds all parameters; activations are DistArrays
split over the sample axis (different samples) and the spatial axes (different parts of each
sample).  Each op's backward gives a rank's partial parameter gradient; the sum over all ranks
is the gradient of the global loss (replicas are counted once, see
:func:`disttensor.autograd.param_share`).  With no reducer every op all-reduces its own
parameter gradients, blocking, layer by layer.  :class:`GradientReducer` instead defers those
sums: as backward finishes each parameter's gradient, it is copied into a bucket (~25 MiB, in
the reverse order of registration, which is roughly the order backward produces them, like
PyTorch's DDP), and a full bucket is summed with a non-blocking ``MPI_Iallreduce`` on a private
communicator while the rest of backward runs; the end of backward waits for the buckets and
hands the sums out as ``.grad``: for NumPy parameters a view of the bucket (as PyTorch's
``gradient_as_bucket_view=True``: no copy out, no zeroing), which the next backward writes
into again only once nothing but ``.grad`` holds it (a ``.grad`` kept for accumulation is
copied first; one referenced elsewhere makes the bucket take a new buffer), so ``.grad``
keeps PyTorch's semantics (``None`` until a gradient arrives, accumulation without
``zero_grad``, arrays handed out never change).  Callbacks registered with :meth:`GradientReducer.on_bucket_done`
receive each bucket's summed gradients as soon as its all-reduce has completed (polled with
``MPI_Test`` as later buckets start, the rest at the end of backward) and may take them instead
of ``.grad``: the in-backward weight update (:mod:`disttensor.nn.backward_update`).

Parameters on the GPU (CuPy): the buckets live on the device and are summed with NCCL
(:mod:`disttensor.core.gpucomm`), queued on a stream of the reducer's own after an event of the
stream backward runs on, so neither the copy of a gradient into its bucket nor the start or the
end of a bucket's sum waits on the host (the end of backward makes the compute stream wait for
the buckets' events).  Without NCCL on the communicator, device buckets go to a CUDA-aware MPI
directly (after a stream synchronisation), else through page-locked host buckets and MPI.
:attr:`GradientReducer.transport` says which (``"nccl"``, ``"cuda-aware mpi"``,
``"host (pinned)"``, ``"host"``, or ``"device (1 rank)"``).

:class:`DistributedDataParallel` wraps a model with a reducer, and checks at construction that
every rank holds the same parameters and buffers (one digest all-reduce; a mismatch raises on
every rank, naming the parameter); ``DISTTENSOR_CHECK_REPLICAS=N`` repeats the check every N
training forwards.
"""
from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

from ..core import agreement
from ..core.backend import array_module, to_host
from ..core.buffer_pool import Recycler
from ..core.comm import collective
from ..core.watchdog import waiting
from ..core.grid import ProcessGrid
from ..autograd.tensor import cancel_post_backward, queue_post_backward
from .module import Module
from .replicas import check_replicas

__all__ = ["GradientReducer", "DistributedDataParallel", "check_replicas",
           "DEFAULT_BUCKET_BYTES"]

DEFAULT_BUCKET_BYTES = 25 * 2 ** 20


class _Bucket:
    def __init__(self, params, dtype):
        self.params = params
        self.dtype = np.dtype(dtype)
        self.offsets = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.data.size
        self.size = n
        #: one "used" flag per parameter after the gradients (buffer[size + i]): 1 where this
        #: rank's backward handed the parameter a gradient; summed with the gradients, so
        #: a parameter used on no rank is known without another round trip
        self.length = n + len(params)
        self.buffer = None  # allocated (zeroed) when the bucket is first needed
        self.missing = len(params)
        self.request = None
        #: per parameter, the host arrays its gradient is copied out into, reused once the
        #: previous step's gradient is dropped (``zero_grad``) and nothing else holds it
        self.recyclers = [Recycler(per_key=2, max_keys=1) for _ in params]
        #: whether ``.grad`` of some parameter was made a view of ``buffer`` (host buckets):
        #: :meth:`GradientReducer._reclaim` checks the views before backward writes again
        self.handed = False
        #: per parameter, its segment of ``buffer`` shaped as the parameter (made once per
        #: buffer): what ``.grad`` becomes
        self.grad_views = None


class GradientReducer:
    """Sum the gradients of ``params`` over every rank of ``grid`` in buckets of about
    ``bucket_bytes``, each started as soon as backward has completed it (``overlap=True``) or
    all at the end of backward (``overlap=False``).  Collective construction.

    Sets ``deferred_reduction`` on each parameter, so the ops hand back per-rank shares
    instead of all-reducing each gradient themselves.  The first gradient a backward pass hands
    over (or :meth:`arm`, called by :class:`DistributedDataParallel` on every training forward)
    makes that backward end with :meth:`finish`.  With :meth:`accumulate` a step is several
    backward passes (micro-batches of a pipeline): shares are summed over the passes and the
    buckets start during the last one (GroPipe's delayed gradient communication).

    :meth:`on_bucket_done` callbacks see each bucket's sums as soon as its all-reduce has
    completed; a bucket whose gradients they all take frees its buffer until the next step
    needs it (so the buffers alive are those of the buckets in flight, not the whole model).
    """

    def __init__(self, params, grid: ProcessGrid, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 overlap: bool = True):
        self.params = [p for p in params if p.requires_grad]
        self.grid = grid
        self.overlap = bool(overlap)
        # the bucket layout follows from these: ranks that disagree would sum unrelated
        # gradients (or wait for buckets the others never start)
        with collective(grid.cart, "GradientReducer",
                        params=[(tuple(p.data.shape), p.data.dtype.str) for p in self.params],
                        bucket_bytes=bucket_bytes, overlap=self.overlap):
            if bucket_bytes < 1:
                raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.comm = grid.cart.Dup()
        self.buckets: list[_Bucket] = []
        self._where: dict[int, tuple[_Bucket, int]] = {}
        cur, cur_bytes, cur_dtype = [], 0, None
        for p in reversed(self.params):
            dtype = np.result_type(np.float32, p.data.dtype)  # float16 sums in float32
            nbytes = p.data.size * dtype.itemsize
            if cur and (cur_bytes + nbytes > bucket_bytes or dtype != cur_dtype):
                self._add_bucket(cur, cur_dtype)
                cur, cur_bytes = [], 0
            cur.append(p)
            cur_bytes += nbytes
            cur_dtype = dtype
        if cur:
            self._add_bucket(cur, cur_dtype)
        self.transport = _bucket_transport(self.params, self.comm)
        self._stream = None  # the NCCL transport's stream (made on first use)
        for p in self.params:
            p.deferred_reduction = grid
            p.register_grad_ready_hook(self._ready)
        self._next_start = 0
        self._next_done = 0  # buckets delivered (on_bucket_done) so far in this step
        self._done_hooks: list = []
        self.armed = False
        # multi-pass accumulation (see accumulate()): passes per step, passes ended so far,
        # and how many times each parameter has been reported in this step
        self._passes = 1
        self._passes_done = 0
        self._reported: dict[int, int] = {}

    def on_bucket_done(self, callback) -> None:
        """Call ``callback(params, grads)`` when a bucket's all-reduce has completed, before
        the sums go into ``.grad``.  ``params`` is the bucket's parameters and ``grads`` a list
        of their gradients (summed over the ranks, in each parameter's dtype and on its device,
        with any ``.grad`` already held added in: what ``.grad`` would become; possibly views
        of the bucket's buffer, valid during the call only: copy one to keep it).  The
        callback takes a gradient by setting ``grads[i] = None``; the others go into ``.grad``
        (copied) as without callbacks.  Completion is polled (``MPI_Test``, local) each time
        backward hands over a parameter's last share of the step, and :meth:`finish` delivers
        the rest, so when a bucket arrives differs between ranks: a callback must not
        communicate.  Buckets arrive in index order, each once per step (:meth:`finish`).
        ``grads[i]`` is ``None`` for a parameter no rank had a gradient for (unused or
        frozen): leave it alone."""
        if not callable(callback):
            raise TypeError(f"on_bucket_done takes a callable, got {type(callback).__name__}")
        self._done_hooks.append(callback)

    def remove_bucket_done(self, callback) -> None:
        """Unregister a callback of :meth:`on_bucket_done` (no error if absent)."""
        self._done_hooks = [c for c in self._done_hooks if c != callback]

    def _add_bucket(self, params, dtype):
        b = _Bucket(params, dtype)
        for i, p in enumerate(params):
            self._where[id(p)] = (b, i)
        self.buckets.append(b)

    def arm(self) -> None:
        """Make the next backward pass end with :meth:`finish` (with :meth:`accumulate`,
        only the last pass of a step finishes)."""
        self.armed = True
        queue_post_backward(id(self), self._end_of_pass)

    def accumulate(self, passes: int) -> None:
        """Make each step ``passes`` backward passes (micro-batches, pipelining): every pass
        adds its shares into the bucket buffers, a bucket starts once each of its parameters
        has been reported ``passes`` times (so during the last pass, overlapped with what is
        left of it), and :meth:`finish` runs once, at the end of the ``passes``-th pass.  The
        setting holds for the following steps; ``accumulate(1)`` is the ordinary behaviour.
        Local (no communication): every rank of the grid must set the same value, between
        steps."""
        if isinstance(passes, bool) or not isinstance(passes, (int, np.integer)) or passes < 1:
            raise ValueError(f"accumulate: passes must be a positive integer, got {passes!r}")
        if self._passes_done or self._reported:
            raise RuntimeError("accumulate: a step is in progress (call it between steps)")
        self._passes = int(passes)

    def _end_of_pass(self) -> None:
        self._passes_done += 1
        if self._passes_done < self._passes:
            self.armed = False  # the next pass's first gradient (or arm()) arms again
            return
        self.finish()

    def _ready(self, p, share) -> bool:
        if not self.armed:  # a backward through the bare module still ends with finish()
            self.arm()
        b, i = self._where[id(p)]
        if b.handed:  # last step's gradients are views of the buffer: free to overwrite?
            self._reclaim(b)
        if b.buffer is None:  # first use, or freed after its gradients were taken
            if self._done_hooks:
                self._poll_done()  # free what has completed before allocating more
            b.buffer = _zeros_buffer(self.transport, b.length, b.dtype)
        seg = b.buffer[b.offsets[i]:b.offsets[i] + p.data.size]
        seen = self._reported.get(id(p), 0)
        self._reported[id(p)] = seen + 1
        if type(share) is np.ndarray and type(seg) is np.ndarray:  # (host bucket)
            share = share.reshape(-1)
        elif share is not None:
            on_device = array_module(share) is not np
            if on_device and not _device_buffers(self.transport):
                share = to_host(share)
            elif not on_device and _device_buffers(self.transport):
                share = array_module(seg).asarray(share)
            share = share.reshape(-1)
        if seen == 0:  # first report of this step: overwrite the zeroed segment
            seg[...] = 0 if share is None else share
            b.buffer[b.size + i] = 0 if share is None else 1
        elif share is not None:  # a later pass of accumulate(): add
            seg += share
            b.buffer[b.size + i] = 1
        if seen + 1 != self._passes:
            return True  # more passes to come before this parameter is complete
        b.missing -= 1
        if self.overlap:
            self._start_ready()
        return True

    def _start_ready(self) -> None:
        # buckets start in index order on every rank (MPI needs the same order everywhere)
        while self._next_start < len(self.buckets) and \
                self.buckets[self._next_start].missing == 0:
            self._start(self.buckets[self._next_start])
            self._next_start += 1
        if self._done_hooks:
            self._poll_done()

    def _poll_done(self) -> None:
        """Deliver the started buckets whose all-reduce has completed, in index order."""
        while self._next_done < self._next_start:
            b = self.buckets[self._next_done]
            if not b.request.Test():
                break
            self._deliver(b)
            self._next_done += 1

    def _deliver(self, b: _Bucket) -> None:
        """Hand bucket ``b``'s sums to the on_bucket_done callbacks, the rest into ``.grad``."""
        hooks = self._done_hooks
        if not hooks and type(b.buffer) is np.ndarray:
            self._deliver_views(b)
            return
        grads, views = [], []
        used = to_host(b.buffer[b.size:]) if array_module(b.buffer) is not np \
            else b.buffer[b.size:]
        for i, (p, off) in enumerate(zip(b.params, b.offsets)):
            if not used[i] or not p.requires_grad:  # no rank had a gradient, or frozen:
                grads.append(None)                  # .grad stays as it is (None), as PyTorch
                views.append(False)
                continue
            xp = array_module(p.data)
            g = b.buffer[off:off + p.data.size].reshape(p.data.shape)
            view = bool(hooks) and xp is np and p.grad is None and g.dtype == p.data.dtype
            if not view:  # (a callback may take a view: it needs no copy of its own)
                if xp is not np and array_module(g) is np:
                    g = xp.asarray(g, dtype=p.data.dtype)  # host bucket -> device
                elif xp is np and array_module(g) is np:  # a copy (the bucket is zeroed
                    out = b.recyclers[i].empty(p.data.shape, p.data.dtype)  # below), into
                    np.copyto(out, g, casting="unsafe")   # last step's array if it is free
                    g = out
                else:
                    g = g.astype(p.data.dtype, copy=True)
                if p.grad is not None:
                    g = p.grad + g
            grads.append(g)
            views.append(view)
        for callback in hooks:
            callback(b.params, grads)
        for p, g, view in zip(b.params, grads, views):
            if g is not None:
                p.grad = g.copy() if view else g
        if self._done_hooks and all(g is None for g in grads):
            b.buffer = None  # all taken: the buffer is allocated again when next needed
            b.grad_views = None
        else:
            b.buffer[...] = 0

    def _deliver_views(self, b: _Bucket) -> None:
        """:meth:`_deliver` of a host bucket without callbacks: a parameter without a
        gradient gets a view of its segment of the bucket as ``.grad`` (no copy; the next
        backward writes into the bucket again only once nothing but ``.grad`` holds those
        views, see :meth:`_reclaim`); one that holds a gradient (accumulation across backward
        passes without ``zero_grad``) gets ``.grad + sum`` as before."""
        buf = b.buffer
        views = b.grad_views
        if views is None or (views and views[0].base is not buf):
            views = b.grad_views = tuple(buf[o:o + p.data.size].reshape(p.data.shape)
                                         for p, o in zip(b.params, b.offsets))
        used = buf[b.size:].tolist()
        dtype = b.dtype
        handed = False
        for i, p in enumerate(b.params):
            if not used[i] or not p.requires_grad:  # no rank had a gradient, or frozen:
                continue                            # .grad stays as it is (None), as PyTorch
            g = views[i]
            data = p.data
            if p.grad is None and type(data) is np.ndarray and data.dtype == dtype:
                p.grad = g
                handed = True
                continue
            if type(data) is np.ndarray:   # a copy into last step's array if it is free
                out = b.recyclers[i].empty(data.shape, data.dtype)
                np.copyto(out, g, casting="unsafe")
                g = out
            else:                          # (CuPy parameters among NumPy ones)
                g = array_module(data).asarray(g, dtype=data.dtype)
            p.grad = g if p.grad is None else p.grad + g
        b.handed = handed

    def _reclaim(self, b: _Bucket) -> None:
        """Before backward writes into host bucket ``b`` again: where last step's views of it
        are still some parameter's ``.grad`` (no ``zero_grad(set_to_none=True)``), that
        ``.grad`` becomes a copy, keeping its values for the sum of this step to be added to;
        where a view, or an array made from one, is held by anything else (a reference the
        caller kept), the bucket takes a fresh buffer and leaves the old one to its holders.
        Either way the arrays handed out never change after their step."""
        b.handed = False
        views = b.grad_views
        if views is None:
            return
        nbuf, most, kept = _view_refs(b.buffer, views, b.params)
        if nbuf == _IDLE_BUFFER + len(views) and most <= _IDLE_VIEW:
            if kept:
                for p, v in zip(b.params, views):
                    if p.grad is v:
                        p.grad = v.copy()
            return
        b.buffer = _zeros_buffer(self.transport, b.length, b.dtype)
        b.grad_views = None

    def _start(self, b: _Bucket) -> None:
        if b.buffer is None:  # no gradient reached it in this step: it sums zeros
            b.buffer = _zeros_buffer(self.transport, b.length, b.dtype)
        if self.comm.size == 1:
            b.request = MPI.REQUEST_NULL
        elif self.transport == "nccl":
            b.request = self._nccl_start(b.buffer)
        else:
            if self.transport == "cuda-aware mpi":  # the bucket's copies must be done
                array_module(b.buffer).cuda.get_current_stream().synchronize()
            b.request = self.comm.Iallreduce(MPI.IN_PLACE, b.buffer, op=MPI.SUM)

    def _nccl_start(self, buffer) -> "_StreamRequest":
        """Queue the NCCL sum of ``buffer`` on the reducer's stream, after everything queued
        so far on the current (compute) stream; the request completes with its event."""
        import cupy
        from ..core.gpucomm import device_allreduce
        if self._stream is None:
            self._stream = cupy.cuda.Stream(non_blocking=True)
        ready = cupy.cuda.Event(disable_timing=True)
        ready.record(cupy.cuda.get_current_stream())
        self._stream.wait_event(ready)
        device_allreduce(self.comm, buffer, "sum", stream=self._stream)
        done = cupy.cuda.Event(disable_timing=True)
        done.record(self._stream)
        return _StreamRequest(done)

    def _wait(self, buckets) -> None:
        """Wait for the sums of ``buckets``: MPI requests on the host; NCCL ones by making the
        compute stream wait for their events (stream-ordered, no host synchronisation)."""
        if self.transport == "nccl" and self.comm.size > 1:
            import cupy
            cur = cupy.cuda.get_current_stream()
            for b in buckets:
                cur.wait_event(b.request.event)
            return
        with waiting(self.comm, "MPI_Waitall (gradient all-reduce buckets)"):
            MPI.Request.Waitall([b.request for b in buckets])

    def finish(self) -> None:
        """Start what is left (parameters backward never reached contribute zeros), wait for
        every bucket, and hand the sums to each parameter's ``.grad`` (collective): a view of
        the bucket where ``.grad`` is ``None`` (host buckets, no :meth:`on_bucket_done`
        callbacks, the bucket's dtype), else added to the ``.grad`` held (a new array).

        As PyTorch's DDP: a parameter that got a gradient on some rank gets the sum (ranks
        where it was unused contribute zeros); one that got none on any rank (unused in
        forward everywhere, or frozen with ``requires_grad_(False)``) keeps its ``.grad``
        (``None`` after ``zero_grad``), so optimizers skip it.  Which is which is decided
        by a "used" flag per parameter summed in the bucket's own all-reduce.

        First the calls deferred over the grid during the step are agreed
        (:func:`~disttensor.core.agreement.settle`, one small all-reduce over the grid): a
        call that moves no data and failed on one rank only (that rank agrees at once and
        waits over the grid) is raised here on every rank, instead of the others waiting on
        the buckets' communicator for sums that rank never starts."""
        self.armed = False
        agreement.settle(self.grid.cart)
        reported = self._reported
        for b in self.buckets:
            if b.handed:  # no gradient reached the bucket in this step
                self._reclaim(b)
            if b.missing and b.buffer is not None:  # parameters backward never reached
                self._zero_unreported(b, reported)  # contribute zeros
            b.missing = 0
        self._start_ready()
        while self._next_start < len(self.buckets):
            self._start(self.buckets[self._next_start])
            self._next_start += 1
        self._wait(self.buckets[self._next_done:])
        for b in self.buckets[self._next_done:]:
            self._deliver(b)
        for b in self.buckets:
            b.missing = len(b.params)
            b.request = None
        self._next_start = 0
        self._next_done = 0
        self._passes_done = 0
        self._reported.clear()

    @staticmethod
    def _zero_unreported(b: _Bucket, reported: dict) -> None:
        """Zero the segments (and "used" flags) of ``b``'s parameters that no backward pass
        of this step reported: the buffer still holds an earlier step's sums there."""
        for i, (p, off) in enumerate(zip(b.params, b.offsets)):
            if not reported.get(id(p)):
                b.buffer[off:off + p.data.size] = 0
                b.buffer[b.size + i] = 0

    def release(self) -> None:
        """Give the parameters back their per-op reduction and free the communicator."""
        cancel_post_backward(id(self))
        self.armed = False
        for p in self.params:
            p.deferred_reduction = None
            p._ready_hooks = [h for h in p._ready_hooks if getattr(h, "__self__", None)
                              is not self]
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


class _StreamRequest:
    """A bucket's NCCL sum in flight: complete when its CUDA event has been reached."""
    __slots__ = ("event",)

    def __init__(self, event):
        self.event = event

    def Test(self) -> bool:  # the MPI request's name, for _poll_done
        return bool(self.event.done)


def _view_refs(buffer, views, params) -> tuple[int, int, int]:
    """``(references to buffer, the most references to one of views not counting the
    .grad that it is, how many are still their parameter's .grad)`` as ``sys.getrefcount``
    reads them here (compared with the calibrated idle counts below)."""
    nbuf = sys.getrefcount(buffer)
    most = kept = 0
    for i in range(len(views)):
        v = views[i]
        is_grad = params[i].grad is v
        n = sys.getrefcount(v) - is_grad
        kept += is_grad
        if n > most:
            most = n
    return nbuf, most, kept


def _calibrate_view_refs() -> tuple[int, int]:
    """What :func:`_view_refs` reads for a bucket whose views nothing holds but the bucket
    and ``.grad`` (measured through the function itself, as the buffer pool calibrates)."""
    class _Holder:
        pass
    h = _Holder()
    h.buffer = np.zeros(4)
    h.views = (h.buffer[:2], h.buffer[2:].reshape(1, 2))
    p0, p1 = _Holder(), _Holder()
    p0.grad, p1.grad = None, h.views[1]
    nbuf, most, kept = _view_refs(h.buffer, h.views, (p0, p1))
    assert kept == 1
    return nbuf - len(h.views), most


_IDLE_BUFFER, _IDLE_VIEW = _calibrate_view_refs()


def _bucket_transport(params, comm: MPI.Comm) -> str:
    """How the buckets of ``params`` are summed over ``comm`` (collective, the same answer on
    every rank): ``"host"`` for NumPy parameters; for CuPy ones ``"device (1 rank)"``,
    ``"nccl"`` where NCCL runs on ``comm``, ``"cuda-aware mpi"`` where MPI takes device
    buffers, else ``"host (pinned)"``."""
    on_gpu = bool(params) and all(array_module(p.data) is not np for p in params)
    if comm.size > 1:
        on_gpu = bool(comm.allreduce(int(on_gpu), op=MPI.MIN))
    if not on_gpu:
        return "host"
    if comm.size == 1:
        return "device (1 rank)"
    from ..core.comm import cuda_aware_mpi
    from ..core.gpucomm import nccl_communicator
    if nccl_communicator(comm) is not None:
        return "nccl"
    return "cuda-aware mpi" if cuda_aware_mpi() else "host (pinned)"


def _device_buffers(transport: str) -> bool:
    return transport in ("nccl", "cuda-aware mpi", "device (1 rank)")


def _zeros_buffer(transport: str, size: int, dtype):
    """A zeroed bucket buffer of ``size`` elements where ``transport`` needs it: on the
    device, in page-locked host memory (CuPy parameters staged through the host), or plain
    NumPy."""
    if _device_buffers(transport):
        import cupy
        return cupy.zeros(size, dtype=dtype)
    if transport == "host (pinned)":
        import cupyx
        buf = cupyx.empty_pinned(size, dtype=dtype)
        buf[...] = 0
        return buf
    return np.zeros(size, dtype=dtype)


class DistributedDataParallel(Module):
    """Wrap ``module`` for training over ``grid``: check that every rank holds the same
    parameters and buffers, then sum gradients with a bucketed, overlapped
    :class:`GradientReducer`.  ``DISTTENSOR_CHECK_REPLICAS=N`` re-checks the replicas every
    ``N`` training forwards.  Collective construction."""

    def __init__(self, module: Module, grid: ProcessGrid,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, overlap: bool = True):
        super().__init__()
        self.module = module
        object.__setattr__(self, "grid", grid)
        with collective(grid.cart):
            if not isinstance(module, Module):
                raise TypeError(f"DistributedDataParallel wraps a Module, got "
                                f"{type(module).__name__}")
        check_replicas(module, grid.cart)
        object.__setattr__(self, "reducer", GradientReducer(module.parameters(), grid,
                                                            bucket_bytes, overlap))
        every = os.environ.get("DISTTENSOR_CHECK_REPLICAS", "")
        object.__setattr__(self, "_check_every", int(every) if every.strip() else 0)
        object.__setattr__(self, "_forwards", 0)

    def forward(self, *args, **kwargs):
        from ..autograd.tensor import is_grad_enabled
        if self.training and is_grad_enabled():
            object.__setattr__(self, "_forwards", self._forwards + 1)
            if self._check_every and self._forwards % self._check_every == 0:
                check_replicas(self.module, self.grid.cart)
            self.reducer.arm()
        return self.module(*args, **kwargs)

    def state_dict(self):
        return self.module.state_dict()

    def load_state_dict(self, state, strict: bool = True):
        return self.module.load_state_dict(state, strict)
